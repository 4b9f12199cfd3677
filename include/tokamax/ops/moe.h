// moe_experts: a mixture-of-experts layer's experts in one call (what Hugging Face transformers'
// experts backends, sgl-kernel's fused_experts_cpu and vLLM's CPU MoE compute). For each token t
// and each of its k routed experts e = top_k_index[t, j]:
//   h   = hidden[t] W_gate_up[e]             (2N values: the gate's N, then the up projection's)
//   a   = activation(h[:N]) * h[N:]          (the gated linear unit)
//   out[t] += top_k_weights[t, j] * (a W_down[e])
// hidden [T, K] f32 or bf16; top_k_index [T, k] int32 or int64, each in [0, E); top_k_weights
// [T, k] f32 or bf16; w_gate_up [E, K, 2N] and w_down [E, N, K], f32 or bf16, or, with
// transposed_weights, transformers' layout ([E, 2N, K] and [E, K, N], out features first). out
// [T, K] has hidden's dtype. Products accumulate in f32; with bf16 weights the activations they
// multiply are rounded to bf16 first (ragged_dot's kDefault precision: every product is exact on
// the CPU's bf16 dot), and the combine sums each token's k results in f32, in j order.
//
// The routing (sort by expert), both products, the activation and the weighted combine run in
// one call on the library's pool: no intermediate arrays cross to the caller.
#pragma once

#include <optional>
#include <string>

#include "tokamax/core/activation.h"
#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"
#include "tokamax/ops/ragged_dot.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct MoeExpertsOptions {
  Activation activation = Activation::kSilu;  // SwiGLU, as Qwen3-MoE, Mixtral, OLMoE, DeepSeek
  // The weights as transformers stores them: w_gate_up [E, 2N, K], w_down [E, K, N].
  bool transposed_weights = false;
  std::string implementation;    // "", "native", "reference"
  std::optional<Config> config;  // needs `implementation`
};

// The experts' weights packed once into the native kernels' panels (pack_rhs of each), as a
// server does at load time: the decode products then stream each expert's weights as one
// forward read. Immutable; share it between calls and threads.
struct PackedMoeWeights {
  PackedRhs gate_up;  // from [E, K, 2N] (or [E, 2N, K] transposed)
  PackedRhs down;     // from [E, N, K] (or [E, K, N] transposed)
  bool empty() const { return gate_up.empty() || down.empty(); }
};
PackedMoeWeights pack_moe_weights(const TensorView& w_gate_up, const TensorView& w_down,
                                  bool transposed_weights = false);

Tensor moe_experts(const TensorView& hidden, const TensorView& top_k_index,
                   const TensorView& top_k_weights, const TensorView& w_gate_up,
                   const TensorView& w_down, const MoeExpertsOptions& options = {});
// Pre-packed weights: the native implementation (options.transposed_weights is ignored: the
// packing recorded the layout).
Tensor moe_experts(const TensorView& hidden, const TensorView& top_k_index,
                   const TensorView& top_k_weights, const PackedMoeWeights& weights,
                   const MoeExpertsOptions& options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
