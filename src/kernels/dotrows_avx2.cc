// The out-features-first decode kernel at AVX2's width (compiled with -mavx2 -mfma): 4 rows x 2
// partial sums = 8 accumulators of 16 ymm.
#define TOKAMAX_DOTROWS_WIDTH 8
#define TOKAMAX_DOTROWS_UNROLL 2
#include <immintrin.h>
#define TOKAMAX_DOTROWS_BF16(p) \
  _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#include "kernels/dotrows_impl.h"

namespace tokamax::kernels {
DotRowsKernel dotrows_kernel_avx2() { return &DotRows::kernel; }
}  // namespace tokamax::kernels
