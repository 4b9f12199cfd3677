// layer_norm's native implementation: the shared cases (test_base.h).
#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, LayerNormImpl, Native);

}  // namespace tokamax::norm_test
