// gated_linear_unit's native implementation: the shared cases (test_base.h).
#include "tests/ops/glu/test_base.h"

namespace tokamax::glu_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, GluImpl, Native);

}  // namespace tokamax::glu_test
