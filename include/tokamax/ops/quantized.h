// Quantized expert weights: the formats CPU mixture-of-experts inference deploys (int8, int4,
// fp8 e4m3, mxfp4), quantize/dequantize, and the grouped matmul that reads them
// (quantized_ragged_dot: the forward ragged_dot, [M,K] x [G,K,N] -> [M,N], with the weights
// widened inside the kernel: weight-only quantization).
//
// A weight w [G,K,N] is quantized along its contraction axis K, in groups of `group_size`
// consecutive k (K itself: one scale per output channel). Each (g, group, n) has a scale s (and,
// for asymmetric int4, a zero point z), and the value a kernel multiplies is
//   int8:     s * q,          q int8 in [-127, 127]
//   int4:     s * (q - z),    q in [0, 15]; z = 8 when symmetric (values -8..7), stored
//                             per group when asymmetric
//   fp8_e4m3: s * e4m3(q),    q an OCP e4m3fn byte (max 448; 0x7f / 0xff are NaN)
//   mxfp4:    2^(e - 127) * e2m1(q), q a 4-bit e2m1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and
//                             their negatives), e the group's e8m0 byte (OCP MX: groups of 32)
// Scales are f32 (e8m0 bytes for mxfp4). quantize rounds to nearest (even, for the float
// formats) with the rule documented at each format (docs/quantized.md); an all-zero group gets
// scale 1 (every q zero), so a scale is never zero.
//
// Layout (the kernels', produced once by quantize: no call repacks): the N columns are cut in
// panels of kQuantPanel = 64 (the last padded with zeros), and each panel's K rows are
// contiguous, so a decode call streams each panel as one forward read:
//   values  int8, fp8: [G, P, K, 64] bytes;  int4, mxfp4: [G, P, K, 32] bytes, byte b of a row
//           holding column b in its low nibble and column b + 32 in its high one;
//   scales  [G, P, K / group_size, 64] (f32; u8 e8m0 for mxfp4);
//   zeros   [G, P, K / group_size, 64] u8 (asymmetric int4 only), in [0, 15];
// with P = ceil(N / 64). QuantizedTensor::from_parts checks a set of arrays against this.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tokamax/core/activation.h"
#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class QuantFormat { kInt8, kInt4, kFp8E4M3, kMxfp4 };

std::string_view quant_format_name(QuantFormat f);  // int8, int4, fp8_e4m3, mxfp4
QuantFormat parse_quant_format(std::string_view name);

// Columns per panel of the quantized layout.
inline constexpr int64_t kQuantPanel = 64;

struct QuantizedTensor {
  QuantFormat format = QuantFormat::kInt8;
  int64_t groups = 0, k = 0, n = 0;  // the logical weight [G, K, N]
  int64_t group_size = 0;            // along K; divides K
  bool asymmetric = false;           // int4 with zero points
  Tensor values, scales;
  std::optional<Tensor> zeros;

  ShapeDtype logical() const { return {{groups, k, n}, DType::kF32}; }
  // Bytes a call that reads every group reads: values, scales and zeros.
  int64_t bytes() const;

  // Checks arrays made elsewhere (a checkpoint's, another process's) against the layout above
  // and takes them: InvalidArgument naming the array, its shape and what was expected, for a
  // wrong shape or dtype, a group size that does not divide K (or is not 32 for mxfp4), zero
  // points out of [0, 15], and NaN, infinite, negative or zero scales.
  static QuantizedTensor from_parts(QuantFormat format, int64_t groups, int64_t k, int64_t n,
                                    int64_t group_size, Tensor values, Tensor scales,
                                    std::optional<Tensor> zeros = std::nullopt);
};

// Imports GGUF blocks (llama.cpp's formats; `type` "Q8_0" or "Q4_0", blocks of 32 along K, an
// f16 scale each) of the weights [G, K, N]: `blocks` u8 [G, N, K / 32 * block bytes] (GGUF's
// expert tensor, rows of K; [N, ...] for G = 1), block bytes 34 (Q8_0) or 18 (Q4_0). The result is
// int8 or symmetric int4 with group size 32 whose dequantized values equal GGUF's, bit for bit
// (its scales may be zero or negative, as GGUF writes them; NaN or infinite ones are refused).
QuantizedTensor from_gguf(const TensorView& blocks, std::string_view type, int64_t groups,
                          int64_t k, int64_t n);

// Quantizes w (f32 or bf16 [G, K, N], or [K, N] as G = 1) along K. group_size 0: K (per
// channel; fp8_e4m3 takes only that); mxfp4 takes 32 (its standard; 0 means 32). asymmetric:
// int4 only.
QuantizedTensor quantize(const TensorView& w, QuantFormat format, int64_t group_size = 0,
                         bool asymmetric = false);
// The f32 weights [G, K, N] the quantized ones stand for (exactly s * value, in f32).
Tensor dequantize(const QuantizedTensor& q);

struct QuantizedRaggedDotOptions {
  Activation activation = Activation::kNone;  // applied to the f32 accumulator
  std::string implementation;                 // "", "native", "reference"
  std::optional<Config> config;
};

// The native implementation's config: rows per kernel call (the weights of a panel are read
// once per such tile) and panels per work item.
struct QuantizedRaggedDotNativeConfig {
  int mr = 4;               // 1..4
  int panels_per_item = 1;  // >= 1
  Json to_json() const;
  static QuantizedRaggedDotNativeConfig from_json(const Json& j);
  friend bool operator==(const QuantizedRaggedDotNativeConfig&,
                         const QuantizedRaggedDotNativeConfig&) = default;
};

// ragged_dot(lhs, dequantize(rhs), group_sizes) (the forward form), with the weights widened
// inside the kernel. lhs f32 or bf16 [M, K]; rows of group g are multiplied with rhs's group g;
// output rows past sum(group_sizes) are zero; the output has lhs's dtype. Accumulation is f32;
// the lhs is used as given (a bf16 one widened exactly).
Tensor ragged_dot(const TensorView& lhs, const QuantizedTensor& rhs,
                  std::span<const int32_t> group_sizes,
                  const QuantizedRaggedDotOptions& options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
