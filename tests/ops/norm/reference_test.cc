// layer_norm's reference implementation: the shared cases (test_base.h).
#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {

struct Reference {
  static constexpr const char* kName = "reference";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Reference, LayerNormImpl, Reference);

}  // namespace tokamax::norm_test
