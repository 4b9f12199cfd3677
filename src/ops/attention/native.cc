// The native dot_product_attention: flash attention on the microkernels. K and V are packed once
// per call into panels (f32, bf16 widened exactly; or bf16 pairs for the AMX tile kernel where
// the CPU has it, q k^T and P v then running on the tiles); work items are (batch, kv head, block
// of query positions) with every query head of the kv head's group as rows, so a K/V panel read
// from memory serves all of them (GQA). Per item, for each kv block the masks leave any logit
// in (others are skipped, not computed and discarded):
//   S = q k^T on the f32 microkernel (rows x block_kv), scaled, biased, soft-capped, masked;
//   online softmax: running row max m and sum l, P = exp(S - m) (vectorized), O rescaled;
//   O += P v on the microkernel (accumulating);
// then out = O / l and the log-sum-exp m + log l. The T x S logits never exist beyond one block.
// Decode (T x G rows within one streaming tile) reads K and V in place instead: see
// run_streamed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "autotuning/bf16_dot.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"
#include "kernels/scratch.h"
#include "ops/attention/base.h"
#include "tokamax/core/device.h"

namespace tokamax {

namespace {
constexpr ConfigFields<AttentionNativeConfig, 2> kNativeFields{
    "dot_product_attention native config",
    {{{"block_q", &AttentionNativeConfig::block_q},
      {"block_kv", &AttentionNativeConfig::block_kv}}}};
}  // namespace

Json AttentionNativeConfig::to_json() const { return kNativeFields.to_json(*this); }
AttentionNativeConfig AttentionNativeConfig::from_json(const Json& j) {
  return kNativeFields.from_json(j);
}

namespace attn {
namespace {

namespace k = kernels;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxRows = 256;  // row ranges on the stack up to this many rows per item
// Decode's sub-blocks (block_kv positions when streamed): in the heuristics, about this many
// bytes of K, and no more than an eighth of L2 (K and V of a sub-block, its pages read a few
// lines at a time). Two threads, decode f32 8 kv heads of 128 (4 KB of K per position), read
// ceiling timed beside it. Sapphire Rapids (2 MiB L2), three interleaved rounds: K then V over
// the sub-block, 32 positions 66-69%, 16 66%; K and V head by head, 16 positions 63-65% (8: 56%,
// 32: 55%, 64: 45%, one run each). Zen 3 (512 KiB L2), 15 interleaved rounds in one process: 16
// positions 0.61-0.71x the time of 32, 8 positions 1.09x of 16. (Software prefetches of the
// next sub-block, whole or a head's slice at a time, L1 or L2: no faster there either.)
constexpr int64_t kDecodeBytes = 128 << 10;
// How decode's FMA kernels keep the memory stream going while they compute, on Intel (the L1
// form; decode_l1_ahead): each line they read also prefetches into L1 (prefetcht0) a line read soon
// after: q k^T the line 16 KiB further on in K (its own stream, position by position), P v the same
// row's columns of the next kv head (which it reads next), rather than L2 prefetches of the whole
// next sub-block (the caller's rows: a block ahead). tokamax_overlap_bench on Sapphire Rapids had
// shown the L1 form 16 KiB ahead reach 88-94% of the read rate at decode's compute per KiB, the L2
// form at any distance about 75%. Decode there (tokamax bench --tag decode --impl native --rounds
// 3, interleaved pairs with the L2 form, 2026-12-06): f32 70.4-74.1% of the read ceiling against
// 66.1-71.2%, bf16 57.9-62.7% against 51.8-56.2% (6 pairs, a build switched by environment
// variables); this code 74.2-75.0% against 66.8-72.3%, bf16 55.9-61.2% against 50.2-53.7% (3
// pairs). 8 or 32 KiB ahead measured alike or slower (70.6-71.6% f32, 2 runs each). On AMD the
// L2 form stays: Zen 4 (whose hardware prefetchers stop at every page), same command, 3
// interleaved pairs with the two forms, 2026-12-06: f32 49.1-53.8% of the read ceiling with the
// L1 form against 77.5-81.1% with the L2 form; the AVX2 kernels there (TOKAMAX_ISA=avx2, 2
// pairs) f32 52.0-53.8% against 67.4-71.4%, bf16 widened 53.3-57.7% against 59.1-59.6%. The bf16
// dot's kernels (Zen 4 only) always take the L2 form they were measured with.
constexpr int64_t kDecodeL1Ahead = 16 << 10;
int64_t decode_l1_ahead() {
  static const int64_t ahead = device_info().is_intel() ? kDecodeL1Ahead : 0;
  return ahead;
}

class Native : public TypedImplementation<AttentionCall, AttentionNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return kNativeFields.names(); }

  void check_config(const AttentionNativeConfig& c) const override {
    const int nr = k::best_kernels().nr;
    // The score block (block_q x block_kv floats per thread) is held to 64 MiB.
    if (c.block_q < 1 || c.block_kv < nr || c.block_kv % nr != 0 ||
        int64_t{c.block_q} * c.block_kv > (int64_t{1} << 24)) {
      throw InvalidArgument(fmt_config(c) + ": expected block_q >= 1 and block_kv a multiple of " +
                            std::to_string(nr));
    }
  }

  // Rows per item (block_q query positions times the group's heads) of about six tiles, a
  // whole number of them where the group allows: each packed K/V panel is reused by that many
  // rows while the item's tiles stay in L2. Enough items to balance the threads; kv blocks of
  // 256. Decode (streamed): sub-blocks of about kDecodeBytes of K, at most L2 / 8.
  AttentionNativeConfig heuristics(const AttentionCall& c) const override {
    const auto& ks = k::best_kernels();
    AttentionNativeConfig cfg;
    const int64_t g = std::max<int64_t>(c.group(), 1);
    // On the AMX tiles (bf16): three 32-row tile pairs and kv blocks of 512 (tuned on Sapphire
    // Rapids, prefill T=S=2048: 1.12x the f32 kernel's then 72 rows and 256).
    const bool tiles = ks.amx && native_uses_bf16_pairs(c);
    const int64_t target_rows = tiles ? 96 : 6 * ks.max_mr;
    int64_t bq = std::clamp<int64_t>(target_rows / g, 1, std::max<int64_t>(c.t, 1));
    const int64_t want = 4 * std::max(1, c.num_threads);
    while (bq > 1 && c.b * c.nk * ((c.t + bq - 1) / bq) < want) bq /= 2;
    cfg.block_q = static_cast<int>(bq);
    cfg.block_kv = static_cast<int>(
        std::min<int64_t>(tiles ? 512 : 256, k::round_up(std::max<int64_t>(c.s, 1), ks.nr)));
    if (streams(c, cfg, ks)) {  // decode: the sub-block's positions, whole panels of them
      const int64_t bytes = std::min<int64_t>(kDecodeBytes, device_info().l2_bytes / 8);
      const int64_t row = c.nk * std::max(c.h, c.hv) * dtype_size(c.q.dtype());
      const int64_t panels =
          std::clamp<int64_t>(bytes / std::max<int64_t>(row, 1) / ks.nr, 1, 256 / ks.nr);
      cfg.block_kv =
          static_cast<int>(std::min(panels * ks.nr, k::round_up(std::max<int64_t>(c.s, 1), ks.nr)));
    }
    return cfg;
  }

  std::vector<AttentionNativeConfig> search_space(const AttentionCall& c) const override {
    const auto& ks = k::best_kernels();
    const int nr = ks.nr;
    const int64_t s_max = k::round_up(std::max<int64_t>(c.s, 1), nr);
    std::vector<AttentionNativeConfig> out;
    // Row blocks up to twice T, the smallest always (decode's T = 1 has only it: every block_q
    // >= T streams alike).
    static constexpr int kRowBlocks[] = {6, 12, 24, 48, 72, 96};
    for (int bq : kRowBlocks) {
      if (bq > std::max<int64_t>(c.t, 1) * 2 && bq != kRowBlocks[0]) continue;
      const int q = static_cast<int>(std::min<int64_t>(bq, std::max<int64_t>(c.t, 1)));
      // Streamed (decode) items: block_kv is the sub-block, of 1 to 8 panels of positions.
      const bool streamed = streams(c, {q, nr}, ks);
      static constexpr int kPanels[] = {1, 2, 4, 8}, kBlocks[] = {64, 128, 256, 512};
      for (int bkv : streamed ? kPanels : kBlocks) {
        const AttentionNativeConfig cfg{q, static_cast<int>(std::min<int64_t>(
                                               streamed ? bkv * nr : k::round_up(bkv, nr), s_max))};
        if (std::find(out.begin(), out.end(), cfg) == out.end()) out.push_back(cfg);
      }
    }
    return out;
  }

  int64_t scratch(const AttentionCall& c, const AttentionNativeConfig& cfg) const override {
    const auto& ks = k::best_kernels();
    const int64_t threads = std::min(c.num_threads, ThreadPool::global().size());
    if (streams(c, cfg, ks)) {  // the chunks' states, and the items' scratch
      return (decode_state_floats(c, threads, ks) + decode_floats(c, cfg) * threads) * 4;
    }
    return packed_floats(c, ks) * 4 + item_floats(c, cfg, ks) * 4 * threads;
  }

  void run_call(AttentionCall& c, const AttentionNativeConfig& cfg,
                const Prepared*) const override {
    const auto& ks = k::best_kernels();
    check_config(cfg);
    if (streams(c, cfg, ks))
      run_streamed(c, cfg, ks);
    else
      run_packed(c, cfg, ks);
  }

 private:
  // Decode: all of T's rows of a kv head's group fit one weight-streaming tile, so K and V are
  // read in place, once, rather than packed (which would read them twice and write them once).
  static bool streams(const AttentionCall& c, const AttentionNativeConfig& cfg,
                      const k::KernelSet& ks) {
    return ks.stream_acc && ks.stream_t && c.t >= 1 && c.t <= cfg.block_q &&
           c.t * c.group() <= k::kStreamMaxMr;
  }

  // Items (batch, kv chunk): the kv positions are split into chunks so every thread streams
  // (flash-decoding). An item takes its positions in sub-blocks (block_kv), K and V read in
  // place: q k^T for every kv head, the online softmax of every head's rows, then P v for every
  // kv head (the last sub-block of a chunk may be short). The reads
  // so go through memory nearly in order: a few positions' rows ([S, Nk, H]: all heads of a
  // position are contiguous) at a time, a few dozen page streams the hardware prefetchers
  // follow. Read one head at a time over all positions (the rows Nk * H apart, 4 KB for 8 heads
  // of 128), the same bytes came at about half the rate. Each chunk leaves, per kv head, its
  // unnormalized O, m and l; the chunks of a row are merged at the end.
  // (Zen 4's hardware prefetchers follow q k^T's four adjacent positions poorly, 15-18 GB/s a
  // core against 22-23 for four long lanes of positions; yet decode in lanes, by per-position
  // calls or inside the q k^T kernel, and in plain memory order, measured slower:
  // docs/performance-log.md, dot_product_attention, fifteenth measurement round.)
  static void run_streamed(const AttentionCall& c, const AttentionNativeConfig& cfg,
                           const k::KernelSet& ks) {
    const int threads = std::min(c.num_threads, ThreadPool::global().size());
    const int64_t rows = c.t * c.group(), ldo = k::round_up(std::max<int64_t>(c.hv, 1), ks.nr);
    const int64_t pairs = c.b * c.nk;
    const int64_t sub = decode_block(c, cfg, ks), chunks = decode_chunks(c, threads, ks);
    // Chunks of whole panels, as even as that allows: sub-blocks need no alignment across them.
    const int64_t chunk_len = k::round_up((c.s + chunks - 1) / chunks, ks.nr);
    const int64_t part = rows * (ldo + 2);  // O, m, l of one chunk
    Tensor parts({std::max<int64_t>(1, decode_state_floats(c, threads, ks))}, DType::kF32);
    // Chunk ch's O (rows x ldo), then its m and l, for (batch, kv head) bh.
    auto state = [&](int64_t bh, int64_t ch) {
      return parts.data_as<float>() + (bh * chunks + ch) * part;
    };
    const k::RowKernels rk = k::row_kernels(ks.isa);
    const bool bf16 = c.q.dtype() == DType::kBF16;
    // bf16 K and V on the bf16 dot where it outruns the widened FMAs: Zen 4, decode_bf16
    // 1.07-1.30x against TOKAMAX_BF16_DOT=0 (tokamax bench, 3 interleaved rounds, both reading
    // K position by position). P is rounded to bf16 for P v.
    const bool dot = bf16 && ks.dot_stream_t && vector_bf16_dot_pays();
    // q k^T over all kv heads position by position, K read as one stream. Zen 4, 2 threads,
    // reading alone (no compute, 64 MiB): head by head over a sub-block 0.49x a sequential
    // read, position by position 0.98x. The memory stream must not stop while the kernels
    // compute (kernels/stream_prefetch.h): on Intel the FMA kernels prefetch into L1 as they
    // read (decode_l1_ahead); elsewhere, and the bf16 dot's always, into L2: q k^T the first
    // sub-block's V rows, then the next sub-block's K a block ahead, P v the next sub-block's V
    // rows as it reads this one's (every CPU did so until 2026-12-06). Against the kernels before
    // (q k^T one position at a time, prefetching only the same positions' V rows), warm: 0.81x the
    // time f32 (S=8192), 0.83x bf16 (S=16384; 20 interleaved pairs each, medians); tokamax bench
    // (cold): f32 0.91x, bf16 0.98-1.08x. The dot's kernel needs q rounded on the stack.
    const k::StreamHeadsKernel heads_t =
        c.nk > std::numeric_limits<int>::max() ? nullptr
        : dot ? (c.nk * rows * k::round_up(c.h, 32) <= k::kDotHeadsMaxValues ? ks.dot_heads_t
                                                                             : nullptr)
              : ks.stream_heads_t;
    const int64_t es = dtype_size(c.q.dtype());
    // The L1 form where the FMA kernels take it (decode_l1_ahead), else the L2 form.
    const int64_t l1_ahead = dot ? 0 : decode_l1_ahead();
    const int64_t krow = c.nk * c.h * es, vrow = c.nk * c.hv * es;  // a position's K, V bytes
    parallel_for(c.b * chunks, threads, [&](int64_t item, int) {
      const int64_t bb = item / chunks, ch = item % chunks;
      const int64_t s0 = std::min(c.s, ch * chunk_len), s1 = std::min(c.s, s0 + chunk_len);
      // Scratch: every kv head's rows of q (f32), S for one sub-block.
      float* Q = k::thread_scratch(k::kAttentionSlot, decode_floats(c, cfg));
      float* S = Q + c.nk * rows * c.h;
      int64_t r0[k::kStreamMaxMr], r1[k::kStreamMaxMr], lo, hi;
      row_ranges(c, bb, 0, rows, s0, s1, r0, r1, &lo, &hi);
      for (int64_t kh = 0; kh < c.nk; ++kh) {
        load_q_rows(c, bb, kh, 0, rows, Q + kh * rows * c.h);
        float* st = state(bb * c.nk + kh, ch);
        std::fill(st, st + rows * ldo, 0.0f);
        std::fill(st + rows * ldo, st + rows * ldo + rows, kNegInf);
        std::fill(st + rows * ldo + rows, st + part, 0.0f);
      }
      const char* kb = static_cast<const char*>(c.k.data()) + bb * c.s * krow;
      const char* vb = static_cast<const char*>(c.v.data()) + bb * c.s * vrow;
      for (int64_t sb = lo; sb < hi; sb += sub) {
        const int64_t width = std::min(sub, hi - sb);
        // S = q k^T for every kv head (the K rows only), the online softmax, then O += P v for
        // every kv head (the V rows only): half as many pages in flight at a time.
        // The next sub-block's positions: P v prefetches its V rows as it reads this one's.
        const int64_t next = std::min(width, hi - sb - width);
        if (heads_t) {  // position by position: K in memory order
          // The L2 form: q k^T prefetches the first sub-block's V rows, which P v reads next,
          // and from then on the next sub-block's K rows, a whole block ahead (P v prefetches the
          // next V rows); the L1 form's are decode_l1_ahead's. With no K prefetch (the
          // near one it then had compiled to nothing: kernels/prefetch.h), decode S=8192 from a
          // flushed cache (tokamax bench, 2 threads, 5 interleaved rounds, slow memory state):
          // f32 2.52-2.98 ms, 63-72% of the read ceiling, bf16 1.44-1.65 ms, 57-64%; with the block
          // ahead 2.32-2.56 ms, 72-80%, and 1.15-1.30 ms, 71-77%. Two blocks ahead measured alike.
          const char* ahead = l1_ahead > 0           ? nullptr
                              : sb == lo             ? vb + sb * vrow
                              : sb + 2 * width <= hi ? kb + (sb + width) * krow
                                                     : nullptr;
          const int64_t ahead_ld = sb == lo ? vrow : krow;
          heads_t(static_cast<int>(rows), static_cast<int>(c.nk), c.h, Q, kb + sb * krow, bf16,
                  c.nk * c.h, width, S, sub, ahead, ahead_ld, ahead_ld, l1_ahead);
        } else {
          for (int64_t kh = 0; kh < c.nk; ++kh) {
            const char* kr = kb + (sb * c.nk + kh) * c.h * es;
            if (dot) {
              ks.dot_stream_t(static_cast<int>(rows), c.h, Q + kh * rows * c.h, c.h,
                              reinterpret_cast<const uint16_t*>(kr), c.nk * c.h, width,
                              S + kh * rows * sub, sub);
            } else {
              ks.stream_t(static_cast<int>(rows), c.h, Q + kh * rows * c.h, c.h, kr, bf16,
                          c.nk * c.h, width, S + kh * rows * sub, sub);
            }
          }
        }
        for (int64_t kh = 0; kh < c.nk; ++kh) {
          float* O = state(bb * c.nk + kh, ch);
          softmax_block(c, rk, bb, kh, 0, rows, sb, width, r0, r1, S + kh * rows * sub, sub,
                        O + rows * ldo, O + rows * ldo + rows, O, ldo);
        }
        for (int64_t kh = 0; kh < c.nk; ++kh) {
          const char* vr = vb + (sb * c.nk + kh) * c.hv * es;
          if (dot) {
            ks.dot_stream_acc(static_cast<int>(rows), width, S + kh * rows * sub, sub,
                              reinterpret_cast<const uint16_t*>(vr), c.nk * c.hv, c.hv,
                              state(bb * c.nk + kh, ch), ldo, next, 0);
          } else {
            ks.stream_acc(static_cast<int>(rows), width, S + kh * rows * sub, sub, vr, bf16,
                          c.nk * c.hv, c.hv, state(bb * c.nk + kh, ch), ldo,
                          l1_ahead > 0 ? 0 : next,  // L2: the next sub-block's V rows
                          l1_ahead > 0 && kh + 1 < c.nk ? c.hv * es : 0);  // L1: next head's
          }
        }
      }
    });
    // Merge the chunks of each (batch, kv head): m = max m_c, l = sum l_c e^(m_c - m), O alike.
    parallel_for(pairs, threads, [&](int64_t bh, int) {
      std::vector<float> O(static_cast<size_t>(rows * ldo), 0.0f), m(rows, kNegInf), l(rows, 0.0f);
      const float* first = state(bh, 0);
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const float* po = first + ch * part;
        const float* pm = po + rows * ldo;
        for (int64_t r = 0; r < rows; ++r) m[r] = std::max(m[r], pm[r]);
      }
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const float* po = first + ch * part;
        const float* pm = po + rows * ldo;
        const float* pl = pm + rows;
        for (int64_t r = 0; r < rows; ++r) {
          if (pl[r] == 0) continue;
          const float w = std::exp(pm[r] - m[r]);
          l[r] += pl[r] * w;
          for (int64_t d = 0; d < ldo; ++d) O[r * ldo + d] += po[r * ldo + d] * w;
        }
      }
      finish(c, bh / c.nk, bh % c.nk, 0, rows, O.data(), ldo, m.data(), l.data());
    });
  }

  static void run_packed(const AttentionCall& c, const AttentionNativeConfig& cfg,
                         const k::KernelSet& ks) {
    const int threads = std::min(c.num_threads, ThreadPool::global().size());
    // K and V panels for every (batch, kv head).
    const int nr = ks.nr;
    const int64_t kp = (c.s + nr - 1) / nr, vp = (c.hv + nr - 1) / nr;
    int64_t k_elems = kp * c.h * nr, v_elems = vp * c.s * nr;
    Tensor packed({std::max<int64_t>(1, packed_floats(c, ks))}, DType::kF32);
    float* kpack = packed.data_as<float>();
    float* vpack = kpack + c.b * c.nk * k_elems;
    // bf16 inputs on the AMX tiles or the vector bf16 dot: q k^T's products are exact (as the
    // f32 FMA's on the widened values); P is rounded to bf16 for P v, as bf16 flash attention
    // kernels do.
    const bool pairs = native_uses_bf16_pairs(c);
    const int64_t hp = (c.h + 1) / 2, s2 = (c.s + 1) / 2;
    if (pairs) {  // bf16 pair panels, half the floats: K [S/nr][H/2][nr], V [Hv/nr][S/2][nr]
      k_elems = kp * hp * nr;
      v_elems = vp * s2 * nr;
      vpack = kpack + c.b * c.nk * k_elems;
    }
    parallel_for(c.b * c.nk * (kp + vp), threads, [&](int64_t idx, int) {
      const int64_t bh = idx / (kp + vp), p = idx % (kp + vp);
      const int64_t bb = bh / c.nk, kh = bh % c.nk;
      if (pairs) {
        const size_t es = sizeof(uint16_t);
        if (p < kp) {  // K^T's panel p: rows of pairs along H, kv positions p*nr.. as columns
          const int64_t n = std::min<int64_t>(nr, c.s - p * nr);
          const char* src =
              static_cast<const char*>(c.k.data()) + ((bb * c.s + p * nr) * c.nk + kh) * c.h * es;
          k::pack_panels(ks, true, src, true, true, c.h, n, kpack + bh * k_elems + p * hp * nr, 0,
                         1, c.nk * c.h);
        } else {  // V's panel q: rows of pairs along S, head dims q*nr.. as columns
          const int64_t q = p - kp;
          const char* src =
              static_cast<const char*>(c.v.data()) + ((bb * c.s * c.nk + kh) * c.hv + q * nr) * es;
          k::pack_panels(ks, true, src, true, false, c.s, std::min<int64_t>(nr, c.hv - q * nr),
                         vpack + bh * v_elems + q * s2 * nr, 0, 1, c.nk * c.hv);
        }
        return;
      }
      if (p < kp) {  // K^T's panel p: [H][nr], kv positions p*nr.., zero past S
        kv_panels(ks, c.k, bb, kh, true, p, p + 1, kpack + bh * k_elems + p * c.h * nr);
      } else {  // V's panel q: [S][nr], head dims q*nr.., zero past Hv
        const int64_t q = p - kp;
        kv_panels(ks, c.v, bb, kh, false, q, q + 1, vpack + bh * v_elems + q * c.s * nr);
      }
    });
    const int64_t tb = (c.t + cfg.block_q - 1) / cfg.block_q;
    const k::RowKernels rk = k::row_kernels(ks.isa);
    const int64_t ldo = k::round_up(std::max<int64_t>(c.hv, 1), nr);
    parallel_for(c.b * c.nk * tb, threads, [&](int64_t idx, int) {
      const int64_t item = c.item_at(idx, tb);
      const int64_t bh = item / tb, bb = bh / c.nk, kh = bh % c.nk;
      const int64_t t0 = (item % tb) * cfg.block_q;
      KvSource src;
      src.kpanels = kpack + bh * k_elems;
      src.vpanels = vpack + bh * v_elems;
      src.pairs = pairs;
      const int64_t rows = std::min<int64_t>(cfg.block_q, c.t - t0) * c.group();
      const ItemScratch sc = attend(c, cfg, ks, rk, bb, kh, t0, src);
      finish(c, bb, kh, t0, rows, sc.o, ldo, sc.m, sc.l);
    });
  }

  static std::string fmt_config(const AttentionNativeConfig& c) {
    return "dot_product_attention native config " + canonical_dump(c.to_json());
  }
  static int64_t packed_floats(const AttentionCall& c, const k::KernelSet& ks) {
    const int64_t nr = ks.nr;
    return c.b * c.nk * (((c.s + nr - 1) / nr) * c.h * nr + ((c.hv + nr - 1) / nr) * c.s * nr);
  }
  static int64_t item_rows(const AttentionCall& c, const AttentionNativeConfig& cfg) {
    return static_cast<int64_t>(cfg.block_q) * std::max<int64_t>(c.group(), 1);
  }
  // One item's scratch: the Q block (f32, or bf16 pairs for the tile kernel), the S/P tile, P as
  // bf16 pairs (tile kernel), the O tile, the row max and sum. Row counts are padded to whole
  // AMX tiles (that kernel writes C and reads A 16 rows at a time).
  struct ItemScratch {
    float* q;
    float* s;
    uint32_t* p;
    float* o;
    float* m;
    float* l;
    uint32_t* qv;  // Q as vector-dot pairs [H/2][rows] (the vector bf16 dot only)
    float* qt;     // Q in pack_a_f32's tiles of mr rows [tiles][H][mr] (f32 calls only)
  };
  static int64_t item_floats(const AttentionCall& c, int64_t rows, int64_t block_kv,
                             const k::KernelSet& ks, ItemScratch* at = nullptr,
                             float* base = nullptr) {
    const int64_t rp = k::round_up(std::max<int64_t>(rows, 1), k::kAmxRows);
    const int64_t ldo = k::round_up(std::max<int64_t>(c.hv, 1), ks.nr);
    // Q as vector-dot pairs ([H/2][rows]) only where the vector dot runs: bf16 calls on it.
    const bool pairs = native_uses_bf16_pairs(c);
    const int64_t qv = !ks.amx && pairs ? rows * ((c.h + 1) / 2) : 0;
    const int64_t qt = pairs ? 0 : k::round_up(std::max<int64_t>(rows, 1), ks.max_mr) * c.h;
    const int64_t sizes[8] = {
        rp * c.h, rp * block_kv, rp * (block_kv / 2 + 1), rp * ldo, rows, rows, qv, qt};
    int64_t off = 0, offs[8];
    for (int i = 0; i < 8; ++i) {
      offs[i] = off;
      off += sizes[i];
    }
    if (at) {
      *at = {base + offs[0],
             base + offs[1],
             reinterpret_cast<uint32_t*>(base + offs[2]),
             base + offs[3],
             base + offs[4],
             base + offs[5],
             reinterpret_cast<uint32_t*>(base + offs[6]),
             base + offs[7]};
    }
    return off;
  }
  static int64_t item_floats(const AttentionCall& c, const AttentionNativeConfig& cfg,
                             const k::KernelSet& ks) {
    return item_floats(c, item_rows(c, cfg), cfg.block_kv, ks);
  }

  // Decode's chunks of kv positions per batch: two items per thread.
  static int64_t decode_chunks(const AttentionCall& c, int64_t threads, const k::KernelSet& ks) {
    if (c.b == 0) return 1;
    const int64_t panels = std::max<int64_t>(1, (c.s + ks.nr - 1) / ks.nr);
    return std::clamp<int64_t>((2 * threads + c.b - 1) / c.b, 1, panels);
  }
  // Decode's chunk states: O, m and l per (batch, kv head, chunk).
  static int64_t decode_state_floats(const AttentionCall& c, int64_t threads,
                                     const k::KernelSet& ks) {
    const int64_t ldo = k::round_up(std::max<int64_t>(c.hv, 1), ks.nr);
    return c.b * c.nk * decode_chunks(c, threads, ks) * c.t * c.group() * (ldo + 2);
  }
  // Decode's sub-block: block_kv positions, no more than the call has (a config read from a
  // cache file may name any multiple of nr up to block_q x block_kv = 2^24; the S block holds
  // the sub-block for every kv head's rows, so it is held to S's own size).
  static int64_t decode_block(const AttentionCall& c, const AttentionNativeConfig& cfg,
                              const k::KernelSet& ks) {
    return std::min<int64_t>(cfg.block_kv, k::round_up(std::max<int64_t>(c.s, 1), ks.nr));
  }
  // Decode's scratch: every kv head's rows of q (f32) and the S block of one sub-block.
  static int64_t decode_floats(const AttentionCall& c, const AttentionNativeConfig& cfg) {
    return c.t * c.group() * c.nk * (c.h + decode_block(c, cfg, k::best_kernels()));
  }

  // Row r's kv positions [r0[r], r1[r]) within [s_begin, s_end) (row r: query position
  // t0 + r / G), and [lo, hi) the span of the rows that see any (lo >= hi: none).
  static void row_ranges(const AttentionCall& c, int64_t bb, int64_t t0, int64_t rows,
                         int64_t s_begin, int64_t s_end, int64_t* r0, int64_t* r1, int64_t* lo,
                         int64_t* hi) {
    *lo = s_end;
    *hi = s_begin;
    for (int64_t r = 0; r < rows; ++r) {
      c.s_range(bb, t0 + r / c.group(), &r0[r], &r1[r]);
      r0[r] = std::max(r0[r], s_begin);
      r1[r] = std::min(r1[r], s_end);
      if (r1[r] > r0[r]) {
        *lo = std::min(*lo, r0[r]);
        *hi = std::max(*hi, r1[r]);
      }
    }
  }

  // Rows r < rows of q for kv head kh from query position t0 (row r: position t0 + r / G, head
  // kh * G + r % G), widened to f32, at dst with row stride H.
  static void load_q_rows(const AttentionCall& c, int64_t bb, int64_t kh, int64_t t0, int64_t rows,
                          float* dst) {
    const int64_t G = c.group();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t base = ((bb * c.t + t0 + r / G) * c.n + kh * G + r % G) * c.h;
      if (c.q.dtype() == DType::kF32) {
        std::memcpy(dst + r * c.h, c.q.data_as<const float>() + base, c.h * sizeof(float));
      } else {
        const uint16_t* src = c.q.data_as<const uint16_t>() + base;
        for (int64_t d = 0; d < c.h; ++d) dst[r * c.h + d] = bf16_to_f32(src[d]);
      }
    }
  }

  // An item's packed K and V panels.
  struct KvSource {
    const float* kpanels = nullptr;  // [S/nr][H][nr] (pairs: [S/nr][H/2][nr])
    const float* vpanels = nullptr;  // [Hv/nr][S][nr] (pairs: [Hv/nr][S/2][nr])
    bool pairs = false;              // bf16 pair panels for the AMX tile kernel
  };

  // One kv block's logits for an item's rows (S: rows x width from position sb, row stride
  // lds; row r sees [r0[r], r1[r])): masked, scaled (biased, capped), then the online softmax:
  // the row max m and sum l updated, O's rows rescaled, and S turned into P = exp(S - m), 0
  // where masked. Without a bias, mask or cap, a positive scale is applied by the exp as it
  // reads S (exp(S scale - m), the product rounded first: the same values).
  static void softmax_block(const AttentionCall& c, const k::RowKernels& rk, int64_t bb, int64_t kh,
                            int64_t t0, int64_t rows, int64_t sb, int64_t width, const int64_t* r0,
                            const int64_t* r1, float* S, int64_t lds, float* m, float* l, float* O,
                            int64_t ldo) {
    const int64_t G = c.group(), se = sb + width;
    const bool elementwise = c.elementwise_logits();
    // With a positive scale and nothing element by element, the logits stay unscaled: the max
    // of the raw row times the scale (the scaled row's max exactly: rounding is monotone), and
    // the exp scales as it reads, one pass over the row fewer (it stored the scaled row).
    // Masked -inf stays -inf.
    const bool scale_in_exp = c.scale_in_exp();
    const float exp_scale = c.exp_scale();
    // Logits, masks and the online softmax, row by row.
    for (int64_t r = 0; r < rows; ++r) {
      float* row = S + r * lds;
      const int64_t tt = t0 + r / G, nn = kh * G + r % G;
      const int64_t a = std::clamp(r0[r], sb, se), b = std::clamp(r1[r], sb, se);
      if (a >= b) {
        std::fill(row, row + width, 0.0f);
        continue;
      }
      // Outside [a, b) of the block: masked. Inside: scaled (and with a bias, mask or cap,
      // element by element).
      std::fill(row, row + (a - sb), kNegInf);
      std::fill(row + (b - sb), row + width, kNegInf);
      float mx = kNegInf;
      if (scale_in_exp) {
        mx = rk.max(row + (a - sb), b - a) * exp_scale;
      } else if (!elementwise) {
        mx = rk.scale_max(row + (a - sb), b - a, c.scale_value);
      } else {
        mx = c.logits_row(row + (a - sb), bb, nn, tt, a, b - a);
      }
      if (std::isnan(mx)) {  // a NaN logit (logits_row's max keeps it): the row's output is NaN
        l[r] = NAN;
        std::fill(row, row + width, 0.0f);
        continue;
      }
      const float m_new = std::max(m[r], mx);
      if (m_new == kNegInf) {
        // Every logit -inf, or NaN (the row maxima skip NaN, which the exp carries otherwise):
        // a scan on this rare path only.
        if (std::any_of(row + (a - sb), row + (b - sb), [](float x) { return std::isnan(x); }))
          l[r] = NAN;
        std::fill(row, row + width, 0.0f);
        continue;
      }
      // A row's max mostly stands after the first blocks: no libm exp for that alpha of 1 (the
      // same value). Decode's softmax phase, S=2048 f32, 2 threads, rdtsc around it (one-off
      // instrumentation, 3 runs of 200 calls each): 51 -> 30-34 ns a position a thread, bf16
      // 35 -> 20; cold decode calls measured alike within the bench's noise.
      const float alpha = m[r] == m_new ? 1.0f : m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
      const float sum = rk.exp_shift_sum(row, width, exp_scale, m_new);
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* o = O + r * ldo;
        for (int64_t d = 0; d < ldo; ++d) o[d] *= alpha;
      }
    }
  }

  // The online softmax of one item (rows: block_q query positions x the kv head's G query
  // heads) over every kv position it sees. Leaves in the thread's scratch the unnormalized
  // O (rows x ldo), the row max m and sum l, and returns where they are.
  static ItemScratch attend(const AttentionCall& c, const AttentionNativeConfig& cfg,
                            const k::KernelSet& ks, const k::RowKernels& rk, int64_t bb, int64_t kh,
                            int64_t t0, const KvSource& src) {
    const int64_t G = c.group(), nr = ks.nr, mr = ks.max_mr;
    const int64_t tq = std::min<int64_t>(cfg.block_q, c.t - t0);
    const int64_t rows = tq * G;
    const int64_t ldo = k::round_up(std::max<int64_t>(c.hv, 1), nr), lds = cfg.block_kv;
    ItemScratch sc;
    item_floats(c, rows, lds, ks, &sc,
                k::thread_scratch(k::kAttentionSlot, item_floats(c, cfg, ks)));
    float* Q = sc.q;
    float* S = sc.s;
    float* O = sc.o;
    float* m = sc.m;
    float* l = sc.l;
    // Pairs: Q as bf16 pairs row by row (rows padded to whole tiles with zeros).
    const int64_t hp = (c.h + 1) / 2;
    uint32_t* Qp = reinterpret_cast<uint32_t*>(Q);
    const int64_t rows_p = k::round_up(rows, k::kAmxRows);
    // Rows (t, g): query position t0 + r / G, head kh * G + r % G; q widened to f32.
    int64_t lo, hi;
    int64_t rs0[kMaxRows], rs1[kMaxRows];
    std::vector<int64_t> rs0v, rs1v;
    int64_t* r0 = rs0;
    int64_t* r1 = rs1;
    if (rows > kMaxRows) {
      rs0v.resize(static_cast<size_t>(rows));
      rs1v.resize(static_cast<size_t>(rows));
      r0 = rs0v.data();
      r1 = rs1v.data();
    }
    // The vector bf16 dot (pairs without the AMX tiles): q widened, then packed as the kernel's
    // lhs pairs [H/2][rows] (exact: it was bf16), tiles of up to mr rows at a time.
    const bool vdot = src.pairs && !ks.amx;
    if (!src.pairs || vdot) load_q_rows(c, bb, kh, t0, rows, Q);
    if (vdot) ks.pack_a_bf16(Q, false, c.h, rows, 0, c.h, rows, sc.qv);
    // f32: Q also in the tile kernel's packed layout, so q k^T runs its unit-stride form (the
    // broadcasts at constant offsets, the panel and C prefetches) rather than the strided one,
    // which keeps 14 row offsets live and reloads some from the stack every k.
    if (!src.pairs) {
      k::f32_lhs_packer(ks)(Q, c.h, rows, 0, c.h, static_cast<int>(mr), sc.qt);
    }
    row_ranges(c, bb, t0, rows, 0, c.s, r0, r1, &lo, &hi);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tt = t0 + r / G, nn = kh * G + r % G;
      const int64_t base = ((bb * c.t + tt) * c.n + nn) * c.h;
      if (src.pairs && !vdot) {
        uint32_t* dst = Qp + r * hp;
        dst[hp - 1] = 0;  // the odd H's last pair: high half zero
        std::memcpy(dst, c.q.data_as<const uint16_t>() + base, c.h * sizeof(uint16_t));
      }
      m[r] = kNegInf;
      l[r] = 0;
    }
    if (src.pairs && !vdot) std::fill(Qp + rows * hp, Qp + rows_p * hp, 0u);
    std::fill(O, O + (src.pairs ? rows_p : rows) * ldo, 0.0f);
    // Blocks span [lo, hi), the positions some row of the item sees, from a panel boundary:
    // what causality or a window masks for every row is never computed.
    for (int64_t sb = lo / nr * nr; sb < hi; sb += cfg.block_kv) {
      const int64_t se = std::min<int64_t>(sb + cfg.block_kv, hi);
      const int64_t width = se - sb, panels = (width + nr - 1) / nr;
      // S = q k^T for the block.
      if (vdot) {
        const uint32_t* kpanels = reinterpret_cast<const uint32_t*>(src.kpanels);
        for (int64_t i = 0; i < rows; i += mr) {
          const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
          for (int64_t p = 0; p < panels; ++p) {
            ks.bf16(tile, hp, sc.qv + i, rows, kpanels + (sb / nr + p) * hp * nr,
                    S + i * lds + p * nr, lds, false);
          }
        }
      } else if (src.pairs) {
        // The whole item on the tile kernel, one K panel at a time (H = 0: no pairs, S = 0).
        const uint32_t* kpanels = reinterpret_cast<const uint32_t*>(src.kpanels);
        for (int64_t p = 0; p < panels; ++p) {
          ks.bf16(static_cast<int>(rows), hp, Qp, rows_p, kpanels + (sb / nr + p) * hp * nr,
                  S + p * nr, lds, false);
        }
      } else {
        for (int64_t i = 0; i < rows; i += mr) {
          const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
          for (int64_t p = 0; p < panels; ++p) {
            float* cp = S + i * lds + p * nr;
            if (c.h == 0) {
              for (int r = 0; r < tile; ++r) std::fill(cp + r * lds, cp + r * lds + nr, 0.0f);
            } else {
              ks.f32(tile, c.h, sc.qt + i * c.h, 1, mr, src.kpanels + (sb / nr + p) * c.h * nr, cp,
                     lds, false, {});
            }
          }
        }
      }
      softmax_block(c, rk, bb, kh, t0, rows, sb, width, r0, r1, S, lds, m, l, O, ldo);
      // O += P v.
      if (vdot) {
        // P rounded to bf16 pairs [width/2][rows], then every V panel, mr rows at a time.
        const int64_t wp = (width + 1) / 2, s2 = (c.s + 1) / 2;
        ks.pack_a_bf16(S, false, lds, rows, 0, width, rows, sc.p);
        const uint32_t* vpanels = reinterpret_cast<const uint32_t*>(src.vpanels);
        for (int64_t i = 0; i < rows; i += mr) {
          const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
          for (int64_t q = 0; q < ldo / nr; ++q) {
            ks.bf16(tile, wp, sc.p + i, rows, vpanels + q * s2 * nr + sb / 2 * nr,
                    O + i * ldo + q * nr, ldo, true);
          }
        }
      } else if (src.pairs) {
        // P rounded to bf16 pairs (rows padded with zeros), then every V panel on the tiles.
        const int64_t wp = (width + 1) / 2, s2 = (c.s + 1) / 2;
        ks.pack_a_bf16(S, false, lds, rows, 0, width, rows_p, sc.p);
        const uint32_t* vpanels = reinterpret_cast<const uint32_t*>(src.vpanels);
        for (int64_t q = 0; q < ldo / nr; ++q) {
          ks.bf16(static_cast<int>(rows), wp, sc.p, rows_p, vpanels + q * s2 * nr + sb / 2 * nr,
                  O + q * nr, ldo, true);
        }
      } else {
        for (int64_t i = 0; i < rows; i += mr) {
          const int tile = static_cast<int>(std::min<int64_t>(mr, rows - i));
          for (int64_t q = 0; q < ldo / nr; ++q) {
            ks.f32(tile, width, S + i * lds, lds, 1, src.vpanels + q * c.s * nr + sb * nr,
                   O + i * ldo + q * nr, ldo, true, {});
          }
        }
      }
    }
    return sc;
  }

  // out = O / l and the log-sum-exp m + log l for the item's rows (a row without a logit: 0
  // and -inf; a row with a NaN logit: NaN).
  static void finish(const AttentionCall& c, int64_t bb, int64_t kh, int64_t t0, int64_t rows,
                     const float* O, int64_t ldo, const float* m, const float* l) {
    const int64_t G = c.group();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tt = t0 + r / G, nn = kh * G + r % G;
      const float inv = l[r] == 0 ? 0.0f : 1.0f / l[r];  // a NaN sum (a NaN logit) stays NaN
      const int64_t base = ((bb * c.t + tt) * c.n + nn) * c.hv;
      const float* o = O + r * ldo;
      if (c.out().dtype() == DType::kF32) {
        float* dst = c.out().data_as<float>() + base;
        for (int64_t d = 0; d < c.hv; ++d) dst[d] = o[d] * inv;
      } else {
        uint16_t* dst = c.out().data_as<uint16_t>() + base;
        for (int64_t d = 0; d < c.hv; ++d) dst[d] = f32_to_bf16(o[d] * inv);
      }
      if (c.lse()) {
        c.lse()->data_as<float>()[(bb * c.n + nn) * c.t + tt] =
            l[r] == 0 ? kNegInf : m[r] + std::log(l[r]);
      }
    }
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace attn
}  // namespace tokamax
