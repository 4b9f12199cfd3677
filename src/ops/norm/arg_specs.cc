// Named layer_norm workloads with tags: `smoke` (tiny, CI), `primary` (benchmarks, shipped
// tuning data): transformer widths (4096 tokens of hidden 2048 and 4096), AlphaFold's pair
// representation, and 2 GiB tensors (`stream`: at least 4x the 260-480 MiB L3 of the machines here,
// where the bandwidth targets apply).
#include "ops/norm/base.h"

namespace tokamax::norm {
namespace {

ArgSpec spec(std::string name, const ShapeDtype& x, bool rms, bool offset,
             std::vector<std::string> tags) {
  const ShapeDtype p{{x.shape.back()}, DType::kF32};
  Json args = {{"x", x.str()}, {"scale", p.str()}, {"subtract_mean", !rms}};
  if (offset) args["offset"] = p.str();
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

}  // namespace

std::vector<ArgSpec> arg_specs() {
  std::vector<ArgSpec> v;
  v.push_back(spec("layer_norm_smoke", {{33, 77}, DType::kF32}, false, true, {"smoke"}));
  v.push_back(spec("rms_norm_smoke_bf16", {{9, 130}, DType::kBF16}, true, false, {"smoke"}));
  for (const auto& [suffix, dt] :
       {std::pair<std::string, DType>{"", DType::kF32}, {"_bf16", DType::kBF16}}) {
    for (int64_t hidden : {2048, 4096}) {
      const std::string h = std::to_string(hidden);
      v.push_back(
          spec("layer_norm_4096x" + h + suffix, {{4096, hidden}, dt}, false, true, {"primary"}));
      v.push_back(
          spec("rms_norm_4096x" + h + suffix, {{4096, hidden}, dt}, true, false, {"primary"}));
    }
  }
  v.push_back(spec("alphafold", {{384, 384, 128}, DType::kF32}, false, true, {"primary"}));
  v.push_back(
      spec("layer_norm_stream", {{131072, 4096}, DType::kF32}, false, true, {"primary", "stream"}));
  v.push_back(
      spec("rms_norm_stream", {{131072, 4096}, DType::kF32}, true, false, {"primary", "stream"}));
  return v;
}

}  // namespace tokamax::norm
