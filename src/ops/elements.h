// Element access every family's reference and baseline loops share: element i of a contiguous
// f32 or bf16 buffer read as f32, and an f32 value stored in a buffer's dtype (bf16 rounded to
// nearest even).
#pragma once

#include <cstdint>

#include "tokamax/core/dtype.h"
#include "tokamax/core/tensor.h"

namespace tokamax {

inline float load_f32(const void* p, DType dt, int64_t i) {
  return dt == DType::kF32 ? static_cast<const float*>(p)[i]
                           : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
inline float load_f32(const TensorView& t, int64_t i) { return load_f32(t.data(), t.dtype(), i); }

inline void store_f32(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::kF32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
}
inline void store_f32(const TensorView& t, int64_t i, float v) {
  store_f32(t.data(), t.dtype(), i, v);
}

// The rule for an f32 x multiplied by bf16 weights (the gated linear unit, the loss; ragged_dot
// at its default precision): x is rounded to bf16 in every implementation and on every CPU, so
// every product is exact in f32 as the CPU's bf16 dot computes it, and a result does not depend
// on which kernels a machine has.
inline bool bf16_weights_round_x(DType x, DType w) { return x == DType::kF32 && w == DType::kBF16; }

}  // namespace tokamax
