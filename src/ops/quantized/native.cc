// The native quantized_ragged_dot: work items of (group, panels, rows); each runs the quantized
// streaming kernel (kernels/qstream.h) on tiles of up to mr rows, so a decode call (1-4 rows per
// group) reads each panel of weights once, as one forward stream, widening it in registers.
#include <algorithm>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/microkernels.h"
#include "ops/elements.h"
#include "ops/quantized/base.h"
#include "tokamax/op/config.h"

namespace tokamax {

namespace {
constexpr ConfigFields<QuantizedRaggedDotNativeConfig, 2> kFields{
    "quantized_ragged_dot native config",
    {{{"mr", &QuantizedRaggedDotNativeConfig::mr},
      {"panels_per_item", &QuantizedRaggedDotNativeConfig::panels_per_item}}}};
}  // namespace

Json QuantizedRaggedDotNativeConfig::to_json() const { return kFields.to_json(*this); }
QuantizedRaggedDotNativeConfig QuantizedRaggedDotNativeConfig::from_json(const Json& j) {
  return kFields.from_json(j);
}

namespace quant {
namespace {

using Cfg = QuantizedRaggedDotNativeConfig;

// One work item: panels [p0, p1) of group g for its rows [r0, r1).
struct Item {
  int64_t g, r0, r1, p0, p1;
};

class Native : public TypedImplementation<QCall, Cfg> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return {"mr", "panels_per_item"}; }
  void check_config(const Cfg& cfg) const override {
    if (cfg.mr < 1 || cfg.mr > kernels::kQMaxMr || cfg.panels_per_item < 1) {
      throw InvalidArgument(cfg.to_json().dump() + ": expected 1 <= mr <= " +
                            std::to_string(kernels::kQMaxMr) + " and panels_per_item >= 1");
    }
  }
  // Tiles as tall as the kernel takes; one panel per item when the groups' panels give each
  // thread several, else the rows split too (run_call splits prefill rows in blocks).
  Cfg heuristics(const QCall&) const override { return {kernels::kQMaxMr, 1}; }
  std::vector<Cfg> search_space(const QCall&) const override {
    std::vector<Cfg> out;
    for (int mr : {1, 2, 4})
      for (int ppi : {1, 2, 4}) out.push_back({mr, ppi});
    return out;
  }
  void run_call(QCall& c, const Cfg& cfg, const Prepared*) const override {
    static const kernels::QStreamKernel kernel =
        kernels::qstream_kernel(kernels::best_kernels().isa);
    const TensorView& out = c.out();
    const int64_t M = c.m, N = c.n;
    // Rows past the groups are zero.
    const int64_t used = c.offsets.empty() ? 0 : c.offsets.back();
    const int64_t es = static_cast<int64_t>(dtype_size(out.dtype()));
    std::fill_n(static_cast<char*>(out.data()) + used * N * es, (M - used) * N * es, 0);
    if (used == 0 || N == 0) return;
    // Rows in blocks of 64 (prefill: each block re-reads its panels from L2, not memory).
    constexpr int64_t kRowBlock = 64;
    std::vector<Item> items;
    for (int64_t g = 0; g < c.g; ++g) {
      for (int64_t r0 = c.offsets[g]; r0 < c.offsets[g + 1]; r0 += kRowBlock) {
        const int64_t r1 = std::min(c.offsets[g + 1], r0 + kRowBlock);
        for (int64_t p0 = 0; p0 < c.panels; p0 += cfg.panels_per_item)
          items.push_back({g, r0, r1, p0, std::min(c.panels, p0 + cfg.panels_per_item)});
      }
    }
    const bool lhs_f32 = c.lhs.dtype() == DType::kF32;
    const auto fmt = kernel_format(c.format);
    const int64_t rb = kernels::qrow_bytes(fmt), ngroups = c.gs > 0 ? c.k / c.gs : 0;
    const int64_t scale_es = static_cast<int64_t>(dtype_size(c.scales.dtype()));
    const auto* values = static_cast<const uint8_t*>(c.values.data());
    const auto* scales = static_cast<const uint8_t*>(c.scales.data());
    const auto* zeros = c.zeros ? static_cast<const uint8_t*>(c.zeros->data()) : nullptr;
    parallel_for(static_cast<int64_t>(items.size()), c.num_threads, [&](int64_t it, int) {
      const Item& w = items[static_cast<size_t>(it)];
      // The item's rows of lhs in f32 (a bf16 lhs widened exactly), and a tile of results.
      std::vector<float> a;
      const float* a_rows = nullptr;
      if (lhs_f32) {
        a_rows = static_cast<const float*>(c.lhs.data()) + w.r0 * c.k;
      } else {
        a.resize(static_cast<size_t>((w.r1 - w.r0) * c.k));
        for (int64_t i = 0; i < static_cast<int64_t>(a.size()); ++i)
          a[static_cast<size_t>(i)] = load_f32(c.lhs, w.r0 * c.k + i);
        a_rows = a.data();
      }
      float tile[kernels::kQMaxMr * kernels::kQPanel];
      for (int64_t p = w.p0; p < w.p1; ++p) {
        const int64_t gp = w.g * c.panels + p;
        const int64_t col0 = p * kernels::kQPanel;
        const int64_t cols = std::min<int64_t>(kernels::kQPanel, N - col0);
        for (int64_t r = w.r0; r < w.r1; r += cfg.mr) {
          const int mr = static_cast<int>(std::min<int64_t>(cfg.mr, w.r1 - r));
          kernel(fmt, mr, c.k, c.gs, a_rows + (r - w.r0) * c.k, c.k, values + gp * c.k * rb,
                 scales + gp * ngroups * kernels::kQPanel * scale_es,
                 zeros ? zeros + gp * ngroups * kernels::kQPanel : nullptr, tile, kernels::kQPanel);
          for (int i = 0; i < mr; ++i) {
            for (int64_t j = 0; j < cols; ++j) {
              store_f32(out, (r + i) * N + col0 + j,
                        kernels::apply_activation(c.activation, tile[i * kernels::kQPanel + j]));
            }
          }
        }
      }
    });
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace quant
}  // namespace tokamax
