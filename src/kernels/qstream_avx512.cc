// The quantized streaming kernel at AVX-512's width (compiled with -mavx512f and friends).
#define TOKAMAX_QSTREAM_WIDTH 16
#include "kernels/qstream_impl.h"

namespace tokamax::kernels {
QStreamKernel qstream_kernel_avx512() { return &QStream::kernel; }
}  // namespace tokamax::kernels
