// The keys the report page shows: labels short enough for a chart's rows, and the view of one
// tuned key's candidates that the summary, its chart and its section share.
#include "report/keys.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "report/html.h"

namespace tokamax::report::internal {

void KeyLabels::add(const std::string& family, const Json& args) {
  if (!args.is_object()) return;
  for (const auto& [name, v] : args.items()) values_[family][name].insert(canonical_dump(v));
}

void KeyLabels::add_key_text(const std::string& op, const std::string& key_json) {
  add(family_of(op), parse_or_null(key_json));
}

std::string KeyLabels::label(const std::string& family, const Json& args) const {
  if (!args.is_object()) return canonical_dump(args);
  std::vector<std::string> shapes, others;
  const auto fam = values_.find(family);
  for (const auto& [name, v] : args.items()) {
    if (v.is_string() && v.get<std::string>().find('[') != std::string::npos) {
      shapes.push_back(v.get<std::string>());
      continue;
    }
    const bool varies =
        fam != values_.end() && fam->second.count(name) && fam->second.at(name).size() > 1;
    if (varies)
      others.push_back(name + "=" + (v.is_string() ? v.get<std::string>() : canonical_dump(v)));
  }
  std::string s = join(shapes, " x ");
  if (!others.empty()) {
    // (Appended in two steps: GCC 12 warns -Wrestrict on " " + join(...) here.)
    if (!s.empty()) s += ' ';
    s += join(others, " ");
  }
  return s;
}

std::string KeyLabels::label_of_key_text(const std::string& op, const std::string& key_json) const {
  const Json args = parse_or_null(key_json);
  return args.is_object() ? label(family_of(op), args) : key_json;
}

Json KeyLabels::parse_or_null(const std::string& text) {
  try {
    return parse_json(text, "key");
  } catch (const std::exception&) {
    return Json();
  }
}

KeyLabels key_labels_of(const Loaded& l) {
  KeyLabels key_labels;
  for (const ResultInput& r : l.results) {
    for (const auto& [b, d] : r.result.data()) key_labels.add(b.family(), b.arguments());
  }
  for (const TraceInput& t : l.traces) {
    for (const TraceCallGroup& g : t.groups) key_labels.add_key_text(g.op, g.key);
  }
  return key_labels;
}

namespace {

// The values at the ranks of the lower quartile, the (lower) median and the upper quartile of
// sorted `v` (not empty): exact elements, so lo <= mid <= hi with no rounding in between.
struct Ranks {
  double lo, mid, hi;
};
Ranks ranks_of(const std::vector<double>& v) {
  const size_t m = v.size() - 1;
  return {v[m / 4], v[m / 2], v[m - m / 4]};
}

bool usable(double x) { return std::isfinite(x) && x > 0; }

}  // namespace

Spread spread_of(const BenchmarkData& b) {
  Spread s;
  s.median = b.median_ms;
  s.samples = b.samples_ms.size();
  std::vector<double> raw;
  for (double x : b.samples_ms) {
    if (std::isfinite(x)) raw.push_back(x);
  }
  std::sort(raw.begin(), raw.end());
  if (!raw.empty()) {
    const size_t n = raw.size();
    s.raw_median = n % 2 ? raw[n / 2] : (raw[n / 2 - 1] + raw[n / 2]) / 2;
  }
  std::vector<double> ratios;
  for (double r : b.ratios) {
    if (usable(r)) ratios.push_back(r);
  }
  std::sort(ratios.begin(), ratios.end());
  if (!ratios.empty() && usable(b.median_ms)) {
    const Ranks k = ranks_of(ratios);
    s.basis = Spread::Basis::kRounds;
    s.accepted = ratios.size();
    // Each quotient is <= 1 (>= 1) exactly when its rank's ratio is, and multiplying by the
    // same median keeps the order: q1 <= median <= q3 without a clamp.
    s.q1 = b.median_ms * (k.lo / k.mid);
    s.q3 = b.median_ms * (k.hi / k.mid);
    return s;
  }
  if (!raw.empty()) {
    const Ranks k = ranks_of(raw);
    s.basis = Spread::Basis::kSamples;
    // The tuner's median of these samples lies between their quartiles' ranks; a file whose
    // median is not its samples' (not written by the tuner) still gets a whisker through its bar.
    s.q1 = std::min(k.lo, b.median_ms);
    s.q3 = std::max(k.hi, b.median_ms);
    return s;
  }
  s.basis = Spread::Basis::kFile;
  const double half = std::isfinite(b.iqr_ms) && b.iqr_ms > 0 ? b.iqr_ms / 2 : 0;
  s.q1 = b.median_ms - half;
  s.q3 = b.median_ms + half;
  return s;
}

std::string basis_text(const Spread& s) {
  switch (s.basis) {
    case Spread::Basis::kRounds:
      return fmt::format("rounds ({} of {} samples)", s.accepted, s.samples);
    case Spread::Basis::kSamples:
      return fmt::format("raw samples ({})", s.samples);
    case Spread::Basis::kFile:
      break;
  }
  return "file (median, IQR)";
}

namespace {

KeyView view_of(const ResultInput& file, const BoundArguments& bound, const AutotuningData& d) {
  KeyView v{&file, &bound, &d, {}, {}, "", "", nullptr, 0, 0};
  const std::string heur = d.heuristics() ? d.heuristics()->str() : "";
  if (d.has_success()) {
    v.winner = d.fastest().config.str();
    v.best = d.best_median_ms();
    v.window = tie_window_ms(v.best);
  }
  for (const auto& [k, e] : d.entries()) {
    if (!e.benchmark) {
      v.failed.emplace_back(k, &*e.failure);
      if (k == heur) v.heur_failed = &*e.failure;
      continue;
    }
    Candidate c;
    c.config = k;
    c.b = &*e.benchmark;
    c.winner = k == v.winner;
    c.heuristics = k == heur;
    c.competes = d.competes(e);
    c.spread = spread_of(*e.benchmark);
    v.ok.push_back(c);
  }
  std::stable_sort(v.ok.begin(), v.ok.end(), [](const Candidate& a, const Candidate& b) {
    return a.b->median_ms < b.b->median_ms;
  });
  return v;
}

}  // namespace

std::vector<KeyView> key_views(const Loaded& l, const KeyLabels& labels) {
  std::vector<KeyView> keys;
  for (const ResultInput& r : l.results) {
    for (const auto& [b, d] : r.result.data()) {
      keys.push_back(view_of(r, b, d));
      keys.back().label = labels.label(b.family(), b.arguments());
    }
  }
  return keys;
}

std::string marks(const Candidate& c) {
  std::vector<std::string> m;
  if (c.winner) m.push_back("winner");
  if (c.b->finalist) m.push_back("finalist");
  if (c.heuristics) m.push_back("heuristics");
  return join(m, ", ");
}

std::string key_anchor(int n) { return fmt::format("key-{}", n); }

std::string speedup_text(const KeyView& v) {
  if (v.winner.empty()) return "no config succeeded";
  if (!v.data->heuristics()) return "heuristics config not recorded in this file";
  if (v.heur_failed)
    return "heuristics config failed (" + std::string(failure_kind_name(v.heur_failed->kind)) + ")";
  if (!v.heur()) return "heuristics config not measured";
  const double w = v.data->entries().at(v.winner).benchmark->median_ms;
  return fmt::format("{}x", num(v.heur()->b->median_ms / w, 3));
}

}  // namespace tokamax::report::internal
