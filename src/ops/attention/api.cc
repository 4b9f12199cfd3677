// Public dot_product_attention functions: fill a call, bind, allocate, dispatch.
#include "ops/attention/base.h"

namespace tokamax {

namespace {

std::vector<Tensor> run(const TensorView& q, const TensorView& k, const TensorView& v,
                        const AttentionOptions& o, bool residuals) {
  attn::AttentionCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.bias = o.bias;
  c.mask = o.mask;
  c.q_seq_lengths = o.q_seq_lengths;
  c.kv_seq_lengths = o.kv_seq_lengths;
  c.scale = o.scale;
  c.is_causal = o.is_causal;
  if (o.local_window_size) {
    c.window_left = o.local_window_size->first;
    c.window_right = o.local_window_size->second;
    if (c.window_left < 0 || c.window_right < 0) {
      throw InvalidArgument("dot_product_attention: local_window_size (" +
                            std::to_string(c.window_left) + ", " + std::to_string(c.window_right) +
                            "); expected both >= 0");
    }
  }
  c.logits_soft_cap = o.logits_soft_cap;
  c.return_residuals = residuals;
  c.num_threads = 0;
  return attn::family().run(c, CallOptions{o.implementation, o.config});
}

}  // namespace

Tensor dot_product_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& o) {
  return std::move(run(q, k, v, o, false).at(0));
}

AttentionResult dot_product_attention_with_residuals(const TensorView& q, const TensorView& k,
                                                     const TensorView& v,
                                                     const AttentionOptions& o) {
  std::vector<Tensor> out = run(q, k, v, o, true);
  return {std::move(out.at(0)), std::move(out.at(1))};
}

}  // namespace tokamax
