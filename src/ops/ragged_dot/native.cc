// The native ragged_dot: its config (blocking sizes), heuristics and search space, mapped onto
// the framework-free grouped GEMM (src/kernels/grouped_gemm.h) with an epilogue that applies the
// activation and converts; and the weights packed ahead (pack_rhs).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "autotuning/bf16_dot.h"
#include "core/thread_pool.h"
#include "kernels/dotrows.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "ops/ragged_dot/base.h"

namespace tokamax {

using rdot::RaggedDotCall;
namespace k = kernels;
using kernels::round_up;

struct PackedRhs::Rep {
  ShapeDtype logical;
  RaggedDimNums dims = RaggedDimNums::kForward;
  const k::KernelSet* ks = nullptr;
  bool bf16_pairs = false;                                      // else f32 panels
  int64_t g = 0, kdim = 0, n = 0, panels = 0, panel_elems = 0;  // elements are floats or pairs
  Tensor data;
  k::PackedPanels panels_view() const { return {data.data(), panels, panel_elems, bf16_pairs}; }
};

ShapeDtype PackedRhs::logical() const { return rep_->logical; }
RaggedDimNums PackedRhs::dim_nums() const { return rep_->dims; }
bool PackedRhs::bf16_dot() const { return rep_->bf16_pairs; }

namespace {
constexpr ConfigFields<RaggedDotNativeConfig, 4> kNativeFields{
    "ragged_dot native config",
    {{{"mr", &RaggedDotNativeConfig::mr},
      {"mc", &RaggedDotNativeConfig::mc},
      {"kc", &RaggedDotNativeConfig::kc},
      {"nc", &RaggedDotNativeConfig::nc}}}};
}  // namespace

Json RaggedDotNativeConfig::to_json() const { return kNativeFields.to_json(*this); }
RaggedDotNativeConfig RaggedDotNativeConfig::from_json(const Json& j) {
  return kNativeFields.from_json(j);
}

namespace rdot {
namespace {

// Builds packed weights (parallel over panels).
std::shared_ptr<const PackedRhs::Rep> pack(const TensorView& rhs, RaggedDimNums dims,
                                           Precision precision, int threads) {
  if (dims == RaggedDimNums::kRaggedContracting)
    throw InvalidArgument("pack_rhs: ragged_contracting rhs is not packed");
  if (rhs.rank() != 3)
    throw InvalidArgument("pack_rhs: rhs has shape " + rhs.spec().str() + "; expected rank 3");
  if (!rhs.is_contiguous())
    throw InvalidArgument("pack_rhs: rhs " + rhs.spec().str() + " must be contiguous");
  if (rhs.data() == nullptr && rhs.size() > 0)
    throw InvalidArgument("pack_rhs: rhs " + rhs.spec().str() +
                          " has a null data pointer; expected the weights");
  if (rhs.dtype() != DType::kF32 && rhs.dtype() != DType::kBF16) {
    throw InvalidArgument("pack_rhs: rhs dtype " + std::string(dtype_name(rhs.dtype())) +
                          "; expected f32 or bf16");
  }
  auto r = std::make_shared<PackedRhs::Rep>();
  r->logical = rhs.spec();
  r->dims = dims;
  r->ks = &k::best_kernels();
  const bool trans = dims == RaggedDimNums::kTransposedRhs;
  r->g = rhs.dim(0);
  r->kdim = trans ? rhs.dim(2) : rhs.dim(1);
  r->n = trans ? rhs.dim(1) : rhs.dim(2);
  const int nr = r->ks->nr;
  r->panels = (r->n + nr - 1) / nr;
  r->bf16_pairs =
      rhs.dtype() == DType::kBF16 && precision == Precision::kDefault && r->ks->bf16 != nullptr;
  r->panel_elems = k::panel_elems(r->kdim, r->bf16_pairs, nr);
  r->data = Tensor({r->g * r->panels * r->panel_elems}, DType::kF32);
  const bool src_bf16 = rhs.dtype() == DType::kBF16;
  const int64_t per_group = r->kdim * r->n;
  const size_t es = dtype_size(rhs.dtype());
  parallel_for(r->g * r->panels, threads, [&](int64_t item, int) {
    const int64_t gi = item / r->panels, p = item % r->panels;
    const void* src =
        static_cast<const uint8_t*>(rhs.data()) + gi * per_group * static_cast<int64_t>(es);
    void* dst = static_cast<uint8_t*>(r->data.data()) + (gi * r->panels + p) * r->panel_elems * 4;
    k::pack_panels(*r->ks, r->bf16_pairs, src, src_bf16, trans, r->kdim, r->n, dst, p, p + 1);
  });
  return r;
}

constexpr int64_t kDecodeRows = 4;  // groups this small are weight-streaming
constexpr int64_t kMaxKc = 8192;    // scratch stays bounded (mc * kc floats per thread)

k::Blocking blocking(const RaggedDotNativeConfig& c) { return {c.mr, c.mc, c.kc, c.nc}; }

class Native : public TypedImplementation<RaggedDotCall, RaggedDotNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  int version() const override { return 2; }  // 2: unpacked weights packed or streamed per call
  std::vector<std::string> config_fields() const override { return kNativeFields.names(); }

  void check_call(const RaggedDotCall& c) const override {
    if (!c.lhs.is_contiguous())
      throw Unsupported("native needs a contiguous lhs, got strides of " + c.lhs.spec().str());
    if (c.packed.empty() && c.rhs.data() && !c.rhs.is_contiguous()) {
      throw Unsupported("native needs a contiguous rhs " + c.rhs.spec().str());
    }
    if (!c.packed.empty()) {
      const auto* r = c.packed.rep();
      if (r->ks != &k::best_kernels()) throw Unsupported("packed rhs was packed for another ISA");
      const bool want_pairs =
          r->logical.dtype == DType::kBF16 && c.precision == Precision::kDefault && r->ks->bf16;
      if (r->bf16_pairs != want_pairs)
        throw Unsupported("packed rhs precision differs from the call's precision");
    }
  }

  void check_config(const RaggedDotNativeConfig& c) const override { check(c, k::best_kernels()); }

  static void check(const RaggedDotNativeConfig& c, const k::KernelSet& ks) {
    k::check_isa_config(
        ks,
        [&](const k::KernelSet& s) { return k::blocking_fits(s, c.mr, c.mc, c.kc, c.nc, s.nr); },
        [&](const k::KernelSet& s) {
          return "ragged_dot native config " + canonical_dump(c.to_json()) +
                 " is invalid for ISA " + s.name + ": expected " + k::blocking_rules(s, s.nr);
        });
  }

  // Rows and columns that the kernel's "M" and "N" mean for this call.
  static void problem(const RaggedDotCall& c, int64_t* max_rows, int64_t* cols, int64_t* depth,
                      int64_t* groups_nonempty) {
    *groups_nonempty = 0;
    int64_t mx = 0;
    for (int32_t s : c.group_sizes) {
      mx = std::max<int64_t>(mx, s);
      *groups_nonempty += s > 0;
    }
    if (c.dims == RaggedDimNums::kRaggedContracting) {
      *max_rows = c.k;
      *cols = c.n;
      *depth = mx;
    } else {
      *max_rows = mx;
      *cols = c.n;
      *depth = c.k;
    }
  }

  // Big row blocks: the tallest tiles in items of up to item_tiles() of them, K blocks of 256,
  // items as wide as possible (up to 1024 columns: the packed A tile is reused across every panel
  // of the item). Each weight panel is then read once per ~200 rows. Measured on Sapphire Rapids, 2
  // threads, interleaved rounds, against the 8-row tiles in 32-row items and K blocks of 512 these
  // heuristics had from Zen 4: 8 x 512 rows, K = N = 1024, 35.0 vs 45.1 ms (33.1 vs 39.2
  // pre-packed) with 12 x 16 tiles, 31.7 with 14 x 14; one group of 2048 rows, 15.8-16.2 vs 19.0
  // ms, 14.9 with 14 x 14. A few rows per group (decode) stream weights through the multi-panel
  // kernels.
  RaggedDotNativeConfig heuristics(const RaggedDotCall& c) const override {
    const auto& ks = k::best_kernels();
    int64_t rows, cols, depth, ng;
    problem(c, &rows, &cols, &depth, &ng);
    RaggedDotNativeConfig cfg;
    const int64_t depth2 = round_up(std::max<int64_t>(depth, 2), 2);
    if (rows <= kDecodeRows) {
      cfg.mr = static_cast<int>(std::clamp<int64_t>(rows, 1, ks.max_mr));
      cfg.mc = cfg.mr;
    } else {
      cfg.mr = ks.max_mr;
      cfg.mc = cfg.mr * static_cast<int>(std::clamp<int64_t>((rows + cfg.mr - 1) / cfg.mr, 1,
                                                             k::item_tiles(ks)));
    }
    // K blocks of 256 keep the packed A block in L2 while it is reused across the item's panels.
    // When the weights are read once anyway (few rows per group), one K block: each panel is
    // then one long stream, not K/256 short ones, each restarting the prefetchers (one thread:
    // GPT-OSS decode 28-29.5 vs 25.7 GB/s, whose K = 2880 also left a 320-deep tail block;
    // memory_bound 30.2 vs 28.6; two threads: within 2%).
    const bool streaming = weight_streaming(c);
    cfg.kc = static_cast<int>(std::min<int64_t>(depth2, streaming ? kMaxKc : 256));
    // Enough work items to balance threads, as wide as possible otherwise.
    const int64_t row_blocks =
        std::max<int64_t>(1, ng) * std::max<int64_t>(1, (rows + cfg.mc - 1) / cfg.mc);
    // ... but no item under ~1 MFLOP (or ~1 MB of weights): below that, splitting costs more
    // than it balances.
    const double work = std::max(call_flops(c) / 1e6, weight_bytes(c) / 1e6);
    const int64_t want =
        std::clamp<int64_t>(static_cast<int64_t>(work), 1, 4 * std::max(1, c.num_threads));
    const int64_t nc =
        k::item_columns(row_blocks, cols, want, streaming ? c.num_threads : 0, 1024, ks.nr);
    cfg.nc = static_cast<int>(
        round_up(std::min<int64_t>(nc, round_up(std::max<int64_t>(cols, 1), ks.nr)), ks.nr));
    return cfg;
  }

  // Tens of configs: decode shapes vary the K block and item width around a tile of all the
  // rows; larger groups vary tile height, item height, K block and item width.
  std::vector<RaggedDotNativeConfig> search_space(const RaggedDotCall& c) const override {
    const auto& ks = k::best_kernels();
    int64_t rows, cols, depth, ng;
    problem(c, &rows, &cols, &depth, &ng);
    const int64_t depth2 = round_up(std::max<int64_t>(depth, 2), 2);
    const int64_t rows1 = std::max<int64_t>(rows, 1);
    const int64_t cols_r = round_up(std::max<int64_t>(cols, 1), ks.nr);
    std::vector<RaggedDotNativeConfig> out;
    // Blocks larger than the problem behave like the problem size: clamp, then drop repeats.
    auto add = [&](int mr, int mc, int kc, int nc) {
      const RaggedDotNativeConfig cfg{mr, mc, static_cast<int>(std::min<int64_t>(kc, depth2)),
                                      static_cast<int>(std::min<int64_t>(nc, cols_r))};
      if (std::find(out.begin(), out.end(), cfg) == out.end()) out.push_back(cfg);
    };
    if (rows1 <= kDecodeRows) {
      const int mr = static_cast<int>(std::min<int64_t>(rows1, ks.max_mr));
      std::vector<int> kcs = {128, 256, 512};
      if (depth2 > 512) kcs.push_back(static_cast<int>(std::min<int64_t>(depth2, kMaxKc)));
      for (int kc : kcs) {
        for (int nc : {128, 256, 512, 1024}) add(mr, mr, kc, nc);
      }
      return out;
    }
    const std::vector<int> mrs =
        ks.max_mr >= 12 ? std::vector<int>{8, ks.max_mr} : std::vector<int>{4, ks.max_mr};
    for (int mr : mrs) {
      if (mr > rows1 && mr != mrs.front()) continue;  // tiles taller than the groups
      std::vector<int> kcs = {128, 256, 512};
      if (weight_streaming(c) && depth2 > 512)
        kcs.push_back(static_cast<int>(std::min<int64_t>(depth2, kMaxKc)));
      for (int mcf : {4, 8, k::item_tiles(ks)}) {
        if (mr * mcf > round_up(rows1, mr) * 2 && mcf != 4) continue;
        for (int kc : kcs) {
          for (int nc : {256, 512, 1024}) add(mr, mr * mcf, kc, nc);
        }
      }
    }
    return out;
  }

  // The cost model the autotuner ranks the search space by: a roofline over the blocking with
  // nominal ceilings (only the ranking matters, so absolute rates cancel; their ratios are
  // typical of this class of core: 2 FMA ports at 3 GHz, ~12 GB/s of DRAM and 4x that from the
  // last-level cache per core). Terms: arithmetic on padded tiles (rows to the tile height,
  // columns to the panel width) at the microkernel's efficiency for its tile height (the B loads
  // of each k step are its overhead); the weights streamed from DRAM once and re-read from the
  // last-level cache once per further row block; A re-read once per column block and partial
  // sums of C re-read once per K block; work items rounded up to whole waves of threads; a
  // fixed cost per item.
  double estimate(const RaggedDotCall& c, const RaggedDotNativeConfig& cfg) const override {
    if (c.dims == RaggedDimNums::kRaggedContracting) return std::nan("");
    const auto& ks = k::best_kernels();
    const bool bf16 = native_uses_bf16_dot(c);
    const double lanes = ks.nr / 2.0;  // two vectors per panel row
    const double f32_rate = 4 * lanes * 3e9;
    const double rate = !bf16 ? f32_rate : ks.amx ? 16 * f32_rate : 2 * f32_rate;
    const double dram = 12e9, llc = 48e9;
    const double wb = bf16 ? 2 : dtype_size(c.rhs.dtype());
    const int tile_rows = bf16 && ks.amx ? k::kAmxRows : cfg.mr;
    const double eff = cfg.mr * 2.0 / (cfg.mr * 2.0 + 2.0);
    const int64_t cols_pad = round_up(std::max<int64_t>(c.n, 1), ks.nr);
    const int64_t col_blocks = (c.n + cfg.nc - 1) / cfg.nc;
    const int64_t k_blocks = (c.k + cfg.kc - 1) / cfg.kc;
    double flops = 0, dram_bytes = 0, llc_bytes = 0;
    int64_t items = 0;
    for (int64_t gi = 0; gi < c.g; ++gi) {
      const int64_t m = c.offsets[gi + 1] - c.offsets[gi];
      if (m == 0) continue;
      const int64_t row_blocks = (m + cfg.mc - 1) / cfg.mc;
      int64_t rows_pad = 0;
      for (int64_t r = 0; r < m; r += cfg.mc)
        rows_pad += round_up(std::min<int64_t>(cfg.mc, m - r), tile_rows);
      flops += 2.0 * static_cast<double>(rows_pad * cols_pad * c.k);
      const double w = static_cast<double>(c.k * c.n) * wb;
      dram_bytes += w + static_cast<double>(m * c.k) * 4 + static_cast<double>(m * c.n) * 4;
      llc_bytes += w * static_cast<double>(row_blocks - 1) +
                   static_cast<double>(m * c.k * 4 * (col_blocks - 1)) +
                   static_cast<double>(m * c.n * 8 * (k_blocks - 1));
      items += row_blocks * col_blocks;
    }
    const int threads = std::max(1, c.num_threads);
    const double waves = std::ceil(static_cast<double>(items) / threads);
    const double imbalance = items > 0 ? waves * threads / static_cast<double>(items) : 1;
    const double compute_s = flops / (rate * eff) / threads * imbalance;
    const double memory_s = dram_bytes / (dram * threads) + llc_bytes / (llc * threads);
    return (std::max(compute_s, memory_s) + waves * 2e-6) * 1e3;
  }

  int64_t scratch(const RaggedDotCall& c, const RaggedDotNativeConfig& cfg) const override {
    if (c.dims == RaggedDimNums::kRaggedContracting) {
      k::GroupedGemmTn p;
      operands(c, nullptr, p);
      return k::grouped_gemm_tn_scratch_bytes(p, blocking(cfg), k::best_kernels());
    }
    k::PackedPanels panels;
    k::GroupedGemm p = gemm(c, nullptr, &panels);
    return k::grouped_gemm_scratch_bytes(p, blocking(cfg), k::best_kernels());
  }

  void run_call(RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                const Prepared*) const override {
    const auto& ks = k::best_kernels();
    check(cfg, ks);
    char* out = static_cast<char*>(c.out().data());
    if (c.dims == RaggedDimNums::kRaggedContracting) {
      k::GroupedGemmTn p;
      operands(c, out, p);
      k::grouped_gemm_tn(p, blocking(cfg), ks);
      return;
    }
    // Rows past the groups are zero.
    const int64_t used = c.offsets.back();
    const size_t es = dtype_size(c.out_dtype);
    if (used < c.m)
      std::memset(out + used * c.n * es, 0, static_cast<size_t>((c.m - used) * c.n) * es);
    if (rows_stream(c)) {
      run_rows_stream(c, out);
      return;
    }
    k::PackedPanels panels;
    k::GroupedGemm p = gemm(c, out, &panels);
    k::grouped_gemm(p, blocking(cfg), ks);
  }

  // Decode on weights stored out-features first (the transposed form, unpacked: torch's
  // nn.Linear and transformers' experts as a model holds them): each group's few rows against
  // its weight rows on the dotrows kernel, which reads each group's weights in place as one
  // sequential stream. Up to one pass of the kernel's rows a group: past that its f32 FMAs, not
  // memory, bound it, and the grouped GEMM re-uses each weight more (Qwen3-30B-A3B's experts
  // at 64 tokens, 4 rows an expert on average: 91 ms here against 74; Zen 4, 2 threads).
  static bool rows_stream(const RaggedDotCall& c) {
    if (c.dims != RaggedDimNums::kTransposedRhs || !c.packed.empty() || c.k == 0 || c.n == 0)
      return false;
    for (int32_t s : c.group_sizes)
      if (s > k::kDotMaxRows) return false;
    return true;
  }

  static void run_rows_stream(const RaggedDotCall& c, char* out) {
    static const k::DotRowsKernel kernel = k::dotrows_kernel(k::best_kernels().isa);
    constexpr int64_t kCols = 64;  // output columns a work item: the threads balance over them
    struct Item {
      int64_t g, c0;
    };
    std::vector<Item> items;
    for (int64_t g = 0; g < c.g; ++g)
      if (c.offsets[g + 1] > c.offsets[g])
        for (int64_t c0 = 0; c0 < c.n; c0 += kCols) items.push_back({g, c0});
    Tensor storage;
    const float* a = c.lhs_f32(&storage);
    const bool bf16 = c.rhs.dtype() == DType::kBF16;
    const auto* w = static_cast<const char*>(c.rhs.data());
    const int64_t es = static_cast<int64_t>(dtype_size(c.rhs.dtype()));
    const k::StoreTile store = epilogue(c, out);
    parallel_for(static_cast<int64_t>(items.size()), c.num_threads, [&](int64_t i, int) {
      const Item& it = items[static_cast<size_t>(i)];
      const int64_t r0 = c.offsets[it.g], rows = c.offsets[it.g + 1] - r0;
      const int64_t cols = std::min(kCols, c.n - it.c0);
      float tile[k::kDotMaxRows * kCols];
      kernel(static_cast<int>(rows), cols, c.k, a + r0 * c.k, c.k,
             w + (it.g * c.n + it.c0) * c.k * es, bf16, c.k, tile, kCols);
      store(tile, kCols, r0, rows, it.c0, cols);
    });
  }

 private:
  // The grouped GEMM of a forward or transposed-rhs call; *panels holds pre-packed weights'
  // view when there are some.
  static k::GroupedGemm gemm(const RaggedDotCall& c, char* out, k::PackedPanels* panels) {
    k::GroupedGemm p;
    operands(c, out, p);
    if (!c.packed.empty()) {
      *panels = c.packed.rep()->panels_view();
      p.packed = panels;
    }
    p.b_trans = c.dims == RaggedDimNums::kTransposedRhs;
    p.bf16_dot = native_uses_bf16_dot(c);
    return p;
  }

  // The call's groups, operands and epilogue (none without an output: scratch sizing).
  static void operands(const RaggedDotCall& c, char* out, k::GroupedOperands& p) {
    p.groups = c.g;
    p.offsets = c.offsets.data();
    p.k = c.k;
    p.n = c.n;
    p.a = c.lhs.data();
    p.a_bf16 = c.lhs.dtype() == DType::kBF16;
    p.round_a_to_bf16 = c.lhs_as_bf16();
    p.b = c.rhs.data();
    p.b_bf16 = c.rhs.dtype() == DType::kBF16;
    if (out) p.store = epilogue(c, out);
    p.threads = c.num_threads;
  }

  // Activation on the f32 accumulator, conversion, store into the [rows, N] output.
  static k::StoreTile epilogue(const RaggedDotCall& c, char* out) {
    return
        [&c, out](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0, int64_t cols) {
          const int64_t ld_out = c.n;
          for (int64_t i = 0; i < rows; ++i) {
            const float* ci = C + i * ldc;
            const int64_t base = (r0 + i) * ld_out + n0;
            if (c.out_dtype == DType::kF32) {
              float* o = reinterpret_cast<float*>(out) + base;
              if (c.activation == Activation::kNone) {
                std::memcpy(o, ci, static_cast<size_t>(cols) * 4);
              } else if (c.activation == Activation::kRelu) {
                for (int64_t j = 0; j < cols; ++j) o[j] = ci[j] > 0 ? ci[j] : 0.0f;
              } else {
                for (int64_t j = 0; j < cols; ++j) o[j] = apply_activation(c.activation, ci[j]);
              }
            } else {
              uint16_t* o = reinterpret_cast<uint16_t*>(out) + base;
              for (int64_t j = 0; j < cols; ++j)
                o[j] = f32_to_bf16(apply_activation(c.activation, ci[j]));
            }
          }
        };
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

bool native_uses_bf16_dot(const RaggedDotCall& c) {
  const DType rd = c.packed.empty() ? c.rhs.dtype() : c.packed.logical().dtype;
  if (rd != DType::kBF16 || c.precision != Precision::kDefault || k::best_kernels().bf16 == nullptr)
    return false;
  // Pre-packed weights keep the packing's choice; unpacked ones are widened to f32 panels
  // where the f32 FMA outruns the bf16 dot (Intel: 1.5x on compute-bound calls).
  return c.packed.empty() ? bf16_dot_pays() : c.packed.bf16_dot();
}

}  // namespace rdot

PackedRhs pack_rhs(const TensorView& rhs, RaggedDimNums dims, Precision precision) {
  return PackedRhs(rdot::pack(rhs, dims, precision, num_threads()));
}

}  // namespace tokamax
