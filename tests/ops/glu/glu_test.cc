// gated_linear_unit's public functions: bad input is a clear error naming the argument.
#include <gtest/gtest.h>

#include "tests/expect_error.h"
#include "tests/ops/glu/test_base.h"

namespace tokamax::glu_test {
namespace {

TEST(Glu, BadInputIsAClearError) {
  const Tensor x = Tensor::randn({4, 6}, DType::kF32, 1);
  const Tensor w = Tensor::randn({6, 2, 5}, DType::kF32, 2);
  using testing::expect_invalid_argument;
  expect_invalid_argument(
      [&] {
        gated_linear_unit(x, Tensor::randn({7, 2, 5}, DType::kF32, 1));
      },
      "w has shape f32[7,2,5]; expected [K, 2, N] with K = 6 (x f32[4,6])");
  expect_invalid_argument(
      [&] {
        gated_linear_unit(x, Tensor::randn({6, 3, 5}, DType::kF32, 1));
      },
      "[K, 2, N]");
  expect_invalid_argument(
      [&] {
        gated_linear_unit(x, Tensor::randn({6, 5}, DType::kF32, 1),
                          Tensor::randn({6, 4}, DType::kF32, 1));
      },
      "w_gate has spec f32[6,5] and w_up f32[6,4]");
  expect_invalid_argument([&] { gated_linear_unit(Tensor::randn({6}, DType::kF32, 1), w); },
                          "x has spec f32[6]; expected [..., M, K]");
  expect_invalid_argument(
      [&] {
        gated_linear_unit(x, Tensor::randn({6, 2, 5}, DType::kF64, 1));
      },
      "f32 or bf16");
  expect_invalid_argument(
      [&] {
        gated_linear_unit(x, pack_glu_weights(Tensor::randn({5, 2, 5}, DType::kF32, 1)));
      },
      "w has shape f32[5,2,5]; expected [K, 2, N] with K = 6");
  const GluResult r = gated_linear_unit_with_residuals(x, w);
  expect_invalid_argument(
      [&] {
        gated_linear_unit_vjp(x, w, r.h, Tensor::randn({4, 6}, DType::kF32, 1));
      },
      "dout has spec f32[4,6]; expected contiguous f32[4,5]");
  expect_invalid_argument([&] { gated_linear_unit_vjp(x, w, r.out, r.out); },
                          "h has spec f32[4,5]; expected contiguous f32[4,2,5]");
  expect_invalid_argument(
      [&] {
        glu::family().bind_json({{"x", "f32[4,6]"}, {"w", "f32[6,2,5]"}, {"activation", "tanh"}},
                                "");
      },
      "activation");
}

}  // namespace
}  // namespace tokamax::glu_test
