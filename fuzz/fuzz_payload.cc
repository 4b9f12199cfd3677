// The `tokamax:{...}` payload scanner, on any string (event names, args, log lines): spans lie
// within the string, in order, and each complete one is a balanced object.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  const std::string_view s = fuzz::text(data, size);
  size_t last = 0;
  for (const PayloadSpan& p : find_payloads(s)) {
    if (p.marker < last || p.begin > s.size() ||
        s.substr(p.marker, kPayloadMarker.size()) != kPayloadMarker)
      __builtin_trap();
    last = p.marker;
    if (!p.error.empty()) continue;
    if (p.end <= p.begin || p.end > s.size() || s[p.begin] != '{' || s[p.end - 1] != '}')
      __builtin_trap();
    fuzz::expect_ok_or_invalid(
        [&] { (void)parse_json(s.substr(p.begin, p.end - p.begin), "payload"); });
  }
  return 0;
}
