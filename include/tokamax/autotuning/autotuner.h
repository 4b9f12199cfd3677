// The autotuner, with XLA's discipline: candidates (heuristics config + search space,
// deduplicated, deterministic order) are prepared in parallel, then measured one at a time with
// nothing else running; every candidate's output is checked against the reference
// implementation (outputs poisoned with NaN and surrounded by guard zones); failures are
// recorded per config with their reason; the winner is the fastest median, the least scratch
// memory within a tie window among the finalists (the fastest few of a first pass, and the
// heuristics config always), re-measured side by side in interleaved rounds.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/autotuning/measurement.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct AutotuneProgress {
  int done = 0, total = 0;
  double elapsed_s = 0, eta_s = 0;
  std::string key;     // family/implementation being tuned
  std::string config;  // the candidate just finished
};

struct AutotuneOptions {
  TimingOptions timing{
      .warmup = 2, .min_samples = 10, .min_time_s = 0.05, .max_samples = 200, .max_time_s = 2.0};
  std::optional<bool> cold_cache;   // default: the family's memory_bound(call)
  double candidate_timeout_s = 10;  // the checked run of a candidate; slower -> timeout
  double budget_s = 1e30;           // whole run, seconds; must be > 0
  int max_candidates = 1 << 30;     // per key; must be > 0 (the heuristics config is always kept)
  int finalists = 3;                // re-measured interleaved, plus the heuristics config
  int remeasure_rounds = 5;
  int prepare_threads = 0;      // 0 = num_threads() (the pool's size caps it)
  uint64_t seed = 0;            // inputs, shared by all candidates
  std::vector<Config> configs;  // explicit candidates (empty = heuristics + search space)
  // autotune(fn): also tune keys an AutotuningScope or the disk cache already answers.
  bool ignore_cache = false;
  // tune_all / autotune(fn): tune every implementation of the family supported here, not only
  // the one each call used (tokamax's all_implementations).
  bool all_implementations = false;
  // autotune(fn): capture the op calls of every thread while fn runs (fn runs ops on threads it
  // starts), not only those of the calling thread. Calls other threads of the process make in
  // that time are captured too.
  bool capture_all_threads = false;
  std::function<void(const AutotuneProgress&)> progress;
  void validate() const;  // InvalidArgument on a zero or negative budget etc.
};

class Autotuner {
 public:
  explicit Autotuner(AutotuneOptions options = {});
  // Tunes one key; `bound` must name its implementation. Identical keys asked for by several
  // threads at once are tuned once. Throws Unsupported if the implementation cannot serve it.
  AutotuningData tune(const BoundArguments& bound) const;
  // Tunes every distinct (family, implementation, key) once; an unsupported key is logged and
  // left out. Bound arguments without an implementation are tuned for every implementation of
  // their family that is supported here.
  AutotuningResult tune_all(const std::vector<BoundArguments>& list) const;
  // The candidate list tune() would measure, in order.
  std::vector<Config> candidates(const BoundArguments& bound) const;

 private:
  AutotuningData tune_uncoordinated(const BoundArguments& bound) const;
  std::vector<Config> candidates_for(const Implementation& impl, const CallBase& call) const;
  AutotuneOptions options_;
};

// Runs `fn` once, capturing the bound arguments of every op call it makes on this thread
// (every thread with options.capture_all_threads; nested calls included), dedupes them, drops the
// keys an active AutotuningScope or the disk cache already answers for this device kind (unless
// options.ignore_cache), and tunes the rest.
AutotuningResult autotune(const std::function<void()>& fn, AutotuneOptions options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
