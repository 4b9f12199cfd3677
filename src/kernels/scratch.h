// Per-thread scratch for kernels, kept between calls: pool threads are persistent, so
// steady-state calls allocate nothing. Each slot grows to the largest request seen on its
// thread; callers own distinct slots (a kernel may hold several at once).
#pragma once

#include <algorithm>
#include <cstdint>

#include "tokamax/core/tensor.h"

namespace tokamax::kernels {

enum ScratchSlot {
  kTileSlot = 0,         // grouped GEMM: C tile + packed A
  kStripSlot = 1,        // grouped GEMM: an item's packed weight strip
  kSharedStripSlot = 2,  // grouped GEMM: the two strips a call's threads share (caller's)
  kAttentionSlot = 3,    // attention forward / backward: an item's tiles
  kEpilogueSlot = 4,     // a grouped GEMM's store callback (a row of its tile)
  kNumScratchSlots = 5,
};

// 64-byte aligned, at least `floats` floats.
inline float* thread_scratch(ScratchSlot slot, int64_t floats) {
  thread_local Tensor buffers[kNumScratchSlots];
  Tensor& buffer = buffers[slot];
  // A default Tensor is a rank-0 scalar with no data (size() 1): a 1-float request must still
  // allocate.
  if (buffer.rank() == 0 || buffer.size() < floats)
    buffer = Tensor({std::max<int64_t>(floats, 1)}, DType::kF32);
  return buffer.data_as<float>();
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace tokamax::kernels
