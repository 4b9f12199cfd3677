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
    // Decode: a batch of 16 tokens routed top-k; prefill: 512 tokens.
    v.push_back(spec("qwen3_30b_a3b_decode" + suffix, 128, 16 * 8, 2048, 768, "f32", rdt,
                     uniform(128, 128), {"primary", "decode"}));
    v.push_back(spec("deepseek_v2_lite_decode" + suffix, 64, 16 * 6, 2048, 1408, "f32", rdt,
                     uniform(64, 96), {"primary", "decode"}));
    v.push_back(spec("gpt_oss_20b_decode" + suffix, 32, 16 * 4, 2880, 2880, "f32", rdt,
                     uniform(32, 64), {"primary", "decode"}));
    v.push_back(spec("mixtral_8x7b_decode" + suffix, 8, 16 * 2, 4096, 14336, "f32", rdt,
                     uniform(8, 32), {"large", "decode"}));
    v.push_back(spec("qwen3_30b_a3b_prefill" + suffix, 128, 512 * 8, 2048, 768, "f32", rdt,
                     uniform(128, 4096), {"large", "prefill"}));
    v.push_back(spec("deepseek_v2_lite_prefill" + suffix, 64, 512 * 6, 2048, 1408, "f32", rdt,
                     uniform(64, 3072), {"large", "prefill"}));
    v.push_back(spec("gpt_oss_20b_prefill" + suffix, 32, 512 * 4, 2880, 2880, "f32", rdt,
                     uniform(32, 2048), {"large", "prefill"}));
    v.push_back(spec("mixtral_8x7b_prefill" + suffix, 8, 512 * 2, 4096, 14336, "f32", rdt,
                     uniform(8, 1024), {"large", "prefill"}));
  }
  return v;
}

}  // namespace tokamax::rdot
