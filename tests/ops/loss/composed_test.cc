// linear_softmax_cross_entropy_loss's composed implementation: the shared cases (test_base.h).
#include "tests/ops/loss/test_base.h"

namespace tokamax::loss_test {

struct Composed {
  static constexpr const char* kName = "composed";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Composed, LossImpl, Composed);

}  // namespace tokamax::loss_test
