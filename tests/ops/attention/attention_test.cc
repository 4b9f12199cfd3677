// dot_product_attention's public functions: bad input is a clear error naming the argument.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

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

// Zero heads (and an empty batch or sequence) in every implementation, forward and backward:
// empty outputs, no crash (was a SIGFPE dividing by the kv heads).
TEST(Attention, EmptyHeadsBatchesAndSequencesRunInEveryImplementation) {
  for (const Shape& qs : std::vector<Shape>{{1, 4, 0, 8}, {0, 4, 2, 8}, {1, 0, 2, 8}}) {
    const Shape ks = {qs[0], 3, qs[2], 8};
    Tensor q = Tensor::randn(qs, DType::kF32, 1), k = Tensor::randn(ks, DType::kF32, 2),
           v = Tensor::randn(ks, DType::kF32, 3);
    for (const char* impl : {"native", "composed", "reference"}) {
      SCOPED_TRACE(std::string(impl) + " q " + shape_str(qs));
      for (const bool causal : {false, true}) {
        AttentionOptions o{.is_causal = causal, .implementation = impl};
        const AttentionResult r = dot_product_attention_with_residuals(q, k, v, o);
        EXPECT_EQ(r.out.shape(), (Shape{qs[0], qs[1], qs[2], 8}));
        const AttentionGrads g = dot_product_attention_vjp(q, k, v, r.out, r.lse, r.out, o);
        EXPECT_EQ(g.dq.shape(), qs);
        EXPECT_EQ(g.dk.shape(), ks);
      }
    }
  }
}

// A window side of 2^63 - 1 bounds nothing (tt + right + 1 overflowed: every position masked).
TEST(Attention, HugeWindowIsNoWindow) {
  Tensor q = Tensor::randn({1, 6, 2, 8}, DType::kF32, fresh_seed()),
         k = Tensor::randn({1, 9, 2, 8}, DType::kF32, fresh_seed()),
         v = Tensor::randn({1, 9, 2, 8}, DType::kF32, fresh_seed());
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (const char* impl : {"native", "composed", "reference"}) {
    SCOPED_TRACE(impl);
    const Tensor want = dot_product_attention(q, k, v, {.implementation = impl});
    const Tensor got = dot_product_attention(
        q, k, v,
        {.local_window_size = std::pair<int64_t, int64_t>{big, big}, .implementation = impl});
    ASSERT_EQ(got.size(), want.size());
    for (int64_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got.get(i), want.get(i), 1e-6) << i;
  }
}

// A scale or soft cap finite as a double but out of f32's range is refused, naming it (1e300
// gave zeros in two implementations and NaN in the third).
TEST(Attention, ScaleAndSoftCapOutsideF32AreRefused) {
  Tensor q = Tensor::randn({1, 2, 1, 8}, DType::kF32, 1);
  for (const double s : {1e300, -1e300, 1e-300}) {
    testing::expect_invalid_argument([&] { dot_product_attention(q, q, q, {.scale = s}); },
                                     "scale = ");
  }
  for (const double cap : {1e300, 1e-300}) {
    testing::expect_invalid_argument(
        [&] { dot_product_attention(q, q, q, {.logits_soft_cap = cap}); }, "logits_soft_cap = ");
  }
  // Zero and ordinary values still run.
  EXPECT_NO_THROW(dot_product_attention(q, q, q, {.scale = 0.0}));
  EXPECT_NO_THROW(dot_product_attention(q, q, q, {.scale = -0.5, .logits_soft_cap = 1e30}));
}

}  // namespace
}  // namespace tokamax::attention_test
