// The native layer_norm and its backward: the norm row kernels (kernels/norm.h) over work items
// of rows_per_item contiguous rows, threads over items. One pass over x for the statistics
// (shifted sums in f64 lanes), a second over the same row while it is still in L1/L2 for y:
// memory sees x read once and y written once. The backward likewise reads x and dy once from
// memory (two passes over each row in cache) and writes dx once; dscale and doffset sum in f32
// over a work item's rows, then into one f64 total per thread slot, each slot owning a fixed
// round-robin set of items and the slots added in order: the result does not depend on
// scheduling.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/handoff.h"
#include "core/thread_pool.h"
#include "kernels/norm.h"
#include "kernels/stream_prefetch.h"
#include "ops/norm/base.h"
#include "tokamax/core/device.h"

namespace tokamax {

namespace {
constexpr ConfigFields<LayerNormNativeConfig, 1> kFields{
    "layer_norm native config", {{{"rows_per_item", &LayerNormNativeConfig::rows_per_item}}}};
}  // namespace

Json LayerNormNativeConfig::to_json() const { return kFields.to_json(*this); }
LayerNormNativeConfig LayerNormNativeConfig::from_json(const Json& j) {
  return kFields.from_json(j);
}

namespace norm {
namespace {

const kernels::NormKernels& row_kernels() {
  static const kernels::NormKernels k = kernels::norm_kernels(kernels::best_kernels().isa);
  return k;
}

// What the norms do differently by CPU vendor, measured where its use says: which outputs are
// streamed (streams_output) and the forward's items on threads that share a cache (item_rows).
struct VendorTuning {
  bool stream_from_l2s;          // outputs of at least 4 L2s a thread are streamed too
  bool block_items_when_shared;  // streamed forwards take one block an item on one cache
};
const VendorTuning& vendor_tuning() {
  static const VendorTuning t =
      device_info().is_intel() ? VendorTuning{true, false} : VendorTuning{false, true};
  return t;
}

// Outputs of at least the last-level cache's size are written non-temporally (NormKernels:
// `stream`): they would not stay in the cache, and ordinary stores read every line first. On
// Intel also those of at least 4 L2s a thread: a Sapphire Rapids VM reports its socket's 480 MiB
// L3, of which two cores' stores see little; streamed there (tokamax bench --impl native, 2-3
// interleaved pairs): layer_norm 4096 x 4096 f32 3.95-4.09 ms against 5.77-6.08, rms_norm 4096 x
// 2048 bf16 (16 MiB out) 1.73-1.75 against 1.98-2.05, alphafold 4.90 against 6.50, the layer_norm
// backward 4096 x 4096 7.2-7.6 against 9.2-9.3.
bool streams_output(int64_t bytes, int threads) {
  const DeviceInfo& d = device_info();
  int64_t at = d.l3_bytes > 0 ? d.l3_bytes : d.l2_bytes;
  if (vendor_tuning().stream_from_l2s && d.l2_bytes > 0)
    at = std::min(at, 4 * d.l2_bytes * std::max(threads, 1));
  return at > 0 && bytes >= at;
}

// The forward normalizes an item's rows in blocks of kBlockRows: the block's statistics, then
// its rows a chunk of kChunkBytes of x at a time, every row of the block per chunk. Why: a row's
// x, scale and offset (16 KiB each at 4096 f32) do not fit a 32 KiB L1 together, so row by row
// every normalization re-read all three from L2; a chunk's scale and offset now stay in L1 for
// the block (Zen 4, 2 threads, one-off harness against the streaming copy in the same rounds:
// row by row 45 GB/s where the blocks reach 56 and the copy 70).
// The block kAheadRows rows on is prefetched into L2 while this one is worked on, in two parts
// (kEarlyLines, kLateLines): the first lines of each 4 KiB chunk of a row before this block's
// statistics of the same row, starting memory on every page of the next block early, and more lines
// of each chunk before this block writes the same chunk of the same row. Nor is the next block read
// in the same loop as this one is written, although the copy does both at once: the fused forms
// tried (the next row's sums with this row's writes, whole rows or 2-8 KiB chunks) ran at 34-45
// GB/s where the blocks reach 56 (Zen 4): each extra stream such a loop draws from L2 (x's row,
// scale, offset) slowed it; without scale and offset the fused row matched the copy.
constexpr int64_t kBlockRows = 4;
constexpr int64_t kChunkBytes = 4096;
// How many rows ahead both directions prefetch x (and the backward dy): a block.
constexpr int64_t kAheadRows = kBlockRows;
// The forward's prefetch of each 4 KiB chunk (64 lines) of the block ahead: lines [0,
// kEarlyLines) during this block's statistics, [kEarlyLines, kLateLines) during its writes, in
// kPrefetchParts bursts (a chunk's writes in parts of kChunkBytes / kPrefetchParts bytes of x,
// each after the prefetches of its own lines). Measured on both vendors:
// Intel (Sapphire Rapids VM, 480 MiB L3). tokamax bench --op layer_norm --spec
// layer_norm_stream --impl native, 3 interleaved rounds a comparison: all 64 lines during the
// writes 139.6-142.0 ms (64.7-65.5% of the streaming copy) against 147.0-149.1 with 16 lines and
// 153.6-156.8 with none (two rows further ahead: 142.5-143.6); then the first 1, 2, 4 or 8 lines
// during the statistics and the rest during the writes 118-126 ms alike (2 lines 118.1-122.1,
// 24 lines 136.0-136.4, 32 lines 136.5-138.8). And those 62 lines in 8 bursts, each before the
// 512 bytes of the chunk written next, rather than all before the chunk (2026-12-06, 3-4
// interleaved runs of `--tag stream`): layer_norm 117.8-120.8 ms against 121.6-128.6, rms_norm
// 112.2-116.7 against 121.0-125.3 (0.90-0.97x the time, paired by run); in 4 parts 0.93-0.99x,
// in 2 or 16 alike to one. A burst of 62 misses holds the core's fill buffers, which the
// streamed stores write through too (the grouped GEMM's next-panel prefetch, likewise).
// AMD (Zen 4), which had taken {0, 16} lines in one burst since 2026-12-05 (the whole chunk
// during the writes had competed with the streamed stores in the memory's fast minutes; 0, 16
// and 64 lines during the writes measured alike on 2026-12-06): the two parts measured there on
// 2026-12-07 (tokamax bench --op layer_norm --tag stream, a test build running {2, 64, 8} in the
// native:heuristics row beside {0, 16, 1} in the same process, 7 interleaved rounds, 5 runs):
// 0.949-0.985x the time in all 10 rows (median 0.96x), both memory states; the same build with
// {0, 16, 1} in both rows 1.001-1.008x. Alike on the AlphaFold-like rows (1.007-1.013x, 2 runs).
constexpr int64_t kEarlyLines = 2, kLateLines = 64, kPrefetchParts = 8;

// The config parts both directions share.
template <class CallT>
class NativeBase : public TypedImplementation<CallT, LayerNormNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return kFields.names(); }
  void check_call(const CallT& c) const override {
    if (c.inner != 1) {
      throw Unsupported(
          "native layer_norm normalizes a contiguous axis (the last, or one followed only by "
          "size-1 dims); x " +
          shape_str(c.x.shape()) + " along axis " + std::to_string(c.axis) + " is strided");
    }
  }
  void check_config(const LayerNormNativeConfig& cfg) const override {
    if (cfg.rows_per_item < 1)
      throw InvalidArgument(kFields.to_json(cfg).dump() + ": expected rows_per_item >= 1");
  }
  // Items of up to 256 rows, at least 8 per thread where the rows allow (tokamax autotune
  // --tag primary here: the winners were 64-512 rows, and items of 128 KiB of x, 8-32 rows,
  // 2-7% slower: each item starts its row streams anew). The backward's items
  // also bound how often its f32 parameter sums are flushed into f64 (2 D adds an item):
  // up to 512 rows, 4 per thread (winners 256-512; 8-32 rows were 6-15% slower).
  // (Until 2026-12-05 the forward over f32 rows of at least two chunks took one block per
  // item, the two threads' items interleaved, each prefetching the whole block after its own;
  // with the partial prefetch, items of 4 rows measured 42-47 GB/s in the memory's fast minutes
  // where items of 64 rows reached 54-58: each item's hardware streams run on past its end.)
  LayerNormNativeConfig heuristics(const CallT& c) const override {
    constexpr bool kBackward = std::is_same_v<CallT, NormVjpCall>;
    // Short forward rows: items of at least 256 KiB of x (alphafold's 512-byte rows: 512 rows,
    // 4.95 ms against 5.58 with 256 on a Sapphire Rapids VM, 2 runs; alike on Zen 4 by its
    // shipped tuning data, 4.55 ms either way).
    const int64_t row_bytes = std::max<int64_t>(1, c.d * dtype_size(c.x.dtype()));
    const int64_t per_thread = kBackward ? 4 : 8,
                  cap = kBackward ? 512 : std::max<int64_t>(256, (int64_t{256} << 10) / row_bytes);
    const int64_t rpi =
        std::clamp<int64_t>(c.rows() / (per_thread * std::max(1, c.num_threads)), 1, cap);
    return {static_cast<int>(rpi)};
  }
  std::vector<LayerNormNativeConfig> search_space(const CallT& c) const override {
    std::vector<LayerNormNativeConfig> out;
    for (int r = 1; r <= 512; r *= 2) {
      if (r > std::max<int64_t>(c.rows(), 1) && !out.empty()) break;
      out.push_back({r});
    }
    return out;
  }
};

// The forward's rows an item: the config's, or one block where the output is streamed, the CPU
// measured so (VendorTuning) and the call's threads share one last-level cache now
// (core/handoff.h: a VM's vCPUs move between dies). Items of one block interleave the threads'
// rows, and each thread's prefetch of the block ahead then fetches the block the other takes
// next: the two sweep memory as one stream. Zen 4, 2 threads, a one-off program alternating the
// hand-off probe with the 512 MiB f32 layer norm (4096 values a row) at 4 and 256 rows an item,
// 30 rounds 2 s apart: in the 22 rounds whose hand-off took 31-36 ns (one die), 4 rows took
// 0.88-1.05x the time of 256 (median 0.925x); in the 8 at 162-172 ns (two dies, each core with
// its own path to memory, where two streams each core's own beat one shared), 1.44-1.56x. The tuner
// can only measure the placement it runs in, so the config keeps the other's choice. The 2 GiB
// rows in `tokamax bench --tag stream`: docs/performance-log.md, layer_norm, seventeenth measurement round.
// Rows of at least two chunks only: a block of short rows is too small an item (the AlphaFold-like
// 512-byte rows, streamed at 75 MB: 8.7 ms a call in blocks against 3.9 in 512-row items).
int64_t item_rows(const NormCall& c, const LayerNormNativeConfig& cfg, bool stream) {
  if (stream && vendor_tuning().block_items_when_shared && c.rows() > 2 * kBlockRows &&
      c.d * dtype_size(c.x.dtype()) >= 2 * kChunkBytes && pool_threads_share_cache(c.num_threads))
    return kBlockRows;
  return cfg.rows_per_item;
}

class Native : public NativeBase<NormCall> {
 public:
  void run_call(NormCall& c, const LayerNormNativeConfig& cfg, const Prepared*) const override {
    check_config(cfg);
    const kernels::NormKernels& k = row_kernels();
    Tensor scale_store, offset_store;
    const float* scale = params_f32(c.scale, &scale_store);
    const float* offset = params_f32(c.offset, &offset_store);
    const int64_t es = dtype_size(c.x.dtype());
    const bool stream = streams_output(c.y().size() * es, c.num_threads);
    const int64_t rpi = item_rows(c, cfg, stream), items = (c.rows() + rpi - 1) / rpi;
    const char* x = static_cast<const char*>(c.x.data());
    char* y = static_cast<char*>(c.y().data());
    float* means = c.mean() ? c.mean()->data_as<float>() : nullptr;
    float* rstds = c.rstd() ? c.rstd()->data_as<float>() : nullptr;
    const int64_t chunk = kChunkBytes / es;
    // A part of a chunk's writes: 512 bytes of x, whole lines and vectors (the kernels' widths
    // divide it), so each prefetched line belongs to one part.
    const int64_t sub = kChunkBytes / kPrefetchParts / es;
    parallel_for(items, c.num_threads, [&](int64_t item, int) {
      const int64_t r1 = std::min(c.rows(), (item + 1) * rpi);
      for (int64_t b0 = item * rpi; b0 < r1; b0 += kBlockRows) {
        const int64_t b1 = std::min(r1, b0 + kBlockRows);
        float mean[kBlockRows], rstd[kBlockRows];
        for (int64_t r = b0; r < b1; ++r) {
          if (r + kAheadRows < c.rows()) {
            const char* ahead = x + (r + kAheadRows) * c.d * es;
            for (int64_t c0 = 0; c0 < c.d; c0 += chunk)
              kernels::prefetch_l2(ahead + c0 * es, 0, std::min(kEarlyLines * 64, (c.d - c0) * es));
          }
          k.stats(x + r * c.d * es, c.bf16, c.d, c.subtract_mean, static_cast<float>(c.epsilon),
                  &mean[r - b0], &rstd[r - b0]);
          if (means) {
            means[r] = mean[r - b0];
            rstds[r] = rstd[r - b0];
          }
        }
        for (int64_t c0 = 0; c0 < c.d; c0 += chunk) {
          const int64_t n = std::min(chunk, c.d - c0);
          const int64_t lo = kEarlyLines * 64, hi = std::min(kLateLines * 64, n * es);  // bytes
          for (int64_t r = b0; r < b1; ++r) {
            const int64_t at = r * c.d + c0;
            for (int64_t s0 = 0; s0 < n; s0 += sub) {
              const int64_t sn = std::min(sub, n - s0);
              if (r + kAheadRows < c.rows()) {
                const int64_t plo = std::max(lo, s0 * es), phi = std::min(hi, (s0 + sn) * es);
                if (plo < phi) kernels::prefetch_l2(x + (at + kAheadRows * c.d) * es, plo, phi);
              }
              k.apply(x + (at + s0) * es, c.bf16, sn, mean[r - b0], rstd[r - b0],
                      scale ? scale + c0 + s0 : nullptr, offset ? offset + c0 + s0 : nullptr,
                      y + (at + s0) * es, stream);
            }
          }
        }
      }
      if (stream) k.fence();
    });
  }
};

class VjpNative : public NativeBase<NormVjpCall> {
 public:
  int64_t scratch(const NormVjpCall& c, const LayerNormNativeConfig&) const override {
    return slots(c) * 2 * c.d * (4 + 8);
  }
  void run_call(NormVjpCall& c, const LayerNormNativeConfig& cfg, const Prepared*) const override {
    check_config(cfg);
    const kernels::NormKernels& k = row_kernels();
    Tensor scale_store;
    const float* scale = params_f32(c.scale, &scale_store);
    const int64_t rpi = cfg.rows_per_item, items = (c.rows() + rpi - 1) / rpi;
    const int64_t es = dtype_size(c.x.dtype()), nslots = slots(c), D = c.d;
    const bool sums = c.scale || c.offset;
    // Slot s: f32 dscale and doffset sums of its current item at [2 s D, (2 s + 2) D), added
    // after each item into f64 totals at the same offsets: f32 sums over hundreds of thousands
    // of rows would drift past the tolerance (the rows' values are summed, not averaged).
    const int64_t part = sums ? std::max<int64_t>(1, 2 * nslots * D) : 1;
    Tensor item_sums = Tensor::zeros({part}, DType::kF32);
    Tensor totals = Tensor::zeros({part}, DType::kF64);
    const char* x = static_cast<const char*>(c.x.data());
    const char* dy = static_cast<const char*>(c.dy.data());
    char* dx = static_cast<char*>(c.dx().data());
    const float* means = c.mean_in.data_as<const float>();
    const float* rstds = c.rstd_in.data_as<const float>();
    const bool stream = streams_output(c.dx().size() * es, c.num_threads);
    parallel_for(nslots, c.num_threads, [&](int64_t slot, int) {
      float* ds = sums ? item_sums.data_as<float>() + 2 * slot * D : nullptr;
      double* tot = sums ? totals.data_as<double>() + 2 * slot * D : nullptr;
      for (int64_t item = slot; item < items; item += nslots) {
        const int64_t r1 = std::min(c.rows(), (item + 1) * rpi);
        for (int64_t r = item * rpi; r < r1; ++r) {
          const int64_t at = r * D * es;
          // The row kAheadRows on, into L2. 2 GiB and 4096 x 4096 f32, 2 threads, Zen 4, 7
          // interleaved rounds against the streaming copy, four runs: medians 0.45-0.58 of it,
          // against 0.41-0.56 with the next row into L1 (the lowest in every run: it also
          // evicted the parameter sums), 0.43-0.59 with no prefetch and 0.44-0.58 with the next
          // row into L2 (those three within noise). The forward's partial prefetch (the first
          // 16 lines of each 4 KiB) and none measured alike too (2 GiB, 2 alternated runs each).
          const int64_t ahead = r + kAheadRows < c.rows() ? at + kAheadRows * D * es : at;
          k.backward(x + at, dy + at, c.bf16, D, means[r], rstds[r], scale, c.subtract_mean,
                     dx + at, c.scale ? ds : nullptr, c.offset ? ds + D : nullptr, x + ahead,
                     dy + ahead, stream);
        }
        if (stream) k.fence();
        if (!sums) continue;
        for (int64_t j = 0; j < 2 * D; ++j) {
          tot[j] += ds[j];
          ds[j] = 0.0f;
        }
      }
    });
    for (const auto& [out, half] : {std::pair{c.dscale(), 0}, std::pair{c.doffset(), 1}}) {
      if (!out) continue;
      float* o = out->data_as<float>();
      for (int64_t j = 0; j < D; ++j) {
        double s = 0;
        for (int64_t sl = 0; sl < nslots; ++sl)
          s += totals.data_as<const double>()[(2 * sl + half) * D + j];
        o[j] = static_cast<float>(s);
      }
    }
  }

 private:
  // One accumulator per thread the call may use (fixed for a thread count: deterministic).
  static int64_t slots(const NormVjpCall& c) {
    return std::max(1, std::min(c.num_threads, ThreadPool::global().size()));
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }
std::shared_ptr<const Implementation> make_vjp_native() { return std::make_shared<VjpNative>(); }

}  // namespace norm
}  // namespace tokamax
