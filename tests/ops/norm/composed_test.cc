// layer_norm's composed implementation: the shared cases (test_base.h).
#include "tests/ops/norm/test_base.h"

namespace tokamax::norm_test {

struct Composed {
  static constexpr const char* kName = "composed";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Composed, LayerNormImpl, Composed);

}  // namespace tokamax::norm_test
