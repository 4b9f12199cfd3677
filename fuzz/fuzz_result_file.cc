// An AutotuningResult file (`tokamax autotune -o`, `cache merge`, AutotuningResult::load): read,
// written back, read again to the same text, and applied as a scope.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    const AutotuningResult r = AutotuningResult::loads(fuzz::text(data, size), "fuzz");
    const std::string once = r.dumps();
    if (AutotuningResult::loads(once, "dump").dumps() != once) __builtin_trap();
    const AutotuningScope scope(r);
    (void)(r | r);
  });
  return 0;
}
