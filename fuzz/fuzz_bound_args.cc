// A bound-args file (`tokamax trace extract` output; autotune and bench --bound-args), read the
// lenient way the commands read it (unusable entries skipped) and the strict way.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    std::vector<std::string> skipped;
    const auto list = BoundArguments::loads_list(fuzz::text(data, size), "fuzz", &skipped);
    for (const BoundArguments& b : list) {
      // The written form reads back to the same key.
      const BoundArguments back = BoundArguments::from_json(b.to_json());
      if (back.key() != b.key()) __builtin_trap();
    }
    (void)BoundArguments::dumps_list(list);
  });
  fuzz::expect_ok_or_invalid(
      [&] { (void)BoundArguments::loads_list(fuzz::text(data, size), "fuzz", nullptr); });
  return 0;
}
