// The autotuner, with XLA's discipline: candidates (heuristics config + search space,
// deduplicated, ranked by the implementation's cost model where it has one) are prepared in
// parallel, then run one at a time with nothing else running; every candidate's output is
// checked against the reference implementation (outputs poisoned with NaN and surrounded by
// guard zones); failures are recorded per config with their reason. The candidates that pass are
// measured in interleaved rounds against the heuristics config as the control, with successive
// halving and a bootstrap confidence (src/autotuning/rounds.h): the stored winner is the best
// finalist when it is confidently faster than the heuristics config beyond the tie window, else
// the heuristics config itself; its entry carries the evidence (TuningEvidence).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// tune_all's progress, before each key and once after the last.
struct AutotuneProgress {
  int done = 0, total = 0;  // keys finished, keys in the run
  double elapsed_s = 0;
  double eta_s = -1;  // from the pace of the keys done so far; -1 before the first is done
  std::string key;    // family/implementation of the key starting (empty after the last)
};

// How the candidates of one key are measured and decided (src/autotuning/rounds.h): every
// candidate gets `first_rounds` accepted rounds against the control (the heuristics config),
// the better half goes on to twice as many, and so on down to `finalists` (plus the control),
// who are measured until decided at `confidence` or `max_rounds`.
struct RoundOptions {
  int first_rounds = 2;
  int finalists = 3;
  int max_rounds = 48;
  double confidence = 0.95;  // two-sided bootstrap interval
  int bootstrap = 400;       // resamples
  // Relative tie window: a winner must be faster than the control by more than this (and by
  // more than 2 us) to be stored instead of it.
  double tie = 0.01;
  // A best is confident only over at least this many accepted rounds: with n paired rounds all
  // favouring it, a sign test bounds the chance of that under no difference by 2^-n, and 95%
  // (two-sided) needs n >= 6. Fewer (a budget cut on a slow key) keeps the heuristics config.
  int min_confident_rounds = 6;
  // Control checks: a segment is discarded when one of its control samples strays more than
  // `stray` above the control's quiet level, or its two control samples differ by more than
  // `bracket`.
  double stray = 0.12;
  double bracket = 0.08;
  // Segments between control samples last about this long.
  double segment_s = 0.6;
  // A candidate whose segments were discarded this many times in one stage goes on with the
  // rounds it has (the budget bounds the rest).
  int max_repeats = 6;
};

struct AutotuneOptions {
  RoundOptions rounds;
  // Seconds of interleaved rounds per key: measure_budget_s, or for a key whose rounds are slow
  // (calls of a second or more, many candidates) what `budget_rounds` rounds of all its
  // candidates take by their checked runs' times, up to measure_budget_max_s. A fixed 20 s gave
  // calls of 0.25-2 s one or two accepted rounds, never enough to store anything but the
  // heuristics config.
  double measure_budget_s = 20;
  double measure_budget_max_s = 120;
  int budget_rounds = 4;
  // A budget the caller names is the budget: not raised for slow keys.
  void fix_measure_budget(double s) { measure_budget_s = measure_budget_max_s = s; }
  // A sample times back-to-back calls (warm) or repeated flush-and-call (cold) lasting at least
  // this long, so that short calls are not timer noise.
  double sample_min_ms = 1;
  // Cost-model pruning: when the implementation has a model, only this best-ranked fraction of
  // the search space (and the heuristics config) is measured, and candidates are checked in the
  // model's order so that a budget cut drops the worst-ranked.
  double model_fraction = 1.0;
  std::optional<bool> cold_cache;   // default: the family's memory_bound(call)
  double candidate_timeout_s = 10;  // the checked run of a candidate; slower -> timeout
  double budget_s = 1e30;           // whole run, seconds; must be > 0
  int max_candidates = 1 << 30;     // per key; must be > 0 (the heuristics config is always kept)
  int prepare_threads = 0;          // 0 = num_threads() (the pool's size caps it)
  uint64_t seed = 0;                // inputs (shared by all candidates), round order, bootstrap
  std::vector<Config> configs;      // explicit candidates (empty = heuristics + search space)
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
  // Held while a key's candidates are run and measured (after its preparation): sharded tuning's
  // host-wide lock, so that processes on one machine never measure at the same moment.
  std::function<std::shared_ptr<void>()> exclusive;
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
  // The distinct (family, implementation, key) tune_all tunes for `list`, in list order.
  std::vector<BoundArguments> work_list(const std::vector<BoundArguments>& list) const;
  // The candidate list tune() would check, in order (before the cost model's cut).
  std::vector<Config> candidates(const BoundArguments& bound) const;

 private:
  AutotuningData tune_uncoordinated(const BoundArguments& bound) const;
  // *model_cut (when given): how many of the list the cost model keeps (SIZE_MAX: no model).
  std::vector<Config> candidates_for(const Implementation& impl, const CallBase& call,
                                     size_t* model_cut = nullptr) const;
  AutotuneOptions options_;
};

// Runs `fn` once, capturing the bound arguments of every op call it makes on this thread
// (every thread with options.capture_all_threads; nested calls included), dedupes them, drops the
// keys an active AutotuningScope or the disk cache already answers for this device kind (unless
// options.ignore_cache), and tunes the rest.
AutotuningResult autotune(const std::function<void()>& fn, AutotuneOptions options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
