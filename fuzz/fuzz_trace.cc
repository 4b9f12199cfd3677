// A trace file's text (TOKAMAX_TRACE, TraceSession, or another tool's Chrome trace): extraction
// of bound arguments (lenient on text that is not JSON) and `tokamax trace summary`'s grouping,
// streamed and from a parsed document (which must agree).
#include <optional>

#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  const std::string_view t = fuzz::text(data, size);
  fuzz::expect_ok_or_invalid([&] { (void)extract_bound_args(t, "fuzz"); });
  // The streamed summary (one event at a time) must agree with the one of the parsed document,
  // whenever either succeeds.
  std::optional<TraceSummary> from_doc, streamed;
  fuzz::expect_ok_or_invalid([&] { from_doc = summarize_trace(parse_json(t, "fuzz"), "fuzz"); });
  std::string streamed_error;
  try {
    streamed = summarize_trace_text(t, "fuzz");
  } catch (const InvalidArgument& e) {
    streamed_error = e.what();
  }
  // The one text a parsed document reads and the stream refuses: a repeated "traceEvents" (the
  // document keeps the last one).
  if (from_doc && !streamed && streamed_error.find("second \"traceEvents\"") == std::string::npos)
    __builtin_trap();
  if (!from_doc && streamed) __builtin_trap();
  if (from_doc && streamed) {
    if (from_doc->warnings != streamed->warnings ||
        from_doc->device_kind != streamed->device_kind ||
        from_doc->groups.size() != streamed->groups.size())
      __builtin_trap();
    for (size_t i = 0; i < from_doc->groups.size(); ++i) {
      const TraceCallGroup &a = from_doc->groups[i], &b = streamed->groups[i];
      if (a.op != b.op || a.key != b.key || a.config != b.config || a.rung != b.rung ||
          a.calls != b.calls || a.total_us != b.total_us || a.nested_calls != b.nested_calls)
        __builtin_trap();
    }
  }
  return 0;
}
