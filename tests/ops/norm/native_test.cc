// layer_norm's native implementation: the shared cases (test_base.h), and rows long enough for
// the forward's column chunks under every rows_per_item (and the backward under each).
#include <cstring>
#include <functional>

#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, LayerNormImpl, Native);

// Rows longer than a forward chunk (4 KiB of x, ops/norm/native.cc) and not a whole number of
// chunks or vectors, row counts that leave a short last block of 4, f32 and bf16, layer and rms
// norm; fn(case, its inputs, options set to "native") per case.
void for_each_long_row_case(
    const std::function<void(const Case&, const Inputs&, LayerNormOptions)>& fn) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (Shape shape : {Shape{7, 2500}, Shape{5, 4100}, Shape{9, 1024}}) {
      for (bool rms : {false, true}) {
        Case c{shape};
        c.dtype = dt;
        c.rms = rms;
        c.offset = !rms;
        const Inputs in = make_inputs(c);
        LayerNormOptions o = in.options;
        o.implementation = "native";
        fn(c, in, o);
      }
    }
  }
}

// Items of 1 row to more than all of them.
constexpr int kRowsPerItem[] = {1, 3, 4, 5, 256};

// Every config writes the same bits (each element's arithmetic does not depend on the blocks,
// chunks or items), and the first one is checked against the reference (the shared cases check
// the reference against doubles).
TEST(LayerNormNative, ChunkedRowsAreTheSameUnderEveryConfig) {
  for_each_long_row_case([](const Case& c, const Inputs& in, LayerNormOptions o) {
    LayerNormOptions r = o;
    r.implementation = "reference";
    const LayerNormResult ref = layer_norm_with_residuals(in.x, in.s(), in.o(), r);
    Tensor first;
    for (int rpi : kRowsPerItem) {
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
  });
}

// The backward over the same rows: dx is the same bits under every config (each row's arithmetic
// does not depend on the items); dscale and doffset sum in f32 per item (rows_per_item moves
// their rounding), so they are checked against the reference under each config.
TEST(LayerNormNative, BackwardUnderEveryConfig) {
  for_each_long_row_case([](const Case& c, const Inputs& in, LayerNormOptions o) {
    LayerNormOptions r = o;
    r.implementation = "reference";
    const LayerNormResult fwd = layer_norm_with_residuals(in.x, in.s(), in.o(), r);
    const Tensor dy = Tensor::randn(c.shape, c.dtype, fresh_seed());
    const LayerNormGrads ref = layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, r);
    const Tolerance tol = vjp_tolerance(c, in, fwd, dy);
    Tensor first;
    for (int rpi : kRowsPerItem) {
      const std::string what = c.str() + " backward rows_per_item " + std::to_string(rpi);
      o.config = Config::make(LayerNormNativeConfig{rpi});
      const LayerNormGrads got = layer_norm_vjp(in.x, in.s(), in.o(), fwd.mean, fwd.rstd, dy, o);
      expect_close(got.dscale, values(ref.dscale), tol, "dscale " + what);
      if (c.offset) expect_close(got.doffset, values(ref.doffset), tol, "doffset " + what);
      if (first.rank() == 0) {
        expect_close(got.dx, values(ref.dx), tol, "dx " + what);
        first = got.dx.clone();
      } else {
        ASSERT_EQ(std::memcmp(first.data(), got.dx.data(), got.dx.nbytes()), 0) << what;
      }
    }
  });
}

}  // namespace tokamax::norm_test
