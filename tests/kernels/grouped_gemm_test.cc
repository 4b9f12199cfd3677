// The framework-free grouped GEMM on every runnable ISA, against a double-precision product:
// packed and unpacked weights, both weight layouts, f32 and bf16 operands (the bf16 dot and the
// widened path), empty and odd-sized groups, small blockings that split every loop, one and two
// threads. The store callback must see every row of every group once and nothing else.
#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tests/kernels/kernel_sets.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

namespace k = kernels;

struct Operands {
  Tensor a, b;  // a [rows, K]; b [G, K, N] or [G, N, K]
  std::vector<int64_t> offsets;
};

// The value the product multiplies for element i of a tensor (bf16 as stored; an f32 A rounded
// when asked).
double value(const Tensor& t, int64_t i, bool round) {
  const double v = t.get(i);
  return round ? bf16_to_f32(f32_to_bf16(static_cast<float>(v))) : v;
}

struct Case {
  const k::KernelSet* ks;
  bool a_bf16, b_bf16, round_a, bf16_dot, trans, packed;
  int threads;
  k::Blocking blk;
  bool a_trans = false;  // A handed in transposed ([K, rows], GroupedOperands::a_trans)
  int64_t a_panel = 0;   // A handed in column panels of this width (GroupedOperands::a_panel)
  int panel_group = 0;   // > 0: B packed by the caller's hook (GroupedGemm::pack_b), whole
                         // groups of this many panels a strip; b itself not handed in
  std::string str() const {
    return std::string(ks->name) + (a_bf16 ? " a:bf16" : " a:f32") +
           (b_bf16 ? " b:bf16" : " b:f32") + (round_a ? " round" : "") + (bf16_dot ? " dot" : "") +
           (trans ? " trans" : "") + (packed ? " packed" : "") + (a_trans ? " a_trans" : "") +
           (a_panel > 0 ? " a_panel=" + std::to_string(a_panel) : "") +
           (panel_group > 0 ? " pack_b group=" + std::to_string(panel_group) : "") +
           " threads=" + std::to_string(threads) + " mr=" + std::to_string(blk.mr) +
           " mc=" + std::to_string(blk.mc) + " kc=" + std::to_string(blk.kc) +
           " nc=" + std::to_string(blk.nc);
  }
};

void check_case(const Case& cs, int64_t K, int64_t N, const std::vector<int32_t>& sizes,
                int64_t extra_rows) {
  const int64_t G = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> offsets(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + sizes[g];
  const int64_t rows = offsets[G] + extra_rows;
  Tensor a = Tensor::randn({rows, K}, cs.a_bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
  Tensor b = Tensor::randn(cs.trans ? Shape{G, N, K} : Shape{G, K, N},
                           cs.b_bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
  const k::KernelSet& ks = *cs.ks;
  const bool pairs = cs.bf16_dot;
  k::PackedPanels panels;
  Tensor packed_data;
  k::GroupedGemm p;
  p.groups = G;
  p.offsets = offsets.data();
  p.k = K;
  p.n = N;
  p.a = a.data();
  p.a_bf16 = cs.a_bf16;
  p.round_a_to_bf16 = cs.round_a;
  Tensor a_t({std::max<int64_t>(1, rows * K)}, DType::kF32);
  if (cs.a_trans) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t kk = 0; kk < K; ++kk) a_t.data_as<float>()[kk * rows + r] = a.get(r * K + kk);
    p.a = a_t.data();
    p.a_trans = true;
    p.lda = rows;  // past the groups' rows: the extra ones are in the stride, never read
  }
  Tensor a_p;
  if (cs.a_panel > 0) {  // panels of the groups' rows only, the last one padded with NaN
    const int64_t w = cs.a_panel, total = offsets[G], panels = (K + w - 1) / w;
    a_p = Tensor({std::max<int64_t>(1, panels * total * w)}, DType::kF32);
    float* d = a_p.data_as<float>();
    std::fill(d, d + panels * total * w, std::nanf(""));
    for (int64_t r = 0; r < total; ++r)
      for (int64_t kk = 0; kk < K; ++kk) d[(kk / w * total + r) * w + kk % w] = a.get(r * K + kk);
    p.a = a_p.data();
    p.a_panel = w;
  }
  p.b = b.data();
  p.b_bf16 = cs.b_bf16;
  p.b_trans = cs.trans;
  p.bf16_dot = pairs;
  p.threads = cs.threads;
  if (cs.packed) {
    panels.panels = (N + ks.nr - 1) / ks.nr;
    panels.panel_elems = k::panel_elems(K, pairs, ks.nr);
    panels.pairs = pairs;
    packed_data =
        Tensor({std::max<int64_t>(1, G * panels.panels * panels.panel_elems)}, DType::kF32);
    panels.data = packed_data.data();
    const int64_t es = cs.b_bf16 ? 2 : 4;
    for (int64_t g = 0; g < G; ++g) {
      k::pack_panels(ks, pairs, static_cast<const char*>(b.data()) + g * K * N * es, cs.b_bf16,
                     cs.trans, K, N, const_cast<void*>(panels.group(g)), 0, panels.panels);
    }
    p.packed = &panels;
  }
  std::atomic<int64_t> hook_panels{0};
  if (cs.panel_group > 0) {
    p.b = nullptr;
    p.panel_group = cs.panel_group;
    const int64_t es = cs.b_bf16 ? 2 : 4;
    p.pack_b = [&, es](int64_t g, void* dst, int64_t p0, int64_t p1) {
      hook_panels += p1 - p0;
      k::pack_panels(ks, pairs, static_cast<const char*>(b.data()) + g * K * N * es, cs.b_bf16,
                     cs.trans, K, N, dst, p0, p1);
    };
  }
  const float kUnwritten = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(static_cast<size_t>(rows * N), kUnwritten);
  std::vector<int> writes(static_cast<size_t>(rows * N), 0);
  p.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t nrows, int64_t n0, int64_t cols) {
    for (int64_t i = 0; i < nrows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        out[(r0 + i) * N + n0 + j] = C[i * ldc + j];
        writes[(r0 + i) * N + n0 + j]++;  // distinct elements per tile: no race
      }
    }
  };
  k::grouped_gemm(p, cs.blk, ks);
  const bool round_a = cs.a_bf16 || cs.round_a;
  // The operands as the kernels multiply them, read once (Tensor::get per product made the
  // check most of the test's time).
  std::vector<double> av(static_cast<size_t>(rows * K)), bv(static_cast<size_t>(G * K * N));
  for (int64_t i = 0; i < rows * K; ++i) av[i] = value(a, i, round_a && !cs.a_bf16);
  for (int64_t i = 0; i < G * K * N; ++i) bv[i] = value(b, i, pairs && !cs.b_bf16);
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int64_t j = 0; j < N; ++j) {
        double want = 0, mag = 0;
        for (int64_t kk = 0; kk < K; ++kk) {
          const double x = av[r * K + kk];
          const double w = bv[g * K * N + (cs.trans ? j * K + kk : kk * N + j)];
          want += x * w;
          mag += std::abs(x * w);
        }
        const float got = out[r * N + j];
        ASSERT_EQ(writes[r * N + j], 1) << cs.str() << " row " << r << " col " << j;
        ASSERT_NEAR(got, want, 1e-6 + 4e-7 * static_cast<double>(K) * mag)
            << cs.str() << " group " << g << " row " << r << " col " << j;
      }
    }
  }
  for (int64_t i = offsets[G] * N; i < rows * N; ++i)
    ASSERT_EQ(writes[i], 0) << cs.str() << ": wrote a row past the groups";
  if (cs.panel_group > 0 && offsets[G] > 0 && N > 0) {
    ASSERT_GE(hook_panels.load(), (N + ks.nr - 1) / ks.nr) << cs.str() << ": the hook packed B";
  }
}

TEST(GroupedGemm, EveryIsaFormAndBlockingAgainstDoubles) {
  // Groups: empty, one row, streaming-size, odd, tall enough to share strips on two threads.
  const std::vector<std::vector<int32_t>> group_sets = {
      {0, 1, 3, 0, 9}, {40, 0, 5}, {2}, {0, 0}, {}};
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    const int nr = ks->nr;
    const std::vector<k::Blocking> blockings = {{std::min(4, ks->max_mr), 8, 6, nr},
                                                {ks->max_mr, ks->max_mr * 2, 64, 4 * nr}};
    for (bool packed : {false, true}) {
      for (bool trans : {false, true}) {
        for (int dtypes = 0; dtypes < 4; ++dtypes) {
          // f32 x f32; f32 x bf16 (rounded A, widened B); bf16 x bf16 widened; bf16 on the dot.
          Case cs{ks, dtypes >= 2, dtypes >= 1, dtypes == 1, dtypes == 3, trans, packed, 1, {}};
          if (cs.bf16_dot && ks->bf16 == nullptr) continue;
          for (const k::Blocking& blk : blockings) {
            for (int threads : {1, 2}) {
              cs.blk = blk;
              cs.threads = threads;
              const int64_t K = threads == 1 ? 13 : 70, N = threads == 1 ? 2 * nr + 3 : nr - 1;
              for (const auto& sizes : group_sets) check_case(cs, K, N, sizes, /*extra_rows=*/2);
              if (dtypes == 0) {  // f32 A read transposed in place, or from column panels
                cs.a_trans = true;
                for (const auto& sizes : group_sets) check_case(cs, K, N, sizes, 2);
                cs.a_trans = false;
                for (int64_t w : {int64_t{nr}, int64_t{5}}) {  // 5: K blocks split panels
                  cs.a_panel = w;
                  for (const auto& sizes : group_sets) check_case(cs, K, N, sizes, 2);
                }
                cs.a_panel = 0;
              }
            }
          }
        }
      }
    }
  }
}

// A read transposed in place (f32), converted first (bf16, or f32 rounded to bf16); K = 7
// output rows per group fit in one tile, K = 40 take the packed strips the threads share.
TEST(GroupedGemm, RaggedContractionAgainstDoubles) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    for (const auto& [bf16, K, rounded] :
         std::vector<std::tuple<bool, int64_t, bool>>{{false, 7, false},
                                                      {true, 7, false},
                                                      {false, 40, false},
                                                      {true, 40, false},
                                                      {false, 40, true}}) {
      const int64_t N = ks->nr + 5;
      const std::vector<int32_t> sizes = {3, 0, 17, 1};
      std::vector<int64_t> offsets = {0};
      for (int32_t s : sizes) offsets.push_back(offsets.back() + s);
      const int64_t rows = offsets.back(), G = static_cast<int64_t>(sizes.size());
      Tensor a = Tensor::randn({rows, K}, bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
      Tensor b = Tensor::randn({rows, N}, bf16 ? DType::kBF16 : DType::kF32, fresh_seed());
      std::vector<float> out(static_cast<size_t>(G * K * N), std::nanf(""));
      k::GroupedGemmTn p;
      p.groups = G;
      p.offsets = offsets.data();
      p.k = K;
      p.n = N;
      p.a = a.data();
      p.a_bf16 = bf16;
      p.round_a_to_bf16 = rounded;
      p.b = b.data();
      p.b_bf16 = bf16;
      p.threads = 2;
      p.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t nrows, int64_t n0,
                    int64_t cols) {
        for (int64_t i = 0; i < nrows; ++i) {
          for (int64_t j = 0; j < cols; ++j) out[(r0 + i) * N + n0 + j] = C[i * ldc + j];
        }
      };
      k::grouped_gemm_tn(p, {std::min(4, ks->max_mr), 4, 4, ks->nr}, *ks);
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t kk = 0; kk < K; ++kk) {
          for (int64_t j = 0; j < N; ++j) {
            double want = 0;
            for (int64_t r = offsets[g]; r < offsets[g + 1]; ++r) {
              const double av = rounded ? round_to_bf16(static_cast<float>(a.get(r * K + kk)))
                                        : a.get(r * K + kk);
              want += av * b.get(r * N + j);
            }
            ASSERT_NEAR(out[(g * K + kk) * N + j], want, 1e-5 * (1 + std::abs(want)))
                << ks->name << (bf16 ? " bf16" : " f32") << (rounded ? " rounded" : "") << " K "
                << K << " group " << g;
          }
        }
      }
    }
  }
}

// A row stride, a transposed A and an A in column panels are for an f32 A on the f32 kernels
// only: a bf16 A (converted per call as a dense copy) is refused with a clear error, not read
// in the wrong layout; so are a stride too short, and panels with a stride or a transpose.
TEST(GroupedGemm, ALayoutsOnlyForF32) {
  const k::KernelSet& ks = k::best_kernels();
  Tensor a = Tensor::randn({4, 16}, DType::kBF16, fresh_seed());
  Tensor b = Tensor::randn({8, ks.nr}, DType::kF32, fresh_seed());
  const int64_t offsets[2] = {0, 4};
  k::GroupedGemm p;
  p.groups = 1;
  p.offsets = offsets;
  p.k = 8;
  p.n = ks.nr;
  p.a = a.data();
  p.b = b.data();
  p.store = [](const float*, int64_t, int64_t, int64_t, int64_t, int64_t) {};
  struct Refused {
    bool a_bf16;
    int64_t lda;
    bool a_trans;
    int64_t a_panel;
    const char* why;
  };
  for (const Refused& r : std::vector<Refused>{
           {true, 16, false, 0, "a row stride with a bf16 A"},
           {false, 4, false, 0, "a row stride shorter than a row"},
           {false, 3, true, 0, "transposed: a stride under the 4 rows"},
           {true, 4, true, 0, "transposed bf16"},
           // Column panels: f32 only, with neither a row stride nor a transpose, a positive width.
           {true, 0, false, ks.nr, "panels of a bf16 A"},
           {false, 16, false, ks.nr, "panels with a row stride"},
           {false, 0, true, ks.nr, "panels transposed"},
           {false, 0, false, -1, "panels of a negative width"}}) {
    p.a_bf16 = r.a_bf16;
    p.lda = r.lda;
    p.a_trans = r.a_trans;
    p.a_panel = r.a_panel;
    EXPECT_THROW(k::grouped_gemm(p, {4, 4, 8, ks.nr}, ks), InvalidArgument) << r.why;
  }
}

// Weights packed by the caller's hook (GroupedGemm::pack_b), on 1 to 4 threads: strips the
// threads share (several: the next one packed during the current one; one), per-item strips
// (fewer rows than 2 threads x mc, beside a shared group in the same call), empty and odd
// groups, K = 0, panels in groups of 1 and 2 (the strips then hold whole pairs, 3 strips of
// them or more), f32 and the bf16 dot. A hook or a store that throws reaches the caller, with no
// thread left waiting on the strip it did not pack, and the next call is right.
TEST(GroupedGemm, CallerPackedStrips) {
  const int threads_before = num_threads();
  set_num_threads(4);
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    for (bool dot : {false, true}) {
      if (dot && ks->bf16 == nullptr) continue;
      for (int group : {1, 2}) {
        const int nc = 2 * group * ks->nr;
        Case cs{ks, false, false, dot, dot, false, false, 2, {4, 8, 16, nc}};
        cs.panel_group = group;
        const int64_t n3 = (4 * group + 1) * ks->nr + 3;  // 3 strips
        check_case(cs, 37, n3, {300}, 0);                 // shared, 3 strips
        check_case(cs, 20, 3, {0, 70, 31}, 2);            // shared, one strip; per-item
        check_case(cs, 37, n3, {23, 0, 9}, 1);            // per-item strips
        check_case(cs, 0, n3, {300}, 0);                  // shared, K = 0
        for (int threads : {1, 3, 4}) {                   // the packing items start at threads - 1
          cs.threads = threads;
          check_case(cs, 37, n3, {300, 31}, 0);
        }
        cs.threads = 2;
        cs.blk.mc = 4;
        check_case(cs, 2, 4 * ks->nr, {17, 64}, 0);  // shared, blocks of 1 tile
      }
    }
  }
  // The hook fails on the third strip's panels (in an item of the second strip), or the store
  // on the second strip's tiles; then a call that fails nowhere.
  const k::KernelSet& ks = k::best_kernels();
  const int64_t K = 16, N = 8 * ks.nr, rows = 200;
  Tensor a = Tensor::randn({rows, K}, DType::kF32, fresh_seed());
  Tensor b = Tensor::randn({K, N}, DType::kF32, fresh_seed());
  const int64_t offsets[2] = {0, rows};
  const k::Blocking blk{4, 8, 16, 2 * ks.nr};
  int where = 0;  // 0: the hook throws, 1: the store, 2: neither
  k::GroupedGemm p;
  p.groups = 1;
  p.offsets = offsets;
  p.k = K;
  p.n = N;
  p.a = a.data();
  p.threads = 2;
  p.pack_b = [&](int64_t, void* dst, int64_t p0, int64_t p1) {
    if (where == 0 && p0 >= 4) throw std::runtime_error("pack");
    k::pack_panels(ks, false, b.data(), false, false, K, N, dst, p0, p1);
  };
  std::vector<float> out(static_cast<size_t>(rows * N), std::nanf(""));
  p.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t nrows, int64_t n0, int64_t cols) {
    if (where == 1 && n0 >= blk.nc) throw std::runtime_error("store");
    for (int64_t i = 0; i < nrows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[(r0 + i) * N + n0 + j] = C[i * ldc + j];
  };
  for (where = 0; where < 2; ++where)
    EXPECT_THROW(k::grouped_gemm(p, blk, ks), std::runtime_error) << where;
  std::fill(out.begin(), out.end(), std::nanf(""));
  k::grouped_gemm(p, blk, ks);  // where == 2
  const float* av = a.data_as<float>();
  const float* bv = b.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < N; ++j) {
      double want = 0;
      for (int64_t kk = 0; kk < K; ++kk) want += double{av[r * K + kk]} * bv[kk * N + j];
      ASSERT_NEAR(out[r * N + j], want, 1e-5 * (1 + std::abs(want))) << r << " " << j;
    }
  }
  set_num_threads(threads_before);
}

// Row blocks of one product: the fewest of at most per_block tiles, then more until the items
// fill whole waves of the threads (never more blocks than tiles), tiles spread evenly.
TEST(GroupedGemm, RowBlocksBalanceTheThreads) {
  // The loss backward's logits: 293 tiles of 14 rows, 14 a block, one column block.
  EXPECT_EQ(k::balanced_blocks(293, 14, 1, 2), 22);
  EXPECT_EQ(k::balanced_blocks(293, 14, 1, 1), 21);  // one thread: the fewest
  EXPECT_EQ(k::balanced_blocks(293, 14, 2, 2), 21);  // 42 items already fill the waves
  EXPECT_EQ(k::balanced_blocks(147, 14, 1, 2), 12);
  EXPECT_EQ(k::balanced_blocks(147, 14, 1, 3), 12);
  EXPECT_EQ(k::balanced_blocks(1, 14, 1, 2), 1);  // one tile: not split
  EXPECT_EQ(k::balanced_blocks(0, 14, 1, 2), 0);
  EXPECT_EQ(k::balanced_blocks(3, 1, 1, 4), 3);  // at most one block a tile
}

// The heuristics' item width: halved while items are too few, and, when asked, until alike
// items split evenly over the threads (to within 1/16 of the last wave); never below the
// narrowest, and tiny calls (want 1) are not split to balance.
TEST(GroupedGemm, ItemColumnsBalanceTheThreads) {
  // 11 items of 1024 columns on 2 threads leave one idle for the last: 22 of 512.
  EXPECT_EQ(k::item_columns(1, 11264, 8, 2, 1024, 64), 512);
  EXPECT_EQ(k::item_columns(1, 11264, 8, 0, 1024, 64), 1024);  // not asked
  // Too few items: halved until there are `want` of them, balanced or not.
  EXPECT_EQ(k::item_columns(1, 4096, 8, 0, 1024, 32), 512);
  // 3 threads: 11 -> 22 (2 of 24 slots idle, over 1/16) -> 44 (1 of 45).
  EXPECT_EQ(k::item_columns(1, 11264, 8, 3, 1024, 32), 256);
  // Already even, or many items: unchanged.
  EXPECT_EQ(k::item_columns(21, 11264, 8, 2, 1024, 64), 1024);
  EXPECT_EQ(k::item_columns(1, 8192, 8, 2, 1024, 64), 1024);
  // The narrowest bounds it; a call too small to split (want 1) is left whole.
  EXPECT_EQ(k::item_columns(1, 96, 8, 2, 1024, 32), 32);
  EXPECT_EQ(k::item_columns(1, 1024 * 3, 1, 2, 1024, 32), 1024);
}

}  // namespace
}  // namespace tokamax
