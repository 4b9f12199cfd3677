// The native add_rms_norm: per row, the sum (kernels' add), its statistics and the normalized
// row read back from L1/L2 while the row is hot; threads over items of rows_per_item rows (the
// layer norm's config). Memory sees x and residual read once, y and the sum written once: 4
// passes where the unfused pair makes 5.
#include <algorithm>
#include <atomic>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/microkernels.h"
#include "kernels/norm.h"
#include "ops/add_norm/base.h"
#include "ops/norm/base.h"
#include "tokamax/core/device.h"

namespace tokamax::add_norm {
namespace {

class Native : public TypedImplementation<AddNormCall, LayerNormNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return {"rows_per_item"}; }
  void check_config(const LayerNormNativeConfig& cfg) const override {
    if (cfg.rows_per_item < 1)
      throw InvalidArgument(cfg.to_json().dump() + ": expected rows_per_item >= 1");
  }
  // Items of about 256 KiB of x (at least one row), 8 per thread where the rows allow: the
  // layer norm's measured rule.
  LayerNormNativeConfig heuristics(const AddNormCall& c) const override {
    const int64_t row_bytes = std::max<int64_t>(1, c.d * dtype_size(c.x.dtype()));
    const int64_t cap = std::max<int64_t>(1, (int64_t{256} << 10) / row_bytes);
    return {
        static_cast<int>(std::clamp<int64_t>(c.rows / (8 * std::max(1, c.num_threads)), 1, cap))};
  }
  std::vector<LayerNormNativeConfig> search_space(const AddNormCall& c) const override {
    std::vector<LayerNormNativeConfig> out;
    for (int r = 1; r <= 512 && (r <= c.rows || out.empty()); r *= 2) out.push_back({r});
    return out;
  }
  void run_call(AddNormCall& c, const LayerNormNativeConfig& cfg, const Prepared*) const override {
    static const kernels::NormKernels k = kernels::norm_kernels(kernels::best_kernels().isa);
    Tensor scale_storage;
    const float* scale = norm::params_f32(c.scale, &scale_storage);
    const int64_t es = static_cast<int64_t>(dtype_size(c.x.dtype())), rpi = cfg.rows_per_item;
    const auto* x = static_cast<const char*>(c.x.data());
    const auto* res = static_cast<const char*>(c.residual.data());
    auto* sum = static_cast<char*>(c.sum().data());
    auto* y = static_cast<char*>(c.y().data());
    const float eps = static_cast<float>(c.epsilon);
    // Outputs that cannot stay in the last-level cache are written non-temporally (NormKernels'
    // `stream`: an ordinary store reads each line first). The sum is then made in a row of
    // scratch that stays in L1/L2, its statistics read from there, and written out as it is
    // normalized; a streamed row is never read back.
    // A row of scratch a thread that does not fit its L2 would not be read back from cache:
    // such rows (over 256K f32 values on 1 MiB) go the direct way.
    const int64_t l2 = device_info().l2_bytes, at_least = stream_threshold_bytes();
    const bool stream =
        at_least > 0 && 2 * c.x.size() * es >= at_least && (l2 <= 0 || 2 * c.d * es <= l2);
    const int threads = std::max(1, c.num_threads);
    std::vector<std::vector<char>> scratch(stream ? static_cast<size_t>(threads) : 0);
    for (auto& row : scratch) row.resize(static_cast<size_t>(c.d * es));
    parallel_for((c.rows + rpi - 1) / rpi, threads, [&](int64_t item, int t) {
      for (int64_t r = item * rpi; r < std::min(c.rows, (item + 1) * rpi); ++r) {
        const int64_t at = r * c.d * es;
        char* s = stream ? scratch[static_cast<size_t>(t)].data() : sum + at;
        float mean, rstd;
        k.add(x + at, res + at, c.bf16, c.d, s);
        k.stats(s, c.bf16, c.d, /*subtract_mean=*/false, eps, &mean, &rstd);
        if (stream) k.apply(s, c.bf16, c.d, 0.0f, 1.0f, nullptr, nullptr, sum + at, true);
        k.apply(s, c.bf16, c.d, 0.0f, rstd, scale, nullptr, y + at, stream);
      }
      if (stream) k.fence();
    });
  }
};

std::atomic<int64_t> g_stream_threshold_for_testing{0};

}  // namespace

int64_t stream_threshold_bytes() {
  const int64_t forced = g_stream_threshold_for_testing.load(std::memory_order_relaxed);
  return forced > 0 ? forced : device_info().l3_bytes;
}

void set_stream_threshold_for_testing(int64_t bytes) {
  g_stream_threshold_for_testing.store(bytes, std::memory_order_relaxed);
}

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace tokamax::add_norm
