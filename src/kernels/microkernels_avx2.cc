// AVX2+FMA microkernels (f32), nr = 16 (two ymm per row), up to 6 rows (12 accumulators of 16
// registers); the multi-panel decode kernel and the weight-streaming kernels (stream, stream_t,
// stream_acc: decode reads weights and KV caches in place, bf16 widened in registers). bf16
// weights are widened to f32 panels at pack time on this ISA (it has no bf16 dot).
// No STL here, as in the AVX-512 file: an inline template instantiated in this file could
// otherwise be shared with baseline code.
#include <immintrin.h>

#include "kernels/exp_sum.h"
#include "kernels/microkernels.h"
#include "kernels/prefetch.h"
#include "kernels/stream_prefetch.h"

namespace tokamax::kernels {
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

constexpr int kNr = 16;

template <int MR>
void f32_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, float* c,
              int64_t ldc, bool acc, L2Ahead ahead) {
  prefetch_l2(ahead.p, 0, ahead.bytes);
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
                float* c, int64_t ldc, bool acc, L2Ahead ahead) {
  with_tile_rows<6>(mr, [&]<int MR>() { f32_tile<MR>(kc, a, rs, cs, b, c, ldc, acc, ahead); });
}

// Decode on pre-packed panels: MR rows (1..4) against NP panels at once, 2 * MR * NP
// accumulators, so each thread keeps NP weight streams in flight. The lhs values are broadcast
// per panel (loads, not FMA-port work) to leave the 16 registers to the accumulators.
template <int MR, int NP>
void f32_multi_tile(int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b, int64_t ps,
                    float* c, int64_t ldc, bool acc) {
  __m256 c0[MR][NP], c1[MR][NP];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) c0[i][p] = c1[i][p] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const __m256 b0 = _mm256_load_ps(b + p * ps + k * kNr),
                   b1 = _mm256_load_ps(b + p * ps + k * kNr + 8);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a + k * cs + i * rs);
        c0[i][p] = _mm256_fmadd_ps(ai, b0, c0[i][p]);
        c1[i][p] = _mm256_fmadd_ps(ai, b1, c1[i][p]);
      }
    }
  }
#pragma GCC unroll 4
  for (int p = 0; p < NP; ++p) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      float* ci = c + i * ldc + p * kNr;
      if (acc) {
        c0[i][p] = _mm256_add_ps(c0[i][p], _mm256_loadu_ps(ci));
        c1[i][p] = _mm256_add_ps(c1[i][p], _mm256_loadu_ps(ci + 8));
      }
      _mm256_storeu_ps(ci, c0[i][p]);
      _mm256_storeu_ps(ci + 8, c1[i][p]);
    }
  }
}

// Panels per multi call by tile rows: 2 * MR * NP accumulators, 2 panel vectors and a broadcast
// within the 16 registers.
constexpr int kMultiNp[kMultiMaxMr + 1] = {0, 4, 3, 2, 1};

void f32_multi(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
               int64_t ps, float* c, int64_t ldc, bool acc) {
  with_tile_rows<kMultiMaxMr>(
      mr, [&]<int MR>() { f32_multi_tile<MR, kMultiNp[MR]>(kc, a, rs, cs, b, ps, c, ldc, acc); });
}

// --- Weight streaming from the caller's layout (see StreamKernel), as the AVX-512 set's with
// 8-lane vectors and half the registers ---

// 8 weights as f32 from element idx (bf16 widened exactly: its bits are the f32's high half);
// MASKED: the first n lanes only (a column or depth tail), zeros after them.
template <bool BF16, bool MASKED>
inline __m256 load_w(const void* b, int64_t idx, int64_t n) {
  if constexpr (BF16) {
    const uint16_t* p = static_cast<const uint16_t*>(b) + idx;
    __m128i h;
    if (MASKED) {  // AVX2 has no 16-bit masked load: the tail through a zeroed copy
      alignas(16) uint16_t t[8] = {};
      for (int64_t i = 0; i < n && i < 8; ++i) t[i] = p[i];
      h = _mm_load_si128(reinterpret_cast<const __m128i*>(t));
    } else {
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    const float* p = static_cast<const float*>(b) + idx;
    return MASKED ? _mm256_maskload_ps(p, tail_mask8(n)) : _mm256_loadu_ps(p);
  }
}

// c's columns [j, j + 8 V) of MR rows (MASKED, V = 1: the first n) in and out.
template <int MR, int V, bool MASKED>
inline void load_acc(__m256 (&acc)[MR][V], const float* c, int64_t ldc, int64_t j, int64_t n) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[i][v] = MASKED ? _mm256_maskload_ps(c + i * ldc + j, tail_mask8(n))
                         : _mm256_loadu_ps(c + i * ldc + j + 8 * v);
    }
  }
}
template <int MR, int V, bool MASKED>
inline void store_acc(const __m256 (&acc)[MR][V], float* c, int64_t ldc, int64_t j, int64_t n) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      if (MASKED)
        _mm256_maskstore_ps(c + i * ldc + j, tail_mask8(n), acc[i][v]);
      else
        _mm256_storeu_ps(c + i * ldc + j + 8 * v, acc[i][v]);
    }
  }
}

// block.template operator()<V, false>(j, 8 V) over c's columns in blocks of 8 V, then of 8,
// then <1, true>(j, lanes left) for the tail.
template <int V, class Block>
inline void column_blocks(int64_t cols, Block&& block) {
  int64_t j = 0;
  for (; j + 8 * V <= cols; j += 8 * V) block.template operator()<V, false>(j, 8 * V);
  for (; j + 8 <= cols; j += 8) block.template operator()<1, false>(j, 8);
  if (j < cols) block.template operator()<1, true>(j, cols - j);
}

// Rows k0..k0+S-1 of b (S streams side by side), columns [j, j + 8 V), into the MR rows of c,
// which are loaded and stored once per S weight rows; the lhs values are broadcast from memory
// (loads), so S is not bounded by the registers. The same columns of the next pass's rows are
// prefetched into L2, one line per row, as the AVX-512 kernel does.
template <int MR, int S, bool BF16, int V, bool MASKED>
inline void stream_chunk(const float* a, int64_t lda, int64_t k0, const void* b, int64_t ldb,
                         int64_t j, int64_t n, float* c, int64_t ldc) {
  static_assert(V == 1 || !MASKED);
  __m256 acc[MR][V];
  load_acc<MR, V, MASKED>(acc, c, ldc, j, n);
#pragma GCC unroll 8
  for (int s = 0; s < S; ++s) {
    __m256 w[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) w[v] = load_w<BF16, MASKED>(b, (k0 + s) * ldb + j + 8 * v, n);
    prefetch_t1(static_cast<const char*>(b) + ((k0 + S + s) * ldb + j) * (BF16 ? 2 : 4));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i * lda + k0 + s);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(x, w[v], acc[i][v]);
    }
  }
  store_acc<MR, V, MASKED>(acc, c, ldc, j, n);
}

template <int MR, bool BF16>
void stream_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t cols,
                 float* c, int64_t ldc) {
  for (int i = 0; i < MR; ++i) {
    for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = 0.0f;
  }
  // 8 weight rows per pass; V = 2 (a line of f32 per row and pass) while the MR x 2
  // accumulators, 2 weights and a broadcast fit the 16 registers.
  constexpr int S = 8, V = MR <= 6 ? 2 : 1;
  auto rows = [&]<int SS>(int64_t k0) {
    column_blocks<V>(cols, [&]<int VV, bool MASKED>(int64_t j, int64_t n) {
      stream_chunk<MR, SS, BF16, VV, MASKED>(a, lda, k0, b, ldb, j, n, c, ldc);
    });
  };
  int64_t k = 0;
  for (; k + S <= K; k += S) rows.template operator()<S>(k);
  for (; k < K; ++k) rows.template operator()<1>(k);
}

// c += a b for a short K (attention decode's P v): column blocks whose MR x V accumulators stay
// in registers over all K rows of b, c loaded and stored once per block.
template <int MR, int V, bool BF16, bool MASKED>
inline void acc_block(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t j,
                      int64_t n, float* c, int64_t ldc, int64_t pf_rows, int64_t l1_ahead) {
  static_assert(V == 1 || !MASKED);
  constexpr int64_t es = BF16 ? 2 : 4;
  __m256 acc[MR][V];
  load_acc<MR, V, MASKED>(acc, c, ldc, j, n);
  for (int64_t k = 0; k < K; ++k) {
    if (k < pf_rows) prefetch_row(b, es, K + k, ldb, j, 8 * V);  // the next block's row k
    prefetch_row_l1(b, es, k, ldb, j, MASKED ? n : 8 * V, l1_ahead);
    __m256 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) w[v] = load_w<BF16, MASKED>(b, k * ldb + j + 8 * v, n);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i * lda + k);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(x, w[v], acc[i][v]);
    }
  }
  store_acc<MR, V, MASKED>(acc, c, ldc, j, n);
}

template <int MR, bool BF16>
void stream_acc_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb,
                     int64_t cols, float* c, int64_t ldc, int64_t pf_rows, int64_t l1_ahead) {
  // MR x V accumulators, V weights and a broadcast within the 16 registers.
  constexpr int V = MR <= 2 ? 4 : MR <= 6 ? 2 : 1;
  column_blocks<V>(cols, [&]<int VV, bool MASKED>(int64_t j, int64_t n) {
    acc_block<MR, VV, BF16, MASKED>(K, a, lda, b, ldb, j, n, c, ldc, pf_rows, l1_ahead);
  });
}

// The sums of the 8 lanes of a, b, c and d, in that order, reduced together (3 horizontal adds
// and one across the halves instead of 4 apiece): a decode row's q k^T is a few dot products per
// K row, whose reductions would otherwise cost as much as their FMAs.
inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Transposed weights: JB output columns are JB rows of b, each a contiguous stream along K; the
// MR x JB dot products are reduced four at a time.
template <int MR, int JB, bool BF16>
void stream_t_cols(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t j0,
                   float* c, int64_t ldc) {
  __m256 acc[MR * JB];
#pragma GCC unroll 16
  for (int f = 0; f < MR * JB; ++f) acc[f] = _mm256_setzero_ps();
  auto step = [&]<bool MASKED>(int64_t k, int64_t n) {
    __m256 w[JB];
#pragma GCC unroll 4
    for (int jj = 0; jj < JB; ++jj) w[jj] = load_w<BF16, MASKED>(b, (j0 + jj) * ldb + k, n);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 x = MASKED ? _mm256_maskload_ps(a + i * lda + k, tail_mask8(n))
                              : _mm256_loadu_ps(a + i * lda + k);
#pragma GCC unroll 4
      for (int jj = 0; jj < JB; ++jj)
        acc[i * JB + jj] = _mm256_fmadd_ps(x, w[jj], acc[i * JB + jj]);
    }
  };
  int64_t k = 0;
#pragma GCC unroll 4
  for (; k + 8 <= K; k += 8) step.template operator()<false>(k, 8);
  if (k < K) step.template operator()<true>(k, K - k);
  // Accumulator f is c's row f / JB, column j0 + f % JB.
  int f = 0;
#pragma GCC unroll 8
  for (; f + 4 <= MR * JB; f += 4) {
    alignas(16) float s[4];
    _mm_store_ps(s, sum4(acc[f], acc[f + 1], acc[f + 2], acc[f + 3]));
#pragma GCC unroll 4
    for (int e = 0; e < 4; ++e) c[(f + e) / JB * ldc + j0 + (f + e) % JB] = s[e];
  }
#pragma GCC unroll 4
  for (; f < MR * JB; ++f) c[f / JB * ldc + j0 + f % JB] = hsum(acc[f]);
}

template <int MR, bool BF16>
void stream_t_tile(int64_t K, const float* a, int64_t lda, const void* b, int64_t ldb, int64_t cols,
                   float* c, int64_t ldc) {
  // MR x JB accumulators, JB weights and one lhs vector within the 16 registers.
  constexpr int JB = MR <= 2 ? 4 : MR <= 6 ? 2 : 1;
  // Rows of b a few groups ahead prefetched whole: rows more than a page apart (a KV cache read
  // one head at a time) defeat the hardware prefetchers (see the AVX-512 kernel).
  constexpr int64_t kAhead = 24;
  const int64_t row_bytes = K * (BF16 ? 2 : 4);
  auto prefetch_rows = [&](int64_t j0, int64_t n) {
    for (int64_t j = j0; j < cols && j < j0 + n; ++j) {
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

// q k^T for every kv head, position by position (StreamHeadsKernel; see the AVX-512 kernel):
// one (position, head) at a time, each step one load of b and MR of a (from L1); two sets of
// accumulators on alternate steps where the 16 registers hold them (MR <= 4), so 8 FMAs are in
// flight; the MR sums reduced four at a time. Prefetches as the AVX-512 kernel's.
template <int MR, bool BF16>
void heads_tile(int heads, int64_t K, const float* a, const void* b, int64_t ldb, int64_t cols,
                float* c, int64_t ldc, const char* pf, int64_t pf_ld, int64_t pf_bytes,
                int64_t l1_ahead) {
  constexpr int kSets = MR <= 4 ? 2 : 1;
  constexpr int64_t es = BF16 ? 2 : 4;
  const HeadsPrefetch prefetch(heads, pf, pf_ld, pf_bytes);
  for (int64_t j = 0; j < cols; ++j) {
    for (int h = 0; h < heads; ++h) {
      prefetch.extra(j, 1, h);
      prefetch_row_l1(b, es, j, ldb, h * K, K, l1_ahead);
      __m256 acc[kSets][MR];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
        for (int t = 0; t < kSets; ++t) acc[t][i] = _mm256_setzero_ps();
      }
      const int64_t base = j * ldb + h * K;
      auto step = [&]<bool MASKED>(int set, int64_t k, int64_t n) {
        const __m256 w = load_w<BF16, MASKED>(b, base + k, n);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const float* ai = a + (h * MR + i) * K + k;
          const __m256 x = MASKED ? _mm256_maskload_ps(ai, tail_mask8(n)) : _mm256_loadu_ps(ai);
          acc[set][i] = _mm256_fmadd_ps(x, w, acc[set][i]);
        }
      };
      int64_t k = 0;
      for (; k + 8 * kSets <= K; k += 8 * kSets) {
        // Written out: an unroll pragma on a loop of one trip (kSets 1) is a clang warning.
        step.template operator()<false>(0, k, 8);
        if constexpr (kSets == 2) step.template operator()<false>(1, k + 8, 8);
      }
      for (; k + 8 <= K; k += 8) step.template operator()<false>(0, k, 8);
      if (k < K) step.template operator()<true>(0, k, K - k);
      if constexpr (kSets == 2) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) acc[0][i] = _mm256_add_ps(acc[0][i], acc[1][i]);
      }
      float* ch = c + h * MR * ldc + j;
      int i = 0;
      for (; i + 4 <= MR; i += 4) {
        alignas(16) float t[4];
        _mm_store_ps(t, sum4(acc[0][i], acc[0][i + 1], acc[0][i + 2], acc[0][i + 3]));
        for (int e = 0; e < 4; ++e) ch[(i + e) * ldc] = t[e];
      }
      for (; i < MR; ++i) ch[i * ldc] = hsum(acc[0][i]);
    }
  }
}

void stream_heads_t(int mr, int heads, int64_t K, const float* a, const void* b, bool b_bf16,
                    int64_t ldb, int64_t cols, float* c, int64_t ldc, const void* prefetch,
                    int64_t prefetch_ld, int64_t prefetch_bytes, int64_t l1_ahead) {
  const char* pf = static_cast<const char*>(prefetch);
  with_rows_and_dtype(mr, b_bf16, [&]<int MR, bool BF16>() {
    heads_tile<MR, BF16>(heads, K, a, b, ldb, cols, c, ldc, pf, prefetch_ld, prefetch_bytes,
                         l1_ahead);
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

const KernelSet kSet{Isa::kAvx2, "avx2",
                     kNr,        6,
                     f32_kernel, nullptr,
                     f32_multi,  nullptr,
                     nullptr,    {kMultiNp[0], kMultiNp[1], kMultiNp[2], kMultiNp[3], kMultiNp[4]},
                     stream,     stream_t,
                     nullptr,    false,
                     nullptr,    stream_acc,
                     nullptr,    nullptr,
                     nullptr,    stream_heads_t};

}  // namespace

const KernelSet* avx2_kernels() { return &kSet; }

namespace {
// exp(v) on the lanes of `m` (all ones or all zeros per lane), 0 elsewhere and where v <= kLo
// (-inf included); +inf above ln(FLT_MAX) and NaN stays NaN, as exp16: the clamps take v as
// their second operand, which max and min return when either is NaN, and `keep` is "not <=
// kLo". kHi keeps 2^n a normal float, so the overflow is one blend more.
inline __m256 exp8(__m256 v, __m256 m) {
  const __m256 lo = _mm256_set1_ps(ep::kLo), hi = _mm256_set1_ps(ep::kHi);
  const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(v, lo, _CMP_NLE_UQ), m);
  const __m256 inf = _mm256_cmp_ps(v, _mm256_set1_ps(ep::kOverflow), _CMP_GT_OQ);
  v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
  const __m256 kf = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(ep::kLog2e)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(ep::kLn2Hi), v);
  r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(ep::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(ep::kP[0]);
  for (int j = 1; j < 5; ++j) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ep::kP[j]));
  const __m256 one = _mm256_set1_ps(1.0f);
  p = _mm256_fmadd_ps(_mm256_fmadd_ps(p, r, one), r, one);
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
  return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_and_ps(inf, m));
}

}  // namespace

// x[i] = exp(x[i] * scale - shift), the product rounded first (as exp_shift_sum_avx512).
float exp_shift_sum_avx2(float* x, int64_t n, float scale, float shift) {
  const __m256 vs = _mm256_set1_ps(shift), vc = _mm256_set1_ps(scale);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = tail_mask8(n - i);
    __m256 prod = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), vc);
    asm("" : "+x"(prod));  // rounded here: GCC would fuse the product into the difference
    const __m256 v = _mm256_sub_ps(prod, vs);
    const __m256 e = exp8(v, _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(x + i, m, e);
    acc = _mm256_add_ps(acc, e);
  }
  return hsum(acc);
}

// The gated linear unit's row loops (see RowKernels), as the AVX-512 ones at 8 lanes: sigmoid,
// silu, gelu_tanh, relu and none on the polynomial exp; gelu (erf) element by element.
namespace {
// sigmoid(x) (exactly 0 below -kHi, NaN where x is), and exp(-x) in *e.
inline __m256 sigmoid8(__m256 x, __m256 m, __m256* e = nullptr) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 ex = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x), m);
  __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, ex));
  s = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-ep::kHi), _CMP_LT_OQ), s);
  if (e) *e = ex;
  return _mm256_blendv_ps(s, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// sigmoid(x), and 1 - sigmoid(x) as e s where x >= 0 (where 1 - s would cancel).
inline __m256 sigmoid_parts8(__m256 x, __m256 m, __m256* one_minus) {
  __m256 e;
  const __m256 s = sigmoid8(x, m, &e);
  const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  *one_minus = _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), s), _mm256_mul_ps(e, s), pos);
  return s;
}

// x S and its derivative for gelu_tanh: S = sigmoid(2z), z = c (x + 0.044715 x^3), (x S)' = S + x
// S (1 - S) 2 z'; S alone where saturated (x^2 may have overflowed, and 0 * inf is NaN).
inline __m256 gelu_tanh8(__m256 x, __m256 m, __m256* d) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const float c2 = 2 * 0.7978845608028654f;
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 z2 = _mm256_mul_ps(
      _mm256_set1_ps(c2), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), _mm256_mul_ps(x2, x), x));
  if (!d) return _mm256_mul_ps(x, sigmoid8(z2, m));
  __m256 oms;
  const __m256 S = sigmoid_parts8(z2, m, &oms);
  const __m256 dz2 =
      _mm256_mul_ps(_mm256_set1_ps(c2), _mm256_fmadd_ps(_mm256_set1_ps(3 * 0.044715f), x2, one));
  const __m256 sp = _mm256_mul_ps(S, oms);
  *d = _mm256_blendv_ps(_mm256_fmadd_ps(_mm256_mul_ps(x, sp), dz2, S), S,
                        _mm256_cmp_ps(sp, _mm256_setzero_ps(), _CMP_EQ_OQ));
  return _mm256_mul_ps(x, S);
}

}  // namespace

void act_mul_avx2(int act, const float* g, const float* u, float* out, int64_t n) {
  if (act == kActGelu) {  // erf: element by element
    act_mul_portable(act, g, u, out, n);
    return;
  }
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i mi = tail_mask8(n - i);
    const __m256 m = _mm256_castsi256_ps(mi);
    const __m256 x = _mm256_maskload_ps(g + i, mi), up = _mm256_maskload_ps(u + i, mi);
    __m256 y = x;
    switch (act) {
      case kActSigmoid:
        y = sigmoid8(x, m);
        break;
      case kActSilu:
        y = _mm256_mul_ps(x, sigmoid8(x, m));
        break;
      case kActGeluTanh:
        y = gelu_tanh8(x, m, nullptr);
        break;
      case kActRelu:
        y = _mm256_max_ps(x, _mm256_setzero_ps());
        break;
      default:
        break;
    }
    _mm256_maskstore_ps(out + i, mi, _mm256_mul_ps(y, up));
  }
}

void act_grad_avx2(int act, const float* g, const float* u, const float* dout, float* dg, float* du,
                   int64_t n) {
  if (act == kActGelu) {  // erf: element by element
    act_grad_portable(act, g, u, dout, dg, du, n);
    return;
  }
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i mi = tail_mask8(n - i);
    const __m256 m = _mm256_castsi256_ps(mi);
    const __m256 x = _mm256_maskload_ps(g + i, mi);
    const __m256 go = _mm256_maskload_ps(dout + i, mi);
    const __m256 up = _mm256_maskload_ps(u + i, mi);
    __m256 a = x, d = one;  // activation(x), activation'(x)
    switch (act) {
      case kActSigmoid: {
        __m256 oms;
        a = sigmoid_parts8(x, m, &oms);
        d = _mm256_mul_ps(a, oms);
        break;
      }
      case kActSilu: {  // (x s)' = s (1 + x (1 - s))
        __m256 oms;
        const __m256 s = sigmoid_parts8(x, m, &oms);
        a = _mm256_mul_ps(x, s);
        d = _mm256_mul_ps(s, _mm256_fmadd_ps(x, oms, one));
        break;
      }
      case kActGeluTanh:
        a = gelu_tanh8(x, m, &d);
        break;
      case kActRelu: {
        const __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
        a = _mm256_and_ps(pos, x);
        d = _mm256_and_ps(pos, one);
        break;
      }
      default:
        break;
    }
    _mm256_maskstore_ps(dg + i, mi, _mm256_mul_ps(_mm256_mul_ps(go, up), d));
    _mm256_maskstore_ps(du + i, mi, _mm256_mul_ps(go, a));
  }
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

float max_avx2(const float* x, int64_t n) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = tail_mask8(n - i);
    mx = _mm256_max_ps(
        mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m)));
  }
  return hmax(mx);
}

}  // namespace tokamax::kernels
