// ragged_dot's shared test cases (tokamax's test_base pattern): every implementation against
// the reference within the family's tolerance, the reference against an independent double-
// precision computation; dtypes, the three dimension-number forms, empty groups (all 2^8
// patterns), edge sizes, activations and the VJP. Inputs are fresh per run; a failure prints
// the TOKAMAX_TEST_SEED that reproduces it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "ops/ragged_dot/base.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax::ragged_dot_test {

// Double-precision ragged_dot on the operands as the call sees them (lhs rounded when the
// precision says so), activation applied.
inline std::vector<double> f64_ragged_dot(const TensorView& lhs, const TensorView& rhs,
                                          const std::vector<int32_t>& sizes, RaggedDimNums dims,
                                          Activation act, bool round_lhs) {
  const int64_t M = lhs.dim(0), K = lhs.dim(1), G = static_cast<int64_t>(sizes.size());
  auto a = [&](int64_t i, int64_t k) {
    const double v = lhs.get(i * K + k);
    return round_lhs ? static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(v)))) : v;
  };
  auto actf = [&](double x) {
    return static_cast<double>(rdot::apply_activation(act, static_cast<float>(x)));
  };
  std::vector<double> out;
  if (dims == RaggedDimNums::kRaggedContracting) {
    const int64_t N = rhs.dim(1);
    out.assign(G * K * N, 0.0);
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t r = r0; r < r0 + sizes[g]; ++r) s += a(r, k) * rhs.get(r * N + n);
          out[(g * K + k) * N + n] = actf(s);
        }
      }
      r0 += sizes[g];
    }
    return out;
  }
  const bool trans = dims == RaggedDimNums::kTransposedRhs;
  const int64_t N = trans ? rhs.dim(1) : rhs.dim(2);
  out.assign(M * N, 0.0);
  int64_t r0 = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = r0; r < r0 + sizes[g]; ++r) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a(r, k) * rhs.get(g * K * N + (trans ? n * K + k : k * N + n));
        out[r * N + n] = actf(s);
      }
    }
    r0 += sizes[g];
  }
  return out;
}

inline void expect_close(const Tensor& got, const std::vector<double>& want, double atol,
                         double rtol, double normwise, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.size()), want.size()) << what;
  double e2 = 0, r2 = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i), w = want[i];
    ASSERT_FALSE(std::isnan(g)) << what << " NaN at " << i;
    e2 += (g - w) * (g - w);
    r2 += w * w;
    if (std::abs(g - w) > atol + rtol * std::abs(w) && bad++ < 3) {
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w;
    }
  }
  if (normwise > 0 && r2 > 0) {
    EXPECT_LE(std::sqrt(e2 / r2), normwise) << what;
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Case {
  DType lhs, rhs;
  std::optional<DType> out;
  RaggedDimNums dims;
  int64_t K, N;
  std::vector<int32_t> sizes;
  int64_t extra_rows = 0;
  Activation act = Activation::kNone;
  Precision precision = Precision::kDefault;
};

inline std::string describe(const Case& c) {
  std::string s = std::string(dtype_name(c.lhs)) + "x" + std::string(dtype_name(c.rhs)) + " " +
                  std::string(dim_nums_name(c.dims)) + " K=" + std::to_string(c.K) +
                  " N=" + std::to_string(c.N) + " act=" + std::string(activation_name(c.act)) +
                  " sizes=";
  for (int32_t x : c.sizes) s += std::to_string(x) + ",";
  return s;
}

// Runs one case through `impl`; checks against the reference and the double computation.
inline void check_case(const std::string& impl, const Case& c, bool packed = false) {
  int64_t M = c.extra_rows;
  for (int32_t s : c.sizes) M += s;
  const int64_t G = static_cast<int64_t>(c.sizes.size());
  const uint64_t seed = fresh_seed();
  Tensor lhs = Tensor::randn({M, c.K}, c.lhs, seed);
  Shape rs = c.dims == RaggedDimNums::kForward         ? Shape{G, c.K, c.N}
             : c.dims == RaggedDimNums::kTransposedRhs ? Shape{G, c.N, c.K}
                                                       : Shape{M, c.N};
  Tensor rhs = Tensor::randn(rs, c.rhs, seed + 1);
  RaggedDotOptions o;
  o.preferred_element_type = c.out;
  o.activation = c.act;
  o.precision = c.precision;
  o.implementation = impl;
  Tensor got = packed ? ragged_dot(lhs, pack_rhs(rhs, c.dims, c.precision), c.sizes, o)
                      : ragged_dot_general(lhs, rhs, c.sizes, c.dims, o);
  o.implementation = "reference";
  Tensor ref = ragged_dot_general(lhs, rhs, c.sizes, c.dims, o);
  const bool round =
      c.lhs == DType::kBF16 || (c.rhs == DType::kBF16 && c.precision == Precision::kDefault);
  const std::vector<double> f64 = f64_ragged_dot(lhs, rhs, c.sizes, c.dims, c.act, round);
  const double depth = std::sqrt(static_cast<double>(
      std::max<int64_t>(c.dims == RaggedDimNums::kRaggedContracting ? M : c.K, 1)));
  const std::string what = impl + (packed ? " packed " : " ") + describe(c);
  // The reference against double precision: f32 accumulation error only (plus output rounding).
  if (got.dtype() == DType::kBF16) {
    expect_close(ref, f64, 1e-2, 5e-3, 0, "reference " + what);
  } else {
    expect_close(ref, f64, 1e-5 * depth, 1e-5, 1e-5, "reference " + what);
  }
  std::vector<double> refd(static_cast<size_t>(ref.size()));
  for (int64_t i = 0; i < ref.size(); ++i) refd[i] = ref.get(i);
  // Against the reference within the family's own tolerance (the autotuner's check).
  rdot::RaggedDotCall call;
  call.lhs = lhs;
  call.rhs = rhs;
  call.group_sizes = c.sizes;
  call.dims = c.dims;
  call.preferred_element_type = c.out;
  call.activation = c.act;
  call.precision = c.precision;
  rdot::family().bind(call);
  const Tolerance tol = rdot::family().tolerance_of(call);
  expect_close(got, refd, tol.atol, tol.rtol, tol.normwise, what);
}

// The cases every implementation passes; one file per implementation instantiates them
// (native_test.cc, blas_test.cc, reference_test.cc) with a type naming it.
template <class Impl>
class RaggedDotImpl : public ::testing::Test {
 protected:
  static std::string impl() { return Impl::kName; }
};
TYPED_TEST_SUITE_P(RaggedDotImpl);

TYPED_TEST_P(RaggedDotImpl, DtypesAndForms) {
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs,
                          RaggedDimNums::kRaggedContracting}) {
    check_case(this->impl(), {DType::kF32, DType::kF32, {}, d, 37, 45, {5, 0, 13, 2}, 3});
    check_case(this->impl(), {DType::kBF16, DType::kBF16, {}, d, 64, 33, {7, 9, 0}, 1});
    check_case(this->impl(), {DType::kBF16, DType::kBF16, DType::kF32, d, 31, 40, {4, 4}, 0});
    check_case(this->impl(), {DType::kF32, DType::kBF16, {}, d, 50, 17, {0, 11, 6}, 2});
    check_case(this->impl(), {DType::kF32,
                              DType::kBF16,
                              {},
                              d,
                              50,
                              17,
                              {3, 11, 6},
                              0,
                              Activation::kNone,
                              Precision::kHighest});
  }
}

TYPED_TEST_P(RaggedDotImpl, EdgeSizes) {
  const auto f = DType::kF32;
  check_case(this->impl(), {f, f, {}, RaggedDimNums::kForward, 16, 16, {}, 0});      // G = 0, M = 0
  check_case(this->impl(), {f, f, {}, RaggedDimNums::kForward, 16, 16, {0, 0}, 0});  // M = 0
  check_case(this->impl(), {f, f, {}, RaggedDimNums::kForward, 1, 1, {1}, 0});       // G = 1, 1x1
  check_case(this->impl(), {f, f, {}, RaggedDimNums::kForward, 0, 7, {3}, 2});       // K = 0
  check_case(this->impl(), {f, f, {}, RaggedDimNums::kForward, 17, 1, {5, 8}, 0});   // N = 1
  check_case(
      this->impl(),
      {f, f, {}, RaggedDimNums::kForward, 300, 129, {1, 70, 0, 2}, 5});  // > one K block, odd
  check_case(this->impl(),
             {f, f, {}, RaggedDimNums::kForward, 33, 65, {200, 1, 1, 0}, 0});  // skewed
  check_case(
      this->impl(),
      {DType::kBF16, DType::kBF16, {}, RaggedDimNums::kForward, 301, 31, {13, 2}, 0});  // odd K
                                                                                        // pairs
}

TYPED_TEST_P(RaggedDotImpl, Activations) {
  for (Activation a : {Activation::kRelu, Activation::kSilu, Activation::kGelu,
                       Activation::kGeluTanh, Activation::kSigmoid}) {
    check_case(this->impl(),
               {DType::kF32, DType::kF32, {}, RaggedDimNums::kForward, 24, 20, {3, 0, 5}, 1, a});
    check_case(this->impl(),
               {DType::kBF16, DType::kBF16, {}, RaggedDimNums::kForward, 24, 20, {3, 5}, 0, a});
  }
}

TYPED_TEST_P(RaggedDotImpl, AllEmptyGroupPatterns) {
  for (int mask = 0; mask < 256; ++mask) {
    std::vector<int32_t> sizes(8);
    for (int g = 0; g < 8; ++g) sizes[g] = (mask >> g) & 1 ? 1 + (g * 3) % 5 : 0;
    check_case(this->impl(),
               {DType::kF32, DType::kF32, {}, RaggedDimNums::kForward, 9, 18, sizes, 1});
    if (mask % 17 == 0)
      check_case(this->impl(),
                 {DType::kF32, DType::kF32, {}, RaggedDimNums::kRaggedContracting, 5, 6, sizes, 0});
  }
}

TYPED_TEST_P(RaggedDotImpl, Vjp) {
  for (Activation act : {Activation::kNone, Activation::kSilu}) {
    const std::vector<int32_t> sizes = {4, 0, 6, 3};
    const int64_t M = 14, K = 19, N = 11, G = 4;
    Tensor lhs = Tensor::randn({M, K}, DType::kF32, fresh_seed());
    Tensor rhs = Tensor::randn({G, K, N}, DType::kF32, fresh_seed());
    Tensor dout = Tensor::randn({M, N}, DType::kF32, fresh_seed());
    RaggedDotOptions o;
    o.activation = act;
    o.implementation = this->impl();
    const RaggedDotGrads gr = ragged_dot_vjp(lhs, rhs, sizes, dout, o);
    // Double-precision gradients.
    std::vector<double> dl(M * K, 0), dr(G * K * N, 0);
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t r = r0; r < r0 + sizes[g]; ++r) {
        for (int64_t n = 0; n < N; ++n) {
          double pre = 0;
          for (int64_t k = 0; k < K; ++k) pre += lhs.get(r * K + k) * rhs.get((g * K + k) * N + n);
          const double d = dout.get(r * N + n) * rdot::activation_grad(act, pre);
          for (int64_t k = 0; k < K; ++k) {
            dl[r * K + k] += d * rhs.get((g * K + k) * N + n);
            dr[(g * K + k) * N + n] += d * lhs.get(r * K + k);
          }
        }
      }
      r0 += sizes[g];
    }
    expect_close(gr.dlhs, dl, 1e-4, 1e-4, 1e-5, this->impl() + " dlhs");
    expect_close(gr.drhs, dr, 1e-4, 1e-4, 1e-5, this->impl() + " drhs");
    for (int64_t i = K * N; i < 2 * K * N; ++i)
      ASSERT_EQ(gr.drhs.get(i), 0.0) << "empty group must get exactly zero";
  }
}

REGISTER_TYPED_TEST_SUITE_P(RaggedDotImpl, DtypesAndForms, EdgeSizes, Activations,
                            AllEmptyGroupPatterns, Vjp);

}  // namespace tokamax::ragged_dot_test
