// The report page's charts (internal to src/report), each an <svg> element drawn with the SVG
// writer: a bench document's roofline, a tuned key's candidates, and a trace's time per op and
// key. Each chart shows what a table next to it lists in full; a chart may throw on figures it
// cannot place, and the caller (chart() in html.h) then notes that instead.
#pragma once

#include <string>
#include <vector>

#include "report/inputs.h"
#include "report/keys.h"

namespace tokamax::report::internal {

// The rows of `b` that have a FLOP count and a time, as points (labelled with their spec's
// number, `spec_index` per row) under the machine's compute and memory roofs.
std::string roofline_svg(const BenchInput& b, const std::vector<int>& spec_index);

// The measured candidates of one key as bars, fastest first, with interquartile whiskers and the
// tie window; `id` makes the chart's pattern ids unique within the page.
std::string candidates_svg(const KeyView& v, const std::string& id);

// The time of the given groups of `t` (op, key, config, rung), coloured by the rung that chose
// their config; `top_level_us` is the trace's time outside nested calls (the shares' whole).
std::string trace_svg(const TraceInput& t, const std::vector<const TraceCallGroup*>& rows,
                      double top_level_us, const KeyLabels& key_labels);

}  // namespace tokamax::report::internal
