// Dispatch and the resolution ladder.
#include "tokamax/op/dispatch.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "core/thread_pool.h"
#include "op/builtins.h"
#include "tokamax/core/enum_names.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"

namespace tokamax {

namespace {

thread_local std::optional<CacheMissPolicy> t_policy;
thread_local bool t_quiet_misses = false;
thread_local CallRecorder* t_recorder = nullptr;
thread_local ConfigSource t_config_source = ConfigSource::kLadder;
thread_local ConfigQuery* t_query = nullptr;
std::atomic<const TuningBackend*> g_backend{nullptr};
// The tracing-off fast path reads only g_observed (relaxed; internal linkage, so a direct load,
// not one through the GOT); g_observer is read after it.
std::atomic<bool> g_observed{false};
std::atomic<const CallObserver*> g_observer{nullptr};
thread_local std::string t_enclosing_payload;

double steady_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The calls that missed the tuning data and took the heuristics config: one warning line for
// the process (a miss per key was a 400-character line each, dozens in a model's first step),
// every key at debug level, and a count when the process exits.
class MissLog {
 public:
  void record(const OpFamily& family, const Implementation& impl, const BoundArguments& bound) {
    std::string id = family.name() + "\n" + impl.name() + "\n" + bound.key();
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!seen_.insert(std::move(id)).second) return;
      first = keys_.empty();
      if (first) kind_ = device_kind();  // for the count at exit, when statics are going away
      keys_.push_back({family.name(), impl.name(), bound.key()});
    }
    if (first && log_enabled("autotune", LogLevel::kWarning)) {
      log_message("autotune", LogLevel::kWarning, miss_warning(family, impl));
    }
    TOKAMAX_LOG("autotune", kDebug,
                "cache miss: " + family.name() + "/" + impl.name() + " " + bound.key());
  }

  std::vector<MissedKey> keys() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_;
  }

  ~MissLog() {
    // The first miss has its line already; more than one gets their count.
    if (keys_.size() > 1 && log_enabled("autotune", LogLevel::kWarning)) {
      log_message("autotune", LogLevel::kWarning,
                  std::to_string(keys_.size()) + " op call keys were not in the tuning data for " +
                      kind_ +
                      " and ran with heuristics configs (TOKAMAX_LOG=autotune:debug lists them)");
    }
  }

 private:
  static std::string miss_warning(const OpFamily& family, const Implementation& impl) {
    return "op calls not in the tuning data for " + device_kind() +
           " use heuristics configs (first: " + family.name() + "/" + impl.name() +
           "). Tune them: tokamax autotune --bound-args (from a trace), or "
           "TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK=autotune; docs/tuning.md";
  }

  mutable std::mutex mu_;
  std::unordered_set<std::string> seen_;
  std::vector<MissedKey> keys_;
  std::string kind_;
};

// Destroyed at exit, after the calls (a function's static: constructed on the first miss).
MissLog& miss_log() {
  static MissLog log;
  return log;
}

}  // namespace

namespace {

// All-threads recorders, and the observer flag's other half (g_observed = an observer is
// installed or this list is not empty; both change under g_slow_path_mu).
std::mutex g_slow_path_mu;
std::vector<CallRecorder*> g_all_threads_recorders;

// Caller holds g_slow_path_mu.
void update_observed_flag() {
  g_observed.store(
      g_observer.load(std::memory_order_acquire) != nullptr || !g_all_threads_recorders.empty(),
      std::memory_order_release);
}

}  // namespace

ConfigSource config_source() { return t_config_source; }

ConfigSourceScope::ConfigSourceScope(ConfigSource source) : previous_(t_config_source) {
  t_config_source = source;
}

ConfigSourceScope::~ConfigSourceScope() { t_config_source = previous_; }

ConfigQuery::ConfigQuery() : outer_(t_query) { t_query = this; }

ConfigQuery::~ConfigQuery() { t_query = outer_; }

void record_call(const BoundArguments& b) {
  for (CallRecorder* r = t_recorder; r; r = r->outer_) r->calls_.push_back(b);
}

void record_call_all_threads(const BoundArguments& b) {
  std::lock_guard<std::mutex> lock(g_slow_path_mu);
  for (CallRecorder* r : g_all_threads_recorders) r->calls_.push_back(b);
}

CallRecorder::CallRecorder(Scope scope) : scope_(scope) {
  if (scope_ == Scope::kThisThread) {
    outer_ = t_recorder;
    t_recorder = this;
    return;
  }
  std::lock_guard<std::mutex> lock(g_slow_path_mu);
  g_all_threads_recorders.push_back(this);
  update_observed_flag();
}

CallRecorder::~CallRecorder() {
  if (scope_ == Scope::kThisThread) {
    t_recorder = outer_;
    return;
  }
  std::lock_guard<std::mutex> lock(g_slow_path_mu);
  std::erase(g_all_threads_recorders, this);
  update_observed_flag();
}

std::vector<BoundArguments> CallRecorder::calls() const {
  if (scope_ == Scope::kThisThread) return calls_;
  std::lock_guard<std::mutex> lock(g_slow_path_mu);
  return calls_;
}

namespace {
constexpr EnumNames<CacheMissPolicy, 3> kPolicies{"cache-miss policy",
                                                  {{{CacheMissPolicy::kHeuristics, "heuristics"},
                                                    {CacheMissPolicy::kAutotune, "autotune"},
                                                    {CacheMissPolicy::kError, "error"}}}};
constexpr EnumNames<Rung, 7> kRungs{"rung",
                                    {{{Rung::kExplicit, "explicit"},
                                      {Rung::kNullConfig, "null_config"},
                                      {Rung::kScope, "scope"},
                                      {Rung::kDiskCache, "disk_cache"},
                                      {Rung::kHeuristics, "heuristics"},
                                      {Rung::kAutotuned, "autotuned"},
                                      {Rung::kRemoteCache, "remote_cache"}}}};
}  // namespace

CacheMissPolicy parse_cache_miss_policy(std::string_view s) { return kPolicies.parse(s); }
std::string_view cache_miss_policy_name(CacheMissPolicy p) { return kPolicies.name(p); }

CacheMissPolicy cache_miss_policy() {
  if (t_policy) return *t_policy;
  const char* env = std::getenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK");
  if (!env || !*env) return CacheMissPolicy::kHeuristics;
  try {
    return parse_cache_miss_policy(env);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK: ") + e.what());
  }
}

CacheMissPolicyScope::CacheMissPolicyScope(CacheMissPolicy policy) : previous_(t_policy) {
  t_policy = policy;
}
CacheMissPolicyScope::~CacheMissPolicyScope() { t_policy = previous_; }

std::string_view rung_name(Rung r) { return kRungs.name(r); }

std::vector<MissedKey> missed_keys() { return miss_log().keys(); }

QuietMissesScope::QuietMissesScope() : previous_(t_quiet_misses) { t_quiet_misses = true; }
QuietMissesScope::~QuietMissesScope() { t_quiet_misses = previous_; }

void set_builtin_tuning_backend(const TuningBackend* backend) { g_backend.store(backend); }

void set_tuning_backend(const TuningBackend* backend) {
  ensure_builtins();  // so that the built-in backend, installed on first use, does not replace it
  g_backend.store(backend);
}

void set_call_observer(const CallObserver* observer) {
  std::lock_guard<std::mutex> lock(g_slow_path_mu);
  g_observer.store(observer, std::memory_order_release);
  update_observed_flag();
}

bool calls_observed() { return g_observed.load(std::memory_order_relaxed); }

const std::string& enclosing_payload() { return t_enclosing_payload; }

std::string call_payload(const BoundArguments& bound, const Resolution& resolution) {
  // Assembled from pieces that are already canonical (the key, the config string), in sorted
  // key order, so the result equals canonical_dump of the object without building it: this
  // runs on every traced call. (tests/trace: CallPayloadIsCanonicalJson.)
  static const std::string version = Json(library_version()).dump();
  std::string s;
  s.reserve(bound.key().size() + resolution.config.str().size() + 160);
  s += kPayloadMarker;
  s += "{\"arguments\":";
  s += bound.key();
  s += ",\"format\":";
  s += std::to_string(kPayloadFormat);
  s += ",\"op\":{\"config\":";
  s += resolution.config.str();
  s += ",\"family\":";
  append_json_string(s, bound.family());
  s += ",\"implementation\":";
  append_json_string(s, bound.implementation());
  s += ",\"rung\":\"";
  s += rung_name(resolution.rung);
  s += "\"},\"tokamax_version\":";
  s += version;
  s += "}";
  return s;
}

Resolution resolve_config(const OpFamily& family, const Implementation& impl, const CallBase& call,
                          const std::optional<Config>& explicit_config) {
  Resolution r;
  if (explicit_config) {
    r.config = *explicit_config;
    r.rung = Rung::kExplicit;
    r.detail = "given by the caller";
    return r;
  }
  if (!impl.has_config()) {
    r.rung = Rung::kNullConfig;
    r.detail = "implementation has nothing to tune";
    return r;
  }
  if (t_config_source == ConfigSource::kHeuristics) {
    r.config = impl.heuristics_config(call);
    r.rung = Rung::kHeuristics;
    r.detail = "heuristics only (ConfigSourceScope)";
    return r;
  }
  ensure_builtins();  // installs the autotuning layer's rungs on the first call
  const TuningBackend* backend = g_backend.load(std::memory_order_acquire);
  const BoundArguments bound = call.bound.with_implementation(impl.name());
  // Scopes, the disk cache, the remote cache for a key; true with r filled on a hit.
  const auto found = [&](const BoundArguments& key) {
    if (auto c = backend->scope_lookup(impl, key, &r.detail)) {
      r.config = *c;
      r.rung = Rung::kScope;
      return true;
    }
    if (auto c = backend->cache_lookup(impl, key, &r.detail)) {
      r.config = *c;
      r.rung = Rung::kDiskCache;
      return true;
    }
    if (auto c = backend->remote_lookup(impl, key, &r.detail)) {
      r.config = *c;
      r.rung = Rung::kRemoteCache;
      return true;
    }
    return false;
  };
  if (backend) {
    if (found(bound)) return r;
    // A forward asked for its residuals (a training step's) has the inference call's config
    // space and nearly its cost (the residual is a row statistic or a copy of what the kernel
    // holds anyway), and a call on pre-packed weights runs the same products: without an entry
    // of its own each takes the plain call's, rather than the heuristics and a miss warning for
    // a spec the shipped data tunes.
    if (const auto plain = family.config_fallback(bound); plain && found(*plain)) {
      r.detail += " (the entry of the plain call: no residuals, weights unpacked)";
      return r;
    }
  }
  switch (cache_miss_policy()) {
    case CacheMissPolicy::kError:
      throw CacheMiss("no tuned config for op " + family.name() + " implementation " + impl.name() +
                      " on device kind " + device_kind() + " with bound arguments " +
                      canonical_dump(bound.to_json()) +
                      " (policy 'error'; tune it with `tokamax autotune` or set "
                      "TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK=heuristics)");
    case CacheMissPolicy::kAutotune:
      if (backend) {
        if (auto c = backend->autotune_now(family, impl, bound, &r.detail)) {
          r.config = *c;
          r.rung = Rung::kAutotuned;
          return r;
        }
      }
      [[fallthrough]];
    case CacheMissPolicy::kHeuristics:
      if (!t_quiet_misses) miss_log().record(family, impl, bound);
      r.config = impl.heuristics_config(call);
      r.rung = Rung::kHeuristics;
      if (r.detail.empty()) r.detail = "cache miss; heuristics";
      return r;
  }
  return r;
}

namespace {

void prepare_and_run(const Implementation& impl, CallBase& call, const Config& config) {
  bump_thread_entry_epoch();  // the caller's code ran since our last call on this thread
  const auto prepared = impl.prepare(call, config);
  impl.run(call, config, prepared.get());
}

// The traced path: the payload (nested under the enclosing calls' payloads on this thread) is
// visible to ops called from inside this one, and the observer gets the call's span, also when
// it throws.
void run_observed(const OpFamily& family, const Implementation& impl, CallBase& call,
                  const BoundArguments& bound, const Resolution& r) {
  const std::string own = call_payload(bound, r);
  std::string payload = t_enclosing_payload.empty() ? own : t_enclosing_payload + "/" + own;
  std::swap(t_enclosing_payload, payload);  // `payload` now holds the enclosing one
  struct Restore {
    std::string& slot;
    std::string& saved;
    ~Restore() { std::swap(slot, saved); }
  } restore{t_enclosing_payload, payload};
  const std::string name = family.name() + "/" + impl.name();
  const double start = steady_us();
  auto report = [&](const std::string& error) {
    if (const CallObserver* o = g_observer.load(std::memory_order_acquire))
      o->on_call(name, t_enclosing_payload, start, steady_us() - start, error);
  };
  try {
    prepare_and_run(impl, call, r.config);
  } catch (const std::exception& e) {
    report(e.what());
    throw;
  }
  report("");
}

template <class OnImpl>
std::string walk(const OpFamily& family, const CallBase& call, const CallOptions& options,
                 std::vector<std::pair<std::string, std::string>>* skipped, OnImpl on_impl) {
  if (options.config && options.implementation.empty()) {
    throw InvalidArgument("an explicit config for op " + family.name() +
                          " needs the implementation it is for (CallOptions::implementation)");
  }
  if (!options.implementation.empty()) {
    auto impl = family.implementation(options.implementation);
    if (!impl->supported_on(device_info())) {
      throw Unsupported(family.name() + " implementation " + impl->name() +
                        " is not supported on " + device_kind());
    }
    impl->validate(call);
    on_impl(*impl);
    return impl->name();
  }
  std::string reasons;
  for (const auto& impl : family.implementations()) {
    try {
      if (!impl->supported_on(device_info()))
        throw Unsupported("not supported on " + device_kind());
      impl->validate(call);
    } catch (const Unsupported& e) {
      if (skipped) skipped->emplace_back(impl->name(), e.what());
      reasons += "\n  " + impl->name() + ": " + e.what();
      continue;
    }
    on_impl(*impl);
    return impl->name();
  }
  throw Unsupported("no implementation of " + family.name() + " can serve " + call.bound.key() +
                    ":" + reasons);
}

}  // namespace

std::string dispatch(const OpFamily& family, CallBase& call, const CallOptions& options) {
  ensure_builtins();  // TOKAMAX_TRACE's recording among them, before the first call is observed
  return walk(family, call, options, nullptr, [&](const Implementation& impl) {
    if (t_query) {
      ConfigQuery::Entry e{family.name(),
                           impl.name(),
                           impl.has_config() ? impl.heuristics_config(call) : Config::null(),
                           {}};
      // The ladder without its miss policy: a query neither tunes nor fails on a miss, and its
      // misses are no call's (the entry says "cache miss; heuristics" itself).
      const CacheMissPolicyScope no_tuning(CacheMissPolicy::kHeuristics);
      const QuietMissesScope quiet;
      e.ladder = resolve_config(family, impl, call, options.config);
      t_query->calls_.push_back(std::move(e));
      return;
    }
    const Resolution r = resolve_config(family, impl, call, options.config);
    if (t_recorder) record_call(call.bound.with_implementation(impl.name()));
    TOKAMAX_LOG("dispatch", kDebug,
                family.name() + " -> " + impl.name() + " config " + r.config.str() + " (" +
                    std::string(rung_name(r.rung)) + ")");
    if (!g_observed.load(std::memory_order_relaxed)) {
      prepare_and_run(impl, call, r.config);
      return;
    }
    const BoundArguments bound = call.bound.with_implementation(impl.name());
    record_call_all_threads(bound);
    if (g_observer.load(std::memory_order_acquire)) {
      run_observed(family, impl, call, bound, r);
    } else {
      prepare_and_run(impl, call, r.config);
    }
  });
}

Explanation explain(const OpFamily& family, const CallBase& call, const CallOptions& options) {
  const QuietMissesScope quiet;  // nothing runs; the resolution's detail names a miss itself
  Explanation e;
  e.implementation = walk(family, call, options, &e.skipped, [&](const Implementation& impl) {
    e.resolution = resolve_config(family, impl, call, options.config);
  });
  return e;
}

}  // namespace tokamax
