// gated_linear_unit's shared test cases: every implementation (forward and backward) against
// the reference within the family's tolerance, the reference against an independent
// double-precision computation, the reference backward against finite differences; every
// activation, stacked and separate weights, pre-packed weights, bf16 weights and inputs, edge
// sizes (one row, one column, sizes off the tile and panel widths, K = 0), determinism.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/glu/base.h"
#include "tests/ops/common.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::glu_test {

using op_test::as_f64;
using op_test::expect_close;
using op_test::expect_gradient;
using op_test::values;

constexpr Activation kAll[] = {Activation::kNone, Activation::kRelu,     Activation::kSilu,
                               Activation::kGelu, Activation::kGeluTanh, Activation::kSigmoid};

struct Case {
  Shape x_lead = {5};  // x's leading dims (rows)
  int64_t k = 19, n = 23;
  Activation act = Activation::kSilu;
  DType x_dtype = DType::kF32, w_dtype = DType::kF32;
  bool separate = false, packed = false;
  std::string str() const {
    return "x" + shape_str(x_lead) + " K=" + std::to_string(k) + " N=" + std::to_string(n) + " " +
           std::string(activation_name(act)) + " x " + std::string(dtype_name(x_dtype)) + " w " +
           std::string(dtype_name(w_dtype)) + (separate ? " separate" : "") +
           (packed ? " packed" : "");
  }
  int64_t m() const {
    int64_t r = 1;
    for (int64_t d : x_lead) r *= d;
    return r;
  }
};

struct Inputs {
  Tensor x, w, gate, up;  // w [K,2,N]; gate, up its halves (for the separate form)
};

inline Inputs make_inputs(const Case& c) {
  Inputs in;
  Shape xs = c.x_lead;
  xs.push_back(c.k);
  in.x = Tensor::randn(xs, c.x_dtype, fresh_seed());
  in.w = Tensor::randn({c.k, 2, c.n}, c.w_dtype, fresh_seed());
  in.gate = Tensor({c.k, c.n}, c.w_dtype);
  in.up = Tensor({c.k, c.n}, c.w_dtype);
  for (int64_t kk = 0; kk < c.k; ++kk) {
    for (int64_t j = 0; j < c.n; ++j) {
      in.gate.view().set(kk * c.n + j, in.w.get((kk * 2) * c.n + j));
      in.up.view().set(kk * c.n + j, in.w.get((kk * 2 + 1) * c.n + j));
    }
  }
  return in;
}

inline double f64_act(Activation a, double x) {
  switch (a) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case Activation::kSigmoid:
      return 1 / (1 + std::exp(-x));
  }
  return x;
}

// The forward in double precision (x, w as f64 or any dtype through get()). bf16 weights
// multiply x rounded to bf16 (glu::rounds_x), as every implementation does.
inline std::vector<double> f64_glu(const Case& c, const Tensor& x, const Tensor& w) {
  const int64_t M = c.m(), K = c.k, N = c.n;
  const bool round = x.dtype() == DType::kF32 && w.dtype() == DType::kBF16;
  std::vector<double> out(static_cast<size_t>(M * N));
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t j = 0; j < N; ++j) {
      double g = 0, u = 0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double xv = round ? bf16_to_f32(f32_to_bf16(static_cast<float>(x.get(r * K + kk))))
                                : x.get(r * K + kk);
        g += xv * w.get((kk * 2) * N + j);
        u += xv * w.get((kk * 2 + 1) * N + j);
      }
      out[r * N + j] = f64_act(c.act, g) * u;
    }
  }
  return out;
}

inline glu::GluCall bound_call(const Inputs& in) {
  glu::GluCall call;
  call.x = in.x;
  call.w = in.w;
  glu::family().bind(call);
  return call;
}

inline Tensor run_forward(const std::string& impl, const Case& c, const Inputs& in) {
  GluOptions o;
  o.activation = c.act;
  o.implementation = impl;
  if (c.packed) return gated_linear_unit(in.x, pack_glu_weights(in.w), o);
  if (c.separate) return gated_linear_unit(in.x, in.gate, in.up, o);
  return gated_linear_unit(in.x, in.w, o);
}

inline void check_case(const std::string& impl, Case c) {
  if (c.packed && impl != "native") c.packed = false;  // only native reads packed weights
  const Inputs in = make_inputs(c);
  const std::string what = impl + " " + c.str();
  const Tensor got = run_forward(impl, c, in);
  const Case plain{c.x_lead, c.k, c.n, c.act, c.x_dtype, c.w_dtype, false, false};
  const Tensor ref = run_forward("reference", plain, in);
  const std::vector<double> f64 = f64_glu(c, in.x, in.w);
  const double k = static_cast<double>(std::max<int64_t>(c.k, 1));
  expect_close(
      ref, f64,
      c.x_dtype == DType::kBF16 ? Tolerance{1e-2 * k, 8e-3, 0} : Tolerance{1e-6 * k, 1e-6, 0},
      "reference vs f64 " + what);
  expect_close(got, values(ref), glu::family().tolerance_of(bound_call(in)), what);
  const Tensor again = run_forward(impl, c, in);
  ASSERT_EQ(std::memcmp(again.data(), got.data(), got.nbytes()), 0) << "rerun " << what;
  // The residual h = x w.
  if (!c.packed && !c.separate) {
    GluOptions o;
    o.activation = c.act;
    o.implementation = impl;
    const GluResult r = gated_linear_unit_with_residuals(in.x, in.w, o);
    ASSERT_EQ(std::memcmp(r.out.data(), got.data(), got.nbytes()), 0) << "residuals " << what;
    std::vector<double> h(static_cast<size_t>(c.m() * 2 * c.n));
    const bool round = c.x_dtype == DType::kF32 && c.w_dtype == DType::kBF16;
    for (int64_t rr = 0; rr < c.m(); ++rr)
      for (int64_t half = 0; half < 2; ++half)
        for (int64_t j = 0; j < c.n; ++j) {
          double s = 0;
          for (int64_t kk = 0; kk < c.k; ++kk) {
            const float xf = static_cast<float>(in.x.get(rr * c.k + kk));
            s += (round ? bf16_to_f32(f32_to_bf16(xf)) : xf) * in.w.get((kk * 2 + half) * c.n + j);
          }
          h[(rr * 2 + half) * c.n + j] = s;
        }
    expect_close(r.h, h,
                 c.w_dtype == DType::kBF16 || c.x_dtype == DType::kBF16
                     ? Tolerance{2e-2 * std::sqrt(k), 1e-2, 0}
                     : Tolerance{1e-5 * std::sqrt(k), 1e-5, 0},
                 "h " + what);
  }
}

inline void check_vjp(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  const std::string what = impl + " vjp " + c.str();
  GluOptions o;
  o.activation = c.act;
  o.implementation = "reference";
  const GluResult fwd = gated_linear_unit_with_residuals(in.x, in.w, o);
  const Tensor dout = Tensor::randn(fwd.out.shape(), c.x_dtype, fresh_seed());
  const GluGrads ref = gated_linear_unit_vjp(in.x, in.w, fwd.h, dout, o);
  o.implementation = impl;
  const GluGrads got = gated_linear_unit_vjp(in.x, in.w, fwd.h, dout, o);
  glu::GluVjpCall call;
  call.x = in.x;
  call.w = in.w;
  call.h_in = fwd.h;
  call.dout = dout;
  glu::vjp_family().bind(call);
  const Tolerance tol = glu::vjp_family().tolerance_of(call);
  expect_close(got.dx, values(ref.dx), tol, "dx " + what);
  expect_close(got.dw, values(ref.dw), tol, "dw " + what);
  const GluGrads again = gated_linear_unit_vjp(in.x, in.w, fwd.h, dout, o);
  ASSERT_EQ(std::memcmp(again.dw.data(), got.dw.data(), got.dw.nbytes()), 0) << "rerun " << what;
  if (impl != "reference" || c.x_dtype != DType::kF32 || c.w_dtype != DType::kF32 ||
      c.act == Activation::kRelu)
    return;
  // The reference backward against central differences of the f64 forward.
  for (int which = 0; which < 2; ++which) {
    auto loss = [&](const Tensor& p) {
      const std::vector<double> y =
          which == 0 ? f64_glu(c, p, as_f64(in.w)) : f64_glu(c, as_f64(in.x), p);
      double l = 0;
      for (size_t i = 0; i < y.size(); ++i) l += y[i] * dout.get(static_cast<int64_t>(i));
      return l;
    };
    expect_gradient(which == 0 ? ref.dx : ref.dw, which == 0 ? in.x : in.w, loss, 1e-5, 1e-4,
                    std::string("reference d") + (which == 0 ? "x " : "w ") + c.str());
  }
}

template <class Impl>
class GluImpl : public ::testing::Test {
 protected:
  static std::string impl() { return Impl::kName; }
};
TYPED_TEST_SUITE_P(GluImpl);

TYPED_TEST_P(GluImpl, ShapesAndActivations) {
  for (Activation a : kAll) check_case(this->impl(), Case{{5}, 19, 23, a});
  for (const Case& c : {Case{{1}, 1, 1}, Case{{1}, 64, 1}, Case{{37}, 45, 70}, Case{{2, 3}, 33, 17},
                        Case{{0}, 8, 8}, Case{{4}, 0, 8}, Case{{4}, 8, 0}, Case{{70}, 130, 97}}) {
    check_case(this->impl(), c);
    Case s = c;
    s.separate = true;
    check_case(this->impl(), s);
    s.separate = false;
    s.packed = true;
    check_case(this->impl(), s);
  }
}

TYPED_TEST_P(GluImpl, Bf16) {
  for (Case c : {Case{{9}, 64, 33}, Case{{30}, 37, 50}}) {
    c.w_dtype = DType::kBF16;
    check_case(this->impl(), c);
    c.packed = true;
    check_case(this->impl(), c);
    c.packed = false;
    c.x_dtype = DType::kBF16;
    c.act = Activation::kGelu;
    check_case(this->impl(), c);
  }
}

TYPED_TEST_P(GluImpl, Vjp) {
  for (Activation a : kAll) check_vjp(this->impl(), Case{{5}, 19, 23, a});
  for (const Case& c : {Case{{1}, 1, 1}, Case{{37}, 45, 70}, Case{{2, 3}, 33, 17}, Case{{0}, 8, 8},
                        Case{{4}, 0, 8}, Case{{4}, 8, 0}}) {
    check_vjp(this->impl(), c);
  }
  Case c{{20}, 40, 30};
  c.w_dtype = DType::kBF16;
  check_vjp(this->impl(), c);
}

REGISTER_TYPED_TEST_SUITE_P(GluImpl, ShapesAndActivations, Bf16, Vjp);

}  // namespace tokamax::glu_test
