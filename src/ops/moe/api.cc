// Public moe_experts functions: the call from the options, bind, allocate, dispatch.
#include "ops/moe/base.h"

namespace tokamax {

namespace {

moe::MoeCall make(const TensorView& hidden, const TensorView& top_k_index,
                  const TensorView& top_k_weights, const MoeExpertsOptions& o) {
  moe::MoeCall c;
  c.hidden = hidden;
  c.top_k_index = top_k_index;
  c.top_k_weights = top_k_weights;
  c.activation = o.activation;
  c.transposed_weights = o.transposed_weights;
  c.num_threads = 0;
  return c;
}

Tensor run(moe::MoeCall& c, const MoeExpertsOptions& o) {
  return std::move(moe::family().run(c, CallOptions{o.implementation, o.config}).at(0));
}

TensorView logical(const PackedRhs& p) {
  const ShapeDtype s = p.logical();
  return TensorView(nullptr, s.dtype, s.shape);
}

}  // namespace

Tensor moe_experts(const TensorView& hidden, const TensorView& top_k_index,
                   const TensorView& top_k_weights, const TensorView& w_gate_up,
                   const TensorView& w_down, const MoeExpertsOptions& o) {
  moe::MoeCall c = make(hidden, top_k_index, top_k_weights, o);
  c.w_gate_up = w_gate_up;
  c.w_down = w_down;
  return run(c, o);
}

Tensor moe_experts(const TensorView& hidden, const TensorView& top_k_index,
                   const TensorView& top_k_weights, const PackedMoeWeights& w,
                   const MoeExpertsOptions& o) {
  if (w.empty()) throw InvalidArgument("moe_experts: the PackedMoeWeights are empty");
  if (w.gate_up.dim_nums() != w.down.dim_nums()) {
    throw InvalidArgument(
        "moe_experts: the packed gate-up and down weights have different "
        "layouts; expected both from one pack_moe_weights call");
  }
  moe::MoeCall c = make(hidden, top_k_index, top_k_weights, o);
  c.transposed_weights = w.gate_up.dim_nums() == RaggedDimNums::kTransposedRhs;
  c.w_gate_up = logical(w.gate_up);
  c.w_down = logical(w.down);
  c.packed = w;
  c.packed_weights = true;
  return run(c, o);
}

}  // namespace tokamax
