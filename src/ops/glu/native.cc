// The native gated_linear_unit: one grouped GEMM (src/kernels/grouped_gemm.h) over weights
// packed with the gate's and the up projection's panels of the same output columns side by
// side (gate panel j, then up panel j), so every tile the GEMM finishes holds both halves of
// its output columns; its epilogue applies activation(gate) * up while the tile is in the
// thread's L1/L2 and writes only the [M, N] output (and, with residuals, x w). No [M, 2N]
// intermediate exists. Weights are packed once ahead (pack_glu_weights), or by the GEMM a strip
// of panel pairs at a time as it goes (the caller's weights: a few MiB of strips, not a copy).
#include <algorithm>
#include <cstring>
#include <vector>

#include "autotuning/bf16_dot.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "ops/glu/base.h"

namespace tokamax {

namespace k = kernels;

struct PackedGluWeights::Rep {
  int64_t k = 0, n = 0;
  DType dtype = DType::kF32;
  const k::KernelSet* ks = nullptr;
  bool pairs = false;  // bf16 pairs for the bf16 dot, else f32 panels
  int64_t panels = 0, panel_elems = 0;
  Tensor data;
  k::PackedPanels view() const { return {data.data(), panels, panel_elems, pairs}; }
};

int64_t PackedGluWeights::k() const { return rep_->k; }
int64_t PackedGluWeights::n() const { return rep_->n; }
DType PackedGluWeights::dtype() const { return rep_->dtype; }

namespace {
constexpr ConfigFields<GluNativeConfig, 4> kFields{"gated_linear_unit native config",
                                                   {{{"mr", &GluNativeConfig::mr},
                                                     {"mc", &GluNativeConfig::mc},
                                                     {"kc", &GluNativeConfig::kc},
                                                     {"nc", &GluNativeConfig::nc}}}};
}  // namespace

Json GluNativeConfig::to_json() const { return kFields.to_json(*this); }
GluNativeConfig GluNativeConfig::from_json(const Json& j) { return kFields.from_json(j); }

namespace glu {

bool packed_pairs(const PackedGluWeights& p) { return p.rep()->pairs; }

namespace {
// Panels [p0, p1) of the interleaved layout into dst: panel q is panel q / 2 of the gate (q
// even) or of the up projection (odd).
void pack_interleaved(const GluCall& c, const k::KernelSet& ks, bool pairs, void* dst, int64_t p0,
                      int64_t p1) {
  int64_t ld;
  const void* halves[2] = {c.weights(0, &ld), c.weights(1, &ld)};
  const int64_t bytes = k::panel_elems(c.k, pairs, ks.nr) * 4;
  for (int64_t q = p0; q < p1; ++q) {
    k::pack_panels(ks, pairs, halves[q % 2], c.w_dtype == DType::kBF16, false, c.k, c.n,
                   static_cast<char*>(dst) + (q - p0) * bytes, q / 2, q / 2 + 1, ld);
  }
}
}  // namespace

std::shared_ptr<const PackedGluWeights::Rep> pack(const GluCall& c, int threads) {
  auto r = std::make_shared<PackedGluWeights::Rep>();
  r->k = c.k;
  r->n = c.n;
  r->dtype = c.w_dtype;
  r->ks = &k::best_kernels();
  const int nr = r->ks->nr;
  r->pairs = c.w_dtype == DType::kBF16 && r->ks->bf16 != nullptr && bf16_dot_pays();
  const int64_t per_half = (c.n + nr - 1) / nr;
  r->panels = 2 * per_half;
  r->panel_elems = k::panel_elems(c.k, r->pairs, nr);
  r->data = Tensor({std::max<int64_t>(1, r->panels * r->panel_elems)}, DType::kF32);
  parallel_for(r->panels, threads, [&](int64_t p, int) {
    pack_interleaved(c, *r->ks, r->pairs,
                     static_cast<char*>(r->data.data()) + p * r->panel_elems * 4, p, p + 1);
  });
  return r;
}

namespace {

k::Blocking blocking(const GluNativeConfig& c) { return {c.mr, c.mc, c.kc, c.nc}; }

void check(const GluNativeConfig& c, const k::KernelSet& ks) {
  k::check_isa_config(
      ks,
      [&](const k::KernelSet& s) { return k::blocking_fits(s, c.mr, c.mc, c.kc, c.nc, 2 * s.nr); },
      [&](const k::KernelSet& s) {
        return "gated_linear_unit native config " + canonical_dump(c.to_json()) +
               " is invalid for ISA " + s.name + ": expected " + k::blocking_rules(s, 2 * s.nr);
      });
}

class Native : public TypedImplementation<GluCall, GluNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return kFields.names(); }
  void check_call(const GluCall& c) const override {
    if (!c.packed.empty() && c.packed.rep()->ks != &k::best_kernels())
      throw Unsupported("packed GLU weights were packed for another ISA");
  }
  void check_config(const GluNativeConfig& c) const override { check(c, k::best_kernels()); }

  // Measured (tokamax autotune --tag primary, M=4096, K=2048, N=5632): the tallest tiles
  // and items of k::item_tiles() of them (12 x 16 won by 1.58x over 8-row tiles in items of 32
  // rows; 14 x 14 since the 14-row kernel): each packed weight panel is reused by ~200 rows.
  // K blocks of k::block_depth(); items as wide as 1024 gate + up columns while there are enough
  // for the threads. Few rows (decode) take the streaming path (run_call), where only the K
  // block (512) and item width matter: there the items are alike, and narrower ones split
  // evenly over the threads (k::item_columns).
  GluNativeConfig heuristics(const GluCall& c) const override {
    const auto& ks = k::best_kernels();
    GluNativeConfig cfg;
    const int64_t rows = std::max<int64_t>(c.m, 1);
    cfg.mr = static_cast<int>(std::min<int64_t>(ks.max_mr, rows));
    cfg.mc = cfg.mr * static_cast<int>(
                          std::clamp<int64_t>((rows + cfg.mr - 1) / cfg.mr, 1, k::item_tiles(ks)));
    const int64_t depth = rows <= k::kStreamMaxMr ? 512 : k::block_depth(ks);
    cfg.kc = static_cast<int>(std::min<int64_t>(depth, k::round_up(std::max<int64_t>(c.k, 2), 2)));
    const int64_t cols = 2 * k::round_up(std::max<int64_t>(c.n, 1), ks.nr);
    const int64_t row_blocks = (rows + cfg.mc - 1) / cfg.mc;
    const int64_t want = std::clamp<int64_t>(static_cast<int64_t>(call_flops(c) / 1e6), 1,
                                             4 * std::max(1, c.num_threads));
    const int64_t nc = k::item_columns(
        row_blocks, cols, want, rows <= k::kStreamMaxMr ? c.num_threads : 0, 1024, 2 * ks.nr);
    cfg.nc = static_cast<int>(k::round_up(std::min<int64_t>(nc, cols), 2 * ks.nr));
    return cfg;
  }

  std::vector<GluNativeConfig> search_space(const GluCall& c) const override {
    const auto& ks = k::best_kernels();
    const int64_t rows = std::max<int64_t>(c.m, 1);
    const int64_t k2 = k::round_up(std::max<int64_t>(c.k, 2), 2);
    const int64_t cols = 2 * k::round_up(std::max<int64_t>(c.n, 1), ks.nr);
    std::vector<GluNativeConfig> out;
    auto add = [&](int mr, int mc, int kc, int nc) {
      const GluNativeConfig cfg{
          mr, mc, static_cast<int>(std::min<int64_t>(kc, k2)),
          static_cast<int>(k::round_up(std::min<int64_t>(nc, cols), 2 * ks.nr))};
      if (std::find(out.begin(), out.end(), cfg) == out.end()) out.push_back(cfg);
    };
    const std::vector<int> mrs =
        ks.max_mr >= 12 ? std::vector<int>{8, ks.max_mr} : std::vector<int>{4, ks.max_mr};
    for (int mr0 : mrs) {
      const int mr = static_cast<int>(std::min<int64_t>(mr0, rows));
      for (int mcf : {4, 8, k::item_tiles(ks)}) {
        if (mr * mcf > k::round_up(rows, mr) * 2 && mcf != 4) continue;
        for (int kc : {256, 512}) {
          for (int nc : {256, 512, 1024}) add(mr, mr * mcf, kc, nc);
        }
      }
    }
    return out;
  }

  int64_t scratch(const GluCall& c, const GluNativeConfig& cfg) const override {
    const auto& ks = k::best_kernels();
    const int64_t offsets[2] = {0, c.m};
    if (c.packed.empty() && c.m <= k::kStreamMaxMr) {  // run_streamed: x w, then the GEMM's
      return c.m * 2 * c.n * 4 +
             k::grouped_gemm_scratch_bytes(streamed_gemm(c, offsets), blocking(cfg), ks);
    }
    // The caller's weights packed in strips by the GEMM, or whole first (pack).
    const bool strips = c.packed.empty() && in_strips(c, cfg);
    const int64_t packed =
        c.packed.empty() && !strips
            ? 2 * ((c.n + ks.nr - 1) / ks.nr) * k::panel_elems(c.k, uses_bf16_dot(c), ks.nr) * 4
            : 0;
    k::PackedPanels panels;
    return packed + k::grouped_gemm_scratch_bytes(gemm(c, offsets, strips ? nullptr : &panels),
                                                  blocking(cfg), ks);
  }

  void run_call(GluCall& c, const GluNativeConfig& cfg, const Prepared*) const override {
    const auto& ks = k::best_kernels();
    check(cfg, ks);
    if (c.m == 0 || c.n == 0) return;
    if (c.packed.empty() && c.m <= k::kStreamMaxMr) {
      run_streamed(c, cfg, ks);
      return;
    }
    const int64_t offsets[2] = {0, c.m};
    // Pre-packed weights, the caller's packed whole first, or (null) theirs in strips.
    std::shared_ptr<const PackedGluWeights::Rep> own;
    const PackedGluWeights::Rep* rep = c.packed.rep();
    if (!rep && !in_strips(c, cfg)) rep = (own = pack(c, c.num_threads)).get();
    k::PackedPanels panels;
    if (rep) panels = rep->view();
    k::GroupedGemm p = gemm(c, offsets, rep ? &panels : nullptr);
    p.store = epilogue(c, ks.nr);
    k::grouped_gemm(p, blocking(cfg), ks);
  }

 private:
  // A few rows (decode) against the caller's weights: packing them would read them twice and
  // write them once, for rows that use each weight once. The grouped GEMM streams them from
  // their own layout instead (the stacked w is a dense [K, 2N]) into an [M, 2N] f32 tile of at
  // most kStreamMaxMr rows, and the activation and product follow.
  static void run_streamed(const GluCall& c, const GluNativeConfig& cfg, const k::KernelSet& ks) {
    const int64_t N = c.n, offsets[2] = {0, c.m};
    float* h = k::thread_scratch(k::kEpilogueSlot, c.m * 2 * N);
    k::GroupedGemm p = streamed_gemm(c, offsets);
    for (int half = 0; half < (c.w_up ? 2 : 1); ++half) {
      int64_t ld;
      p.b = c.weights(half, &ld);
      float* dst = h + half * N;
      p.store = [dst, N](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                         int64_t cols) {
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(dst + (r0 + i) * 2 * N + n0, C + i * ldc, static_cast<size_t>(cols) * 4);
      };
      k::grouped_gemm(p, blocking(cfg), ks);
    }
    activate_rows(c, h, 0, c.m, ks.isa);
  }

  // run_streamed's product but for b and the store: x times one weight matrix ([K, 2N] stacked,
  // or one of the two [K, N]) in its own layout.
  static k::GroupedGemm streamed_gemm(const GluCall& c, const int64_t* offsets) {
    k::GroupedGemm p;
    p.groups = 1;
    p.offsets = offsets;
    p.k = c.k;
    p.n = c.w_up ? c.n : 2 * c.n;
    p.a = c.x.data();
    p.a_bf16 = c.x.dtype() == DType::kBF16;
    p.round_a_to_bf16 = rounds_x(c);
    p.b_bf16 = c.w_dtype == DType::kBF16;
    p.bf16_dot = uses_bf16_dot(c);
    p.threads = c.num_threads;
    return p;
  }

  // Whether the caller's weights go to the GEMM to be packed in strips as it goes: where its
  // threads share them (k::shares_strips), each weight then packed once. Fewer rows would take
  // per-item strips, packed again for each span of rows the items split the call into on many
  // threads: there they are packed whole ahead, as before the strips (unmeasured with them).
  static bool in_strips(const GluCall& c, const GluNativeConfig& cfg) {
    return k::shares_strips(c.num_threads, blocking(cfg), c.m);
  }

  // One group of M rows; the interleaved weights as 2 * ceil(N / nr) panels: `panels` packed
  // ahead, or (null) the caller's, which the GEMM packs a strip of gate-up panel pairs at a
  // time (BLIS's B block, a few MiB in the cache, where packing them all first wrote the whole
  // weights once more to memory: 95 MB at K = 2048, N = 5632 f32).
  static k::GroupedGemm gemm(const GluCall& c, const int64_t* offsets,
                             const k::PackedPanels* panels) {
    const auto& ks = k::best_kernels();
    const int nr = ks.nr;
    k::GroupedGemm p;
    p.groups = 1;
    p.offsets = offsets;
    p.k = c.k;
    p.n = 2 * k::round_up(std::max<int64_t>(c.n, 1), nr);
    p.a = c.x.data();
    p.a_bf16 = c.x.dtype() == DType::kBF16;
    p.round_a_to_bf16 = rounds_x(c);
    p.b_bf16 = c.w_dtype == DType::kBF16;
    p.packed = panels;
    p.bf16_dot = uses_bf16_dot(c);
    p.threads = c.num_threads;
    if (!panels) {
      // Panel q of the interleaved layout: panel q / 2 of the gate (q even) or up half.
      p.panel_group = 2;
      p.pack_b = [&c, &ks, pairs = p.bf16_dot](int64_t, void* dst, int64_t p0, int64_t p1) {
        pack_interleaved(c, ks, pairs, dst, p0, p1);
      };
    }
    return p;
  }

  // A tile's columns come in pairs of nr-wide blocks (gate, then up) of output columns
  // n0 / 2 + q nr onward: out = act(gate) * up, and h = (gate, up) with residuals.
  static k::StoreTile epilogue(const GluCall& c, int nr) {
    const auto act_mul = k::row_kernels(k::best_kernels().isa).act_mul;
    return [&c, nr, act_mul](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                             int64_t cols) {
      const int act = static_cast<int>(c.activation);
      const bool f32 = c.x.dtype() == DType::kF32;
      float* tmp = f32 ? nullptr : k::thread_scratch(k::kEpilogueSlot, nr);
      float* h = c.h() ? c.h()->data_as<float>() : nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        const float* ci = C + i * ldc;
        const int64_t r = r0 + i;
        for (int64_t q = 0; 2 * q * nr < cols; ++q) {
          const float* g = ci + 2 * q * nr;
          const float* u = g + nr;
          const int64_t col = n0 / 2 + q * nr;
          const int64_t w = std::min<int64_t>(nr, c.n - col);
          if (w <= 0) break;
          if (f32) {
            act_mul(act, g, u, c.out().data_as<float>() + r * c.n + col, w);
          } else {
            uint16_t* o = c.out().data_as<uint16_t>() + r * c.n + col;
            act_mul(act, g, u, tmp, w);
            for (int64_t j = 0; j < w; ++j) o[j] = f32_to_bf16(tmp[j]);
          }
          if (h) {
            std::memcpy(h + (2 * r) * c.n + col, g, static_cast<size_t>(w) * 4);
            std::memcpy(h + (2 * r + 1) * c.n + col, u, static_cast<size_t>(w) * 4);
          }
        }
      }
    };
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace glu

namespace {
void check_weights_data(const TensorView& w, const char* name) {
  if (w.data() == nullptr && w.size() > 0) {
    throw InvalidArgument(std::string("pack_glu_weights: ") + name + " " + w.spec().str() +
                          " has a null data pointer; expected the weights");
  }
}
}  // namespace

PackedGluWeights pack_glu_weights(const TensorView& w) {
  check_weights_data(w, "w");
  glu::GluCall c;
  c.x = TensorView(nullptr, w.dtype(), {1, w.rank() == 3 ? w.dim(0) : 0});
  c.w = w;
  glu::bind_forward(c);
  return PackedGluWeights(glu::pack(c, num_threads()));
}

PackedGluWeights pack_glu_weights(const TensorView& w_gate, const TensorView& w_up) {
  check_weights_data(w_gate, "w_gate");
  check_weights_data(w_up, "w_up");
  glu::GluCall c;
  c.x = TensorView(nullptr, w_gate.dtype(), {1, w_gate.rank() == 2 ? w_gate.dim(0) : 0});
  c.w = w_gate;
  c.w_up = w_up;
  glu::bind_forward(c);
  return PackedGluWeights(glu::pack(c, num_threads()));
}

}  // namespace tokamax
