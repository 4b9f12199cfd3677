// Tensor storage, views and seeded determinism.
#include "tokamax/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "tokamax/core/error.h"
#include "tokamax/core/json.h"

namespace tokamax {
namespace {

uint64_t fingerprint(const Tensor& t) {
  return hash64(std::string_view(static_cast<const char*>(t.data()), t.nbytes()));
}

TEST(Tensor, AlignmentAndEmpty) {
  for (int64_t n : {0, 1, 3, 17, 1000}) {
    Tensor t({n}, DType::kBF16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
    EXPECT_EQ(t.nbytes(), static_cast<size_t>(2 * n));
  }
  EXPECT_THROW(Tensor({-1}, DType::kF32), InvalidArgument);
}

TEST(Tensor, MoveOnly) {
  static_assert(!std::is_copy_constructible_v<Tensor>);
  Tensor a = Tensor::full({4}, DType::kF32, 2.5);
  void* p = a.data();
  Tensor b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.get(3), 2.5);
  Tensor c = b.clone();
  EXPECT_NE(c.data(), b.data());
  EXPECT_EQ(c.get(0), 2.5);
}

TEST(Tensor, SeededDeterminism) {
  Tensor a = Tensor::randn({257}, DType::kF32, 7), b = Tensor::randn({257}, DType::kF32, 7);
  Tensor c = Tensor::randn({257}, DType::kF32, 8);
  EXPECT_EQ(fingerprint(a), fingerprint(b));
  EXPECT_NE(fingerprint(a), fingerprint(c));
  // A prefix of a larger tensor has the same values (counter-based generator).
  Tensor big = Tensor::randn({1000}, DType::kF32, 7);
  for (int i = 0; i < 257; ++i) EXPECT_EQ(big.get(i), a.get(i));
  // Roughly standard normal.
  Tensor n = Tensor::randn({20000}, DType::kF64, 1);
  double mean = 0, var = 0;
  for (int i = 0; i < 20000; ++i) mean += n.get(i) / 20000;
  for (int i = 0; i < 20000; ++i) var += (n.get(i) - mean) * (n.get(i) - mean) / 20000;
  EXPECT_NEAR(mean, 0, 0.05);
  EXPECT_NEAR(var, 1, 0.05);
  Tensor u = Tensor::uniform({1000}, DType::kF32, 3, -2, 5);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_GE(u.get(i), -2);
    EXPECT_LT(u.get(i), 5);
  }
}

TEST(Tensor, PoisonAndViews) {
  Tensor t = Tensor::zeros({2, 3}, DType::kBF16);
  t.poison();
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(std::isnan(t.get(i)));
  Tensor f = Tensor::zeros({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) f.view().set(i, i);
  // A transposed (strided) view.
  TensorView tv(f.data(), DType::kF32, {3, 2}, {1, 3});
  EXPECT_FALSE(tv.is_contiguous());
  EXPECT_EQ(tv.get(1), 3);  // element [0,1] = f[1,0]
  EXPECT_THROW(TensorView(f.data(), DType::kF32, {3, 2}, {1}), InvalidArgument);
}

}  // namespace
}  // namespace tokamax
