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
                          "epsilon = -1; expected a finite number >= 0");
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

}  // namespace
}  // namespace tokamax::norm_test
