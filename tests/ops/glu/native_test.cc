// gated_linear_unit's native implementation: the shared cases (test_base.h), and the grouped
// GEMM's strips of the caller's weights (gate and up panels packed in pairs as the GEMM goes).
#include "kernels/microkernels.h"
#include "tests/ops/glu/test_base.h"

namespace tokamax::glu_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, GluImpl, Native);

// With 2 threads, unpacked weights are packed a strip of gate-up panel pairs at a time where
// the threads share the strips (rows >= 2 threads x mc), else packed whole first: several
// strips, one, strips narrowed to the 8 MiB cap (K = 3000: 699 columns fit, an odd number of
// panels when rounded to one panel), fewer rows, N off the panel width, stacked and separate
// weights, f32 and bf16. Each against the reference and bit for bit against the same config on
// the weights packed ahead (the same products in the same order).
TEST(GluNative, StripsOfGateUpPanelPairs) {
  const int threads_before = num_threads();
  set_num_threads(2);
  const int nr = kernels::best_kernels().nr;
  for (const auto& [rows, k, n, mr, mc, nc] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int, int, int>>{
           {300, 70, 150, 4, 8, 2 * nr},  // shared strips, several of them
           {300, 33, 97, 4, 12, 4 * nr},  // shared, row blocks off mc
           {300, 70, 20, 4, 8, 2 * nr},   // shared, one strip
           {40, 70, 150, 4, 12, 6 * nr},  // fewer rows: packed whole
           {23, 16, 3 * nr + 5, 2, 8, 2 * nr},
           {100, 3000, 400, 4, 8, 704},  // shared strips narrowed to the cap
           {40, 3000, 400, 4, 12, 704}}) {
    for (DType w_dtype : {DType::kF32, DType::kBF16}) {
      for (bool separate : {false, true}) {
        Case c{{rows}, k, n};
        c.w_dtype = w_dtype;
        c.separate = separate;
        const Inputs in = make_inputs(c);
        GluOptions o;
        o.activation = c.act;
        o.implementation = "native";
        o.config = Config::make(GluNativeConfig{mr, mc, 32, nc});
        const Tensor got = separate ? gated_linear_unit(in.x, in.gate, in.up, o)
                                    : gated_linear_unit(in.x, in.w, o);
        const std::string what = c.str() + " mr " + std::to_string(mr) + " mc " +
                                 std::to_string(mc) + " nc " + std::to_string(nc);
        const Tensor packed = gated_linear_unit(in.x, pack_glu_weights(in.w), o);
        ASSERT_EQ(std::memcmp(got.data(), packed.data(), got.nbytes()), 0) << "vs packed " << what;
        const Tensor ref =
            run_forward("reference", Case{c.x_lead, k, n, c.act, c.x_dtype, w_dtype}, in);
        expect_close(got, values(ref), glu::family().tolerance_of(bound_call(in)), what);
      }
    }
  }
  set_num_threads(threads_before);
}

}  // namespace tokamax::glu_test
