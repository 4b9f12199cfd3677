// dot_product_attention's shared test cases: every implementation against the reference within
// the family's tolerance, the reference against an independent double-precision computation;
// causal and not, masks, bias, sequence lengths, windows, soft cap, GQA and MQA, T != S, T or
// S = 1, sizes off the block and vector sizes, fully masked rows, bf16, residuals, determinism.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ops/attention/base.h"
#include "tests/ops/common.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::attention_test {

using op_test::as_f64;
using op_test::expect_close;
using op_test::expect_gradient;
using op_test::values;

struct Case {
  int64_t b = 1, t = 5, s = 7, n = 2, nk = 1, h = 8, hv = 8;
  DType dtype = DType::kF32;
  bool causal = false;
  std::optional<Shape> bias, mask;
  bool q_lengths = false, kv_lengths = false;
  std::optional<std::pair<int64_t, int64_t>> window;
  std::optional<double> soft_cap, scale;
  std::string str() const {
    return "B=" + std::to_string(b) + " T=" + std::to_string(t) + " S=" + std::to_string(s) +
           " N=" + std::to_string(n) + " Nk=" + std::to_string(nk) + " H=" + std::to_string(h) +
           " Hv=" + std::to_string(hv) + " " + std::string(dtype_name(dtype)) +
           (causal ? " causal" : "") + (bias ? " bias" + shape_str(*bias) : "") +
           (mask ? " mask" + shape_str(*mask) : "") + (q_lengths ? " q_len" : "") +
           (kv_lengths ? " kv_len" : "") +
           (window
                ? " window" + std::to_string(window->first) + "," + std::to_string(window->second)
                : "") +
           (soft_cap ? " cap" : "");
  }
};

struct Inputs {
  Tensor q, k, v, bias, mask, q_len, kv_len;
  AttentionOptions options;
};

inline Inputs make_inputs(const Case& c) {
  Inputs in;
  in.q = Tensor::randn({c.b, c.t, c.n, c.h}, c.dtype, fresh_seed());
  in.k = Tensor::randn({c.b, c.s, c.nk, c.h}, c.dtype, fresh_seed());
  in.v = Tensor::randn({c.b, c.s, c.nk, c.hv}, c.dtype, fresh_seed());
  AttentionOptions& o = in.options;
  if (c.bias) {
    in.bias = Tensor::randn(*c.bias, DType::kF32, fresh_seed());
    o.bias = in.bias.view();
  }
  if (c.mask) {
    Tensor u = Tensor::uniform(*c.mask, DType::kF64, fresh_seed());
    in.mask = Tensor(*c.mask, DType::kBool);
    for (int64_t i = 0; i < u.size(); ++i)
      in.mask.data_as<uint8_t>()[i] = u.data_as<double>()[i] < 0.7;
    o.mask = in.mask.view();
  }
  auto lengths = [&](int64_t limit) {
    Tensor l({c.b}, DType::kI32);
    Tensor u = Tensor::uniform({c.b}, DType::kF64, fresh_seed());
    for (int64_t i = 0; i < c.b; ++i)
      l.data_as<int32_t>()[i] = static_cast<int32_t>(u.data_as<double>()[i] * (limit + 1));
    if (c.b > 0) l.data_as<int32_t>()[0] = 0;  // one sequence all padding
    return l;
  };
  if (c.q_lengths) {
    in.q_len = lengths(c.t);
    o.q_seq_lengths = in.q_len.view();
  }
  if (c.kv_lengths) {
    in.kv_len = lengths(c.s);
    o.kv_seq_lengths = in.kv_len.view();
  }
  o.is_causal = c.causal;
  o.local_window_size = c.window;
  o.logits_soft_cap = c.soft_cap;
  o.scale = c.scale;
  return in;
}

// Attention in double precision, written from the definition (broadcasting by index
// arithmetic of its own). Also the log-sum-exp.
inline void f64_attention(const Case& c, const Inputs& in, std::vector<double>* out,
                          std::vector<double>* lse) {
  out->assign(static_cast<size_t>(c.b * c.t * c.n * c.hv), 0.0);
  lse->assign(static_cast<size_t>(c.b * c.n * c.t), -INFINITY);
  const double scale = c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.h));
  auto bcast = [](const Tensor& x, int64_t bb, int64_t nn, int64_t tt, int64_t ss) {
    const int64_t idx[4] = {bb, nn, tt, ss};
    int64_t flat = 0;
    for (int64_t d = 0; d < x.rank(); ++d) {
      const int64_t i = idx[4 - x.rank() + d];
      flat = flat * x.dim(d) + (x.dim(d) == 1 ? 0 : i);
    }
    return x.get(flat);
  };
  const int64_t G = c.n / c.nk;
  for (int64_t bb = 0; bb < c.b; ++bb) {
    for (int64_t nn = 0; nn < c.n; ++nn) {
      for (int64_t tt = 0; tt < c.t; ++tt) {
        std::vector<double> logit(static_cast<size_t>(c.s));
        std::vector<bool> on(static_cast<size_t>(c.s));
        double m = -INFINITY;
        for (int64_t ss = 0; ss < c.s; ++ss) {
          bool ok = true;
          if (c.causal) ok = ok && ss <= tt;
          if (c.mask) ok = ok && bcast(in.mask, bb, nn, tt, ss) != 0;
          if (c.q_lengths) ok = ok && tt < in.q_len.data_as<int32_t>()[bb];
          if (c.kv_lengths) ok = ok && ss < in.kv_len.data_as<int32_t>()[bb];
          if (c.window) ok = ok && ss >= tt - c.window->first && ss <= tt + c.window->second;
          on[ss] = ok;
          if (!ok) continue;
          double d = 0;
          for (int64_t x = 0; x < c.h; ++x)
            d += in.q.get(((bb * c.t + tt) * c.n + nn) * c.h + x) *
                 in.k.get(((bb * c.s + ss) * c.nk + nn / G) * c.h + x);
          d *= scale;
          if (c.bias) d += bcast(in.bias, bb, nn, tt, ss);
          if (c.soft_cap) d = *c.soft_cap * std::tanh(d / *c.soft_cap);
          logit[ss] = d;
          m = std::max(m, d);
        }
        if (m == -INFINITY) continue;
        double l = 0;
        for (int64_t ss = 0; ss < c.s; ++ss) l += on[ss] ? std::exp(logit[ss] - m) : 0.0;
        for (int64_t ss = 0; ss < c.s; ++ss) {
          if (!on[ss]) continue;
          const double p = std::exp(logit[ss] - m) / l;
          for (int64_t x = 0; x < c.hv; ++x)
            (*out)[((bb * c.t + tt) * c.n + nn) * c.hv + x] +=
                p * in.v.get(((bb * c.s + ss) * c.nk + nn / G) * c.hv + x);
        }
        (*lse)[(bb * c.n + nn) * c.t + tt] = m + std::log(l);
      }
    }
  }
}

// One case through `impl` (with `config`, or its own choice): against the reference (the
// family's tolerance), the reference against doubles, the residuals, and a second run
// bit-identical.
inline void check_case(const std::string& impl, const Case& c,
                       const std::optional<Config>& config = std::nullopt) {
  const Inputs in = make_inputs(c);
  AttentionOptions o = in.options;
  o.implementation = impl;
  o.config = config;
  const AttentionResult got = dot_product_attention_with_residuals(in.q, in.k, in.v, o);
  o.implementation = "reference";
  o.config.reset();
  const AttentionResult ref = dot_product_attention_with_residuals(in.q, in.k, in.v, o);
  std::vector<double> f64, f64_lse;
  f64_attention(c, in, &f64, &f64_lse);
  const std::string what = impl + " " + c.str();
  const bool bf16 = c.dtype == DType::kBF16;
  // The reference against doubles: f32 sums (and a bf16 output's rounding) only.
  expect_close(ref.out, f64, bf16 ? Tolerance{1e-2, 8e-3, 0} : Tolerance{1e-5, 1e-5, 1e-5},
               "reference vs f64 " + what);
  expect_close(ref.lse, f64_lse, {1e-5, 1e-5, 0}, "reference lse vs f64 " + what);
  attn::AttentionCall call;
  call.q = in.q;
  call.k = in.k;
  call.v = in.v;
  call.bias = in.options.bias;
  call.mask = in.options.mask;
  call.q_seq_lengths = in.options.q_seq_lengths;
  call.kv_seq_lengths = in.options.kv_seq_lengths;
  call.is_causal = c.causal;
  attn::family().bind(call);
  expect_close(got.out, values(ref.out), attn::family().tolerance_of(call), what);
  expect_close(got.lse, values(ref.lse), {1e-4, 1e-5, 0}, "lse " + what);
  // Determinism: the same inputs, config and threads give the same bits.
  o.implementation = impl;
  o.config = config;
  const Tensor again = dot_product_attention(in.q, in.k, in.v, o);
  ASSERT_EQ(std::memcmp(again.data(), got.out.data(), got.out.nbytes()), 0) << "rerun " << what;
}

// sum(dout * attention(q, k, v)) in double precision, with q, k or v replaced by `x` (which = 0,
// 1, 2).
inline double f64_loss(const Case& c, const Inputs& in, int which, const Tensor& x,
                       const Tensor& dout) {
  Inputs p;
  p.q = which == 0 ? x.clone() : as_f64(in.q);
  p.k = which == 1 ? x.clone() : as_f64(in.k);
  p.v = which == 2 ? x.clone() : as_f64(in.v);
  if (c.bias) p.bias = in.bias.clone();
  if (c.mask) p.mask = in.mask.clone();
  if (c.q_lengths) p.q_len = in.q_len.clone();
  if (c.kv_lengths) p.kv_len = in.kv_len.clone();
  std::vector<double> out, lse;
  f64_attention(c, p, &out, &lse);
  double l = 0;
  for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout.get(static_cast<int64_t>(i));
  return l;
}

// The backward through `impl` against the reference backward (the family's tolerance), and the
// reference's dq, dk, dv against central differences of the double-precision forward along a
// random direction.
inline void check_vjp(const std::string& impl, const Case& c) {
  const Inputs in = make_inputs(c);
  AttentionOptions o = in.options;
  o.implementation = "reference";
  const AttentionResult fwd = dot_product_attention_with_residuals(in.q, in.k, in.v, o);
  const Tensor dout = Tensor::randn(fwd.out.shape(), c.dtype, fresh_seed());
  const AttentionGrads ref = dot_product_attention_vjp(in.q, in.k, in.v, fwd.out, fwd.lse, dout, o);
  o.implementation = impl;
  const AttentionGrads got = dot_product_attention_vjp(in.q, in.k, in.v, fwd.out, fwd.lse, dout, o);
  attn::AttentionVjpCall call;
  call.q = in.q;
  call.k = in.k;
  call.v = in.v;
  call.o = fwd.out;
  call.lse_in = fwd.lse;
  call.dout = dout;
  call.bias = in.options.bias;
  call.is_causal = c.causal;
  attn::vjp_family().bind(call);
  const Tolerance tol = attn::vjp_family().tolerance_of(call);
  const std::string what = impl + " vjp " + c.str();
  expect_close(got.dq, values(ref.dq), tol, "dq " + what);
  expect_close(got.dk, values(ref.dk), tol, "dk " + what);
  expect_close(got.dv, values(ref.dv), tol, "dv " + what);
  if (c.bias) expect_close(got.dbias, values(ref.dbias), tol, "dbias " + what);
  if (impl != "reference" || c.dtype != DType::kF32) return;
  const Tensor* grads[3] = {&ref.dq, &ref.dk, &ref.dv};
  const Tensor* xs[3] = {&in.q, &in.k, &in.v};
  for (int which = 0; which < 3; ++which) {
    expect_gradient(
        *grads[which], *xs[which], [&](const Tensor& p) { return f64_loss(c, in, which, p, dout); },
        1e-4, 2e-4, std::string("reference d") + "qkv"[which] + " " + c.str());
  }
}

template <class Impl>
class AttentionImpl : public ::testing::Test {
 protected:
  static std::string impl() { return Impl::kName; }
};
TYPED_TEST_SUITE_P(AttentionImpl);

TYPED_TEST_P(AttentionImpl, ShapesAndGroups) {
  for (const Case& c :
       {Case{}, Case{2, 33, 70, 4, 2, 16, 24}, Case{1, 1, 40, 8, 2, 32, 32},
        Case{1, 50, 1, 3, 3, 5, 7}, Case{2, 19, 19, 6, 1, 12, 12}, Case{1, 0, 5, 2, 1, 8, 8},
        Case{1, 4, 0, 2, 1, 8, 8}, Case{1, 70, 130, 4, 4, 64, 48}}) {
    check_case(this->impl(), c);
  }
}

TYPED_TEST_P(AttentionImpl, MasksAndCausal) {
  Case c{2, 45, 60, 4, 2, 16, 16};
  c.causal = true;
  check_case(this->impl(), c);
  c.causal = false;
  c.window = std::pair<int64_t, int64_t>{5, 2};
  check_case(this->impl(), c);
  c.window.reset();
  c.q_lengths = c.kv_lengths = true;  // batch 0 entirely padding: zero rows, -inf lse
  check_case(this->impl(), c);
  c.q_lengths = c.kv_lengths = false;
  c.mask = Shape{2, 1, 45, 60};
  check_case(this->impl(), c);
  c.mask = Shape{60};
  c.bias = Shape{4, 1, 60};
  c.soft_cap = 2.0;
  c.scale = 0.7;
  check_case(this->impl(), c);
  c = Case{1, 33, 33, 2, 2, 8, 8};
  c.causal = true;
  c.window = std::pair<int64_t, int64_t>{3, 0};
  c.kv_lengths = true;
  c.bias = Shape{1, 2, 33, 33};
  check_case(this->impl(), c);
  // Decode (one query position; the native implementation streams K and V in place, in
  // chunks per batch and sub-blocks of positions across the kv heads): odd S, GQA, head sizes
  // off the vector width, every option.
  Case d{3, 1, 75, 8, 2, 16, 24};
  d.window = std::pair<int64_t, int64_t>{40, 0};
  d.kv_lengths = true;
  check_case(this->impl(), d);
  d.window.reset();
  d.kv_lengths = false;
  d.mask = Shape{3, 1, 1, 75};
  d.bias = Shape{1, 8, 1, 75};
  d.soft_cap = 3.0;
  check_case(this->impl(), d);
  d.causal = true;  // position 0 only
  check_case(this->impl(), d);
  // 8 kv heads of 128: 4 KB of K a position, so the native implementation's sub-blocks are 16
  // to 64 positions and S = 300 spans several of them in each of several chunks (merged at the
  // end), the last ones short; kv lengths (batch 0 empty) and a window end the rows inside them.
  Case many{2, 1, 300, 16, 8, 128, 128};
  check_case(this->impl(), many);
  many.kv_lengths = true;
  check_case(this->impl(), many);
  many.kv_lengths = false;
  many.window = std::pair<int64_t, int64_t>{0, 100};
  many.mask = Shape{2, 1, 1, 300};
  many.bias = Shape{1, 16, 1, 300};
  many.soft_cap = 4.0;
  check_case(this->impl(), many);
}

TYPED_TEST_P(AttentionImpl, Bf16) {
  Case c{1, 37, 70, 4, 2, 32, 16, DType::kBF16};
  check_case(this->impl(), c);
  c.causal = true;
  c.bias = Shape{1, 4, 37, 70};
  check_case(this->impl(), c);
  Case decode{2, 1, 517, 8, 2, 64, 64, DType::kBF16};
  decode.kv_lengths = true;  // batch 0 empty, batch 1 a random length
  check_case(this->impl(), decode);
  // Odd head sizes and kv length (half pairs on the AMX path), more rows than one tile pair,
  // GQA, a window and padding: every edge of the bf16 pair packing.
  Case odd{2, 45, 67, 6, 2, 33, 35, DType::kBF16};
  odd.causal = true;
  odd.window = std::pair<int64_t, int64_t>{20, 0};
  odd.kv_lengths = true;
  check_case(this->impl(), odd);
}

TYPED_TEST_P(AttentionImpl, Vjp) {
  const auto names = attn::vjp_family().implementation_names();
  if (std::find(names.begin(), names.end(), this->impl()) == names.end())
    GTEST_SKIP() << "no backward named " << this->impl();
  for (Case c : {Case{}, Case{2, 33, 70, 4, 2, 16, 24}, Case{1, 1, 40, 8, 2, 32, 32},
                 Case{1, 50, 1, 3, 3, 5, 7}, Case{1, 70, 130, 4, 4, 64, 48}}) {
    check_vjp(this->impl(), c);
  }
  Case c{2, 45, 60, 4, 2, 16, 16};
  c.causal = true;
  check_vjp(this->impl(), c);
  c.causal = false;
  c.window = std::pair<int64_t, int64_t>{5, 2};
  c.q_lengths = c.kv_lengths = true;
  check_vjp(this->impl(), c);
  c.window.reset();
  c.q_lengths = c.kv_lengths = false;
  c.mask = Shape{2, 1, 45, 60};
  c.bias = Shape{4, 1, 60};
  c.soft_cap = 2.0;
  c.scale = 0.7;
  check_vjp(this->impl(), c);
  check_vjp(this->impl(), Case{1, 37, 70, 4, 2, 32, 16, DType::kBF16});
}

REGISTER_TYPED_TEST_SUITE_P(AttentionImpl, ShapesAndGroups, MasksAndCausal, Bf16, Vjp);

}  // namespace tokamax::attention_test
