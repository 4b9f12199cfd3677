// The composed add_rms_norm: the unfused pair a user writes without the fused op, the residual
// add as one elementwise pass (the same vector kernel the native one uses, threads over rows),
// then the library's rms_norm reading the sum back.
#include <cstring>

#include "core/thread_pool.h"
#include "kernels/microkernels.h"
#include "kernels/norm.h"
#include "ops/add_norm/base.h"
#include "tokamax/ops/norm.h"

namespace tokamax::add_norm {
namespace {

class Composed : public TypedImplementation<AddNormCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(AddNormCall& c, const Prepared*) const override {
    static const kernels::NormKernels k = kernels::norm_kernels(kernels::best_kernels().isa);
    const int64_t row = c.d * static_cast<int64_t>(dtype_size(c.x.dtype()));
    const auto* x = static_cast<const char*>(c.x.data());
    const auto* res = static_cast<const char*>(c.residual.data());
    auto* sum = static_cast<char*>(c.sum().data());
    parallel_for(c.rows, c.num_threads, [&](int64_t r, int) {
      k.add(x + r * row, res + r * row, c.bf16, c.d, sum + r * row);
    });
    LayerNormOptions o;
    o.epsilon = c.epsilon;
    const Tensor y = rms_norm(c.sum(), c.scale, o);
    std::memcpy(c.y().data(), y.data(), y.nbytes());
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }

}  // namespace tokamax::add_norm
