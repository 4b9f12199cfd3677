// The portable norm row kernels (SSE2 width, x86-64's baseline) and the per-ISA choice.
#define TOKAMAX_NORM_WIDTH 4
#include "kernels/norm_impl.h"

namespace tokamax::kernels {

NormKernels norm_kernels_portable() { return NormRows::kernels(); }

NormKernels norm_kernels(Isa isa) {
  return for_isa(isa, &norm_kernels_portable, &norm_kernels_avx2, &norm_kernels_avx512);
}

}  // namespace tokamax::kernels
