// Peak-rate loops for the roofline, one per ISA (plain functions; the ISA files are compiled
// with their own -m flags and must only be called when the CPU has that ISA).
// Each returns a value derived from its accumulators so the work cannot be optimized away.
#pragma once

#include <cstdint>

namespace tokamax::roofline {

// iters iterations of 12 independent FMA chains; flops = iters * 12 * lanes * 2.
float fma_f32_avx512(int64_t iters);  // 16 lanes
float fma_f32_avx2(int64_t iters);    // 8 lanes
// iters iterations of 12 independent vdpbf16ps chains; flops = iters * 12 * 16 * 4.
float dot_bf16_avx512(int64_t iters);
// iters iterations of 4 independent TDPBF16PS (16x32 by 32x16 bf16); flops = iters * 4 * 16384.
float dot_bf16_amx(int64_t iters);
// Streaming read (sum) and copy over n floats (the copy with non-temporal stores).
float read_f32_avx2(const float* p, int64_t n);
void copy_f32_avx2(const float* src, float* dst, int64_t n);

}  // namespace tokamax::roofline
