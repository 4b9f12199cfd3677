// dot_product_attention's composed implementation: the shared cases (test_base.h).
#include "tests/ops/attention/test_base.h"

namespace tokamax::attention_test {

struct Composed {
  static constexpr const char* kName = "composed";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Composed, AttentionImpl, Composed);

}  // namespace tokamax::attention_test
