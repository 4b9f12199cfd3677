// The report page's charts (internal to src/report), each an <svg> element drawn with the SVG
// writer: a bench document's roofline, a tuned key's candidates, and a trace's time per op and
// key. Each chart shows what a table next to it lists in full; a chart may throw on figures it
// cannot place, and the caller (chart() in html.h) then notes that instead.
#pragma once

#include <string>
#include <vector>

#include "report/inputs.h"
#include "report/keys.h"
#include "report/svg.h"

namespace tokamax::report::internal {

// One roof of a roofline chart: a ceiling and the segment drawn for it (pixels).
struct RoofLine {
  std::string name;  // "memory read"
  double value = 0;  // GFLOP/s (compute) or GB/s (memory)
  bool memory = false;
  std::string dash;  // stroke-dasharray: a different one for each roof ("" solid)
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool drawn = false;  // false when the roof falls outside the plot
};

// A label as drawn: its text, the point and style text() gets, and the box it covers.
struct PlacedLabel {
  std::string text;
  Box box;
  double x = 0, y = 0;
  TextStyle style;
};

// Where the roofline chart of a bench document puts everything, computed once for drawing it
// (and for tests): no label covers another label or a marker, and no roof crosses a roof's label.
struct RooflineLayout {
  std::vector<RoofLine> roofs;
  std::vector<PlacedLabel> roof_labels;   // "memory read 21.4 GB/s", beside its line
  std::vector<Box> markers;               // one per plotted row
  std::vector<size_t> point_rows;         // the row of each marker
  std::vector<PlacedLabel> point_labels;  // the spec numbers
  int unlabelled = 0;  // points whose number found no free place (their tooltip names them)
};
RooflineLayout roofline_layout(const BenchInput& b, const std::vector<int>& spec_index);

// The rows of `b` that have a FLOP count and a time, as points (labelled with their spec's
// number, `spec_index` per row) under the machine's compute and memory roofs. `unlabelled`,
// when given, receives the number of points left without their number.
std::string roofline_svg(const BenchInput& b, const std::vector<int>& spec_index,
                         int* unlabelled = nullptr);

// The measured candidates of one key as bars, fastest first, with interquartile whiskers and the
// tie window; `id` makes the chart's pattern ids unique within the page.
std::string candidates_svg(const KeyView& v, const std::string& id);

// The time of the given groups of `t` (op, key, config, rung), coloured by the rung that chose
// their config; `top_level_us` is the trace's time outside nested calls (the shares' whole).
std::string trace_svg(const TraceInput& t, const std::vector<const TraceCallGroup*>& rows,
                      double top_level_us, const KeyLabels& key_labels);

}  // namespace tokamax::report::internal
