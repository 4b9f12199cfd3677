// Public gated_linear_unit functions: fill a call, bind, allocate, dispatch.
#include "ops/glu/base.h"

namespace tokamax {

namespace {

std::vector<Tensor> run(glu::GluCall& c, const GluOptions& o) {
  c.activation = o.activation;
  c.num_threads = 0;
  return glu::family().run(c, CallOptions{o.implementation, o.config});
}

}  // namespace

Tensor gated_linear_unit(const TensorView& x, const TensorView& w, const GluOptions& o) {
  glu::GluCall c;
  c.x = x;
  c.w = w;
  return std::move(run(c, o).at(0));
}

Tensor gated_linear_unit(const TensorView& x, const TensorView& w_gate, const TensorView& w_up,
                         const GluOptions& o) {
  glu::GluCall c;
  c.x = x;
  c.w = w_gate;
  c.w_up = w_up;
  return std::move(run(c, o).at(0));
}

Tensor gated_linear_unit(const TensorView& x, const PackedGluWeights& w, const GluOptions& o) {
  if (w.empty()) throw InvalidArgument("gated_linear_unit: the packed weights are empty");
  glu::GluCall c;
  c.x = x;
  c.w = TensorView(nullptr, w.dtype(), {w.k(), 2, w.n()});
  c.packed = w;
  c.packed_w = true;
  return std::move(run(c, o).at(0));
}

GluResult gated_linear_unit_with_residuals(const TensorView& x, const TensorView& w,
                                           const GluOptions& o) {
  glu::GluCall c;
  c.x = x;
  c.w = w;
  c.return_residuals = true;
  std::vector<Tensor> out = run(c, o);
  return {std::move(out.at(0)), std::move(out.at(1))};
}

}  // namespace tokamax
