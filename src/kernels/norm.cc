// The portable norm row kernels (SSE2 width, x86-64's baseline) and the per-ISA choice.
#define TOKAMAX_NORM_WIDTH 4
#include "kernels/norm_impl.h"

namespace tokamax::kernels {

NormKernels norm_kernels_portable() { return NormRows::kernels(); }

NormKernels norm_kernels(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return norm_kernels_avx512();
    case Isa::kAvx2:
      return norm_kernels_avx2();
    case Isa::kPortable:
      break;
  }
  return norm_kernels_portable();
}

}  // namespace tokamax::kernels
