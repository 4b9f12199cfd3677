// Row kernels of layer_norm / rms_norm: statistics, normalization and the backward of one
// contiguous row, at each ISA's vector width (norm_impl.h, compiled once per ISA).
//
// Statistics are one pass: the sum of (x - K) and of (x - K)^2 with K the row's first element,
// accumulated in f64 lanes. Why not Welford: it divides per element (or merges per lane) and
// its result is no more accurate than shifted sums in f64. Why not f32 sums with compensation:
// the shift removes the cancellation between E[x^2] and E[x]^2 that makes one-pass f32 variance
// fail for rows whose mean is large against their spread, and f64 lanes make the rounding of
// thousands of terms negligible, at no cost here: the kernel waits on memory, not arithmetic.
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
  void (*apply)(const void* x, bool bf16, int64_t n, float mean, float rstd, const float* scale,
                const float* offset, void* y);
  // The backward of one row: with xhat = (x - mean) rstd and g = dy * scale,
  //   dx = rstd (g - mean(g) - xhat mean(g xhat))   (without subtract_mean: no mean(g) term);
  // dscale_acc += dy xhat and doffset_acc += dy (f32, either may be null). dx in x's dtype.
  void (*backward)(const void* x, const void* dy, bool bf16, int64_t n, float mean, float rstd,
                   const float* scale, bool subtract_mean, void* dx, float* dscale_acc,
                   float* doffset_acc);
};

NormKernels norm_kernels(Isa isa);
NormKernels norm_kernels_portable();
NormKernels norm_kernels_avx2();    // norm_avx2.cc
NormKernels norm_kernels_avx512();  // norm_avx512.cc

}  // namespace tokamax::kernels
