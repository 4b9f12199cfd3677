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
  // Eight interleaved streams (eighths of the buffer), one accumulator each: DRAM bandwidth
  // needs many misses in flight, which one sequential stream does not produce on every chip
  // (on Zen 4 here: ~23 GB/s per core from one stream, ~30+ from eight).
  constexpr int kStreams = 8;
  const int64_t q = n / kStreams / 8 * 8;
  __m256 a[kStreams];
  for (int s = 0; s < kStreams; ++s) a[s] = _mm256_setzero_ps();
  for (int64_t i = 0; i < q; i += 8) {
#pragma GCC unroll 8
    for (int s = 0; s < kStreams; ++s) a[s] = _mm256_add_ps(a[s], _mm256_load_ps(p + s * q + i));
  }
  __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])),
                           _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7])));
  alignas(32) float out[8];
  _mm256_store_ps(out, t);
  float r = out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
  for (int64_t i = kStreams * q; i < n; ++i) r += p[i];
  return r;
}

// Non-temporal stores: the fastest way to write memory that will not be read back soon (an
// ordinary store first reads each line for ownership, a third more traffic). Kernels that
// write large outputs this way (the norms) are measured against this ceiling, not against an
// ordinary-store copy they can beat (Zen 4, 2 threads: 0.70x the time of that copy's rate).
void copy_f32_avx2(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  // The streamed part starts at a 32-byte boundary of dst.
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32 != 0; ++i) dst[i] = src[i];
  for (; i + 32 <= n; i += 32) {
    _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    _mm256_stream_ps(dst + i + 8, _mm256_loadu_ps(src + i + 8));
    _mm256_stream_ps(dst + i + 16, _mm256_loadu_ps(src + i + 16));
    _mm256_stream_ps(dst + i + 24, _mm256_loadu_ps(src + i + 24));
  }
  _mm_sfence();
  for (; i < n; ++i) dst[i] = src[i];
}

}  // namespace tokamax::roofline
