// Tensor storage, views and seeded determinism.
#include "tokamax/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/sanitizers.h"
#include "core/tensor_cache.h"
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

// A large buffer freed goes to the buffer cache and the next Tensor of the same allocation size
// gets it back (huge-page aligned, as allocated), from any thread; another size does not;
// under ASan and MSan the cache is off. Contents of a reused buffer are unspecified: written
// before read, as a fresh one's.
TEST(Tensor, LargeBuffersAreReused) {
  if (const char* mb = std::getenv("TOKAMAX_TENSOR_CACHE_MB"); mb && std::atoll(mb) < 64) {
    GTEST_SKIP() << "TOKAMAX_TENSOR_CACHE_MB=" << mb << " leaves no room for the test's buffers";
  }
  void* first = nullptr;
  {
    Tensor a({int64_t{3} << 20}, DType::kF32);  // 12 MB
    first = a.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 << 20), 0u);
    std::memset(a.data(), 1, a.nbytes());
  }
  Tensor other({int64_t{5} << 20}, DType::kF32);  // another size: a new buffer
  EXPECT_NE(other.data(), first);
  Tensor again({3, int64_t{1} << 20}, DType::kF32);  // same bytes, another shape
  if (kMemorySanitizer) {
    SUCCEED() << "the buffer cache is off under AddressSanitizer";
  } else {
    EXPECT_EQ(again.data(), first);
  }
  // Across threads: a buffer freed on one is taken on another.
  void* from_thread = nullptr;
  std::thread([&] {
    Tensor t({int64_t{7} << 20}, DType::kF32);
    from_thread = t.data();
  }).join();
  Tensor t2({int64_t{7} << 20}, DType::kF32);
  if (!kMemorySanitizer) {
    EXPECT_EQ(t2.data(), from_thread);
  }
}

// TOKAMAX_TENSOR_CACHE_MB: a whole number of megabytes in range, or a clear error.
TEST(Tensor, BufferCacheLimitFromEnvironment) {
  EXPECT_EQ(tensor_cache_limit_mb(nullptr), 256u);
  EXPECT_EQ(tensor_cache_limit_mb(""), 256u);
  EXPECT_EQ(tensor_cache_limit_mb("0"), 0u);
  EXPECT_EQ(tensor_cache_limit_mb("1024"), 1024u);
  for (const char* bad : {"abc", "12MB", "-1", "1048577", "99999999999999999999"}) {
    try {
      tensor_cache_limit_mb(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("TOKAMAX_TENSOR_CACHE_MB='" + std::string(bad)),
                std::string::npos)
          << e.what();
    }
  }
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
