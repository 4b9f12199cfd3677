// layer_norm's native implementation: the shared cases (test_base.h), and rows long enough for
// the forward's column chunks under every rows_per_item.
#include <cstring>

#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, LayerNormImpl, Native);

// The forward takes rows in blocks of a few and each block in column chunks of 4 KiB of x
// (ops/norm/native.cc): rows longer than a chunk and not a whole number of chunks or vectors,
// row counts that leave a short last block, and items of 1 row to more than all of them. Every
// config writes the same bits (each element's arithmetic does not depend on the blocking), and
// the first one is checked against the reference (the shared cases check it against doubles).
TEST(LayerNormNative, ChunkedRowsAreTheSameUnderEveryConfig) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (Shape shape : {Shape{7, 2500}, Shape{5, 4100}, Shape{9, 1024}}) {
      for (bool rms : {false, true}) {
        Case c{shape};
        c.dtype = dt;
        c.rms = rms;
        c.offset = !rms;
        const Inputs in = make_inputs(c);
        LayerNormOptions o = in.options;
        o.implementation = "reference";
        const LayerNormResult ref = layer_norm_with_residuals(in.x, in.s(), in.o(), o);
        o.implementation = "native";
        Tensor first;
        for (int rpi : {1, 3, 4, 5, 256}) {
          const std::string what = c.str() + " rows_per_item " + std::to_string(rpi);
          o.config = Config::make(LayerNormNativeConfig{rpi});
          const LayerNormResult got = layer_norm_with_residuals(in.x, in.s(), in.o(), o);
          if (first.rank() == 0) {
            expect_close(got.y, values(ref.y), family().tolerance_of(bound_call(c, in)), what);
            expect_close(got.mean, values(ref.mean), {1e-6, 1e-6, 0}, "mean " + what);
            expect_close(got.rstd, values(ref.rstd), {0, 1e-4, 0}, "rstd " + what);
            first = got.y.clone();
          } else {
            ASSERT_EQ(std::memcmp(first.data(), got.y.data(), got.y.nbytes()), 0) << what;
          }
        }
      }
    }
  }
}

}  // namespace tokamax::norm_test
