// Grouping of a trace's op calls by op, key, config and rung.
#include "tokamax/trace/summary.h"

#include <map>
#include <tuple>

#include "tokamax/core/error.h"
#include "tokamax/trace/extract.h"

namespace tokamax {

std::vector<TraceCallGroup> summarize_trace(const Json& doc, const std::string& source) {
  const Json& events = doc.is_object() && doc.contains("traceEvents") ? doc["traceEvents"] : doc;
  if (!events.is_array()) {
    throw InvalidArgument(source + ": not a Chrome trace (expected a \"traceEvents\" list)");
  }
  std::map<std::tuple<std::string, std::string, std::string, std::string>, TraceCallGroup> groups;
  // A field of an event when it is a string, else "" (events of other tools are not checked).
  auto string_field = [](const Json& e, const char* name) {
    const auto it = e.find(name);
    return it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const Json& e : events) {
    if (!e.is_object() || string_field(e, "ph") != "X" || !e.contains("args") ||
        !e["args"].is_object() || !e["args"].contains("payload") ||
        !e["args"]["payload"].is_string())
      continue;
    const std::string& payload = e["args"]["payload"].get_ref<const std::string&>();
    const auto spans = find_payloads(payload);
    if (spans.empty() || !spans.back().error.empty()) continue;
    // A call's own payload is the last one of its nested chain.
    const PayloadSpan& own = spans.back();
    Json p;
    try {
      p = parse_json(std::string_view(payload).substr(own.begin, own.end - own.begin), "payload");
    } catch (const InvalidArgument&) {
      continue;
    }
    if (!p.is_object()) continue;
    const Json op = p.value("op", Json::object());
    if (!op.is_object()) continue;
    const Json rung = op.value("rung", Json("?"));
    const std::string name = string_field(e, "name");
    const std::tuple<std::string, std::string, std::string, std::string> id{
        name, canonical_dump(p.value("arguments", Json::object())),
        canonical_dump(op.value("config", Json::object())),
        rung.is_string() ? rung.get<std::string>() : "?"};
    TraceCallGroup& g = groups[id];
    const double dur = e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0;
    ++g.calls;
    g.total_us += dur;
    if (spans.size() > 1) {
      ++g.nested_calls;
      g.nested_us += dur;
    }
  }
  std::vector<TraceCallGroup> out;
  for (auto& [id, g] : groups) {
    std::tie(g.op, g.key, g.config, g.rung) = id;
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace tokamax
