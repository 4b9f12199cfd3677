// The parts of the report page (internal to src/report), each an <h2> heading with what follows
// it: the summary of the inputs and tuned keys, then a roofline per bench document, a section
// per tuned key and a section per trace. Every chart in them is followed by the table of the
// figures behind it, so nothing is shown only as a picture.
#pragma once

#include <string>
#include <vector>

#include "report/inputs.h"
#include "report/keys.h"

namespace tokamax::report::internal {

// The inputs skipped and used, the bench files' roofline ceilings and a table of the tuned keys,
// each linking to its section.
std::string summary_part(const Loaded& l, const std::vector<KeyView>& keys);
// Per bench document: its roofline chart and every row.
std::string roofline_part(const Loaded& l);
// Per tuned key: the winner against the heuristics config, the candidates' chart and tables.
std::string tuning_part(const std::vector<KeyView>& keys);
// Per trace: the time per op and key with the rung that chose each config.
std::string trace_part(const Loaded& l, const KeyLabels& key_labels);

}  // namespace tokamax::report::internal
