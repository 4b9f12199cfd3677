// moe_experts: the reference against this file's own double-precision loops over experts (the
// layer as transformers' eager experts forward writes it), native (plain and packed weights,
// both layouts) against the reference over edge sizes and routings, and bad input.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/dotrows.h"
#include "tests/expect_error.h"
#include "tests/kernels/kernel_sets.h"
#include "tests/ops/common.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

using op_test::expect_close;
using testing::expect_invalid_argument;

struct Case {
  int64_t t, k, e, n, top_k;
  DType x, w, idx;
  bool transposed;
  Activation act = Activation::kSilu;
};

std::string name_of(const Case& c) {
  return fmt::format("T{} K{} E{} N{} k{} {}/{}/{}{} {}", c.t, c.k, c.e, c.n, c.top_k,
                     dtype_name(c.x), dtype_name(c.w), dtype_name(c.idx),
                     c.transposed ? " transposed" : "", activation_name(c.act));
}

Tensor to_bf16(const Tensor& t) {
  Tensor out(t.shape(), DType::kBF16);
  for (int64_t i = 0; i < t.size(); ++i)
    out.data_as<uint16_t>()[i] = f32_to_bf16(t.data_as<float>()[i]);
  return out;
}

struct Inputs {
  Tensor hidden, index, weights, w_gate_up, w_down;
};

// Routing as a router gives it (distinct experts per token), except that `skew` sends every
// token to the first experts only, so that the others get no rows.
Inputs make_inputs(const Case& c, uint64_t seed, bool skew = false) {
  Inputs in;
  in.hidden = Tensor::randn({c.t, c.k}, c.x, seed);
  const std::vector<int64_t> gu = c.transposed ? std::vector<int64_t>{c.e, 2 * c.n, c.k}
                                               : std::vector<int64_t>{c.e, c.k, 2 * c.n};
  const std::vector<int64_t> dn =
      c.transposed ? std::vector<int64_t>{c.e, c.k, c.n} : std::vector<int64_t>{c.e, c.n, c.k};
  in.w_gate_up = Tensor::randn(gu, DType::kF32, seed + 1);
  in.w_down = Tensor::randn(dn, DType::kF32, seed + 2);
  // At a trained model's scale, so both products stay near unit size.
  for (int64_t i = 0; i < in.w_gate_up.size(); ++i)
    in.w_gate_up.data_as<float>()[i] /= std::sqrt(static_cast<float>(std::max<int64_t>(c.k, 1)));
  for (int64_t i = 0; i < in.w_down.size(); ++i)
    in.w_down.data_as<float>()[i] /= std::sqrt(static_cast<float>(std::max<int64_t>(c.n, 1)));
  if (c.w == DType::kBF16) {
    in.w_gate_up = to_bf16(in.w_gate_up);
    in.w_down = to_bf16(in.w_down);
  }
  in.index = Tensor({c.t, c.top_k}, c.idx);
  in.weights = Tensor({c.t, c.top_k}, DType::kF32);
  std::mt19937_64 rng(seed + 3);
  for (int64_t t = 0; t < c.t; ++t) {
    std::vector<int64_t> experts(static_cast<size_t>(c.e));
    for (int64_t e = 0; e < c.e; ++e) experts[e] = e;
    if (!skew) std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t j = 0; j < c.top_k; ++j) {
      const int64_t e = experts[j % c.e];
      if (c.idx == DType::kI32)
        in.index.data_as<int32_t>()[t * c.top_k + j] = static_cast<int32_t>(e);
      else
        in.index.data_as<int64_t>()[t * c.top_k + j] = e;
      in.weights.data_as<float>()[t * c.top_k + j] =
          std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
    }
  }
  return in;
}

double act_d(Activation a, double x) {
  switch (a) {
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kRelu:
      return x > 0 ? x : 0;
    default:
      return x;
  }
}

// The layer in double, expert by expert over the tokens routed to it (transformers' eager
// order), from the inputs as the library multiplies them: an f32 hidden state rounded to bf16
// against bf16 weights, the activations rounded to bf16 before a bf16 down product.
std::vector<double> expected(const Case& c, const Inputs& in) {
  std::vector<double> out(static_cast<size_t>(c.t * c.k), 0.0);
  const auto w = [&](const Tensor& m, int64_t e, int64_t row, int64_t col, int64_t rows,
                     int64_t cols) {
    return c.transposed ? m.get((e * cols + col) * rows + row)
                        : m.get((e * rows + row) * cols + col);
  };
  const auto bf16 = [](double v) { return static_cast<double>(bf16_to_f32(f32_to_bf16(v))); };
  for (int64_t e = 0; e < c.e; ++e) {
    for (int64_t t = 0; t < c.t; ++t) {
      for (int64_t j = 0; j < c.top_k; ++j) {
        if (static_cast<int64_t>(in.index.get(t * c.top_k + j)) != e) continue;
        std::vector<double> h(static_cast<size_t>(2 * c.n), 0.0);
        for (int64_t kk = 0; kk < c.k; ++kk) {
          double x = in.hidden.get(t * c.k + kk);
          if (c.w == DType::kBF16) x = bf16(x);
          for (int64_t col = 0; col < 2 * c.n; ++col)
            h[col] += x * w(in.w_gate_up, e, kk, col, c.k, 2 * c.n);
        }
        for (int64_t i = 0; i < c.n; ++i) {
          double a = act_d(c.act, h[i]) * h[c.n + i];
          if (c.w == DType::kBF16) a = bf16(a);
          for (int64_t kk = 0; kk < c.k; ++kk) {
            out[t * c.k + kk] +=
                in.weights.get(t * c.top_k + j) * a * w(in.w_down, e, i, kk, c.n, c.k);
          }
        }
      }
    }
  }
  return out;
}

Tolerance tolerance(const Case& c) {
  if (c.x == DType::kBF16 || c.w == DType::kBF16) return {2e-2, 1e-2 + 1.0 / 128, 0};
  return {1e-4 * std::sqrt(static_cast<double>(std::max<int64_t>({c.k, c.n, 1}))), 1e-4, 1e-5};
}

Tensor run(const Case& c, const Inputs& in, const std::string& impl) {
  MoeExpertsOptions o;
  o.activation = c.act;
  o.transposed_weights = c.transposed;
  o.implementation = impl;
  return moe_experts(in.hidden, in.index, in.weights, in.w_gate_up, in.w_down, o);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> v = {
      {1, 16, 4, 8, 2, DType::kF32, DType::kF32, DType::kI64, false},
      {5, 24, 4, 10, 2, DType::kF32, DType::kF32, DType::kI32, true},
      {7, 33, 5, 17, 3, DType::kBF16, DType::kBF16, DType::kI64, true},
      {3, 16, 6, 17, 1, DType::kF32, DType::kBF16, DType::kI64, false},
      {4, 20, 3, 9, 3, DType::kF32, DType::kF32, DType::kI64, false},  // top_k = E
      {9, 40, 8, 24, 2, DType::kBF16, DType::kF32, DType::kI32, false, Activation::kGelu},
      {6, 17, 5, 31, 2, DType::kBF16, DType::kBF16, DType::kI32, false, Activation::kRelu},
      {33, 64, 16, 48, 4, DType::kBF16, DType::kBF16, DType::kI64, true},
      // Over 4 rows an expert: the transposed layout's grouped GEMM, not the dotrows stream.
      {40, 24, 2, 12, 1, DType::kF32, DType::kBF16, DType::kI64, true},
      {37, 20, 3, 9, 2, DType::kF32, DType::kF32, DType::kI32, true},
  };
  return v;
}

TEST(MoeExperts, ReferenceMatchesDoubleLoopsOverExperts) {
  for (const Case& c : cases()) {
    const Inputs in = make_inputs(c, fresh_seed());
    expect_close(run(c, in, "reference"), expected(c, in), tolerance(c), name_of(c));
  }
}

TEST(MoeExpertsImpl, NativeMatchesReference) {
  for (const Case& c : cases()) {
    for (bool skew : {false, true}) {
      const Inputs in = make_inputs(c, fresh_seed(), skew);
      const std::vector<double> want = op_test::values(run(c, in, "reference"));
      const std::string what = name_of(c) + (skew ? " (experts with no rows)" : "");
      expect_close(run(c, in, "native"), want, tolerance(c), what + " native");
      MoeExpertsOptions o;
      o.activation = c.act;
      const PackedMoeWeights packed = pack_moe_weights(in.w_gate_up, in.w_down, c.transposed);
      expect_close(moe_experts(in.hidden, in.index, in.weights, packed, o), want, tolerance(c),
                   what + " native packed");
    }
  }
}

TEST(MoeExpertsImpl, EmptyTokensAndZeroWidthGiveZeros) {
  for (const auto& [t, top_k, n] : {std::tuple{0, 2, 8}, {3, 0, 8}, {3, 2, 0}}) {
    Case c{t, 16, 4, n, top_k, DType::kBF16, DType::kBF16, DType::kI64, false};
    const Inputs in = make_inputs(c, fresh_seed());
    for (const char* impl : {"native", "reference"}) {
      const Tensor out = run(c, in, impl);
      ASSERT_EQ(out.shape(), (std::vector<int64_t>{t, 16})) << impl;
      for (int64_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.get(i), 0.0) << impl << " " << i;
    }
  }
}

TEST(MoeExpertsImpl, DuplicateExpertsOfATokenEachCount) {
  // A router never repeats an expert, but a caller may: each slot is its own term.
  Case c{2, 16, 3, 8, 2, DType::kF32, DType::kF32, DType::kI64, false};
  Inputs in = make_inputs(c, fresh_seed());
  for (int64_t s = 0; s < 4; ++s) in.index.data_as<int64_t>()[s] = 1;
  expect_close(run(c, in, "native"), expected(c, in), tolerance(c), "duplicates");
}

TEST(MoeExperts, DotRowsKernelOfEveryIsaAgainstDoubles) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> normal;
  constexpr float kGuard = 12345.0f;
  for (const kernels::KernelSet* set : testing::runnable_sets()) {
    const kernels::DotRowsKernel kernel = kernels::dotrows_kernel(set->isa);
    for (int rows : {1, 2, 3, 4, 5, 9}) {
      for (int64_t cols : {1, 3, 4, 5, 17}) {
        for (int64_t k : {0, 1, 7, 16, 33, 70}) {
          for (bool bf16 : {false, true}) {
            const int64_t lda = k + 3, ldw = k + 5, ldo = cols + 2;
            std::vector<float> a(static_cast<size_t>(rows * lda)),
                wf(static_cast<size_t>(cols * ldw));
            std::vector<uint16_t> wb(wf.size());
            for (float& v : a) v = normal(rng);
            for (size_t i = 0; i < wf.size(); ++i) {
              wb[i] = f32_to_bf16(normal(rng));
              wf[i] = bf16 ? bf16_to_f32(wb[i]) : normal(rng);
            }
            std::vector<float> out(static_cast<size_t>(rows * ldo), kGuard);
            kernel(rows, cols, k, a.data(), lda,
                   bf16 ? static_cast<const void*>(wb.data()) : wf.data(), bf16, ldw, out.data(),
                   ldo);
            const std::string what = fmt::format("{} rows {} cols {} k {} {}", set->name, rows,
                                                 cols, k, bf16 ? "bf16" : "f32");
            for (int r = 0; r < rows; ++r) {
              for (int64_t c = 0; c < ldo; ++c) {
                const float got = out[r * ldo + c];
                if (c >= cols) {
                  ASSERT_EQ(got, kGuard)
                      << what << ": wrote past the columns at " << r << ", " << c;
                  continue;
                }
                double want = 0, mag = 0;
                for (int64_t i = 0; i < k; ++i) {
                  want += static_cast<double>(a[r * lda + i]) * wf[c * ldw + i];
                  mag += std::abs(static_cast<double>(a[r * lda + i]) * wf[c * ldw + i]);
                }
                ASSERT_NEAR(got, want, 1e-6 * mag + 1e-7) << what << " at " << r << ", " << c;
              }
            }
          }
        }
      }
    }
  }
}

TEST(MoeExperts, BadInputIsRefusedNamingTheArgument) {
  const Case c{3, 16, 4, 8, 2, DType::kF32, DType::kF32, DType::kI64, false};
  const Inputs in = make_inputs(c, fresh_seed());
  const auto call = [&](const TensorView& h, const TensorView& idx, const TensorView& w,
                        const TensorView& gu, const TensorView& dn) {
    return [=] { (void)moe_experts(h, idx, w, gu, dn); };
  };
  Tensor neg = in.index.clone();
  neg.data_as<int64_t>()[3] = -1;
  expect_invalid_argument(call(in.hidden, neg, in.weights, in.w_gate_up, in.w_down),
                          "top_k_index[1, 1] = -1; expected an expert in [0, 4)");
  Tensor big = in.index.clone();
  big.data_as<int64_t>()[0] = 4;
  expect_invalid_argument(call(in.hidden, big, in.weights, in.w_gate_up, in.w_down),
                          "top_k_index[0, 0] = 4");
  Tensor nan = in.weights.clone();
  nan.data_as<float>()[5] = NAN;
  expect_invalid_argument(call(in.hidden, in.index, nan, in.w_gate_up, in.w_down),
                          "top_k_weights[2, 1] = nan");
  const Tensor f_idx({3, 2}, DType::kF32);
  expect_invalid_argument(call(in.hidden, f_idx, in.weights, in.w_gate_up, in.w_down),
                          "top_k_index has spec f32[3,2]");
  const Tensor short_w({3, 1}, DType::kF32);
  expect_invalid_argument(call(in.hidden, in.index, short_w, in.w_gate_up, in.w_down),
                          "top_k_weights has spec f32[3,1]");
  const Tensor odd({4, 16, 15}, DType::kF32);
  expect_invalid_argument(call(in.hidden, in.index, in.weights, odd, in.w_down),
                          "w_gate_up has spec f32[4,16,15]");
  const Tensor wrong_k({4, 17, 16}, DType::kF32);
  expect_invalid_argument(call(in.hidden, in.index, in.weights, wrong_k, in.w_down),
                          "with K = 16 (hidden's)");
  const Tensor few_experts({3, 8, 16}, DType::kF32);
  expect_invalid_argument(call(in.hidden, in.index, in.weights, in.w_gate_up, few_experts),
                          "w_down has spec f32[3,8,16]");
  const Tensor int_hidden({3, 16}, DType::kI32);
  expect_invalid_argument(call(int_hidden, in.index, in.weights, in.w_gate_up, in.w_down),
                          "hidden has spec i32[3,16]");
  const Tensor no_experts({0, 16, 16}, DType::kF32), no_down({0, 8, 16}, DType::kF32);
  expect_invalid_argument(call(in.hidden, in.index, in.weights, no_experts, no_down),
                          "has no experts");
  expect_invalid_argument(
      [&] { (void)moe_experts(in.hidden, in.index, in.weights, PackedMoeWeights{}, {}); },
      "PackedMoeWeights are empty");
}

}  // namespace
}  // namespace tokamax
