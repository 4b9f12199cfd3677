// AVX-512 microkernels (f32 FMA and bf16 vdpbf16ps), nr = 32 (two zmm per row).
// Compiled with -mavx512f/bw/vl/dq/bf16; called only when the CPU has them. No STL here: an
// inline template instantiated in this file could otherwise be shared with baseline code.
// `objdump -d` check: the k-loop of f32_tile_impl<14, 1> (and <14, 256>, offsets 0x400 apart)
// holds 2 panel loads, 14 vbroadcastss at constant offsets from one pointer, 28 vfmadd231ps, 2
// prefetcht0 (the panel ahead, below), the every-other-step prefetcht1 of `ahead`, a few scalar
// ops and no stack traffic (checked again 2026-12-06).
// (f32_tile_impl<14, 0>, a row stride at run time, reloads 3 of its 14 row pointers from the
// stack each k and prefetches in the loop nothing: its `ahead` goes at its start. Attention's f32
// prefill on Sapphire Rapids, 3 interleaved pairs of tokamax bench runs: its q k^T on Q packed into
// tiles instead, 111-114 ms against 121-124; then P v on the fixed stride, 105-110 against
// 115-116.)
#include <immintrin.h>

#include <algorithm>

#include "kernels/exp_sum.h"
#include "kernels/microkernels.h"
#include "kernels/prefetch.h"
#include "kernels/stream_prefetch.h"

namespace tokamax::kernels {
namespace {

constexpr int kNr = 32;
// Tile height: 2 x 14 accumulators, 2 panel vectors and the broadcast fill the 32 registers.
// The 2 panel loads and the loop's scalar ops are shared by 28 FMAs instead of 24
// (tokamax_gemm_bench, 7 interleaved rounds: in L1 0.82 vs 0.78 of the FMA peak for 12 rows;
// the pre-packed GEMM 0.70 vs 0.67).
constexpr int kMaxMr = 14;
// The tiles prefetch their B panel into L1 kPanelAhead k steps ahead and, kTileAhead steps
// before the end, their C tile (read back when accumulating over K blocks, then written). Why:
// with A, B and C in L1 the 14-row tile runs at 0.98-0.99 of the FMA peak, but in the packed
// GEMM each tile reads its panel (K blocks of 512: 64 KiB of floats, twice the L1, or 32 KiB of
// bf16 pairs, the whole L1) from L2 and its C tile from L2 or the L3. tokamax_gemm_bench,
// M=4096, K=2048, N=11264 pre-packed, 2 threads, three alternated runs of 5 rounds each:
// 0.93-0.95 of the peak against 0.91-0.93 without; the f32 GLU at M=4096, K=2048, N=5632
// 860-878 ms against 883-915 (3 alternated pairs of tokamax bench runs). Also prefetching A's
// next steps, or the panel's start for the next tile in the last steps: no better. In a K
// block's last kPanelAhead steps the panel prefetch runs past the panel (into the next one, or
// past the buffer: prefetches do not fault), as stream_chunk's; K blocks shorter than
// kTileAhead prefetch C at their first step.
constexpr int64_t kPanelAhead = 16;
constexpr int64_t kTileAhead = 24;

inline void prefetch_two_lines(const void* b) {
  prefetch_t0(b);
  prefetch_t0(static_cast<const char*>(b) + 64);
}
template <int MR>
inline void prefetch_c_tile(const float* c, int64_t ldc) {
  for (int i = 0; i < MR; ++i) {
    prefetch_two_lines(c + i * ldc);
  }
}

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

// RS: A's row stride when fixed at compile time (1: a packed A tile, or a transposed block; or
// attention's S block, rows block_kv apart), so the MR broadcasts of one k are constant offsets
// from one pointer that steps by cs. RS = 0: rs at run time, where GCC keeps MR row offsets
// live, runs out of general registers and reloads them from the stack inside the k-loop:
// scalar uops that compete with the FMAs for ports 0 and 5.
//
// `ahead` (the grouped GEMM's next panel, a slice per tile) goes into L2 a line every other k
// step, not all at the tile's start: a burst of ~70 prefetches from the L3 holds the core's
// fill buffers, and the tile's own panel loads from L2 wait behind them. Sapphire Rapids,
// tokamax_gemm_bench (pre-packed M=4096, K=2048, N=11264, 2 threads), 3 interleaved runs of 3
// rounds: 0.79-0.83 of the FMA peak spread against 0.75-0.77 in a burst and 0.74-0.78 with no
// next-panel prefetch; a line every step or every fourth 0.76-0.83.
template <int MR, int64_t RS>
void f32_tile_impl(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, float* c,
                   int64_t ldc, bool acc, L2Ahead ahead) {
  constexpr bool kFixedRs = RS != 0;
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  const float* ak = a;
  const int64_t c_at = kc > kTileAhead ? kc - kTileAhead : 0;
  int64_t pf = 0;  // bytes of `ahead` issued
  if constexpr (!kFixedRs) {
    prefetch_l2(ahead.p, 0, ahead.bytes);
    pf = ahead.bytes;
  }
  for (int64_t k = 0; k < kc; ++k, b += kNr, ak += cs) {
    // (Not with a run-time row stride: that loop is already short of registers, see above.)
    if constexpr (kFixedRs) {
      if ((k & 1) == 0 && pf < ahead.bytes) {
        prefetch_t1(ahead.p + pf);
        pf += 64;
      }
      prefetch_two_lines(b + kPanelAhead * kNr);
      if (k == c_at) prefetch_c_tile<MR>(c, ldc);
    }
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(kFixedRs ? ak[i * RS] : ak[i * rs]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  // What a short k loop left (items of fewer than 4 tiles take more than kc / 2 lines each).
  prefetch_l2(ahead.p, pf, ahead.bytes);
  store_tile<MR>(c0, c1, c, ldc, acc);
}

// Full tiles whose rows are one of these strides apart (attention's S and dS blocks: rows
// block_kv floats apart) run with the stride fixed.
template <int MR>
void f32_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, float* c,
              int64_t ldc, bool acc, L2Ahead ahead) {
  if (rs == 1) return f32_tile_impl<MR, 1>(kc, a, rs, cs, b, c, ldc, acc, ahead);
  if constexpr (MR == kMaxMr) {
    switch (rs) {
      case 128:
        return f32_tile_impl<MR, 128>(kc, a, rs, cs, b, c, ldc, acc, ahead);
      case 256:
        return f32_tile_impl<MR, 256>(kc, a, rs, cs, b, c, ldc, acc, ahead);
      case 512:
        return f32_tile_impl<MR, 512>(kc, a, rs, cs, b, c, ldc, acc, ahead);
      default:
        break;
    }
  }
  f32_tile_impl<MR, 0>(kc, a, rs, cs, b, c, ldc, acc, ahead);
}

template <int MR>
void bf16_tile(int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, float* c, int64_t ldc,
               bool acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  const int64_t c_at = kp > kTileAhead ? kp - kTileAhead : 0;
  for (int64_t k = 0; k < kp; ++k) {
    prefetch_two_lines(b + (k + kPanelAhead) * kNr);
    if (k == c_at) prefetch_c_tile<MR>(c, ldc);
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

template <int MR, int NP>
inline void zero_panels(__m512 (&c0)[MR][NP], __m512 (&c1)[MR][NP]) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
    for (int p = 0; p < NP; ++p) c0[i][p] = c1[i][p] = _mm512_setzero_ps();
  }
}

// Stores NP adjacent MR x 32 tiles (panel p at column p * 32).
template <int MR, int NP>
inline void store_panels(__m512 (&c0)[MR][NP], __m512 (&c1)[MR][NP], float* c, int64_t ldc,
                         bool acc) {
#pragma GCC unroll 8
  for (int p = 0; p < NP; ++p) {
    __m512 t0[MR], t1[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      t0[i] = c0[i][p];
      t1[i] = c1[i][p];
    }
    store_tile<MR>(t0, t1, c + p * kNr, ldc, acc);
  }
}

// Decode: MR rows (1..4) against NP panels at once; 2 * MR * NP accumulators (<= 24).
template <int MR, int NP>
void f32_multi_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ps,
                    float* c, int64_t ldc, bool acc) {
  __m512 c0[MR][NP], c1[MR][NP];
  zero_panels<MR, NP>(c0, c1);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 ai[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) ai[i] = _mm512_set1_ps(a[k * cs + i * rs]);
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512 b0 = _mm512_load_ps(b + p * ps + k * kNr),
                   b1 = _mm512_load_ps(b + p * ps + k * kNr + 16);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        c0[i][p] = _mm512_fmadd_ps(ai[i], b0, c0[i][p]);
        c1[i][p] = _mm512_fmadd_ps(ai[i], b1, c1[i][p]);
      }
    }
  }
  store_panels<MR, NP>(c0, c1, c, ldc, acc);
}

template <int MR, int NP>
void bf16_multi_tile(int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, int64_t ps,
                     float* c, int64_t ldc, bool acc) {
  __m512 c0[MR][NP], c1[MR][NP];
  zero_panels<MR, NP>(c0, c1);
  for (int64_t k = 0; k < kp; ++k) {
    __m512bh ai[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      ai[i] = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[k * as + i]));
#pragma GCC unroll 8
    for (int p = 0; p < NP; ++p) {
      const __m512bh b0 = (__m512bh)_mm512_load_si512(b + p * ps + k * kNr);
      const __m512bh b1 = (__m512bh)_mm512_load_si512(b + p * ps + k * kNr + 16);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        c0[i][p] = _mm512_dpbf16_ps(c0[i][p], ai[i], b0);
        c1[i][p] = _mm512_dpbf16_ps(c1[i][p], ai[i], b1);
      }
    }
  }
  store_panels<MR, NP>(c0, c1, c, ldc, acc);
}

// Panels per multi call by tile rows: at most 4 (4 concurrent weight streams per thread), though
// the 32 registers would allow 8 for one row and 6 for two: fewer streams read memory faster,
// the hardware prefetchers keeping up. One thread, measured side by side: memory_bound (one row
// per group) 27.3 vs 24.2-26.3 GB/s with 8 panels; GPT-OSS / DeepSeek decode (mostly 1-3 rows)
// 27.1-27.8 vs 23.0-27.3 GB/s with 6 panels for two rows. A standalone loop over the same
// layout: 28.5 GB/s with 4 panels, 25 with 8, against a plain read at 28-30.
constexpr int kMultiNp[kMultiMaxMr + 1] = {0, 4, 4, 4, 3};

void f32_multi(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
               int64_t ps, float* c, int64_t ldc, bool acc) {
  with_tile_rows<kMultiMaxMr>(
      mr, [&]<int MR>() { f32_multi_tile<MR, kMultiNp[MR]>(kc, a, rs, cs, b, ps, c, ldc, acc); });
}

void bf16_multi(int mr, int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, int64_t ps,
                float* c, int64_t ldc, bool acc) {
  with_tile_rows<kMultiMaxMr>(
      mr, [&]<int MR>() { bf16_multi_tile<MR, kMultiNp[MR]>(kp, a, as, b, ps, c, ldc, acc); });
}

void f32_kernel(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
                float* c, int64_t ldc, bool acc, L2Ahead ahead) {
  with_tile_rows<kMaxMr>(mr, [&]<int MR>() { f32_tile<MR>(kc, a, rs, cs, b, c, ldc, acc, ahead); });
}

void bf16_kernel(int mr, int64_t kp, const uint32_t* a, int64_t as, const uint32_t* b, float* c,
                 int64_t ldc, bool acc) {
  with_tile_rows<kMaxMr>(mr, [&]<int MR>() { bf16_tile<MR>(kp, a, as, b, c, ldc, acc); });
}

// The 16 x 16 transpose of 32-bit lanes: v[r] lane j becomes v[j] lane r (unpacks of 32 and
// 64 bits within 128-bit lanes, then two rounds of 128-bit lane shuffles). The maskz forms with
// every lane set: GCC 12's unmasked ones trip -Wmaybe-uninitialized.
inline void transpose16x32(__m512i v[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_maskz_unpacklo_epi32(0xFFFF, v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, v[2 * i], v[2 * i + 1]);
  }
  // u[4g + c], lane L: rows 4g..4g+3 of column 4L + c.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 =
        _mm512_maskz_shuffle_i32x4(0xFFFF, u[c], u[4 + c], 0x88);  // lanes 0, 2 of each
    const __m512i x1 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[c], u[4 + c], 0xDD);  // lanes 1, 3
    const __m512i y0 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + c], u[12 + c], 0x88);
    const __m512i y1 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + c], u[12 + c], 0xDD);
    v[c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, y0, 0x88);       // column c
    v[4 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, y1, 0x88);   // column 4 + c
    v[8 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, y0, 0xDD);   // column 8 + c
    v[12 + c] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, y1, 0xDD);  // column 12 + c
  }
}

// A as bf16 pairs from an f32 lhs, 32 values per vcvtne2ps2bf16 (round to nearest even, like
// f32_to_bf16; the instruction also flushes f32 denormals, immaterial next to the 2^-8 step).
// dst is [pairs][as]: 16 rows' 16 pairs at a time are converted (bf16 input: loaded as they
// are), transposed in registers and stored as 16 row runs. Against one row at a time (its 16 pairs
// stored one by one, as rows apart: 16 scalar stores per 32 values), attention prefill bf16 on Zen
// 4 spent 8% of its time here (P packed for P v every kv block; perf record -e cpu-clock). (The
// scalar loop before that cost ~20% of the bf16 GEMM kernel's time at mc=32, kc=512.)
void pack_a_bf16_avx512(const void* a, bool is_bf16, int64_t lda, int64_t rows, int64_t k0,
                        int64_t kc, int64_t as, uint32_t* dst) {
  // bf16 input: no rounding, a row's 32 values are its 16 pairs as they lie in memory.
  const float* base = is_bf16 ? nullptr : static_cast<const float*>(a) + k0;
  const uint16_t* base16 = is_bf16 ? static_cast<const uint16_t*>(a) + k0 : nullptr;
  for (int64_t g = 0; g < as; g += 16) {
    const int64_t lanes = std::min<int64_t>(16, as - g);        // rows of dst written
    const int64_t live = std::clamp<int64_t>(rows - g, 0, 16);  // rows of a read (zeros after)
    const __mmask16 out = static_cast<__mmask16>((1u << lanes) - 1);
    for (int64_t k = 0; k < kc; k += 32) {
      const int64_t rem = kc - k;
      const __mmask16 m_lo = rem >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rem) - 1);
      const __mmask16 m_hi = rem >= 32  ? 0xFFFF
                             : rem > 16 ? static_cast<__mmask16>((1u << (rem - 16)) - 1)
                                        : 0;
      const __mmask32 m16 = rem >= 32 ? ~__mmask32{0} : (__mmask32{1} << rem) - 1;
      __m512i v[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        if (r < live && is_bf16) {
          v[r] = _mm512_maskz_loadu_epi16(m16, base16 + (g + r) * lda + k);
        } else if (r < live) {
          const float* p = base + (g + r) * lda + k;
          v[r] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m_hi, p + 16),
                                                               _mm512_maskz_loadu_ps(m_lo, p)));
        } else {
          v[r] = _mm512_setzero_si512();
        }
      }
      transpose16x32(v);
      const int64_t n = rem >= 32 ? 16 : (rem + 1) / 2;  // pairs in this step
      uint32_t* d = dst + (k / 2) * as + g;
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j < n) _mm512_mask_storeu_epi32(d + j * as, out, v[j]);
      }
    }
  }
}

// Up to 16 rows (live of them read, the rest zero) of a tile into dst[k * mr + i], i < width.
void pack_a_f32_half(const float* src, int64_t lda, int64_t live, int64_t kc, int width, int mr,
                     float* d) {
  const __mmask16 out_mask = static_cast<__mmask16>((1u << width) - 1);
  for (int64_t kb = 0; kb < kc; kb += 16) {
    const int64_t n = kc - kb < 16 ? kc - kb : 16;
    const __mmask16 in_mask = static_cast<__mmask16>((1u << n) - 1);
    __m512i col[16];  // row i's 16 values, then (transposed) column k's 16 rows
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      col[i] = i < live ? _mm512_castps_si512(_mm512_maskz_loadu_ps(in_mask, src + i * lda + kb))
                        : _mm512_setzero_si512();
    }
    transpose16x32(col);
    float* o = d + kb * mr;
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      if (k < n) _mm512_mask_storeu_ps(o + k * mr, out_mask, _mm512_castsi512_ps(col[k]));
    }
  }
}

// A into mr-row f32 tiles dst[t][k][mr] (pack_a_f32's layout), 16 k at a time: the 16 values
// of each of the tile's rows (16 with zeros past mr or past the last row), a 16 x 16 transpose
// in registers, then each k's mr values stored as one masked vector. The scalar loop this
// replaces takes 1.32 ns a value, this one 0.16 (tokamax_gemm_bench, 7 interleaved rounds).
// mr <= 32: a tile taller than 16 rows goes as two halves (attention packs K^T panels of 32
// kv positions with it). (The maskz forms with a full mask: see widen_bf16_bits.)
void pack_a_f32_avx512(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                       float* dst) {
  const int64_t tiles = (rows + mr - 1) / mr;
  for (int64_t t = 0; t < tiles; ++t) {
    for (int h = 0; h < mr; h += 16) {
      const int64_t live = std::clamp<int64_t>(std::min<int64_t>(rows - t * mr, mr) - h, 0, 16);
      pack_a_f32_half(live > 0 ? a + (t * mr + h) * lda + k0 : a, lda, live, kc,
                      std::min(mr - h, 16), mr, dst + t * mr * kc + h);
    }
  }
}

// --- Weight streaming from the caller's layout (see StreamKernel) ---

// 16 bf16 values as the high halves of 32-bit lanes, i.e. as exact f32s. (The maskz forms with
// a full mask: GCC 12's unmasked ones start from _mm512_undefined_epi32, which trips
// -Wuninitialized.)
inline __m512i widen_bf16_bits(__m256i h) {
  return _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16);
}

// 16 weights as f32 (bf16 widened exactly: its bits are the high half of the f32's); MASKED
// loads the first `m` lanes only (the column tail), zeros the rest.
template <bool BF16, bool MASKED>
inline __m512 load_w(const void* b, int64_t idx, __mmask16 m) {
  if constexpr (BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(b) + idx;
    const __m256i h = MASKED ? _mm256_maskz_loadu_epi16(m, p)
                             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(widen_bf16_bits(h));
  } else {
    const float* p = static_cast<const float*>(b) + idx;
    return MASKED ? _mm512_maskz_loadu_ps(m, p) : _mm512_loadu_ps(p);
  }
}

// The MR x V accumulators of c's columns [j, j + 16 V) (MASKED, V = 1: the lanes of m) in
// and out: the streaming kernels' c blocks.
template <int MR, int V, bool MASKED>
inline void load_acc(__m512 (&acc)[MR][V], const float* c, int64_t ldc, int64_t j, __mmask16 m) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[i][v] = MASKED ? _mm512_maskz_loadu_ps(m, c + i * ldc + j)
                         : _mm512_loadu_ps(c + i * ldc + j + 16 * v);
    }
  }
}
template <int MR, int V, bool MASKED>
inline void store_acc(const __m512 (&acc)[MR][V], float* c, int64_t ldc, int64_t j, __mmask16 m) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      if (MASKED)
        _mm512_mask_storeu_ps(c + i * ldc + j, m, acc[i][v]);
      else
        _mm512_storeu_ps(c + i * ldc + j + 16 * v, acc[i][v]);
    }
  }
}

// Columns [j, j+16V) of rows k0..k0+S-1 of b into the MR accumulator rows of c: V vectors of
// each weight row (V = 2: 128 bytes of f32, one whole line of bf16, instead of half a line per
// pass). The lhs values are broadcast from memory inside the FMAs (c may alias a as far as the
// compiler knows, so it does not hoist them into S * MR registers): S is then not bounded by
// the register file. MASKED (V = 1 only) loads and stores the first lanes of `m`.
template <int MR, int S, bool BF16, int V, bool MASKED>
inline void stream_chunk(const float* a, int64_t lda, int64_t k0, const void* b, int64_t ldb,
                         int64_t j, __mmask16 m, float* c, int64_t ldc) {
  static_assert(V == 1 || !MASKED);
  __m512 acc[MR][V];
  load_acc<MR, V, MASKED>(acc, c, ldc, j, m);
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    __m512 w[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) w[v] = load_w<BF16, MASKED>(b, (k0 + s) * ldb + j + 16 * v, m);
      // The lines of the next pass's rows (S rows on), one per 64 bytes, into L2: a pass of
      // f32 rows 1024 wide is 32 KB, which would evict this pass from L1 (T1 vs T0, two runs:
      // memory_bound 1.08-1.09 vs 1.07-1.15 the packed call's time, Qwen3 f32 0.94-0.98 vs
      // 1.03-1.11, bf16 the same).
#pragma GCC unroll 2
    for (int v = 0; v < V; v += BF16 ? 2 : 1)
      prefetch_t1(static_cast<const char*>(b) + ((k0 + S + s) * ldb + j + 16 * v) * (BF16 ? 2 : 4));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * lda + k0 + s]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(x, w[v], acc[i][v]);
    }
  }
  store_acc<MR, V, MASKED>(acc, c, ldc, j, m);
}

// block.template operator()<V, false>(j, all lanes) over c's columns in blocks of 16 V, then
// of 16, then <1, true> for the tail, with the tail's lanes as the mask.
template <int V, class Block>
inline void column_blocks(int64_t cols, Block&& block) {
  int64_t j = 0;
  for (; j + 16 * V <= cols; j += 16 * V) block.template operator()<V, false>(j, 0xFFFF);
  for (; j + 16 <= cols; j += 16) block.template operator()<1, false>(j, 0xFFFF);
  if (j < cols) {
    block.template operator()<1, true>(j, static_cast<__mmask16>((1u << (cols - j)) - 1));
  }
}

// S consecutive rows of b (S streams side by side) against the MR rows of c, which stay in L1.
template <int MR, int S, bool BF16>
inline void stream_rows(int64_t k0, const float* a, int64_t lda, const void* b, int64_t ldb,
                        int64_t cols, float* c, int64_t ldc) {
  column_blocks<2>(cols, [&]<int V, bool MASKED>(int64_t j, __mmask16 m) {  // V: see stream_chunk
    stream_chunk<MR, S, BF16, V, MASKED>(a, lda, k0, b, ldb, j, m, c, ldc);
  });
}

template <int MR, bool BF16>
void stream_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t cols,
                 float* c, int64_t ldc) {
  for (int i = 0; i < MR; ++i) {
    for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = 0.0f;
  }
  // 8 rows per pass over the columns: 8 weight streams in flight per thread, each read in
  // 128-byte pieces and prefetched a pass ahead, and the MR rows of c loaded and stored once
  // per 8 weight rows. Two threads, Emerald Rapids, interleaved with the packed call (ratio of
  // times, two runs): Qwen3 decode bf16 8 rows 1.06-1.08, 16 rows 1.08; memory_bound bf16
  // 1.07-1.10 vs 1.13-1.17; GPT-OSS decode f32 1.07-1.08 vs 1.16. Without the prefetch, Qwen3
  // bf16 was 1.30 (its 1.5 KB rows are too short for the hardware prefetchers to follow 16
  // interleaved streams).
  constexpr int S = 8;
  int64_t k = 0;
  for (; k + S <= K; k += S) stream_rows<MR, S, BF16>(k, a, lda, b, ldb, cols, c, ldc);
  for (; k < K; ++k) stream_rows<MR, 1, BF16>(k, a, lda, b, ldb, cols, c, ldc);
}

// c += a b for a short K (attention's P v over a block of kv positions): column blocks of 16 V
// whose MR x V accumulators stay in registers over all K rows of b, c loaded and stored once
// per block. Rows k < pf_rows also prefetch this block's columns of the next block's row k
// (StreamAccKernel).
template <int MR, int V, bool BF16, bool MASKED>
inline void acc_block(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t j,
                      __mmask16 m, float* c, int64_t ldc, int64_t pf_rows, int64_t l1_ahead) {
  static_assert(V == 1 || !MASKED);
  constexpr int64_t es = BF16 ? 2 : 4;
  __m512 acc[MR][V];
  load_acc<MR, V, MASKED>(acc, c, ldc, j, m);
  for (int64_t k = 0; k < K; ++k) {
    if (k < pf_rows) prefetch_row(b, es, K + k, ldb, j, 16 * V);  // the next block's row k
    prefetch_row_l1(b, es, k, ldb, j, 16 * V, l1_ahead);
    __m512 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) w[v] = load_w<BF16, MASKED>(b, k * ldb + j + 16 * v, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(x, w[v], acc[i][v]);
    }
  }
  store_acc<MR, V, MASKED>(acc, c, ldc, j, m);
}

template <int MR, bool BF16>
void stream_acc_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb,
                     int64_t cols, float* c, int64_t ldc, int64_t pf_rows, int64_t l1_ahead) {
  // MR x V <= 16 accumulators.
  column_blocks<MR <= 4 ? 4 : 2>(cols, [&]<int V, bool MASKED>(int64_t j, __mmask16 m) {
    acc_block<MR, V, BF16, MASKED>(K, a, lda, b, ldb, j, m, c, ldc, pf_rows, l1_ahead);
  });
}

// The sum (or the largest) of the 16 lanes, by a shuffle tree: a short softmax row's sum and
// max are on its critical path. (Not _mm512_reduce_add_ps: GCC 12's header trips
// -Wuninitialized.)
template <bool kMax>
inline float hreduce(__m512 v) {
  const auto op4 = [](__m128 x, __m128 y) { return kMax ? _mm_max_ps(x, y) : _mm_add_ps(x, y); };
  const __m256 lo = _mm512_maskz_extractf32x8_ps(0xFF, v, 0);
  const __m256 hi = _mm512_maskz_extractf32x8_ps(0xFF, v, 1);
  const __m256 h = kMax ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  __m128 q = op4(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = op4(q, _mm_movehl_ps(q, q));
  q = op4(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float hsum(__m512 v) { return hreduce<false>(v); }
inline float hmax(__m512 v) { return hreduce<true>(v); }

// The sums of the 16 lanes of a, b, c and d, in that order: the four reduced together (6
// shuffles and 3 adds to per-lane partial sums, then 2 and 2 across the 128-bit lanes) rather
// than each by hsum (about 9 operations apiece). A decode row's q k^T is 4 dot products per K
// row, so its reductions cost as much as its FMAs when taken one by one.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], then [a, b, c, d] of the lane's 4 floats.
  const __m512 ab =
      _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, a, b), _mm512_maskz_unpackhi_ps(0xFFFF, a, b));
  const __m512 cd =
      _mm512_add_ps(_mm512_maskz_unpacklo_ps(0xFFFF, c, d), _mm512_maskz_unpackhi_ps(0xFFFF, c, d));
  const __m512 abcd = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, _mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, _mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // The four 128-bit lanes added.
  const __m256 half = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, abcd, 0),
                                    _mm512_maskz_extractf32x8_ps(0xFF, abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Transposed weights: JB output columns are JB rows of b, each a contiguous stream along K.
// Inlined: called per head from heads_impl, its by-value RowLines went through the stack, the
// caller's 8-byte stores read back as one vector, a store-forwarding stall on every call (27%
// of heads_impl's own samples on two instructions; perf record -e cpu-clock, decode warm in L2).
// Inlined, decode warm one thread 0.94-0.95x the time (3 interleaved pairs of a one-off
// program), from a flushed cache (tokamax bench --tag decode, 3 pairs) f32 69.2-73.8% of the
// read ceiling against 66.6-70.1%, bf16 alike (51.6-57.6% against 52.4-55.3%).
template <int MR, int JB, bool BF16>
__attribute__((always_inline)) inline void stream_t_cols(int64_t K, const float* a, int64_t lda,
                                                         const void* b, int64_t ldb, int64_t j0,
                                                         float* c, int64_t ldc, RowLines pfl = {},
                                                         int64_t l1_ahead = 0) {
  __m512 acc[MR][JB];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int jj = 0; jj < JB; ++jj) acc[i][jj] = _mm512_setzero_ps();
  }
  const int64_t per = pfl.per_step((K + 15) / 16);
  auto step = [&]<bool MASKED>(int64_t k, __mmask16 m) {
    pfl.issue(per);
    if (l1_ahead && (!BF16 || k % 32 == 0)) {  // a line of each row (bf16: every other step)
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj) {
        prefetch_t0(static_cast<const char*>(b) + ((j0 + jj) * ldb + k) * (BF16 ? 2 : 4) +
                    l1_ahead);
      }
    }
    __m512 w[JB];
#pragma GCC unroll 4
    for (int jj = 0; jj < JB; ++jj) w[jj] = load_w<BF16, MASKED>(b, (j0 + jj) * ldb + k, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x =
          MASKED ? _mm512_maskz_loadu_ps(m, a + i * lda + k) : _mm512_loadu_ps(a + i * lda + k);
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj) acc[i][jj] = _mm512_fmadd_ps(x, w[jj], acc[i][jj]);
    }
  };
  int64_t k = 0;
#pragma GCC unroll 8
  for (; k + 16 <= K; k += 16) step.template operator()<false>(k, 0xFFFF);
  if (k < K) step.template operator()<true>(k, static_cast<__mmask16>((1u << (K - k)) - 1));
  pfl.rest();
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if constexpr (JB == 4) {
      _mm_storeu_ps(c + i * ldc + j0, sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    } else {
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj) c[i * ldc + j0 + jj] = hsum(acc[i][jj]);
    }
  }
}

template <int MR, bool BF16>
void stream_t_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t cols,
                   float* c, int64_t ldc) {
  constexpr int JB = MR <= 4 ? 4 : 2;  // MR * JB accumulators + JB weights + 1 lhs register
  // Rows of b a few groups ahead are prefetched whole: rows apart by more than a page (a KV
  // cache's [S, heads, H] read one head at a time) defeat the hardware prefetchers. Measured on
  // decode attention when it read one head at a time (rows 4 KB apart): without it the reads
  // ran at about half the ceiling. Decode now reads a few positions of every head at a time, 32
  // rows a call, and measured the same with and without it (three interleaved runs).
  constexpr int64_t kAhead = 24;
  const int64_t row_bytes = K * (BF16 ? 2 : 4);
  auto prefetch_rows = [&](int64_t j0, int64_t n) {
    for (int64_t j = j0; j < std::min(cols, j0 + n); ++j) {
      const char* row = static_cast<const char*>(b) + j * ldb * (BF16 ? 2 : 4);
      for (int64_t off = 0; off < row_bytes; off += 64) prefetch_t0(row + off);
    }
  };
  prefetch_rows(0, kAhead);
  int64_t j = 0;
  for (; j + JB <= cols; j += JB) {
    prefetch_rows(j + kAhead, JB);
    stream_t_cols<MR, JB, BF16>(K, a, lda, b, ldb, j, c, ldc);
  }
  for (; j < cols; ++j) stream_t_cols<MR, 1, BF16>(K, a, lda, b, ldb, j, c, ldc);
}

// --- Attention decode on the bf16 dot (DotStreamKernel) ---

// The first n bf16 values at p (all 32 when n >= 32), zeros after: whole pairs for the dot.
inline __m512bh load_pairs(const uint16_t* p, int64_t n) {
  const __mmask32 m = n >= 32 ? ~__mmask32{0} : n <= 0 ? 0 : (__mmask32{1} << n) - 1;
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, p));
}

// a's rows [0, MR) x [k0, k0 + n) rounded to bf16 into dst (row stride ld), zero-padded to
// ld: the lhs of the dot kernels, rounded once per call rather than per use.
template <int MR>
inline void round_rows(const float* a, int64_t lda, int64_t k0, int64_t n, uint16_t* dst,
                       int64_t ld) {
  for (int i = 0; i < MR; ++i) {
    for (int64_t k = 0; k < ld; k += 16) {
      const int64_t left = n - k;
      const __mmask16 m = left >= 16  ? __mmask16{0xFFFF}
                          : left <= 0 ? __mmask16{0}
                                      : static_cast<__mmask16>((1u << left) - 1);
      const __m512 x = _mm512_maskz_loadu_ps(m, a + i * lda + k0 + k);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * ld + k),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)));
    }
  }
}

// q k^T: JB rows of b (positions) against the MR bf16 rows of a (stride lda), 32 k (16 pairs)
// a step; the MR x JB sums reduced four at a time as stream_t_cols does, added to c (ACC) or
// written.
template <int MR, int JB, bool ACC>
void dot_t_cols(int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                int64_t j0, float* c, int64_t ldc) {
  __m512 acc[MR][JB];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int jj = 0; jj < JB; ++jj) acc[i][jj] = _mm512_setzero_ps();
  }
  auto step = [&](int64_t k, int64_t n) {
    __m512bh w[JB];
#pragma GCC unroll 4
    for (int jj = 0; jj < JB; ++jj) w[jj] = load_pairs(b + (j0 + jj) * ldb + k, n);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      // a's rows are zero-padded to whole steps: the full load.
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_loadu_si512(a + i * lda + k));
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj) acc[i][jj] = _mm512_dpbf16_ps(acc[i][jj], x, w[jj]);
    }
  };
  int64_t k = 0;
#pragma GCC unroll 4
  for (; k + 32 <= K; k += 32) step(k, 32);
  if (k < K) step(k, K - k);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc + j0;
    if constexpr (JB == 4) {
      __m128 s = sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      if (ACC) s = _mm_add_ps(s, _mm_loadu_ps(ci));
      _mm_storeu_ps(ci, s);
    } else {
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj) ci[jj] = (ACC ? ci[jj] : 0.0f) + hsum(acc[i][jj]);
    }
  }
}

// K in chunks of this many (a's rounded rows on the stack: 8 rows of 1 KB).
constexpr int64_t kDotChunk = 512;

void dot_stream_t(int mr, int64_t K, const float* a, int64_t lda, const uint16_t* b, int64_t ldb,
                  int64_t cols, float* c, int64_t ldc) {
  if (mr <= 0) return;
  with_tile_rows<kStreamMaxMr>(mr, [&]<int MR>() {
    constexpr int JB = MR <= 4 ? 4 : 2;  // MR x JB accumulators, JB weights, one lhs
    alignas(64) uint16_t ab[MR * kDotChunk];
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kDotChunk) {
      const int64_t n = std::min(kDotChunk, K - k0), ld = (n + 31) / 32 * 32;
      round_rows<MR>(a, lda, k0, n, ab, ld);
      auto cols_of = [&]<bool ACC>() {
        int64_t j = 0;
        for (; j + JB <= cols; j += JB) dot_t_cols<MR, JB, ACC>(n, ab, ld, b + k0, ldb, j, c, ldc);
        for (; j < cols; ++j) dot_t_cols<MR, 1, ACC>(n, ab, ld, b + k0, ldb, j, c, ldc);
      };
      if (k0 == 0)
        cols_of.template operator()<false>();
      else
        cols_of.template operator()<true>();
    }
  });
}

// q k^T for every kv head, position by position (StreamHeadsKernel): b's rows in memory order,
// so a KV cache's sub-block is one forward stream. JB positions at a time, every head in turn:
// the JB rows of a head against its MR rows of a, as stream_t_cols / dot_t_cols do for one
// matrix, so each load of a serves JB positions and the MR x JB sums reduce four at a time into
// JB adjacent logits. One position at a time (a reloaded for each, the MR sums of one position
// reduced together), decode S=8192 from a flushed cache, 2 threads, interleaved pairs: f32
// 1.13x the time (median of 8, range 0.96-1.34), bf16 on the dot 0.98x (10 pairs, 0.71-1.21).
// Its own next positions' K rows are not prefetched (only the caller's `prefetch` rows are,
// HeadsPrefetch): issued in bursts (32 lines a head on f32) before each head's work, decode
// S=8192 from a flushed cache, 2 threads, 3 interleaved runs of tokamax bench, Zen 4: f32 67-74%
// of the read ceiling, bf16 on the dot 55-58%, against 75-84% and 73-76% for a form that spread
// them over the K loop, which had in fact been compiled to nothing (kernels/prefetch.h). Issued
// for real, spread (Sapphire Rapids): this kernel with its data in L2 1.4x the time (rdtsc, one
// thread), decode from a flushed cache alike (see kernels/stream_prefetch.h). KIND: 0 f32 b, 1 bf16
// b widened to f32 (FMA), 2 bf16 b on the bf16 dot (a rounded to bf16 first).
template <int MR, int KIND>
void heads_impl(int heads, int64_t K, const float* a, const void* b, int64_t ldb, int64_t cols,
                float* c, int64_t ldc, const char* pf, int64_t pf_ld, int64_t pf_bytes,
                int64_t l1_ahead) {
  constexpr bool kDot = KIND == 2;
  constexpr int JB = MR <= 4 ? 4 : 2;  // MR x JB accumulators, as stream_t_tile
  const int64_t ld = kDot ? (K + 31) / 32 * 32 : K;
  alignas(64) uint16_t ab[kDot ? kDotHeadsMaxValues : 1];
  if constexpr (kDot) {
    for (int h = 0; h < heads; ++h) round_rows<MR>(a + h * MR * K, K, 0, K, ab + h * MR * ld, ld);
  }
  constexpr int64_t es = KIND == 0 ? 4 : 2;
  const HeadsPrefetch prefetch(heads, pf, pf_ld, pf_bytes);
  auto positions = [&]<int N>(int64_t j) {
    for (int h = 0; h < heads; ++h) {
      // The caller's rows: in a burst before the bf16 dot's columns (Zen 4's form, as measured
      // there), spread over the FMA kernel's K steps (RowLines: on Sapphire Rapids bf16 decode
      // 0.96-1.00x the time of the burst, 52.9-54.5% of the read ceiling against 50.2-52.3, f32
      // alike; 6 interleaved pairs of tokamax bench --tag decode runs).
      if constexpr (kDot) {
        prefetch.extra(j, N, h);
        for (int n = 0; n < N; ++n) prefetch_row_l1(b, es, j + n, ldb, h * K, K, l1_ahead);
      }
      const char* bh = static_cast<const char*>(b) + h * K * es;
      if constexpr (kDot) {
        dot_t_cols<MR, N, false>(K, ab + h * MR * ld, ld, reinterpret_cast<const uint16_t*>(bh),
                                 ldb, j, c + h * MR * ldc, ldc);
      } else {
        stream_t_cols<MR, N, KIND == 1>(K, a + h * MR * K, K, bh, ldb, j, c + h * MR * ldc, ldc,
                                        prefetch.lines(j, N, h), l1_ahead);
      }
    }
  };
  int64_t j = 0;
  for (; j + JB <= cols; j += JB) positions.template operator()<JB>(j);
  for (; j < cols; ++j) positions.template operator()<1>(j);
}

void stream_heads_t(int mr, int heads, int64_t K, const float* a, const void* b, bool b_bf16,
                    int64_t ldb, int64_t cols, float* c, int64_t ldc, const void* prefetch,
                    int64_t prefetch_ld, int64_t prefetch_bytes, int64_t l1_ahead) {
  const char* pf = static_cast<const char*>(prefetch);
  with_rows_and_dtype(mr, b_bf16, [&]<int MR, bool BF16>() {
    heads_impl<MR, BF16 ? 1 : 0>(heads, K, a, b, ldb, cols, c, ldc, pf, prefetch_ld, prefetch_bytes,
                                 l1_ahead);
  });
}

void dot_heads_t(int mr, int heads, int64_t K, const float* a, const void* b, bool /*b_bf16*/,
                 int64_t ldb, int64_t cols, float* c, int64_t ldc, const void* prefetch,
                 int64_t prefetch_ld, int64_t prefetch_bytes, int64_t l1_ahead) {
  if (mr <= 0) return;
  with_tile_rows<kStreamMaxMr>(mr, [&]<int MR>() {
    heads_impl<MR, 2>(heads, K, a, b, ldb, cols, c, ldc, static_cast<const char*>(prefetch),
                      prefetch_ld, prefetch_bytes, l1_ahead);
  });
}

// P v: c's columns [j, j + 32 V) (the first n of them) of the MR rows, accumulated over b's K
// rows two at a time: rows k and k + 1 interleaved into pairs (vpermt2w keeps c's columns in
// order), a's (k, k + 1) broadcast as one 32-bit pair (a's rows are zero-padded to even K).
// An odd K's last row pairs with zeros.
// Rows k < pf_rows also prefetch this block's columns of row k + pf_ahead (StreamAccKernel's).
template <int MR, int V>
inline void dot_acc_block(int64_t K, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                          int64_t j, int64_t n, float* c, int64_t ldc, int64_t pf_ahead,
                          int64_t pf_rows, int64_t l1_ahead) {
  // Lane 2i of the result: element i of the first source; lane 2i + 1: element i of the second
  // (lo: elements 0-15, hi: 16-31).
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(kLo);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  __mmask16 m[2 * V];
#pragma GCC unroll 8
  for (int v = 0; v < 2 * V; ++v) {
    const int64_t left = n - 16 * v;
    m[v] = left >= 16  ? __mmask16{0xFFFF}
           : left <= 0 ? __mmask16{0}
                       : static_cast<__mmask16>((1u << left) - 1);
  }
  __m512 acc[MR][2 * V];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * V; ++v)
      acc[i][v] = _mm512_maskz_loadu_ps(m[v], c + i * ldc + j + 16 * v);
  }
  auto pair = [&](int64_t k, bool odd) {
    for (int64_t r = k; r < k + (odd ? 1 : 2) && r < pf_rows; ++r)
      prefetch_row(b, 2, r + pf_ahead, ldb, j, n < 32 * V ? n : 32 * V);
    for (int64_t r = k; r < k + (odd ? 1 : 2); ++r)
      prefetch_row_l1(b, 2, r, ldb, j, n < 32 * V ? n : 32 * V, l1_ahead);
    __m512bh w[2 * V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const int64_t left = n - 32 * v;
      const __m512i r0 = reinterpret_cast<__m512i>(load_pairs(b + k * ldb + j + 32 * v, left));
      const __m512i r1 =
          odd ? _mm512_setzero_si512()
              : reinterpret_cast<__m512i>(load_pairs(b + (k + 1) * ldb + j + 32 * v, left));
      w[2 * v] = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(r0, lo, r1));
      w[2 * v + 1] = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(r0, hi, r1));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      uint32_t word;
      __builtin_memcpy(&word, a + i * lda + k, 4);
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(word)));
#pragma GCC unroll 8
      for (int v = 0; v < 2 * V; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], x, w[v]);
    }
  };
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) pair(k, false);
  if (k < K) pair(k, true);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * V; ++v)
      _mm512_mask_storeu_ps(c + i * ldc + j + 16 * v, m[v], acc[i][v]);
  }
}

void dot_stream_acc(int mr, int64_t K, const float* a, int64_t lda, const uint16_t* b, int64_t ldb,
                    int64_t cols, float* c, int64_t ldc, int64_t prefetch_rows, int64_t l1_ahead) {
  if (mr <= 0) return;
  with_tile_rows<kStreamMaxMr>(mr, [&]<int MR>() {
    // MR x 2V accumulators, 2V pair vectors, the permute indices and a broadcast.
    constexpr int V = MR <= 4 ? 2 : 1;
    alignas(64) uint16_t ab[MR * kDotChunk];
    for (int64_t k0 = 0; k0 < K; k0 += kDotChunk) {
      const int64_t n = std::min(kDotChunk, K - k0), ld = (n + 31) / 32 * 32;
      round_rows<MR>(a, lda, k0, n, ab, ld);
      const uint16_t* bk = b + k0 * ldb;
      int64_t j = 0;
      // bk's row kk is row k0 + kk of b: the next block's row is K rows on.
      const int64_t pf = prefetch_rows - k0;
      for (; j + 32 * V <= cols; j += 32 * V)
        dot_acc_block<MR, V>(n, ab, ld, bk, ldb, j, 32 * V, c, ldc, K, pf, l1_ahead);
      for (; j < cols; j += 32)
        dot_acc_block<MR, 1>(n, ab, ld, bk, ldb, j, cols - j, c, ldc, K, pf, l1_ahead);
    }
  });
}

void stream(int mr, int64_t K, const float* a, int64_t lda, const void* b, bool b_bf16, int64_t ldb,
            int64_t cols, float* c, int64_t ldc) {
  with_rows_and_dtype(mr, b_bf16, [&]<int MR, bool BF16>() {
    stream_tile<MR, BF16>(K, a, lda, b, ldb, cols, c, ldc);
  });
}

void stream_acc(int mr, int64_t K, const float* a, int64_t lda, const void* b, bool b_bf16,
                int64_t ldb, int64_t cols, float* c, int64_t ldc, int64_t prefetch_rows,
                int64_t l1_ahead) {
  with_rows_and_dtype(mr, b_bf16, [&]<int MR, bool BF16>() {
    stream_acc_tile<MR, BF16>(K, a, lda, b, ldb, cols, c, ldc, prefetch_rows, l1_ahead);
  });
}

void stream_t(int mr, int64_t K, const float* a, int64_t lda, const void* b, bool b_bf16,
              int64_t ldb, int64_t cols, float* c, int64_t ldc) {
  with_rows_and_dtype(mr, b_bf16, [&]<int MR, bool BF16>() {
    stream_t_tile<MR, BF16>(K, a, lda, b, ldb, cols, c, ldc);
  });
}

// bf16 [K,N] weights into pair panels: 16 columns of rows 2kp and 2kp+1 are widened to 32 bits
// and merged (row 2kp in the low half, row 2kp+1 in the high half), two vector loads per 16 pairs
// instead of 32 scalar ones.
void pack_b_bf16(const uint16_t* src, int64_t K, int64_t N, int64_t ld, int nr, uint32_t* dst,
                 int64_t p0, int64_t p1) {
  const int64_t KP = (K + 1) / 2;
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* d = dst + (p - p0) * KP * nr;
    const int64_t j0 = p * nr;
    for (int64_t kp = 0; kp < KP; ++kp) {
      const uint16_t* r0 = src + 2 * kp * ld + j0;
      const bool odd_tail = 2 * kp + 1 >= K;
      for (int64_t h = 0; h < nr; h += 16) {
        const int64_t w = N - j0 - h;
        const __mmask16 m = w >= 16 ? 0xFFFF : w <= 0 ? 0 : static_cast<__mmask16>((1u << w) - 1);
        const __m512i lo = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_maskz_loadu_epi16(m, r0 + h));
        const __m512i hi = odd_tail ? _mm512_setzero_si512()
                                    : widen_bf16_bits(_mm256_maskz_loadu_epi16(m, r0 + ld + h));
        _mm512_storeu_si512(d + kp * nr + h, _mm512_or_si512(lo, hi));
      }
    }
  }
}

const KernelSet kSet{Isa::kAvx512,
                     "avx512",
                     kNr,
                     kMaxMr,
                     f32_kernel,
                     bf16_kernel,
                     f32_multi,
                     bf16_multi,
                     pack_a_bf16_avx512,
                     {kMultiNp[0], kMultiNp[1], kMultiNp[2], kMultiNp[3], kMultiNp[4]},
                     stream,
                     stream_t,
                     pack_b_bf16,
                     false,
                     pack_a_f32_avx512,
                     stream_acc,
                     dot_stream_t,
                     dot_stream_acc,
                     dot_heads_t,
                     stream_heads_t,
                     pack_a_bf16_avx512};

}  // namespace

const KernelSet* avx512_kernels() { return &kSet; }

namespace {
namespace ep = expf_poly;
__mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
}  // namespace

// exp(v) on the lanes of `m`, 0 elsewhere and where v <= kLo (-inf included); +inf above
// ln(FLT_MAX) (+inf included); NaN stays NaN (a NaN logit reaches the softmax's sum and every
// output that depends on it, rather than vanishing as a zero probability). No instruction more
// than without the special values: the clamp to kExpClampAvx512 takes v as its second operand,
// which min returns when either is NaN, so NaN flows through the polynomial; `keep` is "not
// <= kLo", true for NaN. Only the top is clamped, above ln(FLT_MAX): scalef takes any 2^n and
// overflows to +inf (the AVX2 loop's integer 2^n needs both clamps).
inline __m512 exp16(__m512 v, __mmask16 m) {
  const __m512 lo = _mm512_set1_ps(ep::kLo), hi = _mm512_set1_ps(ep::kExpClampAvx512);
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(m, v, lo, _CMP_NLE_UQ);
  v = _mm512_maskz_min_ps(0xFFFF, hi, v);
  const __m512 kf = _mm512_maskz_roundscale_ps(0xFFFF, _mm512_mul_ps(v, _mm512_set1_ps(ep::kLog2e)),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(ep::kLn2Hi), v);
  r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(ep::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(ep::kP[0]);
  for (int j = 1; j < 5; ++j) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ep::kP[j]));
  const __m512 one = _mm512_set1_ps(1.0f);
  p = _mm512_fmadd_ps(_mm512_fmadd_ps(p, r, one), r, one);
  return _mm512_maskz_scalef_ps(keep, p, kf);
}

// x[i] = exp(x[i] * scale - shift), the product rounded before the difference: scale_max's
// scaled value less the max, so the largest value's argument is exactly 0 (a fused x scale - m
// leaves it the product's rounding error, up to half an ulp of m: +-128 past 2^31).
float exp_shift_sum_avx512(float* x, int64_t n, float scale, float shift) {
  const __m512 vs = _mm512_set1_ps(shift), vc = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    __m512 prod = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vc);
    asm("" : "+v"(prod));  // rounded here: GCC would fuse the product into the difference
    const __m512 v = _mm512_sub_ps(prod, vs);
    const __m512 e = exp16(v, m);
    _mm512_mask_storeu_ps(x + i, m, e);
    acc = _mm512_add_ps(acc, e);
  }
  return hsum(acc);  // a shuffle tree: a short row's sum is on the softmax's critical path
}

// 1 / (1 + exp(-x)); exactly 0 where exp(-x) is beyond the float range. NaN stays NaN through
// x itself where the caller multiplies by it (silu), and through exp16 (the NaN lanes are put
// back all the same: the result must not hang on the exp's handling of NaN). `e`, when given,
// receives exp(-x).
inline __m512 sigmoid16(__m512 x, __mmask16 m, __m512* e = nullptr) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ex = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x), m);
  __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, ex));
  s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-ep::kHi), _CMP_LT_OQ),
                         _mm512_setzero_ps());
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  if (e) *e = ex;
  return _mm512_mask_mov_ps(s, nan, x);
}

void act_mul_avx512(int act, const float* g, const float* u, float* out, int64_t n) {
  if (act == kActGelu) {  // erf: element by element
    act_mul_portable(act, g, u, out, n);
    return;
  }
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i), up = _mm512_maskz_loadu_ps(m, u + i);
    __m512 y = x;
    switch (act) {
      case kActSigmoid:
        y = sigmoid16(x, m);
        break;
      case kActSilu:
        y = _mm512_mul_ps(x, sigmoid16(x, m));
        break;
      case kActGeluTanh: {
        // 0.5 x (1 + tanh(z)) = x sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3).
        const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        const __m512 z = _mm512_mul_ps(_mm512_set1_ps(2 * 0.7978845608028654f),
                                       _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
        y = _mm512_mul_ps(x, sigmoid16(z, m));
        break;
      }
      case kActRelu:
        y = _mm512_maskz_max_ps(0xFFFF, x, _mm512_setzero_ps());
        break;
      default:
        break;
    }
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(y, up));
  }
}

// sigmoid(x) and 1 - sigmoid(x): the latter as e s (e = exp(-x)) where x >= 0, where 1 - s would
// cancel (sigmoid'(20) = 2e-9, not 0). NaN lanes give NaN in both.
inline __m512 sigmoid_parts16(__m512 x, __mmask16 m, __m512* one_minus) {
  __m512 e;
  const __m512 s = sigmoid16(x, m, &e);
  const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  // 1 - s is exact enough where s <= 1/2, and NaN where s is.
  *one_minus = _mm512_mask_mul_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), s), pos, e, s);
  return s;
}

void act_grad_avx512(int act, const float* g, const float* u, const float* dout, float* dg,
                     float* du, int64_t n) {
  if (act == kActGelu) {  // erf: element by element
    act_grad_portable(act, g, u, dout, dg, du, n);
    return;
  }
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 go = _mm512_maskz_loadu_ps(m, dout + i);
    const __m512 up = _mm512_maskz_loadu_ps(m, u + i);
    __m512 a = x, d = one;  // activation(x), activation'(x)
    switch (act) {
      case kActSigmoid: {
        __m512 oms;
        a = sigmoid_parts16(x, m, &oms);
        d = _mm512_mul_ps(a, oms);
        break;
      }
      case kActSilu: {  // (x s)' = s (1 + x (1 - s))
        __m512 oms;
        const __m512 s = sigmoid_parts16(x, m, &oms);
        a = _mm512_mul_ps(x, s);
        d = _mm512_mul_ps(s, _mm512_fmadd_ps(x, oms, one));
        break;
      }
      case kActGeluTanh: {
        // x S, S = sigmoid(2z), z = c (x + 0.044715 x^3): (x S)' = S + x S (1 - S) 2 z'.
        const float c2 = 2 * 0.7978845608028654f;
        const __m512 x2 = _mm512_mul_ps(x, x);
        const __m512 z2 =
            _mm512_mul_ps(_mm512_set1_ps(c2),
                          _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), _mm512_mul_ps(x2, x), x));
        __m512 oms;
        const __m512 S = sigmoid_parts16(z2, m, &oms);
        a = _mm512_mul_ps(x, S);
        const __m512 dz2 = _mm512_mul_ps(_mm512_set1_ps(c2),
                                         _mm512_fmadd_ps(_mm512_set1_ps(3 * 0.044715f), x2, one));
        const __m512 sp = _mm512_mul_ps(S, oms);
        d = _mm512_fmadd_ps(_mm512_mul_ps(x, sp), dz2, S);
        // Saturated (S (1 - S) = 0): S alone; x^2 may have overflowed, and 0 * inf is NaN.
        d = _mm512_mask_mov_ps(d, _mm512_cmp_ps_mask(sp, _mm512_setzero_ps(), _CMP_EQ_OQ), S);
        break;
      }
      case kActRelu: {
        const __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
        a = _mm512_maskz_mov_ps(pos, x);
        d = _mm512_maskz_mov_ps(pos, one);
        break;
      }
      default:
        break;
    }
    _mm512_mask_storeu_ps(dg + i, m, _mm512_mul_ps(_mm512_mul_ps(go, up), d));
    _mm512_mask_storeu_ps(du + i, m, _mm512_mul_ps(go, a));
  }
}

float scale_max_avx512(float* x, int64_t n, float scale) {
  const __m512 vs = _mm512_set1_ps(scale);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
    _mm512_mask_storeu_ps(x + i, m, v);
    mx = _mm512_mask_max_ps(mx, m, mx, v);
  }
  return hmax(mx);
}

// Four running maxima: one chains every vector's max on the last (4 cycles each), the whole
// cost of a softmax row (one-off timing, 84 rows of 256 in L2: 0.049 ns an element against
// 0.070 with one).
float max_avx512(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = _mm512_maskz_max_ps(0xFFFF, m0, _mm512_loadu_ps(x + i));
    m1 = _mm512_maskz_max_ps(0xFFFF, m1, _mm512_loadu_ps(x + i + 16));
    m2 = _mm512_maskz_max_ps(0xFFFF, m2, _mm512_loadu_ps(x + i + 32));
    m3 = _mm512_maskz_max_ps(0xFFFF, m3, _mm512_loadu_ps(x + i + 48));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    m0 = _mm512_mask_max_ps(m0, m, m0, _mm512_maskz_loadu_ps(m, x + i));
  }
  return hmax(_mm512_maskz_max_ps(0xFFFF, _mm512_maskz_max_ps(0xFFFF, m0, m1),
                                  _mm512_maskz_max_ps(0xFFFF, m2, m3)));
}

}  // namespace tokamax::kernels
