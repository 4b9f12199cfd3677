// The tensor buffer cache's settings (src/core/tensor.cc), parsed here so they can be tested.
#pragma once

#include <cstddef>

namespace tokamax {

// TOKAMAX_TENSOR_CACHE_MB's value: megabytes in [0, 1048576] (unset or empty: 256).
// InvalidArgument naming the variable and its value otherwise.
size_t tensor_cache_limit_mb(const char* value);

}  // namespace tokamax
