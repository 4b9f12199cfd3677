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

struct Candidate {
  std::string config;
  const BenchmarkData* b = nullptr;
  double q1 = 0, q3 = 0;
  bool winner = false, heuristics = false, competes = false;
  size_t samples = 0;
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
