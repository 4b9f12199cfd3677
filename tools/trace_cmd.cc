// `tokamax trace extract` and `tokamax trace summary`.
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <tuple>

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
  const Json doc = parse_json(read_trace_file(trace_file), trace_file);
  const Json& events = doc.is_object() && doc.contains("traceEvents") ? doc["traceEvents"] : doc;
  if (!events.is_array()) {
    throw InvalidArgument(trace_file + ": not a Chrome trace (expected a \"traceEvents\" list)");
  }
  struct Row {
    int64_t calls = 0;
    double total_us = 0;
  };
  // (op/implementation, key, config, rung) -> calls, time. A call's own payload is the last one
  // of its nested chain.
  std::map<std::tuple<std::string, std::string, std::string, std::string>, Row> rows;
  for (const Json& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("args") ||
        !e["args"].contains("payload") || !e["args"]["payload"].is_string())
      continue;
    const std::string& payload = e["args"]["payload"].get_ref<const std::string&>();
    const auto spans = find_payloads(payload);
    if (spans.empty() || !spans.back().error.empty()) continue;
    const PayloadSpan& own = spans.back();
    Json p;
    try {
      p = parse_json(std::string_view(payload).substr(own.begin, own.end - own.begin), "payload");
    } catch (const InvalidArgument&) {
      continue;
    }
    const Json op = p.value("op", Json::object());
    Row& row = rows[{e.value("name", ""), canonical_dump(p.value("arguments", Json::object())),
                     canonical_dump(op.value("config", Json::object())), op.value("rung", "?")}];
    ++row.calls;
    row.total_us += e.value("dur", 0.0);
  }
  if (json) {
    Json arr = Json::array();
    for (const auto& [k, r] : rows) {
      arr.push_back({{"op", std::get<0>(k)},
                     {"key", std::get<1>(k)},
                     {"config", parse_json(std::get<2>(k), "config")},
                     {"rung", std::get<3>(k)},
                     {"calls", r.calls},
                     {"total_ms", r.total_us / 1e3}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  fmt::print("{:<22} {:>6} {:>10}  {:<12} {}\n", "op", "calls", "total ms", "rung", "config / key");
  for (const auto& [k, r] : rows) {
    fmt::print("{:<22} {:>6} {:>10.3f}  {:<12} {}\n{:>54}{}\n", std::get<0>(k), r.calls,
               r.total_us / 1e3, std::get<3>(k), std::get<2>(k), "", std::get<1>(k));
  }
  if (rows.empty()) fmt::print("no tokamax op events in {}\n", trace_file);
  return 0;
}

}  // namespace tokamax::cli
