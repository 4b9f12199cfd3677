// The norm row kernels at AVX2's width (this file is compiled with -mavx2 -mfma).
#define TOKAMAX_NORM_WIDTH 8
#include "kernels/norm_impl.h"

namespace tokamax::kernels {
NormKernels norm_kernels_avx2() { return NormRows::kernels(); }
}  // namespace tokamax::kernels
