// A disk-cache file, read as `tokamax cache verify` and the lazy lookup read it: the file, its
// versions, each key bound by its family, each entry's configs decoded by the implementation.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  fuzz::expect_ok_or_invalid([&] {
    const CacheFile f = CacheFile::from_json(parse_json(fuzz::text(data, size), "fuzz"), "fuzz");
    const auto impl = find_family(f.family).implementation(f.implementation);
    try {
      f.check_versions(*impl);
    } catch (const InvalidArgument&) {
      // Read on anyway: the entries of a stale file still pass through the same readers.
    }
    for (const auto& entry : f.entries) {
      const std::string& key = entry.first;  // named: clang 14 cannot capture bindings
      const Json& configs = entry.second;
      fuzz::expect_ok_or_invalid(
          [&] { find_family(f.family).bind_json(parse_json(key, "key"), f.implementation); });
      fuzz::expect_ok_or_invalid([&] {
        const AutotuningData d = AutotuningData::from_json(configs, *impl);
        if (d.has_success()) d.fastest();
      });
    }
    (void)f.to_json().dump();
  });
  return 0;
}
