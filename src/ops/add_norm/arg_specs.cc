// Named add_rms_norm workloads: `smoke` (tiny, CI) and `primary` (benchmarks, shipped tuning
// data): one decoded token and a 4096-token prefill of Llama-like hidden sizes, bf16 and f32.
#include "ops/add_norm/base.h"

namespace tokamax::add_norm {

std::vector<ArgSpec> arg_specs() {
  auto spec = [](std::string name, const ShapeDtype& x, std::vector<std::string> tags) {
    return ArgSpec{kFamily,
                   std::move(name),
                   {{"x", x.str()},
                    {"residual", x.str()},
                    {"scale", ShapeDtype{{x.shape.back()}, DType::kF32}.str()}},
                   std::move(tags)};
  };
  std::vector<ArgSpec> v = {spec("add_rms_norm_smoke", {{9, 130}, DType::kF32}, {"smoke"}),
                            spec("add_rms_norm_smoke_bf16", {{5, 67}, DType::kBF16}, {"smoke"})};
  for (int64_t hidden : {2048, 4096}) {
    for (int64_t tokens : {1, 4096}) {
      for (DType dt : {DType::kBF16, DType::kF32}) {
        const std::string name = "add_rms_norm_" + std::to_string(tokens) + "x" +
                                 std::to_string(hidden) + (dt == DType::kBF16 ? "_bf16" : "");
        v.push_back(spec(name, {{tokens, hidden}, dt}, {"primary"}));
      }
    }
  }
  return v;
}

}  // namespace tokamax::add_norm
