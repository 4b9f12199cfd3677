// dot_product_attention's reference implementation: the shared cases (test_base.h).
#include "tests/ops/attention/test_base.h"

namespace tokamax::attention_test {

struct Reference {
  static constexpr const char* kName = "reference";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Reference, AttentionImpl, Reference);

}  // namespace tokamax::attention_test
