// Helpers every family's shared test cases use: tensors as doubles, the elementwise (and
// normwise) comparison against a tolerance, and a gradient checked against central
// differences along a random direction.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::op_test {

inline std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.size()));
  for (int64_t i = 0; i < t.size(); ++i) v[i] = t.get(i);
  return v;
}

inline Tensor as_f64(const Tensor& t) {
  Tensor out(t.shape(), DType::kF64);
  for (int64_t i = 0; i < t.size(); ++i) out.data_as<double>()[i] = t.get(i);
  return out;
}

// Every element within atol + rtol |want| (infinities equal), and with tol.normwise the
// normwise relative error below it; the first failures are named.
inline void expect_close(const Tensor& got, const std::vector<double>& want, const Tolerance& tol,
                         const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.size()), want.size()) << what;
  int bad = 0;
  double e2 = 0, r2 = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i), w = want[i];
    if (std::isinf(w)) {
      ASSERT_EQ(g, w) << what << " at " << i;
      continue;
    }
    ASSERT_TRUE(std::isfinite(g)) << what << " non-finite at " << i;
    e2 += (g - w) * (g - w);
    r2 += w * w;
    if (std::abs(g - w) > tol.atol + tol.rtol * std::abs(w) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w;
  }
  if (tol.normwise > 0 && r2 > 0) {
    EXPECT_LE(std::sqrt(e2 / r2), tol.normwise) << what;
  }
}

// `grad` (of a scalar loss with respect to `x`) against the central difference of `loss` (in
// double precision, called with x as f64 moved by +-eps along a fresh random direction).
inline void expect_gradient(const Tensor& grad, const Tensor& x,
                            const std::function<double(const Tensor&)>& loss, double eps,
                            double rtol, const std::string& what) {
  const Tensor u = Tensor::randn(x.shape(), DType::kF64, fresh_seed());
  Tensor plus = as_f64(x), minus = as_f64(x);
  double analytic = 0;
  for (int64_t i = 0; i < u.size(); ++i) {
    const double d = u.data_as<double>()[i];
    plus.data_as<double>()[i] += eps * d;
    minus.data_as<double>()[i] -= eps * d;
    analytic += grad.get(i) * d;
  }
  const double fd = (loss(plus) - loss(minus)) / (2 * eps);
  EXPECT_NEAR(analytic, fd, rtol * (1 + std::abs(fd))) << what << " vs finite differences";
}

}  // namespace tokamax::op_test
