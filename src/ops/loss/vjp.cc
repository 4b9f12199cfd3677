// linear_softmax_cross_entropy_loss_vjp: the backward as an op of its own: its arguments (the
// forward's, its log-sum-exp and the cotangent dloss), bind, the reference and the public
// function. With p = softmax(x w) per row (exp(logits - lse)) and g_b = d loss / d loss_b:
//   d logits = (p - onehot(label)) g_b,   dx = d logits w^T,   dw = x^T d logits.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/loss/base.h"

namespace tokamax {
namespace loss {

VjpFamily::VjpFamily()
    : BackwardFamily(kVjpFamily, family(),
                     {{"lse", &LossVjpCall::lse_in, "the forward's residual, f32 [B]"}},
                     {"dloss", &LossVjpCall::dloss, "the cotangent of loss, its shape, f32"},
                     std::make_shared<VjpReference>(), {make_vjp_native(), make_vjp_composed()}) {}

const VjpFamily& vjp_family() { return family_instance<VjpFamily>(); }

std::vector<ShapeDtype> VjpFamily::output_specs(const LossVjpCall& c) const {
  return {c.x.spec(), {c.w.shape(), DType::kF32}};
}

std::vector<OutputDoc> VjpFamily::output_docs() const {
  return {{"dx", "x's shape and dtype", "x.shape", "x.dtype"},
          {"dw", "w's shape, f32", "w.shape", "float32"}};
}

Tolerance VjpFamily::tolerance_of(const LossVjpCall& c) const {
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>({c.b, c.v, c.h, 1})));
  if (c.x.dtype() == DType::kBF16 || c.w.dtype() == DType::kBF16) return {1e-2 * depth, 2e-2, 0};
  return {1e-5 * depth, 1e-4, 0};
}

CallCost VjpFamily::cost_of(const LossVjpCall& c) const {
  return {3 * call_flops(c), 0.0, false};  // the logits again, dx and dw
}

// --- reference: per row in f64; dw summed over rows in row order ---

void VjpReference::run_call(LossVjpCall& c, const Prepared*) const {
  std::vector<double> dw(static_cast<size_t>(c.h * c.v), 0.0);
  std::vector<double> d(static_cast<size_t>(c.v));
  for (int64_t r = 0; r < c.b; ++r) {
    for (int64_t j = 0; j < c.v; ++j) {
      double l = 0;
      for (int64_t k = 0; k < c.h; ++k)
        l += double{x_value(c, r * c.h + k)} * load_f32(c.w, k * c.v + j);
      d[j] = std::exp(l - c.lse_in.data_as<const float>()[r]) * c.row_weight(r);
    }
    d[c.label(r)] -= c.row_weight(r);
    for (int64_t k = 0; k < c.h; ++k) {
      double s = 0;
      const double xv = x_value(c, r * c.h + k);
      for (int64_t j = 0; j < c.v; ++j) {
        s += d[j] * load_f32(c.w, k * c.v + j);
        dw[k * c.v + j] += xv * d[j];
      }
      if (c.dx().dtype() == DType::kF32)
        c.dx().data_as<float>()[r * c.h + k] = static_cast<float>(s);
      else
        c.dx().data_as<uint16_t>()[r * c.h + k] = f32_to_bf16(static_cast<float>(s));
    }
  }
  for (size_t i = 0; i < dw.size(); ++i) c.dw().data_as<float>()[i] = static_cast<float>(dw[i]);
}

}  // namespace loss

LossGrads linear_softmax_cross_entropy_loss_vjp(const TensorView& x, const TensorView& labels,
                                                const TensorView& w, const TensorView& lse,
                                                const TensorView& dloss, const LossOptions& o) {
  loss::LossVjpCall c;
  c.x = x;
  c.labels = labels;
  c.w = w;
  c.lse_in = lse;
  c.dloss = dloss;
  c.reduction = o.reduction;
  c.num_threads = 0;
  std::vector<Tensor> g = loss::vjp_family().run(c, CallOptions{o.implementation, o.config});
  return {std::move(g.at(0)), std::move(g.at(1))};
}

}  // namespace tokamax
