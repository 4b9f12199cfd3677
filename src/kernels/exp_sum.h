// x[i] = exp(x[i] - shift) over a row, returning the sum: the softmax's inner loop. Written as a
// plain loop of float arithmetic (a degree-6 polynomial on the reduced argument, scaled by 2^n
// through the exponent bits) that the compiler vectorizes at each ISA file's width; included by
// those files only. About 2 ulp over the range that matters; exactly 0 below e^-87 (and for -inf,
// the masked logits).
#pragma once

#include <cstdint>
#include <cstring>

namespace tokamax::kernels {

inline float exp_shift_sum_impl(float* x, int64_t n, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] - shift;
    const bool under = !(v > -87.0f);  // also NaN-free for -inf
    v = v < -87.0f ? -87.0f : v;
    v = v > 88.0f ? 88.0f : v;
    const float kf = __builtin_roundevenf(v * 1.44269504088896341f);
    const float r = v - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    const float e = under ? 0.0f : p * scale;
    x[i] = e;
    sum += e;
  }
  return sum;
}

}  // namespace tokamax::kernels
