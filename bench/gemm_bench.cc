// The f32 GEMM loop's pieces against the FMA ceiling timed in the same rounds (a plain program:
// interleaved rounds, medians and ranges of per-round ratios, so a busy neighbour slows the
// ceiling and the row alike):
//   1. the microkernel with its panel in L1 (its 16 A tiles, 16 KiB each, come from L2 as in the
//      GEMM), per tile height (12, or the set's tallest if
//      lower, and the tallest), as a fraction of the one-core FMA peak on the set's vector
//      width (8 lanes for the AVX2 set, also where a CPU with AVX-512 runs it);
//      With the AVX-512 set also the same k loop written by hand (below: hand_tile_14x32), on the
//      same data: what a loop of this shape reaches on this machine, so the compiled tile's
//      distance to the peak splits into the compiler's part and the machine's;
//   2. the lhs packing (pack_a_f32, scalar and the set's vector one), ns per value;
//   3. the whole pre-packed grouped GEMM (M=4096, K=2048, N=11264: the GLU's gate and up
//      columns together) at the blockings given, as a fraction of threads x the one-core peak, and
//      each blocking against the first, paired per round.
// Usage: tokamax_gemm_bench [--rounds N] [--threads T] [--blocking mr,mc,kc,nc]...
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autotuning/roofline_kernels.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"
#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;
namespace k = tokamax::kernels;
using Clock = std::chrono::steady_clock;

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

#if defined(__x86_64__) && defined(__GNUC__)
#define TOKAMAX_HAND_TILE 1
// The AVX-512 f32 tile's k loop for a packed A (14 rows, 56 bytes a step) against a 32-column
// panel (128 bytes a step), scheduled by hand: the 2 panel loads, 14 broadcasts each feeding 2
// FMAs, the 2 prefetcht0 of the panel 16 steps ahead that the compiled loop issues, and one
// counter; none of the compiled loop's tests (the next-panel and C-tile prefetches' conditions)
// and no C tile written (the compiled tile adds its 28 vectors into C once a call: about 1% at
// kc = 256). The accumulators stay in registers and are dropped: the asm is volatile.
// clang-format off
#define TOKAMAX_ROW(i, r0, r1)                          \
  "vbroadcastss " #i "*4(%[a]), %%zmm30\n\t"            \
  "vfmadd231ps %%zmm28, %%zmm30, %%zmm" #r0 "\n\t"      \
  "vfmadd231ps %%zmm29, %%zmm30, %%zmm" #r1 "\n\t"
// clang-format on
__attribute__((target("avx512f"))) void hand_tile_14x32(int64_t kc, const float* a,
                                                        const float* b) {
  if (kc <= 0) return;
  asm volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vmovaps %%zmm0, %%zmm1\n\tvmovaps %%zmm0, %%zmm2\n\tvmovaps %%zmm0, %%zmm3\n\t"
      "vmovaps %%zmm0, %%zmm4\n\tvmovaps %%zmm0, %%zmm5\n\tvmovaps %%zmm0, %%zmm6\n\t"
      "vmovaps %%zmm0, %%zmm7\n\tvmovaps %%zmm0, %%zmm8\n\tvmovaps %%zmm0, %%zmm9\n\t"
      "vmovaps %%zmm0, %%zmm10\n\tvmovaps %%zmm0, %%zmm11\n\tvmovaps %%zmm0, %%zmm12\n\t"
      "vmovaps %%zmm0, %%zmm13\n\tvmovaps %%zmm0, %%zmm14\n\tvmovaps %%zmm0, %%zmm15\n\t"
      "vmovaps %%zmm0, %%zmm16\n\tvmovaps %%zmm0, %%zmm17\n\tvmovaps %%zmm0, %%zmm18\n\t"
      "vmovaps %%zmm0, %%zmm19\n\tvmovaps %%zmm0, %%zmm20\n\tvmovaps %%zmm0, %%zmm21\n\t"
      "vmovaps %%zmm0, %%zmm22\n\tvmovaps %%zmm0, %%zmm23\n\tvmovaps %%zmm0, %%zmm24\n\t"
      "vmovaps %%zmm0, %%zmm25\n\tvmovaps %%zmm0, %%zmm26\n\tvmovaps %%zmm0, %%zmm27\n\t"
      ".p2align 5\n"
      "1:\n\t"
      "prefetcht0 2048(%[b])\n\t"
      "prefetcht0 2112(%[b])\n\t"
      "vmovaps (%[b]), %%zmm28\n\t"
      "vmovaps 64(%[b]), %%zmm29\n\t"
      // clang-format off
      TOKAMAX_ROW(0, 0, 1) TOKAMAX_ROW(1, 2, 3) TOKAMAX_ROW(2, 4, 5) TOKAMAX_ROW(3, 6, 7)
      TOKAMAX_ROW(4, 8, 9) TOKAMAX_ROW(5, 10, 11) TOKAMAX_ROW(6, 12, 13) TOKAMAX_ROW(7, 14, 15)
      TOKAMAX_ROW(8, 16, 17) TOKAMAX_ROW(9, 18, 19) TOKAMAX_ROW(10, 20, 21)
      TOKAMAX_ROW(11, 22, 23) TOKAMAX_ROW(12, 24, 25) TOKAMAX_ROW(13, 26, 27)
      // clang-format on
      "add $56, %[a]\n\t"
      "sub $-128, %[b]\n\t"
      "dec %[k]\n\t"
      "jnz 1b\n\t"
      : [a] "+r"(a), [b] "+r"(b), [k] "+r"(kc)
      :
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
        "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",
        "xmm29", "xmm30");
}
#undef TOKAMAX_ROW
#endif

// One-core FMA rate of this round (GFLOP/s), on the vector width of the kernel set timed.
double fma_peak(bool avx512) {
  constexpr int64_t kIters = 50'000'000;
  volatile float sink = 0;
  const double s = seconds([&] {
    sink = avx512 ? tokamax::roofline::fma_f32_avx512(kIters)
                  : tokamax::roofline::fma_f32_avx2(kIters);
  });
  (void)sink;
  return kIters * 12.0 * (avx512 ? 16 : 8) * 2 / s / 1e9;
}

struct Series {
  std::string name;
  std::vector<double> values;
  void report(const char* unit) const {
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    std::printf("  %-44s %8.3f %s  [%.3f, %.3f]\n", name.c_str(), v[v.size() / 2], unit, v.front(),
                v.back());
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7, threads = num_threads();
  std::vector<std::string> blocking_args;
  CLI::App app{"the f32 GEMM loop's pieces against the FMA ceiling timed in the same rounds"};
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "threads of the whole GEMM")->check(CLI::Range(1, 1024));
  app.add_option("--blocking", blocking_args,
                 "mr,mc,kc,nc (repeatable; the first is the baseline)");
  CLI11_PARSE(app, argc, argv);
  const k::KernelSet& ks = k::best_kernels();
  const bool avx512 = ks.isa == k::Isa::kAvx512;
  if (!avx512 && ks.isa != k::Isa::kAvx2) {
    std::fprintf(stderr, "this bench times the AVX-512 or AVX2 kernels; this CPU runs %s\n",
                 ks.name);
    return 77;
  }
  std::vector<k::Blocking> blockings;
  for (const std::string& arg : blocking_args) {
    k::Blocking b;
    char end = 0;
    if (std::sscanf(arg.c_str(), "%d,%d,%d,%d%c", &b.mr, &b.mc, &b.kc, &b.nc, &end) != 4 ||
        !k::blocking_fits(ks, b.mr, b.mc, b.kc, b.nc, ks.nr)) {
      std::fprintf(stderr, "--blocking '%s': expected mr,mc,kc,nc with %s\n", arg.c_str(),
                   k::blocking_rules(ks, ks.nr).c_str());
      return 2;
    }
    blockings.push_back(b);
  }
  const int low_mr = std::min(12, ks.max_mr);
  if (blockings.empty()) {
    blockings = {{low_mr, low_mr * 16, 512, 1024}};
    if (ks.max_mr != low_mr)
      blockings.push_back({ks.max_mr, ks.max_mr * k::item_tiles(ks), 512, 1024});
  }
  set_num_threads(threads);

  // 1. Microkernel, panel in L1: kc = 256, 16 A tiles (L2) against one 32 KiB panel, accumulating.
  const int64_t kc = 256;
  std::vector<int> heights = {low_mr};
  if (ks.max_mr != low_mr) heights.push_back(ks.max_mr);
  Tensor a({16 * 16 * kc}, DType::kF32), b({kc * ks.nr}, DType::kF32),
      c({16 * 16 * 64}, DType::kF32);
  std::fill(a.data_as<float>(), a.data_as<float>() + a.size(), 0.001f);
  std::fill(b.data_as<float>(), b.data_as<float>() + b.size(), 0.002f);
  std::fill(c.data_as<float>(), c.data_as<float>() + c.size(), 0.0f);
  std::vector<Series> tiles;
  for (int mr : heights)
    tiles.push_back(
        {"f32 tile " + std::to_string(mr) + " x " + std::to_string(ks.nr) + ", panel in L1", {}});
#ifdef TOKAMAX_HAND_TILE
  const bool hand = avx512 && ks.nr == 32 && ks.max_mr == 14;
#else
  const bool hand = false;
#endif
  Series hand_tile{"  its k loop by hand (asm), same data", {}};

  // 2. Packing: 192 rows, kc = 512 of a [192, 2048] lhs.
  Tensor lhs = Tensor::randn({192, 2048}, DType::kF32, 1), packed({192 * 512}, DType::kF32);
  Series pack_scalar{"pack_a_f32 scalar (192 x 512 of K = 2048)", {}},
      pack_vector{"pack_a_f32 vector", {}};

  // 3. The pre-packed GEMM.
  const int64_t M = 4096, K = 2048, N = 11264;
  Tensor x = Tensor::randn({M, K}, DType::kF32, 2), w = Tensor::randn({K, N}, DType::kF32, 3);
  const int64_t panels = N / ks.nr, pe = k::panel_elems(K, false, ks.nr);
  Tensor wp({panels * pe}, DType::kF32), out({M, N}, DType::kF32);
  k::pack_panels(ks, false, w.data(), false, false, K, N, wp.data(), 0, panels);
  const k::PackedPanels pp{wp.data(), panels, pe, false};
  const int64_t offsets[2] = {0, M};
  k::GroupedGemm g;
  g.groups = 1;
  g.offsets = offsets;
  g.k = K;
  g.n = N;
  g.a = x.data();
  g.threads = threads;
  g.packed = &pp;
  float* o = out.data_as<float>();
  g.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0, int64_t cols) {
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(o + (r0 + i) * N + n0, C + i * ldc, static_cast<size_t>(cols) * 4);
  };
  std::vector<Series> gemms;
  for (const k::Blocking& bl : blockings) {
    gemms.push_back({"GEMM mr " + std::to_string(bl.mr) + " mc " + std::to_string(bl.mc) + " kc " +
                         std::to_string(bl.kc) + " nc " + std::to_string(bl.nc),
                     {}});
  }

  for (int r = 0; r < rounds; ++r) {
    const double peak = fma_peak(avx512);
    for (size_t h = 0; h < heights.size(); ++h) {
      const int mr = heights[h];
      constexpr int64_t kCalls = 20000;
      const double s = seconds([&] {
        for (int64_t i = 0; i < kCalls; ++i) {
          const int64_t t = i % 16;
          ks.f32(mr, kc, a.data_as<float>() + t * 16 * kc, 1, mr, b.data_as<float>(),
                 c.data_as<float>() + t * 16 * 64, 64, true, {});
        }
      });
      tiles[h].values.push_back(kCalls * 2.0 * mr * ks.nr * kc / s / 1e9 / peak);
    }
#ifdef TOKAMAX_HAND_TILE
    if (hand) {
      constexpr int64_t kCalls = 20000;
      const double s = seconds([&] {
        for (int64_t i = 0; i < kCalls; ++i)
          hand_tile_14x32(kc, a.data_as<float>() + (i % 16) * 16 * kc, b.data_as<float>());
      });
      hand_tile.values.push_back(kCalls * 2.0 * 14 * 32 * kc / s / 1e9 / peak);
    }
#endif
    constexpr int kPacks = 200;
    const double values = kPacks * 192.0 * 512;
    pack_scalar.values.push_back(seconds([&] {
                                   for (int i = 0; i < kPacks; ++i)
                                     k::pack_a_f32(lhs.data_as<float>(), 2048, 192, (i % 4) * 512,
                                                   512, low_mr, packed.data_as<float>());
                                 }) /
                                 values * 1e9);
    if (ks.pack_a_f32 != nullptr)  // a set without a vector packer packs with the scalar one
      pack_vector.values.push_back(seconds([&] {
                                     for (int i = 0; i < kPacks; ++i)
                                       ks.pack_a_f32(lhs.data_as<float>(), 2048, 192, (i % 4) * 512,
                                                     512, low_mr, packed.data_as<float>());
                                   }) /
                                   values * 1e9);
    for (size_t i = 0; i < blockings.size(); ++i) {
      const double s = seconds([&] { k::grouped_gemm(g, blockings[i], ks); });
      gemms[i].values.push_back(2.0 * M * N * K / s / 1e9 / (peak * threads));
    }
  }
  std::printf("%s, %d thread(s), %d interleaved rounds (median [min, max])\n", ks.name, threads,
              rounds);
  std::printf("fraction of the one-core %d-lane FMA peak timed in the same round:\n",
              avx512 ? 16 : 8);
  for (const Series& t : tiles) t.report("");
  if (hand) hand_tile.report("");
  std::printf("ns per packed value:\n");
  pack_scalar.report("ns");
  if (!pack_vector.values.empty()) pack_vector.report("ns");
  std::printf("fraction of threads x that peak (pre-packed, M=4096 K=2048 N=11264):\n");
  for (const Series& s : gemms) s.report("");
  if (gemms.size() > 1) {
    // Paired within each round: a neighbour that slows a whole round cancels out.
    std::printf("time of the first blocking / time of each, per round:\n");
    for (size_t i = 1; i < gemms.size(); ++i) {
      Series ratio{gemms[i].name, {}};
      for (int r = 0; r < rounds; ++r)
        ratio.values.push_back(gemms[i].values[r] / gemms[0].values[r]);
      ratio.report("x");
    }
  }
  return 0;
}
