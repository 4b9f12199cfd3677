// ragged_dot's public functions: keys of calls against keys of specs, concurrent callers and
// thread counts, bad input. (The implementations' cases: test_base.h and *_test.cc beside it.)
#include <gtest/gtest.h>

#include <thread>

#include "tests/expect_error.h"
#include "tests/ops/ragged_dot/test_base.h"

namespace tokamax::ragged_dot_test {
namespace {

// Several user threads calling at once share the kernel thread pool; every result must still be
// the reference's (and thread counts 1 and 2 must agree).
TEST(RaggedDot, ConcurrentCallersAndThreadCounts) {
  const std::vector<int32_t> sizes = {40, 0, 25, 3};
  Tensor lhs = Tensor::randn({70, 64}, DType::kF32, fresh_seed());
  Tensor rhs = Tensor::randn({4, 64, 96}, DType::kF32, fresh_seed());
  const Tensor ref = ragged_dot(lhs, rhs, sizes, {.implementation = "reference"});
  std::vector<double> want(static_cast<size_t>(ref.size()));
  for (int64_t i = 0; i < ref.size(); ++i) want[i] = ref.get(i);
  std::vector<Tensor> got(6);
  std::vector<std::thread> callers;
  for (int t = 0; t < 6; ++t) {
    callers.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        got[t] = ragged_dot(lhs, rhs, sizes, {.implementation = t % 2 ? "native" : "blas"});
    });
  }
  for (auto& c : callers) c.join();
  for (int t = 0; t < 6; ++t)
    expect_close(got[t], want, 1e-3, 1e-4, 1e-5, "caller " + std::to_string(t));
  set_num_threads(1);
  const Tensor one = ragged_dot(lhs, rhs, sizes, {.implementation = "native"});
  set_num_threads(0);
  expect_close(one, want, 1e-3, 1e-4, 1e-5, "one thread");
}

// A call's key is the key of its spec: what the public functions bind, bind_json binds the same
// way (the cache and traces depend on it).
TEST(RaggedDot, PublicCallKeyIsItsSpecKey) {
  Tensor lhs = Tensor::randn({6, 8}, DType::kBF16, 1),
         rhs = Tensor::randn({3, 8, 5}, DType::kBF16, 2);
  const std::vector<int32_t> sizes = {2, 0, 3};
  CallRecorder rec;
  ragged_dot(lhs, rhs, sizes, {.activation = Activation::kSilu});
  ragged_dot(lhs, pack_rhs(rhs), sizes, {.preferred_element_type = DType::kF32});
  ragged_dot(lhs, rhs, sizes, {.representative_group_sizes = std::vector<int32_t>{1, 1, 1}});
  const std::vector<BoundArguments> calls = rec.calls();
  ASSERT_EQ(calls.size(), 3u);
  const Json common = {
      {"lhs", "bf16[6,8]"}, {"rhs", "bf16[3,8,5]"}, {"num_threads", num_threads()}};
  auto spec = [&](Json extra) {
    Json j = common;
    j.update(extra);
    return rdot::family().bind_json(j, "").key();
  };
  EXPECT_EQ(calls[0].key(), spec({{"group_sizes", {{"num_groups", 3}, {"total_size", 6}}},
                                  {"activation", "silu"}}));
  EXPECT_EQ(calls[1].key(), spec({{"group_sizes", {{"num_groups", 3}, {"total_size", 6}}},
                                  {"preferred_element_type", "f32"},
                                  {"packed_rhs", true}}));
  EXPECT_EQ(calls[2].key(), spec({{"group_sizes", {1, 1, 1}}}));
  EXPECT_EQ(calls[0].arguments()["preferred_element_type"], "bf16");
  EXPECT_THROW(rdot::family().bind_json(Json{{"lhs", "f32[2,2]"}}, ""), InvalidArgument);
}

// The out-variant writes every element of the caller's buffer (poisoned first, so an element
// it skipped stays NaN), plain and packed, and refuses a wrong, strided or aliasing buffer.
TEST(RaggedDot, IntoWritesTheCallersBuffer) {
  const std::vector<int32_t> sizes = {5, 0, 9};  // 3 rows past the groups: must become zero
  Tensor lhs = Tensor::randn({17, 24}, DType::kF32, fresh_seed());
  Tensor rhs = Tensor::randn({3, 24, 19}, DType::kF32, fresh_seed());
  const Tensor want = ragged_dot(lhs, rhs, sizes, {.implementation = "reference"});
  Tensor out({17, 19}, DType::kF32);
  for (const std::string impl : {"native", "blas", "reference"}) {
    out.poison();
    ragged_dot_into(lhs, rhs, sizes, out, {.implementation = impl});
    for (int64_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out.get(i), want.get(i), 1e-4) << impl;
  }
  out.poison();
  ragged_dot_into(lhs, pack_rhs(rhs), sizes, out);
  for (int64_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out.get(i), want.get(i), 1e-4);
  testing::expect_invalid_argument(
      [&] {
        ragged_dot_into(lhs, rhs, sizes, Tensor({17, 18}, DType::kF32));
      },
      "output 'out' has spec f32[17,18]; expected a contiguous f32[17,19] buffer");
  testing::expect_invalid_argument(
      [&] {
        ragged_dot_into(lhs, rhs, sizes, Tensor({17, 19}, DType::kBF16));
      },
      "bf16[17,19]");
  Tensor wide({17, 38}, DType::kF32);
  testing::expect_invalid_argument(
      [&] {
        ragged_dot_into(lhs, rhs, sizes, TensorView(wide.data(), DType::kF32, {17, 19}, {38, 1}));
      },
      "(not contiguous)");
  testing::expect_invalid_argument(
      [&] {
        ragged_dot_into(lhs, rhs, sizes, TensorView(lhs.data(), DType::kF32, {17, 19}));
      },
      "overlaps input 'lhs'");
}

TEST(RaggedDot, BadInputIsAClearError) {
  Tensor lhs = Tensor::randn({6, 8}, DType::kF32, 1),
         rhs = Tensor::randn({2, 8, 5}, DType::kF32, 2);
  const auto expect_error = [](auto fn, const char* needle) {
    testing::expect_invalid_argument(fn, needle);
  };
  const std::vector<int32_t> ok = {3, 3};
  expect_error(
      [&] {
        ragged_dot(lhs, Tensor::randn({2, 7, 5}, DType::kF32, 3), ok);
      },
      "contraction sizes must match");
  expect_error(
      [&] {
        ragged_dot(lhs, rhs, std::vector<int32_t>{3, 3, 0});
      },
      "group_sizes has length 3");
  expect_error([&] { ragged_dot(lhs, rhs, std::vector<int32_t>{-1, 3}); }, "group_sizes[0] = -1");
  expect_error([&] { ragged_dot(lhs, rhs, std::vector<int32_t>{4, 3}); }, "sum(group_sizes) = 7");
  expect_error([&] { ragged_dot(Tensor::randn({6}, DType::kF32, 1), rhs, ok); }, "rank 2");
  expect_error([&] { ragged_dot(lhs, Tensor::randn({8, 5}, DType::kF32, 1), ok); }, "rank 3");
  expect_error(
      [&] {
        ragged_dot(Tensor::randn({6, 8}, DType::kBF16, 1), rhs, ok);
      },
      "unsupported dtype combination");
  expect_error([&] { ragged_dot(lhs, rhs, ok, {.preferred_element_type = DType::kBF16}); },
               "preferred_element_type");
  expect_error([&] { ragged_dot(lhs, rhs, Tensor::zeros({2}, DType::kI64)); }, "i32[G]");
  TensorView strided(lhs.data(), DType::kF32, {6, 4}, {8, 2});
  expect_error([&] { ragged_dot(strided, rhs, ok); }, "lhs f32[6,4] has strides [8,2]");
  TensorView rows_apart(lhs.data(), DType::kF32, {3, 8}, {16, 1});
  expect_error(
      [&] {
        ragged_dot(rows_apart, rhs, std::vector<int32_t>{1, 1});
      },
      "expected a contiguous");
  TensorView rhs_t(rhs.data(), DType::kF32, {2, 8, 5}, {40, 1, 8});
  expect_error([&] { ragged_dot(lhs, rhs_t, ok); }, "rhs f32[2,8,5] has strides [40,1,8]");
}

}  // namespace
}  // namespace tokamax::ragged_dot_test
