// The norm row kernels at AVX-512's width (this file is compiled with -mavx512f and friends).
#define TOKAMAX_NORM_WIDTH 16
#include "kernels/norm_impl.h"

namespace tokamax::kernels {
NormKernels norm_kernels_avx512() { return NormRows::kernels(); }
}  // namespace tokamax::kernels
