// AVX2 peak loops and the streaming memory loops (AVX2 is enough to saturate memory).
#include <immintrin.h>

#include "autotuning/roofline_kernels.h"

namespace tokamax::roofline {

#define TOKAMAX_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

float fma_f32_avx2(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.999999f), a = _mm256_set1_ps(1e-7f);
#define DECL(i) __m256 c##i = _mm256_set1_ps(static_cast<float>(i));
  TOKAMAX_R12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm256_fmadd_ps(c##i, m, a);
    TOKAMAX_R12(STEP)
#undef STEP
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

float read_f32_avx2(const float* p, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float r = out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
  for (; i < n; ++i) r += p[i];
  return r;
}

void copy_f32_avx2(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    _mm256_store_ps(dst + i, _mm256_load_ps(src + i));
    _mm256_store_ps(dst + i + 8, _mm256_load_ps(src + i + 8));
    _mm256_store_ps(dst + i + 16, _mm256_load_ps(src + i + 16));
    _mm256_store_ps(dst + i + 24, _mm256_load_ps(src + i + 24));
  }
  for (; i < n; ++i) dst[i] = src[i];
}

}  // namespace tokamax::roofline
