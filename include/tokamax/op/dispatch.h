// Dispatch over implementations and the config resolution ladder:
//   1. a config given by the caller;
//   2. the implementation has nothing to tune: the null config, no lookup;
//   3. active AutotuningScopes, innermost first;
//   4. the disk cache (shipped data, then the user cache directory);
//   5. a miss: by policy `heuristics` (default; one warning line per process, each key at the
//      autotune category's debug level, a count at exit), `autotune` or `error`.
// The policy comes from TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK or a CacheMissPolicyScope.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class CacheMissPolicy { kHeuristics, kAutotune, kError };
CacheMissPolicy parse_cache_miss_policy(std::string_view s);
std::string_view cache_miss_policy_name(CacheMissPolicy p);
// The innermost CacheMissPolicyScope on this thread, else the environment variable.
CacheMissPolicy cache_miss_policy();

class CacheMissPolicyScope {
 public:
  explicit CacheMissPolicyScope(CacheMissPolicy policy);
  ~CacheMissPolicyScope();
  CacheMissPolicyScope(const CacheMissPolicyScope&) = delete;
  CacheMissPolicyScope& operator=(const CacheMissPolicyScope&) = delete;

 private:
  std::optional<CacheMissPolicy> previous_;
};

// Where a call's config comes from when its caller names none. kLadder: rungs 3-5 above.
// kHeuristics: the implementation's heuristics config, with no scope or cache lookup: what the
// PyTorch ops do by default, so that a compiled graph does not depend on which cache files a
// machine has (tokamax's PyTorch bridge does the same). An explicit config still wins.
enum class ConfigSource { kLadder, kHeuristics };
// The innermost ConfigSourceScope on this thread; kLadder outside any.
ConfigSource config_source();
class ConfigSourceScope {
 public:
  explicit ConfigSourceScope(ConfigSource source);
  ~ConfigSourceScope();
  ConfigSourceScope(const ConfigSourceScope&) = delete;
  ConfigSourceScope& operator=(const ConfigSourceScope&) = delete;

 private:
  ConfigSource previous_;
};

enum class Rung {
  kExplicit,
  kNullConfig,
  kScope,
  kDiskCache,
  kHeuristics,
  kAutotuned,
  kRemoteCache
};
std::string_view rung_name(Rung r);

struct Resolution {
  Config config;
  Rung rung = Rung::kHeuristics;
  std::string detail;  // which scope / which file / why
};

// Rungs 3-5 live in the autotuning layer; it installs itself here (dependency inversion keeps
// the op layer free of includes from the layer above).
class TuningBackend {
 public:
  virtual ~TuningBackend() = default;
  virtual std::optional<Config> scope_lookup(const Implementation& impl,
                                             const BoundArguments& bound,
                                             std::string* detail) const = 0;
  virtual std::optional<Config> cache_lookup(const Implementation& impl,
                                             const BoundArguments& bound,
                                             std::string* detail) const = 0;
  virtual std::optional<Config> autotune_now(const OpFamily& family, const Implementation& impl,
                                             const BoundArguments& bound,
                                             std::string* detail) const = 0;
  // The fleet's shared store (TOKAMAX_REMOTE_CACHE), after the local disk cache.
  virtual std::optional<Config> remote_lookup(const Implementation&, const BoundArguments&,
                                              std::string*) const {
    return std::nullopt;
  }
};
void set_tuning_backend(const TuningBackend* backend);

// The calls of this process that missed the tuning data and ran with the heuristics config,
// one per (family, implementation, key), in the order of their first miss.
struct MissedKey {
  std::string family;
  std::string implementation;
  std::string key;
};
std::vector<MissedKey> missed_keys();

// While alive, misses on this thread are neither recorded nor warned about: what the autotuner
// runs (a composed candidate's inner op calls) is not the program's own calls, and explain() and
// a ConfigQuery run nothing (each entry says "cache miss; heuristics" itself).
class QuietMissesScope {
 public:
  QuietMissesScope();
  ~QuietMissesScope();
  QuietMissesScope(const QuietMissesScope&) = delete;
  QuietMissesScope& operator=(const QuietMissesScope&) = delete;

 private:
  bool previous_;
};

Resolution resolve_config(const OpFamily& family, const Implementation& impl, const CallBase& call,
                          const std::optional<Config>& explicit_config);

// Runs `call` with the first implementation that can serve it; returns its name.
std::string dispatch(const OpFamily& family, CallBase& call, const CallOptions& options);

struct Explanation {
  std::string implementation;
  Resolution resolution;
  std::vector<std::pair<std::string, std::string>> skipped;  // implementation, reason
};
// What dispatch would do, without running anything.
Explanation explain(const OpFamily& family, const CallBase& call, const CallOptions& options);

// While alive, op calls on this thread are not run: each dispatch records which implementation
// would serve it, its heuristics config and the config the ladder would choose (scopes and the
// disk cache, else the heuristics; never tuning, never a CacheMiss), and returns with the
// outputs unwritten. What get_configs(op, *args) in the Python package is built on: run the
// op's public function (forward or VJP) under a ConfigQuery and read the configs of every op
// call it makes. Nests: the innermost query records.
class ConfigQuery {
 public:
  struct Entry {
    std::string family;
    std::string implementation;
    Config heuristics;  // the null config when the implementation has nothing to tune
    Resolution ladder;  // the full ladder (an explicit config when the call gave one)
  };
  ConfigQuery();
  ~ConfigQuery();
  ConfigQuery(const ConfigQuery&) = delete;
  ConfigQuery& operator=(const ConfigQuery&) = delete;
  const std::vector<Entry>& calls() const { return calls_; }

 private:
  friend std::string dispatch(const OpFamily&, CallBase&, const CallOptions&);
  ConfigQuery* outer_ = nullptr;
  std::vector<Entry> calls_;
};

// The payload a traced call carries: "tokamax:" + compact JSON of
//   {"format": 1, "tokamax_version": V,
//    "op": {"family": F, "implementation": I, "config": {...}, "rung": R},
//    "arguments": {...}}
// i.e. BoundArguments::to_json() plus the chosen config, the ladder rung that chose it and the
// payload format (a reader refuses formats it does not know). A call made inside another op's
// implementation carries "<outer payload>/<own payload>", outermost first.
inline constexpr std::string_view kPayloadMarker = "tokamax:";
inline constexpr int kPayloadFormat = 1;
std::string call_payload(const BoundArguments& bound, const Resolution& resolution);

// Sees every dispatched call while installed (the trace layer installs one when tracing is on).
// With none installed, dispatch pays one relaxed atomic load per call.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // `name` is "family/implementation"; `payload` includes the enclosing calls' payloads;
  // start_us and dur_us are on the steady clock; `error` is the exception message when the
  // call threw (the exception still propagates), else empty.
  virtual void on_call(const std::string& name, const std::string& payload, double start_us,
                       double dur_us, const std::string& error) const = 0;
};
// nullptr uninstalls. The observer must outlive its installation.
void set_call_observer(const CallObserver* observer);
// Whether an observer or an all-threads CallRecorder is installed. Dispatch makes this check
// inline on every call, one relaxed load of a library-internal flag (bench/trace_bench.cc times
// this function, a call around it).
bool calls_observed();
// The payload of the calls enclosing this point on this thread ("" outside any traced call).
const std::string& enclosing_payload();

// Records the BoundArguments of every dispatched call while alive: on the thread that made it
// (recorders nest), or on every thread (for a function that runs ops on threads it starts; calls
// from unrelated threads of the process are recorded too).
class CallRecorder {
 public:
  enum class Scope { kThisThread, kAllThreads };
  explicit CallRecorder(Scope scope = Scope::kThisThread);
  ~CallRecorder();
  CallRecorder(const CallRecorder&) = delete;
  CallRecorder& operator=(const CallRecorder&) = delete;
  std::vector<BoundArguments> calls() const;  // in call order (per thread)

 private:
  friend void record_call(const BoundArguments&);
  friend void record_call_all_threads(const BoundArguments&);
  Scope scope_;
  CallRecorder* outer_ = nullptr;
  std::vector<BoundArguments> calls_;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
