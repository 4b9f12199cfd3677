// The autotuning layer's backend for the resolution ladder (rungs 3-5: scopes, the disk cache,
// autotune on miss), installed by install_autotuning_backend (op/builtins.h).
#pragma once

#include "tokamax/op/op.h"

namespace tokamax {

// Whether a scope or the disk cache already has a config for bound (or there is nothing to tune).
bool already_tuned(const Implementation& impl, const BoundArguments& bound);

}  // namespace tokamax
