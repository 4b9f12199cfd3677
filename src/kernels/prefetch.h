// Software prefetch instructions the compiler cannot drop (x86 with SSE; elsewhere the builtin).
//
// Why not _mm_prefetch / __builtin_prefetch: GCC 12 (Debian 12's compiler, the one CI builds
// with) may delete loops whose only effect is prefetching, in whole or all but the first
// iteration (intel/ScalableVectorSearch#361 met the same). Here it had compiled q k^T's spread
// prefetch of its next positions (a loop over rows of a loop over lines, with the line range
// divided out per step) to nothing: no prefetch instruction in stream_t_cols or dot_t_cols, and
// a stand-alone call of it compiled to a bare `ret`. The other prefetch loops (P v's next
// rows, the grouped GEMM's next panel, the norms') had survived, by luck of their shape. An asm
// statement is kept as written; it has no memory clobber, so it does not stop the compiler from
// keeping values in registers around it. p need not point into a live object: the operand only
// names the address (nothing is loaded, and a prefetch never faults).
#pragma once

#include <cstdint>

namespace tokamax::kernels {

// The line holding p into every cache level (T0) or into L2 and below (T1).
inline void prefetch_t0(const void* p) {
#if defined(__SSE__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}
inline void prefetch_t1(const void* p) {
#if defined(__SSE__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// [p + begin, p + end) into L2 at once, one prefetch per 64-byte line (SSE, so baseline code
// may call it too; the layer norm's forward does).
inline void prefetch_l2(const char* p, int64_t begin, int64_t end) {
  for (int64_t off = begin; off < end; off += 64) prefetch_t1(p + off);
}
inline void prefetch_l1(const char* p, int64_t begin, int64_t end) {
  for (int64_t off = begin; off < end; off += 64) prefetch_t0(p + off);
}

}  // namespace tokamax::kernels
