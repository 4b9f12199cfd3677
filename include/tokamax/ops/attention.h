// dot_product_attention: softmax(scale * q k^T + bias, masked) v, in jax.nn.dot_product_attention's
// layout: q [B,T,N,H], k [B,S,Nk,H], v [B,S,Nk,Hv] -> out [B,T,N,Hv]. N is a multiple of Nk (GQA;
// MQA when Nk = 1): query head n reads kv head n / (N / Nk). Logits are computed and the softmax
// is taken in f32 (bf16 inputs: exact bf16 products, f32 sums); the output has q's dtype.
//
// A logit (b, n, t, s) takes part when every mask allows it:
//   is_causal:           s <= t (top-left aligned, as jax's tril(ones(T, S)));
//   mask:                mask[b, n, t, s] is true (bool, broadcastable to [B,N,T,S]);
//   q/kv_seq_lengths:    t < q_seq_lengths[b] and s < kv_seq_lengths[b] (padding);
//   local_window_size:   t - left <= s <= t + right.
// The logit is scale * q.k (scale default 1/sqrt(H)), plus bias[b, n, t, s] (broadcastable to
// [B,N,T,S]), then soft-capped: cap * tanh(logit / cap) when logits_soft_cap is set. A query row
// with no logit left gives 0 (not NaN) and log-sum-exp -inf.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct AttentionOptions {
  std::optional<double> scale;  // default 1/sqrt(H)
  bool is_causal = false;
  std::optional<TensorView> bias;            // f32 or bf16, broadcastable to [B,N,T,S]
  std::optional<TensorView> mask;            // bool, broadcastable to [B,N,T,S]
  std::optional<TensorView> q_seq_lengths;   // i32 [B], each in [0, T]
  std::optional<TensorView> kv_seq_lengths;  // i32 [B], each in [0, S]
  // (left, right): s in [t - left, t + right]; each >= 0.
  std::optional<std::pair<int64_t, int64_t>> local_window_size;
  std::optional<double> logits_soft_cap;  // > 0
  std::string implementation;             // "", "native", "composed", "reference"
  std::optional<Config> config;           // needs `implementation`
};

Tensor dot_product_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options = {});

struct AttentionResult {
  Tensor out;  // [B,T,N,Hv], q's dtype
  Tensor lse;  // [B,N,T] f32: log-sum-exp of each row's logits (-inf for a fully masked row)
};
// The forward with its residuals (return_residuals): what the backward pass needs.
AttentionResult dot_product_attention_with_residuals(const TensorView& q, const TensorView& k,
                                                     const TensorView& v,
                                                     const AttentionOptions& options = {});

struct AttentionGrads {
  Tensor dq, dk, dv;  // q's, k's and v's shapes and dtypes (dk, dv summed over a group's heads)
  Tensor dbias;       // the bias's shape, f32; empty without a bias
};
// Gradients of dot_product_attention(q, k, v, options) for the cotangent dout [B,T,N,Hv], from
// the forward's output and log-sum-exp (dot_product_attention_with_residuals). An op of its own
// ("dot_product_attention_vjp"): its own implementations, configs and cache entries.
AttentionGrads dot_product_attention_vjp(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const AttentionOptions& options = {});

// The native implementation's config.
struct AttentionNativeConfig {
  int block_q = 64;    // query rows per work item (a multiple of the tile height)
  int block_kv = 256;  // kv positions per block (a multiple of the panel width)
  Json to_json() const;
  static AttentionNativeConfig from_json(const Json& j);
  friend bool operator==(const AttentionNativeConfig&, const AttentionNativeConfig&) = default;
};

// The native backward's config.
struct AttentionVjpNativeConfig {
  int block_q = 64;    // query rows per work item
  int block_kv = 128;  // kv positions per block (a multiple of the panel width)
  Json to_json() const;
  static AttentionVjpNativeConfig from_json(const Json& j);
  friend bool operator==(const AttentionVjpNativeConfig&,
                         const AttentionVjpNativeConfig&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
