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
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "autotuning/backend.h"
#include "autotuning/output_check.h"
#include "autotuning/scope_stack.h"
#include "core/thread_pool.h"
#include "tokamax/autotuning/cache.h"
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
  if (finalists < 1 || remeasure_rounds < 0)
    throw InvalidArgument("finalists must be >= 1, remeasure_rounds >= 0");
  if (timing.min_samples < 1 || timing.max_samples < timing.min_samples) {
    throw InvalidArgument("timing: need 1 <= min_samples <= max_samples");
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

std::vector<Config> Autotuner::candidates_for(const Implementation& impl,
                                              const CallBase& call) const {
  std::vector<Config> list;
  if (!options_.configs.empty()) {
    list = options_.configs;
  } else {
    list.push_back(impl.heuristics_config(call));
    for (auto& c : impl.autotuning_configs(call)) list.push_back(std::move(c));
  }
  // Heuristics first (always measured, so the speed-up over it is known), then sorted.
  std::vector<Config> out;
  std::unordered_set<std::string> seen;
  const Config first = list.front();
  std::sort(list.begin(), list.end());
  out.push_back(first);
  seen.insert(first.str());
  for (auto& c : list) {
    if (seen.insert(c.str()).second) out.push_back(c);
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
  std::vector<int> ok;    // candidates measured successfully
  std::string abandoned;  // set when a candidate overran its timeout and is still running

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
    cold = o.cold_cache.value_or(family.memory_bound(*call));
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

  // Candidates past max_candidates are recorded as skipped and dropped.
  void limit_candidates() {
    const size_t keep = std::min(cands.size(), static_cast<size_t>(o.max_candidates));
    for (size_t i = keep; i < cands.size(); ++i) {
      data.set_failure(cands[i],
                       {FailureKind::kSkipped,
                        fmt::format("over the candidate budget of {}", o.max_candidates)});
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
  // reference; only then timed.
  void measure(int i, bool over_budget) {
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
        TimingOptions t = o.timing;
        t.cold_cache = cold;
        t.max_time_s = std::min(t.max_time_s, o.candidate_timeout_s);
        const SampleStats s = time_callable([&] { impl->run(*call, cfg, p.prepared.get()); }, t);
        BenchmarkData b;
        b.median_ms = s.median_ms;
        b.samples_ms = s.samples_ms;
        b.iqr_ms = s.iqr_ms();
        b.prepare_ms = p.ms;
        b.scratch_bytes = p.scratch;
        b.cold_cache = cold;
        data.set(cfg, std::move(b));
        ok.push_back(i);
      }
    } catch (const Unsupported& e) {
      data.set_failure(cfg, {FailureKind::kUnsupported, e.what()});
    } catch (const std::exception& e) {
      data.set_failure(cfg, {FailureKind::kException, e.what()});
    }
  }

  // Re-measure the finalists interleaved, so that drift in machine state (another process,
  // clocks) hits them alike before a winner is declared.
  void remeasure_finalists() {
    if (ok.size() <= 1 || o.remeasure_rounds <= 0 || !abandoned.empty()) return;
    std::sort(ok.begin(), ok.end(), [&](int a, int b) {
      return data.entries().at(cands[a].str()).benchmark->median_ms <
             data.entries().at(cands[b].str()).benchmark->median_ms;
    });
    // The heuristics config (candidate 0) is always a finalist when it ran: a winner is then
    // one that beat the untuned default side by side, not one measured in a quieter minute.
    const bool heuristics_ok = o.configs.empty() && std::count(ok.begin(), ok.end(), 0);
    ok.resize(std::min<size_t>(ok.size(), static_cast<size_t>(o.finalists)));
    if (heuristics_ok && !std::count(ok.begin(), ok.end(), 0)) ok.push_back(0);
    std::vector<std::vector<double>> samples(ok.size());
    TimingOptions t = o.timing;
    t.cold_cache = cold;
    t.warmup = 1;
    t.min_samples = std::max(3, o.timing.min_samples / std::max(1, o.remeasure_rounds));
    t.min_time_s = o.timing.min_time_s / std::max(1, o.remeasure_rounds);
    t.max_time_s = std::min(t.max_time_s, o.candidate_timeout_s);
    for (int r = 0; r < o.remeasure_rounds; ++r) {
      for (size_t f = 0; f < ok.size(); ++f) {
        const Config& cfg = cands[ok[f]];
        const Prepared* prep = preps[ok[f]].prepared.get();
        const SampleStats s = time_callable([&] { impl->run(*call, cfg, prep); }, t);
        samples[f].insert(samples[f].end(), s.samples_ms.begin(), s.samples_ms.end());
      }
    }
    for (size_t f = 0; f < ok.size(); ++f) {
      BenchmarkData b = *data.entries().at(cands[ok[f]].str()).benchmark;
      const SampleStats s = SampleStats::of(samples[f]);
      b.median_ms = s.median_ms;
      b.samples_ms = s.samples_ms;
      b.iqr_ms = s.iqr_ms();
      b.finalist = true;
      data.set(cands[ok[f]], std::move(b));
    }
  }
};

}  // namespace

AutotuningData Autotuner::tune_uncoordinated(const BoundArguments& bound) const {
  const double start = now_seconds();
  TuningRun run(options_, bound);
  // Preparation (reference, packing) of any key may run alongside preparation of others, never
  // alongside a measurement: shared here, exclusive while measuring.
  std::shared_lock<std::shared_mutex> preparing(phase_mu());
  run.run_reference();
  run.cands = candidates_for(*run.impl, *run.call);
  if (options_.configs.empty()) run.data.set_heuristics(run.cands.front());
  run.limit_candidates();
  run.prepare_all();
  preparing.unlock();

  std::unique_lock<std::shared_mutex> measuring(phase_mu());
  const int n = static_cast<int>(run.cands.size());
  for (int i = 0; i < n; ++i) {
    run.measure(i, now_seconds() - start > options_.budget_s);
    if (options_.progress) {
      const double el = now_seconds() - start;
      options_.progress({i + 1, n, el, el / (i + 1) * (n - i - 1), run.what(), run.cands[i].str()});
    }
  }
  run.remeasure_finalists();
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

AutotuningResult Autotuner::tune_all(const std::vector<BoundArguments>& list) const {
  AutotuningResult result;
  std::vector<BoundArguments> expanded;
  std::unordered_set<std::string> seen;
  for (const BoundArguments& b : list) {
    for (auto& i : per_implementation(b, options_.all_implementations)) {
      if (seen.insert(id_of(i)).second) expanded.push_back(std::move(i));
    }
  }
  const double start = now_seconds();
  for (const BoundArguments& b : expanded) {
    AutotuneOptions o = options_;
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
