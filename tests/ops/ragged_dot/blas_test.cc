// ragged_dot's blas implementation: the shared cases (test_base.h).
#include "tests/ops/ragged_dot/test_base.h"

namespace tokamax::ragged_dot_test {

struct Blas {
  static constexpr const char* kName = "blas";
};
INSTANTIATE_TYPED_TEST_SUITE_P(Blas, RaggedDotImpl, Blas);

}  // namespace tokamax::ragged_dot_test
