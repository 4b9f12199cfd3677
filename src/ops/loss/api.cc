// Public linear_softmax_cross_entropy_loss functions: fill a call, bind, allocate, dispatch.
#include "ops/loss/base.h"

namespace tokamax {

namespace {

std::vector<Tensor> run(const TensorView& x, const TensorView& labels, const TensorView& w,
                        const LossOptions& o, bool residuals) {
  loss::LossCall c;
  c.x = x;
  c.labels = labels;
  c.w = w;
  c.reduction = o.reduction;
  c.return_residuals = residuals;
  c.num_threads = 0;
  return loss::family().run(c, CallOptions{o.implementation, o.config});
}

}  // namespace

Tensor linear_softmax_cross_entropy_loss(const TensorView& x, const TensorView& labels,
                                         const TensorView& w, const LossOptions& o) {
  return std::move(run(x, labels, w, o, false).at(0));
}

LossResult linear_softmax_cross_entropy_loss_with_residuals(const TensorView& x,
                                                            const TensorView& labels,
                                                            const TensorView& w,
                                                            const LossOptions& o) {
  std::vector<Tensor> out = run(x, labels, w, o, true);
  return {std::move(out.at(0)), std::move(out.at(1))};
}

}  // namespace tokamax
