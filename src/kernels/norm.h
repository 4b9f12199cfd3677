// Row kernels of layer_norm / rms_norm: statistics, normalization and the backward of one
// contiguous row, at each ISA's vector width (norm_impl.h, compiled once per ISA).
//
// Statistics are one pass: the sums of (x - K) and (x - K)^2, K the row's first element,
// accumulated in f32 lanes over blocks of 32 values per lane and in f64 across blocks. The
// shift removes the cancellation between E[x^2] and E[x]^2 that makes one-pass variance fail
// for rows whose mean is large against their spread; the short f32 blocks keep the rounding
// near 2e-6 relative whatever the row length, and the f64 sums across blocks stop it growing.
// Why not Welford: a division per element (or per-lane merges) and no better result than
// shifted sums. Why not f64 per element: measured, widening every element made the kernel
// compute-bound (71% of the copy ceiling at [4096,4096] against 91% with f32 blocks).
#pragma once

#include <cstdint>

#include "kernels/microkernels.h"

namespace tokamax::kernels {

struct NormKernels {
  // Row statistics of n elements (f32 or bf16): *mean (0 without subtract_mean) and
  // *rstd = 1 / sqrt(var + eps), var the mean of (x - mean)^2 (of x^2 without subtract_mean).
  void (*stats)(const void* x, bool bf16, int64_t n, bool subtract_mean, float eps, float* mean,
                float* rstd);
  // y = (x - mean) * rstd * scale + offset (scale, offset f32 or null); y in x's dtype.
  // `stream`: y is written with non-temporal stores (where the ISA has them and y is aligned to
  // the vector), which skip the read for ownership an ordinary store makes of every line: for
  // outputs too large to stay in the last-level cache anyway. Such stores are weakly ordered:
  // the caller calls fence() after its last streamed row, before another thread may read the
  // output (once per work item: a fence per row of 128 values took the AlphaFold-like layer
  // norm from 3.8 to 9.3 ms).
  void (*apply)(const void* x, bool bf16, int64_t n, float mean, float rstd, const float* scale,
                const float* offset, void* y, bool stream);
  // The backward of one row: with xhat = (x - mean) rstd and g = dy * scale,
  //   dx = rstd (g - mean(g) - xhat mean(g xhat))   (without subtract_mean: no mean(g) term);
  // dscale_acc += dy xhat and doffset_acc += dy (f32, either may be null). dx in x's dtype.
  // x_next, dy_next (or null): n elements each prefetched into L2 as dx is written (the
  // caller passes a row a few on). `stream`: dx written non-temporally, as apply's y.
  void (*backward)(const void* x, const void* dy, bool bf16, int64_t n, float mean, float rstd,
                   const float* scale, bool subtract_mean, void* dx, float* dscale_acc,
                   float* doffset_acc, const void* x_next, const void* dy_next, bool stream);
  // Orders the streamed stores before what follows (sfence; a no-op where nothing streams).
  void (*fence)();
  // sum = a + b elementwise over n elements (f32 or bf16, all three the same), each sum
  // rounded once to the dtype: a residual stream's update before its norm (add_rms_norm).
  void (*add)(const void* a, const void* b, bool bf16, int64_t n, void* sum);
};

NormKernels norm_kernels(Isa isa);
NormKernels norm_kernels_portable();
NormKernels norm_kernels_avx2();    // norm_avx2.cc
NormKernels norm_kernels_avx512();  // norm_avx512.cc

}  // namespace tokamax::kernels
