// Sharded tuning through a shared store: the claim protocol, the runner, the host-wide
// measurement lock, launcher ranks and the protocol's simulation (see tokamax/fleet/sharded.h).
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
#include <queue>
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

std::map<std::string, std::string> ClaimProtocol::results() {
  return store_.hash_get_all(key("results"));
}

void ClaimProtocol::discard(const std::string& field, const std::string& value) {
  store_.hash_delete_if_equal(key("results"), field, value);
}

std::string ClaimProtocol::claimant(size_t i) {
  auto who = [](const std::string& token) { return token.substr(0, token.rfind('#')); };
  if (const auto holder = store_.get(key("claim:" + std::to_string(i)))) {
    return who(*holder) + " (lease live)";
  }
  if (const auto last = store_.hash_get(key("inflight"), std::to_string(i))) {
    return who(*last) + " (lease expired)";
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
            } catch (const StoreError& e) {
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

}  // namespace

AutotuningResult tune_sharded(const std::vector<BoundArguments>& list, Store& store,
                              const AutotuneOptions& tune_options, const FleetOptions& options) {
  options.validate();
  const double start = now_s();
  const double deadline = start + options.deadline_s;
  const std::string worker = fmt::format("{}:{}/rank{}", host_name(), getpid(), options.rank);
  const std::string lock_path =
      options.host_lock_path.empty() ? default_lock_path() : options.host_lock_path;

  {
    // The lock file must be usable before any work: a key whose measurement cannot take it
    // would fail for every process of this machine.
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
      throw InvalidArgument("the host measurement lock " + lock_path + " cannot be opened (" +
                            std::strerror(errno) + "); give another path (--host-lock)");
    }
    ::close(fd);
  }
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
  // Joining retries a store that fails (until the deadline), as the run's loop below does.
  for (double backoff = options.poll_s;; backoff = std::min(backoff * 2, 10.0)) {
    try {
      // A run that has a plan needs no estimates: the plan's order is used.
      if (!proto.existing_order()) {
        const double t0 = now_s();
        std::vector<std::pair<double, std::string>> costed;
        for (const auto& b : work) costed.emplace_back(estimate_cost_ms(tuner, b), id_of(b));
        TOKAMAX_LOG(
            "fleet", kInfo,
            fmt::format("estimated the cost of {} keys in {:.1f} s", work.size(), now_s() - t0));
        std::stable_sort(costed.begin(), costed.end(),
                         [](const auto& a, const auto& b) { return a.first > b.first; });
        ids.clear();
        for (const auto& [_, id] : costed) ids.push_back(id);
      }
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
  const std::vector<std::string>& fields = proto.fields();
  const size_t n = fields.size();
  // --budget-s bounds this process's tuning (no key is started after it); the deadline bounds
  // the whole run, waiting for the others included.
  const double tune_until = std::min(deadline, start + tune_options.budget_s);

  // Results this process produced and has not yet managed to publish (the store was down).
  std::map<size_t, std::string> unpublished;
  int64_t remaining = static_cast<int64_t>(n);  // as last seen
  int mine = 0;
  double backoff = options.poll_s, idle_poll = options.poll_s;
  bool store_down = false, scan_all = false;
  auto report = [&](const std::string& key) {
    if (!options.progress) return;
    FleetProgress p;
    p.total = static_cast<int>(n);
    p.done = static_cast<int>(static_cast<int64_t>(n) - remaining);
    p.mine = mine;
    p.elapsed_s = now_s() - start;
    // From this process's own pace: others' keys and a resumed run's do not shorten it.
    p.eta_s =
        mine > 0 ? p.elapsed_s / mine * (p.total - p.done) / std::max(1, options.world_size) : 0;
    p.key = key;
    p.worker = worker;
    options.progress(p);
  };
  auto wait = [&](double s) {
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(s, deadline - now_s())));
  };
  auto idle = [&] {
    // Idle until others finish: polls back off to the lease's length (a dead process's key is
    // taken over within about two leases), so that many idle processes do not load the store.
    wait(idle_poll);
    idle_poll = std::min(idle_poll * 1.5, std::max(options.poll_s, options.lease_s));
  };

  for (;;) {
    if (now_s() > deadline) {
      std::string names;
      try {
        std::lock_guard<std::mutex> lock(store_mu);
        const auto missing = proto.missing();
        remaining = static_cast<int64_t>(missing.size());
        for (size_t k = 0; k < missing.size() && k < 20; ++k) {
          names += fmt::format("\n  {} (last claimed by {})", fields[missing[k]],
                               proto.claimant(missing[k]));
        }
        if (missing.size() > 20) names += "\n  ...";
      } catch (const StoreError& e) {
        names = fmt::format(" (the store is unreachable, so which ones cannot be listed: {})",
                            e.what());
      }
      throw Error(
          fmt::format("run {} on {}: the deadline of {:g} s passed with {} of {} keys "
                      "still missing{}",
                      options.run_id, store.describe(), options.deadline_s, remaining, n, names));
    }
    try {
      std::unique_lock<std::mutex> lock(store_mu);
      for (auto it = unpublished.begin(); it != unpublished.end();) {
        proto.publish(it->first, it->second);
        it = unpublished.erase(it);
      }
      if (store_down) {
        TOKAMAX_LOG("fleet", kWarning, "store " + store.describe() + " is reachable again");
        store_down = false;
      }
      backoff = options.poll_s;
      // No key is started with less than a second left to tune it.
      const auto i = now_s() + 1 < tune_until ? proto.claim_next(scan_all) : std::nullopt;
      scan_all = false;
      if (i) {
        idle_poll = options.poll_s;
        lock.unlock();
        const BoundArguments& b = *by_id.at(proto.order()[*i]);
        report(fields[*i]);
        Json value = {{"worker", worker}};
        bool keep = true;
        {
          Renewer renewer(proto, store_mu, *i, options.lease_s);
          try {
            AutotuneOptions o = to;
            o.budget_s = std::max(1.0, tune_until - now_s());
            AutotuningResult r;
            r.add(b, Autotuner(o).tune(b));
            value["result"] = parse_json(r.dumps(), "result");
          } catch (const StoreError&) {
            throw;
          } catch (const Error& e) {
            const bool deterministic =
                dynamic_cast<const InvalidArgument*>(&e) || dynamic_cast<const Unsupported*>(&e);
            TOKAMAX_LOG("autotune", kWarning, "failed to autotune " + id_of(b) + ": " + e.what());
            if (deterministic) {
              // Published: the others must not wait for a key no process can tune.
              value["failed"] = e.what();
            } else {
              keep = false;  // transient (the host lock's wait, ...): another look may tune it
            }
          } catch (const std::exception& e) {
            TOKAMAX_LOG("autotune", kWarning, "failed to autotune " + id_of(b) + ": " + e.what());
            keep = false;
          }
        }
        lock.lock();
        if (!keep) {
          proto.release(*i);
          lock.unlock();
          idle();
          continue;
        }
        ++mine;
        unpublished[*i] = value.dump();
        proto.publish(*i, unpublished[*i]);
        unpublished.erase(*i);
        remaining = proto.remaining();
        lock.unlock();
        report("");
        continue;
      }
      remaining = proto.remaining();
      if (remaining > 0) {
        lock.unlock();
        report("");
        idle();
        continue;
      }
      // Every key has a result: read them all; a value this library cannot use is removed so
      // that its key is tuned again.
      AutotuningResult merged;
      bool all_good = true;
      const auto values = proto.results();
      for (size_t k = 0; k < n; ++k) {
        auto it = values.find(fields[k]);
        if (it == values.end()) {
          all_good = false;
          continue;
        }
        try {
          const Json j = parse_json(it->second, "result " + fields[k]);
          if (j.contains("failed")) {
            TOKAMAX_LOG("fleet", kWarning,
                        fmt::format("{} could not be tuned by {}: {}", fields[k],
                                    j.value("worker", "?"), j["failed"].dump()));
            continue;
          }
          const AutotuningResult r =
              AutotuningResult::loads(j.at("result").dump(), "result " + fields[k]);
          if (r.device_kind() != device_kind() || r.data().size() != 1 ||
              id_of(r.data()[0].first) != proto.order()[k]) {
            throw InvalidArgument("not the result of this key on " + device_kind());
          }
          merged = merged | r;
        } catch (const std::exception& e) {
          TOKAMAX_LOG("fleet", kWarning,
                      "discarding the unusable result under " + fields[k] + " (" + e.what() +
                          "); it is tuned again");
          proto.discard(fields[k], it->second);
          all_good = false;
        }
      }
      if (all_good) {
        report("");
        return merged;
      }
      // Something is missing after all (a result discarded, or others' fields in the hash):
      // look for it, after a pause.
      scan_all = true;
      lock.unlock();
      idle();
    } catch (const StoreError& e) {
      if (!store_down) TOKAMAX_LOG("fleet", kWarning, std::string(e.what()) + "; retrying");
      store_down = true;
      wait(backoff);
      backoff = std::min(backoff * 2, 10.0);
    }
  }
}

// ---- Simulation --------------------------------------------------------------------------------

FleetSimulationResult simulate_fleet(const FleetSimulation& sim) {
  const int w = sim.workers;
  const size_t n = sim.costs_ms.size();
  FleetSimulationResult out;
  out.finish_ms.assign(w, 0);
  out.died.assign(w, false);
  if (sim.count_shards) {
    // XLA's split: worker r tunes the contiguous r-th slice of the list, by count.
    for (int r = 0; r < w; ++r) {
      const size_t lo = n * r / w, hi = n * (r + 1) / w;
      for (size_t i = lo; i < hi; ++i) out.finish_ms[r] += sim.costs_ms[i];
      out.tunings_started += static_cast<int>(hi - lo);
    }
    out.keys_published = static_cast<int>(n);
    out.makespan_ms = *std::max_element(out.finish_ms.begin(), out.finish_ms.end());
  } else {
    double now = 0;
    const std::string name = "simulate_fleet";
    MemoryStore::reset(name);
    std::mt19937_64 rng(sim.seed);
    std::vector<std::string> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = "key" + std::to_string(i);
    // The plan: largest estimated cost first (the simulation's estimate is exact).
    std::vector<std::string> order = ids;
    std::unordered_map<std::string, double> cost;
    for (size_t i = 0; i < n; ++i) cost[ids[i]] = sim.costs_ms[i];
    std::stable_sort(order.begin(), order.end(),
                     [&](const auto& a, const auto& b) { return cost[a] > cost[b]; });
    double total = 0;
    for (double c : sim.costs_ms) total += c;
    struct Worker {
      std::unique_ptr<MemoryStore> store;
      std::unique_ptr<ClaimProtocol> proto;
      std::optional<size_t> holding;
      double finish_at = 0, die_at = 1e300;
      double idle_poll = 0;
      bool done = false;
    };
    std::vector<Worker> ws(w);
    // Latency is charged to the worker that sent the command: its next step is that much later.
    double charged = 0;
    std::uniform_real_distribution<double> unit(0, 1);
    const int dying = static_cast<int>(std::round(sim.die_fraction * w));
    std::vector<int> perm(w);
    for (int i = 0; i < w; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int k = 0; k < w; ++k) {
      Worker& wk = ws[k];
      wk.store = std::make_unique<MemoryStore>(name);
      wk.store->set_clock([&now] { return static_cast<int64_t>(now); });
      MemoryStore::Faults f;
      f.failure_rate = sim.failure_rate;
      f.latency_ms = sim.latency_ms;
      f.on_latency = [&charged](double ms) { charged += ms; };
      f.seed = sim.seed * 7919 + k;
      wk.store->set_faults(f);
      // (std::string("w") += ...: GCC 12 warns -Wrestrict on "w" + std::to_string(k) here.)
      std::string owner = "w";
      owner += std::to_string(k);
      wk.proto = std::make_unique<ClaimProtocol>(*wk.store, "sim", "scope", owner,
                                                 static_cast<int64_t>(sim.lease_ms));
    }
    // Each dying worker dies at a random moment before the work could be done.
    for (int k = 0; k < dying; ++k) ws[perm[k]].die_at = unit(rng) * total / w;
    using Event = std::pair<double, int>;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> q;
    std::vector<bool> joined(w, false);
    std::vector<int> publications(n, 0);  // per plan position
    for (int k = 0; k < w; ++k) q.push({0, k});
    const double renew_every = sim.lease_ms / 3;
    while (!q.empty()) {
      auto [t, k] = q.top();
      q.pop();
      now = t;
      Worker& wk = ws[k];
      if (t >= wk.die_at) {
        out.died[k] = true;
        out.finish_ms[k] = wk.die_at;
        continue;
      }
      charged = 0;
      double next = -1;
      try {
        if (!joined[k]) {
          wk.proto->join(order, order);
          joined[k] = true;
        }
        if (wk.holding && t >= wk.finish_at) {
          const size_t i = *wk.holding;
          wk.proto->publish(i, "done");
          ++publications[i];
          wk.holding.reset();
          out.finish_ms[k] = t;
        }
        if (wk.holding) {
          wk.proto->renew(*wk.holding);
          next = std::min(t + renew_every, wk.finish_at);
        } else if (const auto i = wk.proto->claim_next()) {
          wk.holding = i;
          ++out.tunings_started;
          wk.finish_at = t + cost[wk.proto->order()[*i]];
          next = std::min(t + renew_every, wk.finish_at);
          wk.idle_poll = sim.poll_ms;
        } else if (wk.proto->remaining() > 0) {
          // The runner's idle back-off.
          wk.idle_poll = std::max(wk.idle_poll, sim.poll_ms);
          next = t + wk.idle_poll;
          wk.idle_poll = std::min(wk.idle_poll * 1.5, std::max(sim.poll_ms, sim.lease_ms));
        } else {
          wk.done = true;
        }
      } catch (const StoreError&) {
        next = t + sim.poll_ms;  // the runner's back-off
      }
      if (next >= 0) q.push({next + charged, k});
    }
    MemoryStore check(name);
    const auto results = check.hash_get_all("tokamax:{sim}:scope:results");
    out.keys_published = static_cast<int>(results.size());
    for (int p : publications) {
      out.keys_published_once += p == 1;
      out.keys_published_more += p > 1;
    }
    for (const auto& wk : ws) {
      out.store_operations += wk.store->operations();
      for (const auto& [c, m] : wk.store->operation_counts()) out.operations_by_command[c] += m;
    }
    out.makespan_ms = now;
    MemoryStore::reset(name);
  }
  int alive = 0;
  for (int k = 0; k < w; ++k) {
    if (out.died[k]) continue;
    ++alive;
    out.mean_finish_ms += out.finish_ms[k];
    out.max_finish_ms = std::max(out.max_finish_ms, out.finish_ms[k]);
  }
  if (alive) out.mean_finish_ms /= alive;
  return out;
}

}  // namespace tokamax
