// BenchmarkData, AutotuningData, AutotuningResult and AutotuningScope.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "autotuning/scope_stack.h"
#include "core/json_field.h"
#include "tokamax/autotuning/autotuning.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/core/enum_names.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/log.h"

namespace tokamax {

namespace {
// NaN (a discarded round's ratio; the median ratio of a candidate with no accepted round) as
// JSON null, and back.
Json nullable(double x) { return std::isnan(x) ? Json() : Json(x); }
Json nullable(const std::vector<double>& v) {
  Json a = Json::array();
  for (double x : v) a.push_back(nullable(x));
  return a;
}
double from_nullable(const Json& x, const char* what) {
  if (x.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (x.is_number()) return x.get<double>();
  throw InvalidArgument(std::string(what) + ": expected a number or null, got " +
                        canonical_dump(x).substr(0, 80));
}
std::vector<double> from_nullable_list(const Json& j, const char* what) {
  if (!j.is_array()) throw InvalidArgument(std::string(what) + ": expected a list of numbers");
  std::vector<double> v;
  for (const Json& x : j) v.push_back(from_nullable(x, what));
  return v;
}
double get_nullable(const Json& j, const char* name, const char* what) {
  if (!j.is_object() || !j.contains(name))
    throw InvalidArgument(fmt::format("{}: missing field '{}'", what, name));
  return from_nullable(j.at(name), fmt::format("{} '{}'", what, name).c_str());
}
// A list field of numbers or nulls.
std::vector<double> get_nullable_list(const Json& j, const char* name, const char* what) {
  if (!j.is_object() || !j.contains(name))
    throw InvalidArgument(fmt::format("{}: missing field '{}'", what, name));
  return from_nullable_list(j.at(name), fmt::format("{} '{}'", what, name).c_str());
}
// A [low, high] interval field (either end null when unknown).
std::pair<double, double> get_interval(const Json& j, const char* name, const char* what) {
  const auto v = get_nullable_list(j, name, what);
  if (v.size() != 2) throw InvalidArgument(fmt::format("{}: '{}' must be [low, high]", what, name));
  return {v[0], v[1]};
}
}  // namespace

Json TuningEvidence::to_json() const {
  return {{"ratio", nullable(ratio)},
          {"ci", nullable(std::vector<double>{lo, hi})},
          {"confidence", confidence},
          {"tie", tie},
          {"rounds", rounds},
          {"confident", confident},
          {"best", best},
          {"details", details}};
}

TuningEvidence TuningEvidence::from_json(const Json& j) {
  TuningEvidence e;
  e.ratio = get_nullable(j, "ratio", "TuningEvidence");
  std::tie(e.lo, e.hi) = get_interval(j, "ci", "TuningEvidence");
  e.confidence = json_field<double>(j, "confidence", "TuningEvidence");
  if (j.contains("tie")) e.tie = json_field<double>(j, "tie", "TuningEvidence");
  e.rounds = json_field<int>(j, "rounds", "TuningEvidence");
  e.confident = json_field<bool>(j, "confident", "TuningEvidence");
  if (j.contains("best")) e.best = json_field<std::string>(j, "best", "TuningEvidence");
  if (j.contains("details")) e.details = j.at("details");
  return e;
}

std::string TuningEvidence::summary() const {
  if (details.contains("kept_because") && details["kept_because"].is_string())
    return "the heuristics config, kept unmeasured against the others: " +
           details["kept_because"].get<std::string>();
  if (details.contains("control") && details["control"] == best)
    return fmt::format("the heuristics config was the fastest finalist ({} rounds)", rounds);
  std::string s =
      fmt::format("{:.3f}x the heuristics config [{:.3f}, {:.3f}] ({:.0f}% CI, {} rounds)", ratio,
                  lo, hi, confidence * 100, rounds);
  if (confident) return s + ", confident";
  if (hi < 1 - tie) return s + ", not confident: too few accepted rounds (the budget ran out)";
  return s + ", not faster beyond the " + tie_window_text() + " tie window";
}

std::string TuningEvidence::tie_window_text() const {
  // The window is max(1%, 2 us) of the control's time: printed with what made it wider.
  const double quiet_ms = details.value("control_quiet_ms", 0.0);
  if (quiet_ms > 0 && tie > 0.0101)
    return fmt::format("{:.0f}% (2 us of a {:.4g} ms call)", tie * 100, quiet_ms);
  return fmt::format("{:.0f}%", tie * 100);
}

Json BenchmarkData::to_json() const {
  Json j = {{"median_ms", median_ms},
            {"evaluation_times_ms", samples_ms},
            {"iqr_ms", iqr_ms},
            {"prepare_time_ms", prepare_ms},
            {"scratch_bytes", scratch_bytes},
            {"cold_cache", cold_cache}};
  if (finalist) j["finalist"] = true;  // absent = false (files written before it existed)
  if (!sample_rounds.empty()) {
    j["sample_rounds"] = sample_rounds;
    j["ratios"] = nullable(ratios);
    j["ratio"] = nullable(ratio);
    j["ratio_ci"] = nullable(std::vector<double>{ratio_lo, ratio_hi});
    j["rounds"] = rounds;
    j["stage"] = stage;
  }
  if (chosen) j["chosen"] = true;
  if (evidence) j["evidence"] = evidence->to_json();
  return j;
}

BenchmarkData BenchmarkData::from_json(const Json& j) {
  BenchmarkData b;
  b.median_ms = json_field<double>(j, "median_ms", "BenchmarkData");
  if (!std::isfinite(b.median_ms) || b.median_ms < 0)
    throw InvalidArgument("BenchmarkData: bad median_ms");
  // Checked before the lists are copied out of the document.
  for (const char* list : {"evaluation_times_ms", "sample_rounds", "ratios"}) {
    if (j.is_object() && j.contains(list) && j.at(list).is_array() &&
        static_cast<int64_t>(j.at(list).size()) > kMaxSamplesPerConfig) {
      throw InvalidArgument(fmt::format("BenchmarkData: '{}' has {} entries; at most {}", list,
                                        j.at(list).size(), kMaxSamplesPerConfig));
    }
  }
  if (j.contains("evaluation_times_ms"))
    b.samples_ms = json_field<std::vector<double>>(j, "evaluation_times_ms", "BenchmarkData");
  if (j.contains("iqr_ms")) b.iqr_ms = json_field<double>(j, "iqr_ms", "BenchmarkData");
  if (j.contains("prepare_time_ms"))
    b.prepare_ms = json_field<double>(j, "prepare_time_ms", "BenchmarkData");
  if (j.contains("scratch_bytes"))
    b.scratch_bytes = json_field<int64_t>(j, "scratch_bytes", "BenchmarkData");
  if (j.contains("cold_cache")) b.cold_cache = json_field<bool>(j, "cold_cache", "BenchmarkData");
  if (j.contains("finalist")) b.finalist = json_field<bool>(j, "finalist", "BenchmarkData");
  if (j.contains("sample_rounds")) {
    b.sample_rounds = json_field<std::vector<int>>(j, "sample_rounds", "BenchmarkData");
    b.ratios = get_nullable_list(j, "ratios", "BenchmarkData");
    if (b.ratios.size() != b.sample_rounds.size() || b.ratios.size() != b.samples_ms.size()) {
      throw InvalidArgument(
          "BenchmarkData: 'ratios', 'sample_rounds' and 'evaluation_times_ms' differ in length");
    }
    b.ratio = get_nullable(j, "ratio", "BenchmarkData");
    std::tie(b.ratio_lo, b.ratio_hi) = get_interval(j, "ratio_ci", "BenchmarkData");
    b.rounds = json_field<int>(j, "rounds", "BenchmarkData");
    b.stage = json_field<int>(j, "stage", "BenchmarkData");
  }
  if (j.contains("chosen")) b.chosen = json_field<bool>(j, "chosen", "BenchmarkData");
  if (j.contains("evidence")) b.evidence = TuningEvidence::from_json(j.at("evidence"));
  return b;
}

namespace {
constexpr EnumNames<FailureKind, 7> kFailureKinds{"failure kind",
                                                  {{{FailureKind::kUnsupported, "unsupported"},
                                                    {FailureKind::kWrongResult, "wrong_result"},
                                                    {FailureKind::kUnwritten, "unwritten"},
                                                    {FailureKind::kOutOfBounds, "out_of_bounds"},
                                                    {FailureKind::kTimeout, "timeout"},
                                                    {FailureKind::kException, "exception"},
                                                    {FailureKind::kSkipped, "skipped"}}}};
}  // namespace

std::string_view failure_kind_name(FailureKind k) { return kFailureKinds.name(k); }
FailureKind parse_failure_kind(std::string_view s) { return kFailureKinds.parse(s); }

Json Failure::to_json() const { return {{"kind", failure_kind_name(kind)}, {"message", message}}; }
Failure Failure::from_json(const Json& j) {
  return {parse_failure_kind(json_field<std::string>(j, "kind", "Failure")),
          json_field<std::string>(j, "message", "Failure")};
}

void AutotuningData::set(const Config& config, BenchmarkData data) {
  entries_[config.str()] = Entry{config, std::move(data), std::nullopt};
}
void AutotuningData::set_failure(const Config& config, Failure failure) {
  entries_[config.str()] = Entry{config, std::nullopt, std::move(failure)};
}

bool AutotuningData::has_success() const {
  for (const auto& [k, e] : entries_) {
    if (e.benchmark) return true;
  }
  return false;
}

double tie_window_ms(double best_ms) { return std::max(2e-3, 0.01 * best_ms); }

namespace {
// Only finalists compete when there are any: their medians were measured side by side.
bool any_finalist(const std::map<std::string, AutotuningData::Entry>& entries) {
  for (const auto& [k, e] : entries) {
    if (e.benchmark && e.benchmark->finalist) return true;
  }
  return false;
}
bool competes_given(const AutotuningData::Entry& e, bool finalists_only) {
  return e.benchmark && (!finalists_only || e.benchmark->finalist);
}
}  // namespace

bool AutotuningData::competes(const Entry& e) const {
  return competes_given(e, any_finalist(entries_));
}

double AutotuningData::best_median_ms() const {
  const bool finalists_only = any_finalist(entries_);
  const Entry* best = nullptr;
  for (const auto& [k, e] : entries_) {
    if (competes_given(e, finalists_only) &&
        (!best || e.benchmark->median_ms < best->benchmark->median_ms))
      best = &e;
  }
  return best ? best->benchmark->median_ms : 0;
}

const AutotuningData::Entry& AutotuningData::fastest() const {
  if (!has_success()) {
    std::string why = entries_.empty() ? "autotuning data is empty" : "all configs failed:";
    for (const auto& [k, e] : entries_)
      why += "\n  " + k + ": " + std::string(failure_kind_name(e.failure->kind)) + ": " +
             e.failure->message;
    throw Error(why);
  }
  // The tuner's decision when it made one (several, from files merged by hand: the fastest of
  // them).
  const Entry* chosen = nullptr;
  for (const auto& [k, e] : entries_) {
    if (!e.benchmark || !e.benchmark->chosen) continue;
    if (!chosen || e.benchmark->median_ms < chosen->benchmark->median_ms) chosen = &e;
  }
  if (chosen) return *chosen;
  // Within the tie window of the fastest, prefer less scratch memory, then speed, then the
  // config string (std::map order) so the choice is a pure function of the data.
  const double best = best_median_ms();
  const double window = tie_window_ms(best);
  const bool finalists_only = any_finalist(entries_);
  const Entry* pick = nullptr;
  for (const auto& [k, e] : entries_) {
    if (!competes_given(e, finalists_only) || e.benchmark->median_ms > best + window) continue;
    if (!pick || e.benchmark->scratch_bytes < pick->benchmark->scratch_bytes ||
        (e.benchmark->scratch_bytes == pick->benchmark->scratch_bytes &&
         e.benchmark->median_ms < pick->benchmark->median_ms)) {
      pick = &e;
    }
  }
  return *pick;
}

AutotuningData AutotuningData::operator|(const AutotuningData& other) const {
  AutotuningData out = *this;
  // A decision on the right-hand side (a newer tuning run) replaces the left's.
  bool decides = false;
  for (const auto& [k, e] : other.entries_) decides |= e.benchmark && e.benchmark->chosen;
  if (decides) {
    for (auto& [k, e] : out.entries_) {
      if (e.benchmark) {
        e.benchmark->chosen = false;
        e.benchmark->evidence.reset();
      }
    }
  }
  for (const auto& [k, e] : other.entries_) out.entries_[k] = e;
  if (other.heuristics_) out.heuristics_ = other.heuristics_;
  return out;
}

AutotuningData AutotuningData::successes() const {
  AutotuningData out;
  for (const auto& [k, e] : entries_) {
    if (e.benchmark) out.entries_[k] = e;
  }
  return out;
}

Json AutotuningData::to_json() const {
  Json j = Json::object();
  for (const auto& [k, e] : entries_) {
    j[k] = e.benchmark ? e.benchmark->to_json() : Json{{"failure", e.failure->to_json()}};
    if (heuristics_ && heuristics_->str() == k) j[k]["heuristics"] = true;
  }
  return j;
}

AutotuningData AutotuningData::from_json(const Json& j, const Implementation& impl) {
  if (!j.is_object())
    throw InvalidArgument("autotuning data must be a JSON object of config -> result");
  AutotuningData d;
  for (const auto& [k, v] : j.items()) {
    const Config c = impl.config_from_json(parse_json(k, "config key"));
    if (v.is_object() && v.contains("failure")) {
      d.set_failure(c, Failure::from_json(v["failure"]));
    } else {
      d.set(c, BenchmarkData::from_json(v));
    }
    if (v.is_object() && v.contains("heuristics")) {
      if (!v["heuristics"].is_boolean())
        throw InvalidArgument("autotuning data: 'heuristics' of config " + k + " must be a bool");
      if (v["heuristics"].get<bool>()) d.set_heuristics(c);
    }
  }
  return d;
}

namespace {
bool same_entry(const BoundArguments& a, const BoundArguments& b) {
  return a.family() == b.family() && a.implementation() == b.implementation() && a.key() == b.key();
}
}  // namespace

void AutotuningResult::add(const BoundArguments& bound, const AutotuningData& data) {
  for (auto& [b, d] : data_) {
    if (same_entry(b, bound)) {
      d = d | data;
      return;
    }
  }
  data_.emplace_back(bound, data);
}

const AutotuningData* AutotuningResult::find(const BoundArguments& bound) const {
  for (const auto& [b, d] : data_) {
    if (same_entry(b, bound)) return &d;
  }
  return nullptr;
}

std::string AutotuningResult::dumps() const {
  Json arr = Json::array();
  for (const auto& [b, d] : data_) arr.push_back(Json::array({b.to_json(), d.to_json()}));
  return Json{{"device_kind", device_kind_}, {"tokamax_version", version_}, {"data", arr}}.dump(1);
}

AutotuningResult AutotuningResult::loads(std::string_view text, std::string_view source) {
  const Json j = parse_json(text, source);
  const std::string src(source);
  AutotuningResult r(json_field<std::string>(j, "device_kind", src.c_str()));
  if (j.contains("tokamax_version"))
    r.version_ = json_field<std::string>(j, "tokamax_version", src.c_str());
  const Json& data = j.contains("data") ? j["data"] : Json();
  if (!data.is_array())
    throw InvalidArgument(src + ": 'data' must be a list of [bound_arguments, data] pairs");
  for (const Json& e : data) {
    if (!e.is_array() || e.size() != 2)
      throw InvalidArgument(src + ": each data item must be [bound_arguments, data]");
    const BoundArguments b = BoundArguments::from_json(e[0]);
    if (b.implementation().empty())
      throw InvalidArgument(src + ": bound arguments must name the implementation");
    const auto impl = find_family(b.family()).implementation(b.implementation());
    r.add(b, AutotuningData::from_json(e[1], *impl));
  }
  return r;
}

void AutotuningResult::dump(const std::string& path) const { write_file_atomic(path, dumps()); }

AutotuningResult AutotuningResult::load(const std::string& path) {
  return loads(read_file(path), "'" + path + "'");
}

AutotuningResult AutotuningResult::operator|(const AutotuningResult& other) const {
  if (device_kind_ != other.device_kind_) {
    throw InvalidArgument("cannot merge autotuning results of different device kinds: '" +
                          device_kind_ + "' and '" + other.device_kind_ + "'");
  }
  AutotuningResult out = *this;
  for (const auto& [b, d] : other.data_) out.add(b, d);
  return out;
}

void AutotuningResult::dump_cache(const std::string& dir) const {
  const std::string root = dir.empty() ? user_cache_dir() : dir;
  // Group by file.
  std::map<std::pair<std::string, std::string>, std::map<std::string, AutotuningData>> files;
  for (const auto& [b, d] : data_) {
    AutotuningData s = d.successes();
    if (s.empty()) continue;
    auto& m = files[{b.family(), b.implementation()}][b.key()];
    m = m | s;
  }
  for (const auto& [fi, entries] : files) {
    const auto impl = find_family(fi.first).implementation(fi.second);
    merge_into_cache_file(cache_file_path(root, device_kind_, fi.first, fi.second), fi.first, *impl,
                          device_kind_, entries);
  }
  DiskCache::global().clear();
}

// --- scopes ---

namespace {
// Shared with the scopes made on the thread, which may outlive it.
const std::shared_ptr<ScopeStack>& this_thread_stack() {
  thread_local const std::shared_ptr<ScopeStack> stack = std::make_shared<ScopeStack>();
  return stack;
}
}  // namespace

std::vector<std::shared_ptr<const ScopeOverlay>> active_scopes() {
  ScopeStack& st = *this_thread_stack();
  if (st.size.load(std::memory_order_acquire) == 0) return {};
  std::lock_guard<std::mutex> lock(st.mu);
  return st.scopes;
}

AutotuningScope::AutotuningScope(const AutotuningResult& result) : stack_(this_thread_stack()) {
  const size_t depth = stack_->size.load(std::memory_order_relaxed);
  auto overlay = std::make_shared<ScopeOverlay>();
  overlay->device_kind = result.device_kind();
  overlay->name = "AutotuningScope#" + std::to_string(depth + 1);
  if (result.device_kind() != device_kind()) {
    TOKAMAX_LOG("autotune", kWarning,
                "AutotuningScope: result is for device kind '" + result.device_kind() +
                    "', this is '" + device_kind() + "'; its entries will not be used");
  }
  for (const auto& [b, d] : result.data()) {
    if (!d.has_success()) continue;  // all failed: a miss, as in the disk cache
    const auto& best = d.fastest();
    overlay->winners[b.family() + "/" + b.implementation()][b.key()] = {
        best.config, best.benchmark->evidence ? best.benchmark->evidence->summary() : ""};
  }
  overlay_ = overlay.get();
  std::lock_guard<std::mutex> lock(stack_->mu);
  stack_->scopes.push_back(std::move(overlay));
  stack_->size.store(stack_->scopes.size(), std::memory_order_release);
}

AutotuningScope::~AutotuningScope() {
  std::lock_guard<std::mutex> lock(stack_->mu);
  auto& v = stack_->scopes;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& o) { return o.get() == overlay_; }),
          v.end());
  stack_->size.store(v.size(), std::memory_order_release);
}

}  // namespace tokamax
