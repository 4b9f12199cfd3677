// AVX-512 microkernels (f32 FMA and bf16 vdpbf16ps), nr = 32 (two zmm per row).
// Compiled with -mavx512f/bw/vl/dq/bf16; called only when the CPU has them. No STL here: an
// inline template instantiated in this file could otherwise be shared with baseline code.
// `objdump -d` check: the k-loop of f32_tile<12> holds 24 vfmadd231ps with embedded broadcasts
// and no stack spills.
#include <immintrin.h>

#include "ops/ragged_dot/native_kernels.h"

namespace tokamax::rdot::kernels {
namespace {

constexpr int kNr = 32;

// Writes (or adds, when accumulating over K blocks) the MR x 32 accumulators to C.
template <int MR>
inline void store_tile(__m512 (&c0)[MR], __m512 (&c1)[MR], float* c, int64_t ldc, bool acc) {
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    if (acc) {
      c0[i] = _mm512_add_ps(c0[i], _mm512_loadu_ps(ci));
      c1[i] = _mm512_add_ps(c1[i], _mm512_loadu_ps(ci + 16));
    }
    _mm512_storeu_ps(ci, c0[i]);
    _mm512_storeu_ps(ci + 16, c1[i]);
  }
}

template <int MR>
void f32_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, float* c,
              int64_t ldc, bool acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * kNr), b1 = _mm512_load_ps(b + k * kNr + 16);
    const float* ak = a + k * cs;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ak[i * rs]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  store_tile<MR>(c0, c1, c, ldc, acc);
}

template <int MR>
void bf16_tile(int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, float* c, int64_t ldc,
               bool acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kp; ++k) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + k * kNr);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + k * kNr + 16);
    const uint32_t* ak = a + k * as;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(ak[i]));
      c0[i] = _mm512_dpbf16_ps(c0[i], ai, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], ai, b1);
    }
  }
  store_tile<MR>(c0, c1, c, ldc, acc);
}

#define TOKAMAX_MR_CASES(F, ...) \
  switch (mr) {                  \
    case 1:                      \
      F<1>(__VA_ARGS__);         \
      break;                     \
    case 2:                      \
      F<2>(__VA_ARGS__);         \
      break;                     \
    case 3:                      \
      F<3>(__VA_ARGS__);         \
      break;                     \
    case 4:                      \
      F<4>(__VA_ARGS__);         \
      break;                     \
    case 5:                      \
      F<5>(__VA_ARGS__);         \
      break;                     \
    case 6:                      \
      F<6>(__VA_ARGS__);         \
      break;                     \
    case 7:                      \
      F<7>(__VA_ARGS__);         \
      break;                     \
    case 8:                      \
      F<8>(__VA_ARGS__);         \
      break;                     \
    case 9:                      \
      F<9>(__VA_ARGS__);         \
      break;                     \
    case 10:                     \
      F<10>(__VA_ARGS__);        \
      break;                     \
    case 11:                     \
      F<11>(__VA_ARGS__);        \
      break;                     \
    default:                     \
      F<12>(__VA_ARGS__);        \
      break;                     \
  }

void f32_kernel(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
                float* c, int64_t ldc, bool acc) {
  TOKAMAX_MR_CASES(f32_tile, kc, a, rs, cs, b, c, ldc, acc)
}

void bf16_kernel(int mr, int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, float* c,
                 int64_t ldc, bool acc) {
  TOKAMAX_MR_CASES(bf16_tile, kp, a, as, b, c, ldc, acc)
}

const KernelSet kSet{Isa::kAvx512, "avx512", kNr, 12, f32_kernel, bf16_kernel};

}  // namespace

const KernelSet* avx512_kernels() { return &kSet; }

}  // namespace tokamax::rdot::kernels
