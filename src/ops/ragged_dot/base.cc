// ragged_dot family: bind (validation + canonical key), reference implementation, tolerances.
#include "ops/ragged_dot/base.h"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <unordered_map>

#include "core/thread_pool.h"
#include "tokamax/core/enum_names.h"

namespace tokamax {

namespace {
constexpr EnumNames<Activation, 5> kActivations{"activation",
                                                {{{Activation::kNone, "none"},
                                                  {Activation::kRelu, "relu"},
                                                  {Activation::kSilu, "silu"},
                                                  {Activation::kGelu, "gelu"},
                                                  {Activation::kGeluTanh, "gelu_tanh"}}}};
constexpr EnumNames<RaggedDimNums, 3> kDimNums{
    "dimension_numbers",
    {{{RaggedDimNums::kForward, "forward"},
      {RaggedDimNums::kTransposedRhs, "transposed_rhs"},
      {RaggedDimNums::kRaggedContracting, "ragged_contracting"}}}};
constexpr EnumNames<Precision, 2> kPrecisions{
    "precision", {{{Precision::kDefault, "default"}, {Precision::kHighest, "highest"}}}};
}  // namespace

std::string_view activation_name(Activation a) { return kActivations.name(a); }
Activation parse_activation(std::string_view s) { return kActivations.parse(s); }
std::string_view dim_nums_name(RaggedDimNums d) { return kDimNums.name(d); }
RaggedDimNums parse_dim_nums(std::string_view s) { return kDimNums.parse(s); }

namespace rdot {

bool RaggedDotCall::lhs_as_bf16() const {
  const DType rd = packed.empty() ? rhs.dtype() : packed.logical().dtype;
  return lhs.dtype() == DType::kBF16 || (rd == DType::kBF16 && precision == Precision::kDefault);
}

float RaggedDotCall::lhs_value(int64_t i) const {
  const float v = load_f32(lhs.data(), lhs.dtype(), i);
  return lhs.dtype() == DType::kF32 && lhs_as_bf16() ? bf16_to_f32(f32_to_bf16(v)) : v;
}

const float* RaggedDotCall::lhs_f32(Tensor* storage) const {
  const bool round = lhs_as_bf16();
  if (lhs.dtype() == DType::kF32 && !round) return lhs.data_as<float>();
  *storage = Tensor(lhs.shape(), DType::kF32);
  float* d = storage->data_as<float>();
  // Once per call over the whole lhs (a prefill's is megabytes): chunks in parallel, each a
  // loop the compiler vectorizes.
  constexpr int64_t kChunk = int64_t{1} << 15;
  const int64_t n = lhs.size();
  parallel_for((n + kChunk - 1) / kChunk, num_threads, [&](int64_t chunk, int) {
    const int64_t b = chunk * kChunk, e = std::min(n, b + kChunk);
    if (lhs.dtype() == DType::kBF16) {
      const uint16_t* s = lhs.data_as<uint16_t>();
      for (int64_t i = b; i < e; ++i) d[i] = bf16_to_f32(s[i]);
    } else {
      const float* s = lhs.data_as<float>();
      for (int64_t i = b; i < e; ++i) d[i] = bf16_to_f32(f32_to_bf16(s[i]));
    }
  });
  return d;
}

namespace {

std::string_view precision_name(Precision p) { return kPrecisions.name(p); }

struct SigHash {
  size_t operator()(const std::vector<int64_t>& v) const { return static_cast<size_t>(hash64(v)); }
};

// Building the canonical key JSON costs microseconds; calls repeat a few shapes, so keys are
// interned by a compact signature of everything that goes into them.
BoundArguments intern_key(const std::vector<int64_t>& sig, const std::function<Json()>& build) {
  static std::mutex mu;
  static std::unordered_map<std::vector<int64_t>, BoundArguments, SigHash> table;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = table.find(sig);
    if (it != table.end()) return it->second;
  }
  BoundArguments b(kFamily, "", build());
  std::lock_guard<std::mutex> lock(mu);
  if (table.size() > 100000) table.clear();  // bound memory for programs with endless shapes
  return table.emplace(sig, b).first->second;
}

}  // namespace

void bind_call(RaggedDotCall& c, const TensorView& lhs, const ShapeDtype& rhs,
               std::span<const int32_t> group_sizes, RaggedDimNums dims, const RaggedDotOptions& o,
               int threads, bool packed_rhs) {
  auto bad = [](const std::string& s) { return InvalidArgument("ragged_dot: " + s); };
  if (lhs.rank() != 2) throw bad("lhs has shape " + lhs.spec().str() + "; expected rank 2 [M,K]");
  const DType ld = lhs.dtype(), rd = rhs.dtype;
  if (!((ld == DType::kF32 && rd == DType::kF32) || (ld == DType::kBF16 && rd == DType::kBF16) ||
        (ld == DType::kF32 && rd == DType::kBF16))) {
    throw bad("unsupported dtype combination lhs " + lhs.spec().str() + " x rhs " + rhs.str() +
              "; expected f32 x f32, bf16 x bf16 or f32 x bf16");
  }
  if (!lhs.is_contiguous()) {
    throw bad("lhs " + lhs.spec().str() + " has strides " + shape_str(lhs.strides()) +
              "; expected a contiguous row-major array");
  }
  const int64_t M = lhs.dim(0), K = lhs.dim(1);
  const int64_t G = static_cast<int64_t>(group_sizes.size());
  c.dims = dims;
  c.lhs = lhs;
  c.k = K;
  if (dims == RaggedDimNums::kRaggedContracting) {
    if (packed_rhs)
      throw bad("packed_rhs: a ragged_contracting rhs " + rhs.str() + " is never pre-packed");
    if (rhs.rank() != 2)
      throw bad("rhs has shape " + rhs.str() + "; ragged_contracting expects rank 2 [M,N]");
    if (rhs.shape[0] != M) {
      throw bad("rhs has shape " + rhs.str() + "; ragged_contracting expects " + std::to_string(M) +
                " rows, the rows of lhs " + lhs.spec().str());
    }
    c.m = M;
    c.n = rhs.shape[1];
    c.g = G;
  } else {
    if (rhs.rank() != 3)
      throw bad("rhs has shape " + rhs.str() + "; expected rank 3 " +
                (dims == RaggedDimNums::kForward ? "[G,K,N]" : "[G,N,K]"));
    const int64_t rk = dims == RaggedDimNums::kForward ? rhs.shape[1] : rhs.shape[2];
    if (rk != K) {
      throw bad("rhs has shape " + rhs.str() + " but lhs " + lhs.spec().str() +
                " has K=" + std::to_string(K) + "; contraction sizes must match (" +
                std::string(dim_nums_name(dims)) + ")");
    }
    if (rhs.shape[0] != G) {
      throw bad("group_sizes has length " + std::to_string(G) + " but rhs " + rhs.str() +
                " has G=" + std::to_string(rhs.shape[0]) + " groups; expected equal");
    }
    c.m = M;
    c.n = dims == RaggedDimNums::kForward ? rhs.shape[2] : rhs.shape[1];
    c.g = G;
  }
  c.offsets.assign(static_cast<size_t>(G) + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    if (group_sizes[g] < 0) {
      throw bad("group_sizes[" + std::to_string(g) + "] = " + std::to_string(group_sizes[g]) +
                "; expected >= 0");
    }
    c.offsets[g + 1] = c.offsets[g] + group_sizes[g];
  }
  if (c.offsets[G] > M) {
    throw bad("sum(group_sizes) = " + std::to_string(c.offsets[G]) + " exceeds the " +
              std::to_string(M) + " rows of lhs " + lhs.spec().str());
  }
  c.group_sizes.assign(group_sizes.begin(), group_sizes.end());
  DType out = ld == DType::kBF16 && rd == DType::kBF16 ? DType::kBF16 : DType::kF32;
  if (o.preferred_element_type) {
    const DType p = *o.preferred_element_type;
    const bool ok =
        p == DType::kF32 || (p == DType::kBF16 && ld == DType::kBF16 && rd == DType::kBF16);
    if (!ok) {
      throw bad("preferred_element_type " + std::string(dtype_name(p)) +
                " is not available for lhs " + std::string(dtype_name(ld)) + " x rhs " +
                std::string(dtype_name(rd)) + "; expected f32 (or bf16 for bf16 x bf16)");
    }
    out = p;
  }
  c.out_dtype = out;
  c.activation = o.activation;
  c.precision = o.precision;
  c.num_threads = threads > 0 ? threads : num_threads();
  if (o.representative_group_sizes &&
      static_cast<int64_t>(o.representative_group_sizes->size()) != G) {
    throw bad("representative_group_sizes has length " +
              std::to_string(o.representative_group_sizes->size()) + "; expected " +
              std::to_string(G));
  }

  std::vector<int64_t> sig = {static_cast<int64_t>(ld),
                              M,
                              K,
                              static_cast<int64_t>(rd),
                              static_cast<int64_t>(dims),
                              static_cast<int64_t>(out),
                              static_cast<int64_t>(o.activation),
                              static_cast<int64_t>(o.precision),
                              c.num_threads,
                              packed_rhs,
                              G};
  sig.insert(sig.end(), rhs.shape.begin(), rhs.shape.end());
  if (o.representative_group_sizes) {
    sig.push_back(-1);
    sig.insert(sig.end(), o.representative_group_sizes->begin(),
               o.representative_group_sizes->end());
  }
  c.bound = intern_key(sig, [&] {
    Json gs;
    if (o.representative_group_sizes)
      gs = *o.representative_group_sizes;
    else
      gs = {{"num_groups", G}, {"total_size", M}};
    return Json{{"lhs", lhs.spec().str()},
                {"rhs", rhs.str()},
                {"group_sizes", gs},
                {"dimension_numbers", dim_nums_name(dims)},
                {"preferred_element_type", dtype_name(out)},
                {"activation", activation_name(o.activation)},
                {"precision", precision_name(o.precision)},
                {"num_threads", c.num_threads},
                {"packed_rhs", packed_rhs}};
  });
}

ShapeDtype output_spec(const RaggedDotCall& c) {
  if (c.dims == RaggedDimNums::kRaggedContracting) return {{c.g, c.k, c.n}, c.out_dtype};
  return {{c.m, c.n}, c.out_dtype};
}

double activation_grad(Activation a, double x) {
  switch (a) {
    case Activation::kNone:
      return 1;
    case Activation::kRelu:
      return x > 0 ? 1 : 0;
    case Activation::kSilu: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 + x * (1 - s));
    }
    case Activation::kGelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Activation::kGeluTanh: {
      const double c = 0.7978845608028654, u = c * (x + 0.044715 * x * x * x);
      const double t = std::tanh(u);
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
  }
  return 1;
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
        store_out(out.data(), c.out_dtype, (g * K + kk) * N + j,
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
    for (int64_t j = 0; j < N; ++j) store_out(out.data(), c.out_dtype, i * N + j, acc[j]);
  });
}

std::vector<int32_t> generate_group_sizes(int64_t total, int64_t groups, uint64_t seed) {
  std::vector<int32_t> sizes(static_cast<size_t>(std::max<int64_t>(groups, 0)), 0);
  if (groups <= 0) return sizes;
  Tensor u = Tensor::uniform({total}, DType::kF64, seed ^ 0x5eed);
  for (int64_t r = 0; r < total; ++r) {
    sizes[static_cast<size_t>(
        std::min<int64_t>(groups - 1, static_cast<int64_t>(u.data_as<double>()[r] * groups)))]++;
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

Family::Family() : impls_{make_native(), make_blas()}, reference_(std::make_shared<Reference>()) {}

const Family& family() {
  static const std::shared_ptr<const Family> f = std::make_shared<Family>();
  return *f;
}

BoundArguments Family::bind_json(const Json& a, const std::string& implementation) const {
  auto bad = [](const std::string& s) { return InvalidArgument("ragged_dot arguments: " + s); };
  if (!a.is_object()) throw bad("expected a JSON object");
  for (const char* req : {"lhs", "rhs", "group_sizes"}) {
    if (!a.contains(req)) throw bad(std::string("missing '") + req + "'");
  }
  if (!a["lhs"].is_string() || !a["rhs"].is_string())
    throw bad("'lhs' and 'rhs' must be ShapeDtype strings like \"f32[8,128]\"");
  const ShapeDtype lhs = ShapeDtype::parse(a["lhs"].get<std::string>());
  const ShapeDtype rhs = ShapeDtype::parse(a["rhs"].get<std::string>());
  RaggedDotOptions o;
  const RaggedDimNums dims = parse_dim_nums(a.value("dimension_numbers", "forward"));
  if (a.contains("activation")) o.activation = parse_activation(a["activation"].get<std::string>());
  if (a.contains("precision")) o.precision = kPrecisions.parse(a["precision"].get<std::string>());
  if (a.contains("preferred_element_type") && !a["preferred_element_type"].is_null()) {
    o.preferred_element_type = parse_dtype(a["preferred_element_type"].get<std::string>());
  }
  std::vector<int32_t> sizes;
  const Json& gs = a["group_sizes"];
  if (gs.is_array()) {
    for (const Json& x : gs) {
      if (!x.is_number_integer()) throw bad("group_sizes list must hold integers");
      sizes.push_back(x.get<int32_t>());
    }
    o.representative_group_sizes = sizes;
  } else if (gs.is_object() && gs.contains("num_groups") && gs.contains("total_size")) {
    const int64_t G = gs["num_groups"].get<int64_t>(), T = gs["total_size"].get<int64_t>();
    if (G < 0 || T < 0) throw bad("group_sizes num_groups and total_size must be >= 0");
    sizes = generate_group_sizes(T, G, 0);
  } else {
    throw bad("group_sizes must be a list of ints or {\"num_groups\": G, \"total_size\": M}");
  }
  RaggedDotCall c;
  int threads = num_threads();
  if (a.contains("num_threads")) {
    if (!a["num_threads"].is_number_integer() || a["num_threads"].get<int>() <= 0)
      throw bad("num_threads must be an integer > 0");
    threads = a["num_threads"].get<int>();
  }
  bool packed_rhs = false;
  if (a.contains("packed_rhs")) {
    if (!a["packed_rhs"].is_boolean()) throw bad("packed_rhs must be true or false");
    packed_rhs = a["packed_rhs"].get<bool>();
  }
  bind_call(c, TensorView(nullptr, lhs.dtype, lhs.shape), rhs, sizes, dims, o, threads, packed_rhs);
  Json args = c.bound.arguments();
  if (gs.is_object())
    args["group_sizes"] = {{"num_groups", gs["num_groups"]}, {"total_size", gs["total_size"]}};
  return BoundArguments(kFamily, implementation, std::move(args));
}

std::unique_ptr<CallBase> Family::make_call(const BoundArguments& b, uint64_t seed) const {
  const Json& a = b.arguments();
  const ShapeDtype lhs = ShapeDtype::parse(a["lhs"].get<std::string>());
  const ShapeDtype rhs = ShapeDtype::parse(a["rhs"].get<std::string>());
  auto c = std::make_unique<RaggedDotCall>();
  c->owned.push_back(Tensor::randn(lhs.shape, lhs.dtype, seed));
  c->owned.push_back(Tensor::randn(rhs.shape, rhs.dtype, seed + 1));
  std::vector<int32_t> sizes;
  const Json& gs = a["group_sizes"];
  if (gs.is_array())
    sizes = gs.get<std::vector<int32_t>>();
  else
    sizes =
        generate_group_sizes(gs["total_size"].get<int64_t>(), gs["num_groups"].get<int64_t>(), 0);
  RaggedDotOptions o;
  o.activation = parse_activation(a["activation"].get<std::string>());
  o.precision =
      a["precision"].get<std::string>() == "default" ? Precision::kDefault : Precision::kHighest;
  o.preferred_element_type = parse_dtype(a["preferred_element_type"].get<std::string>());
  const RaggedDimNums dims = parse_dim_nums(a["dimension_numbers"].get<std::string>());
  const bool packed_rhs = a.value("packed_rhs", false);
  bind_call(*c, c->owned[0].view(), rhs, sizes, dims, o, b.num_threads(), packed_rhs);
  c->rhs = c->owned[1].view();
  // Packed once here, outside any timing, as a program packs its weights at load time. The
  // unpacked rhs stays too: the reference and the other implementations read it.
  if (packed_rhs) c->packed = pack_rhs(c->rhs, dims, o.precision);
  c->bound = b;
  c->num_threads = b.num_threads();
  const ShapeDtype out = output_spec(*c);
  c->owned.emplace_back(out.shape, out.dtype);
  c->outputs = {c->owned.back().view()};
  return c;
}

Tolerance Family::tolerance(const CallBase& base) const {
  const auto& c = call_as<RaggedDotCall>(base);
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
  // Arithmetic intensity over weight bytes: flops per byte below ~8 is bandwidth-limited here.
  const double bytes = weight_bytes(c);
  return bytes > 0 && call_flops(c) / bytes < 8.0;
}

bool Family::memory_bound(const CallBase& base) const {
  return weight_streaming(call_as<RaggedDotCall>(base));
}

CallCost Family::cost(const CallBase& base) const {
  const auto& c = call_as<RaggedDotCall>(base);
  return {call_flops(c), weight_bytes(c), native_uses_bf16_dot(c)};
}

// The call as users make it, the pre-packed call, and the alternatives a user has: blas, and
// on memory-bound calls the reference loops (there they can beat blas; on compute-bound ones
// they are 5-10x slower than blas and would only lengthen the run).
std::vector<std::string> Family::bench_rows(const CallBase& call) const {
  std::vector<std::string> rows = OpFamily::bench_rows(call);
  rows.insert(std::find(rows.begin(), rows.end(), "native") + 1, "native:packed");
  return rows;
}

}  // namespace rdot
}  // namespace tokamax
