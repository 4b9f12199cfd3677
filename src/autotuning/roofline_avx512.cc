// AVX-512 peak loops. Accumulators are separate locals (not an array): GCC 12 spills arrays
// of vector accumulators; `objdump -d` shows 12 vfmadd231ps zmm per iteration, no spills.
#include <immintrin.h>

#include "autotuning/roofline_kernels.h"

namespace tokamax::roofline {

#define TOKAMAX_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

namespace {
float reduce12(__m512 c0, __m512 c1, __m512 c2, __m512 c3, __m512 c4, __m512 c5, __m512 c6,
               __m512 c7, __m512 c8, __m512 c9, __m512 c10, __m512 c11) {
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                           _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  // Not _mm512_reduce_add_ps: GCC 12's header trips -Wuninitialized on it.
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}
}  // namespace

float fma_f32_avx512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  TOKAMAX_R12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_fmadd_ps(c##i, m, a);
    TOKAMAX_R12(STEP)
#undef STEP
  }
  return reduce12(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11);
}

float dot_bf16_avx512(int64_t iters) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3380);  // ~6e-8
#define DECL(i) __m512 c##i = _mm512_set1_ps(static_cast<float>(i));
  TOKAMAX_R12(DECL)
#undef DECL
  for (int64_t it = 0; it < iters; ++it) {
#define STEP(i) c##i = _mm512_dpbf16_ps(c##i, x, y);
    TOKAMAX_R12(STEP)
#undef STEP
  }
  return reduce12(c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11);
}

}  // namespace tokamax::roofline
