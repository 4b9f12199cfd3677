// Config JSON (the keys of every cache and result entry), decoded by every implementation of
// every family: accepted configs are within the implementation's bounds and round-trip.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    const Json j = parse_json(fuzz::text(data, size), "config");
    for (const auto& f : families()) {
      for (const auto& impl : f->implementations()) {
        fuzz::expect_ok_or_invalid([&] {
          const Config c = impl->config_from_json(j);
          if (impl->config_from_json(c.json()).str() != c.str()) __builtin_trap();
        });
      }
    }
  });
  return 0;
}
