// Sharded tuning through a shared store: the claim protocol, the runner, the host-wide
// measurement lock and launcher ranks (see tokamax/fleet/sharded.h). The protocol's simulation
// is in simulation.cc.
#include "tokamax/fleet/sharded.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "tokamax/core/device.h"
#include "tokamax/core/json.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"
#include "tokamax/op/op.h"

namespace tokamax {

namespace {

constexpr int kPlanFormat = 1;
constexpr int kSweepSample = 4;  // in-flight keys a sweep looks at
constexpr int kScanTries = 16;   // unlisted keys a scan tries to claim

std::mt19937_64& rng() {
  thread_local std::mt19937_64 r(std::random_device{}());
  return r;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

// The digest of a run's work: its ids, sorted (the order is each process's cost estimate and
// may differ; the set may not).
std::string digest_of(std::vector<std::string> ids) {
  std::sort(ids.begin(), ids.end());
  std::string all;
  for (const auto& id : ids) {
    all += id;
    all += '\n';
  }
  return hex64(hash64(all)) + "-" + std::to_string(ids.size());
}

}  // namespace

// ---- ClaimProtocol -----------------------------------------------------------------------------

ClaimProtocol::ClaimProtocol(Store& store, std::string run_id, std::string scope,
                             std::string worker, int64_t lease_ms)
    : store_(store),
      run_(std::move(run_id)),
      scope_(std::move(scope)),
      worker_(std::move(worker)),
      lease_ms_(lease_ms) {
  if (run_.empty() || run_.find_first_of("{}") != std::string::npos) {
    throw InvalidArgument("run id '" + run_ + "': expected a non-empty name without { or }");
  }
  // Lease tokens are unique to this object: two runs in one process, or two processes that
  // share a host name and pid (containers), never act on each other's leases.
  nonce_ = hex64(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                 reinterpret_cast<uintptr_t>(this));
}

std::string ClaimProtocol::key(const std::string& suffix) const {
  return store_.prefix() + "{" + run_ + "}:" + scope_ + ":" + suffix;
}

namespace {

struct Plan {
  std::string digest, by;
  std::vector<std::string> order;
};

Plan read_plan(const std::string& text, const std::string& run, const std::string& where) {
  Plan p;
  try {
    const Json j = parse_json(text, "the plan of run " + run);
    if (!json_integer_in(j.at("format"), kPlanFormat, kPlanFormat))
      throw std::runtime_error("unknown format");
    p.digest = j.at("digest").get<std::string>();
    p.by = j.value("by", "?");
    p.order = j.at("order").get<std::vector<std::string>>();
  } catch (const std::exception& e) {
    throw InvalidArgument("run " + run + " on " + where +
                          ": its plan is not one this library wrote (" + e.what() +
                          "); use another run id");
  }
  return p;
}

}  // namespace

std::optional<std::vector<std::string>> ClaimProtocol::existing_order() {
  const auto plan = store_.get(key("plan"));
  if (!plan) return std::nullopt;
  return read_plan(*plan, run_, store_.describe()).order;
}

void ClaimProtocol::join(const std::vector<std::string>& ids,
                         const std::vector<std::string>& fields) {
  if (ids.size() != fields.size()) throw Error("ClaimProtocol::join: one field per id");
  const std::string digest = digest_of(fields);
  const Json plan = {{"format", kPlanFormat}, {"digest", digest}, {"order", ids}, {"by", worker_}};
  Plan theirs;
  if (store_.set_if_absent(key("plan"), plan.dump())) {
    theirs.order = ids;
  } else {
    theirs = read_plan(store_.get(key("plan")).value_or(""), run_, store_.describe());
    if (theirs.digest != digest) {
      throw InvalidArgument(fmt::format(
          "run {} on {} was started by {} with other bound arguments ({} keys, digest {}); this "
          "process has {} keys (digest {}). Every process of a run must tune the same "
          "bound-args file with the same library build; entries without num_threads take each "
          "machine's thread count, and entries without an implementation expand to those its "
          "CPU supports, so give both in the file. Check the file, or use a new --run-id",
          run_, store_.describe(), theirs.by, theirs.order.size(), theirs.digest, ids.size(),
          digest));
    }
  }
  std::map<std::string, std::string> field_of;
  for (size_t i = 0; i < ids.size(); ++i) field_of[ids[i]] = fields[i];
  order_.clear();
  fields_.clear();
  for (const auto& id : theirs.order) {
    auto it = field_of.find(id);
    if (it == field_of.end())
      throw InvalidArgument("run " + run_ + ": its plan names a key this process does not have");
    order_.push_back(id);
    fields_.push_back(it->second);
  }
}

bool ClaimProtocol::try_claim(size_t i) {
  const std::string token = worker_ + "#" + nonce_ + "." + std::to_string(++claims_);
  // The lease and its listing in flight are set together: a claimed key is always listed, so a
  // sweep finds every dead process's key.
  if (!store_.claim(key("claim:" + std::to_string(i)), token, lease_ms_, key("inflight"),
                    std::to_string(i))) {
    return false;
  }
  tokens_[i] = token;
  return true;
}

bool ClaimProtocol::claim_published(size_t i) {
  if (!store_.hash_exists(key("results"), fields_[i])) return false;
  // Published between our look and the claim (its lease released): not ours to redo.
  release(i);
  return true;
}

void ClaimProtocol::release(size_t i) {
  auto it = tokens_.find(i);
  if (it == tokens_.end()) return;
  store_.hash_delete_if_equal(key("inflight"), std::to_string(i), it->second);
  store_.delete_if_equal(key("claim:" + std::to_string(i)), it->second);
  tokens_.erase(it);
}

std::optional<size_t> ClaimProtocol::claim_next(bool scan_all) {
  const size_t n = order_.size();
  // First pass: positions handed out by the shared cursor, one process each.
  while (!cursor_done_) {
    const int64_t c = store_.increment(key("cursor")) - 1;
    if (c < 0 || static_cast<size_t>(c) >= n) {
      cursor_done_ = true;
      break;
    }
    const size_t i = static_cast<size_t>(c);
    if (store_.hash_exists(key("results"), fields_[i])) continue;  // a resumed run
    if (try_claim(i)) return i;
  }
  const int64_t left = remaining();
  if (left == 0 && !scan_all) return std::nullopt;
  // The sweep: keys in flight whose lease has expired (their process died). A random sample
  // per look, so that many idle processes cost the store a few commands each, not one per key
  // in flight; a dead process's key is found within a few looks of its lease's expiry.
  for (const auto& f : store_.hash_random_fields(key("inflight"), kSweepSample)) {
    size_t i = 0;
    try {
      i = std::stoul(f);
    } catch (const std::exception&) {
      continue;
    }
    if (i >= n || store_.exists(key("claim:" + f))) continue;
    if (try_claim(i) && !claim_published(i)) return i;
  }
  // More keys missing than listed in flight: some were handed out by the cursor and never
  // claimed (a process died, or the store failed, right after the cursor), or a store restarted
  // without its snapshot. Rare; only then both lists are read, and a bounded number of the
  // unlisted keys tried, from a random start (so that idle processes spread out).
  if (scan_all || left > store_.hash_len(key("inflight"))) {
    const auto listed = store_.hash_fields(key("inflight"));
    const std::set<std::string> in_flight(listed.begin(), listed.end());
    std::vector<size_t> unlisted;
    for (size_t i : missing()) {
      if (!in_flight.count(std::to_string(i))) unlisted.push_back(i);
    }
    const size_t m = unlisted.size();
    const size_t start = m ? std::uniform_int_distribution<size_t>(0, m - 1)(rng()) : 0;
    for (size_t k = 0; k < std::min<size_t>(m, kScanTries); ++k) {
      const size_t i = unlisted[(start + k) % m];
      if (try_claim(i) && !claim_published(i)) return i;
    }
  }
  return std::nullopt;
}

int64_t ClaimProtocol::remaining() {
  return std::max<int64_t>(0,
                           static_cast<int64_t>(order_.size()) - store_.hash_len(key("results")));
}

bool ClaimProtocol::renew(size_t i) {
  auto it = tokens_.find(i);
  if (it == tokens_.end()) return false;
  return store_.renew_if_equal(key("claim:" + std::to_string(i)), it->second, lease_ms_);
}

void ClaimProtocol::publish(size_t i, const std::string& value) {
  store_.hash_set(key("results"), fields_[i], value);
  release(i);
}

std::vector<size_t> ClaimProtocol::missing() {
  const auto published = store_.hash_fields(key("results"));
  const std::set<std::string> have(published.begin(), published.end());
  std::vector<size_t> out;
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (!have.count(fields_[i])) out.push_back(i);
  }
  return out;
}

Store::HashContents ClaimProtocol::results() { return store_.hash_get_all(key("results")); }

void ClaimProtocol::discard(const std::string& field, const std::string& value) {
  store_.hash_delete_if_equal(key("results"), field, value);
}

void ClaimProtocol::discard_unread(const std::string& field) {
  store_.hash_del(key("results"), field);
}

std::string ClaimProtocol::claimant(size_t i) {
  auto who = [](const std::string& token) { return token.substr(0, token.rfind('#')); };
  try {
    if (const auto holder = store_.get(key("claim:" + std::to_string(i)))) {
      return who(*holder) + " (lease live)";
    }
    if (const auto last = store_.hash_get(key("inflight"), std::to_string(i))) {
      return who(*last) + " (lease expired)";
    }
  } catch (const StoreKeyError& e) {
    return "unknown: " + e.message();
  }
  return "nobody";
}

// ---- Options, launcher ranks, host lock --------------------------------------------------------

void FleetOptions::validate() const {
  auto positive = [](const char* what, double v) {
    if (!(v > 0) || !std::isfinite(v))
      throw InvalidArgument(
          fmt::format("fleet option {} = {}: expected a positive number", what, v));
  };
  positive("lease_s", lease_s);
  positive("deadline_s", deadline_s);
  positive("poll_s", poll_s);
  if (lease_s < 0.3)
    throw InvalidArgument(fmt::format("fleet option lease_s = {}: at least 0.3 s", lease_s));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InvalidArgument(
        fmt::format("rank {} of world size {}: expected 0 <= rank < world size", rank, world_size));
  }
}

std::optional<LauncherRank> launcher_rank() {
  const std::pair<const char*, const char*> vars[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
      {"SLURM_PROCID", "SLURM_NTASKS"},
      {"RANK", "WORLD_SIZE"}};
  for (const auto& [r, w] : vars) {
    const char* rv = std::getenv(r);
    const char* wv = std::getenv(w);
    if (!rv || !wv || !*rv || !*wv) continue;
    LauncherRank out;
    try {
      size_t a = 0, b = 0;
      out.rank = std::stoi(rv, &a);
      out.world_size = std::stoi(wv, &b);
      if (a != std::strlen(rv) || b != std::strlen(wv)) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw InvalidArgument(
          fmt::format("launcher variables {}='{}' {}='{}': expected integers", r, rv, w, wv));
    }
    out.source = std::string(r) + "/" + w;
    if (out.world_size < 1 || out.rank < 0 || out.rank >= out.world_size) {
      throw InvalidArgument(fmt::format("launcher variables {}={} {}={}: expected 0 <= rank < size",
                                        r, out.rank, w, out.world_size));
    }
    return out;
  }
  return std::nullopt;
}

std::shared_ptr<void> lock_host_measurement(const std::string& path, double timeout_s) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) {
    throw Error("cannot open the host measurement lock " + path + ": " + std::strerror(errno));
  }
  fchmod(fd, 0666);  // every user's tuning shares it (best effort: fails on another's file)
  const double give_up = now_s() + timeout_s;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int err = errno;
      ::close(fd);
      throw Error("cannot lock " + path + ": " + std::strerror(err));
    }
    if (now_s() > give_up) {
      ::close(fd);
      throw Error(
          fmt::format("waited {:.0f} s for the host measurement lock {} (another process "
                      "on this machine is measuring)",
                      timeout_s, path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::shared_ptr<void>(nullptr, [fd](void*) {
    flock(fd, LOCK_UN);
    ::close(fd);
  });
}

// ---- The runner --------------------------------------------------------------------------------

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "host";
  return buf;
}

std::string default_lock_path() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/tokamax-measure.lock";
}

std::string id_of(const BoundArguments& b) {
  return b.family() + "/" + b.implementation() + "/" + b.key();
}

// The full key a result is published under: nothing another device kind, library version,
// implementation version or thread count could share.
std::string full_key(const BoundArguments& b) {
  const auto impl = find_family(b.family()).implementation(b.implementation());
  return fmt::format("{}/{}@v{}/{}/{}/threads={}/{}", b.family(), b.implementation(),
                     impl->version(), device_kind(), library_version(), b.num_threads(), b.key());
}

// Candidates x the roofline estimate of one run: the implementation's cost model where it has
// one, else the family's arithmetic and bytes against nominal ceilings (only the order of keys
// matters, so absolute rates cancel; measuring the machine's roofline would cost seconds before
// any work starts). The rates are the ones ragged_dot's model uses: one core with two FMA
// ports at 3 GHz (twice that for bf16 dot products) and 12 GB/s from DRAM.
double estimate_cost_ms(const Autotuner& tuner, const BoundArguments& b) {
  try {
    const OpFamily& fam = find_family(b.family());
    const auto impl = fam.implementation(b.implementation());
    auto call = fam.make_call(b, 0);
    double one = impl->has_config() ? impl->estimate_ms(*call, impl->heuristics_config(*call))
                                    : std::nan("");
    if (!std::isfinite(one)) {
      const CallCost c = fam.cost(*call);
      const double flops_per_s = c.bf16_dot ? 192e9 : 96e9, bytes_per_s = 12e9;
      one = 1e3 * std::max(c.flops / flops_per_s, c.bytes / bytes_per_s);
    }
    const double n = impl->has_config() ? static_cast<double>(tuner.candidates(b).size()) : 1;
    return n * std::max(one, 1e-3);
  } catch (const std::exception& e) {
    TOKAMAX_LOG("fleet", kWarning, "no cost estimate for " + id_of(b) + ": " + e.what());
    return 0;
  }
}

// Renews a lease every third of its length while alive.
class Renewer {
 public:
  Renewer(ClaimProtocol& p, std::mutex& mu, size_t i, double lease_s)
      : thread_([this, &p, &mu, i, lease_s] {
          std::unique_lock<std::mutex> lock(m_);
          while (!cv_.wait_for(lock, std::chrono::duration<double>(lease_s / 3),
                               [this] { return stop_; })) {
            try {
              std::lock_guard<std::mutex> store_lock(mu);
              if (!p.renew(i)) {
                TOKAMAX_LOG("fleet", kWarning,
                            "lost the lease on " + p.order()[i] +
                                " (it expired; another process may tune it too)");
                return;  // nothing left to renew
              }
            } catch (const std::exception& e) {
              // Any error: one escaping this thread would end the process.
              TOKAMAX_LOG("fleet", kWarning, std::string("lease renewal failed: ") + e.what());
            }
          }
        }) {}
  ~Renewer() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The lock file must be usable before any work: a key whose measurement cannot take it would
// fail for every process of this machine.
void check_host_lock(const std::string& lock_path) {
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) {
    throw InvalidArgument("the host measurement lock " + lock_path + " cannot be opened (" +
                          std::strerror(errno) + "); give another path (--host-lock)");
  }
  ::close(fd);
}

// The ids of `work`, most expensive first by estimate_cost_ms: the plan's order, so that the
// longest keys start first and the run does not end waiting for one started last.
std::vector<std::string> ids_by_cost(const Autotuner& tuner,
                                     const std::vector<BoundArguments>& work) {
  const double t0 = now_s();
  std::vector<std::pair<double, std::string>> costed;
  for (const auto& b : work) costed.emplace_back(estimate_cost_ms(tuner, b), id_of(b));
  TOKAMAX_LOG("fleet", kInfo,
              fmt::format("estimated the cost of {} keys in {:.1f} s", work.size(), now_s() - t0));
  std::stable_sort(costed.begin(), costed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> ids;
  for (const auto& [_, id] : costed) ids.push_back(id);
  return ids;
}

// Joins the run (its plan made by the first process to come, its order checked by the others).
// Joining retries a store that fails (until the deadline), as the run's loop does.
void join_run(ClaimProtocol& proto, const Autotuner& tuner, const std::vector<BoundArguments>& work,
              const std::unordered_map<std::string, const BoundArguments*>& by_id,
              std::vector<std::string> ids, const FleetOptions& options, double deadline) {
  for (double backoff = options.poll_s;; backoff = std::min(backoff * 2, 10.0)) {
    try {
      // A run that has a plan needs no estimates: the plan's order is used.
      if (!proto.existing_order()) ids = ids_by_cost(tuner, work);
      {
        std::vector<std::string> full;
        for (const auto& id : ids) full.push_back(full_key(*by_id.at(id)));
        proto.join(ids, full);
      }
      break;
    } catch (const StoreError& e) {
      if (now_s() + backoff > deadline) throw;
      TOKAMAX_LOG("fleet", kWarning, std::string(e.what()) + "; retrying");
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    }
  }
}

// One process's part of a joined run: claims keys, tunes them and publishes their results until
// every key has one, then merges them. It survives the store's failures (results it could not
// publish are kept and published when the store is back) until the run's deadline.
class ShardedRunner {
 public:
  ShardedRunner(Store& store, ClaimProtocol& proto, std::mutex& store_mu, const AutotuneOptions& to,
                const FleetOptions& options,
                const std::unordered_map<std::string, const BoundArguments*>& by_id,
                std::string worker, double start, double deadline, double tune_until)
      : store_(store),
        proto_(proto),
        store_mu_(store_mu),
        to_(to),
        options_(options),
        by_id_(by_id),
        worker_(std::move(worker)),
        start_(start),
        deadline_(deadline),
        tune_until_(tune_until),
        fields_(proto.fields()),
        n_(fields_.size()),
        remaining_(static_cast<int64_t>(n_)),
        backoff_(options.poll_s),
        idle_poll_(options.poll_s) {}

  AutotuningResult run();

 private:
  void report(const std::string& key);
  void wait(double s);
  void idle();
  [[noreturn]] void fail_at_deadline();
  void publish_unpublished();
  void tune_claimed(size_t i, std::unique_lock<std::mutex>& lock);
  std::optional<std::string> tune_key(const BoundArguments& b, size_t i);
  std::optional<std::string> tune_value(const BoundArguments& b);
  std::optional<AutotuningResult> merge_results(std::map<size_t, std::string>* doubtful);
  void check_failure(size_t k, const std::string& marker);

  Store& store_;
  ClaimProtocol& proto_;
  std::mutex& store_mu_;  // the store object is shared with the lease renewer
  const AutotuneOptions& to_;
  const FleetOptions& options_;
  const std::unordered_map<std::string, const BoundArguments*>& by_id_;
  const std::string worker_;
  const double start_, deadline_, tune_until_;
  const std::vector<std::string>& fields_;
  const size_t n_;
  // Results this process produced and has not yet managed to publish (the store was down).
  std::map<size_t, std::string> unpublished_;
  // The value this process got for each key it tuned, or checked because the store said it
  // failed: what a failed marker in the store is weighed against.
  std::map<size_t, std::string> own_;
  int64_t remaining_;  // as last seen
  int mine_ = 0;
  double backoff_, idle_poll_;
  bool store_down_ = false, scan_all_ = false;
};

void ShardedRunner::report(const std::string& key) {
  if (!options_.progress) return;
  FleetProgress p;
  p.total = static_cast<int>(n_);
  p.done = static_cast<int>(static_cast<int64_t>(n_) - remaining_);
  p.mine = mine_;
  p.elapsed_s = now_s() - start_;
  // From this process's own pace: others' keys and a resumed run's do not shorten it.
  p.eta_s =
      mine_ > 0 ? p.elapsed_s / mine_ * (p.total - p.done) / std::max(1, options_.world_size) : 0;
  p.key = key;
  p.worker = worker_;
  options_.progress(p);
}

void ShardedRunner::wait(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(s, deadline_ - now_s())));
}

void ShardedRunner::idle() {
  // Idle until others finish: polls back off to the lease's length (a dead process's key is
  // taken over within about two leases), so that many idle processes do not load the store.
  wait(idle_poll_);
  idle_poll_ = std::min(idle_poll_ * 1.5, std::max(options_.poll_s, options_.lease_s));
}

void ShardedRunner::fail_at_deadline() {
  std::string names;
  try {
    std::lock_guard<std::mutex> lock(store_mu_);
    const auto missing = proto_.missing();
    remaining_ = static_cast<int64_t>(missing.size());
    for (size_t k = 0; k < missing.size() && k < 20; ++k) {
      names += fmt::format("\n  {} (last claimed by {})", fields_[missing[k]],
                           proto_.claimant(missing[k]));
    }
    if (missing.size() > 20) names += "\n  ...";
  } catch (const StoreError& e) {
    names =
        fmt::format(" (the store is unreachable, so which ones cannot be listed: {})", e.what());
  }
  throw Error(
      fmt::format("run {} on {}: the deadline of {:g} s passed with {} of {} keys "
                  "still missing{}",
                  options_.run_id, store_.describe(), options_.deadline_s, remaining_, n_, names));
}

// With the store lock held: what the store missed while it was down.
void ShardedRunner::publish_unpublished() {
  for (auto it = unpublished_.begin(); it != unpublished_.end();) {
    proto_.publish(it->first, it->second);
    it = unpublished_.erase(it);
  }
  if (store_down_) {
    TOKAMAX_LOG("fleet", kWarning, "store " + store_.describe() + " is reachable again");
    store_down_ = false;
  }
  backoff_ = options_.poll_s;
}

// Tunes the claimed key i (`lock`, on the store, is not held then) and publishes its result,
// or releases the key when the failure was transient.
void ShardedRunner::tune_claimed(size_t i, std::unique_lock<std::mutex>& lock) {
  const BoundArguments& b = *by_id_.at(proto_.order()[i]);
  report(fields_[i]);
  const std::optional<std::string> value = tune_key(b, i);
  lock.lock();
  if (!value) {
    proto_.release(i);
    lock.unlock();
    idle();
    return;
  }
  ++mine_;
  own_[i] = *value;
  unpublished_[i] = *value;
  proto_.publish(i, unpublished_[i]);
  unpublished_.erase(i);
  remaining_ = proto_.remaining();
  lock.unlock();
  report("");
}

// The value to publish for claimed key i (tune_value's), its lease renewed meanwhile.
std::optional<std::string> ShardedRunner::tune_key(const BoundArguments& b, size_t i) {
  Renewer renewer(proto_, store_mu_, i, options_.lease_s);
  return tune_value(b);
}

// The value to publish for b: its result, or why no process can tune it; nothing when the
// failure may pass (another look may tune it).
std::optional<std::string> ShardedRunner::tune_value(const BoundArguments& b) {
  Json value = {{"worker", worker_}};
  try {
    AutotuneOptions o = to_;
    o.budget_s = std::max(1.0, tune_until_ - now_s());
    AutotuningResult r;
    r.add(b, Autotuner(o).tune(b));
    value["result"] = parse_json(r.dumps(), "result");
  } catch (const StoreError&) {
    throw;
  } catch (const Error& e) {
    const bool deterministic =
        dynamic_cast<const InvalidArgument*>(&e) || dynamic_cast<const Unsupported*>(&e);
    TOKAMAX_LOG("autotune", kWarning, "failed to autotune " + id_of(b) + ": " + e.what());
    // Published when deterministic: the others must not wait for a key no process can tune.
    // Transient (the host lock's wait, ...): another look may tune it.
    if (!deterministic) return std::nullopt;
    value["failed"] = e.what();
  } catch (const std::exception& e) {
    TOKAMAX_LOG("autotune", kWarning, "failed to autotune " + id_of(b) + ": " + e.what());
    return std::nullopt;
  }
  return value.dump();
}

// Key k's published value is a failed marker, `marker`: another writer's word that no process
// can tune the key. Anyone who can write to the store can forge one, and one believed would
// take the key out of every process's result; so this process tunes the key itself first. A
// result replaces the marker in the store (published by the run's loop, as a result the store
// missed); the same kind of failure confirms it. A deterministic failure is usually raised
// before any measuring (binding the call, an unsupported implementation), so a real marker costs
// each process little.
void ShardedRunner::check_failure(size_t k, const std::string& marker) {
  std::string by = "?";
  try {
    by = parse_json(marker, "marker").value("worker", "?");
  } catch (const std::exception&) {
  }
  report(fields_[k]);
  std::optional<std::string> value = tune_value(*by_id_.at(proto_.order()[k]));
  if (!value) {
    // Neither confirmed nor refuted here: left out, as the marker says.
    value =
        Json{{"worker", worker_}, {"failed", "a transient failure where it was checked"}}.dump();
  }
  own_[k] = *value;
  const Json j = parse_json(*value, "own value");
  if (j.contains("failed")) {
    TOKAMAX_LOG("fleet", kWarning,
                fmt::format("{} could not be tuned (by {}, and here): {}", fields_[k], by,
                            j["failed"].dump()));
    return;
  }
  TOKAMAX_LOG("fleet", kWarning,
              fmt::format("{}: the failure published by {} did not happen here (forged, or it "
                          "has passed); this process's result replaces it",
                          fields_[k], by));
  unpublished_[k] = *value;
}

// With the store lock held and every key published: the merged results, or nothing when one is
// missing after all. A value this library cannot use is removed so that its key is tuned again;
// a failed marker not yet checked by this process goes to `doubtful` (check_failure).
std::optional<AutotuningResult> ShardedRunner::merge_results(
    std::map<size_t, std::string>* doubtful) {
  AutotuningResult merged;
  bool all_good = true;
  const auto [values, oversized] = proto_.results();
  for (const auto& field : oversized) {
    // Not this library's value (its results are a few KB): dropped unread, and its key tuned
    // again, rather than the one field refusing the whole run.
    TOKAMAX_LOG("fleet", kWarning,
                "discarding the result under " + field +
                    ": its value is over the store's size limit (not read); it is tuned again");
    proto_.discard_unread(field);
    all_good = false;
  }
  for (size_t k = 0; k < n_; ++k) {
    auto it = values.find(fields_[k]);
    if (it == values.end()) {
      all_good = false;
      continue;
    }
    try {
      Json j = parse_json(it->second, "result " + fields_[k]);
      if (j.contains("failed")) {
        // Weighed against this process's own value for the key: a failure of its own leaves the
        // key out; its own result is used (a marker written over it again is not believed).
        const auto own = own_.find(k);
        if (own == own_.end()) {
          (*doubtful)[k] = it->second;
          all_good = false;
          continue;
        }
        j = parse_json(own->second, "result " + fields_[k]);
        if (j.contains("failed")) continue;
      }
      const AutotuningResult r =
          AutotuningResult::loads(j.at("result").dump(), "result " + fields_[k]);
      if (r.device_kind() != device_kind() || r.data().size() != 1 ||
          id_of(r.data()[0].first) != proto_.order()[k]) {
        throw InvalidArgument("not the result of this key on " + device_kind());
      }
      merged = merged | r;
    } catch (const std::exception& e) {
      TOKAMAX_LOG("fleet", kWarning,
                  "discarding the unusable result under " + fields_[k] + " (" + e.what() +
                      "); it is tuned again");
      proto_.discard(fields_[k], it->second);
      all_good = false;
    }
  }
  if (!all_good) return std::nullopt;
  return merged;
}

AutotuningResult ShardedRunner::run() {
  for (;;) {
    if (now_s() > deadline_) fail_at_deadline();
    try {
      std::unique_lock<std::mutex> lock(store_mu_);
      publish_unpublished();
      // No key is started with less than a second left to tune it.
      const auto i = now_s() + 1 < tune_until_ ? proto_.claim_next(scan_all_) : std::nullopt;
      scan_all_ = false;
      if (i) {
        idle_poll_ = options_.poll_s;
        lock.unlock();
        tune_claimed(*i, lock);
        continue;
      }
      remaining_ = proto_.remaining();
      if (remaining_ > 0) {
        lock.unlock();
        report("");
        idle();
        continue;
      }
      // Every key has a result: read them all.
      std::map<size_t, std::string> doubtful;
      if (std::optional<AutotuningResult> merged = merge_results(&doubtful)) {
        report("");
        return std::move(*merged);
      }
      if (!doubtful.empty()) {
        lock.unlock();
        for (const auto& [k, marker] : doubtful) check_failure(k, marker);
        continue;  // its results published, then everything read again
      }
      // Something is missing after all (a result discarded, or others' fields in the hash):
      // look for it, after a pause.
      scan_all_ = true;
      lock.unlock();
      idle();
    } catch (const StoreError& e) {
      if (!store_down_) TOKAMAX_LOG("fleet", kWarning, std::string(e.what()) + "; retrying");
      store_down_ = true;
      wait(backoff_);
      backoff_ = std::min(backoff_ * 2, 10.0);
    }
  }
}

}  // namespace

AutotuningResult tune_sharded(const std::vector<BoundArguments>& list, Store& store,
                              const AutotuneOptions& tune_options, const FleetOptions& options) {
  options.validate();
  const double start = now_s();
  const double deadline = start + options.deadline_s;
  const std::string worker = fmt::format("{}:{}/rank{}", host_name(), getpid(), options.rank);
  const std::string lock_path =
      options.host_lock_path.empty() ? default_lock_path() : options.host_lock_path;
  check_host_lock(lock_path);
  AutotuneOptions to = tune_options;
  to.exclusive = [lock_path, deadline] {
    return lock_host_measurement(lock_path, std::max(1.0, deadline - now_s()));
  };
  const Autotuner tuner(to);
  const std::vector<BoundArguments> work = tuner.work_list(list);
  std::unordered_map<std::string, const BoundArguments*> by_id;
  std::vector<std::string> ids;
  for (const auto& b : work) {
    by_id[id_of(b)] = &b;
    ids.push_back(id_of(b));
  }

  std::mutex store_mu;  // the store object is shared with the lease renewer
  ClaimProtocol proto(store, options.run_id, device_kind() + "@" + library_version(), worker,
                      static_cast<int64_t>(options.lease_s * 1000));
  try {
    join_run(proto, tuner, work, by_id, std::move(ids), options, deadline);
    // --budget-s bounds this process's tuning (no key is started after it); the deadline bounds
    // the whole run, waiting for the others included.
    const double tune_until = std::min(deadline, start + tune_options.budget_s);
    ShardedRunner runner(store, proto, store_mu, to, options, by_id, worker, start, deadline,
                         tune_until);
    return runner.run();
  } catch (const StoreKeyError& e) {
    // One of the run's own keys (its plan, cursor, results or in-flight list) holds another
    // writer's value: every process would meet it, and waiting does not mend it.
    throw InvalidArgument(fmt::format("run {}: {}; delete that key or use another --run-id",
                                      options.run_id, e.message()));
  }
}

}  // namespace tokamax
