// The out-features-first decode kernel at AVX-512's width (compiled with -mavx512f and
// friends): 4 rows x 4 partial sums = 16 accumulators of 32 zmm.
#define TOKAMAX_DOTROWS_WIDTH 16
#define TOKAMAX_DOTROWS_UNROLL 4
#include <immintrin.h>
#define TOKAMAX_DOTROWS_BF16(p) \
  _mm512_maskz_cvtepu16_epi32(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
#include "kernels/dotrows_impl.h"

namespace tokamax::kernels {
DotRowsKernel dotrows_kernel_avx512() { return &DotRows::kernel; }
}  // namespace tokamax::kernels
