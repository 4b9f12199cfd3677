// Uses the installed library: device kind and one ragged_dot against the reference.
#include <tokamax/tokamax.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace tokamax;
  Tensor x = Tensor::randn({6, 32}, DType::kF32, 0);
  Tensor w = Tensor::randn({2, 32, 16}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 2};
  Tensor y = ragged_dot(x, w, sizes);
  Tensor r = ragged_dot(x, w, sizes, {.implementation = "reference"});
  double err = 0;
  for (int64_t i = 0; i < y.size(); ++i) err = std::max(err, std::abs(y.get(i) - r.get(i)));
  std::printf("device kind %s, max error %g\n", device_kind().c_str(), err);
  if (err > 1e-3) return 1;
  std::printf("consumer ok\n");
  return 0;
}
