// The autotuner: candidates prepared in parallel, measured exclusively, outputs checked against
// the reference (output_check.h). The ladder's backend is in backend.cc.
#include "tokamax/autotuning/autotuner.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "autotuning/backend.h"
#include "autotuning/output_check.h"
#include "autotuning/rounds.h"
#include "autotuning/scope_stack.h"
#include "core/thread_pool.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/autotuning/measurement.h"
#include "tokamax/core/log.h"
#include "tokamax/op/dispatch.h"

namespace tokamax {
namespace {

// Runs fn on its own thread and waits at most timeout_s. Returns false if it has not finished:
// it is then left running, detached, owning what it captured (a C++ function cannot be
// stopped safely). Exceptions from fn are rethrown here. *elapsed_s: the wall time waited.
bool run_with_timeout(std::function<void()> fn, double timeout_s, double* elapsed_s) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto st = std::make_shared<State>();
  const double t0 = now_seconds();
  std::thread([st, fn = std::move(fn)] {
    QuietMissesScope quiet;  // the tuner's run, not the program's (tune_uncoordinated)
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(st->mu);
    st->error = error;
    st->done = true;
    st->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(st->mu);
  const bool done =
      st->cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return st->done; });
  *elapsed_s = now_seconds() - t0;
  if (done && st->error) std::rethrow_exception(st->error);
  return done;
}

// One measurement at a time in the whole process, with nothing else of the tuner running:
// measuring holds this exclusively; references and preparation hold it shared.
std::shared_mutex& phase_mu() {
  static std::shared_mutex mu;
  return mu;
}

std::string id_of(const BoundArguments& b) {
  return b.family() + "/" + b.implementation() + "/" + b.key();
}

}  // namespace

void AutotuneOptions::validate() const {
  if (!(budget_s > 0))
    throw InvalidArgument(fmt::format("autotuning budget_s is {:g}; expected > 0", budget_s));
  if (candidate_timeout_s <= 0) {
    throw InvalidArgument(
        fmt::format("candidate_timeout_s is {:g}; expected > 0", candidate_timeout_s));
  }
  if (max_candidates <= 0) {
    throw InvalidArgument("autotuning max_candidates is " + std::to_string(max_candidates) +
                          "; expected > 0");
  }
  const RoundOptions& r = rounds;
  if (r.first_rounds < 1 || r.finalists < 1 || r.max_rounds < r.first_rounds ||
      r.min_confident_rounds < 1) {
    throw InvalidArgument(fmt::format(
        "autotuning rounds: need first_rounds >= 1, finalists >= 1, max_rounds >= first_rounds, "
        "min_confident_rounds >= 1; got {}, {}, {}, {}",
        r.first_rounds, r.finalists, r.max_rounds, r.min_confident_rounds));
  }
  if (!(measure_budget_s > 0) || !(measure_budget_max_s > 0) || budget_rounds < 0 ||
      !(r.confidence > 0 && r.confidence < 1) || !(r.tie >= 0 && r.tie < 1) ||
      !(sample_min_ms >= 0) || !(r.stray > 0) || !(r.bracket > 0) || r.max_repeats < 0 ||
      r.bootstrap < 1 || !(r.segment_s > 0) || !(model_fraction > 0 && model_fraction <= 1)) {
    throw InvalidArgument(fmt::format(
        "autotuning options: need measure_budget_s > 0 (got {:g}), measure_budget_max_s > 0 "
        "({:g}), budget_rounds >= 0 ({}), 0 < confidence < 1 ({:g}), "
        "0 <= tie < 1 ({:g}), sample_min_ms >= 0 ({:g}), stray > 0 ({:g}), bracket > 0 ({:g}), "
        "max_repeats >= 0 ({}), bootstrap >= 1 ({}), segment_s > 0 ({:g}), "
        "0 < model_fraction <= 1 ({:g})",
        measure_budget_s, measure_budget_max_s, budget_rounds, r.confidence, r.tie, sample_min_ms,
        r.stray, r.bracket, r.max_repeats, r.bootstrap, r.segment_s, model_fraction));
  }
}

Autotuner::Autotuner(AutotuneOptions options) : options_(std::move(options)) {
  options_.validate();
}

std::vector<Config> Autotuner::candidates(const BoundArguments& bound) const {
  const OpFamily& family = find_family(bound.family());
  const auto impl = family.implementation(bound.implementation());
  return candidates_for(*impl, *family.make_call(bound, options_.seed));
}

std::vector<Config> Autotuner::candidates_for(const Implementation& impl, const CallBase& call,
                                              size_t* model_cut) const {
  if (model_cut) *model_cut = SIZE_MAX;
  std::vector<Config> list;
  if (!options_.configs.empty()) {
    list = options_.configs;
  } else {
    list.push_back(impl.heuristics_config(call));
    for (auto& c : impl.autotuning_configs(call)) list.push_back(std::move(c));
  }
  // Heuristics first (always measured: it is the control), then sorted; then, where the
  // implementation has a cost model and explicit configs were not given, ranked by it (stable:
  // equal estimates keep the sorted order).
  std::vector<Config> out;
  std::unordered_set<std::string> seen;
  const Config first = list.front();
  std::sort(list.begin(), list.end());
  out.push_back(first);
  seen.insert(first.str());
  for (auto& c : list) {
    if (seen.insert(c.str()).second) out.push_back(c);
  }
  if (options_.configs.empty() && out.size() > 2) {
    std::vector<std::pair<double, Config>> ranked;
    for (size_t i = 1; i < out.size(); ++i)
      ranked.emplace_back(impl.estimate_ms(call, out[i]), out[i]);
    if (std::all_of(ranked.begin(), ranked.end(),
                    [](const auto& r) { return std::isfinite(r.first); })) {
      std::stable_sort(ranked.begin(), ranked.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      out.resize(1);
      for (auto& r : ranked) out.push_back(std::move(r.second));
      if (model_cut) {
        *model_cut = 1 + std::max<size_t>(
                             1, static_cast<size_t>(std::ceil(options_.model_fraction *
                                                              static_cast<double>(ranked.size()))));
      }
    }
  }
  return out;
}

AutotuningData Autotuner::tune(const BoundArguments& bound) const {
  if (bound.implementation().empty())
    throw InvalidArgument("Autotuner::tune: bound arguments must name an implementation");
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_future<AutotuningData>> in_flight;
  const std::string id = id_of(bound);
  std::promise<AutotuningData> promise;
  std::shared_future<AutotuningData> future;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = in_flight.find(id);
    if (it != in_flight.end()) {
      future = it->second;
    } else {
      future = promise.get_future().share();
      in_flight.emplace(id, future);
      owner = true;
    }
  }
  if (!owner) return future.get();
  try {
    promise.set_value(tune_uncoordinated(bound));
  } catch (...) {
    promise.set_exception(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    in_flight.erase(id);
  }
  return future.get();
}

namespace {

// One key's tuning, phase by phase: the call and its reference outputs, the candidates'
// parallel preparation, their exclusive checked measurement, and the finalists' interleaved
// re-measurement.
struct TuningRun {
  struct Prep {
    std::shared_ptr<const Prepared> prepared;
    double ms = 0;
    int64_t scratch = 0;
    std::optional<Failure> failure;
  };

  const AutotuneOptions& o;
  const OpFamily& family;
  std::shared_ptr<const Implementation> impl;
  // Shared: a candidate that overruns its timeout is abandoned still running, and keeps the
  // call (inputs) and its output buffers alive.
  std::shared_ptr<CallBase> call;
  Tolerance tol;
  bool cold = false;
  std::vector<std::vector<double>> refs;  // the reference's outputs
  std::shared_ptr<GuardedOutputs> out;    // the buffers candidates write into
  std::vector<Config> cands;
  std::vector<Prep> preps;
  AutotuningData data;
  std::vector<int> ok;           // candidates that passed their check, in order
  std::vector<double> first_ms;  // their checked run's time
  std::string abandoned;         // set when a candidate overran its timeout and is still running

  TuningRun(const AutotuneOptions& options, const BoundArguments& bound)
      : o(options),
        family(find_family(bound.family())),
        impl(family.implementation(bound.implementation())) {
    if (!impl->supported_on(device_info())) {
      throw Unsupported(family.name() + " implementation " + impl->name() +
                        " is not supported on " + device_kind());
    }
    call = family.make_call(bound, o.seed);
    impl->validate(*call);
    tol = family.tolerance(*call);
    cold = o.cold_cache.value_or(measured_cold(family, *call));
  }

  std::string what() const { return family.name() + "/" + impl->name(); }

  // Reference outputs on the same inputs; then the guarded buffers candidates write into.
  void run_reference() {
    GuardedOutputs ref_out(call->outputs);
    call->outputs = ref_out.views;
    family.reference()->run(*call, Config::null(), nullptr);
    for (const auto& v : ref_out.views) refs.push_back(to_f64(v));
    out = std::make_shared<GuardedOutputs>(ref_out.views);
    call->outputs = out->views;
  }

  // Candidates below the cost model's cut, then those past max_candidates, are recorded as
  // skipped and dropped.
  void limit_candidates(size_t model_cut) {
    const size_t by_model = std::min(cands.size(), model_cut);
    const size_t keep = std::min(by_model, static_cast<size_t>(o.max_candidates));
    for (size_t i = keep; i < cands.size(); ++i) {
      data.set_failure(
          cands[i],
          {FailureKind::kSkipped,
           i >= by_model
               ? fmt::format("ranked below the cost model's best {:g}%", o.model_fraction * 100)
               : fmt::format("over the candidate budget of {}", o.max_candidates)});
    }
    cands.resize(keep);
  }

  // Parallel preparation (packing, scratch): nothing is measured meanwhile.
  void prepare_all() {
    const int n = static_cast<int>(cands.size());
    preps.assign(static_cast<size_t>(n), Prep{});
    const int threads = o.prepare_threads > 0 ? o.prepare_threads : num_threads();
    // On the library's pool: preparation that itself runs in parallel (packing) then runs inline
    // on each pool thread.
    parallel_for(n, threads, [&](int64_t i, int) {
      Prep& p = preps[i];
      const double t0 = now_seconds();
      try {
        p.scratch = impl->scratch_bytes(*call, cands[i]);
        p.prepared = impl->prepare(*call, cands[i]);
      } catch (const Unsupported& e) {
        p.failure = Failure{FailureKind::kUnsupported, e.what()};
      } catch (const std::exception& e) {
        p.failure = Failure{FailureKind::kException, std::string("prepare: ") + e.what()};
      }
      p.ms = (now_seconds() - t0) * 1e3;
    });
  }

  // Candidate i: one run into poisoned, guarded buffers under the timeout, checked against the
  // reference; if it passes, its time is the first estimate for the rounds.
  void check(int i, bool over_budget) {
    const Config& cfg = cands[i];
    const Prep& p = preps[i];
    if (over_budget) {
      data.set_failure(
          cfg, {FailureKind::kSkipped, fmt::format("time budget of {:g} s exhausted", o.budget_s)});
      return;
    }
    if (p.failure) return data.set_failure(cfg, *p.failure);
    if (!abandoned.empty()) return data.set_failure(cfg, {FailureKind::kSkipped, abandoned});
    try {
      out->poison();
      double dt = 0;
      const bool finished =
          run_with_timeout([impl = impl, call = call, out = out, prepared = p.prepared,
                            cfg] { impl->run(*call, cfg, prepared.get()); },
                           o.candidate_timeout_s, &dt);
      if (!finished) {
        data.set_failure(
            cfg, {FailureKind::kTimeout, fmt::format("did not finish within the timeout of {:g} s; "
                                                     "abandoned, still running",
                                                     o.candidate_timeout_s)});
        abandoned = "not measured: candidate " + cfg.str() +
                    " overran its timeout and still runs on this key's buffers";
        TOKAMAX_LOG("autotune", kWarning,
                    what() + " " + cfg.str() +
                        " overran its timeout and was abandoned while running; later measurements "
                        "in this process may be disturbed");
      } else if (int g = out->damaged_guard(); g >= 0) {
        data.set_failure(cfg, {FailureKind::kOutOfBounds,
                               "wrote outside output " + std::to_string(g) + " " +
                                   call->outputs[g].spec().str() + " (guard zone damaged)"});
      } else if (auto f = check_outputs(out->views, refs, tol)) {
        data.set_failure(cfg, *f);
      } else if (dt > o.candidate_timeout_s) {
        data.set_failure(cfg, {FailureKind::kTimeout,
                               fmt::format("one call took {:.3g} s, over the timeout of {:g} s", dt,
                                           o.candidate_timeout_s)});
      } else {
        ok.push_back(i);
        first_ms.push_back(dt * 1e3);
      }
    } catch (const Unsupported& e) {
      data.set_failure(cfg, {FailureKind::kUnsupported, e.what()});
    } catch (const std::exception& e) {
      data.set_failure(cfg, {FailureKind::kException, e.what()});
    }
  }

  // A cold start for the next call: its tensors (inputs and outputs) evicted line by line when
  // they are small next to the last-level cache (a stream through twice the cache costs ~50 ms
  // on a machine with a large one, more than most memory-bound calls), else the stream; the
  // pool's workers left awake either way (wake_threads).
  void evict_inputs() const {
    int64_t bytes = 0;
    for (const Tensor& t : call->owned) bytes += t.spec().bytes();
    for (const TensorView& v : call->outputs) bytes += v.spec().bytes();
    if (4 * bytes > flush_cache_bytes()) return flush_cache();
    for (const Tensor& t : call->owned)
      evict_range(t.data(), static_cast<size_t>(t.spec().bytes()));
    for (const TensorView& v : call->outputs)
      evict_range(v.data(), static_cast<size_t>(v.spec().bytes()));
    wake_threads();
  }

  // One sample of candidate cands[i] (ms per call), sized from its latest time `est_ms`.
  double sample(int i, double est_ms) const {
    const Config& cfg = cands[i];
    const Prepared* prep = preps[i].prepared.get();
    const double want = std::max(o.sample_min_ms, 1e-3);
    if (cold) {
      // Flushed calls, the median of enough of them to span sample_min_ms.
      const int k =
          static_cast<int>(std::clamp(std::ceil(want / std::max(est_ms, 1e-3)), 1.0, 9.0));
      std::vector<double> t;
      for (int j = 0; j < k; ++j) {
        evict_inputs();
        const double t0 = now_seconds();
        impl->run(*call, cfg, prep);
        t.push_back((now_seconds() - t0) * 1e3);
      }
      return tuning::median_of(std::move(t));
    }
    // A warm-up call first when calls are short: the candidates before it in the round left
    // their own working set (packed panels, scratch) in the caches.
    if (est_ms < 2) impl->run(*call, cfg, prep);
    const int per =
        static_cast<int>(std::clamp(std::ceil(want / std::max(est_ms, 1e-4)), 1.0, 10000.0));
    // Short calls in three chunks, the fastest chunk kept: a preemption (a neighbour's time
    // slice, an interrupt) lands in one chunk and only ever adds time.
    const int chunks = std::min(per, 3);
    double best = std::numeric_limits<double>::infinity();
    for (int c = 0; c < chunks; ++c) {
      const int calls = per / chunks + (c < per % chunks);
      const double t0 = now_seconds();
      for (int j = 0; j < calls; ++j) impl->run(*call, cfg, prep);
      best = std::min(best, (now_seconds() - t0) * 1e3 / calls);
    }
    return best;
  }

  // Candidate ok[j]'s entry: kr, its rounds (quiet_ms: the control's quiet level), or, when it
  // had none, its checked run.
  BenchmarkData benchmark_of(int j, const tuning::CandidateRounds* kr, double quiet_ms) const {
    const int i = ok[j];
    BenchmarkData b;
    b.prepare_ms = preps[i].ms;
    b.scratch_bytes = preps[i].scratch;
    b.cold_cache = cold;
    // Not measured in rounds (abandoned, or the budget ran out before its turn): the checked
    // run's time alone, never an empty sample set's median of 0 (stored once as "0 ms").
    if (!kr || kr->samples_ms.empty()) {
      b.median_ms = first_ms[j];
      b.samples_ms = {first_ms[j]};
      return b;
    }
    const SampleStats raw = SampleStats::of(kr->samples_ms);
    b.samples_ms = kr->samples_ms;
    b.sample_rounds = kr->sample_round;
    b.ratios = kr->ratios;
    b.rounds = kr->accepted;
    b.stage = kr->stage;
    b.finalist = kr->finalist;
    b.iqr_ms = raw.iqr_ms();
    b.ratio = kr->ratio;
    b.ratio_lo = kr->ratio_lo;
    b.ratio_hi = kr->ratio_hi;
    // At the quiet machine's speed: the median ratio times the control's quiet level.
    b.median_ms = kr->accepted > 0 ? kr->ratio * quiet_ms : raw.median_ms;
    return b;
  }

  // The control: the heuristics config, else the candidate fastest in its checked run.
  int control_of(bool has_heuristics) const {
    return has_heuristics ? 0
                          : static_cast<int>(std::min_element(first_ms.begin(), first_ms.end()) -
                                             first_ms.begin());
  }

  // The interleaved rounds themselves. *budget_s: the measuring budget they ran under, the
  // configured one stretched for a slow key but never past what is left of the tuning budget.
  tuning::RoundsResult measure_interleaved(int control, double budget_left_s,
                                           double* budget_s) const {
    tuning::RoundOptions ro;
    static_cast<RoundOptions&>(ro) = o.rounds;
    ro.seed = o.seed;
    std::vector<double> est = first_ms;   // per call, for batching short calls
    std::vector<double> wall = first_ms;  // per sample, for sizing segments
    if (cold) {
      const double t0 = now_seconds();
      evict_inputs();
      const double flush_ms = (now_seconds() - t0) * 1e3;
      for (double& w : wall) w += flush_ms;
    }
    const double slow_key_s =
        std::min(o.measure_budget_max_s,
                 o.budget_rounds * tuning::round_seconds(wall, control, o.rounds.segment_s));
    ro.budget_s = std::max(1e-3, std::min(std::max(o.measure_budget_s, slow_key_s), budget_left_s));
    *budget_s = ro.budget_s;
    return tuning::run_rounds(
        static_cast<int>(ok.size()), control,
        [&](int j) {
          const double t = sample(ok[j], est[j]);
          est[j] = t;
          return t;
        },
        [] { return now_seconds(); }, wall, ro);
  }

  // No round accepted. Nothing measured side by side: one checked run each is no evidence
  // against the heuristics config (single runs of one config spread by 1.3x on a shared
  // machine), so it is kept when there is one.
  void record_undecided(const tuning::RoundsResult& r, int control, bool has_heuristics,
                        double budget_s, double started) {
    const int n = static_cast<int>(ok.size());
    const std::string why =
        r.budget_exhausted
            ? fmt::format(
                  "the measuring budget of {:g} s ran out before a round of the {} candidates "
                  "(about {:.1f} s each) was accepted; raise --measure-budget-s or lower "
                  "--max-candidates",
                  budget_s, n, std::accumulate(first_ms.begin(), first_ms.end(), 0.0) / n / 1e3)
            : "no round was accepted (the machine was never quiet enough)";
    if (!has_heuristics) {
      TOKAMAX_LOG("autotune", kWarning,
                  what() + ": " + why + "; the winner falls back to the raw medians");
      return;
    }
    TOKAMAX_LOG("autotune", kWarning, what() + ": " + why + "; the heuristics config is kept");
    TuningEvidence ev;
    ev.confidence = o.rounds.confidence;
    ev.best = cands[ok[control]].str();
    ev.details = {{"control", ev.best},       {"control_is_heuristics", true},
                  {"candidates", n},          {"rounds", r.rounds},
                  {"decided", false},         {"budget_exhausted", r.budget_exhausted},
                  {"measure_s", r.elapsed_s}, {"tuning_s", now_seconds() - started},
                  {"kept_because", why}};
    BenchmarkData b = *data.entries().at(ev.best).benchmark;
    b.chosen = true;
    b.evidence = std::move(ev);
    data.set(cands[ok[control]], std::move(b));
  }

  // The tie-break on memory (XLA's): among the finalists within the tie window of the best,
  // the least scratch, then the fastest.
  int tie_break(const tuning::RoundsResult& r, double tie) const {
    int pick = r.best;
    for (int j = 0; j < static_cast<int>(ok.size()); ++j) {
      const auto& k = r.candidates[j];
      if (!k.finalist || k.accepted == 0 || k.ratio > r.candidates[r.best].ratio * (1 + tie))
        continue;
      const auto& pk = r.candidates[pick];
      const int64_t sj = preps[ok[j]].scratch, sp = preps[ok[pick]].scratch;
      if (sj < sp || (sj == sp && k.ratio < pk.ratio)) pick = j;
    }
    return pick;
  }

  // The ratios of k's accepted samples (a discarded one's is NaN).
  static std::vector<double> accepted_ratios(const tuning::CandidateRounds& k) {
    std::vector<double> a;
    for (double x : k.ratios) {
      if (!std::isnan(x)) a.push_back(x);
    }
    return a;
  }

  // The evidence for candidate ok[pick], all but its details.
  TuningEvidence evidence_of(const tuning::RoundsResult& r, int pick, int control,
                             double tie) const {
    TuningEvidence ev;
    ev.confidence = o.rounds.confidence;
    ev.tie = tie;
    ev.best = cands[ok[pick]].str();
    ev.rounds = r.candidates[pick].accepted;
    if (pick != control) {
      // The pick's ratios to the control against 1 (as rounds.cc decides).
      const tuning::RatioInterval iv = tuning::bootstrap_ratio(
          accepted_ratios(r.candidates[pick]), {1.0}, o.rounds.confidence, 1000, o.seed + 101);
      ev.ratio = iv.ratio;
      ev.lo = iv.lo;
      ev.hi = iv.hi;
      ev.confident = tuning::confidently_faster(iv, r.candidates[pick].accepted, tie,
                                                o.rounds.min_confident_rounds);
    }
    return ev;
  }

  // The segments the rounds discarded, by config rather than index, for the evidence.
  Json discarded_json(const tuning::RoundsResult& r) const {
    Json discarded = Json::array();
    for (const auto& d : r.discarded) {
      Json configs = Json::array();
      for (int j : d.candidates) configs.push_back(cands[ok[j]].str());
      discarded.push_back({{"round", d.round}, {"configs", configs}, {"reason", d.reason}});
    }
    return discarded;
  }

  // The rounds decided: the pick is stored as chosen with its evidence, unless the heuristics
  // config is the control and the pick is not confidently faster than it.
  void record_decision(const tuning::RoundsResult& r, int control, bool has_heuristics,
                       double started) {
    const double quiet = r.control_quiet_ms;
    const double tie = std::max(o.rounds.tie, 2e-3 / std::max(quiet, 1e-9));
    const int pick = tie_break(r, tie);
    TuningEvidence ev = evidence_of(r, pick, control, tie);
    // Not confidently faster than the heuristics config: the heuristics config is stored.
    const int chosen = (!ev.confident && has_heuristics) ? control : pick;
    const Json discarded = discarded_json(r);
    ev.details = {{"control", cands[ok[control]].str()},
                  {"control_is_heuristics", has_heuristics},
                  {"control_ms", r.control_ms},
                  {"control_quiet_ms", quiet},
                  {"candidates", static_cast<int>(ok.size())},
                  {"stages", r.stages},
                  {"rounds", r.rounds},
                  {"decided", r.decided},
                  {"budget_exhausted", r.budget_exhausted},
                  {"measure_s", r.elapsed_s},
                  {"tuning_s", now_seconds() - started},
                  {"discarded", discarded}};
    BenchmarkData b = *data.entries().at(cands[ok[chosen]].str()).benchmark;
    b.chosen = true;
    b.evidence = std::move(ev);
    data.set(cands[ok[chosen]], std::move(b));
  }

  // The candidates that passed their check, in interleaved rounds against the control (the
  // heuristics config when it passed), then the decision and its evidence.
  void measure_rounds(double budget_left_s, double started) {
    if (ok.empty()) return;
    const int n = static_cast<int>(ok.size());
    if (!abandoned.empty()) {
      // A candidate still runs on this key's buffers: measuring now would time both.
      for (int j = 0; j < n; ++j) data.set(cands[ok[j]], benchmark_of(j, nullptr, 0));
      return;
    }
    const bool has_heuristics = o.configs.empty() && ok.front() == 0;
    const int control = control_of(has_heuristics);
    double budget_s = 0;
    const tuning::RoundsResult r = measure_interleaved(control, budget_left_s, &budget_s);
    for (int j = 0; j < n; ++j)
      data.set(cands[ok[j]], benchmark_of(j, &r.candidates[j], r.control_quiet_ms));
    if (r.best < 0) {
      record_undecided(r, control, has_heuristics, budget_s, started);
      return;
    }
    record_decision(r, control, has_heuristics, started);
  }
};

}  // namespace

AutotuningData Autotuner::tune_uncoordinated(const BoundArguments& bound) const {
  const double start = now_seconds();
  QuietMissesScope quiet;  // a composed candidate's inner calls are not the program's
  TuningRun run(options_, bound);
  // Preparation (reference, packing) of any key may run alongside preparation of others, never
  // alongside a measurement: shared here, exclusive while measuring.
  std::shared_lock<std::shared_mutex> preparing(phase_mu());
  run.run_reference();
  size_t model_cut = SIZE_MAX;
  run.cands = candidates_for(*run.impl, *run.call, &model_cut);
  if (options_.configs.empty()) run.data.set_heuristics(run.cands.front());
  run.limit_candidates(model_cut);
  run.prepare_all();
  preparing.unlock();

  std::unique_lock<std::shared_mutex> measuring(phase_mu());
  const std::shared_ptr<void> exclusive = options_.exclusive ? options_.exclusive() : nullptr;
  const int n = static_cast<int>(run.cands.size());
  for (int i = 0; i < n; ++i) run.check(i, now_seconds() - start > options_.budget_s);
  run.measure_rounds(options_.budget_s - (now_seconds() - start), start);
  if (!run.data.has_success()) {
    TOKAMAX_LOG("autotune", kWarning, "all configs failed for " + run.what() + " " + bound.key());
  } else {
    TOKAMAX_LOG("autotune", kInfo,
                run.what() + " " + bound.key() + ": best " + run.data.fastest().config.str());
  }
  return std::move(run.data);
}

namespace {

// `b` as it names its implementation, or once per implementation of its family supported here
// when it names none or `all` asks for every one.
std::vector<BoundArguments> per_implementation(const BoundArguments& b, bool all) {
  if (!b.implementation().empty() && !all) return {b};
  std::vector<BoundArguments> out;
  for (const auto& impl : find_family(b.family()).implementations()) {
    if (impl->supported_on(device_info())) out.push_back(b.with_implementation(impl->name()));
  }
  return out;
}

}  // namespace

std::vector<BoundArguments> Autotuner::work_list(const std::vector<BoundArguments>& list) const {
  std::vector<BoundArguments> expanded;
  std::unordered_set<std::string> seen;
  for (const BoundArguments& b : list) {
    for (auto& i : per_implementation(b, options_.all_implementations)) {
      if (seen.insert(id_of(i)).second) expanded.push_back(std::move(i));
    }
  }
  return expanded;
}

AutotuningResult Autotuner::tune_all(const std::vector<BoundArguments>& list) const {
  AutotuningResult result;
  const std::vector<BoundArguments> expanded = work_list(list);
  const double start = now_seconds();
  const int total = static_cast<int>(expanded.size());
  int done = 0;
  // Before each key and after the last: the pace of the keys done so far gives the ETA.
  const auto progress = [&](const BoundArguments* b) {
    if (!options_.progress) return;
    AutotuneProgress p;
    p.done = done;
    p.total = total;
    p.elapsed_s = now_seconds() - start;
    p.eta_s = done > 0 ? p.elapsed_s / done * (total - done) : -1;
    if (b) p.key = b->family() + "/" + b->implementation();
    options_.progress(p);
  };
  for (const BoundArguments& b : expanded) {
    progress(&b);
    ++done;
    AutotuneOptions o = options_;
    o.progress = nullptr;
    o.budget_s -= now_seconds() - start;
    if (o.budget_s <= 0) {
      TOKAMAX_LOG(
          "autotune", kWarning,
          "time budget exhausted before " + b.family() + "/" + b.implementation() + " " + b.key());
      continue;
    }
    if (b.num_threads() > device_info().threads_available) {
      TOKAMAX_LOG("autotune", kWarning,
                  b.family() + "/" + b.implementation() + " " + b.key() + " asks for " +
                      std::to_string(b.num_threads()) + " threads; this machine runs " +
                      std::to_string(device_info().threads_available) +
                      ", so the measurement may not carry over to the machine that asked");
    }
    try {
      result.add(b, Autotuner(o).tune(b));
    } catch (const std::exception& e) {
      TOKAMAX_LOG("autotune", kWarning,
                  "failed to autotune " + b.family() + "/" + b.implementation() + " " + b.key() +
                      ": " + e.what());
    }
  }
  progress(nullptr);
  return result;
}

AutotuningResult autotune(const std::function<void()>& fn, AutotuneOptions options) {
  std::vector<BoundArguments> calls;
  {
    CallRecorder recorder(options.capture_all_threads ? CallRecorder::Scope::kAllThreads
                                                      : CallRecorder::Scope::kThisThread);
    fn();
    calls = recorder.calls();
  }
  std::vector<BoundArguments> todo;
  std::unordered_set<std::string> seen;
  for (const BoundArguments& call : calls) {
    for (const BoundArguments& b : per_implementation(call, options.all_implementations)) {
      if (!seen.insert(id_of(b)).second) continue;
      const auto impl = find_family(b.family()).implementation(b.implementation());
      if (!options.ignore_cache && already_tuned(*impl, b)) {
        TOKAMAX_LOG("autotune", kInfo,
                    "already tuned or nothing to tune, skipped: " + b.family() + "/" +
                        b.implementation() + " " + b.key());
        continue;
      }
      todo.push_back(b);
    }
  }
  // Expanded and filtered above: tune_all must not expand again (it would bring back the
  // implementations just skipped as already tuned).
  options.all_implementations = false;
  return Autotuner(std::move(options)).tune_all(todo);
}

}  // namespace tokamax
