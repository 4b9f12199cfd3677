// Dispatch over implementations and the config resolution ladder:
//   1. a config given by the caller;
//   2. the implementation has nothing to tune: the null config, no lookup;
//   3. active AutotuningScopes, innermost first;
//   4. the disk cache (shipped data, then the user cache directory);
//   5. a miss: by policy `heuristics` (default; one warning per key), `autotune` or `error`.
// The policy comes from TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK or a CacheMissPolicyScope.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokamax/op/op.h"

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

enum class Rung { kExplicit, kNullConfig, kScope, kDiskCache, kHeuristics, kAutotuned };
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
};
void set_tuning_backend(const TuningBackend* backend);

Resolution resolve_config(const OpFamily& family, const Implementation& impl, const CallBase& call,
                          const std::optional<Config>& explicit_config);

struct CallOptions {
  std::string implementation;    // empty: the family's default order
  std::optional<Config> config;  // requires `implementation`
};

// Runs `call` with the first implementation that can serve it; returns its name.
std::string dispatch(const OpFamily& family, CallBase& call, const CallOptions& options);

struct Explanation {
  std::string implementation;
  Resolution resolution;
  std::vector<std::pair<std::string, std::string>> skipped;  // implementation, reason
};
// What dispatch would do, without running anything.
Explanation explain(const OpFamily& family, const CallBase& call, const CallOptions& options);

// Records the BoundArguments of every dispatched call on this thread while alive (nests).
class CallRecorder {
 public:
  CallRecorder();
  ~CallRecorder();
  CallRecorder(const CallRecorder&) = delete;
  CallRecorder& operator=(const CallRecorder&) = delete;
  const std::vector<BoundArguments>& calls() const { return calls_; }

 private:
  friend void record_call(const BoundArguments&);
  CallRecorder* outer_;
  std::vector<BoundArguments> calls_;
};

}  // namespace tokamax
