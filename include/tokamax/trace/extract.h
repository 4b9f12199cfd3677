// Extraction of bound arguments from traces: the first half of offline tuning. Finds every
// "tokamax:{...}" payload in a trace (ours, one with unrelated events, or one merged by other
// tools; also a truncated one, whose complete events are kept), isolates each JSON object by
// balancing braces outside JSON strings, validates it into BoundArguments, strips the config
// and rung, and dedupes by (op, implementation, key). Nothing is fatal: a bad payload is
// counted and skipped with a warning that names its event and position.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// One "tokamax:{" occurrence in a string: [begin, end) of the JSON object, or an error.
struct PayloadSpan {
  size_t marker = 0;  // offset of "tokamax:"
  size_t begin = 0, end = 0;
  std::string error;  // non-empty: no balanced object follows the marker
};
// Every payload in `s`, in order ("outer/inner" nesting gives outer first). A marker inside a
// JSON string of an earlier payload is part of that payload, not a new one.
std::vector<PayloadSpan> find_payloads(std::string_view s);

struct ExtractOptions {
  std::string op;  // keep only this family (empty: all)
};

struct ExtractReport {
  std::vector<BoundArguments> bound_args;  // deduplicated, first-seen order, no configs
  bool valid_json = true;    // false: a text was scanned leniently (truncated / not JSON)
  bool chrome_trace = true;  // each input a {"traceEvents": [...]} object or a list of events
  int64_t events = 0;        // trace events looked at (valid JSON only)
  int64_t payloads = 0;      // payloads found, nested ones included
  int64_t duplicates = 0, other_ops = 0;
  int64_t malformed = 0, unknown_op = 0, incompatible = 0, invalid = 0;
  // One per skipped payload (the first 100, then a count), plus file-level ones.
  std::vector<std::string> warnings;
  std::string summary() const;  // one line of counts
};

// The text of a trace file, gunzipped when it is gzip-compressed (traces saved as .json.gz by
// Perfetto, TensorBoard and others). A truncated gzip stream gives the text up to the cut, with
// a warning appended to `warnings` (when given). Error if the file cannot be read.
std::string read_trace_file(const std::string& path, std::vector<std::string>* warnings = nullptr);

// `source` names the input in warnings (a path).
ExtractReport extract_bound_args(std::string_view trace_text, std::string_view source,
                                 const ExtractOptions& options = {});
ExtractReport extract_bound_args_file(const std::string& path, const ExtractOptions& options = {});
// Several traces (say one per process of a job, TOKAMAX_TRACE=trace_%p.json) into one list,
// deduplicated across them; valid_json / chrome_trace hold only if they hold for every file.
ExtractReport extract_bound_args_files(const std::vector<std::string>& paths,
                                       const ExtractOptions& options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
