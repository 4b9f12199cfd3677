// Named gated_linear_unit workloads with tags: `smoke` (tiny, CI), `primary` (benchmarks,
// shipped tuning data: 4096 tokens through a 2048 -> 5632 SwiGLU, f32 and bf16 weights),
// `large` (4096 -> 14336, Llama-3-8B's).
#include "ops/glu/base.h"

namespace tokamax::glu {
namespace {

ArgSpec spec(std::string name, int64_t m, int64_t k, int64_t n, const char* w_dtype,
             const char* activation, std::vector<std::string> tags, bool separate = false) {
  const DType wd = parse_dtype(w_dtype);
  Json args = {{"x", ShapeDtype{{m, k}, DType::kF32}.str()}, {"activation", activation}};
  if (separate) {
    args["w"] = ShapeDtype{{k, n}, wd}.str();
    args["w_up"] = ShapeDtype{{k, n}, wd}.str();
  } else {
    args["w"] = ShapeDtype{{k, 2, n}, wd}.str();
  }
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

}  // namespace

std::vector<ArgSpec> arg_specs() {
  return {spec("glu_smoke", 37, 45, 70, "f32", "silu", {"smoke"}),
          spec("glu_smoke_bf16", 9, 64, 33, "bf16", "gelu", {"smoke"}),
          spec("glu_smoke_separate", 5, 16, 40, "f32", "sigmoid", {"smoke"}, true),
          spec("glu_4096x2048x5632", 4096, 2048, 5632, "f32", "silu", {"primary"}),
          spec("glu_4096x2048x5632_bf16", 4096, 2048, 5632, "bf16", "silu", {"primary"}),
          spec("glu_decode_2048x5632", 8, 2048, 5632, "f32", "silu", {"primary"}),
          spec("glu_4096x4096x14336", 4096, 4096, 14336, "f32", "silu", {"large"})};
}

}  // namespace tokamax::glu
