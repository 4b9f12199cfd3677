// The softmax's row loops at each ISA's width: x[i] = exp(x[i] - shift) returning the sum, and
// x[i] *= scale returning the max. exp is Cephes' expf: n = round(x log2 e), a degree-6
// polynomial on the reduced argument, times 2^n; about 2 ulp, exactly 0 below e^-87 (and for
// -inf, the masked logits). This header holds the constants and the portable loops; the vector
// loops are in the ISA files (microkernels_avx2.cc, microkernels_avx512.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tokamax::kernels::expf_poly {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kLo = -87.0f, kHi = 88.0f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp1(float v) {
  if (!(v > kLo)) return 0.0f;
  v = v > kHi ? kHi : v;
  const float kf = std::nearbyint(v * kLog2e);
  const float r = v - kf * kLn2Hi - kf * kLn2Lo;
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = p * r + kP[i];
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float exp_shift_sum_portable(float* x, int64_t n, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] = exp1(x[i] - shift);
  return sum;
}

inline float scale_max_portable(float* x, int64_t n, float scale) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= scale;
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

}  // namespace tokamax::kernels::expf_poly
