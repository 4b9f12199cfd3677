// Grouped GEMM: work items, blocking and scratch around the microkernels (see grouped_gemm.h).
#include "kernels/grouped_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/scratch.h"
#include "tokamax/core/error.h"

namespace tokamax::kernels {

namespace {

struct Item {
  int64_t g, m0, rows, n0, cols;
};

// Unpacked weights are packed one item's columns at a time into a per-thread strip of K rows
// (BLIS's packed B block, reused by every row block of the item). Items are narrowed so that
// the strip stays within this size, figured at 4 bytes a value (bf16 pairs then take half of
// it), down to one step of panels (nr x panel_group columns), which a K past 8 MiB / 4 / step
// values takes beyond it.
constexpr int64_t kMaxStripBytes = int64_t{8} << 20;

// Panels the multi-panel (weight-streaming) kernel takes at once for an item of `rows` rows
// with `left` panels to go; 1 = use the regular kernel. The whole item must be one packed A
// tile (rows <= mr).
int multi_panels(const KernelSet& ks, bool pairs, int64_t rows, int mr, int64_t left) {
  const bool has = pairs ? ks.bf16_multi != nullptr : ks.f32_multi != nullptr;
  if (rows < 1 || rows > mr || rows > kMultiMaxMr || !has) return 1;
  const int np = ks.multi_np[rows];
  return np > 1 && left >= np ? np : 1;
}

// Row stride of a C tile of `cols` columns: whole panels plus one cache line. A stride of a
// multiple of 4 KiB (nc = 1024 floats) puts all mr rows of a microkernel's tile in the same L1
// sets, where they evict the B panel, and makes the tile's loads alias its stores (one thread,
// 12 x 32 tiles, kc = 512, B panels from L2: 76% vs 79% of the FMA peak with the extra line).
int64_t tile_ldc(int64_t cols, const KernelSet& ks) { return round_up(cols, ks.nr) + 16; }

// Per thread: the C tile (mc x nc, or up to kStreamMaxMr rows for the streaming kernels) and
// after it the packed A block (mc x kc floats or bf16 pairs).
// Rows rounded up to whole AMX tiles: that kernel writes C and reads A in 16-row tiles.
int64_t c_tile_floats(const Blocking& blk, const KernelSet& ks) {
  return round_up(std::max<int64_t>(blk.mc, kStreamMaxMr), kAmxRows) * tile_ldc(blk.nc, ks);
}
int64_t tile_floats(const Blocking& blk, const KernelSet& ks) {
  return c_tile_floats(blk, ks) + round_up(blk.mc, kAmxRows) * blk.kc;
}
struct Tile {
  float* c;
  uint32_t* apack;
};
Tile thread_tile(const Blocking& blk, const KernelSet& ks) {
  float* c = thread_scratch(kTileSlot, tile_floats(blk, ks));
  return {c, reinterpret_cast<uint32_t*>(c + c_tile_floats(blk, ks))};
}

// Columns per item of an unpacked product: the blocking's, narrowed so that the packed strip
// of K rows stays under kMaxStripBytes, in whole steps of panel groups (a group, the GLU's
// gate-up pair, never straddles two strips, whatever nc the blocking has).
int64_t strip_cols(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks) {
  const int64_t row_bytes = std::max<int64_t>(p.k, 2) * 4;
  const int64_t step = int64_t{ks.nr} * std::max(1, p.panel_group);
  return step * std::max<int64_t>(1, std::min(blk.nc / step, kMaxStripBytes / row_bytes / step));
}
int64_t strip_floats(const GroupedGemm& p, const KernelSet& ks, int64_t cols) {
  return (cols + ks.nr - 1) / ks.nr * panel_elems(p.k, p.bf16_dot, ks.nr);
}

int pool_threads(int threads) { return std::clamp(threads, 1, ThreadPool::global().size()); }

// pack_a_f32's tiles (mr rows from m0, K range [k0, k0 + kc)) from an A in column panels of
// width w over `total` rows (GroupedOperands::a_panel): per tile, each panel's part of the K
// range is a pack of rows w apart.
void pack_a_from_panels(const KernelSet& ks, const float* a, int64_t total, int64_t w, int64_t m0,
                        int64_t rows, int64_t k0, int64_t kc, int mr, float* dst) {
  const PackAF32 pack = f32_lhs_packer(ks);
  for (int64_t t = 0; t * mr < rows; ++t) {
    const int64_t tile_rows = std::min<int64_t>(mr, rows - t * mr);
    for (int64_t k = k0; k < k0 + kc;) {
      const int64_t q = k / w, off = k - q * w, len = std::min(w - off, k0 + kc - k);
      pack(a + (q * total + m0 + t * mr) * w, w, tile_rows, off, len, mr,
           dst + t * mr * kc + (k - k0) * mr);
      k += len;
    }
  }
}

// Output rows [m0, m0+rows) x columns [0, cols) of an item, relative to its first column, into
// the f32 tile C (row stride ldc), from weights in panels: `b` is the item's first panel,
// panels are panel_stride elements apart (floats, or bf16 pairs when `pairs`). A is the f32 lhs
// (unused with pairs, which pack the lhs themselves).
void compute_block(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks, bool pairs,
                   const float* A, const void* b, int64_t panel_stride, int64_t m0,
                   int64_t item_rows, int64_t cols, float* C, int64_t ldc, uint32_t* apack) {
  const int64_t K = p.k;
  const int64_t np = (cols + ks.nr - 1) / ks.nr;
  for (int64_t kb = 0; kb < K; kb += blk.kc) {
    const int64_t kcur = std::min<int64_t>(blk.kc, K - kb);
    const bool acc = kb > 0;
    if (pairs) {
      const int64_t kp = (kcur + 1) / 2;
      // Tile height: the blocking's, or for the AMX kernel the whole row block (padded).
      const int64_t th = ks.amx ? round_up(item_rows, kAmxRows) : blk.mr;
      const int64_t tiles = (item_rows + th - 1) / th;
      const int64_t esz = p.a_bf16 ? 2 : 4;
      for (int64_t tt = 0; tt < tiles; ++tt) {
        const int64_t rows = std::min<int64_t>(th, item_rows - tt * th);
        ks.pack_a_bf16(static_cast<const char*>(p.a) + (m0 + tt * th) * K * esz, p.a_bf16, K, rows,
                       kb, kcur, th, apack + tt * th * kp);
      }
      for (int64_t q = 0; q < np;) {
        const uint32_t* bp = static_cast<const uint32_t*>(b) + q * panel_stride + (kb / 2) * ks.nr;
        if (const int step = multi_panels(ks, true, item_rows, blk.mr, np - q); step > 1) {
          ks.bf16_multi(static_cast<int>(item_rows), kp, apack, blk.mr, bp, panel_stride,
                        C + q * ks.nr, ldc, acc);
          q += step;
          continue;
        }
        for (int64_t tt = 0; tt < tiles; ++tt) {
          const int rows = static_cast<int>(std::min<int64_t>(th, item_rows - tt * th));
          ks.bf16(rows, kp, apack + tt * th * kp, th, bp, C + tt * th * ldc + q * ks.nr, ldc, acc);
        }
        ++q;
      }
    } else {
      float* af = reinterpret_cast<float*>(apack);
      const int64_t lda = p.a_stride();
      if (p.a_trans)
        pack_a_f32_t(A + m0, lda, item_rows, kb, kcur, blk.mr, af);
      else if (p.a_panel > 0)
        pack_a_from_panels(ks, A, p.offsets[p.groups], p.a_panel, m0, item_rows, kb, kcur, blk.mr,
                           af);
      else
        f32_lhs_packer(ks)(A + m0 * lda, lda, item_rows, kb, kcur, blk.mr, af);
      for (int64_t q = 0; q < np;) {
        const float* bp = static_cast<const float*>(b) + q * panel_stride + kb * ks.nr;
        if (const int step = multi_panels(ks, false, item_rows, blk.mr, np - q); step > 1) {
          ks.f32_multi(static_cast<int>(item_rows), kcur, af, 1, blk.mr, bp, panel_stride,
                       C + q * ks.nr, ldc, acc);
          q += step;
          continue;
        }
        // The next panel's K block into L2 a slice per tile, while this panel's tiles compute:
        // the first tile on a panel otherwise waits on the L3 (one thread each on both cores,
        // 12 x 32 tiles, kc = 512, 16 tiles a panel: 196 vs 182 GFLOP/s a core; the f32 GLU at
        // M=4096, K=2048, N=5632, pre-packed, interleaved calls: 582 vs 624 ms). The tile
        // issues its slice over its k steps (L2Ahead).
        const char* next = q + 1 < np ? reinterpret_cast<const char*>(bp + panel_stride) : nullptr;
        const int64_t tiles = (item_rows + blk.mr - 1) / blk.mr;
        const int64_t panel_bytes = kcur * ks.nr * 4;
        const int64_t slice = round_up((panel_bytes + tiles - 1) / tiles, 64);
        for (int64_t i = 0, t = 0; i < item_rows; i += blk.mr, ++t) {
          L2Ahead ahead;
          if (next && t * slice < panel_bytes)
            ahead = {next + t * slice, std::min(panel_bytes, (t + 1) * slice) - t * slice};
          const int rows = static_cast<int>(std::min<int64_t>(blk.mr, item_rows - i));
          ks.f32(rows, kcur, af + i * kcur, 1, blk.mr, bp, C + i * ldc + q * ks.nr, ldc, acc,
                 ahead);
        }
        ++q;
      }
    }
  }
  if (K == 0) {
    for (int64_t i = 0; i < item_rows; ++i) std::fill(C + i * ldc, C + i * ldc + cols, 0.0f);
  }
}

// Row block b of `blocks` over rows [r0, r1) in `tiles` tiles of mr rows: the tiles spread
// evenly (each block as many as another or one fewer). Its first row and row count.
struct Span {
  int64_t m0, rows;
};
Span block_span(int64_t r0, int64_t r1, int64_t tiles, int64_t blocks, int64_t b, int mr) {
  const int64_t m0 = r0 + b * tiles / blocks * mr;
  return {m0, std::min(r1, r0 + (b + 1) * tiles / blocks * mr) - m0};
}

// Biggest items first: dynamic scheduling then balances the tail.
void biggest_first(std::vector<Item>& items) {
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.rows > b.rows; });
}

// Weights packed ahead: items of (group, up to mc rows, nc columns) over the packed panels.
void run_packed(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks) {
  const PackedPanels& w = *p.packed;
  // Column blocks outer, row blocks inner: consecutive items (on both threads at once) read the
  // same weight block (K x nc), which then comes from the L3 for every row block after the
  // first instead of from memory for each; A (mc x K per item) is the smaller re-read.
  std::vector<Item> items;
  const int64_t col_blocks = (p.n + blk.nc - 1) / blk.nc;
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t r0 = p.offsets[g], r1 = p.offsets[g + 1];
    const int64_t tiles = (r1 - r0 + blk.mr - 1) / blk.mr;
    // (A block of mc < mr rows is one tile: the tile scratch holds 16 rows at least.)
    const int64_t blocks = balanced_blocks(tiles, std::max(1, blk.mc / blk.mr), col_blocks,
                                           p.groups == 1 ? pool_threads(p.threads) : 1);
    for (int64_t n0 = 0; n0 < p.n; n0 += blk.nc) {
      for (int64_t b = 0; b < blocks; ++b) {
        const auto [m0, rows] = block_span(r0, r1, tiles, blocks, b, blk.mr);
        items.push_back({g, m0, rows, n0, std::min<int64_t>(blk.nc, p.n - n0)});
      }
    }
  }
  biggest_first(items);
  // The f32 kernels read A as f32: a bf16 A widened, or an f32 one rounded when the bf16 path
  // would have rounded it (bf16 weights on an ISA without a bf16 dot). Per call.
  Tensor a_storage;
  const float* A = w.pairs ? nullptr
                           : a_as_f32(p.a, p.a_bf16, p.round_a_to_bf16, p.offsets[p.groups] * p.k,
                                      p.threads, &a_storage);
  parallel_for(static_cast<int64_t>(items.size()), pool_threads(p.threads), [&](int64_t idx, int) {
    const Item& it = items[idx];
    const Tile t = thread_tile(blk, ks);
    const void* b =
        static_cast<const uint8_t*>(w.group(it.g)) + (it.n0 / ks.nr) * w.panel_elems * 4;
    const int64_t ldc = tile_ldc(blk.nc, ks);
    compute_block(p, blk, ks, w.pairs, A, b, w.panel_elems, it.m0, it.rows, it.cols, t.c, ldc,
                  t.apack);
    p.store(t.c, ldc, it.m0, it.rows, it.n0, it.cols);
  });
}

// Waits until `count` reaches `target`; false (at once) when `failed` is set: an item threw, and
// what it would have done will not happen.
bool wait_for(const std::atomic<int64_t>& count, int64_t target, const std::atomic<bool>& failed) {
  for (int spins = 0; count.load(std::memory_order_acquire) < target;) {
    if (failed.load(std::memory_order_relaxed)) return false;
    if (spins < 64)
      ++spins;
    else
      std::this_thread::yield();
  }
  return true;
}

// Group g of a product whose rows keep every thread busy: its weights a strip of `full_cols`
// columns at a time (BLIS's B block, shared by the threads and reused by every row block), in
// one parallel_for over the (strip, row block) items in order, with no barrier between strips.
// Items in the middle of strip s pack strip s + 1 into the other of two buffers, once strip
// s - 1, which that buffer held, is finished; an item computes once its strip is packed. A
// barrier a strip (pack, then compute) left the threads waiting at each one for the slower
// thread's last block: the f32 gated linear unit at M = 4096, K = 2048, N = 5632 (11 strips)
// took 1.03x the time of its weights packed whole ahead, next to OpenBLAS runs (tokamax bench).
// Every item waits only on items claimed before it, so the order cannot deadlock.
template <class Pack>
void run_shared_strips(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks, int64_t g,
                       int64_t full_cols, const Pack& pack, const float* A) {
  const int threads = pool_threads(p.threads);
  const int64_t r0 = p.offsets[g], rows_g = p.offsets[g + 1] - r0, N = p.n;
  const int64_t pe = panel_elems(p.k, p.bf16_dot, ks.nr);
  const int64_t strip_bytes = strip_floats(p, ks, full_cols) * 4;
  char* buffers = reinterpret_cast<char*>(thread_scratch(kSharedStripSlot, 2 * strip_bytes / 4));
  const int64_t ldc = tile_ldc(full_cols, ks);
  const int64_t strips = (N + full_cols - 1) / full_cols;
  auto panels = [&](int64_t s) {  // strip s's first panel and panel count
    const int64_t n0 = s * full_cols;
    return std::pair<int64_t, int64_t>{n0 / ks.nr,
                                       (std::min(full_cols, N - n0) + ks.nr - 1) / ks.nr};
  };
  auto buffer = [&](int64_t s) { return buffers + (s % 2) * strip_bytes; };
  // Row blocks of whole tiles, as many as fill whole waves of the threads.
  const int64_t tiles = (rows_g + blk.mr - 1) / blk.mr;
  const int64_t blocks = balanced_blocks(tiles, std::max(1, blk.mc / blk.mr), 1, threads);
  // Strip 0 by every thread at once; strip s + 1 by items [lo, hi) of strip s: past the first
  // `threads - 1` items of s and a quarter of them (when item lo is claimed, the items still
  // running on the other threads are then strip s's, unless a thread lags by that much, so
  // strip s - 1, whose buffer strip s + 1 takes, is done), and before its last quarter (strip
  // s + 1 is then packed before the first thread gets there).
  const int64_t lo = std::min(blocks - 1, std::max(blocks / 4, int64_t{threads} - 1));
  const int64_t hi = std::max(lo + 1, 3 * blocks / 4);
  const auto packed = std::make_unique<std::atomic<int64_t>[]>(strips);  // zeroed
  const auto done = std::make_unique<std::atomic<int64_t>[]>(strips);
  std::atomic<bool> failed{false};
  {
    // (Not a structured binding: clang before 16 cannot capture one in a lambda.)
    const std::pair<int64_t, int64_t> first = panels(0);
    const int64_t p0 = first.first, np = first.second;
    parallel_for(np, threads,
                 [&](int64_t q, int) { pack(g, buffer(0) + q * pe * 4, p0 + q, p0 + q + 1); });
    packed[0].store(np, std::memory_order_relaxed);
  }
  parallel_for(strips * blocks, threads, [&](int64_t idx, int) {
    const int64_t s = idx / blocks, b = idx % blocks;
    if (failed.load(std::memory_order_relaxed)) return;  // the call throws: no more work
    try {
      if (s + 1 < strips && b >= lo && b < hi) {
        if (s > 0 && !wait_for(done[s - 1], blocks, failed)) return;
        const auto [p0, np] = panels(s + 1);
        const int64_t q0 = (b - lo) * np / (hi - lo), q1 = (b - lo + 1) * np / (hi - lo);
        if (q1 > q0) pack(g, buffer(s + 1) + q0 * pe * 4, p0 + q0, p0 + q1);
        packed[s + 1].fetch_add(q1 - q0, std::memory_order_release);
      }
      if (!wait_for(packed[s], panels(s).second, failed)) return;
      const auto [C, apack] = thread_tile(blk, ks);
      const auto [m0, rows] = block_span(r0, r0 + rows_g, tiles, blocks, b, blk.mr);
      const int64_t n0 = s * full_cols, cols = std::min(full_cols, N - n0);
      compute_block(p, blk, ks, p.bf16_dot, A, buffer(s), pe, m0, rows, cols, C, ldc, apack);
      p.store(C, ldc, m0, rows, n0, cols);
      done[s].fetch_add(1, std::memory_order_release);
    } catch (...) {
      failed.store(true, std::memory_order_relaxed);
      throw;
    }
  });
}

// Whether an unpacked product's group of `rows` rows streams the weights from their own layout
// (the streaming kernels read A's rows in place: not a transposed A, nor one in panels; and
// weights in the caller's layout are only ever packed).
bool streams_group(const GroupedGemm& p, const KernelSet& ks, int64_t rows) {
  const StreamKernel stream = p.b_trans ? ks.stream_t : ks.stream;
  return stream && !p.pack_b && !p.a_trans && p.a_panel == 0 && rows <= kStreamMaxMr;
}

void run_unpacked(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks) {
  const bool trans = p.b_trans;
  const bool pairs = p.bf16_dot;
  const int64_t K = p.k, N = p.n;
  const int threads = pool_threads(p.threads);
  auto rows_of = [&](int64_t g) { return p.offsets[g + 1] - p.offsets[g]; };
  const StreamKernel stream = trans ? ks.stream_t : ks.stream;
  auto streams = [&](int64_t rows) { return streams_group(p, ks, rows); };
  const int64_t src_es = p.b_bf16 ? 2 : 4;
  // Group g's panels [p0, p1) into dst.
  auto pack = [&](int64_t g, void* dst, int64_t p0, int64_t p1) {
    if (p.pack_b)
      p.pack_b(g, dst, p0, p1);
    else
      pack_panels(ks, pairs, static_cast<const char*>(p.b) + g * K * N * src_es, p.b_bf16, trans, K,
                  N, dst, p0, p1);
  };
  // Groups tall enough to keep every thread busy on their row blocks alone share the strips
  // (BLIS's shared B block, run_shared_strips): each packed once, its row blocks spread over
  // the threads. Each weight is then packed once and each A tile once per strip, as with
  // pre-packed weights; per-item strips would pack both several times.
  auto shared = [&](int64_t rows) { return !streams(rows) && shares_strips(p.threads, blk, rows); };
  // Rows per item for the other packed-strip groups: as many as still gives 4 items a thread.
  int64_t max_rows = 0;
  bool any_stream = false;
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t s = rows_of(g);
    if (s == 0 || shared(s)) continue;
    if (streams(s))
      any_stream = true;
    else
      max_rows = std::max<int64_t>(max_rows, s);
  }
  // Items: first all of a group's rows and the blocking's columns; while that leaves fewer
  // than 4 items per thread, narrower columns (down to 256), then fewer rows. Each strip is
  // then packed once and used by every row of its group; halving the rows instead packs
  // the weights again for every row span (compute_bound: 1.2x the pre-packed call's time).
  auto count_items = [&](int64_t span, int64_t cols) {
    const int64_t col_blocks = (N + cols - 1) / cols;
    int64_t n = 0;
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t s = rows_of(g);
      if (s > 0 && !shared(s)) n += (streams(s) ? 1 : (s + span - 1) / span) * col_blocks;
    }
    return n;
  };
  int64_t span = std::max<int64_t>(round_up(max_rows, blk.mc), blk.mc);
  const int64_t full_cols = strip_cols(p, blk, ks);
  const int64_t col_step = int64_t{ks.nr} * p.panel_group;
  int64_t ncols = full_cols;
  const int64_t min_cols = std::min<int64_t>(ncols, round_up(256, col_step));
  while (count_items(span, ncols) < 4 * threads) {
    if (ncols > min_cols) {
      ncols = std::max(min_cols, round_up(ncols / 2, col_step));
    } else if (span > blk.mc) {
      span = std::max<int64_t>(blk.mc, round_up(span / 2, blk.mc));
    } else {
      break;
    }
  }
  std::vector<Item> items;
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t rows_g = rows_of(g);
    if (shared(rows_g)) continue;
    const int64_t step = streams(rows_g) ? rows_g : span;
    for (int64_t m0 = p.offsets[g]; m0 < p.offsets[g + 1]; m0 += step) {
      for (int64_t n0 = 0; n0 < N; n0 += ncols) {
        items.push_back({g, m0, std::min<int64_t>(step, p.offsets[g + 1] - m0), n0,
                         std::min<int64_t>(ncols, N - n0)});
      }
    }
  }
  biggest_first(items);
  Tensor a_storage;
  const float* A = !pairs || any_stream ? a_as_f32(p.a, p.a_bf16, p.round_a_to_bf16,
                                                   p.offsets[p.groups] * K, p.threads, &a_storage)
                                        : nullptr;
  const int64_t strip = strip_floats(p, ks, ncols);
  const int64_t pe = panel_elems(K, pairs, ks.nr);
  const int64_t ldc = tile_ldc(ncols, ks);
  parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t idx, int) {
    const Item& it = items[idx];
    const auto [C, apack] = thread_tile(blk, ks);
    if (streams(it.rows)) {
      const char* b =
          static_cast<const char*>(p.b) + (it.g * K * N + (trans ? it.n0 * K : it.n0)) * src_es;
      const int64_t lda = p.a_stride();
      stream(static_cast<int>(it.rows), K, A + it.m0 * lda, lda, b, p.b_bf16, trans ? K : N,
             it.cols, C, ldc);
      p.store(C, ldc, it.m0, it.rows, it.n0, it.cols);
      return;
    }
    float* b = thread_scratch(kStripSlot, strip);
    const int64_t p0 = it.n0 / ks.nr, np = (it.cols + ks.nr - 1) / ks.nr;
    pack(it.g, b, p0, p0 + np);
    for (int64_t r = 0; r < it.rows; r += blk.mc) {
      const int64_t rows = std::min<int64_t>(blk.mc, it.rows - r);
      compute_block(p, blk, ks, pairs, A, b, pe, it.m0 + r, rows, it.cols, C, ldc, apack);
      p.store(C, ldc, it.m0 + r, rows, it.n0, it.cols);
    }
  });
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t rows_g = rows_of(g);
    if (shared(rows_g)) run_shared_strips(p, blk, ks, g, full_cols, pack, A);
  }
}

}  // namespace

bool shares_strips(int threads, const Blocking& blk, int64_t rows) {
  return rows >= 2 * int64_t{pool_threads(threads)} * blk.mc;
}

// A single product whose last wave leaves a thread idle loses the rest of that item: the loss
// backward's logits (4096 rows, 196-row blocks: 20 whole and one of 176, one column block) kept
// one thread idle for 0.9 of an item of each 10.9 (4%); 22 blocks of 182 to 196 rows do not.
int64_t balanced_blocks(int64_t tiles, int64_t per_block, int64_t col_blocks, int threads) {
  int64_t blocks = (tiles + per_block - 1) / per_block;
  while (threads > 1 && blocks < tiles && (blocks * col_blocks) % threads != 0) ++blocks;
  return blocks;
}

int64_t panel_elems(int64_t K, bool pairs, int nr) { return (pairs ? (K + 1) / 2 : K) * nr; }

void pack_panels(const KernelSet& ks, bool pairs, const void* src, bool src_bf16, bool trans,
                 int64_t K, int64_t N, void* dst, int64_t p0, int64_t p1, int64_t ld) {
  if (!pairs && trans && !src_bf16 && ks.pack_a_f32 && p1 > p0) {
    // [N,K] f32 rows are an lhs of nr-row tiles: the vector transposing pack writes the same
    // layout (0.16 against 1.32 ns a value for the scalar loop, tokamax_gemm_bench).
    const int64_t rows = std::min(N, p1 * ks.nr) - p0 * ks.nr;
    ks.pack_a_f32(static_cast<const float*>(src) + p0 * ks.nr * (ld == 0 ? K : ld),
                  ld == 0 ? K : ld, rows, 0, K, ks.nr, static_cast<float*>(dst));
  } else if (!pairs) {
    pack_panels_f32(src, src_bf16, trans, K, N, ks.nr, static_cast<float*>(dst), p0, p1, ld);
  } else if (src_bf16 && !trans && ks.pack_b_bf16) {
    ks.pack_b_bf16(static_cast<const uint16_t*>(src), K, N, ld == 0 ? N : ld, ks.nr,
                   static_cast<uint32_t*>(dst), p0, p1);
  } else if (trans && ks.pack_rows_bf16) {
    // Each panel's nr rows of [N,K] are an lhs tile of the vector kernel's layout.
    const int64_t row_ld = ld == 0 ? K : ld, es = src_bf16 ? 2 : 4;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j0 = p * ks.nr;
      ks.pack_rows_bf16(static_cast<const char*>(src) + j0 * row_ld * es, src_bf16, row_ld,
                        std::min<int64_t>(ks.nr, N - j0), 0, K, ks.nr,
                        static_cast<uint32_t*>(dst) + (p - p0) * panel_elems(K, true, ks.nr));
    }
  } else {
    pack_panels_bf16(src, src_bf16, trans, K, N, ks.nr, static_cast<uint32_t*>(dst), p0, p1, ld);
  }
}

void grouped_gemm(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks) {
  const bool f32_only = p.a_bf16 || p.round_a_to_bf16 || (p.packed ? p.packed->pairs : p.bf16_dot);
  const int64_t min_lda = p.a_trans ? p.offsets[p.groups] : p.k;
  if ((p.lda != 0 || p.a_trans) && (p.a_stride() < min_lda || f32_only)) {
    throw InvalidArgument("grouped_gemm: a row stride of A (" + std::to_string(p.lda) +
                          (p.a_trans ? ", transposed" : "") +
                          ") needs an f32 A on the f32 kernels and at least " +
                          std::to_string(min_lda));
  }
  if (p.a_panel < 0 || (p.a_panel > 0 && (p.lda != 0 || p.a_trans || f32_only))) {
    throw InvalidArgument("grouped_gemm: A in column panels of " + std::to_string(p.a_panel) +
                          " needs a positive width, an f32 A on the f32 kernels, no row stride "
                          "and no transpose");
  }
  if (p.packed)
    run_packed(p, blk, ks);
  else
    run_unpacked(p, blk, ks);
}

int64_t grouped_gemm_scratch_bytes(const GroupedGemm& p, const Blocking& blk, const KernelSet& ks) {
  // A tile per thread; unpacked: also a strip per thread where a group takes per-item strips,
  // and the two the threads share where one shares them (both when the rows are not given).
  const int threads = pool_threads(p.threads);
  const int64_t tile = tile_floats(blk, ks) * 4;
  if (p.packed) return tile * threads;
  const int64_t strip = strip_floats(p, ks, strip_cols(p, blk, ks)) * 4;
  bool per_item = p.offsets == nullptr, shared = p.offsets == nullptr;
  for (int64_t g = 0; p.offsets && g < p.groups; ++g) {
    const int64_t rows = p.offsets[g + 1] - p.offsets[g];
    if (rows == 0 || streams_group(p, ks, rows)) continue;
    (shares_strips(p.threads, blk, rows) ? shared : per_item) = true;
  }
  return (tile + (per_item ? strip : 0)) * threads + (shared ? 2 * strip : 0);
}

int64_t grouped_gemm_tn_scratch_bytes(const GroupedGemmTn& p, const Blocking& blk,
                                      const KernelSet& ks) {
  const int64_t total = p.offsets ? p.offsets[p.groups] : 0;
  int64_t tallest = 0;
  for (int64_t g = 0; p.offsets && g < p.groups; ++g)
    tallest = std::max(tallest, p.offsets[g + 1] - p.offsets[g]);
  GroupedGemm q;
  q.k = tallest;
  q.n = p.n;
  q.threads = p.threads;
  const bool converted = p.a_bf16 || p.round_a_to_bf16;
  return (converted ? total * p.k * 4 : 0) + grouped_gemm_scratch_bytes(q, blk, ks);
}

void grouped_gemm_tn(const GroupedGemmTn& p, const Blocking& blk, const KernelSet& ks) {
  const int64_t K = p.k, N = p.n, total = p.offsets[p.groups];
  if (K == 0 || N == 0) return;  // no output
  Tensor a_storage;
  const float* A = a_as_f32(p.a, p.a_bf16, p.round_a_to_bf16, total * K, p.threads, &a_storage);
  const int64_t b_es = p.b_bf16 ? 2 : 4;
  const std::vector<float> zeros(static_cast<size_t>(N), 0.0f);
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t r0 = p.offsets[g], mg = p.offsets[g + 1] - r0;
    if (mg == 0) {  // an empty sum: zeros (one row read for every row), a tile of rows at a time
      for (int64_t i = 0; i < K; i += blk.mc)
        p.store(zeros.data(), 0, g * K + i, std::min<int64_t>(blk.mc, K - i), 0, N);
      continue;
    }
    // out_g = (A's rows of g read transposed: K rows, mg columns) x (B's rows of g: [mg, N]).
    const int64_t offsets[2] = {0, K};
    GroupedGemm q;
    q.groups = 1;
    q.offsets = offsets;
    q.k = mg;
    q.n = N;
    q.a = A + r0 * K;
    q.a_trans = true;
    q.lda = K;
    q.b = static_cast<const char*>(p.b) + r0 * N * b_es;
    q.b_bf16 = p.b_bf16;
    q.threads = p.threads;
    q.store = [&](const float* C, int64_t ldc, int64_t i0, int64_t rows, int64_t n0, int64_t cols) {
      p.store(C, ldc, g * K + i0, rows, n0, cols);
    };
    grouped_gemm(q, blk, ks);
  }
}

const float* a_as_f32(const void* a, bool a_bf16, bool round_to_bf16, int64_t count, int threads,
                      Tensor* storage) {
  if (!a_bf16 && !round_to_bf16) return static_cast<const float*>(a);
  *storage = Tensor({count}, DType::kF32);
  float* d = storage->data_as<float>();
  // Once per call over the whole A (a prefill's is megabytes): chunks in parallel, each a loop
  // the compiler vectorizes.
  constexpr int64_t kChunk = int64_t{1} << 15;
  parallel_for((count + kChunk - 1) / kChunk, threads, [&](int64_t chunk, int) {
    const int64_t b = chunk * kChunk, e = std::min(count, b + kChunk);
    if (a_bf16) {
      const uint16_t* s = static_cast<const uint16_t*>(a);
      for (int64_t i = b; i < e; ++i) d[i] = bf16_to_f32(s[i]);
    } else {
      const float* s = static_cast<const float*>(a);
      for (int64_t i = b; i < e; ++i) d[i] = tokamax::round_to_bf16(s[i]);
    }
  });
  return d;
}

}  // namespace tokamax::kernels
