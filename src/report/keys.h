// The keys the report page shows (internal to src/report): short labels for argument specs, and
// each tuned key of the result files as a view of its candidates, ranked, with the winner and
// the heuristics config picked out. The summary table, the charts and the sections all use these
// views, so that they agree on what each key is called and which candidate won.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "report/inputs.h"
#include "tokamax/tokamax.h"

namespace tokamax::report::internal {

// Short labels for argument specs: the tensors' shapes always ("f32[64,128] x f32[8,128,256]"),
// other fields only where the specs of one op in this report differ ("activation=silu"): the
// rest are the same everywhere and would only take room. The full key is in the tables.
class KeyLabels {
 public:
  void add(const std::string& family, const Json& args);
  void add_key_text(const std::string& op, const std::string& key_json);

  std::string label(const std::string& family, const Json& args) const;
  std::string label_of_key_text(const std::string& op, const std::string& key_json) const;

 private:
  static std::string family_of(const std::string& op) { return op.substr(0, op.find('/')); }
  static Json parse_or_null(const std::string& text);
  // family -> field -> the distinct values it takes
  std::map<std::string, std::map<std::string, std::set<std::string>>> values_;
};

// The labels of every key in the results and the traces.
KeyLabels key_labels_of(const Loaded& l);

// A candidate's median and interquartile range as the page plots them: both from one statistic,
// so that q1 <= median <= q3 always holds.
//  - kRounds: its per-sample time ratios to the heuristics config (the control) in accepted
//    rounds. The median is the file's median_ms (the tuner's: the median ratio times the
//    control's quiet time), the quartiles the ratios' quartiles on the same scale (median_ms
//    times quartile ratio / median ratio). Ranks, not interpolation (the tuner's median ratio is
//    the lower middle one): rank (n-1)/4 and n-1-(n-1)/4, around the median's (n-1)/2. The
//    control's ratio is 1 by definition in newer files (its median_ms is its quiet time): its
//    whisker is its own ratios' spread around their median, on that scale too.
//  - kSamples: no accepted round (a checked run only, or rounds that were all discarded): the
//    file's median (that of its raw samples) and the raw samples' quartiles.
//  - kFile: no samples in the file (older versions): the median and median -+ IQR/2.
// A raw sample can be far from the rounds' figures on a busy machine: a slow phase inflates raw
// times, while a ratio divides it out (its control samples were slowed alike).
struct Spread {
  enum class Basis { kRounds, kSamples, kFile };
  Basis basis = Basis::kFile;
  double median = 0, q1 = 0, q3 = 0;
  size_t samples = 0, accepted = 0;  // raw samples; accepted ratios (kRounds)
  double raw_median = 0;             // the raw samples' median; 0 when there are none
};
Spread spread_of(const BenchmarkData& b);
// "rounds (9 of 46 samples)", "raw samples (2)", "file".
std::string basis_text(const Spread& s);

struct Candidate {
  std::string config;
  const BenchmarkData* b = nullptr;
  Spread spread;  // the plotted median and whisker
  bool winner = false, heuristics = false, competes = false;
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

// Every tuned key of the result files, in file order, each labelled by `labels`.
std::vector<KeyView> key_views(const Loaded& l, const KeyLabels& labels);

// The marks of a candidate: "winner", "finalist", "heuristics", comma separated.
std::string marks(const Candidate& c);
// The anchor of the n-th key's section.
std::string key_anchor(int n);
// The winner's speedup over the heuristics config ("1.5x"), or why there is none.
std::string speedup_text(const KeyView& v);

}  // namespace tokamax::report::internal
