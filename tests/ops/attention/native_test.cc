// dot_product_attention's native implementation: the shared cases (test_base.h), and its decode
// sub-blocks.
#include "kernels/microkernels.h"
#include "tests/ops/attention/test_base.h"

namespace tokamax::attention_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, AttentionImpl, Native);

// Decode streams K and V in sub-blocks of block_kv positions (whole panels; the search space
// takes 1 to 8): every size, against the reference, with S ending inside a sub-block and chunks
// of several sub-blocks, and with kv lengths, a window and bf16 ending rows inside them.
TEST(AttentionNative, EveryDecodeSubBlock) {
  const int nr = kernels::best_kernels().nr;
  for (int panels : {1, 2, 4, 8}) {
    const Config cfg = Config::make(AttentionNativeConfig{1, panels * nr});
    Case d{2, 1, 300, 16, 8, 128, 128};
    check_case("native", d, cfg);
    d.kv_lengths = true;
    d.window = std::pair<int64_t, int64_t>{170, 0};
    d.dtype = DType::kBF16;
    check_case("native", d, cfg);
  }
}

// Decode's q k^T takes every kv head position by position where the kernels allow (the bf16
// dot's when its rounded q fits kDotHeadsMaxValues) and head by head otherwise: both sides of
// that bound, f32 and bf16, head dims off the vector width, a sub-block shorter than S.
TEST(AttentionNative, DecodeHeadsAtOnceAndOneByOne) {
  const int nr = kernels::best_kernels().nr;
  const Config cfg = Config::make(AttentionNativeConfig{1, 2 * nr});
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    // 8 kv heads x 8 rows x 160 (rounded up to 32s): 10240 values, past the bound; 8 x 2 x 72
    // (96): within it.
    for (const auto& [n, h] : {std::pair<int64_t, int64_t>{64, 150}, {16, 72}}) {
      Case d{1, 1, 3 * nr + 5, n, 8, h, h - 1};
      d.dtype = dtype;
      check_case("native", d, cfg);
    }
  }
}

// Decode with no key head dim (H = 0: every logit 0, a uniform softmax over the positions; q k^T
// runs no K steps while it prefetches the first sub-block's V rows), f32 and bf16.
TEST(AttentionNative, DecodeWithoutKeyDims) {
  const int nr = kernels::best_kernels().nr;
  const Config cfg = Config::make(AttentionNativeConfig{1, 2 * nr});
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Case d{1, 1, 3 * nr + 5, 16, 8, 0, 24};
    d.dtype = dtype;
    d.scale = 1.0;  // (the default 1 / sqrt(H) has no value at H = 0)
    check_case("native", d, cfg);
  }
}

// The decode specs' search space: every sub-block the kernels stream (1, 2, 4 and 8 panels of
// positions) at block_q 1 (T = 1 once left the tuner nothing but the heuristics config).
TEST(AttentionNative, DecodeSearchSpaceHasEverySubBlock) {
  const kernels::KernelSet& ks = kernels::best_kernels();
  // (Without the streaming kernels, TOKAMAX_ISA=portable, decode runs the packed path and its
  // search space is the prefill one.)
  if (!ks.stream_acc || !ks.stream_t) GTEST_SKIP() << ks.name << " has no streaming kernels";
  const int nr = ks.nr;
  const OpFamily& fam = find_family("dot_product_attention");
  for (const char* spec : {"decode", "decode_bf16"}) {
    const auto call =
        fam.make_call(fam.bind_json(find_arg_specs(fam.name(), spec).at(0).arguments, "native"), 2);
    std::vector<int> blocks;
    for (const Config& c : fam.implementation("native")->autotuning_configs(*call)) {
      EXPECT_EQ(c.get<AttentionNativeConfig>().block_q, 1) << spec;
      blocks.push_back(c.get<AttentionNativeConfig>().block_kv);
    }
    EXPECT_EQ(blocks, (std::vector<int>{nr, 2 * nr, 4 * nr, 8 * nr})) << spec;
  }
}

}  // namespace tokamax::attention_test
