// layer_norm's public functions: bad input is a clear error naming the argument; rms_norm is
// layer_norm without the mean.
#include <gtest/gtest.h>

#include "tests/expect_error.h"
#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {
namespace {

TEST(LayerNorm, BadInputIsAClearError) {
  const Tensor x = Tensor::randn({4, 6}, DType::kF32, 1);
  const Tensor s6 = Tensor::randn({6}, DType::kF32, 2), s5 = Tensor::randn({5}, DType::kF32, 3);
  using testing::expect_invalid_argument;
  expect_invalid_argument(
      [&] { layer_norm(x, s5.view()); },
      "scale has spec f32[5]; expected f32 or bf16 [6] (x [4,6] along axis -1)");
  expect_invalid_argument([&] { layer_norm(x, s6.view(), s5.view()); }, "offset has spec f32[5]");
  expect_invalid_argument([&] { layer_norm(x, std::nullopt, std::nullopt, {.axis = 2}); },
                          "axis = 2 for x of shape [4,6]; expected in [-2, 2)");
  expect_invalid_argument([&] { layer_norm(x, std::nullopt, std::nullopt, {.epsilon = -1}); },
                          "epsilon = -1; expected 0 or a positive number");
  // In f32's units: finite as a double, but infinite or zero as a float.
  for (const double eps : {1e300, 1e-300}) {
    expect_invalid_argument([&] { layer_norm(x, std::nullopt, std::nullopt, {.epsilon = eps}); },
                            "(the kernels compute in f32)");
  }
  expect_invalid_argument(
      [&] { layer_norm(x, std::nullopt, std::nullopt, {.epsilon = std::nan("")}); }, "epsilon");
  expect_invalid_argument(
      [&] {
        layer_norm(Tensor::randn({4, 6}, DType::kF64, 1));
      },
      "expected rank >= 1, f32 or bf16");
  const LayerNormResult r = layer_norm_with_residuals(x, s6.view());
  expect_invalid_argument(
      [&] {
        layer_norm_vjp(x, s6.view(), std::nullopt, r.mean, r.rstd,
                       Tensor::randn({4, 5}, DType::kF32, 1));
      },
      "dy has spec f32[4,5]; expected contiguous f32[4,6]");
  expect_invalid_argument([&] { layer_norm_vjp(x, s6.view(), std::nullopt, r.rstd.view(), x, x); },
                          "rstd has spec f32[4,6]; expected contiguous f32[4]");
  // Through a JSON spec (the CLI's path) too.
  expect_invalid_argument(
      [&] {
        family().bind_json({{"x", "f32[4,6]"}, {"scale", "f32[7]"}}, "");
      },
      "scale has spec f32[7]");
}

TEST(LayerNorm, RmsNormIsLayerNormWithoutTheMean) {
  const Tensor x = Tensor::randn({3, 40}, DType::kF32, 5);
  const Tensor s = Tensor::randn({40}, DType::kF32, 6);
  const Tensor a = rms_norm(x, s.view());
  const Tensor b = layer_norm(x, s.view(), std::nullopt, {.subtract_mean = false});
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  double ms = 0;
  for (int64_t j = 0; j < 40; ++j) ms += x.get(j) * x.get(j);
  EXPECT_NEAR(a.get(0), x.get(0) / std::sqrt(ms / 40 + 1e-6) * s.get(0), 1e-5);
}

// The composed implementation's statistics in f64, as the others': at 10^6 columns its rstd was
// off by 2.3e-5 relative (bf16 x) and 3.5e-6 (f32) with f32 sums.
TEST(LayerNorm, ComposedStatisticsHoldAtAMillionColumns) {
  const int64_t d = 1000000;
  for (const DType dt : {DType::kF32, DType::kBF16}) {
    Tensor x = Tensor::randn({2, d}, dt, fresh_seed());
    // A mean large against the spread, as activations with an offset have.
    for (int64_t i = 0; i < x.size(); ++i) store_f32(x.view(), i, 3.0f + load_f32(x.view(), i));
    const LayerNormResult r =
        layer_norm_with_residuals(x, std::nullopt, std::nullopt, {.implementation = "composed"});
    for (int64_t row = 0; row < 2; ++row) {
      double s = 0, s2 = 0;
      for (int64_t j = 0; j < d; ++j) s += x.get(row * d + j);
      const double mean = s / d;
      for (int64_t j = 0; j < d; ++j)
        s2 += (x.get(row * d + j) - mean) * (x.get(row * d + j) - mean);
      const double rstd = 1 / std::sqrt(s2 / d + 1e-6);
      EXPECT_NEAR(r.rstd.get(row), rstd, 2e-7 * rstd) << dtype_name(dt);
      EXPECT_NEAR(r.mean.get(row), mean, 1e-6 * std::abs(mean)) << dtype_name(dt);
    }
  }
}

}  // namespace
}  // namespace tokamax::norm_test
