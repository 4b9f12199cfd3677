// Arguments that the kernels compute with in f32 (an attention scale or soft cap, a norm's
// epsilon), checked in f32's units: a double that is finite but overflows f32 (1e300) would
// become an infinity inside the kernel, and a nonzero one below f32's normal range (1e-300)
// would become zero or a denormal whose reciprocal overflows. Either gave silently wrong results
// (zeros in one implementation, NaN in another), so both are refused where the call is bound.
#pragma once

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <string>

#include "tokamax/core/error.h"

namespace tokamax {

// Throws InvalidArgument "<op>: <name> = <v>; expected ..." unless v is 0 (where allow_zero) or
// its magnitude lies in f32's normal range [FLT_MIN, FLT_MAX]; `positive`: negative values
// are refused too.
inline void check_in_f32_range(const std::string& op, const char* name, double v, bool allow_zero,
                               bool positive) {
  const double a = std::abs(v);
  const bool zero_ok = allow_zero && v == 0;
  if (zero_ok || (std::isfinite(v) && a >= FLT_MIN && a <= FLT_MAX && (!positive || v > 0))) return;
  throw InvalidArgument(
      fmt::format("{}: {} = {}; expected {}{} of magnitude in [{:g}, {:g}] (the "
                  "kernels compute in f32)",
                  op, name, v, allow_zero ? "0 or " : "",
                  positive ? "a positive number" : "a number", double{FLT_MIN}, double{FLT_MAX}));
}

}  // namespace tokamax
