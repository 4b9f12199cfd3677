// The counter-based generator behind Tensor::uniform and fill_uniform, one value at a time: for
// code that needs a long stream of uniforms without holding them all (ragged_dot spreads a
// spec's total_size rows over its groups this way). Internal.
#pragma once

#include <cstdint>

namespace tokamax {

// The value fill_uniform(view, seed) gives element `index`, in [0, 1).
double uniform_at(uint64_t seed, uint64_t index);

}  // namespace tokamax
