// Named moe_experts workloads: `smoke` (tiny, odd sizes, both layouts, CI) and `moe` (real
// models' expert blocks at 1, 8, 64 and 512 tokens, bf16 weights, routed by top-k over random
// router logits: the made call's routing), so that rows compare with transformers' experts
// backends on the same shapes (bench_peers --op moe_experts).
#include "ops/moe/base.h"

namespace tokamax::moe {
namespace {

ArgSpec spec(std::string name, int64_t tokens, int64_t k, int64_t experts, int64_t n, int64_t top_k,
             const char* x_dt, const char* w_dt, const char* idx_dt, bool transposed,
             std::vector<std::string> tags) {
  const DType w = parse_dtype(w_dt);
  Json args = {{"hidden", ShapeDtype{{tokens, k}, parse_dtype(x_dt)}.str()},
               {"top_k_index", ShapeDtype{{tokens, top_k}, parse_dtype(idx_dt)}.str()},
               {"top_k_weights", ShapeDtype{{tokens, top_k}, DType::kF32}.str()},
               {"w_gate_up", ShapeDtype{transposed ? std::vector<int64_t>{experts, 2 * n, k}
                                                   : std::vector<int64_t>{experts, k, 2 * n},
                                        w}
                                 .str()},
               {"w_down", ShapeDtype{transposed ? std::vector<int64_t>{experts, k, n}
                                                : std::vector<int64_t>{experts, n, k},
                                     w}
                              .str()},
               {"transposed_weights", transposed}};
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

}  // namespace

std::vector<ArgSpec> arg_specs() {
  std::vector<ArgSpec> v = {
      spec("smoke_moe_f32", 5, 24, 4, 10, 2, "f32", "f32", "i32", false, {"smoke"}),
      spec("smoke_moe_bf16_transposed", 7, 40, 5, 33, 3, "bf16", "bf16", "i64", true, {"smoke"}),
      spec("smoke_moe_f32_bf16_top1", 3, 16, 6, 17, 1, "f32", "bf16", "i64", false, {"smoke"}),
  };
  struct Model {
    const char* name;
    int64_t k, experts, n, top_k;
  };
  // Hidden size, routed experts, expert width, experts per token (the models' configs).
  constexpr Model kModels[] = {{"qwen3_30b_a3b", 2048, 128, 768, 8},
                               {"olmoe_1b_7b", 2048, 64, 1024, 8},
                               {"mixtral_8x7b", 4096, 8, 14336, 2},
                               {"deepseek_v2_lite", 2048, 64, 1408, 6},
                               {"gpt_oss_20b", 2880, 32, 2880, 4}};
  for (const Model& m : kModels) {
    for (int64_t tokens : {1, 8, 64, 512}) {
      v.push_back(spec(std::string(m.name) + "_experts_" + std::to_string(tokens) + "tok", tokens,
                       m.k, m.experts, m.n, m.top_k, "bf16", "bf16", "i64", true,
                       {"moe", tokens <= 64 ? "decode" : "prefill"}));
    }
  }
  return v;
}

}  // namespace tokamax::moe
