// The composed add_rms_norm: what a user writes without the fused op, the residual add as one
// elementwise pass, then the library's rms_norm reading the sum back.
#include <cstring>

#include "core/thread_pool.h"
#include "ops/add_norm/base.h"
#include "ops/elements.h"
#include "tokamax/ops/norm.h"

namespace tokamax::add_norm {
namespace {

class Composed : public TypedImplementation<AddNormCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(AddNormCall& c, const Prepared*) const override {
    parallel_for(c.rows, c.num_threads, [&](int64_t r, int) {
      for (int64_t i = r * c.d; i < (r + 1) * c.d; ++i)
        store_f32(c.sum(), i, load_f32(c.x, i) + load_f32(c.residual, i));
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
