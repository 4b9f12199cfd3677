// The mixture-of-experts feed-forward of examples/moe_block and examples/transformer_decoder,
// written the way a model would be (Qwen-MoE's and DeepSeek's, with a shared expert):
//   h = rms_norm(x) * norm_scale; router logits = h W_r; top-k experts per token with softmax
//   weights; tokens sorted by expert; per expert: silu(h W_gate) * (h W_up), then W_down;
//   the shared expert: gated_linear_unit(h, W_shared [D, 2, F]) then W_shared_down;
//   out = x + shared + sum over the token's experts of weight * expert output.
// rms_norm and the shared expert's SwiGLU are tokamax's; the router and the expert matmuls are
// ragged_dot calls (the router and the shared down projection as one group), so a trace records
// every one with its bound arguments and config.
#pragma once

#include <tokamax/tokamax.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace moe {

using namespace tokamax;

struct Dims {
  int tokens = 64, d_model = 256, d_ff = 512, experts = 8, top_k = 2;
};

// Weights are packed once into the native kernel's layout, as an inference server would at load
// time (an unpacked rhs is packed on every call). The reference check uses the plain tensors.
struct Weights {
  Tensor norm_scale;              // [D]
  Tensor router, gate, up, down;  // [1,D,E], [E,D,F], [E,D,F], [E,F,D]
  Tensor shared, shared_down;     // [D,2,F], [1,F,D]
  PackedRhs router_p, gate_p, up_p, down_p, shared_down_p;
  PackedGluWeights shared_p;
  Weights(const Dims& d, DType dtype, uint64_t seed = 10)
      : norm_scale(Tensor::uniform({d.d_model}, DType::kF32, seed + 4)),
        router(Tensor::randn({1, d.d_model, d.experts}, DType::kF32, seed)),
        gate(Tensor::randn({d.experts, d.d_model, d.d_ff}, dtype, seed + 1)),
        up(Tensor::randn({d.experts, d.d_model, d.d_ff}, dtype, seed + 2)),
        down(Tensor::randn({d.experts, d.d_ff, d.d_model}, dtype, seed + 3)),
        shared(Tensor::randn({d.d_model, 2, d.d_ff}, dtype, seed + 5)),
        shared_down(Tensor::randn({1, d.d_ff, d.d_model}, dtype, seed + 6)),
        router_p(pack_rhs(router)),
        gate_p(pack_rhs(gate)),
        up_p(pack_rhs(up)),
        down_p(pack_rhs(down)),
        shared_down_p(pack_rhs(shared_down)),
        shared_p(pack_glu_weights(shared)) {}
};

// The packed weights for tokamax's choice of implementation, the plain ones when one is pinned
// (only native reads the packed layout).
inline Tensor matmul(const TensorView& x, const Tensor& w, const PackedRhs& p,
                     const std::vector<int32_t>& sizes, const RaggedDotOptions& o) {
  return o.implementation.empty() ? ragged_dot(x, p, sizes, o) : ragged_dot(x, w, sizes, o);
}

// One forward pass of the block on x [T, D] (f32). `impl` pins every op's implementation
// ("" = tokamax's choice; "reference" for a check).
inline Tensor moe_block(const Tensor& x, const Weights& w, const Dims& d, const std::string& impl) {
  const int T = static_cast<int>(x.shape()[0]), D = d.d_model, E = d.experts, K = d.top_k;
  LayerNormOptions norm;
  norm.implementation = impl;
  const Tensor h = rms_norm(x, w.norm_scale.view(), norm);
  RaggedDotOptions o;
  o.implementation = impl;
  const std::vector<int32_t> all_rows = {T};
  const Tensor logits = matmul(h, w.router, w.router_p, all_rows, o);  // [T,E]

  // Top-k experts per token, softmax over the chosen logits.
  std::vector<int> expert(T * K);
  std::vector<float> weight(T * K);
  for (int t = 0; t < T; ++t) {
    const float* l = logits.data_as<float>() + int64_t(t) * E;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return l[a] > l[b]; });
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += std::exp(l[order[k]] - l[order[0]]);
    for (int k = 0; k < K; ++k) {
      expert[t * K + k] = order[k];
      weight[t * K + k] = std::exp(l[order[k]] - l[order[0]]) / sum;
    }
  }
  // Sort the (token, slot) pairs by expert: each expert's rows become one contiguous group.
  std::vector<int> slot(T * K);
  std::iota(slot.begin(), slot.end(), 0);
  std::stable_sort(slot.begin(), slot.end(), [&](int a, int b) { return expert[a] < expert[b]; });
  std::vector<int32_t> group_sizes(E, 0);
  Tensor xs({int64_t(T) * K, D}, DType::kF32);
  for (int i = 0; i < T * K; ++i) {
    ++group_sizes[expert[slot[i]]];
    std::copy_n(h.data_as<float>() + int64_t(slot[i] / K) * D, D,
                xs.data_as<float>() + int64_t(i) * D);
  }

  RaggedDotOptions silu = o;
  silu.activation = Activation::kSilu;
  Tensor gate = matmul(xs, w.gate, w.gate_p, group_sizes, silu);  // [T*K, F]
  const Tensor up = matmul(xs, w.up, w.up_p, group_sizes, o);
  for (int64_t i = 0; i < gate.size(); ++i) gate.data_as<float>()[i] *= up.data_as<float>()[i];
  const Tensor y = matmul(gate, w.down, w.down_p, group_sizes, o);  // [T*K, D]

  // The shared expert, every token: SwiGLU in one fused call, then its down projection.
  GluOptions glu;
  glu.activation = Activation::kSilu;
  glu.implementation = impl;
  const Tensor s = impl.empty() ? gated_linear_unit(h, w.shared_p, glu)
                                : gated_linear_unit(h, w.shared, glu);           // [T, F]
  const Tensor shared = matmul(s, w.shared_down, w.shared_down_p, all_rows, o);  // [T, D]

  Tensor out({T, D}, DType::kF32);
  for (int64_t i = 0; i < out.size(); ++i)
    out.data_as<float>()[i] = x.data_as<float>()[i] + shared.data_as<float>()[i];
  for (int i = 0; i < T * K; ++i) {
    float* dst = out.data_as<float>() + int64_t(slot[i] / K) * D;
    const float* src = y.data_as<float>() + int64_t(i) * D;
    for (int c = 0; c < D; ++c) dst[c] += weight[slot[i]] * src[c];
  }
  return out;
}

// The --tuned option of both examples: an AutotuningResult file applied for the program's
// lifetime (an AutotuningScope), and a line saying so; a line when TOKAMAX_TRACE records.
struct TunedScope {
  std::optional<AutotuningResult> result;
  std::optional<AutotuningScope> scope;
  explicit TunedScope(const std::string& path) {
    if (!path.empty()) {
      result = AutotuningResult::load(path);
      scope.emplace(*result);
      std::printf("applying %zu tuned keys from %s (device kind %s)\n", result->data().size(),
                  path.c_str(), result->device_kind().c_str());
    }
    if (!env_trace_path().empty()) std::printf("tracing to %s\n", env_trace_path().c_str());
  }
};

// sqrt(sum (a - b)^2 / sum b^2).
inline double normwise_error(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.size(); ++i) {
    num += std::pow(a.get(i) - b.get(i), 2);
    den += std::pow(b.get(i), 2);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace moe
