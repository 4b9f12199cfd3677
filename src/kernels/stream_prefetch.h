// Software prefetches of the attention decode kernels (StreamHeadsKernel, StreamAccKernel,
// DotStreamAccKernel), shared by the ISA files. Why they exist: a decode step reads a KV cache
// whose position rows are a page each ([S, Nk, H]: 8 heads of 128 f32 = 4 KiB), and Zen 4's
// hardware prefetchers stop at every page, so each row started with demand misses and memory
// sat idle while the kernels computed. A plain sequential read with ~500 FMA cycles of work per
// 4 KiB, 2 threads, 4 interleaved rounds: 20-29 GB/s without software prefetches, 33-38 GB/s
// (the pure read's rate) with prefetcht1 one page ahead spread over the work, 25-32 GB/s at 16
// or 64 KiB ahead, 23-32 with prefetcht0. So each kernel prefetches the next rows of its own
// stream a little at a time, as it computes.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tokamax::kernels {

// [p + begin, p + end) into L2, one prefetch per 64-byte line.
inline void prefetch_l2(const char* p, int64_t begin, int64_t end) {
  for (int64_t off = begin; off < end; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
}

// A heads kernel's prefetches, issued head by head so they spread over its work: when it
// computes positions [j, j + n) of head h, the same head's K rows of the next n positions
// (within the block's cols; K rows row_bytes long, ld_bytes apart, head_bytes apart per head)
// and head h's share of the caller's `extra` rows j..j + n - 1 (extra_bytes per row, extra_ld
// apart: decode passes the first sub-block's V rows, which P v reads next).
struct HeadsPrefetch {
  const char* b;
  int64_t ld_bytes, head_bytes, cols;
  int heads;
  const char* extra;
  int64_t extra_ld, extra_bytes;

  void operator()(int64_t j, int64_t n, int h) const {
    const char* bh = b + h * head_bytes;
    const int64_t end = j + 2 * n < cols ? j + 2 * n : cols;
    for (int64_t jj = j + n; jj < end; ++jj) prefetch_l2(bh + jj * ld_bytes, 0, head_bytes);
    if (!extra) return;
    const int64_t share = (extra_bytes / heads + 63) / 64 * 64;
    const int64_t lo = h * share, hi = lo + share < extra_bytes ? lo + share : extra_bytes;
    for (int64_t jj = j; jj < j + n; ++jj) prefetch_l2(extra + jj * extra_ld, lo, hi);
  }
};

}  // namespace tokamax::kernels
