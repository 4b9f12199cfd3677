// The report page: every input read leniently (a file that cannot be used is skipped and
// listed, the rest still renders), then the sections as XHTML text around the SVG writer's
// charts, each chart followed by the table of its figures.
#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>
#include <set>

#include "report/svg.h"
#include "tokamax/core/limits.h"
#include "tokamax/tokamax.h"

namespace tokamax::report {
namespace {

// The two text styles of a horizontal bar chart's rows: the row's label, right-aligned in
// monospace before the axis, and the tag written after its bar.
std::pair<TextStyle, TextStyle> bar_row_styles() {
  TextStyle label;
  label.size = 12;
  label.monospace = true;
  label.anchor = TextStyle::Anchor::kEnd;
  TextStyle tag;
  tag.size = 12;
  return {label, tag};
}

std::string esc(std::string_view s) { return xml_escape(s); }
std::string num(double v, int digits = 4) { return format_number(v, digits); }

// ---------------------------------------------------------------- inputs

struct ResultInput {
  std::string path;
  AutotuningResult result;
  std::string command, created;  // empty when the file does not say (library-written files)
};

struct BenchRowIn {
  std::string spec, implementation, config, source, peak, baseline, bytes_source;
  double median_ms = 0, iqr_ms = 0, flops = 0, bytes = 0, gflops = 0, gbps = 0, pct = 0;
  double peak_value = 0, speedup = 0;
  int64_t allocated = 0;
  bool measured() const { return median_ms > 0; }
  // Where the row goes on the roofline chart; 0 when it cannot be placed (no FLOP count).
  double intensity() const { return bytes > 0 && flops > 0 ? flops / bytes : 0; }
  bool plotted() const { return measured() && intensity() > 0 && gflops > 0; }
};

struct Ceilings {
  double f32 = 0, bf16 = 0, read = 0, copy = 0;  // GFLOP/s, GFLOP/s, GB/s, GB/s (all threads)
  std::string bf16_unit;  // "amx" (tiles), "avx512_bf16" (vdpbf16ps) or "" (not said)
  int threads = 0;
  bool from_rows = false;  // an older bench file: the ceilings its rows were compared against
};

struct BenchInput {
  std::string path, command, created, version, device_kind, model;
  Ceilings ceilings;
  std::vector<BenchRowIn> rows;
};

struct TraceInput {
  std::string path, device_kind;
  std::vector<TraceCallGroup> groups;
};

struct Loaded {
  std::vector<ResultInput> results;
  std::vector<BenchInput> benches;
  std::vector<TraceInput> traces;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why
};

// The file's text, or InvalidArgument saying why not (without repeating the path: the caller
// names it).
std::string read_input(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InvalidArgument("no such file");
  if (std::filesystem::is_directory(path, ec)) throw InvalidArgument("a directory, not a file");
  return read_file(path);
}

std::string opt_string(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double opt_number(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A count: 0 (not said) unless the field is a number in [0, max]; converting a larger one (a
// file may say 1e300) would be undefined.
int64_t opt_count(const Json& j, const char* name, int64_t max) {
  const double v = opt_number(j, name);
  return v >= 0 && v <= static_cast<double>(max) ? static_cast<int64_t>(v) : 0;
}

ResultInput load_result(const std::string& path) {
  const std::string text = read_input(path);
  ResultInput r{path, AutotuningResult::loads(text, "the file"), "", ""};
  const Json j = parse_json(text, "the file");
  r.command = opt_string(j, "command");
  r.created = opt_string(j, "created");
  return r;
}

BenchRowIn parse_bench_row(const Json& row, size_t i) {
  if (!row.is_object()) throw InvalidArgument(fmt::format("row {} is not an object", i));
  for (const char* required : {"spec", "implementation"}) {
    if (!row.contains(required) || !row[required].is_string())
      throw InvalidArgument(fmt::format("row {} has no string '{}'", i, required));
  }
  if (!row.contains("median_ms") || !row["median_ms"].is_number())
    throw InvalidArgument(fmt::format("row {} has no number 'median_ms'", i));
  BenchRowIn r;
  r.spec = row["spec"].get<std::string>();
  r.implementation = row["implementation"].get<std::string>();
  r.config = opt_string(row, "config");
  r.source = opt_string(row, "config_source");
  r.peak = opt_string(row, "peak");
  r.baseline = opt_string(row, "baseline");
  r.median_ms = row["median_ms"].get<double>();
  r.iqr_ms = opt_number(row, "iqr_ms");
  r.flops = opt_number(row, "flops");
  r.bytes = opt_number(row, "bytes");
  r.bytes_source = opt_string(row, "bytes_source");
  r.gflops = opt_number(row, "gflops");
  r.gbps = opt_number(row, "gbps");
  r.pct = opt_number(row, "pct_of_peak");
  r.peak_value = opt_number(row, "peak_value");
  r.speedup = opt_number(row, "speedup_vs_baseline");
  r.allocated = opt_count(row, "allocated_bytes", int64_t{1} << 62);
  // Rows of bench files written before the FLOP and byte counts were: both follow from the
  // rates, which share one median.
  if (r.flops == 0 && r.gflops > 0 && r.measured()) r.flops = r.gflops * 1e9 * r.median_ms * 1e-3;
  if (r.bytes == 0 && r.gbps > 0 && r.measured()) {
    r.bytes = r.gbps * 1e9 * r.median_ms * 1e-3;
    r.bytes_source = "cost";
  }
  return r;
}

BenchInput load_bench(const std::string& path) {
  const Json doc = parse_json(read_input(path), "the file");
  BenchInput b;
  b.path = path;
  const Json* rows = nullptr;
  if (doc.is_array()) {
    rows = &doc;  // `tokamax bench --json` of versions before the document form
  } else if (doc.is_object() && doc.contains("rows") && doc["rows"].is_array()) {
    rows = &doc["rows"];
    b.command = opt_string(doc, "command");
    b.created = opt_string(doc, "created");
    b.version = opt_string(doc, "tokamax_version");
    b.device_kind = opt_string(doc, "device_kind");
    if (doc.contains("device") && doc["device"].is_object())
      b.model = opt_string(doc["device"], "model_name");
    if (doc.contains("roofline") && doc["roofline"].is_object()) {
      const Json& r = doc["roofline"];
      b.ceilings.f32 = opt_number(r, "f32_fma_gflops_all");
      b.ceilings.bf16 = opt_number(r, "bf16_dot_gflops_all");
      b.ceilings.read = opt_number(r, "mem_read_gbps_all");
      b.ceilings.copy = opt_number(r, "mem_copy_gbps_all");
      b.ceilings.bf16_unit = opt_string(r, "bf16_dot_unit");
      b.ceilings.threads = static_cast<int>(opt_count(r, "threads", kMaxThreads));
    }
  } else {
    throw InvalidArgument(
        "not a tokamax bench document (expected {\"rows\": [...]} or a list of rows)");
  }
  if (rows->empty()) throw InvalidArgument("no benchmark rows");
  for (size_t i = 0; i < rows->size(); ++i) b.rows.push_back(parse_bench_row((*rows)[i], i));
  if (b.ceilings.f32 == 0 && b.ceilings.read == 0) {
    b.ceilings.from_rows = true;
    for (const BenchRowIn& r : b.rows) {
      const bool bf16 = r.peak == "bf16_dot" || r.peak == "bf16_amx";
      double& c = r.peak == "f32_fma"    ? b.ceilings.f32
                  : bf16                 ? b.ceilings.bf16
                  : r.peak == "mem_read" ? b.ceilings.read
                                         : b.ceilings.copy;
      if (!r.peak.empty()) c = std::max(c, r.peak_value);
      if (r.peak == "bf16_amx") b.ceilings.bf16_unit = "amx";
    }
  }
  return b;
}

TraceInput load_trace(const std::string& path) {
  read_input(path);  // says "no such file" plainly; read_trace_file also gunzips
  std::vector<std::string> warnings;
  const std::string text = read_trace_file(path, &warnings);
  if (!warnings.empty()) throw InvalidArgument(join(warnings, "; "));
  const Json doc = parse_json(text, "the file");
  TraceInput t{path, "", summarize_trace(doc, "the file")};
  if (t.groups.empty()) throw InvalidArgument("no tokamax op events");
  // The recorder names its process "tokamax (<device kind>)".
  const Json& events = doc.is_object() && doc.contains("traceEvents") ? doc["traceEvents"] : doc;
  for (const Json& e : events) {
    if (e.is_object() && opt_string(e, "name") == "process_name" && e.contains("args") &&
        e["args"].is_object()) {
      const std::string n = opt_string(e["args"], "name");
      if (n.rfind("tokamax (", 0) == 0 && n.back() == ')') {
        t.device_kind = n.substr(9, n.size() - 10);
        break;
      }
    }
  }
  return t;
}

Loaded load_all(const Inputs& in) {
  Loaded l;
  auto attempt = [&](const std::string& path, auto load, auto& into) {
    try {
      into.push_back(load(path));
    } catch (const Error& e) {
      l.skipped.emplace_back(path, e.message());
    } catch (const std::exception& e) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
      // Under the fuzzer (fuzz/README.md) an exception that is not tokamax's own is a reader's
      // bug (a JSON type error, an out_of_range): its message names no field.
      throw;
#endif
      l.skipped.emplace_back(path, e.what());
    }
  };
  for (const auto& p : in.results) attempt(p, load_result, l.results);
  for (const auto& p : in.benches) attempt(p, load_bench, l.benches);
  for (const auto& p : in.traces) attempt(p, load_trace, l.traces);
  return l;
}

// ---------------------------------------------------------------- page pieces

// Short labels for argument specs: the tensors' shapes always ("f32[64,128] x f32[8,128,256]"),
// other fields only where the specs of one op in this report differ ("activation=silu"): the
// rest are the same everywhere and would only take room. The full key is in the tables.
class KeyLabels {
 public:
  void add(const std::string& family, const Json& args) {
    if (!args.is_object()) return;
    for (const auto& [name, v] : args.items()) values_[family][name].insert(canonical_dump(v));
  }
  void add_key_text(const std::string& op, const std::string& key_json) {
    add(family_of(op), parse_or_null(key_json));
  }

  std::string label(const std::string& family, const Json& args) const {
    if (!args.is_object()) return canonical_dump(args);
    std::vector<std::string> shapes, others;
    const auto fam = values_.find(family);
    for (const auto& [name, v] : args.items()) {
      if (v.is_string() && v.get<std::string>().find('[') != std::string::npos) {
        shapes.push_back(v.get<std::string>());
        continue;
      }
      const bool varies =
          fam != values_.end() && fam->second.count(name) && fam->second.at(name).size() > 1;
      if (varies)
        others.push_back(name + "=" + (v.is_string() ? v.get<std::string>() : canonical_dump(v)));
    }
    std::string s = join(shapes, " x ");
    if (!others.empty()) s += (s.empty() ? "" : " ") + join(others, " ");
    return s;
  }
  std::string label_of_key_text(const std::string& op, const std::string& key_json) const {
    const Json args = parse_or_null(key_json);
    return args.is_object() ? label(family_of(op), args) : key_json;
  }

 private:
  static std::string family_of(const std::string& op) { return op.substr(0, op.find('/')); }
  static Json parse_or_null(const std::string& text) {
    try {
      return parse_json(text, "key");
    } catch (const std::exception&) {
      return Json();
    }
  }
  // family -> field -> the distinct values it takes
  std::map<std::string, std::map<std::string, std::set<std::string>>> values_;
};

std::string clip(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

// A table whose cells are HTML already escaped by the caller.
struct Table {
  std::vector<std::string> head;
  std::vector<bool> numeric;  // right-aligned columns
  std::vector<std::vector<std::string>> rows;
  void add(std::vector<std::string> r) { rows.push_back(std::move(r)); }
  std::string html(std::string_view caption) const {
    std::string s = "<div class=\"scroll\"><table>";
    if (!caption.empty()) s += "<caption>" + esc(caption) + "</caption>";
    s += "<thead><tr>";
    for (const auto& h : head) s += "<th>" + esc(h) + "</th>";
    s += "</tr></thead><tbody>";
    for (const auto& r : rows) {
      s += "<tr>";
      for (size_t i = 0; i < r.size(); ++i) {
        const bool n = i < numeric.size() && numeric[i];
        s += (n ? "<td class=\"n\">" : "<td>") + r[i] + "</td>";
      }
      s += "</tr>";
    }
    return s + "</tbody></table></div>";
  }
};

std::string code(std::string_view s) { return "<code>" + esc(s) + "</code>"; }
// JSON (keys, configs) has no spaces to wrap at: it may break anywhere.
std::string json_code(std::string_view s) { return "<code class=\"j\">" + esc(s) + "</code>"; }

constexpr double kChartWidth = 1100;

// A chart, or a note saying why it could not be drawn: one odd figure in an input must not cost
// the rest of the page (the table below the chart still shows it).
template <class Draw>
std::string chart(Draw draw) {
  try {
    return "<div class=\"chart\">" + draw() + "</div>";
  } catch (const std::exception& e) {
    return "<p class=\"warn\">This chart could not be drawn: " + esc(e.what()) + "</p>";
  }
}

// ---------------------------------------------------------------- roofline

struct SeriesStyle {
  std::string colour;
  Marker marker = Marker::kCircle;
  bool hollow = false;  // an argument variant or pinned config of an implementation
};

// One style per implementation row name on the chart: native first, then its variants, then the
// baselines in the order they appear.
std::map<std::string, SeriesStyle> series_styles(const std::vector<BenchRowIn>& rows,
                                                 std::vector<std::string>* order) {
  std::vector<std::string> names;
  for (const auto& r : rows) {
    if (r.plotted() && std::find(names.begin(), names.end(), r.implementation) == names.end())
      names.push_back(r.implementation);
  }
  auto rank = [](const std::string& n) {
    return n == "native" ? 0 : n.rfind("native:", 0) == 0 ? 1 : 2;
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  std::map<std::string, SeriesStyle> out;
  for (size_t i = 0; i < names.size(); ++i) {
    out[names[i]] = {palette()[i % palette().size()], marker_at(i),
                     names[i].find(':') != std::string::npos};
  }
  *order = names;
  return out;
}

Style marker_style(const SeriesStyle& s) {
  Style st;
  st.stroke = s.colour;
  st.fill = s.hollow ? "#ffffff" : s.colour;
  st.stroke_width = s.hollow ? 2 : 1;
  return st;
}

struct Ceiling {
  std::string name;  // "f32 FMA"
  double value;      // GFLOP/s (compute) or GB/s (memory)
  bool memory;
  std::string dash;
};

std::vector<Ceiling> ceilings_of(const Ceilings& c) {
  std::vector<Ceiling> out;
  if (c.f32 > 0) out.push_back({"f32 FMA", c.f32, false, ""});
  if (c.bf16 > 0)
    out.push_back({c.bf16_unit == "amx" ? "bf16 AMX" : "bf16 dot", c.bf16, false, "9 5"});
  if (c.read > 0) out.push_back({"memory read", c.read, true, ""});
  if (c.copy > 0) out.push_back({"memory copy", c.copy, true, "3 4"});
  return out;
}

std::string roofline_svg(const BenchInput& b, const std::vector<int>& spec_index) {
  std::vector<std::string> order;
  const auto styles = series_styles(b.rows, &order);
  const std::vector<Ceiling> ceils = ceilings_of(b.ceilings);
  double x_lo = 1e300, x_hi = 0, y_lo = 1e300, y_hi = 0, top = 0, slowest_mem = 1e300;
  for (const BenchRowIn& r : b.rows) {
    if (!r.plotted()) continue;
    x_lo = std::min(x_lo, r.intensity());
    x_hi = std::max(x_hi, r.intensity());
    y_lo = std::min(y_lo, r.gflops);
    y_hi = std::max(y_hi, r.gflops);
  }
  for (const Ceiling& c : ceils) {
    if (!c.memory) top = std::max(top, c.value);
    if (c.memory) slowest_mem = std::min(slowest_mem, c.value);
  }
  if (top > 0) y_hi = std::max(y_hi, top);
  // The ridge points (where the memory roofs meet the compute ones) belong on the chart.
  if (top > 0 && slowest_mem < 1e300) x_hi = std::max(x_hi, top / slowest_mem);
  const auto [xd_lo, xd_hi] = decade_domain(x_lo / 1.5, x_hi * 1.5);
  const auto [yd_lo, yd_hi] = decade_domain(y_lo / 1.5, y_hi * 1.5);
  const double height = 600;
  const Frame f{90, 30, kChartWidth - 250, height - 70};
  const Scale x = Scale::log10(xd_lo, xd_hi, f.left, f.right);
  const Scale y = Scale::log10(yd_lo, yd_hi, f.bottom, f.top);
  Svg svg(kChartWidth, height, "Roofline of " + b.path);
  draw_axes(svg, f, x, y, "arithmetic intensity (FLOP/byte)", "achieved GFLOP/s");

  // Ceilings: a compute roof is flat from where the fastest memory roof reaches it; a memory
  // roof rises until the highest compute roof. Each is clipped to the plot.
  const double fastest_mem = [&] {
    double m = 0;
    for (const Ceiling& c : ceils) m = c.memory ? std::max(m, c.value) : m;
    return m;
  }();
  TextStyle roof_label;
  roof_label.size = 12;
  roof_label.fill = "#333333";
  int memory_roofs = 0;
  for (const Ceiling& c : ceils) {
    Style st{"#444444", "none", 2, c.dash};
    if (!c.memory) {
      const double from = fastest_mem > 0 ? std::max(xd_lo, c.value / fastest_mem) : xd_lo;
      if (!y.contains(c.value)) continue;
      svg.line(x(from), y(c.value), f.right, y(c.value), st);
      TextStyle t = roof_label;
      t.anchor = TextStyle::Anchor::kEnd;
      svg.text(f.right - 6, y(c.value) - 9,
               fmt::format("{} {} GFLOP/s", c.name, format_number(c.value)), t);
    } else {
      // y = intensity * bandwidth, from the left edge (or the bottom) up to the top roof.
      double x0 = std::max(xd_lo, yd_lo / c.value);
      double x1 = top > 0 ? std::min(xd_hi, top / c.value) : xd_hi;
      x1 = std::min(x1, yd_hi / c.value);
      if (x1 <= x0) continue;
      svg.line(x(x0), y(x0 * c.value), x(x1), y(x1 * c.value), st);
      // The label along the line: the first roof's above it a third of the way up, the next
      // one's below it further up, so that two close roofs' labels do not overlap.
      const bool above = memory_roofs++ % 2 == 0;
      const double at = above ? 1.0 / 3 : 0.55;
      const double xm = std::pow(10.0, std::log10(x0) + (std::log10(x1) - std::log10(x0)) * at);
      const double angle = std::atan2(y(x1 * c.value) - y(x0 * c.value), x(x1) - x(x0));
      TextStyle t = roof_label;
      t.rotate = angle * 180 / std::numbers::pi;
      t.anchor = TextStyle::Anchor::kMiddle;
      const double side = above ? 10 : -12;
      const double dx = side * std::sin(angle), dy = -side * std::cos(angle);
      svg.text(x(xm) + dx, y(xm * c.value) + dy,
               fmt::format("{} {} GB/s", c.name, format_number(c.value)), t);
    }
  }

  // Points, each labelled with its spec's number; a label moves up or down when it would
  // cover one already placed.
  struct Box {
    double x0, y0, x1, y1;
  };
  std::vector<Box> placed;
  TextStyle point_label;
  point_label.size = 11;
  point_label.bold = true;
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const BenchRowIn& r = b.rows[i];
    if (!r.plotted()) continue;
    const SeriesStyle& s = styles.at(r.implementation);
    const double px = x(r.intensity()), py = y(r.gflops);
    svg.marker(s.marker, px, py, 11, marker_style(s),
               fmt::format("#{} {} / {}: {} FLOP/byte, {} GFLOP/s", spec_index[i], r.spec,
                           r.implementation, num(r.intensity()), num(r.gflops)));
    const std::string label = std::to_string(spec_index[i]);
    const double w = 7.0 * label.size();
    double best_dy = 0;
    for (double dy : {0.0, -12.0, 12.0, -24.0, 24.0}) {
      const Box bx{px + 8, py + dy - 6, px + 8 + w, py + dy + 6};
      const bool clear = std::none_of(placed.begin(), placed.end(), [&](const Box& o) {
        return bx.x0 < o.x1 && o.x0 < bx.x1 && bx.y0 < o.y1 && o.y0 < bx.y1;
      });
      if (clear) {
        best_dy = dy;
        break;
      }
    }
    placed.push_back({px + 8, py + best_dy - 6, px + 8 + w, py + best_dy + 6});
    svg.text(px + 8, py + best_dy, label, point_label);
  }

  // Legend: one entry per implementation row name, then the roofs.
  double ly = f.top + 10;
  const double lx = f.right + 24;
  TextStyle legend;
  legend.size = 12;
  TextStyle heading = legend;
  heading.bold = true;
  svg.text(lx - 6, ly, "implementation", heading);
  ly += 20;
  for (const std::string& name : order) {
    const SeriesStyle& s = styles.at(name);
    svg.marker(s.marker, lx + 6, ly, 11, marker_style(s));
    svg.text(lx + 20, ly, name, legend);
    ly += 20;
  }
  ly += 10;
  for (const Ceiling& c : ceils) {
    svg.line(lx, ly, lx + 28, ly, Style{"#444444", "none", 2, c.dash});
    svg.text(lx + 36, ly, c.name, legend);
    ly += 20;
  }
  TextStyle note = legend;
  note.size = 11;
  note.fill = "#555555";
  svg.text(lx - 6, ly + 8, "numbers: specs (table below)", note);
  return svg.str();
}

std::string bench_section(const BenchInput& b, int n) {
  std::string s = fmt::format("<h3 id=\"roofline-{}\">{}</h3>", n, esc(b.path));
  // Specs numbered in the order they first appear: the chart's labels.
  std::vector<std::string> specs;
  std::vector<int> spec_index;
  for (const BenchRowIn& r : b.rows) {
    auto it = std::find(specs.begin(), specs.end(), r.spec);
    if (it == specs.end()) {
      specs.push_back(r.spec);
      it = specs.end() - 1;
    }
    spec_index.push_back(static_cast<int>(it - specs.begin()) + 1);
  }
  const bool any_point =
      std::any_of(b.rows.begin(), b.rows.end(), [](const BenchRowIn& r) { return r.plotted(); });
  if (b.ceilings.from_rows) {
    s += "<p class=\"muted\">This file holds no roofline (written by an older tokamax): the "
         "ceilings drawn are the highest its rows were compared against.</p>";
  }
  if (any_point) {
    s += chart([&] { return roofline_svg(b, spec_index); });
    s += "<p class=\"muted\">Each point is one row: a spec (its number) run by one "
         "implementation; filled markers are implementations, hollow ones a variant of one "
         "(pre-packed weights, pinned heuristics config). A point's height against the roof "
         "above it is the share of the machine it used. Bytes are what the op counts as its "
         "least traffic, or, where it counts none (compute-bound calls), its tensors' sizes, "
         "each read or written once (column \"bytes from\").</p>";
  } else {
    s += "<p>No row has a FLOP count and a time, so there is nothing to place on a roofline "
         "chart.</p>";
  }
  Table t{{"#", "spec", "implementation", "median ms", "IQR ms", "GFLOP", "MB moved", "bytes from",
           "FLOP/byte", "GFLOP/s", "GB/s", "% of ceiling", "ceiling", "vs other", "alloc MB",
           "config (source)"},
          {true, false, false, true, true, true, true, false, true, true, true, true, false, false,
           true, false},
          {}};
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const BenchRowIn& r = b.rows[i];
    if (!r.measured()) {
      t.add({std::to_string(spec_index[i]), esc(r.spec), esc(r.implementation), "-", "-", "-", "-",
             "-", "-", "-", "-", "-", "-", "-", "-",
             "failed: " + esc(r.source.empty() ? "no measurement" : r.source)});
      continue;
    }
    t.add({std::to_string(spec_index[i]), esc(r.spec), esc(r.implementation), num(r.median_ms),
           num(r.iqr_ms), num(r.flops / 1e9), num(r.bytes / 1e6),
           esc(r.bytes_source.empty() ? "-" : r.bytes_source),
           r.intensity() > 0 ? num(r.intensity()) : "-", num(r.gflops), num(r.gbps), num(r.pct, 3),
           esc(r.peak.empty() ? "-" : r.peak + " " + num(r.peak_value)),
           esc(r.baseline.empty() ? "-" : num(r.speedup, 3) + "x " + r.baseline),
           num(r.allocated / 1e6, 3),
           json_code(r.config) + (r.source.empty() ? "" : " (" + esc(r.source) + ")")});
  }
  s += t.html("Every row of " + b.path);
  return s;
}

// ---------------------------------------------------------------- tuned keys

struct Candidate {
  std::string config;
  const BenchmarkData* b = nullptr;
  double q1 = 0, q3 = 0;
  bool winner = false, heuristics = false, competes = false;
  size_t samples = 0;
};

struct KeyView {
  const ResultInput* file = nullptr;
  const BoundArguments* bound = nullptr;
  const AutotuningData* data = nullptr;
  std::vector<Candidate> ok;  // sorted by median
  std::vector<std::pair<std::string, const Failure*>> failed;
  std::string label;   // the key, short
  std::string winner;  // config; empty when all failed
  const Failure* heur_failed = nullptr;
  double best = 0, window = 0;
  // The heuristics config, when it was measured.
  const Candidate* heur() const {
    for (const Candidate& c : ok) {
      if (c.heuristics) return &c;
    }
    return nullptr;
  }
};

KeyView view_of(const ResultInput& file, const BoundArguments& bound, const AutotuningData& d) {
  KeyView v{&file, &bound, &d, {}, {}, "", "", nullptr, 0, 0};
  const std::string heur = d.heuristics() ? d.heuristics()->str() : "";
  if (d.has_success()) {
    v.winner = d.fastest().config.str();
    v.best = d.best_median_ms();
    v.window = tie_window_ms(v.best);
  }
  for (const auto& [k, e] : d.entries()) {
    if (!e.benchmark) {
      v.failed.emplace_back(k, &*e.failure);
      if (k == heur) v.heur_failed = &*e.failure;
      continue;
    }
    Candidate c;
    c.config = k;
    c.b = &*e.benchmark;
    c.winner = k == v.winner;
    c.heuristics = k == heur;
    c.competes = d.competes(e);
    c.samples = e.benchmark->samples_ms.size();
    if (!e.benchmark->samples_ms.empty()) {
      const SampleStats st = SampleStats::of(e.benchmark->samples_ms);
      c.q1 = st.q1_ms;
      c.q3 = st.q3_ms;
    } else {
      c.q1 = e.benchmark->median_ms - e.benchmark->iqr_ms / 2;
      c.q3 = e.benchmark->median_ms + e.benchmark->iqr_ms / 2;
    }
    v.ok.push_back(c);
  }
  std::stable_sort(v.ok.begin(), v.ok.end(), [](const Candidate& a, const Candidate& b) {
    return a.b->median_ms < b.b->median_ms;
  });
  return v;
}

// Bars by status, dark to light (winner, finalist, halved away earlier): the palette's navy and
// blue, and a grey; the tie window a pale yellow behind them.
constexpr char kWinnerColour[] = "#1b2a5c";
constexpr char kFinalistColour[] = "#2a6fb0";
constexpr char kOtherColour[] = "#c4c4c4";
constexpr char kWindowColour[] = "#f2e3a0";
constexpr char kHeuristicsColour[] = "#e27b2b";  // stripes and outline

std::string candidate_fill(const Candidate& c) {
  return c.winner ? kWinnerColour : c.b->finalist ? kFinalistColour : kOtherColour;
}

std::string marks(const Candidate& c) {
  std::vector<std::string> m;
  if (c.winner) m.push_back("winner");
  if (c.b->finalist) m.push_back("finalist");
  if (c.heuristics) m.push_back("heuristics");
  return join(m, ", ");
}

std::string candidates_svg(const KeyView& v, const std::string& id) {
  size_t label_chars = 10;
  for (const Candidate& c : v.ok) label_chars = std::max(label_chars, c.config.size());
  label_chars = std::min<size_t>(label_chars, 60);
  const double row_h = 20, bar_h = 13;
  const Frame f{24 + 7.3 * static_cast<double>(label_chars), 56, kChartWidth - 190,
                56 + row_h * static_cast<double>(v.ok.size()) + 6};
  const double height = f.bottom + 64;
  double hi = v.best + v.window;
  for (const Candidate& c : v.ok) hi = std::max({hi, c.q3, c.b->median_ms});
  const auto [lo_d, hi_d] = nice_domain(0, hi * 1.02, 8);
  const Scale x = Scale::linear(lo_d, hi_d, f.left, f.right);
  Svg svg(kChartWidth, height,
          "Candidates of " + v.bound->family() + "/" + v.bound->implementation() + " " + v.label);
  const std::string stripes_id = id + "-heur";
  svg.stripes(stripes_id, kHeuristicsColour);
  // The tie window first, under the bars: candidates whose median falls inside it tie with the
  // fastest, and among them the least scratch memory wins.
  if (v.best > 0) {
    const double x0 = x(v.best), x1 = std::min(std::max(x(v.best + v.window), x0 + 2), f.right);
    svg.rect(x0, f.top, x1 - x0, f.bottom - f.top, Style{"none", kWindowColour, 1},
             fmt::format("tie window: {} to {} ms", num(v.best), num(v.best + v.window)));
  }
  draw_value_axis(svg, f, x, "median time per call (ms), whiskers: interquartile range", true, 8);
  const auto [label, tag] = bar_row_styles();
  for (size_t i = 0; i < v.ok.size(); ++i) {
    const Candidate& c = v.ok[i];
    const double cy = f.top + row_h * (static_cast<double>(i) + 0.5) + 3;
    TextStyle l = label;
    l.bold = c.winner;
    svg.text(f.left - 8, cy, clip(c.config, 60), l);
    const std::string tip =
        fmt::format("{}: median {} ms, IQR {} to {} ms{}", c.config, num(c.b->median_ms), num(c.q1),
                    num(c.q3), marks(c).empty() ? "" : " (" + marks(c) + ")");
    svg.rect(f.left, cy - bar_h / 2, x(c.b->median_ms) - f.left, bar_h,
             Style{"#333333", candidate_fill(c), 0.5}, tip);
    if (c.heuristics) {
      // Stripes over the status colour, inside a thick outline: visible at any bar length.
      svg.rect(f.left, cy - bar_h / 2 + 3, x(c.b->median_ms) - f.left, bar_h - 6,
               Style{"none", "url(#" + stripes_id + ")", 1});
      svg.rect(f.left, cy - bar_h / 2, x(c.b->median_ms) - f.left, bar_h,
               Style{kHeuristicsColour, "none", 2.5});
    }
    // The interquartile range as a whisker with end caps.
    const Style whisker{"#000000", "none", 1.5};
    svg.line(x(c.q1), cy, x(c.q3), cy, whisker);
    svg.line(x(c.q1), cy - 5, x(c.q1), cy + 5, whisker);
    svg.line(x(c.q3), cy - 5, x(c.q3), cy + 5, whisker);
    const std::string m = marks(c);
    if (!m.empty()) {
      TextStyle t = tag;
      t.bold = c.winner;
      svg.text(std::max(x(c.q3), x(c.b->median_ms)) + 8, cy, m, t);
    }
  }
  // Legend below the plot.
  double lx = f.left;
  const double ly = f.bottom + 26;
  TextStyle lt;
  lt.size = 12;
  auto swatch = [&](const std::string& fill, const std::string& stroke, const std::string& text) {
    svg.rect(lx, ly - 7, 22, 14, Style{stroke, fill, stroke == kHeuristicsColour ? 2.5 : 0.5});
    svg.text(lx + 28, ly, text, lt);
    lx += 44 + 6.8 * static_cast<double>(text.size());
  };
  swatch(kWinnerColour, "#333333", "winner");
  swatch(kFinalistColour, "#333333", "finalist (measured to the last stage)");
  swatch(kOtherColour, "#333333", "halved away earlier");
  swatch("url(#" + stripes_id + ")", kHeuristicsColour, "heuristics config");
  swatch(kWindowColour, "none", "tie window");
  return svg.str();
}

std::string key_anchor(int n) { return fmt::format("key-{}", n); }

std::string speedup_text(const KeyView& v) {
  if (v.winner.empty()) return "no config succeeded";
  if (!v.data->heuristics()) return "heuristics config not recorded in this file";
  if (v.heur_failed)
    return "heuristics config failed (" + std::string(failure_kind_name(v.heur_failed->kind)) + ")";
  if (!v.heur()) return "heuristics config not measured";
  const double w = v.data->entries().at(v.winner).benchmark->median_ms;
  return fmt::format("{}x", num(v.heur()->b->median_ms / w, 3));
}

std::string key_section(const KeyView& v, int n) {
  const BoundArguments& b = *v.bound;
  std::string s = fmt::format("<h3 id=\"{}\">{}/{} {}</h3>", key_anchor(n), esc(b.family()),
                              esc(b.implementation()), esc(v.label));
  s += "<p>key " + json_code(b.key()) + " from " + esc(v.file->path) + " (device kind " +
       esc(v.file->result.device_kind()) + ")</p>";
  if (v.winner.empty()) {
    s += "<p class=\"warn\">No config succeeded for this key.</p>";
  } else {
    const BenchmarkData& w = *v.data->entries().at(v.winner).benchmark;
    s += "<p><b>Winner</b> " + json_code(v.winner) + ": " + num(w.median_ms) + " ms. ";
    if (v.heur()) {
      const double sp = v.heur()->b->median_ms / w.median_ms;
      s += v.heur()->winner ? std::string("The heuristics config won. ")
                            : "<b>Heuristics config</b> " + json_code(v.heur()->config) + ": " +
                                  num(v.heur()->b->median_ms) + " ms, so the winner is <b>" +
                                  num(sp, 3) + "x</b> as fast. ";
    } else {
      s += esc(speedup_text(v)) + ". ";
    }
    if (w.evidence) {
      // The tuner's decision from interleaved rounds against the heuristics config.
      s += "Tuning evidence: best finalist " + json_code(w.evidence->best) + " " +
           esc(w.evidence->summary()) +
           (w.evidence->confident ? ". " : "; the heuristics config is stored instead. ");
    } else if (w.median_ms > v.best) {
      s += "It is not the fastest competing median: within the tie window it needs the least "
           "scratch memory. ";
    }
    s += fmt::format(
        "Tie window: {} to {} ms (max(2 us, 1%) above the fastest competing median); {} "
        "succeeded, {} failed.</p>",
        num(v.best), num(v.best + v.window), v.ok.size(), v.failed.size());
    s += chart([&] { return candidates_svg(v, key_anchor(n)); });
  }
  Table t{{"rank", "config", "median ms", "q1 ms", "q3 ms", "IQR ms", "samples", "scratch bytes",
           "prepare ms", "cold cache", "in tie window", "marks"},
          {true, false, true, true, true, true, true, true, true, false, false, false},
          {}};
  for (size_t i = 0; i < v.ok.size(); ++i) {
    const Candidate& c = v.ok[i];
    const bool in_window = c.competes && c.b->median_ms <= v.best + v.window;
    t.add({std::to_string(i + 1), json_code(c.config), num(c.b->median_ms), num(c.q1), num(c.q3),
           num(c.q3 - c.q1), std::to_string(c.samples), std::to_string(c.b->scratch_bytes),
           num(c.b->prepare_ms), c.b->cold_cache ? "yes" : "no", in_window ? "yes" : "no",
           esc(marks(c))});
  }
  if (!v.ok.empty()) s += t.html("Measured candidates, fastest first");
  if (!v.failed.empty()) {
    Table ft{{"config", "failure", "reason"}, {}, {}};
    for (const auto& [cfg, fail] : v.failed) {
      ft.add({json_code(cfg) + (v.heur_failed == fail ? " (heuristics)" : ""),
              esc(failure_kind_name(fail->kind)), esc(fail->message)});
    }
    s += ft.html("Failed candidates and why");
  }
  return s;
}

// ---------------------------------------------------------------- traces

// Rungs in ladder order, each with a fixed colour so charts of different traces agree.
const std::vector<std::string>& rung_order() {
  static const std::vector<std::string> r = {
      "explicit", "null_config", "scope", "disk_cache", "remote_cache", "autotuned", "heuristics"};
  return r;
}

std::string rung_colour(const std::string& rung) {
  // The remote cache is a second cache rung: the disk cache's hue, a lighter blue.
  if (rung == "remote_cache") return "#8fb8de";
  const auto& order = rung_order();
  auto it = std::find(order.begin(), order.end(), rung);
  if (it == order.end()) return "#9a9a9a";
  size_t i = static_cast<size_t>(it - order.begin());
  if (i > 4) --i;  // after remote_cache
  return palette()[i];
}

std::string trace_svg(const TraceInput& t, const std::vector<const TraceCallGroup*>& rows,
                      double top_level_us, const KeyLabels& key_labels) {
  const double row_h = 22, bar_h = 14;
  size_t label_chars = 20;
  std::vector<std::string> labels;
  for (const TraceCallGroup* g : rows) {
    labels.push_back(clip(g->op + " " + key_labels.label_of_key_text(g->op, g->key), 64));
    label_chars = std::max(label_chars, labels.back().size());
  }
  const Frame f{24 + 7.3 * static_cast<double>(label_chars), 56, kChartWidth - 200,
                56 + row_h * static_cast<double>(rows.size()) + 6};
  const double height = f.bottom + 64;
  double hi = 0;
  for (const TraceCallGroup* g : rows) hi = std::max(hi, g->total_us / 1e3);
  const auto [lo_d, hi_d] = nice_domain(0, hi * 1.02, 8);
  const Scale x = Scale::linear(lo_d, hi_d, f.left, f.right);
  Svg svg(kChartWidth, height, "Time per op and key in " + t.path);
  draw_value_axis(svg, f, x, "time in the trace (ms), all calls", true, 8);
  const auto [label, tag] = bar_row_styles();
  for (size_t i = 0; i < rows.size(); ++i) {
    const TraceCallGroup& g = *rows[i];
    const double cy = f.top + row_h * (static_cast<double>(i) + 0.5) + 3;
    svg.text(f.left - 8, cy, labels[i], label);
    const double share = top_level_us > 0 ? 100 * (g.total_us - g.nested_us) / top_level_us : 0;
    svg.rect(f.left, cy - bar_h / 2, x(g.total_us / 1e3) - f.left, bar_h,
             Style{"#333333", rung_colour(g.rung), 0.5},
             fmt::format("{} {}: {} calls, {} ms, rung {}, config {}", g.op, g.key, g.calls,
                         num(g.total_us / 1e3), g.rung, g.config));
    svg.text(x(g.total_us / 1e3) + 8, cy,
             fmt::format("{} ms, {}%, {} calls, {}", num(g.total_us / 1e3, 3), num(share, 3),
                         g.calls, g.rung),
             tag);
  }
  // Legend: the rungs present.
  std::set<std::string> present;
  for (const TraceCallGroup* g : rows) present.insert(g->rung);
  double lx = f.left;
  const double ly = f.bottom + 26;
  TextStyle lt;
  lt.size = 12;
  svg.text(lx, ly, "rung that chose the config:", lt);
  lx += 200;
  std::vector<std::string> shown = rung_order();
  for (const std::string& r : present) {
    if (std::find(shown.begin(), shown.end(), r) == shown.end()) shown.push_back(r);
  }
  for (const std::string& r : shown) {
    if (!present.count(r)) continue;
    svg.rect(lx, ly - 7, 22, 14, Style{"#333333", rung_colour(r), 0.5});
    svg.text(lx + 28, ly, r, lt);
    lx += 48 + 6.8 * static_cast<double>(r.size());
  }
  return svg.str();
}

std::string trace_section(const TraceInput& t, int n, const KeyLabels& key_labels) {
  std::string s = fmt::format("<h3 id=\"trace-{}\">{}</h3>", n, esc(t.path));
  std::vector<const TraceCallGroup*> rows;
  double top_level_us = 0;
  int64_t calls = 0;
  for (const TraceCallGroup& g : t.groups) {
    rows.push_back(&g);
    top_level_us += g.total_us - g.nested_us;
    calls += g.calls;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TraceCallGroup* a, const TraceCallGroup* b) {
    return a->total_us > b->total_us;
  });
  constexpr size_t kChartRows = 40;
  s += fmt::format(
      "<p>{} op calls in {} groups (op, key, config, rung); {} ms in top-level calls{}. Shares "
      "are of that time: a call made inside another op's implementation is also inside the "
      "outer call's time.</p>",
      calls, rows.size(), num(top_level_us / 1e3),
      t.device_kind.empty() ? "" : ", recorded on device kind " + esc(t.device_kind));
  const std::vector<const TraceCallGroup*> charted(
      rows.begin(), rows.begin() + static_cast<long>(std::min(rows.size(), kChartRows)));
  s += chart([&] { return trace_svg(t, charted, top_level_us, key_labels); });
  if (rows.size() > kChartRows) {
    s += fmt::format(
        "<p class=\"muted\">The chart shows the {} groups that took longest; the "
        "table has all {}.</p>",
        kChartRows, rows.size());
  }
  Table tb{
      {"op", "key", "config", "rung", "calls", "nested calls", "total ms", "mean us", "share %"},
      {false, false, false, false, true, true, true, true, true},
      {}};
  for (const TraceCallGroup* g : rows) {
    tb.add({esc(g->op), json_code(g->key), json_code(g->config), esc(g->rung),
            std::to_string(g->calls), std::to_string(g->nested_calls), num(g->total_us / 1e3),
            num(g->calls ? g->total_us / static_cast<double>(g->calls) : 0),
            num(top_level_us > 0 ? 100 * (g->total_us - g->nested_us) / top_level_us : 0, 3)});
  }
  s += tb.html("Every op, key and config in the trace, longest first");
  std::map<std::string, std::tuple<int64_t, int64_t, double>> by_rung;  // keys, calls, us
  for (const TraceCallGroup& g : t.groups) {
    auto& [keys, c, us] = by_rung[g.rung];
    ++keys;
    c += g.calls;
    us += g.total_us;
  }
  Table rt{{"rung", "groups", "calls", "total ms"}, {false, true, true, true}, {}};
  for (const auto& [rung, v] : by_rung) {
    rt.add({esc(rung), std::to_string(std::get<0>(v)), std::to_string(std::get<1>(v)),
            num(std::get<2>(v) / 1e3)});
  }
  s += rt.html("Calls by the rung of the resolution ladder that chose their config");
  return s;
}

// ---------------------------------------------------------------- the page

const char* kCss = R"(
body{font-family:"DejaVu Sans",Arial,Helvetica,sans-serif;margin:0 auto;max-width:1140px;
padding:12px 20px 40px;color:#1a1a1a;background:#ffffff;font-size:14px;line-height:1.4}
h1{font-size:24px;margin:8px 0 4px}
h2{font-size:20px;border-bottom:2px solid #1b2a5c;padding-bottom:3px;margin:32px 0 8px}
h3{font-size:16px;margin:26px 0 6px;word-break:break-all}
table{border-collapse:collapse;margin:8px 0 18px;font-size:12px;width:100%}
caption{caption-side:top;text-align:left;font-weight:bold;padding:4px 0}
th,td{border:1px solid #cccccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eceff4}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{font-family:"DejaVu Sans Mono",monospace;font-size:11px;overflow-wrap:break-word}
code.j{word-break:break-all}
.scroll{overflow-x:auto}
.warn{border:2px solid #8e1b3d;background:#fbeff2;padding:6px 12px}
.muted{color:#505050}
.chart{overflow-x:auto;margin:6px 0}
svg{max-width:100%;height:auto;display:block;font-family:"DejaVu Sans",Arial,sans-serif}
nav a{margin-right:14px}
)";

std::string page(const Loaded& l, const About& about) {
  std::string h;
  h += "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head>"
       "<meta charset=\"utf-8\"/>"
       // Nothing may be fetched: no scripts, fonts, images or styles from anywhere.
       "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
       "style-src 'unsafe-inline'\"/>"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>"
       "<title>tokamax report</title><style>";
  h += kCss;
  h += "</style></head><body>";
  h += "<h1>tokamax report</h1>";
  h += "<p class=\"muted\">Made " + esc(about.created) + " by tokamax " + esc(library_version()) +
       ": " + code(about.command) + "</p>";
  h += "<nav><a href=\"#summary\">Summary</a><a href=\"#roofline\">Roofline</a>"
       "<a href=\"#tuning\">Tuned keys</a><a href=\"#trace\">Trace</a></nav>";

  // --- summary
  h += "<h2 id=\"summary\">Summary</h2>";
  if (!l.skipped.empty()) {
    h += "<div class=\"warn\"><p><b>Skipped inputs</b>: these files could not be used; the "
         "report shows the rest.</p><ul>";
    for (const auto& [path, why] : l.skipped) h += "<li>" + code(path) + ": " + esc(why) + "</li>";
    h += "</ul></div>";
  }
  Table in{{"input", "kind", "device kind", "device", "threads", "tokamax", "created", "command"},
           {false, false, false, false, true, false, false, false},
           {}};
  auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : esc(s); };
  for (const ResultInput& r : l.results) {
    in.add({code(r.path), fmt::format("autotuning result ({} keys)", r.result.data().size()),
            esc(r.result.device_kind()), "-", "-", esc(r.result.tokamax_version()),
            or_dash(r.created), r.command.empty() ? "-" : code(r.command)});
  }
  for (const BenchInput& b : l.benches) {
    in.add({code(b.path), fmt::format("benchmark ({} rows)", b.rows.size()), or_dash(b.device_kind),
            or_dash(b.model), b.ceilings.threads ? std::to_string(b.ceilings.threads) : "-",
            or_dash(b.version), or_dash(b.created), b.command.empty() ? "-" : code(b.command)});
  }
  for (const TraceInput& t : l.traces) {
    in.add({code(t.path), fmt::format("trace ({} op groups)", t.groups.size()),
            or_dash(t.device_kind), "-", "-", "-", "-", "-"});
  }
  h += in.html("Inputs");
  if (!l.benches.empty()) {
    Table c{{"bench file", "threads", "f32 FMA GFLOP/s", "bf16 dot GFLOP/s", "memory read GB/s",
             "memory copy GB/s", "source"},
            {false, true, true, true, true, true, false},
            {}};
    for (const BenchInput& b : l.benches) {
      const Ceilings& k = b.ceilings;
      auto v = [](double x) { return x > 0 ? num(x) : std::string("-"); };
      c.add({code(b.path), k.threads ? std::to_string(k.threads) : "-", v(k.f32),
             v(k.bf16) + (k.bf16 > 0 && !k.bf16_unit.empty() ? " (" + esc(k.bf16_unit) + ")" : ""),
             v(k.read), v(k.copy),
             k.from_rows ? "highest ceiling of its rows" : "tokamax device --roofline, same run"});
    }
    h += c.html("Roofline ceilings (measured on all threads)");
  }

  // Tuned keys, gathered once: the summary table and the sections below use the same views.
  KeyLabels key_labels;
  for (const ResultInput& r : l.results) {
    for (const auto& [b, d] : r.result.data()) key_labels.add(b.family(), b.arguments());
  }
  for (const TraceInput& t : l.traces) {
    for (const TraceCallGroup& g : t.groups) key_labels.add_key_text(g.op, g.key);
  }
  std::vector<KeyView> keys;
  for (const ResultInput& r : l.results) {
    for (const auto& [b, d] : r.result.data()) {
      keys.push_back(view_of(r, b, d));
      keys.back().label = key_labels.label(b.family(), b.arguments());
    }
  }
  if (!keys.empty()) {
    Table k{{"op/implementation", "key", "candidates", "failed", "winner", "winner ms",
             "heuristics ms", "winner vs heuristics"},
            {false, false, true, true, false, true, true, true},
            {}};
    for (size_t i = 0; i < keys.size(); ++i) {
      const KeyView& v = keys[i];
      const std::string link =
          fmt::format("<a href=\"#{}\">{}</a>", key_anchor(static_cast<int>(i)), esc(v.label));
      k.add({esc(v.bound->family() + "/" + v.bound->implementation()), link,
             std::to_string(v.ok.size() + v.failed.size()), std::to_string(v.failed.size()),
             v.winner.empty() ? "-" : json_code(v.winner),
             v.winner.empty() ? "-" : num(v.data->entries().at(v.winner).benchmark->median_ms),
             v.heur() ? num(v.heur()->b->median_ms) : "-", esc(speedup_text(v))});
    }
    h += k.html("Tuned keys");
  }

  // --- roofline
  h += "<h2 id=\"roofline\">Roofline</h2>";
  if (l.benches.empty()) h += "<p class=\"muted\">No benchmark file given (--bench).</p>";
  for (size_t i = 0; i < l.benches.size(); ++i)
    h += bench_section(l.benches[i], static_cast<int>(i));

  // --- tuned keys
  h += "<h2 id=\"tuning\">Tuned keys</h2>";
  if (keys.empty()) {
    h += "<p class=\"muted\">No autotuning result given.</p>";
  } else {
    h += "<p class=\"muted\">Per key, every candidate config the autotuner measured, fastest "
         "first. Candidates are measured in interleaved rounds against the heuristics config "
         "with successive halving; a median is the candidate's median ratio to the heuristics "
         "config times that config's quiet time, and the finalists reached the last stage. The "
         "stored winner is the best finalist when it is confidently faster than the heuristics "
         "config (else the heuristics config); within the tie window the candidate with the "
         "least scratch memory wins.</p>";
  }
  for (size_t i = 0; i < keys.size(); ++i) h += key_section(keys[i], static_cast<int>(i));

  // --- trace
  h += "<h2 id=\"trace\">Trace</h2>";
  if (l.traces.empty()) h += "<p class=\"muted\">No trace given (--trace).</p>";
  for (size_t i = 0; i < l.traces.size(); ++i)
    h += trace_section(l.traces[i], static_cast<int>(i), key_labels);

  h += "</body></html>\n";
  return h;
}

}  // namespace

Report build_report(const Inputs& inputs, const About& about) {
  if (inputs.results.empty() && inputs.benches.empty() && inputs.traces.empty()) {
    throw InvalidArgument(
        "report: no input; give autotuning result files, --bench files or --trace files");
  }
  const Loaded l = load_all(inputs);
  Report r;
  for (const auto& [path, why] : l.skipped) r.skipped.push_back("'" + path + "': " + why);
  r.used = static_cast<int>(l.results.size() + l.benches.size() + l.traces.size());
  if (r.used == 0) {
    throw InvalidArgument("report: none of the inputs can be used:\n  " + join(r.skipped, "\n  "));
  }
  r.html = page(l, about);
  return r;
}

}  // namespace tokamax::report
