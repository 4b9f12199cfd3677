// The sections of the report page: warnings, the headline, the charts, the detail tables and the
// inputs, as XHTML text around the charts. Each chart's figures are in a detail table, so that a
// reader (or a script) can check every mark.
#include "report/sections.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>

#include "report/charts.h"
#include "report/html.h"

namespace tokamax::report::internal {
namespace {

// At most this many of a file's warnings are listed (a file may hold any number), each cut to
// kWarningChars.
constexpr size_t kMaxWarnings = 20;
constexpr size_t kWarningChars = 600;

std::string peak_unit(const std::string& peak) {
  return peak.rfind("mem", 0) == 0 ? "GB/s" : "GFLOP/s";
}

// "63.5% of f32_fma 115.1 GFLOP/s": the share and the ceiling it is of.
std::string pct_text(const BenchRowIn& r) {
  if (r.peak.empty()) return "-";
  return esc(num(r.pct, 3) + "% of " + r.peak + " " + num(r.peak_value) + " " + peak_unit(r.peak));
}

// The implementation a row runs, variants ("native:packed") counted as their implementation.
std::string base_implementation(const std::string& impl) { return impl.substr(0, impl.find(':')); }

bool smoke_run(const BenchInput& b) { return b.command.find("--tag smoke") != std::string::npos; }

// ---------------------------------------------------------------- inputs

std::string inputs_table(const Loaded& l) {
  Table in{{"input", "kind", "device kind", "device", "threads", "tokamax", "created", "command"},
           {false, false, false, false, true, false, false, false},
           {}};
  auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : esc(s); };
  for (const ResultInput& r : l.results) {
    in.add({code(r.path), fmt::format("autotuning result ({} keys)", r.result.data().size()),
            esc(r.result.device_kind()), "-", "-", esc(r.result.tokamax_version()),
            or_dash(r.created), r.command.empty() ? "-" : code(r.command)});
  }
  for (const BenchInput& b : l.benches) {
    in.add({code(b.path), fmt::format("benchmark ({} rows)", b.rows.size()), or_dash(b.device_kind),
            or_dash(b.model), b.ceilings.threads ? std::to_string(b.ceilings.threads) : "-",
            or_dash(b.version), or_dash(b.created), b.command.empty() ? "-" : code(b.command)});
  }
  for (const TraceInput& t : l.traces) {
    in.add({code(t.path), fmt::format("trace ({} op groups)", t.groups.size()),
            or_dash(t.device_kind), "-", "-", "-", "-", "-"});
  }
  return in.html("Inputs");
}

std::string ceilings_source(const BenchInput& b) {
  if (b.ceilings.from_rows) return "the highest ceiling of its rows (no roofline in the file)";
  return "tokamax device --roofline, same run" +
         std::string(b.busy ? ", on a machine it judged busy" : "");
}

std::string ceilings_table(const std::vector<BenchInput>& benches) {
  Table c{{"bench file", "threads", "f32 FMA GFLOP/s", "bf16 dot GFLOP/s", "memory read GB/s",
           "memory copy GB/s", "source"},
          {false, true, true, true, true, true, false},
          {}};
  for (const BenchInput& b : benches) {
    const Ceilings& k = b.ceilings;
    auto v = [](double x) { return x > 0 ? num(x) : std::string("-"); };
    c.add({code(b.path), k.threads ? std::to_string(k.threads) : "-", v(k.f32),
           v(k.bf16) + (k.bf16 > 0 && !k.bf16_unit.empty() ? " (" + esc(k.bf16_unit) + ")" : ""),
           v(k.read), v(k.copy), esc(ceilings_source(b))});
  }
  return c.html("Roofline ceilings (measured on all threads)");
}

// ---------------------------------------------------------------- headline

// The ceilings a bench document's percentages are against, in one line.
std::string ceilings_line(const BenchInput& b) {
  const Ceilings& k = b.ceilings;
  std::vector<std::string> parts;
  if (k.f32 > 0) parts.push_back("f32_fma " + num(k.f32) + " GFLOP/s");
  if (k.bf16 > 0)
    parts.push_back("bf16_dot " + num(k.bf16) + " GFLOP/s" +
                    (k.bf16_unit.empty() ? "" : " (" + k.bf16_unit + ")"));
  if (k.read > 0) parts.push_back("mem_read " + num(k.read) + " GB/s");
  if (k.copy > 0) parts.push_back("mem_copy " + num(k.copy) + " GB/s");
  if (parts.empty()) return "";
  std::string s = "<p class=\"muted\">Ceilings" +
                  (k.threads ? fmt::format(" (all {} threads)", k.threads) : std::string()) + ": " +
                  esc(join(parts, ", ")) + "; from " + esc(ceilings_source(b)) +
                  ". Each row's percentage is of the ceiling named beside it (the bench measures "
                  "its own in the same rounds, so it may differ a little from these).</p>";
  return s;
}

std::string headline_table(const BenchInput& b, const std::vector<SpecHeadline>& heads) {
  // A note per spec only where some are tiny and some not: when all are, the note above the
  // table says so once.
  const auto tiny =
      std::count_if(heads.begin(), heads.end(), [](const SpecHeadline& h) { return h.tiny; });
  const bool notes = tiny > 0 && tiny < static_cast<long>(heads.size());
  Table t{{"#", "spec", "best", "median ms", "vs strongest baseline", "% of its ceiling"},
          {true, false, false, true, false, false},
          {}};
  if (notes) t.head.push_back("note");
  for (const SpecHeadline& h : heads) {
    std::vector<std::string> row = {std::to_string(h.number), esc(h.spec)};
    if (!h.best) {
      row.insert(row.end(), {"no row measured", "-", "-", "-"});
    } else {
      const BenchRowIn& r = *h.best;
      std::string vs = "no other implementation measured";
      if (h.baseline) {
        vs = "<b>" + num(h.baseline->median_ms / r.median_ms, 3) + "x</b> faster than " +
             esc(h.baseline->implementation) + " (" + num(h.baseline->median_ms) + " ms)";
      }
      row.insert(row.end(),
                 {"<b>" + esc(r.implementation) + "</b>",
                  num(r.median_ms) + (r.cache_state.empty() ? "" : " " + esc(r.cache_state)), vs,
                  pct_text(r)});
    }
    if (notes) row.push_back(h.tiny ? "tiny: for checking the tools only" : "");
    t.add(std::move(row));
  }
  return t.html("Per spec: the fastest implementation of " + b.path);
}

std::string tiny_note(const BenchInput& b, const std::vector<SpecHeadline>& heads) {
  const auto tiny =
      std::count_if(heads.begin(), heads.end(), [](const SpecHeadline& h) { return h.tiny; });
  if (tiny == 0) return "";
  const std::string which =
      tiny == static_cast<long>(heads.size())
          ? fmt::format("All {} specs of {} are", heads.size(), b.path)
          : fmt::format("{} of the {} specs of {} (marked tiny) are", tiny, heads.size(), b.path);
  return "<p class=\"note\"><b>Shapes too small for conclusions.</b> " + esc(which) +
         fmt::format(
             " smoke specs or calls under {} us: these shapes are for checking the tools, "
             "and too small to conclude anything about performance (fixed costs such as "
             "waking threads dominate them).</p>",
             num(kTinyMs * 1e3));
}

// What tuning found, as a sentence (the page and the console summary).
std::string findings_sentence(const TuningFindings& f) {
  auto n = [](int k, const char* one, const char* many) {
    return fmt::format("{} {}", k, k == 1 ? one : many);
  };
  std::string s = n(f.keys, "key", "keys") + " tuned; ";
  if (f.confident > 0) {
    std::vector<double> sp = f.speedups;
    std::sort(sp.begin(), sp.end());
    const double median = sp[(sp.size() - 1) / 2];
    s += fmt::format(
        "{} stored a config confidently faster than the heuristics config ({} to {}x as fast, "
        "median {}x)",
        f.confident, num(sp.front(), 3), num(sp.back(), 3), num(median, 3));
  } else {
    s += "none found a config confidently faster than the heuristics config";
  }
  std::vector<std::string> rest;
  if (f.kept > 0) rest.push_back(fmt::format("{} kept the heuristics config", f.kept));
  if (f.single > 0)
    rest.push_back(fmt::format("{} had a single candidate (nothing to tune)", f.single));
  if (f.unproven > 0)
    rest.push_back(fmt::format(
        "{} picked a config by median alone (no tuning evidence in the file)", f.unproven));
  if (f.failed > 0) rest.push_back(fmt::format("{} had no config that succeeded", f.failed));
  if (!rest.empty()) s += "; " + join(rest, "; ");
  return s + ".";
}

std::string findings_text(const TuningFindings& f) {
  return "<p><b>What tuning found</b>: " + esc(findings_sentence(f)) + "</p>";
}

// The keys where tuning changed the config, fastest speed-up first (at most kMaxWins).
std::string wins_table(const std::vector<KeyView>& keys, const TuningFindings& f) {
  constexpr size_t kMaxWins = 10;
  if (f.confident_keys.empty()) return "";
  Table t{
      {"op/implementation", "key", "winner", "winner ms", "heuristics ms", "speed-up", "evidence"},
      {false, false, false, true, true, true, false},
      {}};
  for (size_t k = 0; k < f.confident_keys.size() && k < kMaxWins; ++k) {
    const size_t i = f.confident_keys[k];
    const KeyView& v = keys[i];
    const BenchmarkData& w = *v.data->entries().at(v.winner).benchmark;
    t.add({esc(v.bound->family() + "/" + v.bound->implementation()),
           fmt::format("<a href=\"#{}\">{}</a>", key_anchor(static_cast<int>(i)), esc(v.label)),
           json_code(v.winner), num(w.median_ms), num(v.heur()->b->median_ms), esc(speedup_text(v)),
           esc(w.evidence ? w.evidence->summary() : "-")});
  }
  std::string caption = "Keys where tuning stored a faster config";
  if (f.confident_keys.size() > kMaxWins)
    caption += fmt::format(" (the {} largest speed-ups of {})", kMaxWins, f.confident_keys.size());
  return t.html(caption);
}

// ---------------------------------------------------------------- roofline
// Specs numbered in the order they first appear: the chart's labels (one number per row).
std::vector<int> spec_numbers(const std::vector<BenchRowIn>& rows) {
  std::map<std::string, int> number;  // (a file may hold any number of specs)
  std::vector<int> spec_index;
  for (const BenchRowIn& r : rows) {
    const auto [it, added] = number.emplace(r.spec, static_cast<int>(number.size()) + 1);
    spec_index.push_back(it->second);
  }
  return spec_index;
}

// Every row, under a heading per spec (its number and name), in the order of the file.
std::string bench_rows_table(const BenchInput& b, const std::vector<int>& spec_index) {
  const bool cache = std::any_of(b.rows.begin(), b.rows.end(),
                                 [](const BenchRowIn& r) { return !r.cache_state.empty(); });
  Table t{{"implementation", "median ms", "IQR ms"}, {false, true, true}, {}, {}};
  if (cache) {
    t.head.push_back("cache");
    t.numeric.push_back(false);
  }
  for (const auto& [h, n] : std::vector<std::pair<const char*, bool>>{{"GFLOP/s", true},
                                                                      {"GB/s", true},
                                                                      {"FLOP/byte", true},
                                                                      {"% of ceiling", false},
                                                                      {"vs other", false},
                                                                      {"GFLOP", true},
                                                                      {"MB moved (from)", true},
                                                                      {"alloc MB", true},
                                                                      {"config (source)", false}}) {
    t.head.push_back(h);
    t.numeric.push_back(n);
  }
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const BenchRowIn& r = b.rows[i];
    if (i == 0 || b.rows[i - 1].spec != r.spec)
      t.group(fmt::format("#{} ", spec_index[i]) + esc(r.spec));
    std::vector<std::string> row = {esc(r.implementation)};
    if (!r.measured()) {
      row.insert(row.end(), t.head.size() - 2, "-");
      row.push_back("failed: " + esc(r.source.empty() ? "no measurement" : r.source));
      t.add(std::move(row));
      continue;
    }
    row.push_back(num(r.median_ms));
    row.push_back(num(r.iqr_ms));
    if (cache) row.push_back(r.cache_state.empty() ? "-" : esc(r.cache_state));
    row.push_back(num(r.gflops));
    row.push_back(num(r.gbps));
    row.push_back(r.intensity() > 0 ? num(r.intensity()) : "-");
    row.push_back(pct_text(r));
    row.push_back(esc(r.baseline.empty() ? "-" : num(r.speedup, 3) + "x " + r.baseline));
    row.push_back(num(r.flops / 1e9));
    row.push_back(num(r.bytes / 1e6) +
                  (r.bytes_source.empty() ? "" : " (" + esc(r.bytes_source) + ")"));
    row.push_back(num(r.allocated / 1e6, 3));
    row.push_back(json_code(r.config) + (r.source.empty() ? "" : " (" + esc(r.source) + ")"));
    t.add(std::move(row));
  }
  return t.html("Every row of " + b.path);
}

std::string roofline_chart(const BenchInput& b, int n) {
  std::string s = fmt::format("<h3 id=\"roofline-{}\">Roofline of {}</h3>", n, esc(b.path));
  const std::vector<int> spec_index = spec_numbers(b.rows);
  const bool any_point =
      std::any_of(b.rows.begin(), b.rows.end(), [](const BenchRowIn& r) { return r.plotted(); });
  if (b.ceilings.from_rows) {
    s += "<p class=\"muted\">This file holds no roofline (written by an older tokamax): the "
         "ceilings drawn are the highest its rows were compared against.</p>";
  }
  if (!any_point) {
    return s +
           "<p>No row has a FLOP count and a time, so there is nothing to place on a roofline "
           "chart.</p>";
  }
  int unlabelled = 0;
  s += chart([&] { return roofline_svg(b, spec_index, &unlabelled); });
  s += "<p class=\"muted\">Each point is one row: a spec (its number in the headline table) run "
       "by one implementation; filled markers are implementations, hollow ones a variant of one "
       "(pre-packed weights, pinned heuristics config). A point's height against the roof above "
       "it is the share of the machine it used. Bytes are what the op counts as its least "
       "traffic, or, where it counts none (compute-bound calls), its tensors' sizes, each read "
       "or written once (column \"bytes from\" of the detail table).";
  if (unlabelled > 0) {
    s += fmt::format(
        " {} {} left without a number where it would have covered another label or marker: "
        "hover a point for its spec.",
        unlabelled, unlabelled == 1 ? "point is" : "points are");
  }
  return s + "</p>";
}

// ---------------------------------------------------------------- tuned keys

// What tuning did for a key, in the words of the headline's findings.
std::string outcome_text(const KeyView& v) {
  if (v.winner.empty()) return "no config succeeded";
  if (v.ok.size() + v.failed.size() == 1) return "one candidate: nothing to tune";
  if (v.heur() && v.heur()->winner) return "heuristics config kept";
  const BenchmarkData& w = *v.data->entries().at(v.winner).benchmark;
  if (v.heur() && w.evidence && w.evidence->confident) return speedup_text(v) + ", confident";
  return speedup_text(v) + " (by median alone)";
}

std::string keys_table(const std::vector<KeyView>& keys) {
  Table k{{"op/implementation", "key", "candidates", "failed", "winner", "winner ms",
           "heuristics ms", "outcome"},
          {false, false, true, true, false, true, true, true},
          {}};
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyView& v = keys[i];
    const std::string link =
        fmt::format("<a href=\"#{}\">{}</a>", key_anchor(static_cast<int>(i)), esc(v.label));
    k.add({esc(v.bound->family() + "/" + v.bound->implementation()), link,
           std::to_string(v.ok.size() + v.failed.size()), std::to_string(v.failed.size()),
           v.winner.empty() ? "-" : json_code(v.winner),
           v.winner.empty() ? "-" : num(v.data->entries().at(v.winner).benchmark->median_ms),
           v.heur() ? num(v.heur()->b->median_ms) : "-", esc(outcome_text(v))});
  }
  return k.html("Tuned keys");
}

// The winner against the heuristics config and the tie window, then the candidates' chart.
std::string winner_text(const KeyView& v, int n) {
  if (v.winner.empty()) return "<p class=\"warn\">No config succeeded for this key.</p>";
  std::string s;
  const BenchmarkData& w = *v.data->entries().at(v.winner).benchmark;
  s += "<p><b>Winner</b> " + json_code(v.winner) + ": " + num(w.median_ms) + " ms. ";
  if (v.heur()) {
    const double sp = v.heur()->b->median_ms / w.median_ms;
    s += v.heur()->winner ? std::string("The heuristics config won. ")
                          : "<b>Heuristics config</b> " + json_code(v.heur()->config) + ": " +
                                num(v.heur()->b->median_ms) + " ms, so the winner is <b>" +
                                num(sp, 3) + "x</b> as fast. ";
  } else {
    s += esc(speedup_text(v)) + ". ";
  }
  if (w.evidence) {
    // The tuner's decision from interleaved rounds against the heuristics config.
    s += "Tuning evidence: best finalist " + json_code(w.evidence->best) + " " +
         esc(w.evidence->summary()) +
         (w.evidence->confident ? ". " : "; the heuristics config is stored instead. ");
  } else if (w.median_ms > v.best) {
    s += "It is not the fastest competing median: within the tie window it needs the least "
         "scratch memory. ";
  }
  s += fmt::format(
      "Tie window: {} to {} ms (max(2 us, 1%) above the fastest competing median); {} "
      "succeeded, {} failed.</p>",
      num(v.best), num(v.best + v.window), v.ok.size(), v.failed.size());
  s += chart([&] { return candidates_svg(v, key_anchor(n)); });
  return s;
}

// Every measured candidate, fastest first, and every failed one with why.
std::string candidate_tables(const KeyView& v) {
  std::string s;
  Table t{{"rank", "config", "median ms", "q1 ms", "q3 ms", "median and quartiles from",
           "raw samples' median ms", "scratch bytes", "prepare ms", "cold cache", "in tie window",
           "marks"},
          {true, false, true, true, true, false, true, true, true, false, false, false},
          {}};
  for (size_t i = 0; i < v.ok.size(); ++i) {
    const Candidate& c = v.ok[i];
    const Spread& p = c.spread;
    const bool in_window = c.competes && c.b->median_ms <= v.best + v.window;
    t.add({std::to_string(i + 1), json_code(c.config), num(p.median), num(p.q1), num(p.q3),
           esc(basis_text(p)), p.samples > 0 ? num(p.raw_median) : "-",
           std::to_string(c.b->scratch_bytes), num(c.b->prepare_ms), c.b->cold_cache ? "yes" : "no",
           in_window ? "yes" : "no", esc(marks(c))});
  }
  if (!v.ok.empty()) s += t.html("Measured candidates, fastest first");
  if (!v.failed.empty()) {
    Table ft{{"config", "failure", "reason"}, {}, {}};
    for (const auto& [cfg, fail] : v.failed) {
      ft.add({json_code(cfg) + (v.heur_failed == fail ? " (heuristics)" : ""),
              esc(failure_kind_name(fail->kind)), esc(fail->message)});
    }
    s += ft.html("Failed candidates and why");
  }
  return s;
}

std::string key_section(const KeyView& v, int n) {
  const BoundArguments& b = *v.bound;
  std::string s = fmt::format("<h4 id=\"{}\">{}/{} {}</h4>", key_anchor(n), esc(b.family()),
                              esc(b.implementation()), esc(v.label));
  s += "<p>key " + json_code(b.key()) + " from " + esc(v.file->path) + " (device kind " +
       esc(v.file->result.device_kind()) + ")</p>";
  s += winner_text(v, n);
  s += candidate_tables(v);
  return s;
}

const char* kTuningNote =
    "<p class=\"muted\">Per key, every candidate config the autotuner measured, fastest first. "
    "Candidates are measured in interleaved rounds against the heuristics config with "
    "successive halving; the finalists reached the last stage. The stored winner is the best "
    "finalist when it is confidently faster than the heuristics config (else the heuristics "
    "config); within the tie window the candidate with the least scratch memory wins. "
    "<b>A bar and its whisker come from one statistic</b>: the candidate's per-sample time "
    "ratios to the heuristics config in its accepted rounds. The bar is their median times the "
    "heuristics config's quiet time (the median the tuner ranked by, median_ms in the file), "
    "the whisker their quartiles on the same scale. A candidate without an accepted round uses "
    "its raw samples' median and quartiles. The raw samples' own median is in the table: on a "
    "busy machine it can be far from the bar, since a slow phase inflates raw times while a "
    "ratio divides it out.</p>";

// ---------------------------------------------------------------- traces

// Calls by the rung of the resolution ladder that chose their config.
std::string rung_table(const TraceInput& t) {
  std::map<std::string, std::tuple<int64_t, int64_t, double>> by_rung;  // keys, calls, us
  for (const TraceCallGroup& g : t.groups) {
    auto& [keys, c, us] = by_rung[g.rung];
    ++keys;
    c += g.calls;
    us += g.total_us;
  }
  Table rt{{"rung", "groups", "calls", "total ms"}, {false, true, true, true}, {}};
  for (const auto& [rung, v] : by_rung) {
    rt.add({esc(rung), std::to_string(std::get<0>(v)), std::to_string(std::get<1>(v)),
            num(std::get<2>(v) / 1e3)});
  }
  return rt.html("Calls by the rung of the resolution ladder that chose their config");
}

struct TraceRows {
  std::vector<const TraceCallGroup*> rows;  // longest first
  double top_level_us = 0;
  int64_t calls = 0;
};

TraceRows trace_rows(const TraceInput& t) {
  TraceRows r;
  for (const TraceCallGroup& g : t.groups) {
    r.rows.push_back(&g);
    r.top_level_us += g.total_us - g.nested_us;
    r.calls += g.calls;
  }
  std::stable_sort(
      r.rows.begin(), r.rows.end(),
      [](const TraceCallGroup* a, const TraceCallGroup* b) { return a->total_us > b->total_us; });
  return r;
}

constexpr size_t kTraceChartRows = 40;

std::string trace_summary_text(const TraceInput& t, const TraceRows& r) {
  return fmt::format(
      "<p>{} op calls in {} groups (op, key, config, rung); {} ms in top-level calls{}. Shares "
      "are of that time: a call made inside another op's implementation is also inside the "
      "outer call's time.</p>",
      r.calls, r.rows.size(), num(r.top_level_us / 1e3),
      t.device_kind.empty() ? "" : ", recorded on device kind " + esc(t.device_kind));
}

std::string trace_chart(const TraceInput& t, int n, const KeyLabels& key_labels) {
  const TraceRows r = trace_rows(t);
  std::string s = fmt::format("<h3 id=\"trace-{}\">Time per op and key in {}</h3>", n, esc(t.path));
  s += trace_summary_text(t, r);
  const std::vector<const TraceCallGroup*> charted(
      r.rows.begin(), r.rows.begin() + static_cast<long>(std::min(r.rows.size(), kTraceChartRows)));
  s += chart([&] { return trace_svg(t, charted, r.top_level_us, key_labels); });
  if (r.rows.size() > kTraceChartRows) {
    s += fmt::format(
        "<p class=\"muted\">The chart shows the {} groups that took longest; the "
        "detail table has all {}.</p>",
        kTraceChartRows, r.rows.size());
  }
  return s;
}

std::string trace_tables(const TraceInput& t, int n) {
  const TraceRows r = trace_rows(t);
  std::string s = fmt::format("<h3 id=\"trace-rows-{}\">Every group of {}</h3>", n, esc(t.path));
  Table tb{
      {"op", "key", "config", "rung", "calls", "nested calls", "total ms", "mean us", "share %"},
      {false, false, false, false, true, true, true, true, true},
      {}};
  for (const TraceCallGroup* g : r.rows) {
    tb.add({esc(g->op), json_code(g->key), json_code(g->config), esc(g->rung),
            std::to_string(g->calls), std::to_string(g->nested_calls), num(g->total_us / 1e3),
            num(g->calls ? g->total_us / static_cast<double>(g->calls) : 0),
            num(r.top_level_us > 0 ? 100 * (g->total_us - g->nested_us) / r.top_level_us : 0, 3)});
  }
  s += tb.html("Every op, key and config in the trace, longest first");
  s += rung_table(t);
  return s;
}

// A list item per warning of one input, at most kMaxWarnings.
std::string warning_items(const std::string& path, const std::vector<std::string>& warnings) {
  std::string s;
  for (size_t i = 0; i < warnings.size() && i < kMaxWarnings; ++i)
    s += "<li>" + code(path) + ": " + esc(clip(warnings[i], kWarningChars)) + "</li>";
  if (warnings.size() > kMaxWarnings) {
    s += "<li>" + code(path) +
         fmt::format(": {} more warnings not shown</li>", warnings.size() - kMaxWarnings);
  }
  return s;
}

}  // namespace

std::vector<SpecHeadline> spec_headlines(const BenchInput& b) {
  std::vector<SpecHeadline> out;
  std::vector<std::vector<const BenchRowIn*>> rows_of;  // per spec, its measured rows
  const std::vector<int> numbers = spec_numbers(b.rows);
  const bool smoke = smoke_run(b);
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const size_t k = static_cast<size_t>(numbers[i]) - 1;
    if (k == out.size()) {
      out.push_back({numbers[i], b.rows[i].spec, nullptr, nullptr, false});
      rows_of.emplace_back();
    }
    if (b.rows[i].measured()) rows_of[k].push_back(&b.rows[i]);
  }
  for (size_t k = 0; k < out.size(); ++k) {
    SpecHeadline& h = out[k];
    for (const BenchRowIn* r : rows_of[k]) {
      if (!h.best || r->median_ms < h.best->median_ms) h.best = r;
    }
    if (h.best) {
      const std::string impl = base_implementation(h.best->implementation);
      for (const BenchRowIn* r : rows_of[k]) {
        if (base_implementation(r->implementation) == impl) continue;
        if (!h.baseline || r->median_ms < h.baseline->median_ms) h.baseline = r;
      }
    }
    h.tiny = smoke || h.spec.find("smoke") != std::string::npos ||
             (h.best && h.best->median_ms < kTinyMs);
  }
  return out;
}

TuningFindings tuning_findings(const std::vector<KeyView>& keys) {
  TuningFindings f;
  f.keys = static_cast<int>(keys.size());
  std::vector<std::pair<double, size_t>> wins;
  for (size_t i = 0; i < keys.size(); ++i) {
    const KeyView& v = keys[i];
    if (v.winner.empty()) {
      ++f.failed;
    } else if (v.ok.size() + v.failed.size() == 1) {
      ++f.single;
    } else if (v.heur() && v.heur()->winner) {
      ++f.kept;
    } else {
      const BenchmarkData& w = *v.data->entries().at(v.winner).benchmark;
      if (v.heur() && w.evidence && w.evidence->confident && w.median_ms > 0) {
        ++f.confident;
        wins.emplace_back(v.heur()->b->median_ms / w.median_ms, i);
      } else {
        ++f.unproven;
      }
    }
  }
  std::stable_sort(wins.begin(), wins.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [sp, i] : wins) {
    f.speedups.push_back(sp);
    f.confident_keys.push_back(i);
  }
  return f;
}

std::string warnings_part(const Loaded& l) {
  std::string items;
  if (!l.skipped.empty()) {
    items +=
        "<li><b>Skipped inputs</b>: these files could not be used; the report shows the "
        "rest.<ul>";
    for (const auto& [path, why] : l.skipped)
      items += "<li>" + code(path) + ": " + esc(why) + "</li>";
    items += "</ul></li>";
  }
  for (const BenchInput& b : l.benches) {
    if (b.busy) {
      items += "<li>" + code(b.path) +
               ": the machine was busy while its ceilings were measured, so its percentages of "
               "ceiling are uncertain</li>";
    }
    items += warning_items(b.path, b.warnings);
  }
  for (const TraceInput& t : l.traces) items += warning_items(t.path, t.warnings);
  if (items.empty()) return "";
  return "<div class=\"warn\" id=\"warnings\"><p><b>Warnings</b></p><ul>" + items + "</ul></div>";
}

std::string headline_part(const Loaded& l, const std::vector<KeyView>& keys) {
  std::string h = "<h2 id=\"headline\">Headline</h2>";
  for (const BenchInput& b : l.benches) {
    const std::vector<SpecHeadline> heads = spec_headlines(b);
    h += tiny_note(b, heads);
    h += headline_table(b, heads);
    h += ceilings_line(b);
  }
  if (l.benches.empty()) h += "<p class=\"muted\">No benchmark file given (--bench).</p>";
  if (!keys.empty()) {
    const TuningFindings f = tuning_findings(keys);
    h += findings_text(f);
    h += wins_table(keys, f);
  } else {
    h += "<p class=\"muted\">No autotuning result given.</p>";
  }
  return h;
}

std::string charts_part(const Loaded& l, const KeyLabels& key_labels) {
  std::string h = "<h2 id=\"charts\">Charts</h2>";
  for (size_t i = 0; i < l.benches.size(); ++i)
    h += roofline_chart(l.benches[i], static_cast<int>(i));
  for (size_t i = 0; i < l.traces.size(); ++i)
    h += trace_chart(l.traces[i], static_cast<int>(i), key_labels);
  if (l.benches.empty() && l.traces.empty()) {
    h += "<p class=\"muted\">No benchmark file or trace given: the tuned keys' charts are with "
         "their details below.</p>";
  }
  return h;
}

std::string details_part(const Loaded& l, const std::vector<KeyView>& keys) {
  std::string h = "<h2 id=\"details\">Details</h2>";
  for (const BenchInput& b : l.benches) h += bench_rows_table(b, spec_numbers(b.rows));
  h += "<h3 id=\"tuning\">Tuned keys</h3>";
  if (keys.empty()) {
    h += "<p class=\"muted\">No autotuning result given.</p>";
  } else {
    h += kTuningNote;
    h += keys_table(keys);
  }
  for (size_t i = 0; i < keys.size(); ++i) h += key_section(keys[i], static_cast<int>(i));
  for (size_t i = 0; i < l.traces.size(); ++i) h += trace_tables(l.traces[i], static_cast<int>(i));
  return h;
}

std::string inputs_part(const Loaded& l) {
  std::string h = "<h2 id=\"inputs\">Inputs</h2>";
  h += inputs_table(l);
  if (!l.benches.empty()) h += ceilings_table(l.benches);
  return h;
}

// A string from an input file, safe on a terminal: control characters (escape sequences
// included) shown as '?'.
std::string plain(std::string s) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return s;
}

std::string summary_text(const Loaded& l, const std::vector<KeyView>& keys) {
  constexpr size_t kMaxRows = 16;
  std::string s;
  for (const BenchInput& b : l.benches) {
    const Ceilings& k = b.ceilings;
    s += fmt::format("{} on {}: f32_fma {} GFLOP/s", plain(b.path), plain(b.device_kind),
                     num(k.f32));
    if (k.bf16 > 0) s += ", bf16_dot " + num(k.bf16) + " GFLOP/s";
    s += ", mem_read " + num(k.read) + " GB/s, mem_copy " + num(k.copy) + " GB/s\n";
    for (const std::string& w : b.warnings) s += "  warning: " + plain(w) + "\n";
    const std::vector<SpecHeadline> heads = spec_headlines(b);
    const bool all_tiny =
        std::all_of(heads.begin(), heads.end(), [](const SpecHeadline& h) { return h.tiny; });
    s += all_tiny ? "  fastest per spec (shapes too small for conclusions: they check the tools)\n"
                  : "  fastest per spec\n";
    size_t shown = 0;
    for (const SpecHeadline& h : heads) {
      if (!h.best) continue;
      if (shown++ == kMaxRows) break;
      const BenchRowIn& r = *h.best;
      const std::string vs =
          h.baseline ? fmt::format("{}x {}", num(h.baseline->median_ms / r.median_ms, 3),
                                   plain(h.baseline->implementation))
                     : "-";
      const std::string pct = r.peak.empty() ? "-" : num(r.pct, 3) + "% " + plain(r.peak);
      s += fmt::format("  {:<32.32} {:<14.14} {:>9} ms  {:<22.22} {}{}\n", plain(h.spec),
                       plain(r.implementation), num(r.median_ms), vs, pct,
                       h.tiny && !all_tiny ? "  (tiny)" : "");
    }
    if (shown > kMaxRows) s += fmt::format("  ... {} specs in all: see the report\n", heads.size());
  }
  if (!keys.empty()) s += "tuning: " + findings_sentence(tuning_findings(keys)) + "\n";
  return s;
}

}  // namespace tokamax::report::internal
