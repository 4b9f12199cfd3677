// The autotuner and the tuning backend of the resolution ladder (rungs 3-5).
#include "tokamax/autotuning/autotuner.h"

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

#include "autotuning/scope_stack.h"
#include "op/builtins.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/core/log.h"
#include "tokamax/op/dispatch.h"

namespace tokamax {
namespace {

constexpr size_t kGuardBytes = 4096;
constexpr uint8_t kGuardByte = 0xA5;

// Output buffers with guard zones on both sides; the interior is poisoned before each checked run.
struct GuardedOutputs {
  std::vector<Tensor> storage;
  std::vector<TensorView> views;
  std::vector<size_t> sizes;

  explicit GuardedOutputs(const std::vector<TensorView>& like) {
    for (const TensorView& v : like) {
      const size_t bytes = static_cast<size_t>(v.spec().bytes());
      Tensor t({static_cast<int64_t>(bytes + 2 * kGuardBytes)}, DType::kU8);
      std::memset(t.data(), kGuardByte, t.nbytes());
      views.emplace_back(static_cast<uint8_t*>(t.data()) + kGuardBytes, v.dtype(), v.shape());
      sizes.push_back(bytes);
      storage.push_back(std::move(t));
    }
  }
  void poison() {
    for (const TensorView& v : views) {
      if (is_floating(v.dtype()))
        fill_value(v, std::nan(""));
      else
        std::memset(v.data(), 0xFF, static_cast<size_t>(v.spec().bytes()));
    }
  }
  // Index of the first output whose guard zone was written, or -1.
  int damaged_guard() const {
    for (size_t i = 0; i < storage.size(); ++i) {
      const uint8_t* p = static_cast<const uint8_t*>(storage[i].data());
      for (size_t b = 0; b < kGuardBytes; ++b) {
        if (p[b] != kGuardByte || p[kGuardBytes + sizes[i] + b] != kGuardByte)
          return static_cast<int>(i);
      }
    }
    return -1;
  }
};

std::vector<double> to_f64(const TensorView& v) {
  const int64_t n = v.size();
  std::vector<double> out(static_cast<size_t>(n));
  if (v.is_contiguous() && v.dtype() == DType::kF32) {
    const float* p = v.data_as<float>();
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else if (v.is_contiguous() && v.dtype() == DType::kBF16) {
    const uint16_t* p = v.data_as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = v.get(i);
  }
  return out;
}

// Compares outputs with the reference; returns a failure or nullopt.
std::optional<Failure> check_outputs(const std::vector<TensorView>& outs,
                                     const std::vector<std::vector<double>>& refs,
                                     const Tolerance& tol) {
  for (size_t o = 0; o < outs.size(); ++o) {
    const std::vector<double> got = to_f64(outs[o]);
    const std::vector<double>& ref = refs[o];
    const bool floating = is_floating(outs[o].dtype());
    int64_t unwritten = 0, first_unwritten = -1, bad = 0, worst_at = -1;
    double worst = 0, err2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (floating && std::isnan(got[i]) && !std::isnan(ref[i])) {
        if (unwritten++ == 0) first_unwritten = static_cast<int64_t>(i);
        continue;
      }
      const double e = std::abs(got[i] - ref[i]);
      err2 += e * e;
      ref2 += ref[i] * ref[i];
      if (!(e <= tol.atol + tol.rtol * std::abs(ref[i]))) {
        ++bad;
        if (!(e <= worst) || worst_at < 0) {
          worst = e;
          worst_at = static_cast<int64_t>(i);
        }
      }
    }
    const std::string which = "output " + std::to_string(o) + " " + outs[o].spec().str();
    if (unwritten) {
      return Failure{FailureKind::kUnwritten,
                     which + ": " + std::to_string(unwritten) +
                         " elements left unwritten (poison NaN), first at flat index " +
                         std::to_string(first_unwritten)};
    }
    const double normwise = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (bad || (tol.normwise > 0 && normwise > tol.normwise)) {
      std::string msg = which + ": " + std::to_string(bad) + " elements outside atol " +
                        std::to_string(tol.atol) + " rtol " + std::to_string(tol.rtol);
      if (worst_at >= 0) {
        msg += "; worst abs error " + std::to_string(worst) + " at flat index " +
               std::to_string(worst_at) + " (got " + std::to_string(got[worst_at]) + ", expected " +
               std::to_string(ref[worst_at]) + ")";
      }
      msg += "; normwise relative error " + std::to_string(normwise);
      return Failure{FailureKind::kWrongResult, msg};
    }
  }
  return std::nullopt;
}

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

template <class Fn>
void parallel_indices(int n, int threads, Fn fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  auto body = [&] {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  for (int t = 1; t < std::min(threads, n); ++t) pool.emplace_back(body);
  body();
  for (auto& t : pool) t.join();
}

}  // namespace

void AutotuneOptions::validate() const {
  if (!(budget_s > 0))
    throw InvalidArgument("autotuning budget_s is " + std::to_string(budget_s) + "; expected > 0");
  if (candidate_timeout_s <= 0) {
    throw InvalidArgument("candidate_timeout_s is " + std::to_string(candidate_timeout_s) +
                          "; expected > 0");
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

AutotuningData Autotuner::tune_uncoordinated(const BoundArguments& bound) const {
  const double start = now_seconds();
  const OpFamily& family = find_family(bound.family());
  const auto impl = family.implementation(bound.implementation());
  if (!impl->supported_on(device_info())) {
    throw Unsupported(family.name() + " implementation " + impl->name() + " is not supported on " +
                      device_kind());
  }
  // Shared: a candidate that overruns its timeout is abandoned still running, and keeps the
  // call (inputs) and its output buffers alive.
  std::shared_ptr<CallBase> call = family.make_call(bound, options_.seed);
  impl->validate(*call);
  const Tolerance tol = family.tolerance(*call);
  const bool cold = options_.cold_cache.value_or(family.memory_bound(*call));

  // Preparation (reference, packing) of any key may run alongside preparation of others, never
  // alongside a measurement: shared here, exclusive while measuring.
  std::shared_lock<std::shared_mutex> preparing(phase_mu());

  // Reference outputs on the same inputs; then the guarded buffers candidates write into.
  std::vector<std::vector<double>> refs;
  std::shared_ptr<GuardedOutputs> out;
  {
    GuardedOutputs ref_out(call->outputs);
    call->outputs = ref_out.views;
    family.reference()->run(*call, Config::null(), nullptr);
    for (const auto& v : ref_out.views) refs.push_back(to_f64(v));
    out = std::make_shared<GuardedOutputs>(ref_out.views);
    call->outputs = out->views;
  }

  std::vector<Config> cands = candidates_for(*impl, *call);
  AutotuningData data;
  if (options_.configs.empty()) data.set_heuristics(cands.front());
  size_t keep = cands.size();
  if (static_cast<size_t>(options_.max_candidates) < keep) {
    keep = static_cast<size_t>(options_.max_candidates);
    for (size_t i = keep; i < cands.size(); ++i) {
      data.set_failure(cands[i],
                       {FailureKind::kSkipped,
                        "over the candidate budget of " + std::to_string(options_.max_candidates)});
    }
    cands.resize(keep);
  }
  const int n = static_cast<int>(cands.size());

  // Parallel preparation (packing, scratch): nothing is measured meanwhile.
  struct Prep {
    std::shared_ptr<const Prepared> prepared;
    double ms = 0;
    int64_t scratch = 0;
    std::optional<Failure> failure;
  };
  std::vector<Prep> preps(static_cast<size_t>(n));
  const int threads = options_.prepare_threads > 0
                          ? options_.prepare_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  parallel_indices(n, threads, [&](int i) {
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

  preparing.unlock();
  std::unique_lock<std::shared_mutex> measuring(phase_mu());
  std::string abandoned;  // set when a candidate overran its timeout and is still running
  auto report = [&](int done, const Config& c) {
    if (!options_.progress) return;
    const double el = now_seconds() - start;
    options_.progress({done, n, el, done ? el / done * (n - done) : 0,
                       family.name() + "/" + impl->name(), c.str()});
  };
  std::vector<int> ok;
  for (int i = 0; i < n; ++i) {
    const Config& cfg = cands[i];
    Prep& p = preps[i];
    if (now_seconds() - start > options_.budget_s) {
      data.set_failure(cfg,
                       {FailureKind::kSkipped,
                        "time budget of " + std::to_string(options_.budget_s) + " s exhausted"});
      report(i + 1, cfg);
      continue;
    }
    if (p.failure) {
      data.set_failure(cfg, *p.failure);
      report(i + 1, cfg);
      continue;
    }
    if (!abandoned.empty()) {
      data.set_failure(cfg, {FailureKind::kSkipped, abandoned});
      report(i + 1, cfg);
      continue;
    }
    auto run = [&] { impl->run(*call, cfg, p.prepared.get()); };
    try {
      out->poison();
      double dt = 0;
      std::shared_ptr<const Prepared> prepared = p.prepared;
      const bool finished = run_with_timeout(
          [impl, call, out, prepared, cfg] { impl->run(*call, cfg, prepared.get()); },
          options_.candidate_timeout_s, &dt);
      if (!finished) {
        data.set_failure(cfg,
                         {FailureKind::kTimeout, "did not finish within the timeout of " +
                                                     std::to_string(options_.candidate_timeout_s) +
                                                     " s; abandoned, still running"});
        abandoned = "not measured: candidate " + cfg.str() +
                    " overran its timeout and still runs on this key's buffers";
        TOKAMAX_LOG("autotune", kWarning,
                    family.name() + "/" + impl->name() + " " + cfg.str() +
                        " overran its timeout and was abandoned while running; later measurements "
                        "in this process may be disturbed");
      } else if (int g = out->damaged_guard(); g >= 0) {
        data.set_failure(cfg, {FailureKind::kOutOfBounds,
                               "wrote outside output " + std::to_string(g) + " " +
                                   call->outputs[g].spec().str() + " (guard zone damaged)"});
      } else if (auto f = check_outputs(out->views, refs, tol)) {
        data.set_failure(cfg, *f);
      } else if (dt > options_.candidate_timeout_s) {
        data.set_failure(cfg, {FailureKind::kTimeout,
                               "one call took " + std::to_string(dt) + " s, over the timeout of " +
                                   std::to_string(options_.candidate_timeout_s) + " s"});
      } else {
        TimingOptions t = options_.timing;
        t.cold_cache = cold;
        t.max_time_s = std::min(t.max_time_s, options_.candidate_timeout_s);
        const SampleStats s = time_callable(run, t);
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
    report(i + 1, cfg);
  }

  // Re-measure the finalists interleaved, so that drift in machine state (another process,
  // clocks) hits them alike before a winner is declared.
  if (ok.size() > 1 && options_.remeasure_rounds > 0 && abandoned.empty()) {
    std::sort(ok.begin(), ok.end(), [&](int a, int b) {
      return data.entries().at(cands[a].str()).benchmark->median_ms <
             data.entries().at(cands[b].str()).benchmark->median_ms;
    });
    // The heuristics config (candidate 0) is always a finalist when it ran: a winner is then
    // one that beat the untuned default side by side, not one measured in a quieter minute.
    const bool heuristics_ok = options_.configs.empty() && std::count(ok.begin(), ok.end(), 0);
    ok.resize(std::min<size_t>(ok.size(), static_cast<size_t>(options_.finalists)));
    if (heuristics_ok && !std::count(ok.begin(), ok.end(), 0)) ok.push_back(0);
    std::vector<std::vector<double>> samples(ok.size());
    TimingOptions t = options_.timing;
    t.cold_cache = cold;
    t.warmup = 1;
    t.min_samples =
        std::max(3, options_.timing.min_samples / std::max(1, options_.remeasure_rounds));
    t.min_time_s = options_.timing.min_time_s / std::max(1, options_.remeasure_rounds);
    t.max_time_s = std::min(t.max_time_s, options_.candidate_timeout_s);
    for (int r = 0; r < options_.remeasure_rounds; ++r) {
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
  if (!data.has_success()) {
    TOKAMAX_LOG("autotune", kWarning,
                "all configs failed for " + family.name() + "/" + impl->name() + " " + bound.key());
  } else {
    TOKAMAX_LOG("autotune", kInfo,
                family.name() + "/" + impl->name() + " " + bound.key() + ": best " +
                    data.fastest().config.str());
  }
  return data;
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

namespace {
bool already_tuned(const Implementation& impl, const BoundArguments& bound);
}  // namespace

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

namespace {

class Backend : public TuningBackend {
 public:
  std::optional<Config> scope_lookup(const Implementation& impl, const BoundArguments& bound,
                                     std::string* detail) const override {
    const auto& scopes = active_scopes();
    if (scopes.empty()) return std::nullopt;
    const std::string kind = device_kind();
    const std::string id = bound.family() + "/" + impl.name();
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      if ((*it)->device_kind != kind) continue;
      auto f = (*it)->winners.find(id);
      if (f == (*it)->winners.end()) continue;
      auto c = f->second.find(bound.key());
      if (c == f->second.end()) continue;
      if (detail) *detail = (*it)->name;
      return c->second;
    }
    return std::nullopt;
  }
  std::optional<Config> cache_lookup(const Implementation& impl, const BoundArguments& bound,
                                     std::string* detail) const override {
    return DiskCache::global().lookup(impl, bound, detail);
  }
  std::optional<Config> autotune_now(const OpFamily&, const Implementation& impl,
                                     const BoundArguments& bound,
                                     std::string* detail) const override {
    AutotuningData data;
    try {
      data = Autotuner().tune(bound);
    } catch (const std::exception& e) {
      TOKAMAX_LOG("autotune", kWarning,
                  "autotune on cache miss failed for " + bound.key() + ": " + e.what());
      return std::nullopt;
    }
    if (!data.has_success()) return std::nullopt;
    const Config best = data.fastest().config;
    DiskCache::global().put_memory(impl, bound, best);
    try {
      AutotuningResult r;
      r.add(bound, data);
      r.dump_cache();
    } catch (const std::exception& e) {
      TOKAMAX_LOG("cache", kWarning, std::string("could not write the user cache: ") + e.what());
    }
    if (detail) *detail = "tuned on cache miss";
    return best;
  }
};

const Backend g_backend;

bool already_tuned(const Implementation& impl, const BoundArguments& bound) {
  return !impl.has_config() || g_backend.scope_lookup(impl, bound, nullptr) ||
         g_backend.cache_lookup(impl, bound, nullptr);
}
}  // namespace

void install_autotuning_backend() { set_builtin_tuning_backend(&g_backend); }

}  // namespace tokamax
