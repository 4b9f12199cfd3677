// The portable out-features-first decode kernel (SSE2 width, x86-64's baseline) and the per-ISA
// choice.
#define TOKAMAX_DOTROWS_WIDTH 4
#define TOKAMAX_DOTROWS_UNROLL 2
#include "kernels/dotrows_impl.h"

namespace tokamax::kernels {

DotRowsKernel dotrows_kernel_portable() { return &DotRows::kernel; }

DotRowsKernel dotrows_kernel(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return dotrows_kernel_avx512();
    case Isa::kAvx2:
      return dotrows_kernel_avx2();
    case Isa::kPortable:
      break;
  }
  return dotrows_kernel_portable();
}

}  // namespace tokamax::kernels
