// The norm row kernels at AVX-512's width (this file is compiled with -mavx512f and friends).
#define TOKAMAX_NORM_WIDTH 16
#include <immintrin.h>
#define TOKAMAX_NORM_STREAM_F32(p, v) _mm512_stream_ps(p, (__m512)(v))
#define TOKAMAX_NORM_STREAM_BF16(p, h) \
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), (__m256i)(h))
#include "kernels/norm_impl.h"

namespace tokamax::kernels {
NormKernels norm_kernels_avx512() { return NormRows::kernels(); }
}  // namespace tokamax::kernels
