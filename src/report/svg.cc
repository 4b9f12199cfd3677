// The report's SVG writer: scales, ticks, palette, shapes, axes.
#include "report/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tokamax::report {

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the byte there does not start one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = at(i);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b == 0xED) hi = 0x9F;  // U+D800..U+DFFF: surrogates, never characters
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, 0xC0, 0xC1 or 0xF5..0xFF
  }
  if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (at(i + k) < 0x80 || at(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string xml_escape(std::string_view s) {
  // Every string of an input reaches the page through here, and a page that is not well-formed
  // XML is a page an XML reader refuses whole: what comes out is valid UTF-8 made only of
  // characters XML 1.0 allows (its Char production), whatever bytes came in (a file name is
  // any bytes; a JSON string may escape U+FFFF).
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (static_cast<unsigned char>(c) >= 0x80) {
      const size_t n = utf8_sequence_length(s, i);
      if (n == 0) {
        out += kReplacement;  // one per byte that is not part of a well-formed sequence
        ++i;
        continue;
      }
      // U+FFFE and U+FFFF (EF BF BE, EF BF BF) are well-formed UTF-8 but not XML characters.
      const bool not_char =
          n == 3 && s.substr(i, 2) == "\xEF\xBF" && static_cast<unsigned char>(s[i + 2]) >= 0xBE;
      if (not_char)
        out += kReplacement;
      else
        out.append(s.substr(i, n));
      i += n;
      continue;
    }
    ++i;
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab and newline are not allowed in XML 1.0 at all;
        // a label that holds one (a corrupt file) shows '?' instead of breaking the page.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += '?';
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

std::string strip_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Pixel coordinates in attributes: a tenth of a pixel is finer than any screen needs.
std::string px(double v) { return strip_zeros(fmt::format("{:.1f}", v)); }

}  // namespace

std::string format_number(double v, int digits) {
  if (v == 0 || !std::isfinite(v)) return v == 0 ? "0" : fmt::format("{}", v);
  const double a = std::fabs(v);
  if (a >= 1e-4 && a < 1e6) {
    const int mag = static_cast<int>(std::floor(std::log10(a) + 1e-12));
    const int decimals = std::max(0, digits - 1 - mag);
    std::string s = strip_zeros(fmt::format("{:.{}f}", v, decimals));
    return s == "-0" ? "0" : s;
  }
  return fmt::format("{:.{}g}", v, digits);
}

double nice_step(double span, int target) {
  if (!(span > 0) || !std::isfinite(span)) return 1;
  const double raw = span / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double nice = r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10;
  return nice * mag;
}

std::pair<double, double> nice_domain(double lo, double hi, int target) {
  if (lo > hi) std::swap(lo, hi);
  if (hi == lo) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.5;
    lo -= lo == 0 ? 0 : pad;
    hi += pad;
  }
  const double step = nice_step(hi - lo, target);
  return {std::floor(lo / step + 1e-9) * step, std::ceil(hi / step - 1e-9) * step};
}

std::pair<double, double> decade_domain(double lo, double hi) {
  if (!(lo > 0) || !(hi > 0)) throw std::invalid_argument("decade_domain: bounds must be > 0");
  if (lo > hi) std::swap(lo, hi);
  const double a = std::floor(std::log10(lo) + 1e-9);
  double b = std::ceil(std::log10(hi) - 1e-9);
  if (b <= a) b = a + 1;
  return {std::pow(10.0, a), std::pow(10.0, b)};
}

Scale Scale::linear(double lo, double hi, double px_lo, double px_hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi <= lo)
    throw std::invalid_argument(fmt::format("linear scale: bad domain [{}, {}]", lo, hi));
  return Scale(lo, hi, px_lo, px_hi, false);
}

Scale Scale::log10(double lo, double hi, double px_lo, double px_hi) {
  if (!(lo > 0) || !std::isfinite(hi) || hi <= lo)
    throw std::invalid_argument(fmt::format("log scale: bad domain [{}, {}]", lo, hi));
  return Scale(lo, hi, px_lo, px_hi, true);
}

double Scale::operator()(double v) const {
  double t;
  if (log_) {
    t = v > 0 ? (std::log10(v) - std::log10(lo_)) / (std::log10(hi_) - std::log10(lo_))
              : -1e3;  // off the chart, far to the low side
  } else {
    t = (v - lo_) / (hi_ - lo_);
  }
  return px_lo_ + t * (px_hi_ - px_lo_);
}

bool Scale::contains(double v) const {
  const double tol = log_ ? 1e-9 * v : 1e-9 * (hi_ - lo_);
  return v >= lo_ - tol && v <= hi_ + tol;
}

namespace {

std::vector<Tick> linear_ticks(double lo, double hi, int target) {
  const double step = nice_step(hi - lo, target);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  std::vector<Tick> out;
  const double first = std::ceil(lo / step - 1e-9);
  for (int i = 0;; ++i) {
    double v = (first + i) * step;
    if (v > hi + step * 1e-9) break;
    if (std::fabs(v) < step * 1e-9) v = 0;
    std::string label = fmt::format("{:.{}f}", v, decimals);
    out.push_back({v, label == "-0" ? "0" : label, true});
  }
  return out;
}

}  // namespace

std::vector<Tick> Scale::ticks(int target) const {
  if (!log_) return linear_ticks(lo_, hi_, target);
  const double decades = std::log10(hi_) - std::log10(lo_);
  const int k0 = static_cast<int>(std::ceil(std::log10(lo_) - 1e-9));
  const int k1 = static_cast<int>(std::floor(std::log10(hi_) + 1e-9));
  const int powers = k1 - k0 + 1;
  const int every = std::max(1, (powers + target - 1) / std::max(1, target));
  const bool minors = every == 1 && decades <= 8;
  const bool label_2_5 = decades <= 2;
  std::vector<Tick> out;
  for (int k = k0 - 1; k <= k1; ++k) {
    const double p = std::pow(10.0, k);
    if (k >= k0 && (k - k0) % every == 0) out.push_back({p, format_number(p), true});
    if (!minors) continue;
    for (int m = 2; m <= 9; ++m) {
      const double v = m * p;
      if (!contains(v)) continue;
      out.push_back({v, label_2_5 && (m == 2 || m == 5) ? format_number(v) : "", false});
    }
  }
  std::sort(out.begin(), out.end(), [](const Tick& a, const Tick& b) { return a.value < b.value; });
  // A range inside one decade can hold no power of ten and no 2 or 5: round linear ticks then.
  const auto labelled =
      std::count_if(out.begin(), out.end(), [](const Tick& t) { return !t.label.empty(); });
  if (labelled < 2) {
    out.clear();
    for (Tick& t : linear_ticks(lo_, hi_, target)) {
      if (t.value > 0) out.push_back(std::move(t));
    }
  }
  return out;
}

double lightness(std::string_view hex) {
  if (hex.size() != 7 || hex[0] != '#')
    throw std::invalid_argument("lightness: expected #rrggbb, got '" + std::string(hex) + "'");
  auto channel = [&](int i) {
    const double c = std::stoi(std::string(hex.substr(1 + 2 * i, 2)), nullptr, 16) / 255.0;
    return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  const double y = 0.2126 * channel(0) + 0.7152 * channel(1) + 0.0722 * channel(2);
  const double f = y > 216.0 / 24389 ? std::cbrt(y) : (24389.0 / 27 * y + 16) / 116;
  return 116 * f - 16;
}

const std::vector<std::string>& palette() {
  // Navy, wine, blue, orange, green, yellow: hues a colour-blind reader can tell apart too,
  // at lightness 19, 32, 46, 62, 72, 85.
  static const std::vector<std::string> p = {"#1b2a5c", "#8e1b3d", "#2a6fb0",
                                             "#e27b2b", "#5cc4a0", "#eed35a"};
  return p;
}

const char* ink_on(std::string_view hex) { return lightness(hex) < 55 ? "#ffffff" : "#111111"; }

Marker marker_at(size_t i) {
  static constexpr Marker kOrder[] = {Marker::kCircle,  Marker::kSquare,       Marker::kTriangle,
                                      Marker::kDiamond, Marker::kTriangleDown, Marker::kCross};
  return kOrder[i % (sizeof kOrder / sizeof kOrder[0])];
}

namespace {

std::string style_attrs(const Style& s) {
  std::string a = " stroke=\"" + xml_escape(s.stroke) + "\" fill=\"" + xml_escape(s.fill) + "\"";
  if (s.stroke != "none") a += " stroke-width=\"" + px(s.stroke_width) + "\"";
  if (!s.dash.empty()) a += " stroke-dasharray=\"" + xml_escape(s.dash) + "\"";
  if (s.opacity < 1) a += " opacity=\"" + strip_zeros(fmt::format("{:.2f}", s.opacity)) + "\"";
  return a;
}

// A shape element with an optional tooltip (<title> child: browsers show it on hover).
std::string element(std::string_view tag, const std::string& attrs, std::string_view tooltip) {
  if (tooltip.empty()) return fmt::format("<{}{}/>", tag, attrs);
  return fmt::format("<{0}{1}><title>{2}</title></{0}>", tag, attrs, xml_escape(tooltip));
}

std::string points_attr(const std::vector<std::pair<double, double>>& pts) {
  std::string s;
  for (const auto& [x, y] : pts) {
    if (!s.empty()) s += ' ';
    s += px(x) + "," + px(y);
  }
  return s;
}

}  // namespace

Svg::Svg(double width, double height, std::string_view title)
    : width_(width), height_(height), title_(title) {}

void Svg::rect(double x, double y, double w, double h, const Style& s, std::string_view tooltip) {
  if (w < 0) x += w, w = -w;
  if (h < 0) y += h, h = -h;
  body_ += element("rect",
                   " x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" +
                       px(h) + "\"" + style_attrs(s),
                   tooltip);
}

void Svg::line(double x1, double y1, double x2, double y2, const Style& s) {
  body_ += element("line",
                   " x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" +
                       px(y2) + "\"" + style_attrs(s),
                   "");
}

void Svg::polyline(const std::vector<std::pair<double, double>>& points, const Style& s) {
  body_ += element("polyline", " points=\"" + points_attr(points) + "\"" + style_attrs(s), "");
}

void Svg::marker(Marker m, double x, double y, double size, const Style& s,
                 std::string_view tooltip) {
  const double r = size / 2;
  switch (m) {
    case Marker::kCircle:
      body_ +=
          element("circle",
                  " cx=\"" + px(x) + "\" cy=\"" + px(y) + "\" r=\"" + px(r) + "\"" + style_attrs(s),
                  tooltip);
      return;
    case Marker::kSquare:
      return rect(x - r * 0.9, y - r * 0.9, r * 1.8, r * 1.8, s, tooltip);
    case Marker::kTriangle:
    case Marker::kTriangleDown: {
      const double d = m == Marker::kTriangle ? 1 : -1;
      const std::vector<std::pair<double, double>> pts = {{x, y - d * r * 1.15},
                                                          {x + r * 1.05, y + d * r * 0.75},
                                                          {x - r * 1.05, y + d * r * 0.75}};
      body_ += element("polygon", " points=\"" + points_attr(pts) + "\"" + style_attrs(s), tooltip);
      return;
    }
    case Marker::kDiamond: {
      const std::vector<std::pair<double, double>> pts = {
          {x, y - r * 1.2}, {x + r, y}, {x, y + r * 1.2}, {x - r, y}};
      body_ += element("polygon", " points=\"" + points_attr(pts) + "\"" + style_attrs(s), tooltip);
      return;
    }
    case Marker::kCross: {
      // Drawn with the fill colour as its stroke: a cross has no inside.
      Style c = s;
      c.stroke = s.fill != "none" ? s.fill : s.stroke;
      c.fill = "none";
      c.stroke_width = std::max(2.0, s.stroke_width);
      const std::string d = "M" + px(x - r) + "," + px(y - r) + "L" + px(x + r) + "," + px(y + r) +
                            "M" + px(x - r) + "," + px(y + r) + "L" + px(x + r) + "," + px(y - r);
      body_ += element("path", " d=\"" + d + "\"" + style_attrs(c), tooltip);
      return;
    }
  }
}

bool crosses(const Box& b, double x1, double y1, double x2, double y2) {
  // Liang-Barsky: clip the segment's parameter range [0, 1] to the box's open inside.
  double t0 = 0, t1 = 1;
  const double dx = x2 - x1, dy = y2 - y1;
  const double p[4] = {-dx, dx, -dy, dy};
  const double q[4] = {x1 - b.x0, b.x1 - x1, y1 - b.y0, b.y1 - y1};
  for (int i = 0; i < 4; ++i) {
    if (p[i] == 0) {
      if (q[i] <= 0) return false;  // parallel to this edge and not strictly inside it
      continue;
    }
    const double r = q[i] / p[i];
    if (p[i] < 0) {
      t0 = std::max(t0, r);
    } else {
      t1 = std::min(t1, r);
    }
  }
  return t0 < t1;
}

double text_width(std::string_view s, const TextStyle& t) {
  size_t chars = 0;
  for (const char c : s) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // UTF-8 leads
  const double em = t.monospace ? 0.61 : t.bold ? 0.68 : 0.62;
  return static_cast<double>(chars) * em * t.size;
}

Box text_box(double x, double y, std::string_view s, const TextStyle& t) {
  const double w = text_width(s, t);
  const double x0 = t.anchor == TextStyle::Anchor::kStart    ? x
                    : t.anchor == TextStyle::Anchor::kMiddle ? x - w / 2
                                                             : x - w;
  // Ascenders and descenders: the line's height is about 1.2 em.
  const double h = 1.2 * t.size;
  const double y0 = t.middle ? y - h / 2 : y - 0.9 * t.size;
  return {x0, y0, x0 + w, y0 + h};
}

void Svg::open_group(const std::vector<std::pair<std::string, std::string>>& attrs) {
  body_ += "<g";
  for (const auto& [name, value] : attrs) body_ += " " + name + "=\"" + xml_escape(value) + "\"";
  body_ += ">";
}

void Svg::text(double x, double y, std::string_view s, const TextStyle& t,
               std::string_view tooltip) {
  std::string a = " x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(t.size) + "\"";
  if (t.anchor != TextStyle::Anchor::kStart)
    a +=
        t.anchor == TextStyle::Anchor::kMiddle ? " text-anchor=\"middle\"" : " text-anchor=\"end\"";
  if (t.middle) a += " dominant-baseline=\"central\"";
  if (t.bold) a += " font-weight=\"bold\"";
  if (t.monospace) a += " font-family=\"monospace\"";
  a += " fill=\"" + xml_escape(t.fill) + "\"";
  if (t.rotate != 0) a += " transform=\"rotate(" + px(t.rotate) + " " + px(x) + " " + px(y) + ")\"";
  body_ += "<text" + a + ">";
  if (!tooltip.empty()) body_ += "<title>" + xml_escape(tooltip) + "</title>";
  body_ += xml_escape(s) + "</text>";
}

void Svg::stripes(std::string_view id, std::string_view colour) {
  defs_ += "<pattern id=\"" + xml_escape(id) +
           "\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
           "patternTransform=\"rotate(45)\"><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"" +
           xml_escape(colour) + "\" stroke-width=\"4\"/></pattern>";
}

std::string Svg::str() const {
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width_) +
                  "\" height=\"" + px(height_) + "\" viewBox=\"0 0 " + px(width_) + " " +
                  px(height_) + "\" role=\"img\" aria-label=\"" + xml_escape(title_) + "\">";
  s += "<title>" + xml_escape(title_) + "</title>";
  if (!defs_.empty()) s += "<defs>" + defs_ + "</defs>";
  s += body_;
  s += "</svg>";
  return s;
}

namespace {

const Style kFrameStyle{"#777777", "none", 1};
const Style kMajorGrid{"#d9d9d9", "none", 1};
const Style kMinorGrid{"#efefef", "none", 1};
const Style kTickStyle{"#555555", "none", 1};

}  // namespace

void draw_axes(Svg& svg, const Frame& f, const Scale& x, const Scale& y, std::string_view x_title,
               std::string_view y_title, int x_ticks, int y_ticks) {
  TextStyle label;
  label.size = 12;
  label.fill = "#333333";
  for (const Tick& t : x.ticks(x_ticks)) {
    const double px_x = x(t.value);
    svg.line(px_x, f.top, px_x, f.bottom, t.major ? kMajorGrid : kMinorGrid);
    if (t.label.empty()) continue;
    svg.line(px_x, f.bottom, px_x, f.bottom + 5, kTickStyle);
    TextStyle l = label;
    l.anchor = TextStyle::Anchor::kMiddle;
    svg.text(px_x, f.bottom + 15, t.label, l);
  }
  for (const Tick& t : y.ticks(y_ticks)) {
    const double px_y = y(t.value);
    svg.line(f.left, px_y, f.right, px_y, t.major ? kMajorGrid : kMinorGrid);
    if (t.label.empty()) continue;
    svg.line(f.left - 5, px_y, f.left, px_y, kTickStyle);
    TextStyle l = label;
    l.anchor = TextStyle::Anchor::kEnd;
    svg.text(f.left - 8, px_y, t.label, l);
  }
  svg.rect(f.left, f.top, f.right - f.left, f.bottom - f.top, kFrameStyle);
  TextStyle title;
  title.size = 13;
  title.bold = true;
  title.anchor = TextStyle::Anchor::kMiddle;
  svg.text((f.left + f.right) / 2, f.bottom + 38, x_title, title);
  title.rotate = -90;
  svg.text(f.left - 58, (f.top + f.bottom) / 2, y_title, title);
}

void draw_value_axis(Svg& svg, const Frame& f, const Scale& x, std::string_view title, bool top,
                     int ticks) {
  TextStyle label;
  label.size = 12;
  label.fill = "#333333";
  label.anchor = TextStyle::Anchor::kMiddle;
  const double edge = top ? f.top : f.bottom;
  const double dir = top ? -1 : 1;
  for (const Tick& t : x.ticks(ticks)) {
    const double px_x = x(t.value);
    svg.line(px_x, f.top, px_x, f.bottom, t.major ? kMajorGrid : kMinorGrid);
    if (t.label.empty()) continue;
    svg.line(px_x, edge, px_x, edge + dir * 5, kTickStyle);
    svg.text(px_x, edge + dir * 14, t.label, label);
  }
  svg.line(f.left, edge, f.right, edge, kFrameStyle);
  svg.line(f.left, f.top, f.left, f.bottom, kFrameStyle);
  TextStyle t;
  t.size = 13;
  t.bold = true;
  t.anchor = TextStyle::Anchor::kMiddle;
  svg.text((f.left + f.right) / 2, edge + dir * 32, title, t);
}

}  // namespace tokamax::report
