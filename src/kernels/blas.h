// OpenBLAS for the baselines: set up before each of their calls (tokamax/core/blas.h says which
// kernels it runs and why that matters).
// Internal: not part of the public API.
#pragma once

#include "tokamax/core/blas.h"

namespace tokamax::kernels {

// OpenBLAS's thread count for the call, and (once per process) a warning when it runs an older
// core type's kernels than this CPU has.
void use_blas(int threads);

}  // namespace tokamax::kernels
