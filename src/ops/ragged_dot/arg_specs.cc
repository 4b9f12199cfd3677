// Named ragged_dot workloads with tags: `smoke` (tiny, CI), `primary` (benchmarks, shipped
// tuning data), `large` (big model shapes: minutes to tune, gigabytes of weights).
#include "ops/ragged_dot/base.h"

namespace tokamax::rdot {
namespace {

ArgSpec spec(std::string name, int64_t groups, int64_t m, int64_t k, int64_t n, const char* lhs_dt,
             const char* rhs_dt, Json group_sizes, std::vector<std::string> tags) {
  auto sd = [](const char* dt, std::vector<int64_t> s) {
    return ShapeDtype{s, parse_dtype(dt)}.str();
  };
  Json args = {{"lhs", sd(lhs_dt, {m, k})},
               {"rhs", sd(rhs_dt, {groups, k, n})},
               {"group_sizes", group_sizes}};
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

Json uniform(int64_t g, int64_t total) { return {{"num_groups", g}, {"total_size", total}}; }

}  // namespace

std::vector<ArgSpec> arg_specs() {
  std::vector<ArgSpec> v;
  v.push_back(
      spec("smoke_f32", 4, 67, 96, 80, "f32", "f32", Json::array({20, 0, 40, 7}), {"smoke"}));
  v.push_back(spec("smoke_bf16_weights", 4, 67, 96, 80, "f32", "bf16", Json::array({20, 0, 40, 7}),
                   {"smoke"}));
  v.push_back(spec("smoke_decode", 8, 8, 256, 256, "f32", "f32",
                   Json::array({1, 1, 1, 1, 1, 1, 1, 1}), {"smoke"}));
  for (const auto& [suffix, rdt] :
       {std::pair<std::string, const char*>{"", "f32"}, {"_bf16_weights", "bf16"}}) {
    v.push_back(spec("compute_bound" + suffix, 8, 2048, 1024, 1024, "f32", rdt,
                     Json::array({2048, 0, 0, 0, 0, 0, 0, 0}), {"primary"}));
    v.push_back(spec("balanced_prefill" + suffix, 8, 4096, 1024, 1024, "f32", rdt,
                     Json::array({512, 512, 512, 512, 512, 512, 512, 512}), {"primary"}));
    v.push_back(spec("memory_bound" + suffix, 8, 8, 2048, 2048, "f32", rdt,
                     Json::array({1, 1, 1, 1, 1, 1, 1, 1}), {"primary"}));
    // Mixture-of-experts models: decode is a batch of 16 tokens routed top-k, prefill 512.
    // Each token takes top_k rows; rows spread over the experts as tokamax does (uniform).
    struct Model {
      const char* name;
      int64_t experts, k, n, top_k;
      bool primary_decode;  // small enough to tune and benchmark routinely
    };
    constexpr Model kModels[] = {{"qwen3_30b_a3b", 128, 2048, 768, 8, true},
                                 {"deepseek_v2_lite", 64, 2048, 1408, 6, true},
                                 {"gpt_oss_20b", 32, 2880, 2880, 4, true},
                                 {"mixtral_8x7b", 8, 4096, 14336, 2, false}};
    for (const auto& [phase, tokens] :
         {std::pair<std::string, int64_t>{"decode", 16}, {"prefill", 512}}) {
      for (const Model& m : kModels) {
        const int64_t rows = tokens * m.top_k;
        const bool primary = phase == "decode" && m.primary_decode;
        v.push_back(spec(std::string(m.name) + "_" + phase + suffix, m.experts, rows, m.k, m.n,
                         "f32", rdt, uniform(m.experts, rows),
                         {primary ? "primary" : "large", phase}));
      }
    }
  }
  return v;
}

}  // namespace tokamax::rdot
