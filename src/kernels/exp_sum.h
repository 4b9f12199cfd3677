// The softmax's row loops at each ISA's width: x[i] = exp(x[i] * scale - shift) returning the
// sum, x[i] *= scale returning the max, and the max alone. exp: n = round(x log2 e), the reduced
// argument r = x - n ln 2 (two parts), e^r as a degree-6 polynomial with its first two
// coefficients 1 (fitted minimax for relative error on [-ln2/2, ln2/2], 3e-9), times 2^n; exactly
// 0 below e^-87 (and for -inf, the masked logits), +inf above ln(FLT_MAX); NaN stays NaN (the
// maxima may skip a NaN: the exp then carries it into the sum). Against double exp over every float
// in
// [-87, 0.5], scalar emulation with fma (one-off, 1.7e9 values): at most 0.88 ulp, mean 0.074,
// where Cephes' expf (a degree-5 polynomial q in 1 + r + r^2 q(r), the form used until
// 2026-12-06) gives 1.26 and 0.086 with two more operations; degree 5 would save one more and
// give 2.18 ulp. The vector loops are in the ISA files (microkernels_avx2.cc,
// microkernels_avx512.cc); this header holds the constants and the portable loops.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tokamax::kernels::expf_poly {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kLo = -87.0f, kHi = 88.0f;
// ln(FLT_MAX): above it exp overflows to +inf (the polynomial, clamped at kHi, would give a
// finite e^88: an Inf logit must stay infinite, as std::exp keeps it).
inline constexpr float kOverflow = 88.72283935546875f;
// AVX-512's clamp: above ln(FLT_MAX), so that scalef overflows to +inf there (an integer 2^n,
// as the AVX2 and portable loops build it, needs kHi).
inline constexpr float kExpClampAvx512 = 89.0f;
// e^r ~ 1 + r (1 + r (kP[4] + r (kP[3] + r (kP[2] + r (kP[1] + r kP[0]))))): Horner, 6 FMAs.
inline constexpr float kP[5] = {1.381461319e-3f, 8.368709823e-3f, 4.166838736e-2f, 1.666652069e-1f,
                                4.999999345e-1f};

inline float exp1(float v) {
  if (std::isnan(v)) return v;  // as the vector loops: NaN stays NaN
  if (!(v > kLo)) return 0.0f;
  if (v > kOverflow) return INFINITY;
  v = v > kHi ? kHi : v;
  const float kf = std::nearbyint(v * kLog2e);
  // Plain products and sums (fused where the compiler may): std::fma would be a libm call
  // without the FMA instructions, where this portable loop runs.
  const float r = v - kf * kLn2Hi - kf * kLn2Lo;
  float p = kP[0];
  for (int i = 1; i < 5; ++i) p = p * r + kP[i];
  p = (p * r + 1.0f) * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float exp_shift_sum_portable(float* x, int64_t n, float scale, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] = exp1(x[i] * scale - shift);
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

inline float max_portable(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace tokamax::kernels::expf_poly
