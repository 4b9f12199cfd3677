// Named dot_product_attention workloads with tags: `smoke` (tiny, CI), `primary` (benchmarks,
// shipped tuning data), `large` (long sequences).
#include "ops/attention/base.h"

namespace tokamax::attn {
namespace {

std::string sd(const char* dt, Shape s) { return ShapeDtype{std::move(s), parse_dtype(dt)}.str(); }

ArgSpec spec(std::string name, const char* dt, int64_t b, int64_t t, int64_t s, int64_t n,
             int64_t nk, int64_t h, bool causal, std::vector<std::string> tags, Json extra = {}) {
  Json args = {{"q", sd(dt, {b, t, n, h})},
               {"k", sd(dt, {b, s, nk, h})},
               {"v", sd(dt, {b, s, nk, h})},
               {"is_causal", causal}};
  if (extra.is_object()) args.update(extra);
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

}  // namespace

std::vector<ArgSpec> arg_specs() {
  std::vector<ArgSpec> v;
  v.push_back(spec("smoke", "f32", 2, 37, 45, 4, 2, 32, false, {"smoke"}));
  v.push_back(spec("smoke_causal_bf16", "bf16", 1, 40, 40, 2, 1, 16, true, {"smoke"}));
  v.push_back(spec("smoke_masked", "f32", 2, 17, 33, 2, 2, 8, false, {"smoke"},
                   {{"bias", sd("f32", {1, 2, 17, 33})},
                    {"mask", sd("bool", {2, 1, 1, 33})},
                    {"kv_seq_lengths", sd("i32", {2})},
                    {"local_window_size", {8, 4}},
                    {"logits_soft_cap", 30.0}}));
  for (const auto& [suffix, dt] :
       {std::pair<std::string, const char*>{"", "f32"}, {"_bf16", "bf16"}}) {
    v.push_back(spec("prefill" + suffix, dt, 1, 2048, 2048, 16, 16, 128, false, {"primary"}));
    v.push_back(spec("prefill_causal" + suffix, dt, 1, 2048, 2048, 16, 16, 128, true, {"primary"}));
    // Decode: one query position per sequence against an 8K-token KV cache (GQA 32/8).
    v.push_back(spec("decode" + suffix, dt, 1, 1, 8192, 32, 8, 128, false, {"primary", "decode"}));
  }
  v.push_back(spec("gqa_causal", "f32", 1, 1024, 1024, 32, 8, 128, true, {"primary"}));
  // AlphaFold's pair attention: 384 rows of 384, 4 heads of 32, a bias per head, a key mask.
  v.push_back(
      spec("alphafold", "f32", 384, 384, 384, 4, 4, 32, false, {"primary"},
           {{"bias", sd("f32", {1, 4, 384, 384})}, {"mask", sd("bool", {384, 1, 1, 384})}}));
  v.push_back(spec("prefill_8k", "f32", 1, 8192, 8192, 16, 16, 128, false, {"large"}));
  v.push_back(spec("prefill_8k_causal", "f32", 1, 8192, 8192, 16, 16, 128, true, {"large"}));
  return v;
}

}  // namespace tokamax::attn
