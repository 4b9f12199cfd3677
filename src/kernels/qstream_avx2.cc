// The quantized streaming kernel at AVX2's width (compiled with -mavx2 -mfma).
#define TOKAMAX_QSTREAM_WIDTH 8
#include "kernels/qstream_impl.h"

namespace tokamax::kernels {
QStreamKernel qstream_kernel_avx2() { return &QStream::kernel; }
}  // namespace tokamax::kernels
