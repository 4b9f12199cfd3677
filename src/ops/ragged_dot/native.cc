// The native ragged_dot: packed weights, cache-blocked loops around SIMD microkernels chosen at
// run time, threads over (group, row block, column block) work items scheduled dynamically so
// skewed groups still balance. Loops (BLIS order, per work item):
//   for kb in K step kc:           (A block mc x kc stays in L2)
//     for panel in item's columns: (B panel kc x nr stays in L1)
//       for row tile of mr rows:   microkernel
//   epilogue: activation on the f32 accumulator, convert, store.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/thread_pool.h"
#include "ops/ragged_dot/base.h"
#include "ops/ragged_dot/native_kernels.h"

namespace tokamax {

using rdot::RaggedDotCall;
namespace k = rdot::kernels;

struct PackedRhs::Rep {
  ShapeDtype logical;
  RaggedDimNums dims = RaggedDimNums::kForward;
  const k::KernelSet* ks = nullptr;
  bool bf16_pairs = false;                                      // else f32 panels
  int64_t g = 0, kdim = 0, n = 0, panels = 0, panel_elems = 0;  // elements are floats or pairs
  Tensor data;
  const void* group(int64_t gi) const {
    return static_cast<const uint8_t*>(data.data()) + gi * panels * panel_elems * 4;
  }
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

// Elements (floats, or bf16 pairs) of one packed panel of K rows and nr columns.
int64_t panel_elems(int64_t K, bool pairs, int nr) { return (pairs ? (K + 1) / 2 : K) * nr; }

// Panels [p0, p1) of one group's weights into dst: bf16 pairs (for the bf16 dot) or f32.
void pack_panels(const k::KernelSet& ks, bool pairs, const void* src, bool src_bf16, bool trans,
                 int64_t K, int64_t N, void* dst, int64_t p0, int64_t p1) {
  if (!pairs) {
    k::pack_panels_f32(src, src_bf16, trans, K, N, ks.nr, static_cast<float*>(dst), p0, p1);
  } else if (src_bf16 && !trans && ks.pack_b_bf16) {
    ks.pack_b_bf16(static_cast<const uint16_t*>(src), K, N, ks.nr, static_cast<uint32_t*>(dst), p0,
                   p1);
  } else {
    k::pack_panels_bf16(src, src_bf16, trans, K, N, ks.nr, static_cast<uint32_t*>(dst), p0, p1);
  }
}

// Builds packed weights (parallel over panels).
std::shared_ptr<const PackedRhs::Rep> pack(const TensorView& rhs, RaggedDimNums dims,
                                           Precision precision, int threads) {
  if (dims == RaggedDimNums::kRaggedContracting)
    throw InvalidArgument("pack_rhs: ragged_contracting rhs is not packed");
  if (rhs.rank() != 3)
    throw InvalidArgument("pack_rhs: rhs has shape " + rhs.spec().str() + "; expected rank 3");
  if (!rhs.is_contiguous())
    throw InvalidArgument("pack_rhs: rhs " + rhs.spec().str() + " must be contiguous");
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
  r->panel_elems = panel_elems(r->kdim, r->bf16_pairs, nr);
  r->data = Tensor({r->g * r->panels * r->panel_elems}, DType::kF32);
  const bool src_bf16 = rhs.dtype() == DType::kBF16;
  const int64_t per_group = r->kdim * r->n;
  const size_t es = dtype_size(rhs.dtype());
  parallel_for(r->g * r->panels, threads, [&](int64_t item, int) {
    const int64_t gi = item / r->panels, p = item % r->panels;
    const void* src =
        static_cast<const uint8_t*>(rhs.data()) + gi * per_group * static_cast<int64_t>(es);
    void* dst =
        const_cast<uint8_t*>(static_cast<const uint8_t*>(r->group(gi))) + p * r->panel_elems * 4;
    pack_panels(*r->ks, r->bf16_pairs, src, src_bf16, trans, r->kdim, r->n, dst, p, p + 1);
  });
  return r;
}

struct Item {
  int64_t g, m0, rows, n0, cols;
};

constexpr int64_t kDecodeRows = 4;  // groups this small are weight-streaming
constexpr int64_t kMaxKc = 8192;    // scratch stays bounded (mc * kc floats per thread)

// Per-thread scratch, kept between calls: pool threads are persistent, so steady-state calls
// allocate nothing. Each slot grows to the largest request seen on the thread.
// Slots: C tile + packed A; an item's packed weight strip; the strip a call's threads share
// (held by the calling thread, which may run items too, hence its own slot).
enum ScratchSlot { kTileSlot = 0, kStripSlot = 1, kSharedStripSlot = 2 };
float* thread_scratch(ScratchSlot slot, int64_t floats) {
  thread_local Tensor buffers[3];
  Tensor& buffer = buffers[slot];
  if (buffer.size() < floats) buffer = Tensor({floats}, DType::kF32);
  return buffer.data_as<float>();
}

// Unpacked weights are packed one item's columns at a time into a per-thread strip of K rows
// (BLIS's packed B block, reused by every row block of the item). Items are narrowed so that
// the strip stays within this size, whatever K is.
constexpr int64_t kMaxStripBytes = int64_t{8} << 20;

// Panels the multi-panel (weight-streaming) kernel takes at once for an item of `rows` rows
// with `left` panels to go; 1 = use the regular kernel. The whole item must be one packed A
// tile (rows <= mr).
int multi_panels(const k::KernelSet& ks, int64_t rows, int mr, int64_t left) {
  if (rows < 1 || rows > mr || rows > k::kMultiMaxMr || !ks.f32_multi) return 1;
  const int np = ks.multi_np[rows];
  return np > 1 && left >= np ? np : 1;
}

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
    if (c.mr < 1 || c.mr > ks.max_mr || c.mc < c.mr || c.mc % c.mr != 0 || c.kc < 2 ||
        c.kc % 2 != 0 || c.nc < ks.nr || c.nc % ks.nr != 0) {
      throw InvalidArgument(
          "ragged_dot native config " + canonical_dump(c.to_json()) + " is invalid for ISA " +
          ks.name + ": expected 1 <= mr <= " + std::to_string(ks.max_mr) +
          ", mc a multiple of mr, kc even >= 2, nc a multiple of " + std::to_string(ks.nr));
    }
  }

  static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

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

  // Measured on Zen 4 (tokamax autotune --tag primary): big row blocks want 8-row tiles,
  // 32-row items, K blocks of 512 and items as wide as possible (up to 1024 columns: the packed
  // A tile is reused across every panel of the item), ~90% of FMA peak; a few rows per group
  // (decode) stream weights through the multi-panel kernels.
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
      cfg.mr = std::min(8, ks.max_mr);
      cfg.mc = cfg.mr * static_cast<int>(std::clamp<int64_t>((rows + cfg.mr - 1) / cfg.mr, 1, 4));
    }
    // K blocks of 512 keep the packed A tile in L2 while it is reused across the item's panels.
    // When the weights are read once anyway (few rows per group), one K block: each panel is
    // then one long stream, not K/512 short ones, each restarting the prefetchers (one thread:
    // GPT-OSS decode 28-29.5 vs 25.7 GB/s, whose K = 2880 also left a 320-deep tail block;
    // memory_bound 30.2 vs 28.6; two threads: within 2%).
    const bool streaming = weight_streaming(c);
    cfg.kc = static_cast<int>(std::min<int64_t>(depth2, streaming ? kMaxKc : 512));
    // Enough work items to balance threads, as wide as possible otherwise.
    const int64_t row_blocks =
        std::max<int64_t>(1, ng) * std::max<int64_t>(1, (rows + cfg.mc - 1) / cfg.mc);
    // ... but no item under ~1 MFLOP (or ~1 MB of weights): below that, splitting costs more
    // than it balances.
    const double work = std::max(call_flops(c) / 1e6, weight_bytes(c) / 1e6);
    const int64_t want =
        std::clamp<int64_t>(static_cast<int64_t>(work), 1, 4 * std::max(1, c.num_threads));
    int nc = 1024;
    while (nc > ks.nr && row_blocks * ((cols + nc - 1) / nc) < want) nc /= 2;
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
        ks.max_mr >= 12 ? std::vector<int>{8, 12} : std::vector<int>{4, ks.max_mr};
    for (int mr : mrs) {
      if (mr > rows1 && mr != mrs.front()) continue;  // tiles taller than the groups
      std::vector<int> kcs = {128, 256, 512};
      if (weight_streaming(c) && depth2 > 512)
        kcs.push_back(static_cast<int>(std::min<int64_t>(depth2, kMaxKc)));
      for (int mcf : {4, 8, 16}) {
        if (mr * mcf > round_up(rows1, mr) * 2 && mcf != 4) continue;
        for (int kc : kcs) {
          for (int nc : {256, 512, 1024}) add(mr, mr * mcf, kc, nc);
        }
      }
    }
    return out;
  }

  int64_t scratch(const RaggedDotCall& c, const RaggedDotNativeConfig& cfg) const override {
    const auto& ks = k::best_kernels();
    // A tile per thread; unpacked: also a strip per thread and the one the threads share.
    const int64_t tile = tile_floats(cfg, ks) * 4;
    const int64_t strip = c.packed.empty() && c.dims != RaggedDimNums::kRaggedContracting
                              ? strip_floats(c, ks, strip_cols(c, cfg, ks)) * 4
                              : 0;
    return (tile + strip) * pool_threads(c) + strip;
  }

  void run_call(RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                const Prepared*) const override {
    const auto& ks = k::best_kernels();
    check(cfg, ks);
    if (c.dims == RaggedDimNums::kRaggedContracting) {
      run_contracting(c, cfg, ks);
      return;
    }
    // Rows past the groups are zero.
    const int64_t used = c.offsets.back();
    const size_t es = dtype_size(c.out_dtype);
    char* out = static_cast<char*>(c.out().data());
    if (used < c.m)
      std::memset(out + used * c.n * es, 0, static_cast<size_t>((c.m - used) * c.n) * es);
    if (c.packed.empty()) {
      run_unpacked(c, cfg, ks);
    } else {
      run_packed(c, cfg, ks);
    }
  }

 private:
  // Per thread: the C tile (mc x nc, or up to kStreamMaxMr rows for the streaming kernels) and
  // after it the packed A block (mc x kc floats or bf16 pairs).
  static int64_t c_tile_floats(const RaggedDotNativeConfig& cfg, const k::KernelSet& ks) {
    return std::max<int64_t>(cfg.mc, k::kStreamMaxMr) * round_up(cfg.nc, ks.nr);
  }
  static int64_t tile_floats(const RaggedDotNativeConfig& cfg, const k::KernelSet& ks) {
    return c_tile_floats(cfg, ks) + static_cast<int64_t>(cfg.mc) * cfg.kc;
  }
  struct Tile {
    float* c;
    uint32_t* apack;
  };
  static Tile thread_tile(const RaggedDotNativeConfig& cfg, const k::KernelSet& ks) {
    float* c = thread_scratch(kTileSlot, tile_floats(cfg, ks));
    return {c, reinterpret_cast<uint32_t*>(c + c_tile_floats(cfg, ks))};
  }

  // Columns per item of an unpacked call: the config's, narrowed so that the packed strip of K
  // rows stays under kMaxStripBytes.
  static int64_t strip_cols(const RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                            const k::KernelSet& ks) {
    const int64_t row_bytes = std::max<int64_t>(c.k, 2) * 4;
    const int64_t fit = std::max<int64_t>(ks.nr, kMaxStripBytes / row_bytes / ks.nr * ks.nr);
    return std::min<int64_t>(cfg.nc, fit);
  }
  static int64_t strip_floats(const RaggedDotCall& c, const k::KernelSet& ks, int64_t cols) {
    return (cols + ks.nr - 1) / ks.nr * panel_elems(c.k, native_uses_bf16_dot(c), ks.nr);
  }

  // Output rows [m0, m0+rows) x columns [0, cols) of an item, relative to its first column, into
  // the f32 tile C (row stride ldc), from weights in panels: `b` is the item's first panel,
  // panels are panel_stride elements apart (floats, or bf16 pairs when `pairs`). A is the f32 lhs
  // (unused with pairs, which pack the lhs themselves).
  static void compute_block(const RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                            const k::KernelSet& ks, bool pairs, const float* A, const void* b,
                            int64_t panel_stride, int64_t m0, int64_t item_rows, int64_t cols,
                            float* C, int64_t ldc, uint32_t* apack) {
    const int64_t K = c.k;
    const int64_t np = (cols + ks.nr - 1) / ks.nr;
    const bool lhs_bf16 = c.lhs.dtype() == DType::kBF16;
    for (int64_t kb = 0; kb < K; kb += cfg.kc) {
      const int64_t kcur = std::min<int64_t>(cfg.kc, K - kb);
      const bool acc = kb > 0;
      if (pairs) {
        const int64_t kp = (kcur + 1) / 2;
        const int64_t tiles = (item_rows + cfg.mr - 1) / cfg.mr;
        for (int64_t tt = 0; tt < tiles; ++tt) {
          const int64_t rows = std::min<int64_t>(cfg.mr, item_rows - tt * cfg.mr);
          const int64_t esz = lhs_bf16 ? 2 : 4;
          ks.pack_a_bf16(static_cast<const char*>(c.lhs.data()) + (m0 + tt * cfg.mr) * K * esz,
                         lhs_bf16, K, rows, kb, kcur, cfg.mr, apack + tt * cfg.mr * kp);
        }
        for (int64_t p = 0; p < np;) {
          const uint32_t* bp =
              static_cast<const uint32_t*>(b) + p * panel_stride + (kb / 2) * ks.nr;
          if (const int step = multi_panels(ks, item_rows, cfg.mr, np - p); step > 1) {
            ks.bf16_multi(static_cast<int>(item_rows), kp, apack, cfg.mr, bp, panel_stride,
                          C + p * ks.nr, ldc, acc);
            p += step;
            continue;
          }
          for (int64_t tt = 0; tt < tiles; ++tt) {
            const int rows = static_cast<int>(std::min<int64_t>(cfg.mr, item_rows - tt * cfg.mr));
            ks.bf16(rows, kp, apack + tt * cfg.mr * kp, cfg.mr, bp,
                    C + tt * cfg.mr * ldc + p * ks.nr, ldc, acc);
          }
          ++p;
        }
      } else {
        float* af = reinterpret_cast<float*>(apack);
        k::pack_a_f32(A + m0 * K, K, item_rows, kb, kcur, cfg.mr, af);
        for (int64_t p = 0; p < np;) {
          const float* bp = static_cast<const float*>(b) + p * panel_stride + kb * ks.nr;
          if (const int step = multi_panels(ks, item_rows, cfg.mr, np - p); step > 1) {
            ks.f32_multi(static_cast<int>(item_rows), kcur, af, 1, cfg.mr, bp, panel_stride,
                         C + p * ks.nr, ldc, acc);
            p += step;
            continue;
          }
          for (int64_t i = 0; i < item_rows; i += cfg.mr) {
            const int rows = static_cast<int>(std::min<int64_t>(cfg.mr, item_rows - i));
            ks.f32(rows, kcur, af + i * kcur, 1, cfg.mr, bp, C + i * ldc + p * ks.nr, ldc, acc);
          }
          ++p;
        }
      }
    }
    if (K == 0) {
      for (int64_t i = 0; i < item_rows; ++i) std::fill(C + i * ldc, C + i * ldc + cols, 0.0f);
    }
  }

  static int pool_threads(const RaggedDotCall& c) {
    return std::min<int>(c.num_threads, ThreadPool::global().size());
  }

  // Weights pre-packed by pack_rhs: items of (group, mc rows, nc columns) over the packed panels.
  static void run_packed(RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                         const k::KernelSet& ks) {
    const PackedRhs::Rep& r = *c.packed.rep();
    std::vector<Item> items;
    for (int64_t g = 0; g < c.g; ++g) {
      for (int64_t m0 = c.offsets[g]; m0 < c.offsets[g + 1]; m0 += cfg.mc) {
        for (int64_t n0 = 0; n0 < c.n; n0 += cfg.nc) {
          items.push_back({g, m0, std::min<int64_t>(cfg.mc, c.offsets[g + 1] - m0), n0,
                           std::min<int64_t>(cfg.nc, c.n - n0)});
        }
      }
    }
    // Biggest items first: dynamic scheduling then balances the tail.
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.rows > b.rows; });
    // The f32 kernels read the lhs as f32: a bf16 lhs widened, or an f32 one rounded when the
    // bf16 path would have rounded it (bf16 weights on an ISA without a bf16 dot). Per call.
    Tensor lhs_storage;
    const float* A = r.bf16_pairs ? nullptr : c.lhs_f32(&lhs_storage);
    char* out = static_cast<char*>(c.out().data());
    parallel_for(static_cast<int64_t>(items.size()), pool_threads(c), [&](int64_t idx, int) {
      const Item& it = items[idx];
      const Tile t = thread_tile(cfg, ks);
      const void* b =
          static_cast<const uint8_t*>(r.group(it.g)) + (it.n0 / ks.nr) * r.panel_elems * 4;
      compute_block(c, cfg, ks, r.bf16_pairs, A, b, r.panel_elems, it.m0, it.rows, it.cols, t.c,
                    cfg.nc, t.apack);
      epilogue(c, t.c, cfg.nc, it.m0, it.rows, it.n0, it.cols, c.n, out);
    });
  }

  // Weights as the caller holds them ([G,K,N] or [G,N,K], f32 or bf16), nothing packed ahead:
  //  - groups of at most kStreamMaxMr rows stream the weights straight from their layout
  //    (each weight is used by so few rows that a packed copy would cost as much as the call);
  //  - larger groups pack one item's columns at a time into a per-thread strip (BLIS's packed B
  //    block), reused by every row block of the item, so packing is amortized over its rows.
  // Empty groups cost nothing: no item touches their weights.
  static void run_unpacked(RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                           const k::KernelSet& ks) {
    const bool trans = c.dims == RaggedDimNums::kTransposedRhs;
    const bool src_bf16 = c.rhs.dtype() == DType::kBF16;
    const bool pairs = native_uses_bf16_dot(c);
    const k::StreamKernel stream = trans ? ks.stream_t : ks.stream;
    const int64_t K = c.k, N = c.n;
    const int threads = pool_threads(c);
    auto streams = [&](int64_t rows) { return stream && rows <= k::kStreamMaxMr; };
    // Groups tall enough to keep every thread busy on their row blocks alone share one strip
    // at a time (BLIS's shared B block): the threads pack it together, a panel each, then
    // compute its row blocks. Each weight is then packed once and each lhs tile once per
    // strip, as with pre-packed weights; per-item strips would pack both several times.
    auto shared = [&](int64_t rows) { return !streams(rows) && rows >= 2 * threads * cfg.mc; };
    // Rows per item for the other packed-strip groups: as many as still gives 4 items a thread.
    int64_t max_rows = 0;
    bool any_stream = false;
    for (int32_t s : c.group_sizes) {
      if (s == 0 || shared(s)) continue;
      if (streams(s))
        any_stream = true;
      else
        max_rows = std::max<int64_t>(max_rows, s);
    }
    // Items: first all of a group's rows and the config's columns; while that leaves fewer
    // than 4 items per thread, narrower columns (down to 256), then fewer rows. Each strip is
    // then packed once and used by every row of its group; halving the rows instead packs
    // the weights again for every row span (compute_bound: 1.2x the pre-packed call's time).
    auto count_items = [&](int64_t span, int64_t cols) {
      const int64_t col_blocks = (N + cols - 1) / cols;
      int64_t n = 0;
      for (int32_t s : c.group_sizes) {
        if (s > 0 && !shared(s)) n += (streams(s) ? 1 : (s + span - 1) / span) * col_blocks;
      }
      return n;
    };
    int64_t span = std::max<int64_t>(round_up(max_rows, cfg.mc), cfg.mc);
    const int64_t full_cols = strip_cols(c, cfg, ks);
    int64_t ncols = full_cols;
    const int64_t min_cols = std::min<int64_t>(ncols, round_up(256, ks.nr));
    while (count_items(span, ncols) < 4 * threads) {
      if (ncols > min_cols) {
        ncols = std::max(min_cols, round_up(ncols / 2, ks.nr));
      } else if (span > cfg.mc) {
        span = std::max<int64_t>(cfg.mc, round_up(span / 2, cfg.mc));
      } else {
        break;
      }
    }
    std::vector<Item> items;
    for (int64_t g = 0; g < c.g; ++g) {
      const int64_t rows_g = c.offsets[g + 1] - c.offsets[g];
      if (shared(rows_g)) continue;
      const int64_t step = streams(rows_g) ? rows_g : span;
      for (int64_t m0 = c.offsets[g]; m0 < c.offsets[g + 1]; m0 += step) {
        for (int64_t n0 = 0; n0 < N; n0 += ncols) {
          items.push_back({g, m0, std::min<int64_t>(step, c.offsets[g + 1] - m0), n0,
                           std::min<int64_t>(ncols, N - n0)});
        }
      }
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const Item& a, const Item& b) { return a.rows > b.rows; });
    Tensor lhs_storage;
    const float* A = !pairs || any_stream ? c.lhs_f32(&lhs_storage) : nullptr;
    char* out = static_cast<char*>(c.out().data());
    const size_t src_es = dtype_size(c.rhs.dtype());
    const int64_t strip = strip_floats(c, ks, ncols);
    const int64_t pe = panel_elems(K, pairs, ks.nr);
    const int64_t ldc = round_up(ncols, ks.nr);
    parallel_for(static_cast<int64_t>(items.size()), pool_threads(c), [&](int64_t idx, int) {
      const Item& it = items[idx];
      const auto [C, apack] = thread_tile(cfg, ks);
      const char* wg =
          static_cast<const char*>(c.rhs.data()) + it.g * K * N * static_cast<int64_t>(src_es);
      if (streams(it.rows)) {
        const char* b = wg + (trans ? it.n0 * K : it.n0) * static_cast<int64_t>(src_es);
        stream(static_cast<int>(it.rows), K, A + it.m0 * K, K, b, src_bf16, trans ? K : N, it.cols,
               C, ldc);
        epilogue(c, C, ldc, it.m0, it.rows, it.n0, it.cols, N, out);
        return;
      }
      float* b = thread_scratch(kStripSlot, strip);
      const int64_t p0 = it.n0 / ks.nr, np = (it.cols + ks.nr - 1) / ks.nr;
      pack_panels(ks, pairs, wg, src_bf16, trans, K, N, b, p0, p0 + np);
      for (int64_t r = 0; r < it.rows; r += cfg.mc) {
        const int64_t rows = std::min<int64_t>(cfg.mc, it.rows - r);
        compute_block(c, cfg, ks, pairs, A, b, pe, it.m0 + r, rows, it.cols, C, ldc, apack);
        epilogue(c, C, ldc, it.m0 + r, rows, it.n0, it.cols, N, out);
      }
    });
    const int64_t shared_ldc = round_up(full_cols, ks.nr);
    for (int64_t g = 0; g < c.g; ++g) {
      const int64_t r0 = c.offsets[g], rows_g = c.offsets[g + 1] - r0;
      if (!shared(rows_g)) continue;
      const char* wg =
          static_cast<const char*>(c.rhs.data()) + g * K * N * static_cast<int64_t>(src_es);
      char* b =
          reinterpret_cast<char*>(thread_scratch(kSharedStripSlot, strip_floats(c, ks, full_cols)));
      for (int64_t n0 = 0; n0 < N; n0 += full_cols) {
        const int64_t cols = std::min<int64_t>(full_cols, N - n0);
        const int64_t p0 = n0 / ks.nr, np = (cols + ks.nr - 1) / ks.nr;
        parallel_for(np, threads, [&](int64_t p, int) {
          pack_panels(ks, pairs, wg, src_bf16, trans, K, N, b + p * pe * 4, p0 + p, p0 + p + 1);
        });
        parallel_for((rows_g + cfg.mc - 1) / cfg.mc, threads, [&](int64_t blk, int) {
          const auto [C, apack] = thread_tile(cfg, ks);
          const int64_t m0 = r0 + blk * cfg.mc, rows = std::min<int64_t>(cfg.mc, r0 + rows_g - m0);
          compute_block(c, cfg, ks, pairs, A, b, pe, m0, rows, cols, C, shared_ldc, apack);
          epilogue(c, C, shared_ldc, m0, rows, n0, cols, N, out);
        });
      }
    }
  }

  static void epilogue(const RaggedDotCall& c, const float* C, int64_t ldc, int64_t r0,
                       int64_t rows, int64_t n0, int64_t cols, int64_t ld_out, char* out) {
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
  }

  // out[g] = lhs[rows_g]^T @ rhs[rows_g]: A is the transposed lhs block (K x M_g, f32), B the
  // group's rhs rows packed into f32 panels per call; empty groups are zero.
  void run_contracting(RaggedDotCall& c, const RaggedDotNativeConfig& cfg,
                       const k::KernelSet& ks) const {
    const int64_t K = c.k, N = c.n;
    char* out = static_cast<char*>(c.out().data());
    const size_t es = dtype_size(c.out_dtype);
    const int threads = std::min<int>(c.num_threads, ThreadPool::global().size());
    const int64_t panels = (N + ks.nr - 1) / ks.nr;
    for (int64_t g = 0; g < c.g; ++g) {
      const int64_t r0 = c.offsets[g], mg = c.offsets[g + 1] - r0;
      char* og = out + g * K * N * static_cast<int64_t>(es);
      if (mg == 0 || K == 0 || N == 0) {
        std::memset(og, 0, static_cast<size_t>(K * N) * es);
        continue;
      }
      // A^T block as f32 [K][mg] and B panels [panels][mg][nr].
      Tensor at({K * mg}, DType::kF32);
      float* a = at.data_as<float>();
      for (int64_t r = 0; r < mg; ++r) {
        for (int64_t kk = 0; kk < K; ++kk) a[kk * mg + r] = c.lhs_value((r0 + r) * K + kk);
      }
      Tensor bp({panels * mg * ks.nr}, DType::kF32);
      const size_t rs = dtype_size(c.rhs.dtype());
      const char* rhs_rows =
          static_cast<const char*>(c.rhs.data()) + r0 * N * static_cast<int64_t>(rs);
      k::pack_panels_f32(rhs_rows, c.rhs.dtype() == DType::kBF16, false, mg, N, ks.nr,
                         bp.data_as<float>(), 0, panels);
      std::vector<Item> items;
      for (int64_t m0 = 0; m0 < K; m0 += cfg.mc) {
        for (int64_t n0 = 0; n0 < N; n0 += cfg.nc) {
          items.push_back(
              {g, m0, std::min<int64_t>(cfg.mc, K - m0), n0, std::min<int64_t>(cfg.nc, N - n0)});
        }
      }
      parallel_for(static_cast<int64_t>(items.size()), threads, [&](int64_t idx, int) {
        const Item& it = items[idx];
        float* C = thread_scratch(kTileSlot, static_cast<int64_t>(cfg.mc) * cfg.nc);
        const int64_t ldc = cfg.nc, p0 = it.n0 / ks.nr, np = (it.cols + ks.nr - 1) / ks.nr;
        for (int64_t kb = 0; kb < mg; kb += cfg.kc) {
          const int64_t kcur = std::min<int64_t>(cfg.kc, mg - kb);
          for (int64_t p = 0; p < np; ++p) {
            const float* b = bp.data_as<float>() + (p0 + p) * mg * ks.nr + kb * ks.nr;
            for (int64_t i = 0; i < it.rows; i += cfg.mr) {
              const int rows = static_cast<int>(std::min<int64_t>(cfg.mr, it.rows - i));
              ks.f32(rows, kcur, a + (it.m0 + i) * mg + kb, mg, 1, b, C + i * ldc + p * ks.nr, ldc,
                     kb > 0);
            }
          }
        }
        epilogue(c, C, ldc, it.m0, it.rows, it.n0, it.cols, N, og);
      });
    }
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
  return c.packed.empty() ? k::bf16_dot_pays() : c.packed.bf16_dot();
}

}  // namespace rdot

PackedRhs pack_rhs(const TensorView& rhs, RaggedDimNums dims, Precision precision) {
  return PackedRhs(rdot::pack(rhs, dims, precision, num_threads()));
}

}  // namespace tokamax
