// The norm row kernels at AVX2's width (this file is compiled with -mavx2 -mfma).
#define TOKAMAX_NORM_WIDTH 8
#include <immintrin.h>
#define TOKAMAX_NORM_STREAM_F32(p, v) _mm256_stream_ps(p, (__m256)(v))
#define TOKAMAX_NORM_STREAM_BF16(p, h) _mm_stream_si128(reinterpret_cast<__m128i*>(p), (__m128i)(h))
#include "kernels/norm_impl.h"

namespace tokamax::kernels {
NormKernels norm_kernels_avx2() { return NormRows::kernels(); }
}  // namespace tokamax::kernels
