// Extraction of bound arguments from trace files.
#include "tokamax/trace/extract.h"

#include <zlib.h>

#include <cctype>
#include <unordered_map>
#include <unordered_set>

#include "core/json_scan.h"
#include "tokamax/core/error.h"
#include "tokamax/core/json.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"
#include "tokamax/op/dispatch.h"

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
// hold for every input.
void extract_into(std::string_view text, std::string_view source, Extractor& x) {
  ExtractReport& report = x.report();
  const int64_t payloads_before = report.payloads;
  bool chrome_trace = true;
  Json doc;
  try {
    doc = parse_json(text, source);
  } catch (const InvalidArgument& e) {
    report.valid_json = false;
    chrome_trace = false;
    report.warnings.push_back(std::string(e.what()) +
                              "; scanning its text for payloads instead (the complete events "
                              "of a truncated trace are kept)");
    TOKAMAX_LOG("trace", kInfo, report.warnings.back());
    scan_leniently(text, x);
  }
  const Json* events = nullptr;
  if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array())
    events = &doc["traceEvents"];
  else if (doc.is_array())
    events = &doc;
  if (!chrome_trace) {
    // scanned above
  } else if (events) {
    for (size_t i = 0; i < events->size(); ++i) {
      const std::string label = std::string(source) + ": " + event_label((*events)[i], i);
      ++report.events;
      for_each_string((*events)[i], [&](const std::string& s) { x.scan(s, label); });
    }
    if (doc.is_object()) {  // other top-level members (merged traces keep metadata there)
      for (const auto& [k, v] : doc.items()) {
        if (k == "traceEvents") continue;
        const std::string label = std::string(source) + ": top-level '" + k + "'";
        for_each_string(v, [&](const std::string& s) { x.scan(s, label); });
      }
    }
  } else {
    chrome_trace = false;
    for_each_string(doc, [&](const std::string& s) { x.scan(s, std::string(source)); });
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
  extract_into(text, source, x);
  x.finish();
  return report;
}

std::string read_trace_file(const std::string& path, std::vector<std::string>* warnings) {
  std::string raw = read_file(path);
  if (raw.size() < 2 || static_cast<unsigned char>(raw[0]) != 0x1f ||
      static_cast<unsigned char>(raw[1]) != 0x8b) {
    return raw;
  }
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw Error(path + ": zlib initialization failed");
  z.next_in = reinterpret_cast<Bytef*>(raw.data());
  z.avail_in = static_cast<uInt>(raw.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    // gzip compresses a repetitive text a thousandfold: the limit is on what comes out.
    if (static_cast<int64_t>(out.size() + (sizeof buf - z.avail_out)) > kMaxInputFileBytes) {
      inflateEnd(&z);
      throw InvalidArgument("'" + path + "': gzip text is larger than " +
                            std::to_string(kMaxInputFileBytes) +
                            " bytes (kMaxInputFileBytes); expected a smaller trace");
    }
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // input ends before the stream does
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    const std::string why = path + ": gzip stream " +
                            (rc == Z_BUF_ERROR ? std::string("truncated") : "corrupt") + " after " +
                            std::to_string(out.size()) + " bytes of text; reading what came out";
    if (warnings) warnings->push_back(why);
    TOKAMAX_LOG("trace", kInfo, why);
  }
  return out;
}

ExtractReport extract_bound_args_files(const std::vector<std::string>& paths,
                                       const ExtractOptions& options) {
  ExtractReport report;
  Extractor x(options, report);
  for (const std::string& path : paths)
    extract_into(read_trace_file(path, &report.warnings), path, x);
  x.finish();
  return report;
}

ExtractReport extract_bound_args_file(const std::string& path, const ExtractOptions& options) {
  return extract_bound_args_files({path}, options);
}

}  // namespace tokamax
