// layer_norm's shared test cases: every implementation (forward and backward) against the
// reference within the family's tolerance, the reference against an independent double-precision
// computation, the reference backward against finite differences; edge sizes (one row, one
// column, widths off the vector width), axes, bf16, rms_norm, constant rows (variance 0), rows
// with a large mean (one-pass variance must not cancel), determinism.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/norm/base.h"
#include "tests/ops/common.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::norm_test {

using op_test::as_f64;
using op_test::expect_close;
using op_test::expect_gradient;
using op_test::values;

using norm::family;
using norm::NormCall;
using norm::NormVjpCall;
using norm::vjp_family;

struct Case {
  Shape shape = {5, 19};
  int64_t axis = -1;
  DType dtype = DType::kF32;
  bool scale = true, offset = true, rms = false;
  double epsilon = 1e-6;
  double shift = 0;       // added to every x: a mean large against the spread
  bool constant = false;  // every row constant: variance 0
  std::string str() const {
    return std::string(rms ? "rms " : "ln ") + shape_str(shape) + " axis " + std::to_string(axis) +
           " " + std::string(dtype_name(dtype)) + (scale ? " scale" : "") +
           (offset ? " offset" : "") + (shift != 0 ? " shift" : "") + (constant ? " constant" : "");
  }
};

struct Inputs {
  Tensor x, scale, offset;
  LayerNormOptions options;
  std::optional<TensorView> s() const {
    return scale.rank() > 0 ? std::optional<TensorView>(scale.view()) : std::nullopt;
  }
  std::optional<TensorView> o() const {
    return offset.rank() > 0 ? std::optional<TensorView>(offset.view()) : std::nullopt;
  }
};

// [outer, D, inner] around the axis.
inline void split(const Case& c, int64_t* outer, int64_t* d, int64_t* inner) {
  const int64_t rank = static_cast<int64_t>(c.shape.size());
  const int64_t ax = c.axis < 0 ? c.axis + rank : c.axis;
  *outer = *inner = 1;
  for (int64_t i = 0; i < ax; ++i) *outer *= c.shape[i];
  for (int64_t i = ax + 1; i < rank; ++i) *inner *= c.shape[i];
  *d = c.shape[ax];
}

inline Inputs make_inputs(const Case& c) {
  Inputs in;
  int64_t outer, d, inner;
  split(c, &outer, &d, &inner);
  Tensor x = Tensor::randn(c.shape, DType::kF64, fresh_seed());
  for (int64_t i = 0; i < x.size(); ++i) {
    double& v = x.data_as<double>()[i];
    if (c.constant) v = std::floor(v * 4) / 4;  // per element; rows made constant below
    v += c.shift;
  }
  if (c.constant) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < d; ++j)
        for (int64_t i = 0; i < inner; ++i)
          x.data_as<double>()[(o * d + j) * inner + i] = x.data_as<double>()[o * d * inner + i];
  }
  in.x = Tensor(c.shape, c.dtype);
  for (int64_t i = 0; i < x.size(); ++i) in.x.view().set(i, x.data_as<double>()[i]);
  if (c.scale) in.scale = Tensor::randn({d}, DType::kF32, fresh_seed());
  if (c.offset) in.offset = Tensor::randn({d}, DType::kF32, fresh_seed());
  in.options.axis = c.axis;
  in.options.epsilon = c.epsilon;
  in.options.subtract_mean = !c.rms;
  return in;
}

// The forward in double precision from the definition; also the mean and rstd.
inline void f64_norm(const Case& c, const Tensor& x, const Tensor* scale, const Tensor* offset,
                     std::vector<double>* y, std::vector<double>* mean, std::vector<double>* rstd) {
  int64_t outer, d, inner;
  split(c, &outer, &d, &inner);
  y->assign(static_cast<size_t>(x.size()), 0.0);
  mean->assign(static_cast<size_t>(outer * inner), 0.0);
  rstd->assign(static_cast<size_t>(outer * inner), 0.0);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * d + j) * inner + i; };
      double m = 0, v = 0;
      for (int64_t j = 0; j < d; ++j) m += x.get(at(j));
      m = c.rms || d == 0 ? 0.0 : m / static_cast<double>(d);
      for (int64_t j = 0; j < d; ++j) v += (x.get(at(j)) - m) * (x.get(at(j)) - m);
      v = d == 0 ? 0.0 : v / static_cast<double>(d);
      const double r = 1.0 / std::sqrt(v + c.epsilon);
      for (int64_t j = 0; j < d; ++j) {
        (*y)[at(j)] = (x.get(at(j)) - m) * r * (scale ? scale->get(j) : 1.0) +
                      (offset ? offset->get(j) : 0.0);
      }
      (*mean)[o * inner + i] = m;
      (*rstd)[o * inner + i] = r;
    }
  }
}

inline bool strided(const Case& c) {
  int64_t outer, d, inner;
  split(c, &outer, &d, &inner);
  return inner != 1;
}

inline NormCall bound_call(const Case& c, const Inputs& in) {
  NormCall call;
  call.x = in.x;
  call.scale = in.s();
  call.offset = in.o();
  call.axis = c.axis;
  call.subtract_mean = !c.rms;
  family().bind(call);
  return call;
}

inline void check_case(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  const std::string what = impl + " " + c.str();
  LayerNormOptions o = in.options;
  o.implementation = impl;
  if (impl == "native" && strided(c)) {
    EXPECT_THROW(layer_norm(in.x, in.s(), in.o(), o), Unsupported) << what;
    return;
  }
  const LayerNormResult got = layer_norm_with_residuals(in.x, in.s(), in.o(), o);
  o.implementation = "reference";
  const LayerNormResult ref = layer_norm_with_residuals(in.x, in.s(), in.o(), o);
  std::vector<double> y, mean, rstd;
  f64_norm(c, in.x, c.scale ? &in.scale : nullptr, c.offset ? &in.offset : nullptr, &y, &mean,
           &rstd);
  Tolerance tol = family().tolerance_of(bound_call(c, in));
  // An f32 mean of ~shift is itself rounded by shift * 2^-24, and every y with it (times rstd,
  // about 1, and |scale|, below 5 here): the reference keeps it in f64.
  tol.atol += 6e-8 * std::abs(c.shift) * 5;
  // The reference against doubles: its output's rounding only (f32 or bf16).
  expect_close(ref.y, y,
               c.dtype == DType::kBF16 ? Tolerance{1e-2, 8e-3, 0} : Tolerance{1e-5, 1e-6, 0},
               "reference vs f64 " + what);
  expect_close(ref.mean, mean, {1e-6 * (1 + std::abs(c.shift)), 1e-6, 0}, "reference mean " + what);
  expect_close(ref.rstd, rstd, {0, 1e-5, 0}, "reference rstd " + what);
  expect_close(got.y, values(ref.y), tol, what);
  expect_close(got.mean, values(ref.mean), {1e-6 * (1 + std::abs(c.shift)), 1e-6, 0},
               "mean " + what);
  expect_close(got.rstd, values(ref.rstd), {0, 1e-4, 0}, "rstd " + what);
  o.implementation = impl;
  const Tensor again = layer_norm(in.x, in.s(), in.o(), o);
  ASSERT_EQ(std::memcmp(again.data(), got.y.data(), got.y.nbytes()), 0) << "rerun " << what;
}

// sum(dy * layer_norm(x, scale, offset)) in double precision.
inline double f64_loss(const Case& c, const Tensor& x, const Tensor* scale, const Tensor* offset,
                       const Tensor& dy) {
  std::vector<double> y, mean, rstd;
  f64_norm(c, x, scale, offset, &y, &mean, &rstd);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += y[i] * dy.get(static_cast<int64_t>(i));
  return l;
}

// The backward's tolerance for a case, its forward residuals and cotangent.
inline Tolerance vjp_tolerance(const Case& c, const Inputs& in, const LayerNormResult& fwd,
                               const Tensor& dy) {
  NormVjpCall call;
  call.x = in.x;
  call.scale = in.s();
  call.offset = in.o();
  call.axis = c.axis;
  call.mean_in = fwd.mean;
  call.rstd_in = fwd.rstd;
  call.dy = dy;
  vjp_family().bind(call);
  return vjp_family().tolerance_of(call);
}

inline void check_vjp(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  const std::string what = impl + " vjp " + c.str();
  LayerNormOptions o = in.options;
  o.implementation = "reference";
  const LayerNormResult fwd = layer_norm_with_residuals(in.x, in.s(), in.o(), o);
  const Tensor dy = Tensor::randn(c.shape, c.dtype, fresh_seed());
  const LayerNormGrads ref = layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, o);
  o.implementation = impl;
  if (impl == "native" && strided(c)) {
    EXPECT_THROW(layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, o), Unsupported);
    return;
  }
  const LayerNormGrads got = layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, o);
  const Tolerance tol = vjp_tolerance(c, in, fwd, dy);
  expect_close(got.dx, values(ref.dx), tol, "dx " + what);
  if (c.scale) expect_close(got.dscale, values(ref.dscale), tol, "dscale " + what);
  if (c.offset) expect_close(got.doffset, values(ref.doffset), tol, "doffset " + what);
  const LayerNormGrads again = layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, o);
  ASSERT_EQ(std::memcmp(again.dx.data(), got.dx.data(), got.dx.nbytes()), 0) << "rerun " << what;
  if (c.scale) {
    ASSERT_EQ(std::memcmp(again.dscale.data(), got.dscale.data(), got.dscale.nbytes()), 0) << what;
  }
  if (impl != "reference" || c.dtype != DType::kF32 || c.constant) return;
  // The reference backward against central differences along random directions.
  const Tensor* grads[3] = {&ref.dx, c.scale ? &ref.dscale : nullptr,
                            c.offset ? &ref.doffset : nullptr};
  const Tensor* xs[3] = {&in.x, c.scale ? &in.scale : nullptr, c.offset ? &in.offset : nullptr};
  for (int which = 0; which < 3; ++which) {
    if (!xs[which]) continue;
    auto loss = [&](const Tensor& p) {
      const Tensor x = which == 0 ? p.clone() : as_f64(in.x);
      const Tensor s = c.scale ? (which == 1 ? p.clone() : as_f64(in.scale)) : Tensor();
      const Tensor f = c.offset ? (which == 2 ? p.clone() : as_f64(in.offset)) : Tensor();
      return f64_loss(c, x, c.scale ? &s : nullptr, c.offset ? &f : nullptr, dy);
    };
    // A step of 1e-7: over an axis of one element, rms_norm is x / sqrt(x^2 + epsilon), whose
    // curvature scale is sqrt(epsilon) = 1e-3, and a step of 1e-5 left a truncation error of
    // 1.5e-4 relative for an x near it (seen once in CI); the f64 rounding error stays ~1e-9.
    expect_gradient(*grads[which], *xs[which], loss, 1e-7, 1e-4,
                    std::string("reference d") +
                        (which == 0   ? "x"
                         : which == 1 ? "scale"
                                      : "offset") +
                        " " + c.str());
  }
}

template <class Impl>
class LayerNormImpl : public ::testing::Test {
 protected:
  static std::string impl() { return Impl::kName; }
};
TYPED_TEST_SUITE_P(LayerNormImpl);

TYPED_TEST_P(LayerNormImpl, ShapesAndAxes) {
  for (Case c :
       {Case{}, Case{{1, 1}}, Case{{1, 40}}, Case{{37, 1}}, Case{{3, 4, 67}}, Case{{2, 129}},
        Case{{0, 16}}, Case{{4, 0}}, Case{{6, 33}, 0}, Case{{3, 7, 5}, 1}, Case{{300, 45}}}) {
    check_case(this->impl(), c);
    c.rms = true;
    c.offset = false;
    check_case(this->impl(), c);
    c.scale = false;
    check_case(this->impl(), c);
  }
}

TYPED_TEST_P(LayerNormImpl, HardRows) {
  Case c{{9, 130}};
  c.shift = 1000;  // mean 1000, spread 1: a naive one-pass f32 variance loses every digit
  check_case(this->impl(), c);
  c.shift = 0;
  c.constant = true;  // variance 0: rstd = 1/sqrt(epsilon), y = offset
  check_case(this->impl(), c);
  c.epsilon = 0.5;
  check_case(this->impl(), c);
}

TYPED_TEST_P(LayerNormImpl, Bf16) {
  for (Case c : {Case{{7, 130}}, Case{{3, 16}}, Case{{2, 5, 33}}}) {
    c.dtype = DType::kBF16;
    check_case(this->impl(), c);
    c.rms = true;
    check_case(this->impl(), c);
  }
}

TYPED_TEST_P(LayerNormImpl, Vjp) {
  for (Case c : {Case{}, Case{{1, 1}}, Case{{37, 1}}, Case{{3, 4, 67}}, Case{{2, 129}},
                 Case{{0, 16}}, Case{{6, 33}, 0}, Case{{300, 45}}}) {
    check_vjp(this->impl(), c);
    c.rms = true;
    c.offset = false;
    check_vjp(this->impl(), c);
    c.scale = false;
    check_vjp(this->impl(), c);
  }
  Case c{{9, 130}};
  c.constant = true;
  check_vjp(this->impl(), c);
  c = Case{{5, 70}};
  c.dtype = DType::kBF16;
  check_vjp(this->impl(), c);
}

REGISTER_TYPED_TEST_SUITE_P(LayerNormImpl, ShapesAndAxes, HardRows, Bf16, Vjp);

}  // namespace tokamax::norm_test
