// The public add_rms_norm: fill a call, run it.
#include "ops/add_norm/base.h"

namespace tokamax {

AddRmsNormResult add_rms_norm(const TensorView& x, const TensorView& residual,
                              const std::optional<TensorView>& scale, const AddRmsNormOptions& o) {
  add_norm::AddNormCall c;
  c.x = x;
  c.residual = residual;
  c.scale = scale;
  c.epsilon = o.epsilon;
  c.num_threads = 0;
  std::vector<Tensor> out = add_norm::family().run(c, CallOptions{o.implementation, o.config});
  return {std::move(out.at(0)), std::move(out.at(1))};
}

}  // namespace tokamax
