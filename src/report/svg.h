// A small SVG writer for `tokamax report`'s charts: linear and log10 scales with ticks at round
// values, axes with tick labels and units, lines, markers, bars and text, and a palette whose
// colours stay apart when printed in grey. Every string that reaches the output is XML-escaped,
// so labels holding '<', '&' or quotes (configs and keys are JSON) cannot break the document.
// The output is well-formed XML: the report embeds it in an XHTML-compatible page.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tokamax::report {

// `s` with & < > " ' replaced by entities: safe in text and in attribute values. The result is
// valid UTF-8 of XML 1.0 characters only: each byte of an ill-formed UTF-8 sequence (a lone
// surrogate's encoding too) and U+FFFE / U+FFFF become U+FFFD, control characters other than tab
// and newline '?'.
std::string xml_escape(std::string_view s);

// A number as a short label: at most `digits` significant digits, no trailing zeros, no
// exponent between 1e-4 and 1e6 ("0.25", "1200", "3e+07").
std::string format_number(double v, int digits = 3);

struct Tick {
  double value = 0;
  std::string label;  // empty on minor ticks
  bool major = true;
};

// Maps a data interval onto a pixel interval (px_lo for lo, px_hi for hi: pass them reversed
// for a y axis that grows upwards).
class Scale {
 public:
  static Scale linear(double lo, double hi, double px_lo, double px_hi);
  // lo and hi must be > 0.
  static Scale log10(double lo, double hi, double px_lo, double px_hi);

  double operator()(double v) const;
  double lo() const { return lo_; }
  double hi() const { return hi_; }
  double px_lo() const { return px_lo_; }
  double px_hi() const { return px_hi_; }
  bool is_log() const { return log_; }
  bool contains(double v) const;

  // Linear: about `target` ticks at 1, 2 or 5 times a power of ten, all labelled. Log: a
  // labelled tick per power of ten (every k-th when there are more than `target`), minor ticks
  // at 2..9 times each power when the range spans few enough decades to show them, and 2 and 5
  // labelled too when it spans at most two.
  std::vector<Tick> ticks(int target = 6) const;

 private:
  Scale(double lo, double hi, double px_lo, double px_hi, bool log)
      : lo_(lo), hi_(hi), px_lo_(px_lo), px_hi_(px_hi), log_(log) {}
  double lo_, hi_, px_lo_, px_hi_;
  bool log_;
};

// The step of round ticks (1, 2 or 5 times a power of ten) near span / target.
double nice_step(double span, int target);
// [lo, hi] widened to multiples of nice_step(hi - lo, target); a degenerate interval is widened
// around its value first.
std::pair<double, double> nice_domain(double lo, double hi, int target = 6);
// [lo, hi] widened to whole powers of ten (lo, hi > 0).
std::pair<double, double> decade_domain(double lo, double hi);

// The grey level of a colour "#rrggbb": its CIE lightness L* (0 black .. 100 white), which is
// what is left of it in a greyscale print.
double lightness(std::string_view hex);
// Series colours ("#rrggbb"), darkest first, at least kMinGreyStep apart in lightness from one
// another, so series stay apart in grey (markers and dashes differ as well).
const std::vector<std::string>& palette();
constexpr double kMinGreyStep = 10;
// Text colour (black or white) that reads on a background of `hex`.
const char* ink_on(std::string_view hex);

enum class Marker { kCircle, kSquare, kTriangle, kDiamond, kTriangleDown, kCross };
Marker marker_at(size_t i);  // a distinct shape per series index (cycling)

struct Style {
  std::string stroke = "none";
  std::string fill = "none";
  double stroke_width = 1;
  std::string dash;  // stroke-dasharray, e.g. "6 3"
  double opacity = 1;
};

struct TextStyle {
  enum class Anchor { kStart, kMiddle, kEnd } anchor = Anchor::kStart;
  double size = 12;
  bool bold = false;
  bool monospace = false;
  std::string fill = "#222222";
  double rotate = 0;  // degrees, around the anchor point
  // Vertical placement: the y given is the text's middle (else its baseline).
  bool middle = true;
};

// A rectangle in pixels (x0 <= x1, y0 <= y1), for laying out labels so that none covers
// another.
struct Box {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  // Whether the two share some area (touching edges do not count).
  bool overlaps(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
  bool inside(const Box& o) const { return x0 >= o.x0 && x1 <= o.x1 && y0 >= o.y0 && y1 <= o.y1; }
};
// Whether the segment from (x1, y1) to (x2, y2) passes through the inside of `b`.
bool crosses(const Box& b, double x1, double y1, double x2, double y2);

// The width of `s` drawn in `t`, estimated on the generous side from the fonts the page asks
// for (DejaVu Sans, its monospace): per character 0.62 em, bold 0.68, monospace 0.61. Labels
// are laid out with it: a text never reaches further than this.
double text_width(std::string_view s, const TextStyle& t);
// The box that text(x, y, s, t) covers (unrotated text only).
Box text_box(double x, double y, std::string_view s, const TextStyle& t);

// Builds one <svg> element. Coordinates are in pixels of a width x height canvas; the element
// scales down (viewBox) when the page is narrower.
class Svg {
 public:
  Svg(double width, double height, std::string_view title);
  double width() const { return width_; }
  double height() const { return height_; }

  void rect(double x, double y, double w, double h, const Style& s, std::string_view tooltip = "");
  void line(double x1, double y1, double x2, double y2, const Style& s);
  void polyline(const std::vector<std::pair<double, double>>& points, const Style& s);
  void marker(Marker m, double x, double y, double size, const Style& s,
              std::string_view tooltip = "");
  // A tooltip (a <title> child) holds the full text of a label that was shortened to fit.
  void text(double x, double y, std::string_view s, const TextStyle& t = {},
            std::string_view tooltip = "");
  // A group <g> around what is drawn until close_group(), with attributes (names as given,
  // values escaped): a chart marks what a test or a reader may check, e.g. data-median.
  void open_group(const std::vector<std::pair<std::string, std::string>>& attrs);
  void close_group() { body_ += "</g>"; }
  // A diagonal-stripe fill usable as Style::fill = "url(#id)"; transparent between the
  // stripes, so it marks a shape drawn over another without hiding its colour.
  void stripes(std::string_view id, std::string_view colour);
  // Raw markup the caller built from this writer's escaped pieces (a group, say).
  void raw(std::string_view markup) { body_ += markup; }

  std::string str() const;

 private:
  double width_, height_;
  std::string title_, defs_, body_;
};

// A plot's frame: the scales, the plot rectangle they map onto, grid lines, ticks with labels,
// and the axis titles (with units) below and at the left.
struct Frame {
  double left = 0, top = 0, right = 0, bottom = 0;  // the plot rectangle, in pixels
};
void draw_axes(Svg& svg, const Frame& f, const Scale& x, const Scale& y, std::string_view x_title,
               std::string_view y_title, int x_ticks = 8, int y_ticks = 6);
// A horizontal value axis only (bar charts: categories are labelled by the caller), along the
// top or the bottom of the frame, with vertical grid lines.
void draw_value_axis(Svg& svg, const Frame& f, const Scale& x, std::string_view title, bool top,
                     int ticks = 8);

}  // namespace tokamax::report
