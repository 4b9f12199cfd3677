// AVX2+FMA microkernel (f32), nr = 16 (two ymm per row), up to 6 rows (12 accumulators of 16
// registers). bf16 weights are widened to f32 panels at pack time on this ISA.
#include <immintrin.h>

#include "kernels/exp_sum.h"
#include "kernels/microkernels.h"

namespace tokamax::kernels {
namespace {

constexpr int kNr = 16;

template <int MR>
void f32_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, float* c,
              int64_t ldc, bool acc) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * kNr), b1 = _mm256_load_ps(b + k * kNr + 8);
    const float* ak = a + k * cs;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(ak + i * rs);
      c0[i] = _mm256_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm256_fmadd_ps(ai, b1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    if (acc) {
      c0[i] = _mm256_add_ps(c0[i], _mm256_loadu_ps(ci));
      c1[i] = _mm256_add_ps(c1[i], _mm256_loadu_ps(ci + 8));
    }
    _mm256_storeu_ps(ci, c0[i]);
    _mm256_storeu_ps(ci + 8, c1[i]);
  }
}

void f32_kernel(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
                float* c, int64_t ldc, bool acc) {
  with_tile_rows<6>(mr, [&]<int MR>() { f32_tile<MR>(kc, a, rs, cs, b, c, ldc, acc); });
}

const KernelSet kSet{Isa::kAvx2, "avx2", kNr, 6, f32_kernel, nullptr};

}  // namespace

const KernelSet* avx2_kernels() { return &kSet; }

namespace {
namespace ep = expf_poly;
// Lanes [0, left) of 8 as a load/store mask.
__m256i tail_mask8(int64_t left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)), idx);
}
float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
}  // namespace

float exp_shift_sum_avx2(float* x, int64_t n, float shift) {
  const __m256 vs = _mm256_set1_ps(shift), lo = _mm256_set1_ps(ep::kLo),
               hi = _mm256_set1_ps(ep::kHi);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = tail_mask8(n - i);
    __m256 v = _mm256_sub_ps(_mm256_maskload_ps(x + i, m), vs);
    const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(v, lo, _CMP_GT_OQ), _mm256_castsi256_ps(m));
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256 kf = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(ep::kLog2e)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(ep::kLn2Hi), v);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(ep::kLn2Lo), r);
    __m256 p = _mm256_set1_ps(ep::kP[0]);
    for (int j = 1; j < 6; ++j) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ep::kP[j]));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
    _mm256_maskstore_ps(x + i, m, e);
    acc = _mm256_add_ps(acc, e);
  }
  return hsum(acc);
}

float scale_max_avx2(float* x, int64_t n, float scale) {
  const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = tail_mask8(n - i);
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), vs);
    _mm256_maskstore_ps(x + i, m, v);
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(m)));
  }
  return hmax(mx);
}

}  // namespace tokamax::kernels
