// The native attention backward: flash attention's backward on the f32 microkernels, the
// probabilities recomputed per block from the saved log-sum-exp (the T x S matrix never exists).
// Work items are (batch, kv head, block of query positions) with the group's query heads as rows,
// as in the forward. Per kv block of an item:
//   S = q k^T, P = exp(S scale - lse) (or of the biased, masked, capped logits);  dP = do v^T;  dS
//   = P (dP - D) (through the soft cap); dq += dS k (the item's own rows);  dv += P^T do and dk +=
//   dS^T q into the accumulators of the item's list (rows of several items meet there; the items
//   are dealt to one fixed list per thread, so the sums are the same on every call), summed over
//   the lists at the end.
// K and V are packed once per call in the three panel layouts the products read.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "ops/attention/base.h"

namespace tokamax {

namespace {
constexpr ConfigFields<AttentionVjpNativeConfig, 2> kVjpFields{
    "dot_product_attention_vjp native config",
    {{{"block_q", &AttentionVjpNativeConfig::block_q},
      {"block_kv", &AttentionVjpNativeConfig::block_kv}}}};
}  // namespace

Json AttentionVjpNativeConfig::to_json() const { return kVjpFields.to_json(*this); }
AttentionVjpNativeConfig AttentionVjpNativeConfig::from_json(const Json& j) {
  return kVjpFields.from_json(j);
}

namespace attn {
namespace {

namespace k = kernels;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class VjpNative : public TypedImplementation<AttentionVjpCall, AttentionVjpNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return kVjpFields.names(); }

  void check_config(const AttentionVjpNativeConfig& c) const override {
    const int nr = k::best_kernels().nr;
    // The score block (block_q x block_kv floats per thread) is held to 64 MiB.
    if (c.block_q < 1 || c.block_kv < nr || c.block_kv % nr != 0 ||
        int64_t{c.block_q} * c.block_kv > (int64_t{1} << 24)) {
      throw InvalidArgument("dot_product_attention_vjp native config " +
                            canonical_dump(c.to_json()) +
                            ": expected block_q >= 1 and block_kv a multiple of " +
                            std::to_string(nr) + ", block_q * block_kv at most 2^24");
    }
  }

  // About 48 rows per item (block_q query positions times the group's heads), kv blocks of 128.
  AttentionVjpNativeConfig heuristics(const AttentionVjpCall& c) const override {
    const auto& ks = k::best_kernels();
    AttentionVjpNativeConfig cfg;
    const int64_t g = std::max<int64_t>(c.group(), 1);
    cfg.block_q =
        static_cast<int>(std::clamp<int64_t>(4 * ks.max_mr / g, 1, std::max<int64_t>(c.t, 1)));
    cfg.block_kv =
        static_cast<int>(std::min<int64_t>(128, k::round_up(std::max<int64_t>(c.s, 1), ks.nr)));
    return cfg;
  }

  std::vector<AttentionVjpNativeConfig> search_space(const AttentionVjpCall& c) const override {
    const int nr = k::best_kernels().nr;
    const int64_t s_max = k::round_up(std::max<int64_t>(c.s, 1), nr);
    std::vector<AttentionVjpNativeConfig> out;
    for (int bq : {12, 24, 48, 96}) {
      for (int bkv : {64, 128, 256}) {
        const AttentionVjpNativeConfig cfg{
            static_cast<int>(std::min<int64_t>(bq, std::max<int64_t>(c.t, 1))),
            static_cast<int>(std::min<int64_t>(k::round_up(bkv, nr), s_max))};
        if (std::find(out.begin(), out.end(), cfg) == out.end()) out.push_back(cfg);
      }
    }
    return out;
  }

  void run_call(AttentionVjpCall& c, const AttentionVjpNativeConfig& cfg,
                const Prepared*) const override {
    const auto& ks = k::best_kernels();
    check_config(cfg);
    const int threads = std::max(1, std::min(c.num_threads, ThreadPool::global().size()));
    const int64_t nr = ks.nr, pairs = c.b * c.nk;
    const int64_t hp = k::round_up(std::max<int64_t>(c.h, 1), nr),
                  hvp = k::round_up(std::max<int64_t>(c.hv, 1), nr);
    const int64_t sp = (c.s + nr - 1) / nr;  // kv panels
    // Per (batch, kv head): kT [S/nr][H][nr] (S = q k^T), vT [S/nr][Hv][nr] (dP = do v^T),
    // kF [H/nr][S][nr] (dq += dS k).
    const int64_t kt_elems = sp * c.h * nr, vt_elems = sp * c.hv * nr, kf_elems = hp * c.s;
    const int64_t per_pair = kt_elems + vt_elems + kf_elems;
    Tensor packed({std::max<int64_t>(1, pairs * per_pair)}, DType::kF32);
    float* base = packed.data_as<float>();
    parallel_for(pairs, threads, [&](int64_t bh, int) {
      const int64_t bb = bh / c.nk, kh = bh % c.nk;
      float* kt = base + bh * per_pair;
      float* vt = kt + kt_elems;
      float* kf = vt + vt_elems;
      kv_panels(ks, c.k, bb, kh, true, 0, sp, kt);
      kv_panels(ks, c.v, bb, kh, true, 0, sp, vt);
      kv_panels(ks, c.k, bb, kh, false, 0, hp / nr, kf);
    });
    // Per-thread dk and dv accumulators (rows (batch, kv head, s), padded columns) and dbias.
    const int64_t acc_floats = pairs * c.s * (hp + hvp);
    const int64_t dbias_floats = c.bias ? c.bias->size() : 0;
    Tensor accs({std::max<int64_t>(1, threads * (acc_floats + dbias_floats))}, DType::kF32);
    std::fill(accs.data_as<float>(), accs.data_as<float>() + accs.size(), 0.0f);
    const int64_t tb = (c.t + cfg.block_q - 1) / cfg.block_q;
    const k::RowKernels rk = k::row_kernels(ks.isa);
    const std::vector<std::vector<int64_t>> lists = deal_items(c, cfg, tb, threads);
    parallel_for(threads, threads, [&](int64_t list, int) {
      float* acc = accs.data_as<float>() + list * (acc_floats + dbias_floats);
      for (const int64_t item : lists[static_cast<size_t>(list)]) {
        const int64_t bh = item / tb, t0 = (item % tb) * cfg.block_q;
        run_item(c, cfg, ks, rk, bh, t0, base + bh * per_pair, acc + bh * c.s * hp,
                 acc + pairs * c.s * hp + bh * c.s * hvp, acc + acc_floats);
      }
    });
    // Sum the threads' accumulators into dk, dv (dk scaled) and dbias.
    parallel_for(pairs * c.s, threads, [&](int64_t row, int) {
      const int64_t bh = row / c.s, ss = row % c.s, bb = bh / c.nk, kh = bh % c.nk;
      const int64_t out_row = (bb * c.s + ss) * c.nk + kh;
      for (int64_t d = 0; d < c.h; ++d) {
        float sum = 0;
        for (int t = 0; t < threads; ++t)
          sum += accs.data_as<float>()[t * (acc_floats + dbias_floats) + row * hp + d];
        store_f32(c.dk(), out_row * c.h + d, sum * c.scale_value);
      }
      for (int64_t d = 0; d < c.hv; ++d) {
        float sum = 0;
        for (int t = 0; t < threads; ++t) {
          sum += accs.data_as<float>()[t * (acc_floats + dbias_floats) + pairs * c.s * hp +
                                       row * hvp + d];
        }
        store_f32(c.dv(), out_row * c.hv + d, sum);
      }
    });
    if (c.dbias()) {
      float* db = c.dbias()->data_as<float>();
      for (int64_t i = 0; i < dbias_floats; ++i) {
        float sum = 0;
        for (int t = 0; t < threads; ++t)
          sum += accs.data_as<float>()[t * (acc_floats + dbias_floats) + acc_floats + i];
        db[i] = sum;
      }
    }
  }

 private:
  // The work items dealt to `lists` fixed lists, one accumulator each: dk, dv and dbias sum the
  // items of a list in a fixed order and the lists in a fixed order, so which pool thread runs
  // which list never changes a bit of the result (items taken dynamically landed in whichever
  // thread's accumulator was free: 4 of 300 identical calls differed, by up to 4.8e-7). Dealt
  // largest first to the least loaded list, by the kv positions each item's rows see (causal
  // items differ up to T / block_q-fold), then each list in run order (head by head, as
  // item_at: the threads share a head's K and V in the caches).
  static std::vector<std::vector<int64_t>> deal_items(const AttentionVjpCall& c,
                                                      const AttentionVjpNativeConfig& cfg,
                                                      int64_t tb, int lists) {
    const int64_t items = c.b * c.nk * tb;
    std::vector<std::pair<int64_t, int64_t>> by_cost;  // (cost, run position)
    by_cost.reserve(static_cast<size_t>(items));
    for (int64_t i = 0; i < items; ++i) {
      const int64_t item = c.item_at(i, tb);
      const int64_t bb = item / tb / c.nk, t0 = (item % tb) * cfg.block_q;
      const int64_t t1 = std::min<int64_t>(c.t, t0 + cfg.block_q) - 1;
      int64_t lo0, hi0, lo1, hi1;
      c.s_range(bb, t0, &lo0, &hi0);
      c.s_range(bb, t1, &lo1, &hi1);
      const int64_t span = std::max(hi0, hi1) - std::min(lo0, lo1);
      by_cost.emplace_back((t1 - t0 + 1) * std::max<int64_t>(span, 1), i);
    }
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(lists));
    std::vector<int64_t> load(static_cast<size_t>(lists), 0);
    for (const auto& [cost, i] : by_cost) {
      const size_t l =
          static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[l] += cost;
      out[l].push_back(i);
    }
    for (auto& list : out) {
      std::sort(list.begin(), list.end());
      for (int64_t& i : list) i = c.item_at(i, tb);
    }
    return out;
  }

  static void run_item(const AttentionVjpCall& c, const AttentionVjpNativeConfig& cfg,
                       const k::KernelSet& ks, const k::RowKernels& rk, int64_t bh, int64_t t0,
                       const float* panels, float* dk_acc, float* dv_acc, float* dbias_acc) {
    const int64_t G = c.group(), nr = ks.nr, mr = ks.max_mr;
    const int64_t bb = bh / c.nk, kh = bh % c.nk;
    const int64_t hp = k::round_up(std::max<int64_t>(c.h, 1), nr),
                  hvp = k::round_up(std::max<int64_t>(c.hv, 1), nr);
    const int64_t sp = (c.s + nr - 1) / nr;
    const float* kt = panels;
    const float* vt = kt + sp * c.h * nr;
    const float* kf = vt + sp * c.hv * nr;
    const int64_t rows = std::min<int64_t>(cfg.block_q, c.t - t0) * G;
    const int64_t rp = k::round_up(rows, 16), lds = cfg.block_kv;
    // Scratch regions (each a multiple of 16 floats: panels stay 64-byte aligned).
    const bool cap = c.logits_soft_cap.has_value();
    const int64_t rt = k::round_up(rows, mr);  // rows in whole tiles
    float* Q = k::thread_scratch(
        k::kAttentionSlot,
        rp * (c.h + c.hv + 2 * hp + 2 * hvp + (cap ? 3 : 2) * lds + 2) + rt * (c.h + c.hv) + 16);
    float* dO = Q + rp * c.h;
    float* qpan = dO + rp * c.hv;   // [H/nr][rows][nr]
    float* dopan = qpan + rp * hp;  // [Hv/nr][rows][nr]
    float* dQ = dopan + rp * hvp;   // [rows][hp]
    float* P = dQ + rp * hp;        // [rows][lds]
    float* dS = P + rp * lds;       // [rows][lds]
    float* capg = dS + rp * lds;    // [rows][lds], with a soft cap
    float* D = capg + (cap ? rp * lds : 0);
    float* lse = D + rp;
    // Q and dO also in the tile kernel's packed layout ([tiles][H][mr]): q k^T and do v^T then
    // run its unit-stride form, as the forward's q k^T does.
    float* qt = lse + rp;
    float* dot = qt + rt * c.h;
    int64_t lo = c.s, hi = 0;
    std::vector<int64_t> r0(static_cast<size_t>(rows)), r1(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tt = t0 + r / G, nn = kh * G + r % G;
      const int64_t qrow = (bb * c.t + tt) * c.n + nn;
      for (int64_t d = 0; d < c.h; ++d) Q[r * c.h + d] = load_f32(c.q, qrow * c.h + d);
      float dd = 0;
      for (int64_t d = 0; d < c.hv; ++d) {
        dO[r * c.hv + d] = load_f32(c.dout, qrow * c.hv + d);
        dd += dO[r * c.hv + d] * load_f32(c.o, qrow * c.hv + d);
      }
      D[r] = dd;
      lse[r] = c.lse_at(bb, nn, tt);
      for (int64_t d = 0; d < hp; ++d)
        qpan[((d / nr) * rows + r) * nr + d % nr] = d < c.h ? Q[r * c.h + d] : 0.0f;
      for (int64_t d = 0; d < hvp; ++d)
        dopan[((d / nr) * rows + r) * nr + d % nr] = d < c.hv ? dO[r * c.hv + d] : 0.0f;
      c.s_range(bb, tt, &r0[r], &r1[r]);
      if (lse[r] == kNegInf) r1[r] = r0[r];  // no probability anywhere: no gradient
      if (r1[r] > r0[r]) {
        lo = std::min(lo, r0[r]);
        hi = std::max(hi, r1[r]);
      }
    }
    std::fill(dQ, dQ + rows * hp, 0.0f);
    const k::PackAF32 pack = k::f32_lhs_packer(ks);
    pack(Q, c.h, rows, 0, c.h, static_cast<int>(mr), qt);
    pack(dO, c.hv, rows, 0, c.hv, static_cast<int>(mr), dot);
    const bool elementwise = c.elementwise_logits();
    // As the forward: a positive scale is applied by the exp as it reads the row (the product
    // rounded first, the values scale_max would store).
    const bool scale_in_exp = c.scale_in_exp();
    const float exp_scale = c.exp_scale();
    for (int64_t sb = lo / nr * nr; sb < hi; sb += cfg.block_kv) {
      const int64_t se = std::min<int64_t>(sb + cfg.block_kv, hi);
      const int64_t width = se - sb, panels_w = (width + nr - 1) / nr, wp = panels_w * nr;
      // S = q k^T and dP = do v^T for the block.
      for (int64_t i = 0; i < rows; i += mr) {
        const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
        for (int64_t p = 0; p < panels_w; ++p) {
          const int64_t panel = sb / nr + p;
          if (c.h > 0) {
            ks.f32(tile, c.h, qt + i * c.h, 1, mr, kt + panel * c.h * nr, P + i * lds + p * nr, lds,
                   false, {});
          } else {
            for (int r = 0; r < tile; ++r) std::fill_n(P + (i + r) * lds + p * nr, nr, 0.0f);
          }
          if (c.hv > 0) {
            ks.f32(tile, c.hv, dot + i * c.hv, 1, mr, vt + panel * c.hv * nr, dS + i * lds + p * nr,
                   lds, false, {});
          } else {
            for (int r = 0; r < tile; ++r) std::fill_n(dS + (i + r) * lds + p * nr, nr, 0.0f);
          }
        }
      }
      // P = exp(logits - lse), dS = P (dP - D) (times the cap's derivative); zero where masked.
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = P + r * lds;
        float* ds = dS + r * lds;
        const int64_t tt = t0 + r / G, nn = kh * G + r % G;
        const int64_t a = std::clamp(r0[r], sb, se), b = std::clamp(r1[r], sb, se);
        if (a >= b) {
          std::fill(pr, pr + wp, 0.0f);
          std::fill(ds, ds + wp, 0.0f);
          continue;
        }
        std::fill(pr, pr + (a - sb), kNegInf);
        std::fill(pr + (b - sb), pr + wp, kNegInf);
        if (elementwise) {
          c.logits_row(pr + (a - sb), bb, nn, tt, a, b - a);
          if (cap) {
            for (int64_t ss = a; ss < b; ++ss) capg[r * lds + ss - sb] = c.cap_grad(pr[ss - sb]);
          }
        } else if (!scale_in_exp) {
          rk.scale_max(pr + (a - sb), b - a, c.scale_value);
        }
        rk.exp_shift_sum(pr, wp, exp_scale, lse[r]);
        for (int64_t j = 0; j < wp; ++j) {
          ds[j] = pr[j] * (ds[j] - D[r]);
          if (cap && pr[j] != 0.0f) ds[j] *= capg[r * lds + j];
        }
        if (c.bias) {
          for (int64_t ss = a; ss < b; ++ss) dbias_acc[c.bias_index(bb, nn, tt, ss)] += ds[ss - sb];
        }
      }
      // dq += dS k (rows of the item).
      for (int64_t i = 0; i < rows; i += mr) {
        const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
        for (int64_t q = 0; q < hp / nr; ++q) {
          ks.f32(tile, width, dS + i * lds, lds, 1, kf + q * c.s * nr + sb * nr,
                 dQ + i * hp + q * nr, hp, true, {});
        }
      }
      // dv += P^T do and dk += dS^T q for the block's positions (A read transposed).
      if (rows > 0) {
        for (int64_t i = 0; i < width; i += mr) {
          const int tile = static_cast<int>(std::min<int64_t>(mr, width - i));
          for (int64_t q = 0; q < hvp / nr; ++q) {
            ks.f32(tile, rows, P + i, 1, lds, dopan + q * rows * nr,
                   dv_acc + (sb + i) * hvp + q * nr, hvp, true, {});
          }
          for (int64_t q = 0; q < hp / nr; ++q) {
            ks.f32(tile, rows, dS + i, 1, lds, qpan + q * rows * nr,
                   dk_acc + (sb + i) * hp + q * nr, hp, true, {});
          }
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tt = t0 + r / G, nn = kh * G + r % G;
      const int64_t qrow = (bb * c.t + tt) * c.n + nn;
      for (int64_t d = 0; d < c.h; ++d)
        store_f32(c.dq(), qrow * c.h + d, dQ[r * hp + d] * c.scale_value);
    }
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_vjp_native() { return std::make_shared<VjpNative>(); }

}  // namespace attn
}  // namespace tokamax
