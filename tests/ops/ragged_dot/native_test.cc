// ragged_dot's native implementation: the shared cases (test_base.h), and its own:
// pre-packed weights on every ISA, the decode (streaming) paths, shared strips, allocation,
// every config of its search space and explicit configs at the kernels' edges.
#include <cmath>
#include <vector>

#include "autotuning/roofline_kernels.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "tests/ops/ragged_dot/test_base.h"

namespace tokamax::ragged_dot_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, RaggedDotImpl, Native);

TEST(RaggedDotNative, PackedWeightsAndAllIsas) {
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs}) {
    check_case("native", {DType::kF32, DType::kF32, {}, d, 70, 90, {30, 0, 11}, 2}, true);
    check_case("native", {DType::kF32, DType::kBF16, {}, d, 70, 90, {30, 0, 11}, 2}, true);
    check_case("native", {DType::kBF16, DType::kBF16, {}, d, 71, 33, {3, 0, 11}, 0}, true);
  }
  // The portable and AVX2 kernels directly (best_kernels() is chosen once per process).
  namespace k = kernels;
  for (const k::KernelSet* ks : {&k::portable_kernels(), k::avx2_kernels(), k::avx512_kernels()}) {
    if (ks->isa == k::Isa::kAvx2 && !device_info().isa.has_avx2_fma()) continue;
    if (ks->isa == k::Isa::kAvx512 && !device_info().isa.has_avx512_bf16()) continue;
    const int64_t K = 21, nr = ks->nr;
    for (int mr = 1; mr <= ks->max_mr; ++mr) {
      Tensor a = Tensor::randn({mr, K}, DType::kF32, fresh_seed());
      Tensor b = Tensor::randn({K, nr}, DType::kF32, fresh_seed());
      Tensor bp({K * nr}, DType::kF32);
      k::pack_panels_f32(b.data(), false, false, K, nr, ks->nr, bp.data_as<float>(), 0, 1);
      Tensor c = Tensor::zeros({mr, nr}, DType::kF32);
      // With a range to prefetch (A's rows K apart: the AVX-512 tile's run-time stride, which
      // issues it at its start; microkernels_test covers the spread form).
      const k::L2Ahead ahead{static_cast<const char*>(b.data()), K * nr * 4};
      ks->f32(mr, K, a.data_as<float>(), K, 1, bp.data_as<float>(), c.data_as<float>(), nr, false,
              ahead);
      for (int i = 0; i < mr; ++i) {
        for (int64_t j = 0; j < nr; ++j) {
          double s = 0;
          for (int64_t kk = 0; kk < K; ++kk) s += a.get(i * K + kk) * b.get(kk * nr + j);
          ASSERT_NEAR(c.get(i * nr + j), s, 1e-4) << ks->name << " mr=" << mr;
        }
      }
    }
  }
}

// The bf16 pair kernels directly: the AVX-512 vdpbf16ps one (tiles of mr rows) and, where the
// CPU has AMX, the tile one (a whole row block, rows padded to 16), against double-precision
// sums of the bf16-rounded inputs; K with and without a partial last step (odd, below and above
// 32 pairs), overwriting and accumulating into C.
TEST(RaggedDotNative, Bf16KernelsEveryIsa) {
  namespace k = kernels;
  std::vector<const k::KernelSet*> sets;
  if (device_info().isa.has_avx512_bf16()) sets.push_back(k::avx512_kernels());
  if (device_info().isa.has_avx512_bf16() && device_info().isa.amx_bf16 && k::amx_kernels())
    sets.push_back(k::amx_kernels());
  if (sets.empty()) GTEST_SKIP() << "no bf16 dot on this CPU";
  for (const k::KernelSet* ks : sets) {
    // The roofline's AMX loop between kernel calls on one thread (tokamax bench measures its
    // ceilings between rows) must leave the tiles as the kernels configured them.
    if (ks->amx) {
      alignas(64) uint32_t z[16 * 32] = {};
      alignas(64) float cz[16 * 32];
      ks->bf16(1, 16, z, 16, z, cz, 32, false);  // this thread's tiles configured
      roofline::dot_bf16_amx(16);
    }
    const int nr = ks->nr;
    for (int64_t K : {int64_t{1}, int64_t{21}, int64_t{64}, int64_t{95}, int64_t{300}}) {
      const int64_t kp = (K + 1) / 2;
      for (int rows : {1, 5, 12, 16, 17, 32, 40}) {
        if (!ks->amx && rows > ks->max_mr) continue;
        const int64_t th = ks->amx ? k::round_up(rows, k::kAmxRows) : rows;
        Tensor a = Tensor::randn({rows, K}, DType::kBF16, fresh_seed());
        Tensor b = Tensor::randn({K, nr}, DType::kBF16, fresh_seed());
        // Panels are 64-byte aligned (the vector kernels' aligned loads): a Tensor's storage is.
        std::vector<uint32_t> ap(th * kp);
        Tensor bt({kp * nr}, DType::kF32);
        uint32_t* bp = static_cast<uint32_t*>(bt.data());
        ks->pack_a_bf16(a.data(), true, K, rows, 0, K, th, ap.data());
        k::pack_panels_bf16(b.data(), true, false, K, nr, nr, bp, 0, 1);
        std::vector<float> c(th * nr);
        for (bool acc : {false, true}) {
          for (size_t i = 0; i < c.size(); ++i) c[i] = acc ? 0.5f * static_cast<float>(i % 7) : -1;
          const std::vector<float> before = c;
          ks->bf16(rows, kp, ap.data(), th, bp, c.data(), nr, acc);
          for (int i = 0; i < rows; ++i) {
            for (int j = 0; j < nr; ++j) {
              double want = acc ? before[i * nr + j] : 0.0;
              for (int64_t kk = 0; kk < K; ++kk) want += a.get(i * K + kk) * b.get(kk * nr + j);
              ASSERT_NEAR(c[i * nr + j], want, 1e-4 * (1 + std::sqrt(static_cast<double>(K))))
                  << ks->name << " K=" << K << " rows=" << rows << " acc=" << acc << " at " << i
                  << "," << j;
            }
          }
        }
      }
    }
  }
}

// Code outside the library may release the AMX tiles between two of our calls on one thread
// (torch's bf16 matmul does, after its own tile kernels); the next bf16 call must configure them
// again rather than fault with SIGILL. Run on the test's thread, single-threaded, so that the
// call that follows the release is on the same thread.
TEST(RaggedDotNative, Bf16CallAfterForeignTileReleaseOnTheSameThread) {
  if (!(device_info().isa.amx_bf16 && kernels::amx_kernels() &&
        &kernels::best_kernels() == kernels::amx_kernels())) {
    GTEST_SKIP() << "the AMX kernels do not serve on this CPU";
  }
  const int threads = num_threads();
  set_num_threads(1);
  Tensor lhs = Tensor::randn({40, 64}, DType::kBF16, fresh_seed());
  Tensor rhs = Tensor::randn({2, 64, 48}, DType::kBF16, fresh_seed());
  const std::vector<int32_t> sizes = {25, 15};
  const RaggedDotOptions o{.preferred_element_type = DType::kF32, .implementation = "native"};
  const Tensor want = ragged_dot(
      lhs, rhs, sizes, {.preferred_element_type = DType::kF32, .implementation = "reference"});
  for (int rep = 0; rep < 3; ++rep) {
    const Tensor got = ragged_dot(lhs, rhs, sizes, o);
    for (int64_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got.get(i), want.get(i), 1e-3);
    kernels::amx_release_tiles();
  }
  set_num_threads(threads);
}

// Groups of 1-5 rows with many panels: the weight-streaming (multi-panel) kernels for every row
// count they take (1-4), a whole number of their panel groups and a tail, the regular kernel
// beyond, in f32 and with bf16 weights, packed and not.
TEST(RaggedDotNative, DecodeShapesStreamManyPanels) {
  // Unpacked, groups of up to kStreamMaxMr rows stream the weights from their own layout (both
  // forms), larger ones pack a strip per item: every path against the reference.
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs}) {
    for (DType rhs : {DType::kF32, DType::kBF16}) {
      for (int64_t N : {int64_t{128}, int64_t{7 * 32 + 5}}) {
        const Case c{DType::kF32, rhs, {}, d, 133, N, {1, 2, 0, 3, 4, 5, 1, 8, 9, 17}, 1};
        check_case("native", c, false);
        check_case("native", c, true);
      }
    }
  }
}

// The plain call on unpacked weights packs nothing of the size of the weights: once the
// per-thread buffers have grown (first call), a call allocates its output and, where the lhs is
// rounded or widened, one copy of the lhs; nothing else (scratch_bytes' buffers excepted). pack_rhs
// is the contrast: it allocates the whole packed rhs, so the counter is seen to count.
TEST(RaggedDotNative, UnpackedCallAllocatesOnlyOutputAndLhsCopy) {
  const int64_t K = 384, N = 512;
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs}) {
    const bool trans = d == RaggedDimNums::kTransposedRhs;
    for (DType rd : {DType::kF32, DType::kBF16}) {
      for (int32_t rows : {1, 3, 64, 300}) {  // streamed, strip per item, shared strip
        const std::vector<int32_t> sizes(8, rows);
        const int64_t M = 8 * rows;
        Tensor lhs = Tensor::randn({M, K}, DType::kF32, fresh_seed());
        Tensor rhs = Tensor::randn(trans ? Shape{8, N, K} : Shape{8, K, N}, rd, fresh_seed());
        const RaggedDotOptions o{.implementation = "native"};
        const Tensor first = ragged_dot_general(lhs, rhs, sizes, d, o);
        // A pool thread that got no item in earlier calls grows its two buffers in a later one:
        // of 2 * threads + 1 calls at least one allocates nothing but the call's own tensors.
        int64_t least_count = INT64_MAX, least_bytes = INT64_MAX;
        Tensor out;
        for (int call = 0; call < 2 * num_threads() + 1; ++call) {
          const TensorAllocations before = tensor_allocations();
          out = ragged_dot_general(lhs, rhs, sizes, d, o);
          const TensorAllocations after = tensor_allocations();
          least_count = std::min(least_count, after.count - before.count);
          least_bytes = std::min(least_bytes, after.bytes - before.bytes);
        }
        const std::string what = std::string(trans ? "transposed " : "forward ") +
                                 std::string(dtype_name(rd)) + " rows=" + std::to_string(rows);
        EXPECT_LE(least_count, 2) << what;
        EXPECT_LE(least_bytes, static_cast<int64_t>(out.nbytes()) + M * K * 4) << what;
        for (int64_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.get(i), first.get(i)) << what;
        const TensorAllocations pack_before = tensor_allocations();
        const PackedRhs packed = pack_rhs(rhs, d);
        EXPECT_GE(tensor_allocations().bytes - pack_before.bytes,
                  static_cast<int64_t>(8 * K * N * (rd == DType::kF32 ? 4 : 2)))
            << what;
      }
    }
  }
}

TEST(RaggedDotNative, SharedStripGroupsMixedWithOthers) {
  // Unpacked, groups tall enough for every thread (>= 2 * threads * mc rows) share one packed
  // strip at a time; beside them empty, streamed and per-item-strip groups, both forms and
  // weight dtypes, columns not a multiple of the panel width.
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs}) {
    for (DType rhs : {DType::kF32, DType::kBF16}) {
      const Case c{DType::kF32, rhs, {}, d, 70, 7 * 32 + 5, {300, 0, 3, 141, 40, 1}, 1};
      check_case("native", c, false);
    }
  }
}

TEST(RaggedDotNative, VectorBf16PackingMatchesScalar) {
  namespace k = kernels;
  if (!device_info().isa.has_avx512_bf16()) GTEST_SKIP() << "needs AVX-512 BF16";
  // Row counts and strides (as) within one group of 16, across groups, with a partial last
  // group and with rows < as (padding rows must come out zero).
  const std::pair<int64_t, int64_t> shapes[] = {{5, 8},   {1, 1},   {14, 14}, {16, 16},
                                                {17, 20}, {30, 32}, {84, 84}, {40, 96}};
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const bool bf16 = dt == DType::kBF16;
    for (const auto& [rows, as] : shapes) {
      for (int64_t kc : {1, 2, 15, 16, 17, 31, 32, 33, 64, 77}) {
        const int64_t lda = 80, kp = (kc + 1) / 2;
        Tensor a = Tensor::randn({rows * lda}, dt, fresh_seed());
        // One element past dst on either side: the packer writes [0, kp * as) only.
        std::vector<uint32_t> want(static_cast<size_t>(kp * as + 2), 7),
            got(static_cast<size_t>(kp * as + 2), 7);
        k::pack_a_bf16(a.data(), bf16, lda, rows, 3, kc, as, want.data() + 1);
        k::avx512_kernels()->pack_a_bf16(a.data(), bf16, lda, rows, 3, kc, as, got.data() + 1);
        EXPECT_EQ(got, want) << dtype_name(dt) << " rows=" << rows << " as=" << as << " kc=" << kc;
      }
    }
  }
}

TEST(RaggedDotNative, EveryConfigOfTheSearchSpaceIsCorrect) {
  const auto& fam = rdot::family();
  for (const char* spec : {"smoke_f32", "smoke_bf16_weights", "smoke_decode"}) {
    const BoundArguments b =
        fam.bind_json(find_arg_specs("ragged_dot", spec)[0].arguments, "native");
    AutotuneOptions o;
    o.rounds.first_rounds = 1;
    o.rounds.max_rounds = 1;
    o.sample_min_ms = 0;
    o.seed = fresh_seed();
    const AutotuningData d = Autotuner(o).tune(b);
    EXPECT_GE(d.entries().size(), 3u) << spec;
    for (const auto& [k, e] : d.entries())
      EXPECT_TRUE(e.benchmark) << spec << " " << k << ": " << e.failure->message;
  }
}

// Explicit configs around the kernels' edges: tiles taller or shorter than the groups, the
// weight-streaming kernels (<= 4 rows), K blocks of 2, items narrower than the output.
TEST(RaggedDotNative, ExplicitConfigsAgreeWithReference) {
  const int max_mr = kernels::best_kernels().max_mr, nr = kernels::best_kernels().nr;
  const std::vector<int32_t> sizes = {1, 2, 3, 4, 5, 0, 9};
  const int64_t M = 26, K = 70, N = 7 * nr + 5;
  for (DType rd : {DType::kF32, DType::kBF16}) {
    Tensor lhs = Tensor::randn({M, K}, DType::kF32, fresh_seed());
    Tensor rhs = Tensor::randn({7, K, N}, rd, fresh_seed());
    const Tensor ref = ragged_dot(lhs, rhs, sizes, {.implementation = "reference"});
    for (int mr : {1, 2, 3, 4, max_mr}) {
      for (int mcf : {1, 3}) {
        for (int kc : {2, 64, 256}) {
          for (int nc : {nr, 2 * nr, 8 * nr}) {
            const RaggedDotNativeConfig cfg{mr, mr * mcf, kc, nc};
            const Tensor got = ragged_dot(
                lhs, rhs, sizes, {.implementation = "native", .config = Config::make(cfg)});
            std::vector<double> want(static_cast<size_t>(ref.size()));
            for (int64_t i = 0; i < ref.size(); ++i) want[i] = ref.get(i);
            expect_close(got, want, rd == DType::kBF16 ? 1e-2 : 1e-3,
                         rd == DType::kBF16 ? 5e-3 : 1e-4, 0,
                         canonical_dump(cfg.to_json()) + " rhs " + std::string(dtype_name(rd)));
          }
        }
      }
    }
  }
  EXPECT_THROW(ragged_dot(Tensor::randn({2, 4}, DType::kF32, 1),
                          Tensor::randn({1, 4, 4}, DType::kF32, 1), std::vector<int32_t>{2},
                          {.implementation = "native",
                           .config = Config::make(RaggedDotNativeConfig{3, 4, 8, nr})}),
               InvalidArgument);  // mc not a multiple of mr
}

}  // namespace tokamax::ragged_dot_test
