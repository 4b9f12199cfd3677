// ragged_dot's reference implementation: the shared cases (test_base.h) (there the reference
// is checked against doubles only).
#include "tests/ops/ragged_dot/test_base.h"

namespace tokamax::ragged_dot_test {

struct Reference {
  static constexpr const char* kName = "reference";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Reference, RaggedDotImpl, Reference);

}  // namespace tokamax::ragged_dot_test
