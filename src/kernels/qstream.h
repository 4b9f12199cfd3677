// The quantized weight-streaming kernel (weight-only quantization: the weights are widened to
// f32 in registers, next to the FMAs that use them). One call multiplies up to kQMaxMr rows of
// an f32 lhs with one panel of quantized weights: kQPanel columns, K rows, each row's bytes
// contiguous and the rows one after another (the layout of tokamax/ops/quantized.h), so the
// weights are one forward stream. Written once over vector types (qstream_impl.h) and compiled
// per ISA. No framework types here.
#pragma once

#include <cstdint>

#include "kernels/microkernels.h"

namespace tokamax::kernels {

inline constexpr int kQPanel = 64;
inline constexpr int kQMaxMr = 4;

enum class QFormat { kInt8, kInt4, kFp8E4M3, kMxfp4 };

// Bytes per panel row of values.
inline constexpr int qrow_bytes(QFormat f) {
  return f == QFormat::kInt4 || f == QFormat::kMxfp4 ? kQPanel / 2 : kQPanel;
}

// For i < mr (1..kQMaxMr), j < kQPanel:
//   c[i*ldc + j] = sum_{k<K} a[i*lda + k] * s(k / group_size, j) * value(k, j)
// values: K rows of qrow_bytes(format) bytes; scales: K / group_size rows of kQPanel f32 (u8
// e8m0 for mxfp4); zeros: as scales, u8 (int4 only; null: 8, the symmetric zero). Each group's
// products are summed in f32 and then scaled. c is overwritten.
using QStreamKernel = void (*)(QFormat format, int mr, int64_t K, int64_t group_size,
                               const float* a, int64_t lda, const uint8_t* values,
                               const void* scales, const uint8_t* zeros, float* c, int64_t ldc);

QStreamKernel qstream_kernel(Isa isa);
QStreamKernel qstream_kernel_portable();
QStreamKernel qstream_kernel_avx2();
QStreamKernel qstream_kernel_avx512();

// One value of each format, as the kernels decode it (the reference and quantize use these).
float decode_fp8_e4m3(uint8_t q);
float decode_e2m1(uint8_t nibble);
float decode_e8m0(uint8_t e);

}  // namespace tokamax::kernels
