// ShapeDtype strings ("bf16[8,128]"), as argument specs in bound-args, cache and result files
// carry them: a parsed string prints back to a string that parses to the same value.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    const ShapeDtype s = ShapeDtype::parse(fuzz::text(data, size));
    const ShapeDtype back = ShapeDtype::parse(s.str());
    if (back.str() != s.str() || back.dtype != s.dtype || back.shape != s.shape) __builtin_trap();
  });
  return 0;
}
