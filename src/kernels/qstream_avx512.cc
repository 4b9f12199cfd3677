// The quantized streaming kernel at AVX-512's width (compiled with -mavx512f and friends).
#define TOKAMAX_QSTREAM_WIDTH 16
#include <immintrin.h>
#define TOKAMAX_QSTREAM_WIDEN_U8(p) \
  _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_WIDEN_I8(p) \
  _mm512_maskz_cvtepi8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_WIDEN_U8_U16(p) \
  _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define TOKAMAX_QSTREAM_F16_TO_F32(h) _mm512_maskz_cvtph_ps(0xffff, (__m256i)(h))
#define TOKAMAX_QSTREAM_LOOKUP(table, idx) \
  _mm512_maskz_permutexvar_ps(0xffff, (__m512i)(idx), (__m512)(table))
#include "kernels/qstream_impl.h"

namespace tokamax::kernels {
QStreamKernel qstream_kernel_avx512() { return &QStream::kernel; }
}  // namespace tokamax::kernels
