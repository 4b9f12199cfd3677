// Named quantized_ragged_dot workloads: `smoke` (tiny, odd sizes, every format, CI) and
// `quantized` (the expert shapes of ragged_dot's model specs, in the format each model ships:
// decode is 16 tokens routed top-k, prefill 512), so that a quantized row and the bf16 row of
// the same model compare directly.
#include "ops/quantized/base.h"

namespace tokamax::quant {
namespace {

ArgSpec spec(std::string name, QuantFormat f, int64_t groups, int64_t m, int64_t k, int64_t n,
             int64_t group_size, bool asymmetric, const char* lhs_dt, Json group_sizes,
             std::vector<std::string> tags) {
  Json args = {{"lhs", ShapeDtype{{m, k}, parse_dtype(lhs_dt)}.str()},
               {"values", values_spec(f, groups, k, n).str()},
               {"scales", scales_spec(f, groups, k, n, group_size).str()},
               {"group_sizes", std::move(group_sizes)},
               {"format", std::string(quant_format_name(f))},
               {"n", n},
               {"group_size", group_size}};
  if (asymmetric) {
    ShapeDtype z = scales_spec(f, groups, k, n, group_size);
    z.dtype = DType::kU8;
    args["zeros"] = z.str();
  }
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

Json uniform(int64_t g, int64_t total) { return {{"num_groups", g}, {"total_size", total}}; }

}  // namespace

std::vector<ArgSpec> arg_specs() {
  using F = QuantFormat;
  std::vector<ArgSpec> v = {
      spec("smoke_int8", F::kInt8, 3, 9, 40, 70, 0, false, "f32", Json::array({4, 0, 3}),
           {"smoke"}),
      spec("smoke_int8_g8_bf16", F::kInt8, 2, 5, 24, 65, 8, false, "bf16", Json::array({1, 3}),
           {"smoke"}),
      spec("smoke_int4_g32", F::kInt4, 3, 7, 64, 33, 32, false, "f32", Json::array({2, 2, 2}),
           {"smoke"}),
      spec("smoke_int4_asym_g32", F::kInt4, 2, 6, 96, 130, 32, true, "bf16", Json::array({0, 5}),
           {"smoke"}),
      spec("smoke_fp8_e4m3", F::kFp8E4M3, 2, 4, 24, 65, 0, false, "f32", Json::array({3, 1}),
           {"smoke"}),
      spec("smoke_mxfp4", F::kMxfp4, 2, 5, 64, 100, 32, false, "f32", Json::array({2, 3}),
           {"smoke"}),
  };
  struct Model {
    const char* name;
    int64_t experts, k, n, top_k;
    F format;
    int64_t group_size;
    const char* format_name;
  };
  constexpr Model kModels[] = {{"qwen3_30b_a3b", 128, 2048, 768, 8, F::kInt4, 128, "int4_g128"},
                               {"deepseek_v2_lite", 64, 2048, 1408, 6, F::kInt8, 0, "int8"},
                               {"gpt_oss_20b", 32, 2880, 2880, 4, F::kMxfp4, 32, "mxfp4"},
                               {"mixtral_8x7b", 8, 4096, 14336, 2, F::kInt4, 32, "q4_0"},
                               {"qwen3_30b_a3b", 128, 2048, 768, 8, F::kFp8E4M3, 0, "fp8_e4m3"}};
  for (const auto& [phase, tokens] :
       {std::pair<std::string, int64_t>{"decode", 16}, {"prefill", 512}}) {
    for (const Model& m : kModels) {
      const int64_t rows = tokens * m.top_k;
      v.push_back(spec(std::string(m.name) + "_" + phase + "_" + m.format_name, m.format, m.experts,
                       rows, m.k, m.n, m.group_size, false, "f32", uniform(m.experts, rows),
                       {"quantized", phase}));
    }
  }
  return v;
}

}  // namespace tokamax::quant
