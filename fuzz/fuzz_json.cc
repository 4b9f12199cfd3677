// parse_json (every JSON file tokamax reads goes through it) and what is done with what it
// returns: canonical dumps (keys) and destruction, which recurse per nesting level.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    const Json j = parse_json(fuzz::text(data, size), "fuzz input");
    const std::string once = canonical_dump(j);
    if (canonical_dump(parse_json(once, "canonical dump")) != once) __builtin_trap();
  });
  return 0;
}
