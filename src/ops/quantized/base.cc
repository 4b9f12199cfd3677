// quantized_ragged_dot: its description, bind (the layout's checks), the reference, tolerances
// and cost.
#include "ops/quantized/base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "ops/elements.h"
#include "ops/ragged_dot/groups.h"
#include "tokamax/core/enum_names.h"

namespace tokamax {

namespace {
constexpr EnumNames<QuantFormat, 4> kFormats{"format",
                                             {{{QuantFormat::kInt8, "int8"},
                                               {QuantFormat::kInt4, "int4"},
                                               {QuantFormat::kFp8E4M3, "fp8_e4m3"},
                                               {QuantFormat::kMxfp4, "mxfp4"}}}};
}  // namespace

std::string_view quant_format_name(QuantFormat f) { return kFormats.name(f); }
QuantFormat parse_quant_format(std::string_view name) { return kFormats.parse(name); }

namespace quant {

namespace {

using A = Args<QCall>;

InvalidArgument bad(const std::string& what) {
  return InvalidArgument(std::string(kFamily) + ": " + what);
}

// The reference: each weight dequantized (s * value in f32), then the float reference's loops
// (f32 accumulation in k order), as ragged_dot(lhs, dequantize(rhs)) computes.
class Reference : public TypedImplementation<QCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(QCall& c, const Prepared*) const override {
    const TensorView& out = c.out();
    const uint8_t* zeros = c.zeros ? static_cast<const uint8_t*>(c.zeros->data()) : nullptr;
    parallel_for(c.m, c.num_threads, [&](int64_t i, int) {
      const auto it = std::upper_bound(c.offsets.begin(), c.offsets.end(), i);
      const int64_t g = (it - c.offsets.begin()) - 1;
      std::vector<float> acc(static_cast<size_t>(c.n), 0.0f);
      if (g < c.g) {
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const float a = load_f32(c.lhs, i * c.k + kk);
          for (int64_t j = 0; j < c.n; ++j) {
            acc[j] += a * weight_at(c.format, c.values.data(), c.scales.data(), zeros, c.panels,
                                    c.k, c.gs, g, kk, j);
          }
        }
        for (float& v : acc) v = kernels::apply_activation(c.activation, v);
      }
      for (int64_t j = 0; j < c.n; ++j) store_f32(out, i * c.n + j, acc[j]);
    });
  }
};

// A made call's arrays: values that decode to finite numbers, positive scales, zero points in
// range (the values a quantizer writes; bind does not read the data).
A::Fill values_fill() {
  return [](const QCall& c, const TensorView& v, uint64_t seed) {
    if (v.dtype() == DType::kI8) {
      fill_uniform(v, seed, -127, 127.99);
      return;
    }
    fill_uniform(v, seed, 0, 255.99);
    if (c.format != QuantFormat::kFp8E4M3) return;
    auto* b = static_cast<uint8_t*>(v.data());
    for (int64_t i = 0; i < v.size(); ++i) {
      if ((b[i] & 0x7f) == 0x7f) b[i] ^= 1;  // 0x7f / 0xff are e4m3's NaN
    }
  };
}
A::Fill scales_fill() {
  return [](const QCall&, const TensorView& v, uint64_t seed) {
    if (v.dtype() == DType::kU8)
      fill_uniform(v, seed, 118, 122.99);  // e8m0: 2^-9 .. 2^-5
    else
      fill_uniform(v, seed, 0.002, 0.02);
  };
}
A::Fill zeros_fill() {
  return [](const QCall&, const TensorView& v, uint64_t seed) { fill_uniform(v, seed, 0, 15.99); };
}

std::vector<ArgField<QCall>> argument_fields() {
  return {
      A::input("lhs", &QCall::lhs).describe("f32 or bf16 [M, K], rows grouped"),
      A::input("values", &QCall::values, values_fill())
          .describe("the quantized weights in panels: i8 [G, P, K, 64] (int8), u8 [G, P, K, 64] "
                    "(fp8_e4m3) or u8 [G, P, K, 32] (int4, mxfp4), P = ceil(N / 64)"),
      A::input("scales", &QCall::scales, scales_fill())
          .describe("f32 [G, P, K / group_size, 64] (u8 e8m0 for mxfp4)"),
      A::optional_input("zeros", &QCall::zeros, zeros_fill())
          .describe("u8 zero points as scales (asymmetric int4), in [0, 15]"),
      rdot::group_sizes_field<QCall>().describe(
          "int32 [G] or a list: the rows of each group, in order"),
      A::enumeration("format", &QCall::format, kFormats).describe("the weights' format"),
      A::value("n", &QCall::n).describe("the weights' columns N (the panels pad them to 64)"),
      A::value("group_size", &QCall::group_size)
          .describe("rows of K per scale; 0: K (one per channel); mxfp4: 32"),
      A::enumeration("activation", &QCall::activation, activation_names())
          .describe("applied to each output element (f32) before it is stored"),
  };
}

void check_array(const TensorView& v, const char* name, const ShapeDtype& want) {
  if (v.spec() != want || !v.is_contiguous()) {
    throw bad(fmt::format("{} has spec {}{}; expected contiguous {}", name, v.spec().str(),
                          v.is_contiguous() ? "" : " (not contiguous)", want.str()));
  }
}

}  // namespace

kernels::QFormat kernel_format(QuantFormat f) {
  switch (f) {
    case QuantFormat::kInt8:
      return kernels::QFormat::kInt8;
    case QuantFormat::kInt4:
      return kernels::QFormat::kInt4;
    case QuantFormat::kFp8E4M3:
      return kernels::QFormat::kFp8E4M3;
    case QuantFormat::kMxfp4:
      break;
  }
  return kernels::QFormat::kMxfp4;
}

int64_t effective_group_size(QuantFormat f, int64_t k, int64_t group_size) {
  if (group_size != 0) return group_size;
  return f == QuantFormat::kMxfp4 ? 32 : k;
}

void check_sizes(int64_t g, int64_t k, int64_t n, const char* op) {
  constexpr int64_t kMax = int64_t{1} << 40;
  if (g < 0 || k < 0 || n < 0 || g > kMax || k > kMax || n > kMax) {
    throw InvalidArgument(
        fmt::format("{}: [G, K, N] = [{}, {}, {}]; expected sizes in [0, 2^40]", op, g, k, n));
  }
}

void check_group_size(QuantFormat f, int64_t k, int64_t group_size, const char* op) {
  const int64_t gs = effective_group_size(f, k, group_size);
  const auto refuse = [&](const std::string& expected) {
    throw InvalidArgument(fmt::format("{}: group_size = {} for {} with K = {}; expected {}", op,
                                      group_size, quant_format_name(f), k, expected));
  };
  if (f == QuantFormat::kMxfp4 && gs != 32) refuse("32 (mxfp4's block)");
  if (f == QuantFormat::kFp8E4M3 && gs != k) refuse("0 or K (fp8_e4m3 scales per channel)");
  if (k == 0) return;
  if (gs <= 0 || k % gs != 0) refuse("a positive divisor of K (or 0 for K)");
}

ShapeDtype values_spec(QuantFormat f, int64_t g, int64_t k, int64_t n) {
  const int64_t p = (n + kQuantPanel - 1) / kQuantPanel;
  const kernels::QFormat kf = kernel_format(f);
  return {{g, p, k, kernels::qrow_bytes(kf)}, f == QuantFormat::kInt8 ? DType::kI8 : DType::kU8};
}

ShapeDtype scales_spec(QuantFormat f, int64_t g, int64_t k, int64_t n, int64_t group_size) {
  const int64_t p = (n + kQuantPanel - 1) / kQuantPanel;
  const int64_t gs = effective_group_size(f, k, group_size);
  return {{g, p, gs > 0 ? k / gs : 0, kQuantPanel},
          f == QuantFormat::kMxfp4 ? DType::kU8 : DType::kF32};
}

float weight_at(QuantFormat f, const void* values, const void* scales, const uint8_t* zeros,
                int64_t panels, int64_t k, int64_t gs, int64_t g, int64_t kk, int64_t j) {
  const int64_t p = j / kQuantPanel, col = j % kQuantPanel;
  const int64_t rb = kernels::qrow_bytes(kernel_format(f));
  const int64_t row = (g * panels + p) * k + kk;
  const int64_t srow = (g * panels + p) * (k / gs) + kk / gs;
  const int64_t s_at = srow * kQuantPanel + col;
  const auto* u8 = static_cast<const uint8_t*>(values);
  float value, scale;
  if (f == QuantFormat::kInt8 || f == QuantFormat::kFp8E4M3) {
    const uint8_t b = u8[row * rb + col];
    value = f == QuantFormat::kInt8 ? static_cast<float>(static_cast<int8_t>(b))
                                    : kernels::decode_fp8_e4m3(b);
  } else {
    const uint8_t b = u8[row * rb + col % 32];
    const uint8_t nib = col < 32 ? (b & 15) : (b >> 4);
    value = f == QuantFormat::kInt4
                ? static_cast<float>(nib) - static_cast<float>(zeros ? zeros[s_at] : 8)
                : kernels::decode_e2m1(nib);
  }
  scale = f == QuantFormat::kMxfp4 ? kernels::decode_e8m0(static_cast<const uint8_t*>(scales)[s_at])
                                   : static_cast<const float*>(scales)[s_at];
  return scale * value;
}

Family::Family()
    : TypedFamily(kFamily, argument_fields(), std::make_shared<Reference>(), {make_native()}) {}

const Family& family() { return family_instance<Family>(); }

std::string Family::summary() const {
  return "ragged_dot (forward: [M, K] x [G, K, N] -> [M, N]) with quantized weights (int8, int4, "
         "fp8_e4m3, mxfp4; quantize() makes them), widened inside the kernel: the weight-only "
         "path of mixture-of-experts decode.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"out", "the grouped product, lhs's dtype; rows past sum(group_sizes) are zero",
           "(lhs.shape[0], n)", "lhs.dtype"}};
}

void Family::bind(QCall& c) const {
  if (c.lhs.rank() != 2 || (c.lhs.dtype() != DType::kF32 && c.lhs.dtype() != DType::kBF16) ||
      !c.lhs.is_contiguous()) {
    throw bad(fmt::format("lhs has spec {}; expected a contiguous f32 or bf16 [M, K]",
                          c.lhs.spec().str()));
  }
  const int64_t M = c.lhs.dim(0), K = c.lhs.dim(1);
  rdot::expand_pending_groups(c, M, kFamily);
  const int64_t G = static_cast<int64_t>(c.group_sizes.size());
  check_sizes(G, K, c.n, kFamily);
  check_group_size(c.format, K, c.group_size, kFamily);
  c.m = M;
  c.k = K;
  c.g = G;
  c.gs = effective_group_size(c.format, K, c.group_size);
  c.group_size = c.gs;  // one key for 0 and K
  c.panels = (c.n + kQuantPanel - 1) / kQuantPanel;
  check_array(c.values, "values", values_spec(c.format, G, K, c.n));
  check_array(c.scales, "scales", scales_spec(c.format, G, K, c.n, c.group_size));
  if (c.zeros) {
    if (c.format != QuantFormat::kInt4) {
      throw bad(fmt::format("zeros {} given for {}; only asymmetric int4 has zero points",
                            c.zeros->spec().str(), quant_format_name(c.format)));
    }
    ShapeDtype z = scales_spec(c.format, G, K, c.n, c.group_size);
    z.dtype = DType::kU8;
    check_array(*c.zeros, "zeros", z);
  }
  rdot::bind_offsets(c, M, G, kFamily);
  c.out_dtype = c.lhs.dtype();
  if (c.representative_group_sizes &&
      static_cast<int64_t>(c.representative_group_sizes->size()) != G) {
    throw bad(fmt::format("representative_group_sizes has length {}; expected {}",
                          c.representative_group_sizes->size(), G));
  }
  if (c.key_total_rows < 0) c.key_total_rows = M;
}

// Spec-made calls only: their values are what the fills made.
void Family::finish_made_call(QCall&) const {}

Tolerance Family::tolerance_of(const QCall& c) const {
  // Both sum f32 products of the same weights, the reference in k order, native per group and
  // then scaled: ragged_dot's f32 bound with a normwise 1e-4 (its 1e-5 was exceeded, up to
  // 2e-5, on single columns whose sums cancel: the grouped order rounds the partial sums
  // apart); a bf16 output adds its unit in the last place.
  const double scale = std::sqrt(static_cast<double>(std::max<int64_t>(c.k, 1)));
  if (c.out_dtype == DType::kBF16) return {1e-2, 5e-3 + 1.0 / 128, 0};
  return {1e-4 * scale, 1e-4, 1e-4};
}

double weight_bytes(const QCall& c) {
  int64_t nonempty = 0;
  for (int32_t s : c.group_sizes) nonempty += s > 0;
  const double per_group = static_cast<double>(c.values.size() * dtype_size(c.values.dtype()) +
                                               c.scales.size() * dtype_size(c.scales.dtype()) +
                                               (c.zeros ? c.zeros->size() : 0)) /
                           static_cast<double>(std::max<int64_t>(c.g, 1));
  return static_cast<double>(nonempty) * per_group;
}

bool Family::memory_bound_of(const QCall& c) const { return bandwidth_bound(cost_of(c)); }

CallCost Family::cost_of(const QCall& c) const {
  const double rows = static_cast<double>(c.offsets.empty() ? 0 : c.offsets.back());
  return {2.0 * rows * static_cast<double>(c.k) * static_cast<double>(c.n), weight_bytes(c), false};
}

}  // namespace quant
}  // namespace tokamax
