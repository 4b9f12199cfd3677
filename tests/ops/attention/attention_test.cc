// dot_product_attention's public functions: bad input is a clear error naming the argument.
#include <gtest/gtest.h>

#include "tests/expect_error.h"
#include "tests/ops/attention/test_base.h"

namespace tokamax::attention_test {
namespace {

TEST(Attention, BadInputIsAClearError) {
  Tensor q = Tensor::randn({2, 5, 4, 8}, DType::kF32, 1),
         k = Tensor::randn({2, 7, 2, 8}, DType::kF32, 2),
         v = Tensor::randn({2, 7, 2, 8}, DType::kF32, 3);
  const auto expect_error = [](auto fn, const char* needle) {
    testing::expect_invalid_argument(fn, needle);
  };
  expect_error(
      [&] {
        dot_product_attention(q, Tensor::randn({3, 7, 2, 8}, DType::kF32, 1), v);
      },
      "batch sizes differ");
  expect_error(
      [&] {
        dot_product_attention(q, Tensor::randn({2, 7, 2, 6}, DType::kF32, 1), v);
      },
      "head dims differ");
  expect_error(
      [&] {
        dot_product_attention(q, Tensor::randn({2, 7, 3, 8}, DType::kF32, 1),
                              Tensor::randn({2, 7, 3, 8}, DType::kF32, 1));
      },
      "N a multiple of Nk");
  expect_error(
      [&] {
        dot_product_attention(Tensor::randn({5, 4, 8}, DType::kF32, 1), k, v);
      },
      "rank 4");
  Tensor bias = Tensor::randn({3, 5, 7}, DType::kF32, 1);
  expect_error([&] { dot_product_attention(q, k, v, {.bias = bias.view()}); },
               "bias has shape f32[3,5,7], not broadcastable to [B,N,T,S] = [2,4,5,7]");
  Tensor mask = Tensor::zeros({7}, DType::kF32);
  expect_error([&] { dot_product_attention(q, k, v, {.mask = mask.view()}); }, "expected bool");
  Tensor lengths = Tensor::full({2}, DType::kI32, 8);
  expect_error([&] { dot_product_attention(q, k, v, {.kv_seq_lengths = lengths.view()}); },
               "kv_seq_lengths[0] = 8; expected in [0, 7]");
  expect_error([&] { dot_product_attention(q, k, v, {.q_seq_lengths = lengths.view()}); },
               "q_seq_lengths[0] = 8; expected in [0, 5]");
  expect_error(
      [&] {
        dot_product_attention(q, k, v, {.local_window_size = std::pair<int64_t, int64_t>{-1, 2}});
      },
      "local_window_size");
  expect_error([&] { dot_product_attention(q, k, v, {.scale = std::nan("")}); }, "scale");
  expect_error([&] { dot_product_attention(q, k, v, {.logits_soft_cap = -1.0}); },
               "logits_soft_cap");
  expect_error(
      [&] {
        dot_product_attention(q, Tensor::randn({2, 7, 2, 8}, DType::kBF16, 1), v);
      },
      "one dtype");
  // Specs are checked the same way.
  expect_error([&] { attn::family().bind_json(Json{{"q", "f32[1,2,3,4]"}}, ""); }, "missing 'k'");
}

}  // namespace
}  // namespace tokamax::attention_test
