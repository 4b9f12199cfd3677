// Software prefetches of the attention decode kernels (StreamHeadsKernel, StreamAccKernel,
// DotStreamAccKernel), shared by the ISA files. Why they exist: a decode step reads a KV cache
// whose position rows are a page each ([S, Nk, H]: 8 heads of 128 f32 = 4 KiB), and Zen 4's
// hardware prefetchers stop at every page, so each row started with demand misses and memory
// sat idle while the kernels computed. A plain sequential read with ~500 FMA cycles of work per
// 4 KiB, 2 threads, 4 interleaved rounds: 20-29 GB/s without software prefetches, 33-38 GB/s
// (the pure read's rate) with prefetcht1 one page ahead spread over the work, 25-32 GB/s at 16
// or 64 KiB ahead, 23-32 with prefetcht0.
//
// On Intel, decode's FMA kernels (f32 and bf16 widened) prefetch into L1 instead, as they read
// (l1_ahead; decode_l1_ahead in ops/attention/native.cc says why and what each form measured on
// Sapphire Rapids and on Zen 4, where the L1 form took about 1.5x the time). What follows is the
// L2 scheme, which AMD CPUs and the bf16 dot's kernels keep; its findings (q k^T not prefetching
// its own next positions, P v's prefetch the one that counts) were made with it.
// What the kernels prefetch: q k^T, as its caller asks (HeadsPrefetch: the first sub-block's V
// rows, then the next sub-block's K rows, a block ahead), and P v the next sub-block's V rows,
// one row for each row it reads (prefetch_row). Not q k^T's own next positions. A form that
// spread those over its K loop was kept on 2026-12-05 (decode f32 75-84% of the read ceiling
// against 67-74% for bursts of them, Zen 4), but GCC 12 had compiled it to nothing
// (kernels/prefetch.h): bursts had lost to no prefetch, and every measurement since (the block
// ahead, the shipped tuning) ran without it. Issued for real on Sapphire Rapids: q k^T with its
// data in L2 1.4x the time (rdtsc, one thread), and decode S=8192 from a flushed cache 2.97-3.00
// ms against 3.00-3.05 without it (f32; bf16 1.94-2.01 against 1.97-2.00; 3 interleaved pairs of
// tokamax bench runs). So it is gone, which leaves the compiled kernels as they were. P v's
// prefetch is the one that counts there: removed, f32 decode took 3.06-3.24 ms against 2.93-2.99
// and bf16 2.45-2.57 against 1.94-1.96 (3 interleaved rounds).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/prefetch.h"

namespace tokamax::kernels {

// Columns [j, j + n) of row `row` of a row-major matrix b (rows ld elements of es bytes apart)
// into L2: the P v kernels' next block, one row per row they read.
inline void prefetch_row(const void* b, int64_t es, int64_t row, int64_t ld, int64_t j, int64_t n) {
  prefetch_l2(static_cast<const char*>(b) + (row * ld + j) * es, 0, n * es);
}

// The same columns of row `row`, `ahead` bytes further on, into L1 (nothing when ahead is 0): the
// decode kernels' l1_ahead, issued as they read the row.
inline void prefetch_row_l1(const void* b, int64_t es, int64_t row, int64_t ld, int64_t j,
                            int64_t n, int64_t ahead) {
  if (ahead != 0) prefetch_l1(static_cast<const char*>(b) + (row * ld + j) * es + ahead, 0, n * es);
}

// Bytes [lo, hi) of `rows` rows ld bytes apart into L2, a few lines at a time over a kernel's
// steps (issue(per_step(steps)) each step, then rest()) rather than in a burst, which holds the
// core's fill buffers while the kernel's own loads wait (as the grouped GEMM's L2Ahead,
// kernels/microkernels.h). Default-constructed: nothing to issue.
class RowLines {
 public:
  RowLines() = default;
  RowLines(const char* p, int64_t ld, int64_t lo, int64_t hi, int64_t rows)
      : p_(p ? p + lo : nullptr),
        ld_(ld),
        span_((hi - lo + 63) / 64 * 64),
        left_(hi > lo && p ? rows * ((hi - lo + 63) / 64) : 0) {}

  // Lines a step issues to finish within `steps` steps (all of them when steps <= 0).
  int64_t per_step(int64_t steps) const { return steps > 0 ? (left_ + steps - 1) / steps : left_; }
  // The count is settled first, so the loop has one branch a line besides its own: the q k^T
  // kernel calls this every 16 values of K. Against the form before (a rows-left test and the
  // row's end recomputed a line), Zen 4, decode S=1024 with its 8 MiB of KV in L3 (a one-off
  // loop of calls, interleaved): one thread 0.72-0.94x the time (7 pairs, median 0.86), two
  // 0.82-0.91x (4 of 6 pairs; one round 1.4-1.5x, a neighbour's burst); from memory (tokamax
  // bench --tag decode, 6 pairs) f32 0.96-1.03x, bf16 0.85-1.06x: alike.
  void issue(int64_t n) {
    n = std::min(n, left_);
    left_ -= n;
    for (; n > 0; --n) {
      prefetch_t1(p_ + off_);
      off_ += 64;
      if (off_ == span_) {
        off_ = 0;
        p_ += ld_;
      }
    }
  }
  void rest() { issue(left_); }

 private:
  const char* p_ = nullptr;  // the current row's first byte to prefetch
  int64_t ld_ = 0;
  int64_t span_ = 0;  // a row's bytes to prefetch, whole lines
  int64_t left_ = 0;  // lines left in all
  int64_t off_ = 0;   // bytes past p_ of the next line
};

// A heads kernel's prefetches, head by head: when it computes positions [j, j + n) of head h,
// head h's share of the caller's `extra` rows j..j + n - 1 (extra_bytes per row, extra_ld
// apart: decode passes the first sub-block's V rows, which P v reads next, then the next
// sub-block's K rows, a block ahead; P v prefetches the later V rows itself).
class HeadsPrefetch {
 public:
  HeadsPrefetch(int heads, const char* extra, int64_t extra_ld, int64_t extra_bytes)
      : extra_(extra),
        extra_ld_(extra_ld),
        extra_bytes_(extra_bytes),
        share_(heads > 0 ? (extra_bytes / heads + 63) / 64 * 64 : 0) {}

  // Those rows' lines, to issue over a kernel's steps (the FMA kernels) or at once (extra).
  RowLines lines(int64_t j, int64_t n, int h) const {
    if (!extra_) return {};
    const int64_t lo = h * share_, hi = lo + share_ < extra_bytes_ ? lo + share_ : extra_bytes_;
    return RowLines(extra_ + j * extra_ld_, extra_ld_, lo, hi, n);
  }
  void extra(int64_t j, int64_t n, int h) const { lines(j, n, h).rest(); }

 private:
  const char* extra_;
  int64_t extra_ld_, extra_bytes_;
  int64_t share_;  // bytes of an extra row per head, whole lines
};

}  // namespace tokamax::kernels
