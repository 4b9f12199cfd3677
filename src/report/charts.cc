// The report's charts: the roofline of a bench document, the candidates of a tuned key and the
// time per op and key of a trace. Colours and markers are chosen so that charts stay readable
// when printed in grey, and each chart's tooltips carry the figures behind every mark.
#include "report/charts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <set>
#include <utility>

#include "report/html.h"
#include "report/svg.h"

namespace tokamax::report::internal {
namespace {

constexpr double kChartWidth = 1100;

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

// `s` shortened (ending in "...") until it is at most `px` wide in `t`; the caller puts the full
// text in the label's tooltip when it was shortened.
std::string fit_text(const std::string& s, const TextStyle& t, double px) {
  if (text_width(s, t) <= px || s.size() <= 4) return s;
  size_t lo = 4, hi = s.size();  // the longest clip that fits lies in [lo, hi)
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (text_width(clip(s, mid), t) <= px ? lo : hi) = mid;
  }
  return clip(s, lo);
}

// A row label drawn at x, cut to `px` with the full text as its tooltip.
void row_label(Svg& svg, double x, double y, const std::string& s, const TextStyle& t, double px) {
  const std::string shown = fit_text(s, t, px);
  svg.text(x, y, shown, t, shown == s ? "" : s);
}

// Ticks on a bar chart's value axis: about one per 80 pixels, so their labels stay apart.
int value_ticks(const Frame& f) { return std::max(3, static_cast<int>((f.right - f.left) / 80)); }

// A bar chart keeps this much room for its plot between the row labels and the tags after the
// bars, and gives its row labels at most kMaxLabelWidth.
constexpr double kMinPlotWidth = 300;
constexpr double kMaxLabelWidth = 520;

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

// The roofline plot's domains (whole decades, both axes logarithmic) and its highest compute
// roof: every point, roof and ridge point fits.
struct RooflineDomain {
  double x_lo, x_hi, y_lo, y_hi;
  double top;  // the highest compute roof (GFLOP/s), 0 when there is none
};

RooflineDomain roofline_domain(const std::vector<BenchRowIn>& rows,
                               const std::vector<Ceiling>& ceils) {
  double x_lo = 1e300, x_hi = 0, y_lo = 1e300, y_hi = 0, top = 0, slowest_mem = 1e300;
  for (const BenchRowIn& r : rows) {
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
  return {xd_lo, xd_hi, yd_lo, yd_hi, top};
}

// Ceilings: a compute roof is flat from where the fastest memory roof reaches it; a memory
// roof rises until the highest compute roof. Each is clipped to the plot.
void draw_roofs(Svg& svg, const Frame& f, const Scale& x, const Scale& y, const RooflineDomain& d,
                const std::vector<Ceiling>& ceils) {
  const double xd_lo = d.x_lo, xd_hi = d.x_hi, yd_lo = d.y_lo, yd_hi = d.y_hi, top = d.top;
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
}

// Points, each labelled with its spec's number; a label moves up or down when it would
// cover one already placed.
void draw_points(Svg& svg, const Scale& x, const Scale& y, const BenchInput& b,
                 const std::map<std::string, SeriesStyle>& styles,
                 const std::vector<int>& spec_index) {
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
}

// Legend: one entry per implementation row name, then the roofs.
void draw_roofline_legend(Svg& svg, const Frame& f, const std::vector<std::string>& order,
                          const std::map<std::string, SeriesStyle>& styles,
                          const std::vector<Ceiling>& ceils) {
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
}

}  // namespace

std::string roofline_svg(const BenchInput& b, const std::vector<int>& spec_index) {
  std::vector<std::string> order;
  const auto styles = series_styles(b.rows, &order);
  const std::vector<Ceiling> ceils = ceilings_of(b.ceilings);
  const RooflineDomain d = roofline_domain(b.rows, ceils);
  const double height = 600;
  const Frame f{90, 30, kChartWidth - 250, height - 70};
  const Scale x = Scale::log10(d.x_lo, d.x_hi, f.left, f.right);
  const Scale y = Scale::log10(d.y_lo, d.y_hi, f.bottom, f.top);
  Svg svg(kChartWidth, height, "Roofline of " + b.path);
  draw_axes(svg, f, x, y, "arithmetic intensity (FLOP/byte)", "achieved GFLOP/s");
  draw_roofs(svg, f, x, y, d, ceils);
  draw_points(svg, x, y, b, styles, spec_index);
  draw_roofline_legend(svg, f, order, styles, ceils);
  return svg.str();
}

// ---------------------------------------------------------------- candidates

namespace {

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

// The legend below the candidates plot, from the chart's left edge (the label column may be
// wide).
void draw_candidates_legend(Svg& svg, const Frame& f, const std::string& stripes_id) {
  double lx = 24;
  const double ly = f.bottom + 26;
  TextStyle lt;
  lt.size = 12;
  auto swatch = [&](const std::string& fill, const std::string& stroke, const std::string& text) {
    svg.rect(lx, ly - 7, 22, 14, Style{stroke, fill, stroke == kHeuristicsColour ? 2.5 : 0.5});
    svg.text(lx + 28, ly, text, lt);
    lx += 28 + text_width(text, lt) + 16;
  };
  swatch(kWinnerColour, "#333333", "winner");
  swatch(kFinalistColour, "#333333", "finalist (measured to the last stage)");
  swatch(kOtherColour, "#333333", "halved away earlier");
  swatch("url(#" + stripes_id + ")", kHeuristicsColour, "heuristics config");
  swatch(kWindowColour, "none", "tie window");
}

}  // namespace

std::string candidates_svg(const KeyView& v, const std::string& id) {
  const auto [label, tag] = bar_row_styles();
  // The tags after the bars set the right margin; the configs take what is left, up to a limit.
  double tag_px = 0, label_px = 60;
  for (const Candidate& c : v.ok) {
    TextStyle t = tag;
    t.bold = c.winner;
    tag_px = std::max(tag_px, text_width(marks(c), t));
    label_px = std::max(label_px, text_width(c.config, label));
  }
  const double right = kChartWidth - tag_px - 24;
  label_px = std::min({label_px, kMaxLabelWidth, right - kMinPlotWidth - 32});
  const double row_h = 20, bar_h = 13;
  const Frame f{24 + label_px + 8, 56, right, 56 + row_h * static_cast<double>(v.ok.size()) + 6};
  const double height = f.bottom + 64;
  double hi = v.best + v.window;
  for (const Candidate& c : v.ok) hi = std::max({hi, c.spread.q3, c.spread.median});
  const auto [lo_d, hi_d] = nice_domain(0, hi * 1.02, value_ticks(f));
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
  draw_value_axis(svg, f, x,
                  "time per call (ms): bar the median, whisker the quartiles (one statistic)", true,
                  value_ticks(f));
  for (size_t i = 0; i < v.ok.size(); ++i) {
    const Candidate& c = v.ok[i];
    const Spread& p = c.spread;
    const double cy = f.top + row_h * (static_cast<double>(i) + 0.5) + 3;
    TextStyle l = label;
    l.bold = c.winner;
    row_label(svg, f.left - 8, cy, c.config, l, label_px);
    // The bar and its whisker, with the figures they show (the tests check that the median lies
    // within its whisker, in the figures and in the drawing).
    svg.open_group({{"class", "candidate"},
                    {"data-median", fmt::format("{}", p.median)},
                    {"data-q1", fmt::format("{}", p.q1)},
                    {"data-q3", fmt::format("{}", p.q3)}});
    const std::string m = marks(c);
    const std::string tip =
        fmt::format("{}: median {} ms, quartiles {} to {} ms, from {}{}", c.config, num(p.median),
                    num(p.q1), num(p.q3), basis_text(p), m.empty() ? "" : " (" + m + ")");
    svg.rect(f.left, cy - bar_h / 2, x(p.median) - f.left, bar_h,
             Style{"#333333", candidate_fill(c), 0.5}, tip);
    if (c.heuristics) {
      // Stripes over the status colour, inside a thick outline: visible at any bar length.
      svg.rect(f.left, cy - bar_h / 2 + 3, x(p.median) - f.left, bar_h - 6,
               Style{"none", "url(#" + stripes_id + ")", 1});
      svg.rect(f.left, cy - bar_h / 2, x(p.median) - f.left, bar_h,
               Style{kHeuristicsColour, "none", 2.5});
    }
    // The interquartile range as a whisker with end caps.
    const Style whisker{"#000000", "none", 1.5};
    svg.line(x(p.q1), cy, x(p.q3), cy, whisker);
    svg.line(x(p.q1), cy - 5, x(p.q1), cy + 5, whisker);
    svg.line(x(p.q3), cy - 5, x(p.q3), cy + 5, whisker);
    svg.close_group();
    if (!m.empty()) {
      TextStyle t = tag;
      t.bold = c.winner;
      svg.text(std::max(x(p.q3), x(p.median)) + 8, cy, m, t);
    }
  }
  draw_candidates_legend(svg, f, stripes_id);
  return svg.str();
}

// ---------------------------------------------------------------- traces

namespace {

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

// The legend below the trace's plot: the rungs present, in ladder order.
void draw_rung_legend(Svg& svg, const Frame& f, const std::vector<const TraceCallGroup*>& rows) {
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
}

}  // namespace

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
  draw_rung_legend(svg, f, rows);
  return svg.str();
}

}  // namespace tokamax::report::internal
