// linear_softmax_cross_entropy_loss's native implementation: the shared cases (test_base.h).
#include "tests/ops/loss/test_base.h"

namespace tokamax::loss_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, LossImpl, Native);

}  // namespace tokamax::loss_test
