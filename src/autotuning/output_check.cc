// Output checking for the autotuner (see output_check.h).
#include "autotuning/output_check.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace tokamax {

std::vector<double> to_f64(const TensorView& v) {
  const int64_t n = v.size();
  std::vector<double> out(static_cast<size_t>(n));
  if (v.is_contiguous() && v.dtype() == DType::kF32) {
    const float* p = v.data_as<float>();
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else if (v.is_contiguous() && v.dtype() == DType::kBF16) {
    const uint16_t* p = v.data_as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = v.get(i);
  }
  return out;
}

// Compares outputs with the reference; returns a failure or nullopt.
std::optional<Failure> check_outputs(const std::vector<TensorView>& outs,
                                     const std::vector<std::vector<double>>& refs,
                                     const Tolerance& tol) {
  for (size_t o = 0; o < outs.size(); ++o) {
    const std::vector<double> got = to_f64(outs[o]);
    const std::vector<double>& ref = refs[o];
    const bool floating = is_floating(outs[o].dtype());
    int64_t unwritten = 0, first_unwritten = -1, bad = 0, worst_at = -1;
    double worst = 0, err2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (floating && std::isnan(got[i]) && !std::isnan(ref[i])) {
        if (unwritten++ == 0) first_unwritten = static_cast<int64_t>(i);
        continue;
      }
      const double e = std::abs(got[i] - ref[i]);
      err2 += e * e;
      ref2 += ref[i] * ref[i];
      if (!(e <= tol.atol + tol.rtol * std::abs(ref[i]))) {
        ++bad;
        if (!(e <= worst) || worst_at < 0) {
          worst = e;
          worst_at = static_cast<int64_t>(i);
        }
      }
    }
    const std::string which = "output " + std::to_string(o) + " " + outs[o].spec().str();
    if (unwritten) {
      return Failure{FailureKind::kUnwritten,
                     which + ": " + std::to_string(unwritten) +
                         " elements left unwritten (poison NaN), first at flat index " +
                         std::to_string(first_unwritten)};
    }
    const double normwise = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (bad || (tol.normwise > 0 && normwise > tol.normwise)) {
      // {:.6g}: 1e-05, not std::to_string's 0.000010.
      std::string msg = fmt::format("{}: {} elements outside atol {:.6g} rtol {:.6g}", which, bad,
                                    tol.atol, tol.rtol);
      if (worst_at >= 0) {
        msg +=
            fmt::format("; worst abs error {:.6g} at flat index {} (got {:.9g}, expected {:.9g})",
                        worst, worst_at, got[worst_at], ref[worst_at]);
      }
      msg += fmt::format("; normwise relative error {:.6g}", normwise);
      return Failure{FailureKind::kWrongResult, msg};
    }
  }
  return std::nullopt;
}

}  // namespace tokamax
