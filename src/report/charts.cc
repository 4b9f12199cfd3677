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
  std::set<std::string> seen;  // (a file may name any number of implementations)
  for (const auto& r : rows) {
    if (r.plotted() && seen.insert(r.implementation).second) names.push_back(r.implementation);
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

constexpr double kMarkerSize = 11;
constexpr char kRoofColour[] = "#444444";

// The roofs, each with its own line style: solid and long dashes for the compute roofs, dots and
// dash-dots for the memory ones, so that no two share a look (in print too).
std::vector<RoofLine> roofs_of(const Ceilings& c) {
  std::vector<RoofLine> out;
  if (c.f32 > 0) out.push_back({"f32 FMA", c.f32, false, ""});
  if (c.bf16 > 0)
    out.push_back({c.bf16_unit == "amx" ? "bf16 AMX" : "bf16 dot", c.bf16, false, "10 4"});
  if (c.read > 0) out.push_back({"memory read", c.read, true, "2 3"});
  if (c.copy > 0) out.push_back({"memory copy", c.copy, true, "10 3 2 3"});
  return out;
}

std::string roof_text(const RoofLine& r) {
  return fmt::format("{} {} {}", r.name, format_number(r.value), r.memory ? "GB/s" : "GFLOP/s");
}

// The roofline plot's domains (whole decades, both axes logarithmic) and its highest compute
// roof: every point, roof and ridge point fits.
struct RooflineDomain {
  double x_lo, x_hi, y_lo, y_hi;
  double top;  // the highest compute roof (GFLOP/s), 0 when there is none
};

RooflineDomain roofline_domain(const std::vector<BenchRowIn>& rows,
                               const std::vector<RoofLine>& roofs) {
  double x_lo = 1e300, x_hi = 0, y_lo = 1e300, y_hi = 0, top = 0, slowest_mem = 1e300;
  for (const BenchRowIn& r : rows) {
    if (!r.plotted()) continue;
    x_lo = std::min(x_lo, r.intensity());
    x_hi = std::max(x_hi, r.intensity());
    y_lo = std::min(y_lo, r.gflops);
    y_hi = std::max(y_hi, r.gflops);
  }
  for (const RoofLine& c : roofs) {
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

struct RooflineGeometry {
  RooflineDomain d;
  Frame f;
  Scale x, y;
};

constexpr double kRooflineHeight = 600;

RooflineGeometry geometry_of(const BenchInput& b, const std::vector<RoofLine>& roofs) {
  const RooflineDomain d = roofline_domain(b.rows, roofs);
  const Frame f{90, 30, kChartWidth - 250, kRooflineHeight - 70};
  return {d, f, Scale::log10(d.x_lo, d.x_hi, f.left, f.right),
          Scale::log10(d.y_lo, d.y_hi, f.bottom, f.top)};
}

// Each roof's segment, clipped to the plot: a compute roof is flat from where the fastest
// memory roof reaches it; a memory roof rises until the highest compute roof.
void place_roofs(const RooflineGeometry& g, std::vector<RoofLine>& roofs) {
  const RooflineDomain& d = g.d;
  double fastest_mem = 0;
  for (const RoofLine& c : roofs)
    fastest_mem = c.memory ? std::max(fastest_mem, c.value) : fastest_mem;
  for (RoofLine& c : roofs) {
    if (!c.memory) {
      if (!g.y.contains(c.value)) continue;
      const double from = fastest_mem > 0 ? std::max(d.x_lo, c.value / fastest_mem) : d.x_lo;
      c.x0 = g.x(from);
      c.x1 = g.f.right;
      c.y0 = c.y1 = g.y(c.value);
    } else {
      // y = intensity * bandwidth, from the left edge (or the bottom) up to the top roof.
      const double x0 = std::max(d.x_lo, d.y_lo / c.value);
      double x1 = d.top > 0 ? std::min(d.x_hi, d.top / c.value) : d.x_hi;
      x1 = std::min(x1, d.y_hi / c.value);
      if (x1 <= x0) continue;
      c.x0 = g.x(x0);
      c.y0 = g.y(x0 * c.value);
      c.x1 = g.x(x1);
      c.y1 = g.y(x1 * c.value);
    }
    c.drawn = c.x1 > c.x0;
  }
}

// Greedy label placement: the first candidate position whose box stays in the plot, covers no
// label placed before and no marker, and (when `avoid_lines`) is crossed by no roof.
class Placer {
 public:
  Placer(const Frame& f, const RooflineLayout& l)
      : area_{f.left + 2, f.top + 2, f.right - 2, f.bottom - 2}, l_(l) {}

  bool free(const Box& b, bool avoid_lines) const {
    if (!b.inside(area_)) return false;
    for (const Box& m : l_.markers) {
      if (b.overlaps(m)) return false;
    }
    for (const PlacedLabel& p : l_.roof_labels) {
      if (b.overlaps(p.box)) return false;
    }
    for (const PlacedLabel& p : l_.point_labels) {
      if (b.overlaps(p.box)) return false;
    }
    if (avoid_lines) {
      for (const RoofLine& r : l_.roofs) {
        if (r.drawn && crosses(b, r.x0, r.y0, r.x1, r.y1)) return false;
      }
    }
    return true;
  }

 private:
  Box area_;
  const RooflineLayout& l_;
};

PlacedLabel label_at(double x, double y, const std::string& text, const TextStyle& t) {
  return {text, text_box(x, y, text, t), x, y, t};
}

// Roof labels: a compute roof's above or below its line, from the right end leftwards; a memory
// roof's above-left or below-right of a point on its line, from a third of the way up. A roof
// whose label finds no free place is named in the legend only (the legend names every roof).
void place_roof_labels(const RooflineGeometry& g, RooflineLayout& l) {
  TextStyle t;
  t.size = 12;
  t.fill = "#333333";
  const Placer placer(g.f, l);
  for (const RoofLine& r : l.roofs) {
    if (!r.drawn) continue;
    const std::string text = roof_text(r);
    const double h = 1.2 * t.size;
    std::vector<PlacedLabel> candidates;
    if (!r.memory) {
      TextStyle e = t;
      e.anchor = TextStyle::Anchor::kEnd;
      for (double right = r.x1 - 6; right - text_width(text, e) > r.x0; right -= 40) {
        candidates.push_back(label_at(right, r.y0 - 3 - h / 2, text, e));
        candidates.push_back(label_at(right, r.y0 + 3 + h / 2, text, e));
      }
    } else {
      TextStyle e = t, s = t;
      e.anchor = TextStyle::Anchor::kEnd;
      for (double at : {0.33, 0.45, 0.22, 0.58, 0.12, 0.7, 0.82, 0.05, 0.92}) {
        const double px = r.x0 + (r.x1 - r.x0) * at, py = r.y0 + (r.y1 - r.y0) * at;
        candidates.push_back(label_at(px - 4, py - 4 - h / 2, text, e));
        candidates.push_back(label_at(px + 4, py + 4 + h / 2, text, s));
      }
    }
    for (const PlacedLabel& c : candidates) {
      if (placer.free(c.box, true)) {
        l.roof_labels.push_back(c);
        break;
      }
    }
  }
}

// Points' numbers: beside the marker, then above or below it, then further out; first where no
// roof crosses the number, then anywhere free. A number with no free place is left out (the
// point's tooltip and the tables name its spec) and counted.
void place_point_labels(const RooflineGeometry& g, const std::vector<std::string>& texts,
                        RooflineLayout& l) {
  TextStyle t;
  t.size = 11;
  t.bold = true;
  const Placer placer(g.f, l);
  // Each place tried is checked against every label and marker: past a few hundred points the
  // numbers would cost time quadratic in the rows, and could not be read anyway.
  constexpr size_t kMaxLabelledPoints = 400;
  if (l.point_rows.size() > kMaxLabelledPoints) {
    l.unlabelled = static_cast<int>(l.point_rows.size());
    return;
  }
  for (size_t i = 0; i < l.point_rows.size(); ++i) {
    const Box& m = l.markers[i];
    const double px = (m.x0 + m.x1) / 2, py = (m.y0 + m.y1) / 2;
    const std::string& text = texts[i];
    TextStyle s = t, e = t, c = t;
    e.anchor = TextStyle::Anchor::kEnd;
    c.anchor = TextStyle::Anchor::kMiddle;
    const std::vector<PlacedLabel> candidates = {
        label_at(m.x1 + 2, py, text, s),      label_at(m.x0 - 2, py, text, e),
        label_at(m.x1 + 1, py - 11, text, s), label_at(m.x1 + 1, py + 11, text, s),
        label_at(m.x0 - 1, py - 11, text, e), label_at(m.x0 - 1, py + 11, text, e),
        label_at(px, m.y0 - 8, text, c),      label_at(px, m.y1 + 8, text, c),
        label_at(m.x1 + 2, py - 22, text, s), label_at(m.x1 + 2, py + 22, text, s),
        label_at(m.x1 + 16, py, text, s),     label_at(m.x0 - 16, py, text, e),
        label_at(m.x0 - 2, py - 22, text, e), label_at(m.x0 - 2, py + 22, text, e)};
    bool placed = false;
    for (bool avoid_lines : {true, false}) {
      for (const PlacedLabel& cand : candidates) {
        if (placer.free(cand.box, avoid_lines)) {
          l.point_labels.push_back(cand);
          placed = true;
          break;
        }
      }
      if (placed) break;
    }
    if (!placed) ++l.unlabelled;
  }
}

RooflineLayout layout_with(const RooflineGeometry& g, const BenchInput& b,
                           const std::vector<int>& spec_index) {
  RooflineLayout l;
  l.roofs = roofs_of(b.ceilings);
  place_roofs(g, l.roofs);
  std::vector<std::string> texts;
  const double r = kMarkerSize / 2 * 1.25;  // the largest shape's reach (a diamond's 1.2 r)
  for (size_t i = 0; i < b.rows.size(); ++i) {
    if (!b.rows[i].plotted()) continue;
    const double px = g.x(b.rows[i].intensity()), py = g.y(b.rows[i].gflops);
    l.markers.push_back({px - r, py - r, px + r, py + r});
    l.point_rows.push_back(i);
    texts.push_back(std::to_string(spec_index[i]));
  }
  place_roof_labels(g, l);
  place_point_labels(g, texts, l);
  return l;
}

void draw_roofs(Svg& svg, const RooflineLayout& l) {
  for (const RoofLine& r : l.roofs) {
    if (!r.drawn) continue;
    svg.open_group({{"class", "roof"}, {"data-roof", r.name}});
    svg.line(r.x0, r.y0, r.x1, r.y1, Style{kRoofColour, "none", 2, r.dash});
    svg.close_group();
  }
  for (const PlacedLabel& p : l.roof_labels) svg.text(p.x, p.y, p.text, p.style);
}

void draw_points(Svg& svg, const RooflineLayout& l, const BenchInput& b,
                 const std::map<std::string, SeriesStyle>& styles,
                 const std::vector<int>& spec_index) {
  for (size_t k = 0; k < l.point_rows.size(); ++k) {
    const size_t i = l.point_rows[k];
    const BenchRowIn& r = b.rows[i];
    const SeriesStyle& s = styles.at(r.implementation);
    const Box& m = l.markers[k];
    svg.marker(s.marker, (m.x0 + m.x1) / 2, (m.y0 + m.y1) / 2, kMarkerSize, marker_style(s),
               fmt::format("#{} {} / {}: {} FLOP/byte, {} GFLOP/s", spec_index[i], r.spec,
                           r.implementation, num(r.intensity()), num(r.gflops)));
  }
  for (const PlacedLabel& p : l.point_labels) svg.text(p.x, p.y, p.text, p.style);
}

// Legend: one entry per implementation row name, then the roofs with their values.
void draw_roofline_legend(Svg& svg, const Frame& f, const std::vector<std::string>& order,
                          const std::map<std::string, SeriesStyle>& styles,
                          const RooflineLayout& l) {
  double ly = f.top + 10;
  const double lx = f.right + 24;
  const double room = kChartWidth - lx - 24;  // for an entry's text
  TextStyle legend;
  legend.size = 12;
  TextStyle heading = legend;
  heading.bold = true;
  svg.text(lx - 6, ly, "implementation", heading);
  ly += 20;
  // As many implementations as leave room for the roofs below them (a bench run has a few).
  constexpr size_t kMaxEntries = 12;
  for (size_t i = 0; i < order.size() && i < kMaxEntries; ++i) {
    const std::string& name = order[i];
    const SeriesStyle& s = styles.at(name);
    svg.marker(s.marker, lx + 6, ly, kMarkerSize, marker_style(s));
    const std::string shown = fit_text(name, legend, room - 20);
    svg.text(lx + 20, ly, shown, legend, shown == name ? "" : name);
    ly += 20;
  }
  if (order.size() > kMaxEntries) {
    svg.text(lx + 20, ly, fmt::format("and {} more", order.size() - kMaxEntries), legend);
    ly += 20;
  }
  ly += 10;
  svg.text(lx - 6, ly, "ceilings (all threads)", heading);
  ly += 20;
  for (const RoofLine& r : l.roofs) {
    svg.line(lx, ly, lx + 28, ly, Style{kRoofColour, "none", 2, r.dash});
    svg.text(lx + 36, ly, roof_text(r), legend);
    ly += 20;
  }
  TextStyle note = legend;
  note.size = 11;
  note.fill = "#555555";
  svg.text(lx - 6, ly + 8, "numbers: specs (the # column", note);
  svg.text(lx - 6, ly + 24, "of the headline table)", note);
}

}  // namespace

RooflineLayout roofline_layout(const BenchInput& b, const std::vector<int>& spec_index) {
  return layout_with(geometry_of(b, roofs_of(b.ceilings)), b, spec_index);
}

std::string roofline_svg(const BenchInput& b, const std::vector<int>& spec_index, int* unlabelled) {
  std::vector<std::string> order;
  const auto styles = series_styles(b.rows, &order);
  const RooflineGeometry g = geometry_of(b, roofs_of(b.ceilings));
  const RooflineLayout l = layout_with(g, b, spec_index);
  if (unlabelled) *unlabelled = l.unlabelled;
  Svg svg(kChartWidth, kRooflineHeight, "Roofline of " + b.path);
  draw_axes(svg, g.f, g.x, g.y, "arithmetic intensity (FLOP/byte)", "achieved GFLOP/s");
  draw_roofs(svg, l);
  draw_points(svg, l, b, styles, spec_index);
  draw_roofline_legend(svg, g.f, order, styles, l);
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

// The legend below the trace's plot: the rungs present, in ladder order, from the chart's left
// edge, on as many lines as they need. Returns the height it takes.
double draw_rung_legend(Svg* svg, const Frame& f, const std::vector<const TraceCallGroup*>& rows) {
  std::set<std::string> present;
  for (const TraceCallGroup* g : rows) present.insert(g->rung);
  TextStyle lt;
  lt.size = 12;
  const std::string title = "rung that chose the config:";
  double lx = 24 + text_width(title, lt) + 12, ly = f.bottom + 26;
  if (svg) svg->text(24, ly, title, lt);
  std::vector<std::string> shown = rung_order();
  for (const std::string& r : present) {
    if (std::find(shown.begin(), shown.end(), r) == shown.end()) shown.push_back(r);
  }
  for (const std::string& r : shown) {
    if (!present.count(r)) continue;
    const std::string name = fit_text(r, lt, 200);  // a rung name from the file may be any text
    const double w = 28 + text_width(name, lt) + 16;
    if (lx + w > kChartWidth - 8) {
      lx = 24;
      ly += 20;
    }
    if (svg) {
      svg->rect(lx, ly - 7, 22, 14, Style{"#333333", rung_colour(r), 0.5});
      svg->text(lx + 28, ly, name, lt, name == r ? "" : r);
    }
    lx += w;
  }
  return ly - f.bottom + 20;
}

}  // namespace

std::string trace_svg(const TraceInput& t, const std::vector<const TraceCallGroup*>& rows,
                      double top_level_us, const KeyLabels& key_labels) {
  const double row_h = 22, bar_h = 14;
  const auto [label, tag] = bar_row_styles();
  // The tags after the bars set the right margin; the labels take what is left, up to a limit.
  std::vector<std::string> labels, tags;
  double tag_px = 0, label_px = 120;
  for (const TraceCallGroup* g : rows) {
    const double share = top_level_us > 0 ? 100 * (g->total_us - g->nested_us) / top_level_us : 0;
    labels.push_back(g->op + " " + key_labels.label_of_key_text(g->op, g->key));
    tags.push_back(fit_text(fmt::format("{} ms, {}%, {} calls, {}", num(g->total_us / 1e3, 3),
                                        num(share, 3), g->calls, g->rung),
                            tag, 320));
    tag_px = std::max(tag_px, text_width(tags.back(), tag));
    label_px = std::max(label_px, text_width(labels.back(), label));
  }
  const double right = kChartWidth - tag_px - 24;
  label_px = std::min({label_px, kMaxLabelWidth, right - kMinPlotWidth - 32});
  Frame f{24 + label_px + 8, 56, right, 56 + row_h * static_cast<double>(rows.size()) + 6};
  const double height = f.bottom + draw_rung_legend(nullptr, f, rows) + 24;
  double hi = 0;
  for (const TraceCallGroup* g : rows) hi = std::max(hi, g->total_us / 1e3);
  const auto [lo_d, hi_d] = nice_domain(0, hi * 1.02, value_ticks(f));
  const Scale x = Scale::linear(lo_d, hi_d, f.left, f.right);
  Svg svg(kChartWidth, height, "Time per op and key in " + t.path);
  draw_value_axis(svg, f, x, "time in the trace (ms), all calls", true, value_ticks(f));
  for (size_t i = 0; i < rows.size(); ++i) {
    const TraceCallGroup& g = *rows[i];
    const double cy = f.top + row_h * (static_cast<double>(i) + 0.5) + 3;
    row_label(svg, f.left - 8, cy, labels[i], label, label_px);
    svg.rect(f.left, cy - bar_h / 2, x(g.total_us / 1e3) - f.left, bar_h,
             Style{"#333333", rung_colour(g.rung), 0.5},
             fmt::format("{} {}: {} calls, {} ms, rung {}, config {}", g.op, g.key, g.calls,
                         num(g.total_us / 1e3), g.rung, g.config));
    svg.text(x(g.total_us / 1e3) + 8, cy, tags[i], tag);
  }
  draw_rung_legend(&svg, f, rows);
  return svg.str();
}

}  // namespace tokamax::report::internal
