// gated_linear_unit's reference implementation: the shared cases (test_base.h).
#include "tests/ops/glu/test_base.h"

namespace tokamax::glu_test {

struct Reference {
  static constexpr const char* kName = "reference";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Reference, GluImpl, Reference);

}  // namespace tokamax::glu_test
