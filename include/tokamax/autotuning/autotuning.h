// Autotuning results: BenchmarkData (one config's measurement), AutotuningData (every config
// tried for one key, with its measurement or the reason it failed), AutotuningResult (all keys
// of a tuning run, JSON round trip, merge, disk-cache export) and AutotuningScope (applies a
// result to the calls on this thread, RAII, nests, innermost wins).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/core/json.h"
#include "tokamax/core/version.h"
#include "tokamax/op/config.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// Why a key's winner was chosen: the best finalist against the heuristics config, measured
// side by side in interleaved rounds. `ratio` is best / heuristics (ratio of median per-round
// ratios) with its bootstrap interval at `confidence`; `confident` when the interval's upper end
// is below 1 - tie (faster beyond the tie window). A best that is not confidently faster is not
// stored: the heuristics config is (same speed, fewer distinct configs), and `best` names the
// candidate that was set aside. `details`: stages, rounds, discarded segments with their reasons,
// the control's samples, the time spent.
struct TuningEvidence {
  double ratio = 1, lo = 1, hi = 1;
  double confidence = 0.95;
  double tie = 0.01;
  int rounds = 0;  // accepted rounds of the best
  bool confident = false;
  std::string best;  // the best finalist's config (canonical JSON)
  Json details = Json::object();
  Json to_json() const;
  static TuningEvidence from_json(const Json& j);
  std::string summary() const;  // one line, for explain and cache show
  // "1%", or "23% (2 us of a 0.0089 ms call)" where 2 us widened the window.
  std::string tie_window_text() const;
};

struct BenchmarkData {
  double median_ms = 0;
  std::vector<double> samples_ms;
  double iqr_ms = 0;
  double prepare_ms = 0;
  int64_t scratch_bytes = 0;
  bool cold_cache = false;
  // Re-measured with the other finalists in interleaved rounds; when a key has finalists, its
  // winner is chosen among them only (their medians come from the same minutes; the others'
  // first-pass medians do not, and cannot be compared with them fairly).
  bool finalist = false;
  // Interleaved rounds against the heuristics config (the control): per sample, its round and
  // its time over the mean of the two control samples bracketing its segment (NaN, written as
  // null, when the segment was discarded); the median of the accepted ratios with its bootstrap
  // interval; accepted rounds; the successive-halving stage it reached. Empty / 0 in files
  // written before rounds existed.
  std::vector<int> sample_rounds;
  std::vector<double> ratios;
  double ratio = 0, ratio_lo = 0, ratio_hi = 0;
  int rounds = 0;
  int stage = 0;
  // The tuner's decision for its key: the config stored as the winner (see TuningEvidence).
  bool chosen = false;
  std::optional<TuningEvidence> evidence;  // on the chosen entry
  Json to_json() const;
  static BenchmarkData from_json(const Json& j);
};

enum class FailureKind {
  kUnsupported,
  kWrongResult,
  kUnwritten,
  kOutOfBounds,
  kTimeout,
  kException,
  kSkipped
};
std::string_view failure_kind_name(FailureKind k);
FailureKind parse_failure_kind(std::string_view s);

struct Failure {
  FailureKind kind = FailureKind::kException;
  std::string message;
  Json to_json() const;
  static Failure from_json(const Json& j);
};

// config (canonical JSON string) -> measurement or failure.
class AutotuningData {
 public:
  struct Entry {
    Config config;
    std::optional<BenchmarkData> benchmark;
    std::optional<Failure> failure;
  };
  void set(const Config& config, BenchmarkData data);
  void set_failure(const Config& config, Failure failure);
  const std::map<std::string, Entry>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  bool has_success() const;
  // The winner: the entry the tuner chose (`chosen`) when there is one; else among the
  // finalists if any entry is one (else among all successes), the fastest median; within the tie
  // window (tie_window_ms) of it the least scratch memory, then the fastest, then the smallest
  // config string. Error naming every failure when none succeeded.
  const Entry& fastest() const;
  // Whether `e` competes for the win: it succeeded, and it is a finalist or there are none.
  bool competes(const Entry& e) const;
  // The fastest median among the entries that compete (0 when none succeeded): where the tie
  // window starts.
  double best_median_ms() const;
  // Right-hand side wins per config; a right-hand side with a chosen entry (a newer decision)
  // clears the left's.
  AutotuningData operator|(const AutotuningData& other) const;
  // The implementation's heuristics config for this key, when the tuner measured it (for
  // reports such as "winner is 1.3x the heuristics config"). Result files mark its entry with
  // "heuristics": true; the disk cache does not keep it.
  const std::optional<Config>& heuristics() const { return heuristics_; }
  void set_heuristics(const Config& c) { heuristics_ = c; }
  // Keeps successes only (the disk-cache form).
  AutotuningData successes() const;
  // {config_json_string: BenchmarkData | {"failure": {...}}}; from_json decodes each config
  // with impl.config_from_json (which validates it).
  Json to_json() const;
  static AutotuningData from_json(const Json& j, const Implementation& impl);

 private:
  std::map<std::string, Entry> entries_;
  std::optional<Config> heuristics_;
};

// The tie window above the fastest competing median `best_ms`: candidates within it count as
// equally fast, and the one with the least scratch memory wins. max(2 us, 1%): below that,
// differences on a CPU are timer and scheduling noise.
double tie_window_ms(double best_ms);

class AutotuningResult {
 public:
  AutotuningResult() : device_kind_(tokamax::device_kind()), version_(library_version()) {}
  explicit AutotuningResult(std::string device_kind)
      : device_kind_(std::move(device_kind)), version_(library_version()) {}

  const std::string& device_kind() const { return device_kind_; }
  const std::string& tokamax_version() const { return version_; }
  const std::vector<std::pair<BoundArguments, AutotuningData>>& data() const { return data_; }
  // Adds or merges (right wins per config) the entry for bound's (family, implementation, key).
  void add(const BoundArguments& bound, const AutotuningData& data);
  const AutotuningData* find(const BoundArguments& bound) const;

  std::string dumps() const;
  static AutotuningResult loads(std::string_view text,
                                std::string_view source = "autotuning result");
  void dump(const std::string& path) const;  // atomic
  static AutotuningResult load(const std::string& path);
  // Device kinds must match (else InvalidArgument); the right-hand side wins per config.
  AutotuningResult operator|(const AutotuningResult& other) const;
  // Writes successes into `dir`/<device_kind>/<family>_<implementation>.json (disk-cache format),
  // merging with what is there. Default dir: the user cache directory.
  void dump_cache(const std::string& dir = "") const;

 private:
  std::string device_kind_;
  std::string version_;
  std::vector<std::pair<BoundArguments, AutotuningData>> data_;
};

struct ScopeOverlay;
struct ScopeStack;

// Applies a result's winners to the calls on the thread that made it while alive. Innermost
// first; a miss falls through to outer scopes, then the disk cache. Destroying a scope on
// another thread (a Python generator resumed elsewhere exits its `with` there) removes it from
// the stack of the thread that made it, and from nothing else.
class AutotuningScope {
 public:
  explicit AutotuningScope(const AutotuningResult& result);
  ~AutotuningScope();
  AutotuningScope(const AutotuningScope&) = delete;
  AutotuningScope& operator=(const AutotuningScope&) = delete;

 private:
  std::shared_ptr<ScopeStack> stack_;  // the making thread's, kept alive past that thread
  const ScopeOverlay* overlay_ = nullptr;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
