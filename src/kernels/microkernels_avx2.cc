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

float exp_shift_sum_avx2(float* x, int64_t n, float shift) {
  return exp_shift_sum_impl(x, n, shift);
}

}  // namespace tokamax::kernels
