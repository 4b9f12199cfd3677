// linear_softmax_cross_entropy_loss's public functions: bad input is a clear error naming the
// argument (labels: the first bad index and value).
#include <gtest/gtest.h>

#include "tests/expect_error.h"
#include "tests/ops/loss/test_base.h"

namespace tokamax::loss_test {
namespace {

TEST(Loss, BadInputIsAClearError) {
  const Tensor x = Tensor::randn({4, 6}, DType::kF32, 1);
  const Tensor w = Tensor::randn({6, 10}, DType::kF32, 2);
  Tensor labels({4}, DType::kI32);
  for (int i = 0; i < 4; ++i) labels.data_as<int32_t>()[i] = i;
  using testing::expect_invalid_argument;
  Tensor bad_labels = labels.clone();
  bad_labels.data_as<int32_t>()[2] = 10;
  bad_labels.data_as<int32_t>()[3] = -1;
  expect_invalid_argument([&] { linear_softmax_cross_entropy_loss(x, bad_labels, w); },
                          "labels[2] = 10; expected in [0, 10)");
  expect_invalid_argument(
      [&] {
        linear_softmax_cross_entropy_loss(x, labels, Tensor::randn({5, 10}, DType::kF32, 1));
      },
      "w has spec f32[5,10]; expected [H, V] with H = 6 (x f32[4,6])");
  expect_invalid_argument(
      [&] { linear_softmax_cross_entropy_loss(x, Tensor({3}, DType::kI32), w); },
      "labels has spec i32[3]; expected i32[4]");
  expect_invalid_argument(
      [&] { linear_softmax_cross_entropy_loss(x, Tensor::zeros({4}, DType::kF32), w); },
      "labels has spec f32[4]");
  expect_invalid_argument(
      [&] {
        linear_softmax_cross_entropy_loss(Tensor::randn({4, 6, 1}, DType::kF32, 1), labels, w);
      },
      "x has spec f32[4,6,1]; expected [B, H]");
  const LossResult r = linear_softmax_cross_entropy_loss_with_residuals(x, labels, w);
  expect_invalid_argument(
      [&] {
        linear_softmax_cross_entropy_loss_vjp(x, labels, w, r.lse, Tensor::zeros({4}, DType::kF32));
      },
      "dloss has spec f32[4]; expected contiguous f32[] (the cotangent of the forward's output "
      "'loss')");
  expect_invalid_argument(
      [&] { linear_softmax_cross_entropy_loss_vjp(x, labels, w, r.loss, r.loss); },
      "lse has spec f32[]; expected contiguous f32[4]");
}

}  // namespace
}  // namespace tokamax::loss_test
