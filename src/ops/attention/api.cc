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
  attn::set_options(c, o);
  c.return_residuals = residuals;
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
