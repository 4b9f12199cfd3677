// A trace's op calls grouped by (op/implementation, key, config, rung), with their count and
// time: which calls dominate a run and which rung of the resolution ladder configured them.
// What `tokamax trace summary` prints and `tokamax report` charts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/core/json.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct TraceCallGroup {
  std::string op;      // the event's name, "family/implementation"
  std::string key;     // canonical JSON of the call's bound arguments
  std::string config;  // canonical JSON of the config it ran with
  std::string rung;    // the ladder rung that chose the config ("?" if the payload has none)
  int64_t calls = 0;
  double total_us = 0;
  // Of those, the calls made inside another op's implementation ("outer/inner" payloads):
  // their time is also inside the outer call's.
  int64_t nested_calls = 0;
  double nested_us = 0;
};

struct TraceSummary {
  std::vector<TraceCallGroup> groups;  // sorted by (op, key, config, rung)
  // Events that carry a tokamax payload but were left out because a field the summary reads
  // has the wrong type or is missing (a numeric "name", a string "dur", a payload that does not
  // parse): one line per field, with how many events, what was expected and the first of them.
  std::vector<std::string> warnings;
  int64_t skipped = 0;  // those events
  // The device kind the recorder names its process with ("tokamax (<kind>)"); "" if none.
  std::string device_kind;
};

// Every complete event ("ph": "X") of a Chrome trace (a {"traceEvents": [...]} object or a list
// of events) that carries a tokamax payload; events of other tools are ignored, tokamax events
// with a mistyped field are counted and warned about. InvalidArgument naming `source` when `doc`
// is not a trace.
TraceSummary summarize_trace(const Json& doc, const std::string& source);

// The same from a trace's text, parsed one event at a time: memory holds the summary, not a
// parsed document (which took about 13 times the text's size). InvalidArgument as parse_json
// gives it (malformed, too deep) naming `source`, or when the text is not a trace.
TraceSummary summarize_trace_text(std::string_view text, const std::string& source);
// The same from a trace file (gzip-compressed too), read as a stream: memory holds the summary,
// neither the file nor its text. Errors as read_trace_file's and summarize_trace_text's; a gzip
// stream cut short adds read_trace_file's warning to `file_warnings` (when given), also when
// the text it ends with then fails to parse. `source` names the text in parse errors ("": the
// path).
TraceSummary summarize_trace_file(const std::string& path,
                                  std::vector<std::string>* file_warnings = nullptr,
                                  const std::string& source = "");

}  // namespace tokamax
TOKAMAX_PUBLIC_END
