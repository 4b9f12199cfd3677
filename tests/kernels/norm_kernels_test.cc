// The norm row kernels' non-temporal output path (NormKernels `stream`, taken for outputs of at
// least the last-level cache) against their ordinary stores, for every ISA this CPU runs: the
// same bytes, for f32 and bf16 rows of lengths around the vector widths, y aligned to a vector
// and not (where the kernels fall back to ordinary stores), and the backward's parameter sums.
// The values themselves are checked through the op against double precision (ops/norm).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/norm.h"
#include "tests/kernels/kernel_sets.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

namespace k = kernels;

// A 64-byte aligned buffer of `bytes`, filled with a sentinel byte, offset by `offset` bytes.
struct Buffer {
  explicit Buffer(size_t bytes, size_t offset)
      : base(static_cast<char*>(std::aligned_alloc(64, (bytes + offset + 64 + 63) / 64 * 64))),
        p(base + offset),
        size(bytes) {
    std::memset(base, 0x5a, (bytes + offset + 64 + 63) / 64 * 64);
  }
  ~Buffer() { std::free(base); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* base;
  char* p;
  size_t size;
};

TEST(NormKernels, NonTemporalStoresWriteTheSameBytes) {
  for (const k::KernelSet* set : testing::runnable_sets()) {
    const k::NormKernels nk = k::norm_kernels(set->isa);
    for (bool bf16 : {false, true}) {
      const size_t es = bf16 ? 2 : 4;
      for (int64_t n : {1, 3, 8, 16, 33, 64, 4101}) {
        Tensor x = Tensor::randn({n}, bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
        Tensor dy = Tensor::randn({n}, bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
        Tensor scale = Tensor::randn({n}, DType::kF32, fresh_seed());
        Tensor offset = Tensor::randn({n}, DType::kF32, fresh_seed());
        float mean = 0, rstd = 0;
        nk.stats(x.data(), bf16, n, true, 1e-6f, &mean, &rstd);
        for (size_t off : {size_t{0}, es}) {
          SCOPED_TRACE(::testing::Message() << "isa " << static_cast<int>(set->isa) << " bf16 "
                                            << bf16 << " n " << n << " y offset " << off);
          Buffer plain(n * es, off), streamed(n * es, off);
          nk.apply(x.data(), bf16, n, mean, rstd, scale.data_as<float>(), offset.data_as<float>(),
                   plain.p, false);
          nk.apply(x.data(), bf16, n, mean, rstd, scale.data_as<float>(), offset.data_as<float>(),
                   streamed.p, true);
          nk.fence();
          EXPECT_EQ(std::memcmp(plain.base, streamed.base, n * es + off + 64), 0);
          // The written row differs from the sentinel (the kernels wrote it).
          EXPECT_NE(std::memcmp(plain.p, Buffer(n * es, off).p, n * es), 0);

          Buffer dx_plain(n * es, off), dx_streamed(n * es, off);
          std::vector<float> ds_plain(2 * n, 0.0f), ds_streamed(2 * n, 0.0f);
          nk.backward(x.data(), dy.data(), bf16, n, mean, rstd, scale.data_as<float>(), true,
                      dx_plain.p, ds_plain.data(), ds_plain.data() + n, nullptr, nullptr, false);
          nk.backward(x.data(), dy.data(), bf16, n, mean, rstd, scale.data_as<float>(), true,
                      dx_streamed.p, ds_streamed.data(), ds_streamed.data() + n, x.data(),
                      dy.data(), true);
          nk.fence();
          EXPECT_EQ(std::memcmp(dx_plain.base, dx_streamed.base, n * es + off + 64), 0);
          EXPECT_EQ(ds_plain, ds_streamed);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokamax
