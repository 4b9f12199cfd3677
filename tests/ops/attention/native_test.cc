// dot_product_attention's native implementation: the shared cases (test_base.h).
#include "tests/ops/attention/test_base.h"

namespace tokamax::attention_test {

struct Native {
  static constexpr const char* kName = "native";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Native, AttentionImpl, Native);

}  // namespace tokamax::attention_test
