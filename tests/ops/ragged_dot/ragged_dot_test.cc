// ragged_dot: every implementation against the reference, the reference against a double-
// precision computation; dtypes, the three dimension-number forms, empty groups (all 2^8
// patterns), edge sizes, activations, packed weights, the VJP and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "ops/ragged_dot/base.h"
#include "kernels/microkernels.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

// Double-precision ragged_dot on the operands as the call sees them (lhs rounded when the
// precision says so), activation applied.
std::vector<double> f64_ragged_dot(const TensorView& lhs, const TensorView& rhs,
                                   const std::vector<int32_t>& sizes, RaggedDimNums dims,
                                   Activation act, bool round_lhs) {
  const int64_t M = lhs.dim(0), K = lhs.dim(1), G = static_cast<int64_t>(sizes.size());
  auto a = [&](int64_t i, int64_t k) {
    const double v = lhs.get(i * K + k);
    return round_lhs ? static_cast<double>(bf16_to_f32(f32_to_bf16(static_cast<float>(v)))) : v;
  };
  auto actf = [&](double x) {
    return static_cast<double>(rdot::apply_activation(act, static_cast<float>(x)));
  };
  std::vector<double> out;
  if (dims == RaggedDimNums::kRaggedContracting) {
    const int64_t N = rhs.dim(1);
    out.assign(G * K * N, 0.0);
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t r = r0; r < r0 + sizes[g]; ++r) s += a(r, k) * rhs.get(r * N + n);
          out[(g * K + k) * N + n] = actf(s);
        }
      }
      r0 += sizes[g];
    }
    return out;
  }
  const bool trans = dims == RaggedDimNums::kTransposedRhs;
  const int64_t N = trans ? rhs.dim(1) : rhs.dim(2);
  out.assign(M * N, 0.0);
  int64_t r0 = 0;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = r0; r < r0 + sizes[g]; ++r) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += a(r, k) * rhs.get(g * K * N + (trans ? n * K + k : k * N + n));
        out[r * N + n] = actf(s);
      }
    }
    r0 += sizes[g];
  }
  return out;
}

void expect_close(const Tensor& got, const std::vector<double>& want, double atol, double rtol,
                  double normwise, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.size()), want.size()) << what;
  double e2 = 0, r2 = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.get(i), w = want[i];
    ASSERT_FALSE(std::isnan(g)) << what << " NaN at " << i;
    e2 += (g - w) * (g - w);
    r2 += w * w;
    if (std::abs(g - w) > atol + rtol * std::abs(w) && bad++ < 3) {
      ADD_FAILURE() << what << ": element " << i << " got " << g << " want " << w;
    }
  }
  if (normwise > 0 && r2 > 0) {
    EXPECT_LE(std::sqrt(e2 / r2), normwise) << what;
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Case {
  DType lhs, rhs;
  std::optional<DType> out;
  RaggedDimNums dims;
  int64_t K, N;
  std::vector<int32_t> sizes;
  int64_t extra_rows = 0;
  Activation act = Activation::kNone;
  Precision precision = Precision::kDefault;
};

std::string describe(const Case& c) {
  std::string s = std::string(dtype_name(c.lhs)) + "x" + std::string(dtype_name(c.rhs)) + " " +
                  std::string(dim_nums_name(c.dims)) + " K=" + std::to_string(c.K) +
                  " N=" + std::to_string(c.N) + " act=" + std::string(activation_name(c.act)) +
                  " sizes=";
  for (int32_t x : c.sizes) s += std::to_string(x) + ",";
  return s;
}

// Runs one case through `impl`; checks against the reference and the double computation.
void check_case(const std::string& impl, const Case& c, bool packed = false) {
  int64_t M = c.extra_rows;
  for (int32_t s : c.sizes) M += s;
  const int64_t G = static_cast<int64_t>(c.sizes.size());
  const uint64_t seed = fresh_seed();
  Tensor lhs = Tensor::randn({M, c.K}, c.lhs, seed);
  Shape rs = c.dims == RaggedDimNums::kForward         ? Shape{G, c.K, c.N}
             : c.dims == RaggedDimNums::kTransposedRhs ? Shape{G, c.N, c.K}
                                                       : Shape{M, c.N};
  Tensor rhs = Tensor::randn(rs, c.rhs, seed + 1);
  RaggedDotOptions o;
  o.preferred_element_type = c.out;
  o.activation = c.act;
  o.precision = c.precision;
  o.implementation = impl;
  Tensor got = packed ? ragged_dot(lhs, pack_rhs(rhs, c.dims, c.precision), c.sizes, o)
                      : ragged_dot_general(lhs, rhs, c.sizes, c.dims, o);
  o.implementation = "reference";
  Tensor ref = ragged_dot_general(lhs, rhs, c.sizes, c.dims, o);
  const bool round =
      c.lhs == DType::kBF16 || (c.rhs == DType::kBF16 && c.precision == Precision::kDefault);
  const std::vector<double> f64 = f64_ragged_dot(lhs, rhs, c.sizes, c.dims, c.act, round);
  const bool bf16 = c.lhs == DType::kBF16 || c.rhs == DType::kBF16 || got.dtype() == DType::kBF16;
  const double depth = std::sqrt(static_cast<double>(
      std::max<int64_t>(c.dims == RaggedDimNums::kRaggedContracting ? M : c.K, 1)));
  const std::string what = impl + (packed ? " packed " : " ") + describe(c);
  // The reference against double precision: f32 accumulation error only (plus output rounding).
  if (got.dtype() == DType::kBF16) {
    expect_close(ref, f64, 1e-2, 5e-3, 0, "reference " + what);
  } else {
    expect_close(ref, f64, 1e-5 * depth, 1e-5, 1e-5, "reference " + what);
  }
  std::vector<double> refd(static_cast<size_t>(ref.size()));
  for (int64_t i = 0; i < ref.size(); ++i) refd[i] = ref.get(i);
  if (bf16) {
    // As Family::tolerance: a bf16 output may round one ulp apart from the reference's.
    const double rtol = got.dtype() == DType::kBF16 ? 5e-3 + rdot::kBf16OutputUlp : 5e-3;
    expect_close(got, refd, 1e-2, rtol, 0, what);
  } else {
    expect_close(got, refd, 1e-4 * depth, 1e-4, 1e-5, what);
  }
}

class RaggedDot : public ::testing::TestWithParam<std::string> {};

TEST_P(RaggedDot, DtypesAndForms) {
  for (RaggedDimNums d : {RaggedDimNums::kForward, RaggedDimNums::kTransposedRhs,
                          RaggedDimNums::kRaggedContracting}) {
    check_case(GetParam(), {DType::kF32, DType::kF32, {}, d, 37, 45, {5, 0, 13, 2}, 3});
    check_case(GetParam(), {DType::kBF16, DType::kBF16, {}, d, 64, 33, {7, 9, 0}, 1});
    check_case(GetParam(), {DType::kBF16, DType::kBF16, DType::kF32, d, 31, 40, {4, 4}, 0});
    check_case(GetParam(), {DType::kF32, DType::kBF16, {}, d, 50, 17, {0, 11, 6}, 2});
    check_case(GetParam(), {DType::kF32,
                            DType::kBF16,
                            {},
                            d,
                            50,
                            17,
                            {3, 11, 6},
                            0,
                            Activation::kNone,
                            Precision::kHighest});
  }
}

TEST_P(RaggedDot, EdgeSizes) {
  const auto f = DType::kF32;
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 16, 16, {}, 0});      // G = 0, M = 0
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 16, 16, {0, 0}, 0});  // M = 0
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 1, 1, {1}, 0});       // G = 1, 1x1
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 0, 7, {3}, 2});       // K = 0
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 17, 1, {5, 8}, 0});   // N = 1
  check_case(
      GetParam(),
      {f, f, {}, RaggedDimNums::kForward, 300, 129, {1, 70, 0, 2}, 5});  // > one K block, odd
  check_case(GetParam(), {f, f, {}, RaggedDimNums::kForward, 33, 65, {200, 1, 1, 0}, 0});  // skewed
  check_case(
      GetParam(),
      {DType::kBF16, DType::kBF16, {}, RaggedDimNums::kForward, 301, 31, {13, 2}, 0});  // odd K
                                                                                        // pairs
}

TEST_P(RaggedDot, Activations) {
  for (Activation a :
       {Activation::kRelu, Activation::kSilu, Activation::kGelu, Activation::kGeluTanh}) {
    check_case(GetParam(),
               {DType::kF32, DType::kF32, {}, RaggedDimNums::kForward, 24, 20, {3, 0, 5}, 1, a});
    check_case(GetParam(),
               {DType::kBF16, DType::kBF16, {}, RaggedDimNums::kForward, 24, 20, {3, 5}, 0, a});
  }
}

TEST_P(RaggedDot, AllEmptyGroupPatterns) {
  for (int mask = 0; mask < 256; ++mask) {
    std::vector<int32_t> sizes(8);
    for (int g = 0; g < 8; ++g) sizes[g] = (mask >> g) & 1 ? 1 + (g * 3) % 5 : 0;
    check_case(GetParam(),
               {DType::kF32, DType::kF32, {}, RaggedDimNums::kForward, 9, 18, sizes, 1});
    if (mask % 17 == 0)
      check_case(GetParam(),
                 {DType::kF32, DType::kF32, {}, RaggedDimNums::kRaggedContracting, 5, 6, sizes, 0});
  }
}

TEST_P(RaggedDot, Vjp) {
  for (Activation act : {Activation::kNone, Activation::kSilu}) {
    const std::vector<int32_t> sizes = {4, 0, 6, 3};
    const int64_t M = 14, K = 19, N = 11, G = 4;
    Tensor lhs = Tensor::randn({M, K}, DType::kF32, fresh_seed());
    Tensor rhs = Tensor::randn({G, K, N}, DType::kF32, fresh_seed());
    Tensor dout = Tensor::randn({M, N}, DType::kF32, fresh_seed());
    RaggedDotOptions o;
    o.activation = act;
    o.implementation = GetParam();
    const RaggedDotGrads gr = ragged_dot_vjp(lhs, rhs, sizes, dout, o);
    // Double-precision gradients.
    std::vector<double> dl(M * K, 0), dr(G * K * N, 0);
    int64_t r0 = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t r = r0; r < r0 + sizes[g]; ++r) {
        for (int64_t n = 0; n < N; ++n) {
          double pre = 0;
          for (int64_t k = 0; k < K; ++k) pre += lhs.get(r * K + k) * rhs.get((g * K + k) * N + n);
          const double d = dout.get(r * N + n) * rdot::activation_grad(act, pre);
          for (int64_t k = 0; k < K; ++k) {
            dl[r * K + k] += d * rhs.get((g * K + k) * N + n);
            dr[(g * K + k) * N + n] += d * lhs.get(r * K + k);
          }
        }
      }
      r0 += sizes[g];
    }
    expect_close(gr.dlhs, dl, 1e-4, 1e-4, 1e-5, GetParam() + " dlhs");
    expect_close(gr.drhs, dr, 1e-4, 1e-4, 1e-5, GetParam() + " drhs");
    for (int64_t i = K * N; i < 2 * K * N; ++i)
      ASSERT_EQ(gr.drhs.get(i), 0.0) << "empty group must get exactly zero";
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, RaggedDot, ::testing::Values("native", "blas", "reference"));

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
      ks->f32(mr, K, a.data_as<float>(), K, 1, bp.data_as<float>(), c.data_as<float>(), nr, false);
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
  for (int64_t kc : {1, 2, 15, 16, 17, 31, 32, 33, 64, 77}) {
    const int64_t lda = 80, rows = 5, as = 8, kp = (kc + 1) / 2;
    Tensor a = Tensor::randn({rows * lda}, DType::kF32, fresh_seed());
    std::vector<uint32_t> want(static_cast<size_t>(kp * as), 7),
        got(static_cast<size_t>(kp * as), 9);
    k::pack_a_bf16(a.data(), false, lda, rows, 3, kc, as, want.data());
    k::avx512_kernels()->pack_a_bf16(a.data(), false, lda, rows, 3, kc, as, got.data());
    EXPECT_EQ(got, want) << "kc=" << kc;
  }
}

TEST(RaggedDotNative, EveryConfigOfTheSearchSpaceIsCorrect) {
  const auto& fam = rdot::family();
  for (const char* spec : {"smoke_f32", "smoke_bf16_weights", "smoke_decode"}) {
    const BoundArguments b =
        fam.bind_json(find_arg_specs("ragged_dot", spec)[0].arguments, "native");
    AutotuneOptions o;
    o.timing.min_samples = 1;
    o.timing.min_time_s = 0;
    o.timing.warmup = 0;
    o.remeasure_rounds = 0;
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

TEST(RaggedDot, BadInputIsAClearError) {
  Tensor lhs = Tensor::randn({6, 8}, DType::kF32, 1),
         rhs = Tensor::randn({2, 8, 5}, DType::kF32, 2);
  auto expect_error = [](auto fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
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
}  // namespace tokamax
