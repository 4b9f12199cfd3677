// The portable out-features-first decode kernel (SSE2 width, x86-64's baseline) and the per-ISA
// choice.
#define TOKAMAX_DOTROWS_WIDTH 4
#define TOKAMAX_DOTROWS_UNROLL 2
#include "kernels/dotrows_impl.h"

namespace tokamax::kernels {

DotRowsKernel dotrows_kernel_portable() { return &DotRows::kernel; }

DotRowsKernel dotrows_kernel(Isa isa) {
  return for_isa(isa, &dotrows_kernel_portable, &dotrows_kernel_avx2, &dotrows_kernel_avx512);
}

}  // namespace tokamax::kernels
