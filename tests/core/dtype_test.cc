// DType names and exhaustive bf16 / f16 conversions against independent formulas.
#include "tokamax/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tokamax/core/error.h"
#include "tokamax/core/log.h"

namespace tokamax {
namespace {

// Independent decoders: sign * mantissa * 2^exp computed in double.
double decode(uint32_t bits, int exp_bits, int mant_bits) {
  const uint32_t sign = bits >> (exp_bits + mant_bits);
  const uint32_t e = (bits >> mant_bits) & ((1u << exp_bits) - 1);
  const uint32_t m = bits & ((1u << mant_bits) - 1);
  const int bias = (1 << (exp_bits - 1)) - 1;
  double v;
  if (e == (1u << exp_bits) - 1)
    v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - mant_bits);
  else
    v = std::ldexp(static_cast<double>(m | (1u << mant_bits)),
                   static_cast<int>(e) - bias - mant_bits);
  return sign ? -v : v;
}

// Nearest-even rounding of a double onto the grid of a small float format, by search.
uint32_t round_to(double x, int exp_bits, int mant_bits) {
  const uint32_t n = 1u << (exp_bits + mant_bits);
  // Largest finite positive and Inf.
  const uint32_t inf = ((1u << exp_bits) - 1) << mant_bits;
  const double ax = std::abs(x);
  uint32_t lo = 0, hi = inf;  // binary search over positive patterns (monotonic in value)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (decode(mid, exp_bits, mant_bits) <= ax)
      lo = mid;
    else
      hi = mid;
  }
  (void)n;
  const double vl = decode(lo, exp_bits, mant_bits);
  double vh = decode(hi, exp_bits, mant_bits);
  if (hi == inf) {
    // The overflow threshold: halfway between max finite and the next (virtual) step.
    vh = decode(lo, exp_bits, mant_bits) +
         (decode(lo, exp_bits, mant_bits) - decode(lo - 1, exp_bits, mant_bits));
  }
  uint32_t r;
  if (ax - vl < vh - ax)
    r = lo;
  else if (ax - vl > vh - ax)
    r = hi;
  else
    r = (lo & 1) ? hi : lo;
  if (ax == vl) r = lo;
  const uint32_t sign = std::signbit(x) ? 1u << (exp_bits + mant_bits) : 0;
  return r | sign;
}

TEST(DType, NamesRoundTrip) {
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_THROW(parse_dtype("f8"), InvalidArgument);
  EXPECT_THROW(parse_dtype(""), InvalidArgument);
}

TEST(DType, Bf16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    const double want = decode(h, 8, 7);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << h;
      EXPECT_EQ(f32_to_bf16(f), h) << h;  // exact values round-trip
    }
  }
}

TEST(DType, F16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    const double want = decode(h, 5, 10);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
    } else {
      EXPECT_EQ(static_cast<double>(f), want) << h;
      EXPECT_EQ(f32_to_f16(f), h) << h;
    }
  }
}

// Rounding: every midpoint and its neighbours, for all patterns, against the search above.
TEST(DType, RoundingAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x7f80; ++h) {  // positive finite bf16
    const double a = decode(h, 8, 7), b = decode(h + 1, 8, 7);
    const double mid = (a + b) / 2;
    for (double x : {mid, std::nextafter(static_cast<float>(mid), 0.0f) * 1.0,
                     std::nextafter(static_cast<float>(mid), INFINITY) * 1.0}) {
      const float xf = static_cast<float>(x);
      ASSERT_EQ(f32_to_bf16(xf), round_to(xf, 8, 7)) << h;
      ASSERT_EQ(f32_to_bf16(-xf), round_to(-static_cast<double>(xf), 8, 7)) << h;
    }
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // positive finite f16 (incl. subnormals), and overflow
    const double a = decode(h, 5, 10);
    const double b = h + 1 == 0x7c00 ? 65536.0 : decode(h + 1, 5, 10);
    const double mid = (a + b) / 2;
    for (float xf : {static_cast<float>(mid), std::nextafter(static_cast<float>(mid), 0.0f),
                     std::nextafter(static_cast<float>(mid), INFINITY)}) {
      ASSERT_EQ(f32_to_f16(xf), round_to(xf, 5, 10)) << h << " " << xf;
    }
  }
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to Inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(Log, ParsesAndRejects) {
  auto s = LogSettings::parse("dispatch,autotune:debug");
  EXPECT_EQ(s.level_for("dispatch"), LogLevel::kInfo);
  EXPECT_EQ(s.level_for("autotune"), LogLevel::kDebug);
  EXPECT_EQ(s.level_for("cache"), LogLevel::kWarning);
  EXPECT_EQ(LogSettings::parse("debug").level_for("x"), LogLevel::kDebug);
  EXPECT_THROW(LogSettings::parse("autotune:loud"), InvalidArgument);
  EXPECT_THROW(LogSettings::parse("a,,b"), InvalidArgument);
  EXPECT_THROW(LogSettings::parse("bad cat"), InvalidArgument);
}

}  // namespace
}  // namespace tokamax
