// ragged_dot family: bind (validation + canonical key), reference implementation, tolerances.
#include "ops/ragged_dot/base.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "core/random.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "ops/ragged_dot/groups.h"
#include "tokamax/core/enum_names.h"
#include "tokamax/core/limits.h"

namespace tokamax {

namespace {
constexpr EnumNames<RaggedDimNums, 3> kDimNums{
    "dimension_numbers",
    {{{RaggedDimNums::kForward, "forward"},
      {RaggedDimNums::kTransposedRhs, "transposed_rhs"},
      {RaggedDimNums::kRaggedContracting, "ragged_contracting"}}}};
constexpr EnumNames<Precision, 2> kPrecisions{
    "precision", {{{Precision::kDefault, "default"}, {Precision::kHighest, "highest"}}}};
}  // namespace

std::string_view dim_nums_name(RaggedDimNums d) { return kDimNums.name(d); }
RaggedDimNums parse_dim_nums(std::string_view s) { return kDimNums.parse(s); }

namespace rdot {

bool RaggedDotCall::lhs_as_bf16() const {
  const DType rd = packed.empty() ? rhs.dtype() : packed.logical().dtype;
  return lhs.dtype() == DType::kBF16 || (rd == DType::kBF16 && precision == Precision::kDefault);
}

float RaggedDotCall::lhs_value(int64_t i) const {
  const float v = load_f32(lhs.data(), lhs.dtype(), i);
  return lhs.dtype() == DType::kF32 && lhs_as_bf16() ? round_to_bf16(v) : v;
}

const float* RaggedDotCall::lhs_f32(Tensor* storage) const {
  return kernels::a_as_f32(lhs.data(), lhs.dtype() == DType::kBF16, lhs_as_bf16(), lhs.size(),
                           num_threads, storage);
}

namespace {

InvalidArgument bad(const std::string& s) { return InvalidArgument("ragged_dot: " + s); }

// lhs [M,K], and lhs and rhs contiguous in a dtype pair the kernels implement.
void check_operands(const RaggedDotCall& c) {
  const TensorView& lhs = c.lhs;
  const ShapeDtype rhs = c.rhs.spec();
  if (lhs.rank() != 2) throw bad("lhs has shape " + lhs.spec().str() + "; expected rank 2 [M,K]");
  const DType ld = lhs.dtype(), rd = rhs.dtype;
  if (!((ld == DType::kF32 && rd == DType::kF32) || (ld == DType::kBF16 && rd == DType::kBF16) ||
        (ld == DType::kF32 && rd == DType::kBF16))) {
    throw bad("unsupported dtype combination lhs " + lhs.spec().str() + " x rhs " + rhs.str() +
              "; expected f32 x f32, bf16 x bf16 or f32 x bf16");
  }
  for (const auto& [name, v] : {std::pair{"lhs", &c.lhs}, std::pair{"rhs", &c.rhs}}) {
    if (!v->is_contiguous()) {
      throw bad(fmt::format("{} {} has strides {}; expected a contiguous row-major array", name,
                            v->spec().str(), shape_str(v->strides())));
    }
  }
}

// The weight gradient: rhs [M,N] shares lhs's ragged rows, and the output is [G,K,N].
void bind_ragged_contracting(RaggedDotCall& c, int64_t M, int64_t G) {
  const ShapeDtype rhs = c.rhs.spec();
  if (c.packed_rhs)
    throw bad("packed_rhs: a ragged_contracting rhs " + rhs.str() + " is never pre-packed");
  if (rhs.rank() != 2)
    throw bad("rhs has shape " + rhs.str() + "; ragged_contracting expects rank 2 [M,N]");
  if (rhs.shape[0] != M) {
    throw bad(
        fmt::format("rhs has shape {}; ragged_contracting expects {} rows, the rows of lhs {}",
                    rhs.str(), M, c.lhs.spec().str()));
  }
  c.m = M;
  c.n = rhs.shape[1];
  c.g = G;
}

// Forward or transposed: rhs holds one [K,N] (or [N,K]) matrix per group.
void bind_grouped(RaggedDotCall& c, int64_t M, int64_t K, int64_t G) {
  const ShapeDtype rhs = c.rhs.spec();
  const RaggedDimNums dims = c.dims;
  if (rhs.rank() != 3)
    throw bad("rhs has shape " + rhs.str() + "; expected rank 3 " +
              (dims == RaggedDimNums::kForward ? "[G,K,N]" : "[G,N,K]"));
  const int64_t rk = dims == RaggedDimNums::kForward ? rhs.shape[1] : rhs.shape[2];
  if (rk != K) {
    throw bad(fmt::format("rhs has shape {} but lhs {} has K={}; contraction sizes must match ({})",
                          rhs.str(), c.lhs.spec().str(), K, dim_nums_name(dims)));
  }
  if (rhs.shape[0] != G) {
    throw bad(fmt::format("group_sizes has length {} but rhs {} has G={} groups; expected equal", G,
                          rhs.str(), rhs.shape[0]));
  }
  c.m = M;
  c.n = dims == RaggedDimNums::kForward ? rhs.shape[2] : rhs.shape[1];
  c.g = G;
}

// f32 unless both operands are bf16; preferred_element_type may ask for bf16 only then.
DType output_dtype(const RaggedDotCall& c) {
  const DType ld = c.lhs.dtype(), rd = c.rhs.spec().dtype;
  DType out = ld == DType::kBF16 && rd == DType::kBF16 ? DType::kBF16 : DType::kF32;
  if (c.preferred_element_type) {
    const DType p = *c.preferred_element_type;
    const bool ok =
        p == DType::kF32 || (p == DType::kBF16 && ld == DType::kBF16 && rd == DType::kBF16);
    if (!ok) {
      throw bad(fmt::format(
          "preferred_element_type {} is not available for lhs {} x rhs {}; expected f32 (or bf16 "
          "for bf16 x bf16)",
          dtype_name(p), dtype_name(ld), dtype_name(rd)));
    }
    out = p;
  }
  return out;
}

}  // namespace

void Family::bind(RaggedDotCall& c) const {
  check_operands(c);
  const int64_t M = c.lhs.dim(0), K = c.lhs.dim(1);
  expand_pending_groups(c, M, "ragged_dot");
  const int64_t G = static_cast<int64_t>(c.group_sizes.size());
  c.k = K;
  if (c.dims == RaggedDimNums::kRaggedContracting) {
    bind_ragged_contracting(c, M, G);
  } else {
    bind_grouped(c, M, K, G);
  }
  bind_offsets(c, M, G, "ragged_dot");
  c.out_dtype = output_dtype(c);
  if (c.representative_group_sizes &&
      static_cast<int64_t>(c.representative_group_sizes->size()) != G) {
    throw bad(fmt::format("representative_group_sizes has length {}; expected {}",
                          c.representative_group_sizes->size(), G));
  }
  if (c.key_total_rows < 0) c.key_total_rows = M;
}

ShapeDtype output_spec(const RaggedDotCall& c) {
  if (c.dims == RaggedDimNums::kRaggedContracting) return {{c.g, c.k, c.n}, c.out_dtype};
  return {{c.m, c.n}, c.out_dtype};
}

// --- reference: plain loops, f32 accumulation, in the order i, k, j (the inner loop is a
// contiguous row update, so it is fast enough to check big shapes). ---

void Reference::run_call(RaggedDotCall& c, const Prepared*) const {
  if (c.rhs.data() == nullptr && c.k * c.n * c.g > 0) {
    throw Unsupported("the reference needs the unpacked rhs");
  }
  const TensorView& out = c.out();
  auto a_at = [&](int64_t i, int64_t kk) { return c.lhs_value(i * c.k + kk); };
  const void* B = c.rhs.data();
  const DType bd = c.rhs.dtype();
  if (c.dims == RaggedDimNums::kRaggedContracting) {
    const int64_t K = c.k, N = c.n;
    parallel_for(c.g * K, c.num_threads, [&](int64_t gk, int) {
      const int64_t g = gk / K, kk = gk % K;
      std::vector<float> acc(static_cast<size_t>(N), 0.0f);
      for (int64_t r = c.offsets[g]; r < c.offsets[g + 1]; ++r) {
        const float a = a_at(r, kk);
        for (int64_t j = 0; j < N; ++j) acc[j] += a * load_f32(B, bd, r * N + j);
      }
      for (int64_t j = 0; j < N; ++j) {
        store_f32(out.data(), c.out_dtype, (g * K + kk) * N + j,
                  apply_activation(c.activation, acc[j]));
      }
    });
    return;
  }
  const int64_t K = c.k, N = c.n;
  const bool trans = c.dims == RaggedDimNums::kTransposedRhs;
  parallel_for(c.m, c.num_threads, [&](int64_t i, int) {
    // Group of row i (rows past the groups are zero).
    const auto it = std::upper_bound(c.offsets.begin(), c.offsets.end(), i);
    const int64_t g = (it - c.offsets.begin()) - 1;
    std::vector<float> acc(static_cast<size_t>(N), 0.0f);
    if (g < c.g) {
      const int64_t base_off = g * K * N;
      for (int64_t kk = 0; kk < K; ++kk) {
        const float a = a_at(i, kk);
        if (trans) {
          for (int64_t j = 0; j < N; ++j) acc[j] += a * load_f32(B, bd, base_off + j * K + kk);
        } else {
          for (int64_t j = 0; j < N; ++j) acc[j] += a * load_f32(B, bd, base_off + kk * N + j);
        }
      }
      for (int64_t j = 0; j < N; ++j) acc[j] = apply_activation(c.activation, acc[j]);
    }
    for (int64_t j = 0; j < N; ++j) store_f32(out.data(), c.out_dtype, i * N + j, acc[j]);
  });
}

std::vector<int32_t> generate_group_sizes(int64_t total, int64_t groups, uint64_t seed) {
  std::vector<int32_t> sizes(static_cast<size_t>(std::max<int64_t>(groups, 0)), 0);
  if (groups <= 0) return sizes;
  // The values Tensor::uniform({total}, f64, seed ^ 0x5eed) would hold, one at a time: `total`
  // comes from a spec, and holding them all cost 8 bytes a row (2 GB for 250M rows) before the
  // sum was checked against lhs.
  for (int64_t r = 0; r < total; ++r) {
    const double u = uniform_at(seed ^ 0x5eed, static_cast<uint64_t>(r));
    sizes[static_cast<size_t>(std::min<int64_t>(groups - 1, static_cast<int64_t>(u * groups)))]++;
  }
  return sizes;
}

double call_flops(const RaggedDotCall& c) {
  const int64_t rows = c.offsets.back();
  return 2.0 * static_cast<double>(rows) * static_cast<double>(c.k) * static_cast<double>(c.n);
}

double weight_bytes(const RaggedDotCall& c) {
  if (c.dims == RaggedDimNums::kRaggedContracting) {
    return static_cast<double>(c.offsets.back()) *
           (c.k * dtype_size(c.lhs.dtype()) + c.n * dtype_size(c.rhs.dtype()));
  }
  const DType rd = c.packed.empty() ? c.rhs.dtype() : c.packed.logical().dtype;
  int64_t nonempty = 0;
  for (int32_t s : c.group_sizes) nonempty += s > 0;
  return static_cast<double>(nonempty) * c.k * c.n * dtype_size(rd);
}

// --- family ---

namespace {

using Field = ArgField<RaggedDotCall>;
using A = Args<RaggedDotCall>;

// preferred_element_type: absent (or null) in a spec lets bind choose; the key holds the choice.
Field out_dtype_field() {
  return A::custom(
      "preferred_element_type",
      [](const RaggedDotCall& c) { return Json(dtype_name(c.out_dtype)); },
      [](RaggedDotCall& c, const Json& j) {
        if (j.is_null()) return;
        if (!j.is_string()) throw InvalidArgument("expected a dtype name");
        c.preferred_element_type = parse_dtype(j.get<std::string>());
      },
      [](const RaggedDotCall& c, Signature& sig) {
        sig.push_back(static_cast<int64_t>(c.out_dtype));
      });
}

}  // namespace

Family::Family()
    : TypedFamily(
          kFamily,
          {A::input("lhs", &RaggedDotCall::lhs).describe("f32 or bf16 [M, K], rows grouped"),
           A::input("rhs", &RaggedDotCall::rhs)
               .describe("f32 or bf16 [G, K, N] (or pack_rhs' result)"),
           group_sizes_field<RaggedDotCall>().describe(
               "int32 [G] or a list: the rows of each group, in order"),
           A::enumeration("dimension_numbers", &RaggedDotCall::dims, kDimNums)
               .python("dim_nums")
               .describe("forward, the transposed rhs, or the weight gradient"),
           out_dtype_field().describe("float32 or bfloat16; None: f32 unless both are bf16"),
           A::enumeration("activation", &RaggedDotCall::activation, activation_names())
               .describe("applied to each output element (f32) before it is stored"),
           A::enumeration("precision", &RaggedDotCall::precision, kPrecisions)
               .describe("default, or highest (f32 products even for bf16 inputs)"),
           A::value("packed_rhs", &RaggedDotCall::packed_rhs).internal()},
          std::make_shared<Reference>(), {make_native(), make_blas()}) {}

const Family& family() { return family_instance<Family>(); }

// Packed once here, outside any timing, as a program packs its weights at load time. The
// unpacked rhs stays too: the reference and the other implementations read it.
void Family::finish_made_call(RaggedDotCall& c) const {
  if (c.packed_rhs) c.packed = pack_rhs(c.rhs, c.dims, c.precision);
}

Tolerance Family::tolerance_of(const RaggedDotCall& c) const {
  const bool bf16 =
      c.lhs.dtype() == DType::kBF16 || c.rhs.dtype() == DType::kBF16 || c.out_dtype == DType::kBF16;
  // tokamax's bf16 tolerance (same bf16 inputs, f32 accumulation), plus, for a bf16 output, one
  // unit in its last place (2^-7 relative): two correct f32 sums in different orders either
  // side of a rounding midpoint round one ulp apart (at 19.3, 19.25 and 19.375).
  if (bf16) return {1e-2, c.out_dtype == DType::kBF16 ? 5e-3 + kBf16OutputUlp : 5e-3, 0};
  // f32: normwise relative error <= 1e-5; elementwise catches a few grossly wrong elements.
  const double scale = std::sqrt(static_cast<double>(
      std::max<int64_t>(c.dims == RaggedDimNums::kRaggedContracting ? c.m : c.k, 1)));
  return {1e-4 * scale, 1e-4, 1e-5};
}

bool weight_streaming(const RaggedDotCall& c) {
  return bandwidth_bound({call_flops(c), weight_bytes(c)});
}

bool Family::memory_bound_of(const RaggedDotCall& c) const { return weight_streaming(c); }

CallCost Family::cost_of(const RaggedDotCall& c) const {
  return {call_flops(c), weight_bytes(c), native_uses_bf16_dot(c)};
}

}  // namespace rdot
}  // namespace tokamax
