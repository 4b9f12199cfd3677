// Extraction of bound arguments from trace files.
#include "tokamax/trace/extract.h"

#include <cctype>
#include <cstddef>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "core/json_scan.h"
#include "tokamax/core/error.h"
#include "tokamax/core/json.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"
#include "tokamax/op/dispatch.h"
#include "trace/reader.h"

namespace tokamax {

std::vector<PayloadSpan> find_payloads(std::string_view s) {
  // Each marker's object ends at the brace that balances its '{' (braces inside strings do not
  // count). A marker whose object is unbalanced makes its scan run to the end of the string, and
  // the next marker is searched from just after it (a truncated payload must not hide a later
  // complete one): scanning afresh from every marker would be quadratic in a string of repeated
  // "tokamax:{" (5.9 s at 360 KB). So each scan records where every marker it meets outside a
  // string ends (a stack of its open braces), and a later marker it met is answered from that.
  // Only markers an unbalanced scan met inside a string need scans of their own; those scans,
  // run to the end, are limited to a budget of a few times the string's length, after which
  // such markers are reported unscanned.
  constexpr size_t kUnknown = std::string_view::npos, kUnbalanced = 0;
  std::unordered_map<size_t, size_t> known;  // a marker's '{' -> its object's end, or kUnbalanced
  int64_t budget = 4 * static_cast<int64_t>(s.size()) + (int64_t{1} << 20);
  std::vector<size_t> open;  // positions of the unbalanced '{' of one scan
  auto is_marker_brace = [&](size_t k) {
    return k >= kPayloadMarker.size() &&
           s.compare(k - kPayloadMarker.size(), kPayloadMarker.size(), kPayloadMarker) == 0;
  };
  // Scans from the '{' at `begin`; returns its object's end or kUnbalanced.
  auto scan = [&](size_t begin) {
    open.clear();
    JsonStringTracker strings;
    size_t k = begin;
    for (; k < s.size(); ++k) {
      const char c = s[k];
      if (!strings.structural(c)) continue;
      if (c == '{') {
        open.push_back(k);
      } else if (c == '}') {
        const size_t o = open.back();
        open.pop_back();
        if (is_marker_brace(o)) known[o] = k + 1;
        if (open.empty()) break;
      }
    }
    budget -= static_cast<int64_t>(k - begin);
    if (!open.empty()) {
      for (const size_t o : open) {
        if (is_marker_brace(o)) known[o] = kUnbalanced;
      }
      return kUnbalanced;
    }
    return k + 1;
  };
  std::vector<PayloadSpan> out;
  size_t pos = 0;
  while (true) {
    const size_t marker = s.find(kPayloadMarker, pos);
    if (marker == std::string_view::npos) break;
    const size_t begin = marker + kPayloadMarker.size();
    pos = begin;
    if (begin >= s.size() || s[begin] != '{') continue;  // "tokamax:" in prose, not a payload
    PayloadSpan span{marker, begin, 0, ""};
    size_t end = kUnknown;
    if (const auto it = known.find(begin); it != known.end()) {
      end = it->second;
    } else if (budget > 0) {
      end = scan(begin);
    }
    if (end == kUnknown) {
      span.error = "not scanned: inside a string of an unbalanced payload before it";
    } else if (end == kUnbalanced) {
      span.error = "no balanced JSON object after the marker (truncated payload)";
    } else {
      span.end = end;
      pos = end;
    }
    out.push_back(std::move(span));
  }
  return out;
}

std::string ExtractReport::summary() const {
  std::string s = std::to_string(bound_args.size()) + " bound arguments from " +
                  std::to_string(payloads) + " payloads";
  if (valid_json) s += " in " + std::to_string(events) + " events";
  s += " (" + std::to_string(duplicates) + " duplicates";
  if (other_ops) s += ", " + std::to_string(other_ops) + " of other ops";
  s += ", skipped: " + std::to_string(malformed) + " malformed, " + std::to_string(unknown_op) +
       " unknown op, " + std::to_string(incompatible) + " incompatible, " +
       std::to_string(invalid) + " invalid)";
  return s;
}

namespace {

class Extractor {
 public:
  // InvalidArgument when options.op names no known family.
  Extractor(const ExtractOptions& o, ExtractReport& r) : options_(o), report_(r) {
    if (!options_.op.empty()) find_family(options_.op);
  }
  ExtractReport& report() { return report_; }

  // Every payload in one string of the trace. `where` names the event and string.
  void scan(std::string_view s, const std::string& where) {
    if (s.find(kPayloadMarker) == std::string_view::npos) return;
    for (const PayloadSpan& p : find_payloads(s)) {
      ++report_.payloads;
      const std::string at = where + ", payload at offset " + std::to_string(p.marker);
      if (!p.error.empty()) {
        skip(report_.malformed, at + ": " + p.error);
        continue;
      }
      Json j;
      try {
        j = parse_json(s.substr(p.begin, p.end - p.begin), "payload");
      } catch (const InvalidArgument& e) {
        skip(report_.malformed, at + ": " + e.what());
        continue;
      }
      add(j, at);
    }
  }

  // What the extraction has found so far, to go back to when an input turns out not to be JSON
  // partway through (its events read until then are scanned again, leniently).
  struct State {
    ExtractReport report;
    std::unordered_set<std::string> seen;
    int64_t suppressed = 0;
  };
  State save() const { return {report_, seen_, suppressed_}; }
  void restore(State s) {
    report_ = std::move(s.report);
    seen_ = std::move(s.seen);
    suppressed_ = s.suppressed;
  }

  // Adds the count of warnings left out (a huge trace of bad payloads must not flood the report).
  void finish() {
    if (suppressed_ > 0)
      report_.warnings.push_back(std::to_string(suppressed_) + " more skipped payloads not listed");
  }

 private:
  static constexpr size_t kMaxListed = 100;

  void skip(int64_t& counter, const std::string& why) {
    ++counter;
    if (report_.warnings.size() < kMaxListed)
      report_.warnings.push_back(why);
    else
      ++suppressed_;
    TOKAMAX_LOG("trace", kInfo, "skipped " + why);
  }

  void add(const Json& j, const std::string& at) {
    if (!j.is_object() || !j.contains("format") ||
        !json_integer_in(j["format"], kPayloadFormat, kPayloadFormat)) {
      const std::string format =
          j.is_object() && j.contains("format") ? canonical_dump(j["format"]) : "none";
      const std::string version = j.is_object() && j.contains("tokamax_version")
                                      ? canonical_dump(j["tokamax_version"])
                                      : "unknown";
      skip(report_.incompatible, at + ": payload format " + format + " (tokamax version " +
                                     version + "); this library (" + library_version() +
                                     ") reads format " + std::to_string(kPayloadFormat));
      return;
    }
    const Json op = j.value("op", Json());
    const std::string family = op.is_object() && op.contains("family") && op["family"].is_string()
                                   ? op["family"].get<std::string>()
                                   : "";
    if (!options_.op.empty() && family != options_.op) {
      ++report_.other_ops;
      return;
    }
    try {
      find_family(family);
    } catch (const InvalidArgument& e) {
      skip(report_.unknown_op, at + ": " + e.what());
      return;
    }
    BoundArguments b;
    try {
      b = BoundArguments::from_json(j);  // keeps op.family/implementation and the arguments
    } catch (const std::exception& e) {
      skip(report_.invalid, at + ": " + e.what());
      return;
    }
    if (!seen_.insert(b.family() + "/" + b.implementation() + "/" + b.key()).second) {
      ++report_.duplicates;
      return;
    }
    report_.bound_args.push_back(std::move(b));
  }

  const ExtractOptions& options_;
  ExtractReport& report_;
  std::unordered_set<std::string> seen_;
  int64_t suppressed_ = 0;
};

// Every string (keys too) under `j`.
template <class F>
void for_each_string(const Json& j, F&& f) {
  if (j.is_string()) {
    f(j.get_ref<const std::string&>());
  } else if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      f(k);
      for_each_string(v, f);
    }
  } else if (j.is_array()) {
    for (const Json& v : j) for_each_string(v, f);
  }
}

std::string event_label(const Json& e, size_t index) {
  std::string label = "event #" + std::to_string(index);
  if (e.is_object() && e.contains("name") && e["name"].is_string())
    label += " '" + e["name"].get<std::string>() + "'";
  return label;
}

// Text that is not valid JSON (a trace cut off mid-write, or not JSON at all): walk its string
// literals lexically, decode each complete one and scan it. An event is named by the last
// "name": "..." value seen before the payload.
void scan_leniently(std::string_view text, Extractor& x) {
  std::string last_name;
  bool next_is_name = false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '"') continue;
    size_t k = i + 1;
    for (bool esc = false; k < text.size(); ++k) {
      if (esc)
        esc = false;
      else if (text[k] == '\\')
        esc = true;
      else if (text[k] == '"')
        break;
    }
    if (k >= text.size()) break;  // an unterminated literal: the cut
    std::string value;
    try {
      value = Json::parse(text.substr(i, k + 1 - i)).get<std::string>();
    } catch (const std::exception&) {
      i = k;
      continue;
    }
    size_t after = k + 1;
    while (after < text.size() && std::isspace(static_cast<unsigned char>(text[after]))) ++after;
    const bool is_key = after < text.size() && text[after] == ':';
    if (next_is_name && !is_key) last_name = value;
    next_is_name = is_key && value == "name";
    x.scan(value, "string at byte " + std::to_string(i) +
                      (last_name.empty() ? "" : " (event '" + last_name + "')"));
    i = k;
  }
}

}  // namespace

namespace {

// One input into a report shared by several: dedupe spans inputs; valid_json and chrome_trace
// hold for every input. The text is parsed as it is read from `buf`, one event at a time (what is
// kept is what the extraction finds, not the trace). Text that turns out not to be JSON is
// scanned leniently instead, whole: `whole_text` gives it (a truncated trace, whose complete
// events are kept). `buf_warnings`: what reading `buf` warned about (a gzip stream cut short),
// listed before what the input's events did.
void extract_into(trace_internal::TraceBuf& buf, std::string_view source, Extractor& x,
                  const std::function<std::string_view()>& whole_text,
                  const std::vector<std::string>* buf_warnings) {
  ExtractReport& report = x.report();
  const int64_t payloads_before = report.payloads;
  const size_t warnings_before = report.warnings.size();
  bool chrome_trace = true;
  // Each event's strings (keys too) as soon as the event is parsed.
  class Events : public trace_internal::EventVisitor {
   public:
    Events(std::string_view source, Extractor& x) : source_(source), x_(x) {}
    void event(const Json& e, size_t index) override {
      const std::string label = std::string(source_) + ": " + event_label(e, index);
      ++x_.report().events;
      for_each_string(e, [&](const std::string& s) { x_.scan(s, label); });
    }

   private:
    std::string_view source_;
    Extractor& x_;
  } events(source, x);
  Extractor::State saved = x.save();
  trace_internal::TraceShape shape;
  try {
    shape = trace_internal::parse_trace(buf, source, events);
  } catch (const trace_internal::MalformedTrace& e) {
    x.restore(std::move(saved));
    const std::string_view text = whole_text();  // its own reading's warnings come first
    report.valid_json = false;
    chrome_trace = false;
    report.warnings.push_back(std::string(e.what()) +
                              "; scanning its text for payloads instead (the complete events "
                              "of a truncated trace are kept)");
    TOKAMAX_LOG("trace", kInfo, report.warnings.back());
    scan_leniently(text, x);
  }
  if (chrome_trace && buf_warnings) {
    report.warnings.insert(report.warnings.begin() + static_cast<std::ptrdiff_t>(warnings_before),
                           buf_warnings->begin(), buf_warnings->end());
  }
  if (!chrome_trace) {
    // scanned above
  } else if (shape.events_list) {
    // Other top-level members (merged traces keep metadata there), after the events.
    if (shape.rest.is_object()) {
      for (const auto& [k, v] : shape.rest.items()) {
        if (k == "traceEvents") continue;
        const std::string label = std::string(source) + ": top-level '" + k + "'";
        for_each_string(v, [&](const std::string& s) { x.scan(s, label); });
      }
    }
  } else {
    chrome_trace = false;
    for_each_string(shape.rest, [&](const std::string& s) { x.scan(s, std::string(source)); });
  }
  report.chrome_trace = report.chrome_trace && chrome_trace;
  if (!chrome_trace && report.payloads == payloads_before) {
    report.warnings.push_back(std::string(source) +
                              " does not look like a Chrome trace (not JSON with a "
                              "\"traceEvents\" list) and holds no tokamax payloads");
  }
}

}  // namespace

ExtractReport extract_bound_args(std::string_view text, std::string_view source,
                                 const ExtractOptions& options) {
  ExtractReport report;
  Extractor x(options, report);
  trace_internal::TextBuf buf(text);
  extract_into(
      buf, source, x, [&] { return text; }, nullptr);
  x.finish();
  return report;
}

std::string read_trace_file(const std::string& path, std::vector<std::string>* warnings) {
  trace_internal::TraceFileBuf buf(path);
  std::string out;
  char chunk[1 << 16];
  for (std::streamsize n; (n = buf.sgetn(chunk, sizeof chunk)) > 0;)
    out.append(chunk, static_cast<size_t>(n));
  if (warnings) warnings->insert(warnings->end(), buf.warnings().begin(), buf.warnings().end());
  return out;
}

ExtractReport extract_bound_args_files(const std::vector<std::string>& paths,
                                       const ExtractOptions& options) {
  ExtractReport report;
  Extractor x(options, report);
  for (const std::string& path : paths) {
    trace_internal::TraceFileBuf buf(path);
    std::string text;
    extract_into(
        buf, path, x,
        [&]() -> std::string_view {
          text = read_trace_file(path, &report.warnings);
          return text;
        },
        &buf.warnings());
  }
  x.finish();
  return report;
}

ExtractReport extract_bound_args_file(const std::string& path, const ExtractOptions& options) {
  return extract_bound_args_files({path}, options);
}

}  // namespace tokamax
