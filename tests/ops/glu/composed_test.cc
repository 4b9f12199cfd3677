// gated_linear_unit's composed implementation: the shared cases (test_base.h).
#include "tests/ops/glu/test_base.h"

namespace tokamax::glu_test {

struct Composed {
  static constexpr const char* kName = "composed";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Composed, GluImpl, Composed);

}  // namespace tokamax::glu_test
