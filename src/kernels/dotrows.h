// The decode product with weights stored out-features first (torch's nn.Linear, transformers'
// experts: W [cols, K] row-major): each weight row is dotted with up to kDotMaxRows rows of a,
//   out[i * ldo + c] = sum_{k < K} a[i * lda + k] * W[c * ldw + k],  i < rows, c < cols,
// so every weight row is one contiguous forward stream, read from memory once for all rows (a
// few columns at a time; the rows of a come from L1). Weights bf16 (widened exactly in
// registers) or f32; a in f32 (a caller that multiplies bf16-rounded values rounds them first).
// Sums accumulate in f32, in lane order then across lanes. Written once over vector types
// (dotrows_impl.h) and compiled per ISA. No framework types here.
#pragma once

#include <cstdint>

#include "kernels/microkernels.h"

namespace tokamax::kernels {

inline constexpr int kDotMaxRows = 4;

using DotRowsKernel = void (*)(int rows, int64_t cols, int64_t k, const float* a, int64_t lda,
                               const void* w, bool w_bf16, int64_t ldw, float* out, int64_t ldo);

DotRowsKernel dotrows_kernel(Isa isa);
DotRowsKernel dotrows_kernel_portable();
DotRowsKernel dotrows_kernel_avx2();
DotRowsKernel dotrows_kernel_avx512();

}  // namespace tokamax::kernels
