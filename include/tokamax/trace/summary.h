// A trace's op calls grouped by (op/implementation, key, config, rung), with their count and
// time: which calls dominate a run and which rung of the resolution ladder configured them.
// What `tokamax trace summary` prints and `tokamax report` charts.
#pragma once

#include <cstdint>
#include <string>
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

// Every complete event ("ph": "X") of a Chrome trace (a {"traceEvents": [...]} object or a list
// of events) that carries a tokamax payload; other events and unreadable payloads are ignored.
// Sorted by (op, key, config, rung). InvalidArgument naming `source` when `doc` is not a trace.
std::vector<TraceCallGroup> summarize_trace(const Json& doc, const std::string& source);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
