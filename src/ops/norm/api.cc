// Public layer_norm / rms_norm functions: fill a call, bind, allocate, dispatch.
#include "ops/norm/base.h"

namespace tokamax {

namespace {

std::vector<Tensor> run(const TensorView& x, const std::optional<TensorView>& scale,
                        const std::optional<TensorView>& offset, const LayerNormOptions& o,
                        bool residuals) {
  norm::NormCall c;
  c.x = x;
  c.scale = scale;
  c.offset = offset;
  norm::set_options(c, o);
  c.return_residuals = residuals;
  return norm::family().run(c, CallOptions{o.implementation, o.config});
}

}  // namespace

Tensor layer_norm(const TensorView& x, const std::optional<TensorView>& scale,
                  const std::optional<TensorView>& offset, const LayerNormOptions& o) {
  return std::move(run(x, scale, offset, o, false).at(0));
}

Tensor rms_norm(const TensorView& x, const std::optional<TensorView>& scale, LayerNormOptions o) {
  o.subtract_mean = false;
  return std::move(run(x, scale, std::nullopt, o, false).at(0));
}

LayerNormResult layer_norm_with_residuals(const TensorView& x,
                                          const std::optional<TensorView>& scale,
                                          const std::optional<TensorView>& offset,
                                          const LayerNormOptions& o) {
  std::vector<Tensor> out = run(x, scale, offset, o, true);
  return {std::move(out.at(0)), std::move(out.at(1)), std::move(out.at(2))};
}

}  // namespace tokamax
