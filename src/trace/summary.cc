// Grouping of a trace's op calls by op, key, config and rung.
#include "tokamax/trace/summary.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "tokamax/core/error.h"
#include "tokamax/trace/extract.h"
#include "trace/reader.h"

namespace tokamax {

namespace {

// The summary built one event at a time.
class TraceSummarizer {
 public:
  explicit TraceSummarizer(std::string source) : source_(std::move(source)) {}

  void add(const Json& e, size_t index) {
    if (!e.is_object()) return;
    note_device_kind(e);
    // A tokamax event is one whose args.payload holds a payload; the rest are other tools'.
    const auto args = e.find("args");
    if (args == e.end() || !args->is_object()) return;
    const auto payload_it = args->find("payload");
    if (payload_it == args->end() || !payload_it->is_string()) return;
    const std::string& payload = payload_it->get_ref<const std::string&>();
    const auto spans = find_payloads(payload);
    if (spans.empty()) return;
    // From here on it is a tokamax event: a field that cannot be read is said, not read as
    // blank or 0 (a numeric name showed as an op without a name, a string dur as no time).
    const auto ph = e.find("ph");
    if (ph == e.end() || !ph->is_string())
      return skip("'ph' is missing or not a string", "\"X\"", e, "ph", index);
    if (ph->get_ref<const std::string&>() != "X") return;  // not a complete event
    const auto name = e.find("name");
    if (name == e.end() || !name->is_string())
      return skip("'name' is missing or not a string", "the op's name", e, "name", index);
    const auto dur = e.find("dur");
    if (dur == e.end() || !dur->is_number())
      return skip("'dur' is missing or not a number", "microseconds", e, "dur", index);
    // A call's own payload is the last one of its nested chain.
    const PayloadSpan& own = spans.back();
    Json p;
    if (own.error.empty()) {
      try {
        p = parse_json(std::string_view(payload).substr(own.begin, own.end - own.begin), "payload");
      } catch (const InvalidArgument&) {
      }
    }
    if (!p.is_object())
      return skip("its payload is not a JSON object", "tokamax:{...}", e, "", index);
    const Json none = Json::object();
    const auto op = p.find("op");
    if (op != p.end() && !op->is_object())
      return skip("the payload's 'op' is not an object", "an object", p, "op", index);
    const Json& op_obj = op != p.end() ? *op : none;
    const auto rung = op_obj.find("rung");
    if (rung != op_obj.end() && !rung->is_string())
      return skip("the payload's 'op.rung' is not a string", "a rung's name", op_obj, "rung",
                  index);
    const auto config = op_obj.find("config");
    if (config != op_obj.end() && !config->is_object())
      return skip("the payload's 'op.config' is not an object", "an object", op_obj, "config",
                  index);
    const auto arguments = p.find("arguments");
    if (arguments != p.end() && !arguments->is_object())
      return skip("the payload's 'arguments' is not an object", "an object", p, "arguments", index);
    const std::tuple<std::string, std::string, std::string, std::string> id{
        name->get<std::string>(), canonical_dump(arguments != p.end() ? *arguments : none),
        canonical_dump(config != op_obj.end() ? *config : none),
        rung != op_obj.end() ? rung->get<std::string>() : "?"};
    TraceCallGroup& g = groups_[id];
    const double us = dur->get<double>();
    ++g.calls;
    g.total_us += us;
    if (spans.size() > 1) {
      ++g.nested_calls;
      g.nested_us += us;
    }
  }

  TraceSummary finish() && {
    TraceSummary s;
    for (auto& [id, g] : groups_) {
      std::tie(g.op, g.key, g.config, g.rung) = id;
      s.groups.push_back(std::move(g));
    }
    // In the order of their first events.
    std::vector<std::pair<std::string, Skipped>> skipped(skipped_.begin(), skipped_.end());
    std::stable_sort(skipped.begin(), skipped.end(), [](const auto& a, const auto& b) {
      return a.second.first_index < b.second.first_index;
    });
    for (const auto& [why, k] : skipped) {
      s.warnings.push_back(source_ + ": skipped " + std::to_string(k.count) + " tokamax event" +
                           (k.count == 1 ? "" : "s") + ": " + why + ", expected " + k.expected +
                           " (the first: event #" + std::to_string(k.first_index) +
                           (k.first_value.empty() ? "" : ", " + k.first_value) + ")");
      s.skipped += k.count;
    }
    s.device_kind = std::move(device_kind_);
    return s;
  }

 private:
  struct Skipped {
    int64_t count = 0;
    size_t first_index = 0;
    std::string expected, first_value;
  };

  // Counted per reason; the first event's index and value shown, cut short.
  void skip(const std::string& why, const char* expected, const Json& holder, const char* field,
            size_t index) {
    Skipped& k = skipped_[why];
    if (k.count++ == 0) {
      k.first_index = index;
      k.expected = expected;
      const auto it = *field ? holder.find(field) : holder.end();
      if (it != holder.end()) {
        std::string v = canonical_dump(*it);
        if (v.size() > 60) v = v.substr(0, 57) + "...";
        k.first_value = std::string("'") + field + "': " + v;
      }
    }
  }

  // The recorder names its process "tokamax (<device kind>)" in a metadata event.
  void note_device_kind(const Json& e) {
    if (!device_kind_.empty()) return;
    const auto name = e.find("name");
    const auto args = e.find("args");
    if (name == e.end() || *name != "process_name" || args == e.end() || !args->is_object()) return;
    const auto n = args->find("name");
    if (n == args->end() || !n->is_string()) return;
    const std::string& s = n->get_ref<const std::string&>();
    if (s.rfind("tokamax (", 0) == 0 && s.back() == ')') device_kind_ = s.substr(9, s.size() - 10);
  }

  std::string source_;
  std::map<std::tuple<std::string, std::string, std::string, std::string>, TraceCallGroup> groups_;
  std::map<std::string, Skipped> skipped_;
  std::string device_kind_;
};

}  // namespace

namespace {

TraceSummary summarize_stream(trace_internal::TraceBuf& buf, const std::string& source) {
  struct Visitor : trace_internal::EventVisitor {
    explicit Visitor(TraceSummarizer& s) : s(s) {}
    void event(const Json& e, size_t index) override { s.add(e, index); }
    TraceSummarizer& s;
  };
  TraceSummarizer s(source);
  Visitor v(s);
  if (!trace_internal::parse_trace(buf, source, v).events_list) {
    throw InvalidArgument(source + ": not a Chrome trace (expected a \"traceEvents\" list)");
  }
  return std::move(s).finish();
}

}  // namespace

TraceSummary summarize_trace_text(std::string_view text, const std::string& source) {
  trace_internal::TextBuf buf(text);
  return summarize_stream(buf, source);
}

TraceSummary summarize_trace_file(const std::string& path, std::vector<std::string>* file_warnings,
                                  const std::string& source) {
  trace_internal::TraceFileBuf buf(path);
  auto add_warnings = [&] {
    if (file_warnings)
      file_warnings->insert(file_warnings->end(), buf.warnings().begin(), buf.warnings().end());
  };
  try {
    TraceSummary s = summarize_stream(buf, source.empty() ? path : source);
    add_warnings();
    return s;
  } catch (const InvalidArgument&) {
    add_warnings();  // a gzip stream cut short is why its text does not parse
    throw;
  }
}

TraceSummary summarize_trace(const Json& doc, const std::string& source) {
  const Json& events = doc.is_object() && doc.contains("traceEvents") ? doc["traceEvents"] : doc;
  if (!events.is_array()) {
    throw InvalidArgument(source + ": not a Chrome trace (expected a \"traceEvents\" list)");
  }
  TraceSummarizer s(source);
  for (size_t i = 0; i < events.size(); ++i) s.add(events[i], i);
  return std::move(s).finish();
}

}  // namespace tokamax
