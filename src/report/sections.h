// The parts of the report page (internal to src/report), in the order a performance engineer
// reads them: the warnings about the inputs and the machine, the headline (per bench spec what
// won and by how much, and what tuning found), the charts, the detail tables behind them, and
// the inputs. Every chart's figures are in a detail table, so nothing is shown only as a picture.
#pragma once

#include <string>
#include <vector>

#include "report/inputs.h"
#include "report/keys.h"

namespace tokamax::report::internal {

// Calls this short (or specs named or tagged smoke) check the tools, not the machine's speed.
constexpr double kTinyMs = 0.05;

// One bench spec's line of the headline: its fastest row and the fastest row of another
// implementation (variants such as native:packed are the same implementation as native).
struct SpecHeadline {
  int number = 0;  // the spec's number on the roofline chart
  std::string spec;
  const BenchRowIn* best = nullptr;      // nullptr when no row of the spec was measured
  const BenchRowIn* baseline = nullptr;  // nullptr when no other implementation was measured
  bool tiny = false;                     // too small to conclude anything (see kTinyMs)
};
std::vector<SpecHeadline> spec_headlines(const BenchInput& b);

// What tuning found over all tuned keys.
struct TuningFindings {
  int keys = 0;
  int confident = 0;  // a config confidently faster than the heuristics config was stored
  int kept = 0;       // the heuristics config was stored (no candidate confidently faster)
  int single = 0;     // one candidate only: nothing to choose
  int unproven = 0;   // a winner other than the heuristics config, without evidence in the file
  int failed = 0;     // no config succeeded
  std::vector<double> speedups;        // of the confident ones: heuristics median / winner median
  std::vector<size_t> confident_keys;  // their indices, fastest speed-up first
};
TuningFindings tuning_findings(const std::vector<KeyView>& keys);

// The inputs skipped, the bench documents' warnings (a busy machine, ceilings that disagree)
// and the traces' events left out; empty when there is nothing to warn about.
std::string warnings_part(const Loaded& l);
// Per bench document the headline table and the ceilings its percentages used; what tuning
// found.
std::string headline_part(const Loaded& l, const std::vector<KeyView>& keys);
// A roofline per bench document and a time chart per trace.
std::string charts_part(const Loaded& l, const KeyLabels& key_labels);
// Every bench row; the tuned keys' table and a section per key; every trace group.
std::string details_part(const Loaded& l, const std::vector<KeyView>& keys);
// The inputs with their provenance, and the bench documents' ceilings.
std::string inputs_part(const Loaded& l);
// What won, as plain text for a console: per bench document its ceilings, warnings and the
// fastest row of each spec (at most 16), and what tuning found.
std::string summary_text(const Loaded& l, const std::vector<KeyView>& keys);

}  // namespace tokamax::report::internal
