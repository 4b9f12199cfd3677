// The sections of the report page: the summary tables, a roofline section per bench document, a
// section per tuned key and a section per trace, as XHTML text around the charts. Each chart is
// followed by the table of its figures, so that a reader (or a script) can check every mark.
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

// ---------------------------------------------------------------- summary

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
           v(k.read), v(k.copy),
           k.from_rows ? "highest ceiling of its rows" : "tokamax device --roofline, same run"});
  }
  return c.html("Roofline ceilings (measured on all threads)");
}

std::string keys_table(const std::vector<KeyView>& keys) {
  Table k{{"op/implementation", "key", "candidates", "failed", "winner", "winner ms",
           "heuristics ms", "winner vs heuristics"},
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
           v.heur() ? num(v.heur()->b->median_ms) : "-", esc(speedup_text(v))});
  }
  return k.html("Tuned keys");
}

// ---------------------------------------------------------------- roofline

// Specs numbered in the order they first appear: the chart's labels (one number per row).
std::vector<int> spec_numbers(const std::vector<BenchRowIn>& rows) {
  std::vector<std::string> specs;
  std::vector<int> spec_index;
  for (const BenchRowIn& r : rows) {
    auto it = std::find(specs.begin(), specs.end(), r.spec);
    if (it == specs.end()) {
      specs.push_back(r.spec);
      it = specs.end() - 1;
    }
    spec_index.push_back(static_cast<int>(it - specs.begin()) + 1);
  }
  return spec_index;
}

std::string bench_rows_table(const BenchInput& b, const std::vector<int>& spec_index) {
  Table t{{"#", "spec", "implementation", "median ms", "IQR ms", "GFLOP", "MB moved", "bytes from",
           "FLOP/byte", "GFLOP/s", "GB/s", "% of ceiling", "ceiling", "vs other", "alloc MB",
           "config (source)"},
          {true, false, false, true, true, true, true, false, true, true, true, true, false, false,
           true, false},
          {}};
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const BenchRowIn& r = b.rows[i];
    if (!r.measured()) {
      t.add({std::to_string(spec_index[i]), esc(r.spec), esc(r.implementation), "-", "-", "-", "-",
             "-", "-", "-", "-", "-", "-", "-", "-",
             "failed: " + esc(r.source.empty() ? "no measurement" : r.source)});
      continue;
    }
    t.add({std::to_string(spec_index[i]), esc(r.spec), esc(r.implementation), num(r.median_ms),
           num(r.iqr_ms), num(r.flops / 1e9), num(r.bytes / 1e6),
           esc(r.bytes_source.empty() ? "-" : r.bytes_source),
           r.intensity() > 0 ? num(r.intensity()) : "-", num(r.gflops), num(r.gbps), num(r.pct, 3),
           esc(r.peak.empty() ? "-" : r.peak + " " + num(r.peak_value)),
           esc(r.baseline.empty() ? "-" : num(r.speedup, 3) + "x " + r.baseline),
           num(r.allocated / 1e6, 3),
           json_code(r.config) + (r.source.empty() ? "" : " (" + esc(r.source) + ")")});
  }
  return t.html("Every row of " + b.path);
}

std::string bench_section(const BenchInput& b, int n) {
  std::string s = fmt::format("<h3 id=\"roofline-{}\">{}</h3>", n, esc(b.path));
  const std::vector<int> spec_index = spec_numbers(b.rows);
  const bool any_point =
      std::any_of(b.rows.begin(), b.rows.end(), [](const BenchRowIn& r) { return r.plotted(); });
  if (b.ceilings.from_rows) {
    s += "<p class=\"muted\">This file holds no roofline (written by an older tokamax): the "
         "ceilings drawn are the highest its rows were compared against.</p>";
  }
  if (any_point) {
    s += chart([&] { return roofline_svg(b, spec_index); });
    s += "<p class=\"muted\">Each point is one row: a spec (its number) run by one "
         "implementation; filled markers are implementations, hollow ones a variant of one "
         "(pre-packed weights, pinned heuristics config). A point's height against the roof "
         "above it is the share of the machine it used. Bytes are what the op counts as its "
         "least traffic, or, where it counts none (compute-bound calls), its tensors' sizes, "
         "each read or written once (column \"bytes from\").</p>";
  } else {
    s += "<p>No row has a FLOP count and a time, so there is nothing to place on a roofline "
         "chart.</p>";
  }
  s += bench_rows_table(b, spec_index);
  return s;
}

// ---------------------------------------------------------------- tuned keys

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
  std::string s = fmt::format("<h3 id=\"{}\">{}/{} {}</h3>", key_anchor(n), esc(b.family()),
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

std::string trace_section(const TraceInput& t, int n, const KeyLabels& key_labels) {
  std::string s = fmt::format("<h3 id=\"trace-{}\">{}</h3>", n, esc(t.path));
  std::vector<const TraceCallGroup*> rows;
  double top_level_us = 0;
  int64_t calls = 0;
  for (const TraceCallGroup& g : t.groups) {
    rows.push_back(&g);
    top_level_us += g.total_us - g.nested_us;
    calls += g.calls;
  }
  std::stable_sort(rows.begin(), rows.end(), [](const TraceCallGroup* a, const TraceCallGroup* b) {
    return a->total_us > b->total_us;
  });
  constexpr size_t kChartRows = 40;
  s += fmt::format(
      "<p>{} op calls in {} groups (op, key, config, rung); {} ms in top-level calls{}. Shares "
      "are of that time: a call made inside another op's implementation is also inside the "
      "outer call's time.</p>",
      calls, rows.size(), num(top_level_us / 1e3),
      t.device_kind.empty() ? "" : ", recorded on device kind " + esc(t.device_kind));
  for (const std::string& w : t.warnings) s += "<p class=\"warn\">" + esc(w) + "</p>";
  const std::vector<const TraceCallGroup*> charted(
      rows.begin(), rows.begin() + static_cast<long>(std::min(rows.size(), kChartRows)));
  s += chart([&] { return trace_svg(t, charted, top_level_us, key_labels); });
  if (rows.size() > kChartRows) {
    s += fmt::format(
        "<p class=\"muted\">The chart shows the {} groups that took longest; the "
        "table has all {}.</p>",
        kChartRows, rows.size());
  }
  Table tb{
      {"op", "key", "config", "rung", "calls", "nested calls", "total ms", "mean us", "share %"},
      {false, false, false, false, true, true, true, true, true},
      {}};
  for (const TraceCallGroup* g : rows) {
    tb.add({esc(g->op), json_code(g->key), json_code(g->config), esc(g->rung),
            std::to_string(g->calls), std::to_string(g->nested_calls), num(g->total_us / 1e3),
            num(g->calls ? g->total_us / static_cast<double>(g->calls) : 0),
            num(top_level_us > 0 ? 100 * (g->total_us - g->nested_us) / top_level_us : 0, 3)});
  }
  s += tb.html("Every op, key and config in the trace, longest first");
  s += rung_table(t);
  return s;
}

}  // namespace

std::string summary_part(const Loaded& l, const std::vector<KeyView>& keys) {
  std::string h = "<h2 id=\"summary\">Summary</h2>";
  if (!l.skipped.empty()) {
    h += "<div class=\"warn\"><p><b>Skipped inputs</b>: these files could not be used; the "
         "report shows the rest.</p><ul>";
    for (const auto& [path, why] : l.skipped) h += "<li>" + code(path) + ": " + esc(why) + "</li>";
    h += "</ul></div>";
  }
  h += inputs_table(l);
  if (!l.benches.empty()) h += ceilings_table(l.benches);
  if (!keys.empty()) h += keys_table(keys);
  return h;
}

std::string roofline_part(const Loaded& l) {
  std::string h = "<h2 id=\"roofline\">Roofline</h2>";
  if (l.benches.empty()) h += "<p class=\"muted\">No benchmark file given (--bench).</p>";
  for (size_t i = 0; i < l.benches.size(); ++i)
    h += bench_section(l.benches[i], static_cast<int>(i));
  return h;
}

std::string tuning_part(const std::vector<KeyView>& keys) {
  std::string h = "<h2 id=\"tuning\">Tuned keys</h2>";
  if (keys.empty()) {
    h += "<p class=\"muted\">No autotuning result given.</p>";
  } else {
    h += kTuningNote;
  }
  for (size_t i = 0; i < keys.size(); ++i) h += key_section(keys[i], static_cast<int>(i));
  return h;
}

std::string trace_part(const Loaded& l, const KeyLabels& key_labels) {
  std::string h = "<h2 id=\"trace\">Trace</h2>";
  if (l.traces.empty()) h += "<p class=\"muted\">No trace given (--trace).</p>";
  for (size_t i = 0; i < l.traces.size(); ++i)
    h += trace_section(l.traces[i], static_cast<int>(i), key_labels);
  return h;
}

}  // namespace tokamax::report::internal
