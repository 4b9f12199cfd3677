// The portable quantized streaming kernel (SSE2 width, x86-64's baseline), the per-ISA choice,
// and the scalar decoders of each format.
#define TOKAMAX_QSTREAM_WIDTH 4
#include <cmath>
#include <limits>

#include "kernels/qstream_impl.h"

namespace tokamax::kernels {

QStreamKernel qstream_kernel_portable() { return &QStream::kernel; }

QStreamKernel qstream_kernel(Isa isa) {
  return for_isa(isa, &qstream_kernel_portable, &qstream_kernel_avx2, &qstream_kernel_avx512);
}

float decode_fp8_e4m3(uint8_t q) {
  const int e = (q >> 3) & 15, m = q & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + static_cast<float>(m) / 8, e - 7);
  return q & 0x80 ? -mag : mag;
}

float decode_e2m1(uint8_t nibble) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kValues[nibble & 7];
  return nibble & 8 ? -mag : mag;
}

float decode_e8m0(uint8_t e) {
  if (e == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

}  // namespace tokamax::kernels
