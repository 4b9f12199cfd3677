// linear_softmax_cross_entropy_loss's reference implementation: the shared cases (test_base.h).
#include "tests/ops/loss/test_base.h"

namespace tokamax::loss_test {

struct Reference {
  static constexpr const char* kName = "reference";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Reference, LossImpl, Reference);

}  // namespace tokamax::loss_test
