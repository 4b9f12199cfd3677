// A trace file's text (TOKAMAX_TRACE, TraceSession, or another tool's Chrome trace): extraction
// of bound arguments (lenient on text that is not JSON) and `tokamax trace summary`'s grouping.
#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  const std::string_view t = fuzz::text(data, size);
  fuzz::expect_ok_or_invalid([&] { (void)extract_bound_args(t, "fuzz"); });
  fuzz::expect_ok_or_invalid([&] { (void)summarize_trace(parse_json(t, "fuzz"), "fuzz"); });
  return 0;
}
