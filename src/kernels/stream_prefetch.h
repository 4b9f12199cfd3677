// Software prefetches of the attention decode kernels (StreamHeadsKernel, StreamAccKernel,
// DotStreamAccKernel), shared by the ISA files. Why they exist: a decode step reads a KV cache
// whose position rows are a page each ([S, Nk, H]: 8 heads of 128 f32 = 4 KiB), and Zen 4's
// hardware prefetchers stop at every page, so each row started with demand misses and memory
// sat idle while the kernels computed. A plain sequential read with ~500 FMA cycles of work per
// 4 KiB, 2 threads, 4 interleaved rounds: 20-29 GB/s without software prefetches, 33-38 GB/s
// (the pure read's rate) with prefetcht1 one page ahead spread over the work, 25-32 GB/s at 16
// or 64 KiB ahead, 23-32 with prefetcht0. So each kernel prefetches the next rows of its own
// stream a little at a time, as it computes: a few lines at each step of its inner loop (the
// AVX-512 heads kernels: decode 1.01-1.36x (f32) and 1.25-1.33x (bf16) faster, 6 and 3
// interleaved pairs of bench runs, than with the same lines issued in one burst before each
// head's work; the AVX2 one, whose bursts were a position's 8 lines, measured alike under
// TOKAMAX_ISA=avx2 here, 7 interleaved pairs).
//
// A correction to those pairs: until 2026-12-05 GCC 12 compiled SpreadPrefetch::step and P v's
// prefetch_row to nothing (loops of prefetches only; kernels/prefetch.h), so the "spread" side
// of them issued no next-row prefetches at all, and it was the bursts that lost. With the
// prefetches issued (the asm helpers), Sapphire Rapids, decode S=8192 from a flushed cache,
// 3 interleaved pairs of tokamax bench runs: f32 2.97-3.00 ms against 3.00-3.05 without, bf16
// 1.94-2.01 against 1.97-2.00: alike. That VM adds a stream's compute to its read time whether
// or not lines are prefetched ahead (tokamax_overlap_bench), so there the prefetches neither
// help nor hurt; they stay for the machines where memory runs on during compute (Zen 4 above).
#pragma once

#include <cstdint>

#include "kernels/prefetch.h"

namespace tokamax::kernels {

// [p + begin, p + end) into L2, one prefetch per 64-byte line (prefetcht1: SSE, so baseline
// code may call it too; the layer norm's forward does).
inline void prefetch_l2(const char* p, int64_t begin, int64_t end) {
  for (int64_t off = begin; off < end; off += 64) prefetch_t1(p + off);
}

// Columns [j, j + n) of row `row` of a row-major matrix b (rows ld elements of es bytes apart)
// into L2: the P v kernels' next block, one row per row they read.
inline void prefetch_row(const void* b, int64_t es, int64_t row, int64_t ld, int64_t j, int64_t n) {
  prefetch_l2(static_cast<const char*>(b) + (row * ld + j) * es, 0, n * es);
}

// Rows of a stream prefetched into L2 a share at a time over the steps of a kernel's loop
// rather than all before it: step s of `steps` takes lines [s L / steps, (s + 1) L / steps) of
// each row (L lines a row). Empty (rows 0): nothing.
struct SpreadPrefetch {
  const char* p = nullptr;
  int64_t rows = 0, ld_bytes = 0, lines = 0;
  void step(int64_t s, int64_t steps) const {
    const int64_t lo = s * lines / steps, hi = (s + 1) * lines / steps;
    for (int64_t r = 0; r < rows; ++r) prefetch_l2(p + r * ld_bytes, lo * 64, hi * 64);
  }
};

// A heads kernel's prefetches, head by head: when it computes positions [j, j + n) of head h,
// the same head's K rows of the next n positions (within the block's cols; rows ld_bytes apart,
// head_bytes long and apart), spread over its K loop (next_rows), and before it head h's share
// of the caller's `extra` rows j..j + n - 1 (extra_bytes per row, extra_ld apart: decode passes
// the first sub-block's V rows, which P v reads next, then the next sub-block's K rows, a block
// ahead; P v prefetches the later V rows itself).
class HeadsPrefetch {
 public:
  HeadsPrefetch(const void* b, int64_t ld_bytes, int64_t head_bytes, int64_t cols, int heads,
                const char* extra, int64_t extra_ld, int64_t extra_bytes)
      : b_(static_cast<const char*>(b)),
        ld_bytes_(ld_bytes),
        head_bytes_(head_bytes),
        cols_(cols),
        extra_(extra),
        extra_ld_(extra_ld),
        extra_bytes_(extra_bytes),
        share_(heads > 0 ? (extra_bytes / heads + 63) / 64 * 64 : 0) {}

  void extra(int64_t j, int64_t n, int h) const {
    if (!extra_) return;
    const int64_t lo = h * share_, hi = lo + share_ < extra_bytes_ ? lo + share_ : extra_bytes_;
    for (int64_t jj = j; jj < j + n; ++jj) prefetch_l2(extra_ + jj * extra_ld_, lo, hi);
  }
  // Head h's K rows of the n positions after [j, j + n) (within the block).
  SpreadPrefetch next_rows(int64_t j, int64_t n, int h) const {
    const int64_t end = j + 2 * n < cols_ ? j + 2 * n : cols_;
    return {b_ + h * head_bytes_ + (j + n) * ld_bytes_, end > j + n ? end - (j + n) : 0, ld_bytes_,
            (head_bytes_ + 63) / 64};
  }

 private:
  const char* b_;
  int64_t ld_bytes_, head_bytes_, cols_;
  const char* extra_;
  int64_t extra_ld_, extra_bytes_;
  int64_t share_;  // bytes of an extra row per head, whole lines
};

}  // namespace tokamax::kernels
