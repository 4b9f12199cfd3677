// `tokamax trace extract` and `tokamax trace summary`.
#include <fmt/format.h>

#include <iostream>

#include "tools/commands.h"

namespace tokamax::cli {

int trace_extract(const std::vector<std::string>& trace_files, const std::string& out_path,
                  const std::string& op, bool json) {
  ExtractOptions options;
  options.op = op;
  const ExtractReport r = extract_bound_args_files(trace_files, options);
  const std::string traces = join(trace_files, ", ");
  if (json) {
    const Json j = {{"traces", trace_files},          {"valid_json", r.valid_json},
                    {"chrome_trace", r.chrome_trace}, {"events", r.events},
                    {"payloads", r.payloads},         {"extracted", r.bound_args.size()},
                    {"duplicates", r.duplicates},     {"other_ops", r.other_ops},
                    {"malformed", r.malformed},       {"unknown_op", r.unknown_op},
                    {"incompatible", r.incompatible}, {"invalid", r.invalid},
                    {"warnings", r.warnings}};
    std::cerr << j.dump(2) << "\n";
  } else {
    for (const auto& w : r.warnings) fmt::print(stderr, "warning: {}\n", w);
  }
  if (r.bound_args.empty()) {
    fmt::print(stderr, "tokamax trace extract: nothing extracted from {}: {}\n", traces,
               r.summary());
    return 1;
  }
  const std::string text = BoundArguments::dumps_list(r.bound_args) + "\n";
  if (out_path.empty()) {
    std::cout << text;
  } else {
    write_file_atomic(out_path, text);
  }
  if (!json) {
    fmt::print(stderr, "extracted {} -> {}\n", r.summary(), out_path.empty() ? "stdout" : out_path);
  }
  return 0;
}

int trace_summary(const std::string& trace_file, bool json) {
  const TraceSummary summary = summarize_trace_file(trace_file);  // streamed: any size
  // Events left out for a mistyped field: said on stderr (stdout keeps its format), not fatal.
  for (const std::string& w : summary.warnings) fmt::print(stderr, "warning: {}\n", w);
  const std::vector<TraceCallGroup>& rows = summary.groups;
  if (json) {
    Json arr = Json::array();
    for (const TraceCallGroup& r : rows) {
      arr.push_back({{"op", r.op},
                     {"key", r.key},
                     {"config", parse_json(r.config, "config")},
                     {"rung", r.rung},
                     {"calls", r.calls},
                     {"total_ms", r.total_us / 1e3}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  fmt::print("{:<22} {:>6} {:>10}  {:<12} {}\n", "op", "calls", "total ms", "rung", "config / key");
  for (const TraceCallGroup& r : rows) {
    fmt::print("{:<22} {:>6} {:>10.3f}  {:<12} {}\n{:>54}{}\n", r.op, r.calls, r.total_us / 1e3,
               r.rung, r.config, "", r.key);
  }
  if (rows.empty()) fmt::print("no tokamax op events in {}\n", trace_file);
  return 0;
}

}  // namespace tokamax::cli
