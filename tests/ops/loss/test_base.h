// linear_softmax_cross_entropy_loss's shared test cases: every implementation (forward and
// backward) against the reference within the family's tolerance, the reference against an
// independent double-precision computation, the reference backward against finite differences;
// every reduction, labels at 0 and V-1, large logits (1e4: the log-sum-exp must not overflow),
// edge sizes (one row, V = 1, sizes off the tile and block widths), bf16, determinism.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/loss/base.h"
#include "tests/ops/common.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::loss_test {

using op_test::as_f64;
using op_test::expect_close;
using op_test::expect_gradient;
using op_test::values;

struct Case {
  int64_t b = 7, h = 19, v = 45;
  LossReduction reduction = LossReduction::kMean;
  DType dtype = DType::kF32;
  double x_scale = 1;  // 1e3 with unit w: logits near 1e4
  std::string str() const {
    return "B=" + std::to_string(b) + " H=" + std::to_string(h) + " V=" + std::to_string(v) + " " +
           std::string(loss::reduction_names().name(reduction)) + " " +
           std::string(dtype_name(dtype)) + (x_scale != 1 ? " large logits" : "");
  }
};

struct Inputs {
  Tensor x, labels, w;
};

inline Inputs make_inputs(const Case& c) {
  Inputs in;
  Tensor x = Tensor::randn({c.b, c.h}, DType::kF64, fresh_seed());
  in.x = Tensor({c.b, c.h}, c.dtype);
  for (int64_t i = 0; i < x.size(); ++i) in.x.view().set(i, x.get(i) * c.x_scale);
  in.w = Tensor::randn({c.h, c.v}, c.dtype, fresh_seed());
  in.labels = Tensor({c.b}, DType::kI32);
  Tensor u = Tensor::uniform({c.b}, DType::kF64, fresh_seed());
  for (int64_t i = 0; i < c.b; ++i)
    in.labels.data_as<int32_t>()[i] =
        static_cast<int32_t>(std::min<int64_t>(c.v - 1, static_cast<int64_t>(u.get(i) * c.v)));
  if (c.b > 0) in.labels.data_as<int32_t>()[0] = 0;
  if (c.b > 1) in.labels.data_as<int32_t>()[c.b - 1] = static_cast<int32_t>(c.v - 1);
  return in;
}

// Per-row losses and log-sum-exps in double precision.
inline void f64_loss(const Case& c, const Tensor& x, const Tensor& labels, const Tensor& w,
                     std::vector<double>* per_row, std::vector<double>* lse) {
  per_row->assign(static_cast<size_t>(c.b), 0.0);
  lse->assign(static_cast<size_t>(c.b), 0.0);
  for (int64_t r = 0; r < c.b; ++r) {
    std::vector<double> l(static_cast<size_t>(c.v), 0.0);
    for (int64_t j = 0; j < c.v; ++j)
      for (int64_t k = 0; k < c.h; ++k) l[j] += x.get(r * c.h + k) * w.get(k * c.v + j);
    double m = -INFINITY;
    for (double e : l) m = std::max(m, e);
    double s = 0;
    for (double e : l) s += std::exp(e - m);
    (*lse)[r] = m + std::log(s);
    (*per_row)[r] = (*lse)[r] - l[labels.data_as<int32_t>()[r]];
  }
}

inline std::vector<double> reduced(const Case& c, const std::vector<double>& per_row) {
  if (c.reduction == LossReduction::kNone) return per_row;
  double s = 0;
  for (double e : per_row) s += e;
  if (c.reduction == LossReduction::kMean) s = c.b > 0 ? s / static_cast<double>(c.b) : 0.0;
  return {s};
}

inline loss::LossCall bound_call(const Case& c, const Inputs& in) {
  loss::LossCall call;
  call.x = in.x;
  call.labels = in.labels;
  call.w = in.w;
  call.reduction = c.reduction;
  loss::family().bind(call);
  return call;
}

inline void check_case(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  const std::string what = impl + " " + c.str();
  LossOptions o;
  o.reduction = c.reduction;
  o.implementation = impl;
  const LossResult got = linear_softmax_cross_entropy_loss_with_residuals(in.x, in.labels, in.w, o);
  o.implementation = "reference";
  const LossResult ref = linear_softmax_cross_entropy_loss_with_residuals(in.x, in.labels, in.w, o);
  std::vector<double> per_row, lse;
  f64_loss(c, in.x, in.labels, in.w, &per_row, &lse);
  // Relative to the logits' size: 1e4-sized logits keep f32's 1e-3 absolute rounding.
  const double scale = c.x_scale;
  const bool bf16 = c.dtype == DType::kBF16;
  expect_close(ref.loss, reduced(c, per_row), {1e-5 * scale, 1e-6, 0}, "reference vs f64 " + what);
  expect_close(ref.lse, lse, {1e-5 * scale, 1e-6, 0}, "reference lse vs f64 " + what);
  Tolerance tol = loss::family().tolerance_of(bound_call(c, in));
  tol.atol *= scale;
  expect_close(got.loss, values(ref.loss), tol, what);
  expect_close(got.lse, values(ref.lse), {(bf16 ? 1e-2 : 1e-4) * scale, 1e-5, 0}, "lse " + what);
  const Tensor again =
      linear_softmax_cross_entropy_loss(in.x, in.labels, in.w, {c.reduction, impl, std::nullopt});
  ASSERT_EQ(std::memcmp(again.data(), got.loss.data(), got.loss.nbytes()), 0) << "rerun " << what;
}

inline void check_vjp(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  const std::string what = impl + " vjp " + c.str();
  LossOptions o;
  o.reduction = c.reduction;
  o.implementation = "reference";
  const LossResult fwd = linear_softmax_cross_entropy_loss_with_residuals(in.x, in.labels, in.w, o);
  const Tensor dloss = Tensor::randn(fwd.loss.shape(), DType::kF32, fresh_seed());
  const LossGrads ref =
      linear_softmax_cross_entropy_loss_vjp(in.x, in.labels, in.w, fwd.lse, dloss, o);
  o.implementation = impl;
  const LossGrads got =
      linear_softmax_cross_entropy_loss_vjp(in.x, in.labels, in.w, fwd.lse, dloss, o);
  loss::LossVjpCall call;
  call.x = in.x;
  call.labels = in.labels;
  call.w = in.w;
  call.reduction = c.reduction;
  call.lse_in = fwd.lse;
  call.dloss = dloss;
  loss::vjp_family().bind(call);
  const Tolerance tol = loss::vjp_family().tolerance_of(call);
  expect_close(got.dx, values(ref.dx), tol, "dx " + what);
  expect_close(got.dw, values(ref.dw), tol, "dw " + what);
  const LossGrads again =
      linear_softmax_cross_entropy_loss_vjp(in.x, in.labels, in.w, fwd.lse, dloss, o);
  ASSERT_EQ(std::memcmp(again.dw.data(), got.dw.data(), got.dw.nbytes()), 0) << "rerun " << what;
  if (impl != "reference" || c.dtype != DType::kF32 || c.x_scale != 1) return;
  for (int which = 0; which < 2; ++which) {
    auto loss_of = [&](const Tensor& p) {
      std::vector<double> per_row, lse;
      if (which == 0)
        f64_loss(c, p, in.labels, as_f64(in.w), &per_row, &lse);
      else
        f64_loss(c, as_f64(in.x), in.labels, p, &per_row, &lse);
      const std::vector<double> l = reduced(c, per_row);
      double s = 0;
      for (size_t i = 0; i < l.size(); ++i) s += l[i] * dloss.get(static_cast<int64_t>(i));
      return s;
    };
    expect_gradient(which == 0 ? ref.dx : ref.dw, which == 0 ? in.x : in.w, loss_of, 1e-5, 1e-4,
                    std::string("reference d") + (which == 0 ? "x " : "w ") + c.str());
  }
}

template <class Impl>
class LossImpl : public ::testing::Test {
 protected:
  static std::string impl() { return Impl::kName; }
};
TYPED_TEST_SUITE_P(LossImpl);

TYPED_TEST_P(LossImpl, ShapesAndReductions) {
  for (LossReduction r : {LossReduction::kSum, LossReduction::kMean, LossReduction::kNone}) {
    for (const Case& c : {Case{7, 19, 45}, Case{1, 1, 1}, Case{1, 8, 2}, Case{33, 40, 700},
                          Case{0, 8, 5}, Case{5, 0, 9}, Case{70, 37, 1300}}) {
      Case cc = c;
      cc.reduction = r;
      check_case(this->impl(), cc);
    }
  }
}

TYPED_TEST_P(LossImpl, LargeLogitsAndBf16) {
  Case c{9, 16, 300};
  c.x_scale = 1e3;  // logits of about 4e3, up to 1e4
  check_case(this->impl(), c);
  c = Case{9, 64, 130, LossReduction::kNone, DType::kBF16};
  check_case(this->impl(), c);
}

TYPED_TEST_P(LossImpl, Vjp) {
  for (LossReduction r : {LossReduction::kSum, LossReduction::kMean, LossReduction::kNone}) {
    for (const Case& c :
         {Case{7, 19, 45}, Case{1, 1, 1}, Case{33, 40, 700}, Case{0, 8, 5}, Case{5, 0, 9}}) {
      Case cc = c;
      cc.reduction = r;
      check_vjp(this->impl(), cc);
    }
  }
  check_vjp(this->impl(), Case{9, 64, 130, LossReduction::kNone, DType::kBF16});
}

REGISTER_TYPED_TEST_SUITE_P(LossImpl, ShapesAndReductions, LargeLogitsAndBf16, Vjp);

}  // namespace tokamax::loss_test
