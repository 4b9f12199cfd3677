// `tokamax report`'s page: every section from real result, bench and trace files, the figures
// behind each chart in its table, escaping, well-formedness, and inputs that cannot be used.
#include "report/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "report/charts.h"
#include "report/inputs.h"
#include "report/keys.h"
#include "report/svg.h"
#include "tests/op/fake_ops.h"
#include "tests/report/xml_check.h"

namespace tokamax::report {
namespace {

using testing::fake;
using testing::fake_call;
using testing::xml_problem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake();  // result files of the fake family load through its registration
    dir_ = std::filesystem::temp_directory_path() / ("tokamax_report_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name)) << text;
    return path(name);
  }

  static AutotuneOptions quick() {
    AutotuneOptions o;
    o.rounds.first_rounds = 2;
    o.rounds.max_rounds = 6;
    o.sample_min_ms = 0.2;
    o.candidate_timeout_s = 0.5;
    return o;
  }

  // A result file of two keys as `tokamax autotune -o` writes it: one_field (tile 3 fastest,
  // the heuristics config tile 1 slowest) and throws (its search-space config fails).
  std::string result_file(AutotuningResult* out = nullptr) const {
    AutotuningResult r;
    for (const char* impl : {"one_field", "throws"}) {
      const BoundArguments b = fake_call()->bound.with_implementation(impl);
      r.add(b, Autotuner(quick()).tune(b));
    }
    Json j = Json::parse(r.dumps());
    j["command"] = "tokamax autotune --tag smoke -o r.json";
    j["created"] = "2025-01-02T03:04:05Z";
    if (out) *out = r;
    return write("r.json", j.dump(1));
  }

  static Json bench_row(const std::string& spec, const std::string& impl, double ms) {
    const double flops = 2e9, bytes = 1e8;
    return {{"spec", spec},
            {"implementation", impl},
            {"config", "{\"tile\":3}"},
            {"config_source", "scope"},
            {"median_ms", ms},
            {"iqr_ms", ms / 10},
            {"flops", flops},
            {"bytes", bytes},
            {"arithmetic_intensity", flops / bytes},
            {"gflops", flops / (ms * 1e-3) / 1e9},
            {"gbps", bytes / (ms * 1e-3) / 1e9},
            {"pct_of_peak", 50},
            {"peak", "f32_fma"},
            {"peak_value", 400},
            {"baseline", "blas"},
            {"speedup_vs_baseline", 2},
            {"allocated_bytes", 0}};
  }

  std::string bench_file() const {
    Json rows = Json::array(
        {bench_row("spec <&\"'>", "native", 10), bench_row("spec <&\"'>", "native:packed", 8),
         bench_row("spec <&\"'>", "blas", 20), bench_row("decode", "native", 40)});
    rows[3]["flops"] = 1e8;  // 1 FLOP/byte: on the memory roof's side of the chart
    rows[3]["gflops"] = 1e8 / 40e-3 / 1e9;
    Json failed = bench_row("decode", "blas", 0);
    failed["config_source"] = "error: blas refused <this>";
    rows.push_back(failed);
    const Json doc = {{"tokamax_version", "0.1.0"},
                      {"device_kind", "test_kind"},
                      {"device", {{"model_name", "Test CPU"}}},
                      {"roofline",
                       {{"threads", 2},
                        {"f32_fma_gflops_all", 400.0},
                        {"bf16_dot_gflops_all", 200.0},
                        {"bf16_dot_unit", "amx"},
                        {"mem_read_gbps_all", 50.0},
                        {"mem_copy_gbps_all", 40.0}}},
                      {"command", "tokamax bench --tag smoke -o b.json"},
                      {"created", "2025-01-02T03:05:00Z"},
                      {"rows", rows}};
    return write("b.json", doc.dump(2));
  }

  static Json trace_event(const std::string& rung, int tile, double dur, bool nested = false) {
    const Json payload = {{"op",
                           {{"family", "fake"},
                            {"implementation", "one_field"},
                            {"config", {{"tile", tile}}},
                            {"rung", rung}}},
                          {"arguments", {{"x", "f32[64]"}, {"num_threads", 2}}}};
    const std::string own = "tokamax:" + payload.dump();
    return {{"ph", "X"},
            {"name", "fake/one_field"},
            {"ts", 0},
            {"dur", dur},
            {"pid", 1},
            {"tid", 1},
            {"args", {{"payload", nested ? "tokamax:{\"op\":{}}/" + own : own}}}};
  }

  std::string trace_file() const {
    const Json doc = {
        {"traceEvents",
         {{{"ph", "M"}, {"name", "process_name"}, {"args", {{"name", "tokamax (test_kind)"}}}},
          trace_event("scope", 3, 600),
          trace_event("scope", 3, 300),
          trace_event("heuristics", 1, 100),
          trace_event("heuristics", 1, 50, true)}}};
    return write("t.json", doc.dump());
  }

  std::filesystem::path dir_;
};

TEST_F(ReportTest, RendersEverySectionWithTheFiguresBehindItsCharts) {
  AutotuningResult tuned;
  const Report r = build_report({{result_file(&tuned)}, {bench_file()}, {trace_file()}},
                                {"tokamax report r.json -o x.html", "2025-01-02T04:00:00Z"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(r.used, 3);
  const std::string& h = r.html;
  EXPECT_EQ(xml_problem(h), "");
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  // Self-contained: nothing to fetch and a policy that would refuse it anyway.
  EXPECT_NE(h.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  for (const char* remote : {"<script", "src=", "href=\"http", "url(http", "@import"})
    EXPECT_EQ(h.find(remote), std::string::npos) << remote;

  // The parts in the order a performance engineer reads them: what won first, then the charts,
  // the detail tables, and the inputs last (no warnings: every input was used).
  EXPECT_EQ(h.find("id=\"warnings\""), std::string::npos);
  const size_t headline = h.find("<h2 id=\"headline\">"), charts = h.find("<h2 id=\"charts\">"),
               details = h.find("<h2 id=\"details\">"), inputs = h.find("<h2 id=\"inputs\">");
  ASSERT_NE(inputs, std::string::npos);
  EXPECT_LT(headline, charts);
  EXPECT_LT(charts, details);
  EXPECT_LT(details, inputs);
  EXPECT_LT(h.find("Roofline of "), details);
  EXPECT_LT(h.find("Time per op and key in "), details);
  EXPECT_GT(h.find("<caption>Tuned keys</caption>"), details);
  EXPECT_GT(h.find("<caption>Every row of "), details);

  // The same headline as console text (`tokamax report` prints it, `make run` ends with it).
  for (const char* s :
       {"fastest per spec (shapes too small for conclusions", "native:packed", "2.5x blas",
        "50% f32_fma", "tuning: 2 keys tuned; 1 stored a config confidently faster"})
    EXPECT_NE(r.summary.find(s), std::string::npos) << s << "\n" << r.summary;
  EXPECT_EQ(r.summary.find("&lt;"), std::string::npos) << r.summary;  // text, not HTML
  EXPECT_EQ(r.summary.find("<b>"), std::string::npos) << r.summary;

  // Headline: per spec the fastest implementation, its ratio to the fastest other
  // implementation (native:packed is native's variant, so blas is its baseline), its share of
  // the ceiling it names; the ceilings; the smoke note; what tuning found.
  const std::string head = h.substr(headline, charts - headline);
  for (const char* s :
       {"<td>spec &lt;&amp;&quot;&#39;&gt;</td><td><b>native:packed</b></td><td class=\"n\">8</td>"
        "<td><b>2.5x</b> faster than blas (20 ms)</td><td>50% of f32_fma 400 GFLOP/s</td>",
        "<td>decode</td><td><b>native</b></td><td class=\"n\">40</td><td>no other implementation "
        "measured</td>",
        "f32_fma 400 GFLOP/s, bf16_dot 200 GFLOP/s (amx), mem_read 50 GB/s, mem_copy 40 GB/s",
        "Shapes too small for conclusions.", "are smoke specs or calls under 50 us",
        "<th>% of its ceiling</th></tr>",  // no note column: the note above says all are tiny
        "<b>What tuning found</b>: 2 keys tuned; 1 stored a config confidently faster than "
        "the heuristics config (",
        "1 kept the heuristics config", "Keys where tuning stored a faster config"})
    EXPECT_NE(head.find(s), std::string::npos) << s << "\n" << head;

  // Inputs: each with its provenance, the ceilings, the report's own command.
  for (const char* s : {"tokamax report r.json -o x.html", "2025-01-02T04:00:00Z",
                        "tokamax autotune --tag smoke -o r.json", "2025-01-02T03:04:05Z",
                        "tokamax bench --tag smoke -o b.json", "Test CPU", "test_kind"})
    EXPECT_NE(h.find(s), std::string::npos) << s;

  // Roofline: the ceilings as labelled lines, one marker per measured row with its tooltip,
  // the failed row in the table with its reason, a spec name with markup escaped.
  for (const char* s :
       {"f32 FMA 400 GFLOP/s", "bf16 AMX 200 GFLOP/s", "200 (amx)", "memory read 50 GB/s",
        "memory copy 40 GB/s", "arithmetic intensity (FLOP/byte)", "achieved GFLOP/s",
        "#1 spec &lt;&amp;&quot;&#39;&gt; / native: 20 FLOP/byte, 200 GFLOP/s",
        "#1 spec &lt;&amp;&quot;&#39;&gt; / native:packed: 20 FLOP/byte, 250 GFLOP/s",
        "#1 spec &lt;&amp;&quot;&#39;&gt; / blas: 20 FLOP/byte, 100 GFLOP/s",
        "#2 decode / native: 1 FLOP/byte, 2.5 GFLOP/s", "failed: error: blas refused &lt;this&gt;"})
    EXPECT_NE(h.find(s), std::string::npos) << s;
  EXPECT_EQ(h.find("spec <&"), std::string::npos);
  EXPECT_EQ(h.find("#2 decode / blas"), std::string::npos);  // nothing to plot

  // Tuned keys: the candidates' chart and table, the marks, the window, the speed-up.
  const AutotuningData& d = tuned.data()[0].second;
  const std::string winner = d.fastest().config.str();
  const std::string heur = d.heuristics()->str();
  ASSERT_NE(winner, heur);
  const double speedup =
      d.entries().at(heur).benchmark->median_ms / d.entries().at(winner).benchmark->median_ms;
  for (const std::string& s :
       {std::string("Candidates of fake/one_field f32[64]"), xml_escape(winner),
        std::string("winner, finalist"), std::string("heuristics config"),
        std::string("tie window: ") + format_number(d.best_median_ms(), 4),
        "so the winner is <b>" + format_number(speedup, 3) + "x</b>",
        format_number(speedup, 3) + "x</td>"})
    EXPECT_NE(h.find(s), std::string::npos) << s;
  // Every candidate's median is in the table.
  for (const auto& [cfg, e] : d.entries()) {
    EXPECT_NE(h.find("<td class=\"n\">" + format_number(e.benchmark->median_ms, 4) + "</td>"),
              std::string::npos)
        << cfg;
  }
  // The failing key lists its failure with the reason.
  EXPECT_NE(h.find("Failed candidates and why"), std::string::npos);
  EXPECT_NE(h.find("boom"), std::string::npos);

  // Trace: time per op and key, the rung of each config, shares of the top-level time (the
  // nested call's 50 us is inside another call's time: 1000 us at the top level).
  for (const char* s : {"0.9 ms, 90%, 2 calls, scope", "0.15 ms, 10%, 2 calls, heuristics",
                        "rung that chose the config:", "recorded on device kind test_kind",
                        "Calls by the rung of the resolution ladder"})
    EXPECT_NE(h.find(s), std::string::npos) << s;
}

TEST_F(ReportTest, SkipsWhatItCannotUseAndSaysWhy) {
  const std::string bench = bench_file();
  const Report r = build_report(
      {{path("missing.json"), write("bad.json", "{\"device_kind\": \"x\", \"da"), dir_.string()},
       {bench, write("not_bench.json", "{\"rows\": 3}")},
       {write("empty_trace.json", "{\"traceEvents\": []}")}},
      {"cmd", "now"});
  EXPECT_EQ(r.used, 1);
  ASSERT_EQ(r.skipped.size(), 5u);
  EXPECT_EQ(r.skipped[0], "'" + path("missing.json") + "': no such file");
  EXPECT_NE(r.skipped[1].find("'" + path("bad.json") + "': malformed JSON"), std::string::npos)
      << r.skipped[1];
  EXPECT_EQ(r.skipped[2], "'" + dir_.string() + "': a directory, not a file");
  EXPECT_NE(r.skipped[3].find("not a tokamax bench document"), std::string::npos) << r.skipped[3];
  EXPECT_EQ(r.skipped[4], "'" + path("empty_trace.json") + "': no tokamax op events");
  EXPECT_EQ(xml_problem(r.html), "");
  EXPECT_NE(r.html.find("Skipped inputs"), std::string::npos);
  for (const char* f : {"missing.json", "bad.json", "not_bench.json", "empty_trace.json"})
    EXPECT_NE(r.html.find(path(f) + "</code>: "), std::string::npos) << f;
  EXPECT_NE(r.html.find("Roofline of " + bench), std::string::npos);  // the valid one renders
  EXPECT_NE(r.html.find("No autotuning result given"), std::string::npos);
}

// A trace event of tokamax's with a mistyped field is left out of the charts, and the page says
// so (it was counted as a call of no time, or of an op without a name).
TEST_F(ReportTest, TraceEventsWithMistypedFieldsAreNamed) {
  Json bad = trace_event("scope", 3, 600);
  bad["dur"] = "600";
  const Json doc = {{"traceEvents", {trace_event("scope", 3, 300), bad}}};
  const Report r = build_report({{}, {}, {write("mistyped.json", doc.dump())}}, {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(xml_problem(r.html), "");
  // Among the warnings at the top of the page, before the headline.
  const size_t warning = r.html.find(
      "<li><code>" + path("mistyped.json") +
      "</code>: the file: skipped 1 tokamax event: &#39;dur&#39; is missing or not a number");
  EXPECT_NE(warning, std::string::npos) << r.html;
  EXPECT_LT(r.html.find("id=\"warnings\""), warning);
  EXPECT_LT(warning, r.html.find("id=\"headline\""));
  EXPECT_NE(r.html.find("1 op calls in 1 groups"), std::string::npos);
  // With nothing left, the file is skipped, and why.
  const Report only_bad = build_report(
      {{}, {bench_file()}, {write("bad.json", Json::array({bad}).dump())}}, {"cmd", "now"});
  ASSERT_EQ(only_bad.skipped.size(), 1u);
  EXPECT_NE(only_bad.skipped[0].find("no tokamax op events that could be read: the file: skipped "
                                     "1 tokamax event: 'dur'"),
            std::string::npos)
      << only_bad.skipped[0];
}

TEST_F(ReportTest, NoInputOrNothingUsableIsAnError) {
  EXPECT_THROW(build_report({}, {}), InvalidArgument);
  try {
    build_report({{path("a.json")}, {write("b.json", "[]")}, {}}, {});
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("none of the inputs can be used"), std::string::npos) << what;
    EXPECT_NE(what.find(path("a.json") + "': no such file"), std::string::npos) << what;
    EXPECT_NE(what.find(path("b.json") + "': no benchmark rows"), std::string::npos) << what;
  }
}

TEST_F(ReportTest, OlderFilesStillRender) {
  // A bench file from before the document form: a bare list of rows without FLOP and byte
  // counts (they follow from the rates) and a result file without the heuristics mark.
  Json row = bench_row("old", "native", 10);
  for (const char* k : {"flops", "bytes", "arithmetic_intensity"}) row.erase(k);
  const std::string bench = write("old_bench.json", Json::array({row}).dump());
  AutotuningResult tuned;
  result_file(&tuned);
  Json j = Json::parse(tuned.dumps());
  for (auto& entry : j["data"][0][1]) entry.erase("heuristics");
  const std::string result = write("old_result.json", j.dump());
  const Report r = build_report({{result}, {bench}, {}}, {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(xml_problem(r.html), "");
  EXPECT_NE(r.html.find("holds no roofline"), std::string::npos);
  EXPECT_NE(r.html.find("f32 FMA 400 GFLOP/s"), std::string::npos);  // the row's ceiling
  EXPECT_NE(r.html.find("#1 old / native: 20 FLOP/byte, 200 GFLOP/s"), std::string::npos);
  EXPECT_NE(r.html.find("heuristics config not recorded in this file"), std::string::npos);
}

// Numbers a file may hold that no bench run writes (found by fuzz_report): counts beyond any
// integer type (converting them was undefined), rates and ceilings at the ends of the double
// range. The page still renders; a count it cannot hold reads as not said.
TEST_F(ReportTest, ExtremeNumbersInABenchFile) {
  Json row = bench_row("huge", "native", 1e-300);
  row["allocated_bytes"] = 1e300;
  row["gflops"] = 1e308;
  row["flops"] = 1e308;
  row["bytes"] = 1e-300;
  Json small = bench_row("small", "blas", 1e300);
  small["allocated_bytes"] = -5;
  const Json doc = {{"roofline",
                     {{"threads", 1e300},
                      {"f32_fma_gflops_all", 1e308},
                      {"mem_read_gbps_all", 1e-308},
                      {"mem_copy_gbps_all", -1}}},
                    {"rows", {row, small}}};
  const Report r = build_report({{}, {write("extreme.json", doc.dump())}, {}}, {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(xml_problem(r.html), "");
  // The chart cannot place an infinite intensity (it says so); the table has every row.
  EXPECT_NE(r.html.find("Every row of " + path("extreme.json")), std::string::npos);
}

// A page is XML only if every character in it is one XML allows: a spec name holding U+FFFE or
// U+FFFF (JSON may escape them) and a file name of bytes that are not UTF-8 (Linux allows any)
// made pages an XML reader refused whole. Each becomes U+FFFD; the rest of the name stays.
TEST_F(ReportTest, NamesOfAnyBytesKeepThePageWellFormed) {
  const Json doc = {{"rows", {bench_row("x\xEF\xBF\xBE\xEF\xBF\xBF\x01y", "native", 10)}}};
  ASSERT_NE(doc.dump().find("\xEF\xBF\xBE"), std::string::npos);  // U+FFFE as UTF-8, unescaped
  // Not UTF-8 at all (0xFF, 0xFE), a lone surrogate's encoding (ED A0 80), a cut sequence (E2 82).
  const std::string name = std::string("b\xFF\xFE-\xED\xA0\x80-\xE2\x82.json");
  const std::string bench = write(name, doc.dump());
  const Report r = build_report({{}, {bench}, {}}, {"tokamax report \xC0\xAF", "now"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(xml_problem(r.html), "");
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_NE(r.html.find("x" + fffd + fffd + "?y"), std::string::npos);
  EXPECT_NE(r.html.find("b" + fffd + fffd + "-" + fffd + fffd + fffd + "-" + fffd + fffd + ".json"),
            std::string::npos);
  EXPECT_NE(r.html.find("tokamax report " + fffd + fffd), std::string::npos);  // overlong '/'
}

// ---------------------------------------------------------------- statistics and layout

std::string fixture(const std::string& name) {
  return std::string(TOKAMAX_SOURCE_DIR) + "/tests/report/data/" + name;
}

// A candidate's bar and whisker as the page draws them: the figures in the group's data
// attributes, and in pixels the bar's end and the whisker's ends.
struct Plotted {
  double median, q1, q3;
  double bar_end, whisker_lo, whisker_hi;
};

std::vector<Plotted> plotted_candidates(const std::string& html) {
  static const std::regex group(
      "<g class=\"candidate\" data-median=\"([^\"]*)\" data-q1=\"([^\"]*)\" "
      "data-q3=\"([^\"]*)\">(.*?)</g>");
  static const std::regex rect("<rect x=\"([^\"]*)\" y=\"[^\"]*\" width=\"([^\"]*)\"");
  static const std::regex line("<line x1=\"([^\"]*)\" y1=\"[^\"]*\" x2=\"([^\"]*)\"");
  std::vector<Plotted> out;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), group);
       it != std::sregex_iterator(); ++it) {
    const std::string inner = (*it)[4];
    std::smatch r, l;
    if (!std::regex_search(inner, r, rect) || !std::regex_search(inner, l, line)) {
      ADD_FAILURE() << "a candidate without its bar or whisker: " << inner;
      continue;
    }
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]),
                   std::stod(r[1]) + std::stod(r[2]), std::stod(l[1]), std::stod(l[2])});
  }
  return out;
}

// Every plotted median lies within its whisker: in the figures, and in the drawing (pixels are
// written to a tenth).
void expect_medians_within_whiskers(const std::string& html, size_t at_least) {
  const std::vector<Plotted> p = plotted_candidates(html);
  EXPECT_GE(p.size(), at_least);
  for (const Plotted& c : p) {
    EXPECT_LE(c.q1, c.median);
    EXPECT_LE(c.median, c.q3);
    EXPECT_LE(c.whisker_lo, c.bar_end + 0.11) << c.median << " in [" << c.q1 << ", " << c.q3 << "]";
    EXPECT_LE(c.bar_end, c.whisker_hi + 0.11) << c.median << " in [" << c.q1 << ", " << c.q3 << "]";
  }
}

// Real `tokamax autotune --op ragged_dot --tag smoke -o` output from a busy 2-core machine: the
// rounds' figures and the raw samples disagree (a raw median 6x the median the tuner ranked
// by). Plotting the rounds' median with the raw samples' quartiles put a median below its own
// first quartile; bar and whisker now come from one statistic.
TEST_F(ReportTest, EveryPlottedMedianLiesWithinItsWhisker) {
  const std::string real = fixture("ragged_dot_smoke_result.json");
  // The fixture holds the case: a candidate whose median_ms is outside its raw samples'
  // interquartile range.
  const AutotuningResult tuned = AutotuningResult::load(real);
  bool outside = false;
  for (const auto& [b, d] : tuned.data()) {
    for (const auto& [cfg, e] : d.entries()) {
      if (!e.benchmark || e.benchmark->samples_ms.empty()) continue;
      const SampleStats raw = SampleStats::of(e.benchmark->samples_ms);
      outside |= e.benchmark->median_ms < raw.q1_ms || e.benchmark->median_ms > raw.q3_ms;
    }
  }
  ASSERT_TRUE(outside) << "the fixture no longer shows what this test guards against";
  const Report r = build_report({{real, result_file()}, {}, {}}, {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty());
  EXPECT_EQ(xml_problem(r.html), "");
  expect_medians_within_whiskers(r.html, 12);
  // The page says which statistic it plots, and shows the raw samples' median beside it.
  EXPECT_NE(r.html.find("A bar and its whisker come from one statistic"), std::string::npos);
  EXPECT_NE(r.html.find("raw samples&#39; median ms"), std::string::npos);
  EXPECT_NE(r.html.find("rounds (9 of 46 samples)"), std::string::npos);
}

TEST(ReportSpread, OneStatisticForTheMedianAndItsQuartiles) {
  // Two accepted ratios: the tuner's median ratio is the lower one (0.9), where an interpolated
  // lower quartile (0.925) would lie above it.
  BenchmarkData b;
  b.samples_ms = {1.0, 5.0, 1.2};
  b.ratios = {0.9, std::nan(""), 1.0};
  b.sample_rounds = {1, 2, 3};
  b.ratio = 0.9;
  b.median_ms = 0.45;  // 0.9 times a quiet time of 0.5 ms
  internal::Spread s = internal::spread_of(b);
  EXPECT_EQ(s.basis, internal::Spread::Basis::kRounds);
  EXPECT_DOUBLE_EQ(s.median, 0.45);
  EXPECT_DOUBLE_EQ(s.q1, 0.45);
  EXPECT_DOUBLE_EQ(s.q3, 0.5);
  EXPECT_EQ(s.accepted, 2u);
  EXPECT_DOUBLE_EQ(s.raw_median, 1.2);
  EXPECT_EQ(internal::basis_text(s), "rounds (2 of 3 samples)");
  // The control: newer files set its ratio to 1 (its median_ms is its quiet time) while its
  // own ratios spread around another median; its whisker is that spread, through its bar.
  BenchmarkData control = b;
  control.ratios = {0.2, 0.9, 3.0};
  control.ratio = 1;
  control.median_ms = 0.5;
  s = internal::spread_of(control);
  EXPECT_DOUBLE_EQ(s.median, 0.5);
  EXPECT_DOUBLE_EQ(s.q1, 0.5 * 0.2 / 0.9);
  EXPECT_DOUBLE_EQ(s.q3, 0.5 * 3.0 / 0.9);
  // No accepted round: the raw samples' median and quartiles.
  b.ratios = {std::nan(""), std::nan(""), std::nan("")};
  b.median_ms = 1.2;
  s = internal::spread_of(b);
  EXPECT_EQ(s.basis, internal::Spread::Basis::kSamples);
  EXPECT_DOUBLE_EQ(s.q1, 1.0);
  EXPECT_DOUBLE_EQ(s.q3, 5.0);
  // An older file: no samples, the median and its IQR.
  BenchmarkData old;
  old.median_ms = 2;
  old.iqr_ms = 0.5;
  s = internal::spread_of(old);
  EXPECT_EQ(s.basis, internal::Spread::Basis::kFile);
  EXPECT_DOUBLE_EQ(s.q1, 1.75);
  EXPECT_DOUBLE_EQ(s.q3, 2.25);
  // Whatever the ratios, the median stays within its quartiles (rank, not interpolation).
  for (int n = 1; n <= 9; ++n) {
    BenchmarkData k;
    for (int i = 0; i < n; ++i) {
      k.ratios.push_back(1 + 0.37 * ((i * 7) % n));
      k.samples_ms.push_back(1);
      k.sample_rounds.push_back(i);
    }
    std::vector<double> sorted = k.ratios;
    std::sort(sorted.begin(), sorted.end());
    k.ratio = sorted[(sorted.size() - 1) / 2];
    k.median_ms = k.ratio * 0.123;
    const internal::Spread p = internal::spread_of(k);
    EXPECT_LE(p.q1, p.median) << n;
    EXPECT_LE(p.median, p.q3) << n;
  }
}

// The roofline's labels: each roof drawn in its own style, no label covering another label or a
// marker, no roof line through a roof's label.
void expect_clear_roofline(const internal::BenchInput& b) {
  std::vector<int> numbers;
  std::vector<std::string> specs;
  for (const internal::BenchRowIn& r : b.rows) {
    auto it = std::find(specs.begin(), specs.end(), r.spec);
    if (it == specs.end()) it = specs.insert(specs.end(), r.spec);
    numbers.push_back(static_cast<int>(it - specs.begin()) + 1);
  }
  const internal::RooflineLayout l = internal::roofline_layout(b, numbers);
  std::set<std::string> dashes;
  for (const internal::RoofLine& r : l.roofs) {
    EXPECT_TRUE(dashes.insert(r.dash).second) << r.name << " shares its dashes";
  }
  std::vector<internal::PlacedLabel> labels = l.roof_labels;
  labels.insert(labels.end(), l.point_labels.begin(), l.point_labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    for (size_t j = i + 1; j < labels.size(); ++j) {
      EXPECT_FALSE(labels[i].box.overlaps(labels[j].box))
          << "'" << labels[i].text << "' and '" << labels[j].text << "' overlap";
    }
    for (const Box& m : l.markers) {
      EXPECT_FALSE(labels[i].box.overlaps(m)) << "'" << labels[i].text << "' covers a marker";
    }
  }
  for (const internal::PlacedLabel& p : l.roof_labels) {
    for (const internal::RoofLine& r : l.roofs) {
      EXPECT_FALSE(r.drawn && crosses(p.box, r.x0, r.y0, r.x1, r.y1))
          << r.name << " crosses '" << p.text << "'";
    }
  }
  // Every roof drawn has its label beside it.
  const auto drawn = std::count_if(l.roofs.begin(), l.roofs.end(),
                                   [](const internal::RoofLine& r) { return r.drawn; });
  EXPECT_EQ(static_cast<long>(l.roof_labels.size()), drawn);
  EXPECT_EQ(l.point_labels.size() + static_cast<size_t>(l.unlabelled), l.markers.size());
}

TEST_F(ReportTest, RooflineLabelsDoNotOverlap) {
  // Real `tokamax bench --tag smoke -o` output: 80 rows of 11 op families.
  const internal::Loaded real = internal::load_all({{}, {fixture("smoke_bench.json")}, {}});
  ASSERT_EQ(real.benches.size(), 1u);
  expect_clear_roofline(real.benches[0]);
  EXPECT_EQ(real.benches[0].rows.size(), 80u);
  // Close roofs (memory read and copy 5% apart, the compute roofs 10%) and a crowd of points
  // at one place: labels move or are left out, never overlap.
  internal::BenchInput crowded;
  crowded.ceilings = {115, 127, 21.4, 22.4, "", 2, false};
  for (int i = 0; i < 30; ++i) {
    internal::BenchRowIn r;
    r.spec = "s";  // (in two steps: GCC 12 warns -Wrestrict on "s" + to_string(...) here)
    r.spec += std::to_string(i % 12);
    r.implementation = i % 3 == 0 ? "native" : i % 3 == 1 ? "native:packed" : "blas";
    r.median_ms = 1;
    r.flops = 1e6 * (1 + 0.01 * i);
    r.bytes = 1e5;
    r.gflops = 20 + 0.1 * i;
    crowded.rows.push_back(r);
  }
  expect_clear_roofline(crowded);
}

// Every label of every chart lies within its chart and covers no other: long configs, keys and
// tags are cut (their full text in a tooltip) or the label column widens, never cut off by the
// chart's edge; value axes get fewer ticks when the plot is narrow.
TEST_F(ReportTest, EveryChartLabelFitsItsChart) {
  // A trace whose key label is long, and the real inputs.
  Json event = trace_event("a_rung_with_a_long_name_from_a_future_version", 3, 1234567);
  Json payload = Json::parse(event["args"]["payload"].get<std::string>().substr(8));
  for (int i = 0; i < 12; ++i) payload["arguments"]["x" + std::to_string(i)] = "f32[4096,4096]";
  event["args"]["payload"] = "tokamax:" + payload.dump();
  const std::string trace = write("long.json", Json({{"traceEvents", {event}}}).dump());
  const Report r = build_report({{fixture("ragged_dot_smoke_result.json"), result_file()},
                                 {fixture("smoke_bench.json")},
                                 {trace, trace_file()}},
                                {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty());
  static const std::regex svg_re("<svg [^>]*width=\"([^\"]*)\"[^>]*>(.*?)</svg>");
  static const std::regex text_re("<text ([^>]*)>(?:<title>([^<]*)</title>)?([^<]*)</text>");
  static const std::regex attr_re("([a-z-]+)=\"([^\"]*)\"");
  int charts = 0, texts = 0, titled = 0;
  for (auto s = std::sregex_iterator(r.html.begin(), r.html.end(), svg_re);
       s != std::sregex_iterator(); ++s, ++charts) {
    const double width = std::stod((*s)[1]);
    const std::string body = (*s)[2];
    std::vector<std::pair<Box, std::string>> boxes;
    for (auto t = std::sregex_iterator(body.begin(), body.end(), text_re);
         t != std::sregex_iterator(); ++t) {
      std::map<std::string, std::string> a;
      const std::string attrs = (*t)[1];
      for (auto m = std::sregex_iterator(attrs.begin(), attrs.end(), attr_re);
           m != std::sregex_iterator(); ++m)
        a[(*m)[1]] = (*m)[2];
      if (a.count("transform")) continue;  // the rotated axis title
      TextStyle st;
      st.size = std::stod(a["font-size"]);
      st.bold = a.count("font-weight") > 0;
      st.monospace = a.count("font-family") > 0;
      st.anchor = a["text-anchor"] == "end"      ? TextStyle::Anchor::kEnd
                  : a["text-anchor"] == "middle" ? TextStyle::Anchor::kMiddle
                                                 : TextStyle::Anchor::kStart;
      // Entities count as the one character they stand for.
      const std::string shown =
          std::regex_replace(std::string((*t)[3]), std::regex("&[^;]+;"), "x");
      const Box b = text_box(std::stod(a["x"]), std::stod(a["y"]), shown, st);
      EXPECT_GE(b.x0, 0) << shown;
      EXPECT_LE(b.x1, width) << shown;
      // Nor does a label cover another one of its chart (tick labels, row labels, tags,
      // legends, a roofline's labels).
      for (const auto& [other, text] : boxes) {
        EXPECT_FALSE(b.overlaps(other)) << "'" << shown << "' and '" << text << "' overlap";
      }
      boxes.emplace_back(b, shown);
      ++texts;
      titled += (*t)[2].matched;
    }
  }
  EXPECT_GE(charts, 1 + 2 + 6 + 2);  // a roofline, two traces, the keys of two result files
  EXPECT_GT(texts, 200);
  EXPECT_GT(titled, 0);  // the long trace label, cut, with its full text as a tooltip
  EXPECT_NE(r.html.find("<title>fake/one_field f32[64] x f32[4096,4096] x"), std::string::npos);
}

TEST_F(ReportTest, BenchWarningsBusyCeilingsAndCacheStates) {
  Json rows = Json::array({bench_row("big", "native", 2), bench_row("big", "blas", 3),
                           bench_row("tiny", "native", 0.01)});
  rows[0]["cache_state"] = "cold";
  rows[1]["cache_state"] = "warm";
  rows[2]["cache_state"] = "";  // not said (bench writes it so for a row that failed)
  const Json doc = {{"roofline", {{"f32_fma_gflops_all", 400.0}, {"busy", true}}},
                    {"warnings",
                     {"machine busy: load 3.2 on 2 cores <b>",
                      "f32_fma ceiling 27.4 GFLOP/s is 76% below the shipped 115"}},
                    {"command", "tokamax bench --op x -o b.json"},
                    {"rows", rows}};
  const Report r = build_report({{}, {write("w.json", doc.dump())}, {}}, {"cmd", "now"});
  EXPECT_TRUE(r.skipped.empty()) << r.skipped[0];
  const std::string& h = r.html;
  EXPECT_EQ(xml_problem(h), "");
  // The warnings first, before the headline.
  const size_t warnings = h.find("id=\"warnings\""), headline = h.find("id=\"headline\"");
  ASSERT_NE(warnings, std::string::npos);
  EXPECT_LT(warnings, headline);
  for (const char* s : {"machine busy: load 3.2 on 2 cores &lt;b&gt;",
                        "f32_fma ceiling 27.4 GFLOP/s is 76% below the shipped 115",
                        "the machine was busy while its ceilings were measured"}) {
    const size_t at = h.find(s);
    EXPECT_NE(at, std::string::npos) << s;
    EXPECT_LT(at, headline) << s;
  }
  // Cold or warm per row, in the headline and the detail table; the ceiling used.
  EXPECT_NE(h.find("<td class=\"n\">2 cold</td><td><b>1.5x</b> faster than blas (3 ms)</td>"
                   "<td>50% of f32_fma 400 GFLOP/s</td>"),
            std::string::npos);
  EXPECT_NE(h.find("<th>cache</th>"), std::string::npos);
  EXPECT_NE(h.find("<td>warm</td>"), std::string::npos);
  EXPECT_NE(h.find("<td>native</td><td class=\"n\">0.01</td><td class=\"n\">0.001</td><td>-</td>"),
            std::string::npos);  // the tiny row says neither
  EXPECT_NE(h.find("on a machine it judged busy"), std::string::npos);
  // One tiny spec of two: named as such, the other not.
  EXPECT_NE(h.find("1 of the 2 specs of"), std::string::npos);
  EXPECT_NE(h.find("<td>tiny</td><td><b>native</b></td>"), std::string::npos);
  EXPECT_NE(h.find("<td>tiny: for checking the tools only</td>"), std::string::npos);
  EXPECT_NE(h.find("<th>note</th>"), std::string::npos);

  // Without the new fields (older files) nothing is said; with a wrong type or value, the file
  // is skipped, saying which field.
  const Json plain = {{"rows", {bench_row("big", "native", 2)}}};
  const Report p = build_report({{}, {write("p.json", plain.dump())}, {}}, {"cmd", "now"});
  EXPECT_EQ(p.html.find("id=\"warnings\""), std::string::npos);
  EXPECT_EQ(p.html.find("<th>cache</th>"), std::string::npos);
  EXPECT_EQ(p.html.find("Shapes too small"), std::string::npos);
  const std::vector<std::pair<Json, std::string>> bad = {
      {{{"warnings", "busy"}, {"rows", rows}}, "'warnings' is not a list of strings"},
      {{{"warnings", {"busy", 3}}, {"rows", rows}}, "'warnings' item 1 is not a string"},
      {{{"roofline", {{"busy", "yes"}}}, {"rows", rows}}, "'roofline.busy' is not true or false"},
      {{{"rows", {bench_row("a", "native", 1), bench_row("a", "blas", 1)}}}, ""},
  };
  for (const auto& [d, why] : bad) {
    const Report b = build_report(
        {{}, {write("bad.json", d.dump()), write("p.json", plain.dump())}, {}}, {"cmd", "now"});
    if (why.empty()) {
      EXPECT_TRUE(b.skipped.empty());
      continue;
    }
    ASSERT_EQ(b.skipped.size(), 1u) << why;
    EXPECT_NE(b.skipped[0].find(why), std::string::npos) << b.skipped[0];
  }
  for (const auto& [value, why] : std::vector<std::pair<Json, std::string>>{
           {3, "row 1: 'cache_state' is not a string"},
           {"hot", "row 1: 'cache_state' is \"hot\", expected \"warm\" or \"cold\""}}) {
    Json rs = rows;
    rs[1]["cache_state"] = value;
    const Report b = build_report(
        {{}, {write("bad.json", Json({{"rows", rs}}).dump()), write("p.json", plain.dump())}, {}},
        {"cmd", "now"});
    ASSERT_EQ(b.skipped.size(), 1u) << why;
    EXPECT_NE(b.skipped[0].find(why), std::string::npos) << b.skipped[0];
  }
}

// A file may hold any number of warnings of any length: the page shows a bounded part.
TEST_F(ReportTest, ManyLongWarningsAreBounded) {
  Json warnings = Json::array();
  for (int i = 0; i < 500; ++i) warnings.push_back(std::string(2000, 'w') + std::to_string(i));
  const Json doc = {{"warnings", warnings}, {"rows", {bench_row("big", "native", 2)}}};
  const Report r = build_report({{}, {write("many.json", doc.dump())}, {}}, {"cmd", "now"});
  EXPECT_EQ(xml_problem(r.html), "");
  EXPECT_LT(r.html.size(), 100000u);
  EXPECT_NE(r.html.find("480 more warnings not shown"), std::string::npos);
}

TEST(XmlProblem, CatchesWhatItLooksFor) {
  // The checker (tests/report/xml_check.h) must be able to fail.
  EXPECT_EQ(xml_problem("<a><b/></a>"), "");
  EXPECT_NE(xml_problem("<a><b></a>"), "");
  EXPECT_NE(xml_problem("<a>x < y</a>"), "");
  EXPECT_NE(xml_problem("<a>x & y</a>"), "");
  EXPECT_NE(xml_problem("<a title=\"x>y</a>"), "");
  EXPECT_NE(xml_problem("<a>"), "");
  EXPECT_NE(xml_problem("<a><></a>"), "");
  // Characters: UTF-8 that is ill-formed, overlong or a surrogate, and characters XML refuses.
  EXPECT_EQ(xml_problem("<a>\xC2\xB5s \xF0\x9F\x98\x80 \xEF\xBF\xBD</a>"), "");
  for (const char* bad : {"\xFF", "\xE2\x82", "\xC0\xAF", "\xED\xA0\x80", "\xEF\xBF\xBE",
                          "\xEF\xBF\xBF", "\x01", "\xF4\x90\x80\x80"})
    EXPECT_NE(xml_problem(std::string("<a>") + bad + "</a>"), "") << bad;
}

}  // namespace
}  // namespace tokamax::report
