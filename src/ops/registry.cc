// Every op family the library ships, registered on first use of the registry or of dispatch
// (op/builtins.h says why explicitly). A new family adds one line here.
#include "op/builtins.h"
#include "ops/add_norm/base.h"
#include "ops/attention/base.h"
#include "ops/glu/base.h"
#include "ops/loss/base.h"
#include "ops/moe/base.h"
#include "ops/norm/base.h"
#include "ops/quantized/base.h"
#include "ops/ragged_dot/base.h"
#include "tokamax/op/op.h"

namespace tokamax {

namespace {
// Families are process-lifetime singletons: the registry holds them without owning them.
template <class F>
std::shared_ptr<const OpFamily> unowned(const F& family) {
  return std::shared_ptr<const OpFamily>(&family, [](const OpFamily*) {});
}
}  // namespace

void register_builtin_families() {
  install_autotuning_backend();
  install_remote_rung();
  register_family(unowned(rdot::family()));
  register_family(unowned(attn::family()));
  register_family(unowned(attn::vjp_family()));
  register_family(unowned(norm::family()));
  register_family(unowned(norm::vjp_family()));
  register_family(unowned(glu::family()));
  register_family(unowned(glu::vjp_family()));
  register_family(unowned(loss::family()));
  register_family(unowned(loss::vjp_family()));
  register_family(unowned(add_norm::family()));
  register_family(unowned(quant::family()));
  register_family(unowned(moe::family()));
}

}  // namespace tokamax
