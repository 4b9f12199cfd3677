// `tokamax autotune-check`: how trustworthy the autotuner's winners are on this machine. Each
// spec is tuned several times (optionally with a busy process on one core in random on/off
// phases), then an oracle measures every candidate of the search space in many interleaved
// rounds, and the contenders among them again for more rounds; each run's winner is scored by its
// regret (its oracle median over the oracle's best), reruns by whether they agree, the cost model
// by where it ranked the oracle's best.
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <random>

#include "tools/commands.h"

namespace tokamax::cli {
namespace {

// A busy process on one core (the last one this process may run on), alternating between
// spinning and sleeping for random phases of 0.2 to 2 s: a neighbour that comes and goes.
class NoiseProcess {
 public:
  explicit NoiseProcess(uint64_t seed) {
    pid_ = fork();
    if (pid_ == 0) run(seed);  // never returns
    if (pid_ < 0) throw Error("autotune-check --noise: fork failed");
  }
  ~NoiseProcess() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  NoiseProcess(const NoiseProcess&) = delete;
  NoiseProcess& operator=(const NoiseProcess&) = delete;

 private:
  // Only async-signal-safe calls and arithmetic: the parent has threads.
  [[noreturn]] static void run(uint64_t seed) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      int last = -1;
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &set)) last = c;
      }
      if (last >= 0) {
        CPU_ZERO(&set);
        CPU_SET(last, &set);
        sched_setaffinity(0, sizeof(set), &set);
      }
    }
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> phase(0.2, 2.0);
    auto now = [] {
      timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
    };
    volatile double sink = 0;
    while (true) {
      const double end = now() + phase(rng);
      while (now() < end) {
        for (int i = 0; i < 10000; ++i) sink = sink + 1.0;
      }
      const double off = phase(rng);
      timespec ts{static_cast<time_t>(off), static_cast<long>((off - std::floor(off)) * 1e9)};
      nanosleep(&ts, nullptr);
    }
  }
  pid_t pid_;
};

struct Run {
  std::string winner;
  double seconds = 0, regret = 0;
  bool confident = false;
};

struct SpecCheck {
  std::string spec, implementation;
  std::vector<Run> runs;
  bool agree = false;
  std::string oracle_best;
  double oracle_best_ratio = 0, oracle_halfwidth = 0;
  int oracle_candidates = 0, oracle_rounds = 0;
  int oracle_refined = 0;  // candidates in the oracle's second stage (0: none)
  int model_rank = 0;  // 1-based rank of the oracle's best in the cost model's order; 0: no model
  double oracle_s = 0;
};

// Oracle medians (ratio to the control, quiet machine) per config string.
std::map<std::string, double> oracle_ratios(const AutotuningData& d) {
  std::map<std::string, double> out;
  for (const auto& [k, e] : d.entries()) {
    if (e.benchmark && e.benchmark->rounds > 0) out[k] = e.benchmark->ratio;
  }
  return out;
}

using Ratios = std::map<std::string, double>;

Ratios::const_iterator best_of(const Ratios& m) {
  return std::min_element(m.begin(), m.end(),
                          [](const auto& a, const auto& c) { return a.second < c.second; });
}

// The runs as a program would tune: each its own seed, and with --noise its own neighbour.
void tune_reruns(const BoundArguments& b, const CheckOptions& co, SpecCheck& s) {
  for (int r = 0; r < co.reruns; ++r) {
    AutotuneOptions o;
    o.seed = static_cast<uint64_t>(r) + 1;
    std::optional<NoiseProcess> noise;
    if (co.noise) noise.emplace(static_cast<uint64_t>(r) * 7919 + 13);
    const double t0 = now_seconds();
    const AutotuningData d = Autotuner(o).tune(b);
    Run run;
    run.seconds = now_seconds() - t0;
    noise.reset();
    const auto& w = d.fastest();
    run.winner = w.config.str();
    run.confident = w.benchmark->evidence && w.benchmark->evidence->confident;
    s.runs.push_back(run);
    fmt::print(stderr, "  {} run {}: {} in {:.1f} s\n", s.spec, r + 1, run.winner, run.seconds);
  }
}

// The oracle: every candidate, no halving, no model cut, the same rounds for all.
AutotuneOptions oracle_options(const CheckOptions& co) {
  AutotuneOptions oo;
  oo.rounds.first_rounds = oo.rounds.max_rounds = co.oracle_rounds;
  oo.rounds.finalists = 1 << 20;
  oo.model_fraction = 1;
  oo.rounds.max_repeats = 1 << 20;  // every candidate gets all its rounds (the budget bounds it)
  oo.fix_measure_budget(co.oracle_budget_s);
  oo.seed = 1000;
  return oo;
}

// Second stage: 15 rounds leave a median's interval at 1-2% on a noisy decode key, as wide as
// the 3% regret bar is from the tie window. The contenders (within the window of the first
// stage's best, and every run's winner) are measured again, interleaved, for more rounds; their
// regrets come from these rounds. Nothing when there is one contender or none was measured.
std::optional<AutotuningData> refine_oracle(const BoundArguments& b, const AutotuningData& od,
                                            const Ratios& ratios, AutotuneOptions ro,
                                            const CheckOptions& co, const std::vector<Run>& runs) {
  constexpr double kWindow = 0.04;  // the contenders: within this of the first stage's best
  const double cut = best_of(ratios)->second * (1 + kWindow);
  // The heuristics config first: the best's ratio to it is reported.
  if (od.heuristics()) ro.configs.push_back(*od.heuristics());
  for (const auto& [k, e] : od.entries()) {
    if (od.heuristics() && e.config == *od.heuristics()) continue;
    const bool winner =
        std::any_of(runs.begin(), runs.end(), [&, &k = k](const Run& r) { return r.winner == k; });
    const auto it = ratios.find(k);
    if (winner || (it != ratios.end() && it->second <= cut)) ro.configs.push_back(e.config);
  }
  if (ro.configs.size() <= 1) return std::nullopt;
  ro.rounds.first_rounds = ro.rounds.max_rounds = co.oracle_refine_rounds;
  ro.seed = 2000;
  AutotuningData refined = Autotuner(ro).tune(b);
  if (oracle_ratios(refined).empty()) return std::nullopt;
  return refined;
}

// The oracle's best, and each run's regret against it; `final_od` measured `ratios`.
void score_runs(const AutotuningData& od, const AutotuningData& final_od, const Ratios& ratios,
                SpecCheck& s) {
  const auto best = best_of(ratios);
  s.oracle_best = best->first;
  // Ratios are to each stage's control: the heuristics config in the first, the fastest
  // contender in its checked run in the second (explicit candidates have no heuristics config).
  const auto heur = od.heuristics() ? ratios.find(od.heuristics()->str()) : ratios.end();
  s.oracle_best_ratio = best->second / (heur == ratios.end() ? 1.0 : heur->second);
  const BenchmarkData& bb = *final_od.entries().at(best->first).benchmark;
  s.oracle_rounds = bb.rounds;
  s.oracle_halfwidth = (bb.ratio_hi - bb.ratio_lo) / 2 / bb.ratio;
  double lo = INFINITY, hi = 0;
  for (Run& r : s.runs) {
    const auto it = ratios.find(r.winner);
    r.regret = it == ratios.end() ? NAN : it->second / best->second - 1;
    if (it != ratios.end()) {
      lo = std::min(lo, it->second);
      hi = std::max(hi, it->second);
    }
  }
  s.agree = hi > 0 && hi <= lo * 1.01;
}

// The cost model's rank of the oracle's best among the candidates the oracle measured (1-based;
// 0 when the implementation has no model).
int model_rank(const BoundArguments& b, const AutotuningData& od, const Ratios& measured,
               const std::string& oracle_best) {
  const OpFamily& fam = find_family(b.family());
  const auto impl = fam.implementation(b.implementation());
  const auto call = fam.make_call(b, 0);
  std::vector<std::pair<double, std::string>> est;
  for (const auto& [k, e] : od.entries()) {
    if (measured.count(k)) est.emplace_back(impl->estimate_ms(*call, e.config), k);
  }
  int rank = 0;
  if (std::all_of(est.begin(), est.end(), [](const auto& e) { return std::isfinite(e.first); })) {
    std::stable_sort(est.begin(), est.end());
    for (size_t i = 0; i < est.size(); ++i) {
      if (est[i].second == oracle_best) rank = static_cast<int>(i) + 1;
    }
  }
  return rank;
}

SpecCheck check_one(const BoundArguments& b, const std::string& spec, const CheckOptions& co) {
  SpecCheck s;
  s.spec = spec;
  s.implementation = b.implementation();
  tune_reruns(b, co, s);
  const AutotuneOptions oo = oracle_options(co);
  const double t0 = now_seconds();
  const AutotuningData od = Autotuner(oo).tune(b);
  const Ratios first_ratios = oracle_ratios(od);
  Ratios ratios = first_ratios;
  if (ratios.empty()) throw Error("autotune-check: the oracle measured nothing for " + spec);
  s.oracle_candidates = static_cast<int>(ratios.size());
  std::optional<AutotuningData> refined;
  if (co.oracle_refine_rounds > 0) refined = refine_oracle(b, od, ratios, oo, co, s.runs);
  if (refined) {
    ratios = oracle_ratios(*refined);
    s.oracle_refined = static_cast<int>(ratios.size());
  }
  s.oracle_s = now_seconds() - t0;
  score_runs(od, refined ? *refined : od, ratios, s);
  s.model_rank = model_rank(b, od, first_ratios, s.oracle_best);
  return s;
}

void check_options(const CheckOptions& co) {
  if (co.reruns < 1) throw InvalidArgument("--reruns must be >= 1");
  if (co.oracle_rounds < 3) throw InvalidArgument("--oracle-rounds must be >= 3");
  if (co.oracle_refine_rounds != 0 && co.oracle_refine_rounds < 3)
    throw InvalidArgument("--oracle-refine-rounds must be 0 or >= 3");
  if (!(co.oracle_budget_s > 0)) throw InvalidArgument("--oracle-budget-s must be > 0");
  if (!co.out_path.empty()) check_writable(co.out_path);  // before the work, not after it
  check_one_source(co.spec, co.tag, "");
}

// Every (spec, tunable implementation supported here) the options select.
std::vector<SpecCheck> check_specs(const CheckOptions& co) {
  const auto specs = find_arg_specs(co.op, co.spec, co.tag);
  if (specs.empty())
    throw InvalidArgument("no spec of op '" + co.op + "' has tag '" + co.tag + "'");
  std::vector<SpecCheck> checks;
  for (const ArgSpec& a : specs) {
    const OpFamily& fam = find_family(a.family);
    for (const auto& impl : fam.implementations()) {
      if (!impl->has_config() || !impl->supported_on(device_info())) continue;
      if (!co.impls.empty() &&
          std::find(co.impls.begin(), co.impls.end(), impl->name()) == co.impls.end())
        continue;
      fmt::print(stderr, "{} / {} {}\n", a.family, impl->name(), a.name);
      checks.push_back(check_one(fam.bind_json(a.arguments, impl->name()), a.name, co));
    }
  }
  return checks;
}

// A run is good when its regret is within 3% (a run whose winner the oracle lacks is not).
bool within_3pct(const Run& r) { return r.regret <= 0.03; }

struct Summary {
  int runs = 0, runs_ok = 0, specs_ok = 0, agree = 0, ranked = 0, top_quarter = 0;
  double max_s = 0, sum_s = 0;
};

Summary summarize(const std::vector<SpecCheck>& checks) {
  Summary m;
  for (const SpecCheck& s : checks) {
    bool all_ok = true;
    for (const Run& r : s.runs) {
      const bool ok = within_3pct(r);
      m.runs_ok += ok;
      all_ok &= ok;
      ++m.runs;
      m.max_s = std::max(m.max_s, r.seconds);
      m.sum_s += r.seconds;
    }
    m.specs_ok += all_ok;
    m.agree += s.agree;
    if (s.model_rank > 0) {
      ++m.ranked;
      m.top_quarter += s.model_rank <= (s.oracle_candidates + 3) / 4;
    }
  }
  return m;
}

Json spec_json(const SpecCheck& s) {
  Json runs = Json::array();
  for (const Run& r : s.runs) {
    runs.push_back({{"winner", r.winner},
                    {"regret", r.regret},
                    {"seconds", r.seconds},
                    {"confident", r.confident}});
  }
  return {{"spec", s.spec},
          {"implementation", s.implementation},
          {"runs", runs},
          {"agree", s.agree},
          {"oracle",
           {{"best", s.oracle_best},
            {"best_ratio_to_heuristics", s.oracle_best_ratio},
            {"best_ci_halfwidth", s.oracle_halfwidth},
            {"candidates", s.oracle_candidates},
            {"refined_candidates", s.oracle_refined},
            {"rounds", s.oracle_rounds},
            {"seconds", s.oracle_s}}},
          {"model_rank", s.model_rank}};
}

Json check_document(const CheckOptions& co, const std::vector<SpecCheck>& checks,
                    const Summary& m) {
  Json rows = Json::array();
  for (const SpecCheck& s : checks) rows.push_back(spec_json(s));
  const int n = static_cast<int>(checks.size());
  Json summary = {{"specs", n},
                  {"noise", co.noise},
                  {"reruns", co.reruns},
                  {"runs_within_3pct", m.runs_ok},
                  {"runs", m.runs},
                  {"specs_all_runs_within_3pct", m.specs_ok},
                  {"specs_agreeing", m.agree},
                  {"mean_tuning_s", m.runs ? m.sum_s / m.runs : 0},
                  {"max_tuning_s", m.max_s},
                  {"model_ranked_specs", m.ranked},
                  {"oracle_best_in_model_top_quarter", m.top_quarter}};
  return {{"command", command_line()},
          {"device_kind", device_kind()},
          {"tokamax_version", library_version()},
          {"time", utc_now()},
          {"summary", summary},
          {"specs", rows}};
}

void print_check_table(const CheckOptions& co, const std::vector<SpecCheck>& checks,
                       const Summary& m) {
  fmt::print("{:<38} {:>8} {:>9} {:>8} {:>6} {:>9} {:>7}  {}\n", "spec", "regret", "worst %",
             "tune s", "agree", "oracle x", "model", "winners (run 1 first)");
  for (const SpecCheck& s : checks) {
    double worst = 0, secs = 0;
    std::string winners;
    for (const Run& r : s.runs) {
      worst = std::max(worst, r.regret);
      secs = std::max(secs, r.seconds);
      winners += (winners.empty() ? "" : " | ") + r.winner;
    }
    fmt::print("{:<38} {:>8} {:>8.2f}% {:>8.1f} {:>6} {:>9.3f} {:>7}  {}\n", s.spec,
               worst <= 0.03 ? "ok" : "HIGH", worst * 100, secs, s.agree ? "yes" : "NO",
               s.oracle_best_ratio,
               s.model_rank ? fmt::format("{}/{}", s.model_rank, s.oracle_candidates) : "-",
               winners);
  }
  const int n = static_cast<int>(checks.size());
  fmt::print(
      "\n{}: runs within 3% of the oracle's best: {}/{} ({:.0f}%); specs with every run within 3%: "
      "{}/{} ({:.0f}%); specs whose reruns agree: {}/{} ({:.0f}%); tuning time mean {:.1f} s, "
      "max {:.1f} s; oracle's best in the cost model's top quarter: {}/{}\n",
      co.noise ? "with --noise" : "quiet", m.runs_ok, m.runs,
      m.runs ? 100.0 * m.runs_ok / m.runs : 0, m.specs_ok, n, n ? 100.0 * m.specs_ok / n : 0,
      m.agree, n, n ? 100.0 * m.agree / n : 0, m.runs ? m.sum_s / m.runs : 0, m.max_s,
      m.top_quarter, m.ranked);
}

}  // namespace

int autotune_check(const CheckOptions& co) {
  check_options(co);
  const std::vector<SpecCheck> checks = check_specs(co);
  const Summary m = summarize(checks);
  const Json doc = check_document(co, checks, m);
  if (!co.out_path.empty()) write_file_atomic(co.out_path, doc.dump(1));
  if (co.json) {
    std::cout << doc.dump(2) << "\n";
    return kExitSuccess;
  }
  print_check_table(co, checks, m);
  return kExitSuccess;
}

}  // namespace tokamax::cli
