// The quantized streaming kernel at AVX2's width (compiled with -mavx2 -mfma).
#define TOKAMAX_QSTREAM_WIDTH 8
#include <immintrin.h>
#define TOKAMAX_QSTREAM_WIDEN_U8(p) \
  _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_WIDEN_I8(p) \
  _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_WIDEN_U8_U16(p) \
  _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_F16_TO_F32(h) _mm256_cvtph_ps((__m128i)(h))
#define TOKAMAX_QSTREAM_LOOKUP(table, idx) _mm256_permutevar8x32_ps((__m256)(table), (__m256i)(idx))
#include "kernels/qstream_impl.h"

namespace tokamax::kernels {
QStreamKernel qstream_kernel_avx2() { return &QStream::kernel; }
}  // namespace tokamax::kernels
