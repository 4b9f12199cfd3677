// Grouped GEMM on the microkernels: the native ragged_dot's loop nest as plain functions over
// pointers, strides and blocking sizes (BLIS's mr, mc, kc, nc), with no framework types, so that
// every op that multiplies matrices (ragged_dot, attention's blocks, the gated linear unit, the
// loss's projection) reuses one tuned piece. Loops, per work item (group, rows, columns):
//   for kb in K step kc:           (the A block, mc x kc, stays in L2)
//     for panel in item's columns: (the B panel, kc x nr, stays in L1)
//       for row tile of mr rows:   microkernel
//   then the caller's store of the f32 tile (activation, conversion).
// Work items run on the thread pool, scheduled dynamically (biggest first) so skewed groups
// still balance.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/microkernels.h"
#include "tokamax/core/error.h"
#include "tokamax/core/tensor.h"

namespace tokamax::kernels {

struct Blocking {
  int mr = 8;    // rows per microkernel tile
  int mc = 64;   // rows per work item (multiple of mr)
  int kc = 256;  // K block (even)
  int nc = 256;  // columns per work item (multiple of the panel width)
};

// Tiles per work item for prefill heuristics: each packed weight panel is reused by that many
// tiles while it sits in L1/L2. 14 of the AVX-512 set's 14-row tiles (196 rows; 2 threads,
// M=4096, K=2048, N=11264 pre-packed, tokamax_gemm_bench: 0.70 of the FMA peak vs 0.67 with
// 12 x 16), 16 of the narrower ISAs' (the AVX2 set on the same machine, TOKAMAX_ISA=avx2, 8
// groups of 512 rows, K = N = 1024, a one-off interleaved sweep: 6 x 16 tiles with K blocks of
// 256 63.5 ms against 68.9 for the 6 x 4 and 512 the ragged_dot heuristics had).
inline int item_tiles(const KernelSet& ks) { return ks.max_mr >= 14 ? 14 : 16; }

// K block for prefill heuristics: a packed weight panel of kc x nr stays in L1 while a row
// block's tiles pass over it. 512 on the AVX-512 sets (32-column panels from L2 measured
// faster than 256 on Sapphire and Emerald Rapids, see tile_ldc); 256 on the narrower ones:
// the AVX2 set's 512 x 16 panel is the whole of Zen 3's 32 KiB L1 (2 threads, M=4096,
// K=2048, N=11264 pre-packed, tokamax_gemm_bench: 0.82-0.89 of the FMA peak with K blocks of
// 512, 0.87-0.90 with 256, 1.014x [1.003, 1.133] paired over 9 rounds; on Emerald Rapids
// capped at AVX2 63.5 against 68.9 ms, see above).
inline int block_depth(const KernelSet& ks) { return ks.max_mr >= 14 ? 512 : 256; }

// Columns per work item, for the heuristics: `widest` halved (not below `narrowest`) while the
// items, row_blocks times the column blocks of `cols`, number fewer than `want`; and, given
// `even_over` threads (0: not asked), while items alike in size (one tile of rows each: the
// weight-streaming path) would leave a thread idle for over 1/16 of the last wave. 11 items on
// 2 threads take as long as 12: the GLU at decode (8 rows, 2048 x 11264 weights streamed) took
// 0.906x the time [0.889, 0.915] with the 22 items of 512 columns the tuner chose as with the
// heuristics' 11 of 1024 (Emerald Rapids, 2 threads, 48 interleaved rounds). Row blocks of
// unequal height (a group's last block) are balanced by the scheduler's biggest-first order.
inline int64_t item_columns(int64_t row_blocks, int64_t cols, int64_t want, int even_over,
                            int64_t widest, int64_t narrowest) {
  auto items = [&](int64_t nc) { return row_blocks * ((cols + nc - 1) / nc); };
  auto uneven = [&](int64_t n) {
    if (even_over < 2 || want < even_over) return false;
    const int64_t slots = (n + even_over - 1) / even_over * even_over;
    return 16 * (slots - n) > slots;
  };
  int64_t nc = widest;
  while (nc > narrowest && (items(nc) < want || uneven(items(nc)))) nc /= 2;
  return nc;
}

// Row blocks for `tiles` row tiles (mr rows each) of one group, at most `per_block` tiles each:
// the fewest, then, when `threads` > 1, more until the items (blocks x col_blocks) fill whole
// waves of the threads, never more than `tiles`. The packed product spreads the tiles evenly
// over them (each block the same size as the others or one tile less) for single-group calls.
int64_t balanced_blocks(int64_t tiles, int64_t per_block, int64_t col_blocks, int threads);

// A config's blocks size per-thread scratch (mc x kc of A, kc x nc of B): each product is held
// to this many floats (64 MiB), so a config from a file cannot ask for gigabytes. Tuned and
// heuristic blockings stay far below (at most 2880 x 1024 so far).
inline constexpr int64_t kMaxBlockFloats = int64_t{1} << 24;
inline bool blocks_bounded(int mc, int kc, int nc) {
  return int64_t{mc} * kc <= kMaxBlockFloats && int64_t{kc} * nc <= kMaxBlockFloats;
}

// Whether blocking (mr, mc, kc, nc) suits kernel set s, with nc a multiple of nc_step, and the
// rules it breaks otherwise, for the error ("1 <= mr <= 14, mc a multiple of mr, ...").
inline bool blocking_fits(const KernelSet& s, int mr, int mc, int kc, int nc, int nc_step) {
  return mr >= 1 && mr <= s.max_mr && mc >= mr && mc % mr == 0 && kc >= 2 && kc % 2 == 0 &&
         nc >= nc_step && nc % nc_step == 0 && blocks_bounded(mc, kc, nc);
}
inline std::string blocking_rules(const KernelSet& s, int nc_step) {
  return "1 <= mr <= " + std::to_string(s.max_mr) +
         ", mc a multiple of mr, kc even >= 2, nc a multiple of " + std::to_string(nc_step) +
         ", mc * kc and kc * nc at most " + std::to_string(kMaxBlockFloats);
}

// A blocking config's check against kernel set ks: nothing when valid(ks), else message(ks)
// thrown, as ConfigForOtherIsa where ks is the running set capped by TOKAMAX_ISA and the CPU's
// own best set would take the config (tuning data made uncapped), else as InvalidArgument.
template <class Valid, class Message>
void check_isa_config(const KernelSet& ks, Valid&& valid, Message&& message) {
  if (valid(ks)) return;
  const KernelSet& own = cpu_best_kernels();
  if (&ks == &best_kernels() && &ks != &own && valid(own)) throw ConfigForOtherIsa(message(ks));
  throw InvalidArgument(message(ks));
}

// Elements (floats, or bf16 pairs) of one packed panel of K rows and nr columns.
int64_t panel_elems(int64_t K, bool pairs, int nr);

// Panels [p0, p1) of one group's weights (src: [K,N], or [N,K] when trans; f32 or bf16) into
// dst: bf16 pairs for the bf16 dot, or f32.
// ld: src's row stride in elements (0: dense).
void pack_panels(const KernelSet& ks, bool pairs, const void* src, bool src_bf16, bool trans,
                 int64_t K, int64_t N, void* dst, int64_t p0, int64_t p1, int64_t ld = 0);

// Every group's weights packed ahead into panels (pack_panels), groups of equal size one after
// the other.
struct PackedPanels {
  const void* data = nullptr;
  int64_t panels = 0;       // per group
  int64_t panel_elems = 0;  // floats or pairs (4 bytes each) per panel
  bool pairs = false;       // bf16 pairs for the bf16 dot, else f32
  const void* group(int64_t g) const {
    return static_cast<const uint8_t*>(data) + g * panels * panel_elems * 4;
  }
};

// Receives a finished f32 tile: output rows [r0, r0 + rows) x columns [n0, n0 + cols) are
// C[i * ldc + j]. Called once per tile, on the thread that computed it.
using StoreTile = std::function<void(const float* C, int64_t ldc, int64_t r0, int64_t rows,
                                     int64_t n0, int64_t cols)>;

// What both grouped products share: groups of rows, A, B and the store of the results. Group g
// owns rows [offsets[g], offsets[g+1]) of A (and of B in the ragged contraction).
struct GroupedOperands {
  int64_t groups = 0;
  const int64_t* offsets = nullptr;  // groups + 1 ascending row offsets
  int64_t k = 0, n = 0;
  // A: row-major [rows, k], f32 or bf16. round_a_to_bf16: an f32 A is multiplied as rounded to
  // bf16 (bf16 weights at default precision: every product is then exact, as the bf16 dot's).
  const void* a = nullptr;
  bool a_bf16 = false;
  bool round_a_to_bf16 = false;
  // A's row stride in elements (0: k). Another stride only for an f32 A on the f32 kernels
  // (no rounding, no bf16 dot): a block of a wider matrix.
  int64_t lda = 0;
  // A given transposed: a column-major [rows, k], element (r, kk) at a[kk * lda + r] (lda 0:
  // offsets[groups]). f32 A on the f32 kernels only; packing its tiles is a copy of contiguous
  // runs, so the ragged contraction multiplies A^T without ever making it.
  bool a_trans = false;
  // A given as column panels (a_panel > 0; f32 A on the f32 kernels, neither strided nor
  // transposed): columns [q * a_panel, (q + 1) * a_panel) of every row form panel q, row-major
  // [offsets[groups], a_panel] at a + q * offsets[groups] * a_panel. That is the layout of
  // packed B panels (K = the rows), so that one matrix serves as the packed B of one product and
  // the A of another (the loss backward's d: dx = d w^T, dw = x^T d) without a second copy.
  int64_t a_panel = 0;
  int64_t a_stride() const { return lda > 0 ? lda : a_trans ? (offsets ? offsets[groups] : 0) : k; }
  const void* b = nullptr;  // see each product
  bool b_bf16 = false;
  StoreTile store;
  int threads = 1;  // at most the pool's
};

// For every group g: C[rows of g] = A[rows of g] x B_g. Rows past offsets[groups] are not
// touched. B: packed panels, or the caller's weights, group g at b + g * k * n elements, [k, n]
// or, with b_trans, [n, k]; f32 or bf16. bf16_dot: unpacked bf16 weights run on the bf16 dot as
// pairs (else they are widened to f32 panels for the f32 FMA).
struct GroupedGemm : GroupedOperands {
  const PackedPanels* packed = nullptr;
  bool b_trans = false;
  bool bf16_dot = false;
  // Unpacked weights in a layout of the caller's: when set, the strips are packed by
  // pack_b(g, dst, p0, p1) (group g's panels [p0, p1) into dst, the layout pack_panels writes),
  // never read from b, and no group streams them. panel_group: the items' and strips' columns
  // are whole groups of this many panels (the gated linear unit's gate and up panels of the same
  // output columns, side by side: 2). Neither pack_b nor store may run a grouped product
  // itself: run inline on the same thread, it would take the outer call's strips and tile
  // (per-thread scratch slots) while other threads still read them.
  std::function<void(int64_t g, void* dst, int64_t p0, int64_t p1)> pack_b;
  int panel_group = 1;
};

// Runs the product. Unpacked weights: groups of at most kStreamMaxMr rows stream them from
// their own layout; taller groups pack one item's columns at a time into a per-thread strip
// (BLIS's packed B block), reused by every row block of the item; groups tall enough to keep
// every thread busy share the strips, each packed by the threads during the one before it (two
// buffers, no barrier between strips). Empty groups cost nothing.
void grouped_gemm(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks);

// Whether a group of `rows` rows of an unpacked product on `threads` threads (GroupedOperands::
// threads) that does not stream its weights shares strips among the threads (enough row blocks to
// keep every thread busy on each strip): its weights are then packed once a call. Fewer rows take
// per-item strips, which pack them once for each span of rows the items split the group into.
bool shares_strips(int threads, const Blocking& blk, int64_t rows);

// Scratch grouped_gemm keeps per call (per-thread tiles and strips), in bytes: what a blocking
// changes (the autotuner's tie-break on memory). Not the f32 copy of a bf16 (or rounded) A that
// the f32 kernels read, rows x k floats, the same for every blocking.
int64_t grouped_gemm_scratch_bytes(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks);

// The ragged contraction: for every group g, out_g[K, N] = A[rows of g]^T x B[rows of g], A
// row-major [rows, k] (f32 or bf16, rounded as above), B row-major [rows, n] (f32 or bf16).
// store receives rows g * k + i of the stacked [groups * k, n] result; an empty group's are zero.
// Each group is a grouped GEMM of its rows of A read transposed (a_trans: nothing is copied for
// an f32 A; a bf16 or rounded one is converted once per call) against its rows of B as unpacked
// weights.
using GroupedGemmTn = GroupedOperands;
// Scratch grouped_gemm_tn keeps per call (A converted, and the products' tiles and strips).
int64_t grouped_gemm_tn_scratch_bytes(const GroupedGemmTn& p, const Blocking& blk,
                                      const KernelSet& ks);
void grouped_gemm_tn(const GroupedGemmTn& p, const Blocking& blk, const KernelSet& ks);

// The f32 values the f32 kernels multiply for A: A itself when it already is (f32, no
// rounding), else a converted copy in *storage (parallel, vectorized).
const float* a_as_f32(const void* a, bool a_bf16, bool round_to_bf16, int64_t count, int threads,
                      Tensor* storage);

}  // namespace tokamax::kernels
