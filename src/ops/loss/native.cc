// The native linear_softmax_cross_entropy_loss and its backward, on the grouped GEMM
// (src/kernels/grouped_gemm.h); neither materializes the [B, V] logits.
//
// Forward: one product x w whose epilogue reduces each finished tile (mc rows x nc vocabulary
// columns, in the thread's L1/L2) to each row's max and sum of exp (SIMD exp) and picks the
// label's logit when the tile holds it. A row's partials, one per column block, are merged at
// the end (an online log-sum-exp): B x V / nc pairs of floats instead of B x V logits.
//
// Backward: the vocabulary in chunks of block_v columns. Per chunk: the logits [B, block_v]
// recomputed (packed weights of the chunk), turned in the product's epilogue into
// d logits = (softmax - onehot) * dloss_b; then dx += d w_chunk^T and dw[:, chunk] = x^T d, two
// more products. One chunk of logits and the chunk's packed weights exist at a time.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/float_mode.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "ops/loss/base.h"

namespace tokamax {

namespace k = kernels;

namespace {
constexpr ConfigFields<LossNativeConfig, 5> kFields{
    "linear_softmax_cross_entropy_loss native config",
    {{{"mr", &LossNativeConfig::mr},
      {"mc", &LossNativeConfig::mc},
      {"kc", &LossNativeConfig::kc},
      {"nc", &LossNativeConfig::nc},
      {"block_v", &LossNativeConfig::block_v}}}};
}  // namespace

Json LossNativeConfig::to_json() const { return kFields.to_json(*this); }
LossNativeConfig LossNativeConfig::from_json(const Json& j) { return kFields.from_json(j); }

namespace loss {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

k::Blocking blocking(const LossNativeConfig& c) { return {c.mr, c.mc, c.kc, c.nc}; }

template <class CallT>
class NativeBase : public TypedImplementation<CallT, LossNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return kFields.names(); }
  void check_config(const LossNativeConfig& c) const override {
    k::check_isa_config(
        k::best_kernels(),
        [&](const k::KernelSet& s) {
          return k::blocking_fits(s, c.mr, c.mc, c.kc, c.nc, s.nr) && c.nc <= 8192 &&
                 c.block_v >= s.nr && c.block_v % s.nr == 0;
        },
        [&](const k::KernelSet& s) {
          return kFields.to_json(c).dump() + " is invalid for ISA " + s.name + ": expected " +
                 k::blocking_rules(s, s.nr) + ", nc at most 8192, block_v a multiple of " +
                 std::to_string(s.nr);
        });
  }
  // Measured (tokamax autotune --tag primary, B=512, H=2048, V=32000): K blocks of 256,
  // vocabulary blocks of 1024 and chunks of 2048 columns won by 1.12-1.13x over K blocks of 512
  // and chunks of 4096 (a chunk's packed panels, H x 2048 floats, stay in L2/L3 while every row
  // block reads them). Rows: the tallest tiles in items of k::item_tiles() of them (14 x 14 on
  // AVX-512: 272.6 ms vs 294.1 for the 8-row tiles in 64-row items these heuristics had,
  // composed 314.9, interleaved on Sapphire Rapids).
  LossNativeConfig heuristics(const CallT& c) const override {
    const auto& ks = k::best_kernels();
    LossNativeConfig cfg;
    const int64_t rows = std::max<int64_t>(c.b, 1);
    cfg.mr = static_cast<int>(std::min<int64_t>(ks.max_mr, rows));
    cfg.mc = cfg.mr * static_cast<int>(
                          std::clamp<int64_t>((rows + cfg.mr - 1) / cfg.mr, 1, k::item_tiles(ks)));
    cfg.kc = static_cast<int>(std::min<int64_t>(256, k::round_up(std::max<int64_t>(c.h, 2), 2)));
    const int64_t cols = k::round_up(std::max<int64_t>(c.v, 1), ks.nr);
    const int64_t row_blocks = (rows + cfg.mc - 1) / cfg.mc;
    const int64_t want = 4 * std::max(1, c.num_threads);
    const int64_t nc = k::item_columns(row_blocks, cols, want, 0, 1024, ks.nr);
    cfg.nc = static_cast<int>(k::round_up(std::min<int64_t>(nc, cols), ks.nr));
    cfg.block_v = static_cast<int>(std::min<int64_t>(block_vs().front(), cols));
    return cfg;
  }
  // Vocabulary chunk widths the search tries, the heuristics' first. The forward's chunk is
  // its packed weights alone (H x block_v floats); the backward's is also d [B, block_v] and
  // the weights packed both ways, so its chunks are narrower (next to VjpNative).
  virtual std::vector<int> block_vs() const { return {2048, 8192}; }
  std::vector<LossNativeConfig> search_space(const CallT& c) const override {
    const auto& ks = k::best_kernels();
    const int64_t rows = std::max<int64_t>(c.b, 1);
    const int64_t cols = k::round_up(std::max<int64_t>(c.v, 1), ks.nr);
    const int64_t h2 = k::round_up(std::max<int64_t>(c.h, 2), 2);
    std::vector<LossNativeConfig> out;
    const int mr = static_cast<int>(std::min<int64_t>(ks.max_mr, rows));
    for (int mcf : {4, 8, k::item_tiles(ks)}) {
      if (mr * mcf > k::round_up(rows, mr) * 2 && mcf != 4) continue;  // items taller than B
      for (int kc : {256, 512}) {
        for (int nc : {512, 1024, 2048}) {
          for (int bv : block_vs()) {
            const LossNativeConfig cfg{mr, mr * mcf, static_cast<int>(std::min<int64_t>(kc, h2)),
                                       static_cast<int>(std::min<int64_t>(nc, cols)),
                                       static_cast<int>(std::min<int64_t>(bv, cols))};
            if (std::find(out.begin(), out.end(), cfg) == out.end()) out.push_back(cfg);
          }
        }
      }
    }
    return out;
  }
};

// Packs the vocabulary columns [v0, v0 + cv) of w [H, V] into panels: as [H, cv] (the product
// x w_chunk; bf16 pairs with `pairs`) or, transposed, as [cv, H] (the product d w_chunk^T).
void pack_chunk(const k::KernelSet& ks, const LossCall& c, int64_t v0, int64_t cv, bool trans,
                bool pairs, float* dst) {
  const int nr = ks.nr;
  const char* src =
      static_cast<const char*>(c.w.data()) + v0 * static_cast<int64_t>(dtype_size(c.w.dtype()));
  const bool bf16 = c.w.dtype() == DType::kBF16;
  const int64_t K = trans ? cv : c.h, N = trans ? c.h : cv;
  const int64_t pe = k::panel_elems(K, pairs, nr);
  parallel_for((N + nr - 1) / nr, c.num_threads, [&](int64_t i, int) {
    k::pack_panels(ks, pairs, src, bf16, trans, K, N, dst + i * pe, i, i + 1, c.v);
  });
}

// The product of x with one chunk packed by pack_chunk (pairs: native_logits_on_bf16_dot), its
// finished tiles handed to `store`. x32 is x as f32 (the f32 kernels' A); pairs pack x themselves.
void chunk_product(const k::KernelSet& ks, const LossCall& c, const LossNativeConfig& cfg,
                   const float* x32, bool pairs, const float* panels, int64_t cv,
                   const int64_t* offsets, k::StoreTile store) {
  const k::PackedPanels pp{panels, (cv + ks.nr - 1) / ks.nr, k::panel_elems(c.h, pairs, ks.nr),
                           pairs};
  k::GroupedGemm p;
  p.groups = 1;
  p.offsets = offsets;
  p.k = c.h;
  p.n = cv;
  p.a = pairs ? c.x.data() : x32;
  p.a_bf16 = pairs && c.x.dtype() == DType::kBF16;
  p.packed = &pp;
  p.threads = c.num_threads;
  p.store = std::move(store);
  k::grouped_gemm(p, blocking(cfg), ks);
}

// Vocabulary chunks: block_v rounded up to whole column blocks (nc), at most V.
int64_t chunk_cols(const LossCall& c, const LossNativeConfig& cfg) {
  return k::round_up(std::min<int64_t>(cfg.block_v, std::max<int64_t>(c.v, 1)), cfg.nc);
}

class Native : public NativeBase<LossCall> {
 public:
  int64_t scratch(const LossCall& c, const LossNativeConfig& cfg) const override {
    return c.b * ((c.v + cfg.nc - 1) / cfg.nc) * 8 + c.b * 4 + c.h * chunk_cols(c, cfg) * 4;
  }
  void run_call(LossCall& c, const LossNativeConfig& cfg, const Prepared*) const override {
    check_config(cfg);
    const auto& ks = k::best_kernels();
    const k::RowKernels rk = k::row_kernels(ks.isa);
    const int64_t blocks = (c.v + cfg.nc - 1) / cfg.nc, bv = chunk_cols(c, cfg);
    // Per row and column block: max and sum of exp; per row: the label's logit.
    Tensor part({std::max<int64_t>(1, c.b * blocks * 2)}, DType::kF32);
    Tensor picked({std::max<int64_t>(1, c.b)}, DType::kF32);
    Tensor panels({std::max<int64_t>(1, c.h * k::round_up(bv, ks.nr))}, DType::kF32);
    float* P = part.data_as<float>();
    float* L = picked.data_as<float>();
    const int64_t offsets[2] = {0, c.b};
    const bool pairs = native_logits_on_bf16_dot(c);
    Tensor x_store;
    const float* x32 = pairs ? nullptr : x_as_f32(c, &x_store);
    const int nc = cfg.nc;
    for (int64_t v0 = 0; c.b > 0 && v0 < c.v; v0 += bv) {
      const int64_t cv = std::min(bv, c.v - v0);
      pack_chunk(ks, c, v0, cv, false, pairs, panels.data_as<float>());
      chunk_product(
          ks, c, cfg, x32, pairs, panels.data_as<float>(), cv, offsets,
          [&](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0, int64_t cols) {
            float* row = k::thread_scratch(k::kEpilogueSlot, cols);
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t r = r0 + i, lab = c.label(r) - v0 - n0;
              std::memcpy(row, C + i * ldc, static_cast<size_t>(cols) * 4);
              if (lab >= 0 && lab < cols) L[r] = row[lab];
              const float m = rk.max(row, cols);
              float* pr = P + (r * blocks + (v0 + n0) / nc) * 2;
              pr[0] = m;
              pr[1] = rk.exp_shift_sum(row, cols, 1.0f, m);
            }
          });
    }
    std::vector<double> per_row(static_cast<size_t>(c.b));
    for (int64_t r = 0; r < c.b; ++r) {
      const float* pr = P + r * blocks * 2;
      float m = kNegInf;
      for (int64_t bl = 0; bl < blocks; ++bl) m = std::max(m, pr[2 * bl]);
      double s = 0;
      for (int64_t bl = 0; bl < blocks; ++bl)
        s += static_cast<double>(pr[2 * bl + 1]) * std::exp(static_cast<double>(pr[2 * bl] - m));
      const double lse = m + std::log(s);
      per_row[r] = lse - L[r];
      if (c.lse()) c.lse()->data_as<float>()[r] = static_cast<float>(lse);
    }
    c.write_loss(per_row);
  }
};

class VjpNative : public NativeBase<LossVjpCall> {
 public:
  // A chunk holds d [B, block_v] and the chunk's weights packed both ways (2 x H x block_v):
  // at B=4096, H=2048, 1024 columns are 34 MB (2048: 67 MB) and ran as fast (V=8192, one-off
  // interleaved calls on Emerald Rapids: 1.97-2.25 s against 2.18-2.27 s; at B=512, V=32000
  // 1.09-1.34 s against 1.05-2.22 s).
  std::vector<int> block_vs() const override { return {1024, 2048}; }
  int64_t scratch(const LossVjpCall& c, const LossNativeConfig& cfg) const override {
    const int64_t bv = k::round_up(chunk_cols(c, cfg), k::best_kernels().nr);
    return (c.b + 2 * c.h) * bv * 4;
  }
  void run_call(LossVjpCall& c, const LossNativeConfig& cfg, const Prepared*) const override {
    check_config(cfg);
    // The probabilities of a wide vocabulary are mostly tiny, and their products with x and w
    // in the two GEMMs over d fall below f32's smallest normal by the million: each such FMA
    // result or operand takes a microcode assist unless denormals are flushed (B=4096, H=2048,
    // V=8192, randn inputs, interleaved calls: 1.84-1.95 s flushed against 2.62-3.20 s).
    const ScopedFlushDenormals flush;
    const auto& ks = k::best_kernels();
    const int nr = ks.nr;
    const int64_t B = c.b, H = c.h, V = c.v, bv = chunk_cols(c, cfg);
    float* dw = c.dw().data_as<float>();
    // dx accumulates over the chunks in f32: in the output itself when it is f32.
    Tensor dx32;
    float* DX = c.dx().dtype() == DType::kF32 ? c.dx().data_as<float>() : nullptr;
    if (!DX) {
      dx32 = Tensor({std::max<int64_t>(1, B * H)}, DType::kF32);
      DX = dx32.data_as<float>();
    }
    std::fill(DX, DX + B * H, 0.0f);
    if (B == 0 || H == 0) std::fill(dw, dw + H * V, 0.0f);
    // d in panels of nr columns ([B, nr] each, GroupedOperands::a_panel): the packed B of
    // dw = x^T d as it stands, and the A of dx = d w^T. (Row-major, dw's product packed it into
    // strips of 512 columns, and x^T, its A, was packed again for each: 1.0x composed's time at
    // B=4096, V=151936, the same product at 192 against OpenBLAS's 194-205 GFLOP/s.)
    Tensor d({std::max<int64_t>(1, B * k::round_up(bv, nr))}, DType::kF32);
    float* D = d.data_as<float>();
    Tensor wp({std::max<int64_t>(1, H * k::round_up(bv, nr))}, DType::kF32);
    Tensor wt({std::max<int64_t>(1, bv * k::round_up(H, nr))}, DType::kF32);
    const float* lse = c.lse_in.data_as<const float>();
    const int64_t offsets[2] = {0, B};
    Tensor x_store;
    const float* x32 = x_as_f32(c, &x_store);
    const k::RowKernels rk = k::row_kernels(ks.isa);
    // The logits are recomputed as the forward computed them (its lse was).
    const bool pairs = native_logits_on_bf16_dot(c);
    for (int64_t v0 = 0; B > 0 && H > 0 && v0 < V; v0 += bv) {
      const int64_t cv = std::min(bv, V - v0);
      pack_chunk(ks, c, v0, cv, false, pairs, wp.data_as<float>());
      pack_chunk(ks, c, v0, cv, true, false, wt.data_as<float>());
      // d = (softmax - onehot) * the row's weight, from the recomputed logits.
      chunk_product(
          ks, c, cfg, x32, pairs, wp.data_as<float>(), cv, offsets,
          [&](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0, int64_t cols) {
            float* dr = k::thread_scratch(k::kEpilogueSlot, cols);
            for (int64_t i = 0; i < rows; ++i) {
              const int64_t r = r0 + i;
              const float wgt = c.row_weight(r), l = lse[r];
              const float* ci = C + i * ldc;
              std::memcpy(dr, ci, static_cast<size_t>(cols) * 4);
              rk.exp_shift_sum(dr, cols, 1.0f, l);  // the SIMD exp, as the forward's
              // (Denormal products flush to 0 under the scope above.) A NaN logit stays NaN
              // (the SIMD exp gives 0 for it).
              for (int64_t j = 0; j < cols; ++j) dr[j] = ci[j] == ci[j] ? dr[j] * wgt : ci[j];
              const int64_t lab = c.label(r) - v0 - n0;
              if (lab >= 0 && lab < cols) dr[lab] -= wgt;
              for (int64_t j = 0; j < cols; j += nr) {  // n0 is a whole number of panels
                float* dst = D + ((n0 + j) / nr * B + r) * nr;
                const int64_t len = std::min<int64_t>(nr, cols - j);
                std::memcpy(dst, dr + j, static_cast<size_t>(len) * 4);
                std::fill(dst + len, dst + nr, 0.0f);
              }
            }
          });
      // dx += d w_chunk^T.
      const k::PackedPanels t_panels{wt.data(), (H + nr - 1) / nr, cv * nr, false};
      k::GroupedGemm gx;
      gx.groups = 1;
      gx.offsets = offsets;
      gx.k = cv;
      gx.n = H;
      gx.a = D;
      gx.a_panel = nr;
      gx.packed = &t_panels;
      gx.threads = c.num_threads;
      gx.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                     int64_t cols) {
        for (int64_t i = 0; i < rows; ++i) {
          float* o = DX + (r0 + i) * H + n0;
          const float* ci = C + i * ldc;
          for (int64_t j = 0; j < cols; ++j) o[j] += ci[j];
        }
      };
      k::grouped_gemm(gx, blocking(cfg), ks);
      // dw[:, chunk] = x^T d.
      const k::PackedPanels d_panels{D, (cv + nr - 1) / nr, B * nr, false};
      const int64_t h_offsets[2] = {0, H};
      k::GroupedGemm gw;
      gw.groups = 1;
      gw.offsets = h_offsets;
      gw.k = B;
      gw.n = cv;
      gw.a = x32;  // read transposed in place: x^T is never made
      gw.a_trans = true;
      gw.lda = H;
      gw.packed = &d_panels;
      gw.threads = c.num_threads;
      gw.store = [&](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                     int64_t cols) {
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(dw + (r0 + i) * V + v0 + n0, C + i * ldc, static_cast<size_t>(cols) * 4);
      };
      k::grouped_gemm(gw, blocking(cfg), ks);
    }
    if (dx32.rank() > 0)
      for (int64_t i = 0; i < B * H; ++i) c.dx().data_as<uint16_t>()[i] = f32_to_bf16(DX[i]);
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }
std::shared_ptr<const Implementation> make_vjp_native() { return std::make_shared<VjpNative>(); }

}  // namespace loss
}  // namespace tokamax
