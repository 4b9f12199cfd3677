// layer_norm_vjp: the backward as an op of its own: its arguments (the forward's, its residuals
// mean and rstd, the cotangent dy), bind, the reference and the public function. With
// xhat = (x - mean) rstd and g = dy * scale, per row of D:
//   dx = rstd (g - mean(g) - xhat mean(g xhat))   (rms_norm: without the mean(g) term),
//   dscale = sum over rows of dy xhat,   doffset = sum over rows of dy.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/norm/base.h"

namespace tokamax {
namespace norm {

VjpFamily::VjpFamily()
    : BackwardFamily(kVjpFamily, family(),
                     {{"mean", &NormVjpCall::mean_in, "the forward's mean residual"},
                      {"rstd", &NormVjpCall::rstd_in, "the forward's rstd residual"}},
                     {"dy", &NormVjpCall::dy, "the cotangent of y, x's shape and dtype"},
                     std::make_shared<VjpReference>(), {make_vjp_native(), make_vjp_composed()}) {}

const VjpFamily& vjp_family() { return family_instance<VjpFamily>(); }

std::vector<ShapeDtype> VjpFamily::output_specs(const NormVjpCall& c) const {
  std::vector<ShapeDtype> out = {c.x.spec()};
  if (c.scale) out.push_back({{c.d}, DType::kF32});
  if (c.offset) out.push_back({{c.d}, DType::kF32});
  return out;
}

std::vector<OutputDoc> VjpFamily::output_docs() const {
  return {{"dx", "x's shape and dtype", "x.shape", "x.dtype"},
          {"dscale", "f32 [D], with a scale", "(x.shape[axis],)", "float32", "scale"},
          {"doffset", "f32 [D], with an offset", "(x.shape[axis],)", "float32", "offset"}};
}

Tolerance VjpFamily::tolerance_of(const NormVjpCall& c) const {
  // tokamax: dscale 10x and doffset 25x the forward's atol, scaled by the square root of the
  // reduced size (D for dx, the rows for dscale and doffset). dx gets the same 25x: its
  // 1 - xhat^2 cancels in f32 when a row is short (D = 1, 2), times rstd.
  const double depth = std::sqrt(
      static_cast<double>(std::max<int64_t>(std::max(c.d, c.scale || c.offset ? c.rows() : 1), 1)));
  const double grads = 25.0;
  if (c.bf16) return {grads * 2e-3 * depth, 2e-2, 0};
  return {grads * 5e-7 * depth, 1e-5, 0};
}

CallCost VjpFamily::cost_of(const NormVjpCall& c) const {
  // x and dy read, dx written.
  return {12.0 * static_cast<double>(c.x.size()),
          3.0 * static_cast<double>(c.x.size() * dtype_size(c.x.dtype())), false, true};
}

// --- reference: per row in f64; dscale and doffset summed over rows in row order ---

void VjpReference::run_call(NormVjpCall& c, const Prepared*) const {
  std::vector<double> dscale(static_cast<size_t>(c.d), 0.0), doffset(static_cast<size_t>(c.d), 0.0);
  for (int64_t r = 0; r < c.rows(); ++r) {
    const double mean = c.mean_in.data_as<const float>()[r];
    const double rstd = c.rstd_in.data_as<const float>()[r];
    double sg = 0, sgx = 0;
    for (int64_t j = 0; j < c.d; ++j) {
      const int64_t i = c.index(r, j);
      const double xh = (load_f32(c.x, i) - mean) * rstd, dy = load_f32(c.dy, i);
      const double g = c.scale ? dy * load_f32(*c.scale, j) : dy;
      sg += g;
      sgx += g * xh;
      dscale[j] += dy * xh;
      doffset[j] += dy;
    }
    const double n = static_cast<double>(std::max<int64_t>(c.d, 1));
    const double a = c.subtract_mean ? sg / n : 0.0, b = sgx / n;
    for (int64_t j = 0; j < c.d; ++j) {
      const int64_t i = c.index(r, j);
      const double xh = (load_f32(c.x, i) - mean) * rstd, dy = load_f32(c.dy, i);
      const double g = c.scale ? dy * load_f32(*c.scale, j) : dy;
      store_f32(c.dx(), i, static_cast<float>(rstd * (g - a - xh * b)));
    }
  }
  for (int64_t j = 0; j < c.d; ++j) {
    if (c.dscale()) c.dscale()->data_as<float>()[j] = static_cast<float>(dscale[j]);
    if (c.doffset()) c.doffset()->data_as<float>()[j] = static_cast<float>(doffset[j]);
  }
}

}  // namespace norm

LayerNormGrads layer_norm_vjp(const TensorView& x, const std::optional<TensorView>& scale,
                              const std::optional<TensorView>& offset, const TensorView& mean,
                              const TensorView& rstd, const TensorView& dy,
                              const LayerNormOptions& o) {
  norm::NormVjpCall c;
  c.x = x;
  c.scale = scale;
  c.offset = offset;
  c.mean_in = mean;
  c.rstd_in = rstd;
  c.dy = dy;
  norm::set_options(c, o);
  std::vector<Tensor> g = norm::vjp_family().run(c, CallOptions{o.implementation, o.config});
  LayerNormGrads grads;
  grads.dx = std::move(g.at(0));
  size_t next = 1;
  if (scale) grads.dscale = std::move(g.at(next++));
  if (offset) grads.doffset = std::move(g.at(next++));
  return grads;
}

}  // namespace tokamax
