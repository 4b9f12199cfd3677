// The report's SVG writer: scales, round and logarithmic ticks, number labels, escaping of
// labels that hold markup characters, the grey-safe palette, shapes.
#include "report/svg.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

namespace tokamax::report {
namespace {

std::vector<std::string> labels(const std::vector<Tick>& ticks) {
  std::vector<std::string> out;
  for (const Tick& t : ticks) {
    if (!t.label.empty()) out.push_back(t.label);
  }
  return out;
}

std::vector<double> values(const std::vector<Tick>& ticks, bool major) {
  std::vector<double> out;
  for (const Tick& t : ticks) {
    if (t.major == major) out.push_back(t.value);
  }
  return out;
}

TEST(XmlEscape, EveryMarkupCharacter) {
  EXPECT_EQ(xml_escape(R"(a<b && "c" 'd'>)"), "a&lt;b &amp;&amp; &quot;c&quot; &#39;d&#39;&gt;");
  EXPECT_EQ(xml_escape("plain {\"kc\":96}"), "plain {&quot;kc&quot;:96}");
  // Characters XML 1.0 does not allow at all become '?'; tab and newline stay.
  EXPECT_EQ(xml_escape(std::string("a\x01"
                                   "b\tc\n",
                                   6)),
            "a?b\tc\n");
  EXPECT_EQ(xml_escape("µs"), "µs");  // UTF-8 passes through
  EXPECT_EQ(xml_escape("\xF0\x9F\x98\x80 \xEF\xBF\xBD \xED\x9F\xBF"),
            "\xF0\x9F\x98\x80 \xEF\xBF\xBD \xED\x9F\xBF");  // U+1F600, U+FFFD, U+D7FF
  // What is not UTF-8, or not an XML character, becomes U+FFFD: each stray byte, each byte of
  // an overlong form or a surrogate's encoding, U+FFFE and U+FFFF.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(xml_escape("a\xFF"
                       "b"),
            "a" + r + "b");
  EXPECT_EQ(xml_escape("a\xE2\x82"), "a" + r + r);   // cut short
  EXPECT_EQ(xml_escape("\xC0\xAF"), r + r);          // overlong '/'
  EXPECT_EQ(xml_escape("\xED\xA0\x80"), r + r + r);  // U+D800
  EXPECT_EQ(xml_escape("\xEF\xBF\xBE\xEF\xBF\xBF<"), r + r + "&lt;");
  EXPECT_EQ(xml_escape("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
}

TEST(Svg, LabelsAndTooltipsAreEscaped) {
  Svg svg(100, 50, "title <&> \"q\"");
  const std::string evil = "</text><script>alert('x')</script> & \"";
  svg.text(10, 10, evil);
  svg.rect(0, 0, 5, 5, Style{"#000000", "#ffffff", 1}, evil);
  svg.marker(Marker::kCircle, 5, 5, 4, Style{}, evil);
  const std::string s = svg.str();
  EXPECT_EQ(s.find("<script"), std::string::npos) << s;
  EXPECT_EQ(s.find("'x'"), std::string::npos) << s;
  const std::string escaped =
      "&lt;/text&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;";
  EXPECT_NE(s.find(">" + escaped + "</text>"), std::string::npos) << s;
  EXPECT_NE(s.find("<title>" + escaped + "</title></rect>"), std::string::npos) << s;
  EXPECT_NE(s.find("<title>" + escaped + "</title></circle>"), std::string::npos) << s;
  EXPECT_NE(s.find("aria-label=\"title &lt;&amp;&gt; &quot;q&quot;\""), std::string::npos) << s;
  // Every element opened is closed: as many '<' as '>' and the root closes last.
  EXPECT_EQ(std::count(s.begin(), s.end(), '<'), std::count(s.begin(), s.end(), '>'));
  EXPECT_EQ(s.rfind("</svg>"), s.size() - 6);
}

TEST(Svg, TextTooltipsAndGroupsAreEscaped) {
  Svg svg(100, 50, "t");
  svg.open_group({{"class", "candidate"}, {"data-median", "1\" onload=\"x"}});
  svg.text(10, 10, "short...", {}, "the full <text> & more");
  svg.close_group();
  const std::string s = svg.str();
  EXPECT_NE(s.find("<g class=\"candidate\" data-median=\"1&quot; onload=&quot;x\">"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("><title>the full &lt;text&gt; &amp; more</title>short...</text></g>"),
            std::string::npos)
      << s;
}

TEST(SvgLayout, TextBoxesFollowTheAnchorAndTheFont) {
  TextStyle t;
  t.size = 10;
  EXPECT_DOUBLE_EQ(text_width("abcd", t), 4 * 0.62 * 10);
  EXPECT_DOUBLE_EQ(text_width("\xC2\xB5s", t), 2 * 0.62 * 10);  // characters, not bytes
  t.monospace = true;
  EXPECT_DOUBLE_EQ(text_width("abcd", t), 4 * 0.61 * 10);
  t.monospace = false;
  t.bold = true;
  EXPECT_GT(text_width("abcd", t), 4 * 0.62 * 10);
  t.bold = false;
  const Box start = text_box(100, 50, "abcd", t);
  EXPECT_DOUBLE_EQ(start.x0, 100);
  EXPECT_DOUBLE_EQ(start.x1, 124.8);
  EXPECT_DOUBLE_EQ(start.y0, 44);  // centred on y: 1.2 em high
  EXPECT_DOUBLE_EQ(start.y1, 56);
  t.anchor = TextStyle::Anchor::kEnd;
  EXPECT_DOUBLE_EQ(text_box(100, 50, "abcd", t).x1, 100);
  t.anchor = TextStyle::Anchor::kMiddle;
  EXPECT_DOUBLE_EQ(text_box(100, 50, "abcd", t).x0, 87.6);
}

TEST(SvgLayout, BoxesOverlapAndSegmentsCross) {
  const Box b{10, 10, 20, 20};
  EXPECT_TRUE(b.overlaps({15, 15, 30, 30}));
  EXPECT_FALSE(b.overlaps({20, 10, 30, 20}));  // touching edges only
  EXPECT_FALSE(b.overlaps({21, 0, 30, 30}));
  EXPECT_TRUE(b.inside({0, 0, 20, 20}));
  EXPECT_FALSE(b.inside({0, 0, 19, 20}));
  EXPECT_TRUE(crosses(b, 0, 0, 30, 30));    // through the middle
  EXPECT_TRUE(crosses(b, 15, 15, 16, 16));  // wholly inside
  EXPECT_TRUE(crosses(b, 0, 15, 30, 15));   // horizontal, through
  EXPECT_FALSE(crosses(b, 0, 10, 30, 10));  // along an edge
  EXPECT_FALSE(crosses(b, 0, 0, 30, 5));    // above
  EXPECT_FALSE(crosses(b, 0, 19, 19, 0));   // passes the corner (10, 10) outside
  EXPECT_TRUE(crosses(b, 0, 35, 35, 0));    // cuts the box (x + y = 35)
  EXPECT_FALSE(crosses(b, 0, 15, 5, 15));   // stops short
}

TEST(Scale, LinearMapsEndsAndMiddleAndCanRunUpwards) {
  const Scale x = Scale::linear(0, 10, 100, 300);
  EXPECT_DOUBLE_EQ(x(0), 100);
  EXPECT_DOUBLE_EQ(x(10), 300);
  EXPECT_DOUBLE_EQ(x(2.5), 150);
  const Scale y = Scale::linear(0, 1, 400, 0);  // a y axis: larger values higher up
  EXPECT_DOUBLE_EQ(y(0), 400);
  EXPECT_DOUBLE_EQ(y(0.75), 100);
  EXPECT_TRUE(x.contains(10));
  EXPECT_FALSE(x.contains(10.5));
  EXPECT_THROW(Scale::linear(1, 1, 0, 10), std::invalid_argument);
  EXPECT_THROW(Scale::linear(0, NAN, 0, 10), std::invalid_argument);
}

TEST(Scale, LogGivesEachDecadeTheSameLength) {
  const Scale x = Scale::log10(1, 1000, 0, 300);
  EXPECT_DOUBLE_EQ(x(1), 0);
  EXPECT_NEAR(x(10), 100, 1e-9);
  EXPECT_NEAR(x(100), 200, 1e-9);
  EXPECT_NEAR(x(std::sqrt(10.0)), 50, 1e-9);
  EXPECT_LT(x(0), -1000);  // no logarithm: far off the chart, not NaN
  EXPECT_THROW(Scale::log10(0, 10, 0, 1), std::invalid_argument);
  EXPECT_THROW(Scale::log10(10, 1, 0, 1), std::invalid_argument);
}

TEST(Ticks, LinearTicksAreRoundAndLabelledToTheirStep) {
  EXPECT_EQ(labels(Scale::linear(0, 1, 0, 100).ticks(5)),
            (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));
  EXPECT_EQ(labels(Scale::linear(0, 97, 0, 100).ticks(5)),
            (std::vector<std::string>{"0", "20", "40", "60", "80"}));
  EXPECT_EQ(labels(Scale::linear(-0.011, 0.011, 0, 100).ticks(4)),
            (std::vector<std::string>{"-0.010", "-0.005", "0.000", "0.005", "0.010"}));
  EXPECT_EQ(labels(Scale::linear(1000, 5000, 0, 100).ticks(4)),
            (std::vector<std::string>{"1000", "2000", "3000", "4000", "5000"}));
  EXPECT_DOUBLE_EQ(nice_step(97, 5), 20);
  EXPECT_DOUBLE_EQ(nice_step(0.011, 8), 0.001);
  EXPECT_DOUBLE_EQ(nice_step(7, 1), 10);
  EXPECT_EQ(nice_domain(0, 97, 5), std::make_pair(0.0, 100.0));
  const auto [lo, hi] = nice_domain(0.3, 0.3, 5);  // a point, widened around it
  EXPECT_LT(lo, 0.3);
  EXPECT_GT(hi, 0.3);
  EXPECT_EQ(nice_domain(0, 0, 5), std::make_pair(0.0, 1.0));
}

TEST(Ticks, LogTicksAtPowersOfTenWithUnlabelledMinors) {
  const auto t = Scale::log10(0.1, 1000, 0, 400).ticks(6);
  EXPECT_EQ(labels(t), (std::vector<std::string>{"0.1", "1", "10", "100", "1000"}));
  EXPECT_EQ(values(t, true).size(), 5u);
  // 2..9 times each power inside the range: 4 decades x 8.
  const auto minors = values(t, false);
  ASSERT_EQ(minors.size(), 32u);
  EXPECT_NEAR(minors.front(), 0.2, 1e-12);
  EXPECT_NEAR(minors.back(), 900, 1e-9);
  // Ranges that do not start on a power of ten keep the minors inside them only.
  const auto partial = Scale::log10(0.5, 30, 0, 400).ticks(6);
  EXPECT_EQ(labels(partial), (std::vector<std::string>{"0.5", "1", "2", "5", "10", "20"}));
  for (const Tick& k : partial) {
    EXPECT_GE(k.value, 0.5 - 1e-12);
    EXPECT_LE(k.value, 30 + 1e-9);
  }
}

TEST(Ticks, LogTicksOnFewAndManyDecades) {
  // Two decades: 2 and 5 labelled too, so the axis has enough numbers to read.
  EXPECT_EQ(labels(Scale::log10(1, 100, 0, 400).ticks(6)),
            (std::vector<std::string>{"1", "2", "5", "10", "20", "50", "100"}));
  // Twelve decades: every third power, no minors.
  const auto wide = Scale::log10(1e-3, 1e9, 0, 400).ticks(6);
  EXPECT_EQ(labels(wide), (std::vector<std::string>{"0.001", "1", "1000", "1e+06", "1e+09"}));
  EXPECT_TRUE(values(wide, false).empty());
  // Inside one decade with no 2 or 5 in it: round linear ticks instead.
  const auto narrow = Scale::log10(2.1, 2.9, 0, 400).ticks(4);
  EXPECT_GE(labels(narrow).size(), 2u);
  for (const Tick& k : narrow) {
    EXPECT_GE(k.value, 2.1 - 1e-12);
    EXPECT_LE(k.value, 2.9 + 1e-12);
  }
  EXPECT_EQ(decade_domain(0.3, 45), std::make_pair(0.1, 100.0));
  EXPECT_EQ(decade_domain(10, 10), std::make_pair(10.0, 100.0));
  EXPECT_THROW(decade_domain(0, 10), std::invalid_argument);
}

TEST(FormatNumber, ShortLabels) {
  EXPECT_EQ(format_number(1200), "1200");
  EXPECT_EQ(format_number(478.5079), "479");
  EXPECT_EQ(format_number(0.25), "0.25");
  EXPECT_EQ(format_number(0.0001234, 2), "0.00012");
  EXPECT_EQ(format_number(1.2e-5), "1.2e-05");
  EXPECT_EQ(format_number(3e7), "3e+07");
  EXPECT_EQ(format_number(-0.0), "0");
  EXPECT_EQ(format_number(-2.5), "-2.5");
  EXPECT_EQ(format_number(1e6), "1e+06");
}

TEST(Palette, ColoursStayApartInGrey) {
  EXPECT_NEAR(lightness("#000000"), 0, 1e-9);
  EXPECT_NEAR(lightness("#ffffff"), 100, 1e-6);
  EXPECT_NEAR(lightness("#777777"), 50, 1);
  EXPECT_THROW(lightness("red"), std::invalid_argument);
  const auto& p = palette();
  ASSERT_GE(p.size(), 5u);
  for (size_t i = 0; i < p.size(); ++i) {
    // Dark enough to see on white.
    EXPECT_LT(lightness(p[i]), 90) << p[i];
    for (size_t j = i + 1; j < p.size(); ++j) {
      EXPECT_GE(std::fabs(lightness(p[i]) - lightness(p[j])), kMinGreyStep)
          << p[i] << " and " << p[j];
    }
  }
  EXPECT_STREQ(ink_on(p.front()), "#ffffff");
  EXPECT_STREQ(ink_on("#eeeeee"), "#111111");
}

TEST(Svg, MarkersAreDistinctShapes) {
  Svg svg(100, 100, "m");
  for (size_t i = 0; i < 6; ++i) {
    svg.marker(marker_at(i), 50, 50, 10, Style{"#000000", "#1b2a5c", 1});
  }
  const std::string s = svg.str();
  EXPECT_NE(s.find("<circle"), std::string::npos);
  EXPECT_NE(s.find("<rect"), std::string::npos);
  EXPECT_EQ(std::count(s.begin(), s.end(), 'M'), 2);  // the cross: two strokes of one path
  size_t polygons = 0;
  for (size_t at = s.find("<polygon"); at != std::string::npos; at = s.find("<polygon", at + 1))
    ++polygons;
  EXPECT_EQ(polygons, 3u);  // two triangles and a diamond
  EXPECT_EQ(marker_at(0), marker_at(6));
  EXPECT_NE(marker_at(0), marker_at(1));
}

TEST(Axes, TicksLabelsAndTitlesWithUnits) {
  Svg svg(600, 400, "axes");
  const Frame f{80, 20, 560, 340};
  const Scale x = Scale::log10(0.1, 100, f.left, f.right);
  const Scale y = Scale::linear(0, 50, f.bottom, f.top);
  draw_axes(svg, f, x, y, "arithmetic intensity (FLOP/byte)", "achieved GFLOP/s", 8, 5);
  const std::string s = svg.str();
  for (const char* label : {">0.1<", ">1<", ">10<", ">100<", ">0<", ">10<", ">50<"})
    EXPECT_NE(s.find(label), std::string::npos) << label;
  EXPECT_NE(s.find(">arithmetic intensity (FLOP/byte)</text>"), std::string::npos);
  EXPECT_NE(s.find("rotate(-90"), std::string::npos);  // the y title runs upwards
  EXPECT_NE(s.find(">achieved GFLOP/s</text>"), std::string::npos);
  // The 10 on the x axis sits two thirds of the way along it.
  EXPECT_NE(s.find("x=\"400\" y=\"355\""), std::string::npos) << s;
}

}  // namespace
}  // namespace tokamax::report
