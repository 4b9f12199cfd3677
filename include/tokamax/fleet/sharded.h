// Sharded tuning across processes and machines through a shared store (tokamax/fleet/store.h):
// `tokamax autotune --bound-args F --store redis://... --run-id ID` on every process.
//
// The claim protocol (ClaimProtocol), all keys of a run under the hash tag {run id} so that it
// runs unchanged on Redis Cluster:
//   <prefix>{<run>}:<scope>:plan        the run's work list: a digest of its full keys and their
//                                       order (largest estimated cost first), set once by the
//                                       first process (SET NX); a process whose keys differ is
//                                       refused.
//   <prefix>{<run>}:<scope>:cursor      INCR hands out plan positions, one process each.
//   <prefix>{<run>}:<scope>:claim:<i>   a lease (SET NX PX with the listing below, in one
//                                       script; renewed while measuring); a process
//                                       that dies stops renewing and the key expires (the store's
//                                       clock, not the processes').
//   <prefix>{<run>}:<scope>:inflight    hash: position -> the lease's holder, until published.
//   <prefix>{<run>}:<scope>:results     hash: full key -> the published AutotuningResult.
// <scope> is the device kind and library version: a process never reads another kind's or
// version's results. When the cursor has passed the end, processes sweep for ids with neither a
// result nor a live lease (a dead process's keys, listed in flight) and claim those; when every
// id has a result (HLEN), each process reads them all and returns the merged result. Store
// commands per key: about six (cursor, claim, listing, result, release) plus a renewal every
// lease / 3 and the idle processes' polls at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tokamax/autotuning/autotuner.h"
#include "tokamax/core/export.h"
#include "tokamax/fleet/store.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

class ClaimProtocol {
 public:
  // `scope`: the run's namespace for one kind of process (device kind and library version);
  // `worker`: this process's name in listings and messages (host:pid/rank).
  ClaimProtocol(Store& store, std::string run_id, std::string scope, std::string worker,
                int64_t lease_ms);
  // Joins the run: publishes the scope's plan (when first) or checks this process's keys
  // against it. `ids` in this process's cost order, `fields[i]` the full key ids[i]'s result is
  // published under (the digest covers these: implementation versions and thread counts
  // included). The plan's order is used from then on (processes may estimate costs
  // differently). InvalidArgument when the keys differ from the run's (a run id reused with
  // other inputs, or machines that fill in thread counts or implementations differently) or
  // the plan is not one this library wrote.
  void join(const std::vector<std::string>& ids, const std::vector<std::string>& fields);
  // The scope's plan order when the run has one (a process that finds one need not estimate
  // costs).
  std::optional<std::vector<std::string>> existing_order();
  const std::vector<std::string>& order() const { return order_; }
  const std::vector<std::string>& fields() const { return fields_; }

  // The next plan position this process should tune, claimed; nullopt when none is claimable
  // now (every key has a result or a live lease). `scan_all`: also look for keys neither
  // published nor listed in flight (after a merge found one missing).
  std::optional<size_t> claim_next(bool scan_all = false);
  // Extends the lease on i; false when it was lost (expired and taken by another process).
  bool renew(size_t i);
  // Stores i's result and releases the lease and the listing (if still ours).
  void publish(size_t i, const std::string& value);
  // Gives up the claim on i without a result (another process may take it at once).
  void release(size_t i);
  // Positions without a result (reads every published field: for messages and scans).
  std::vector<size_t> missing();
  // How many positions have no result yet (one HLEN; never below 0).
  int64_t remaining();
  // field -> value of every published result.
  Store::HashContents results();
  // Removes a result that cannot be used (corrupt, foreign), if it still holds `value`, so that
  // its key is tuned again.
  void discard(const std::string& field, const std::string& value);
  // Removes a published result whose value could not be read (over the size limit).
  void discard_unread(const std::string& field);
  // Who holds (or last held) the claim on i, for messages.
  std::string claimant(size_t i);
  const std::string& worker() const { return worker_; }
  std::string key(const std::string& suffix) const;  // a scope key's full name

 private:
  bool try_claim(size_t i);
  // After claiming i in a sweep: true (and the claim dropped) when i turned out published.
  bool claim_published(size_t i);
  Store& store_;
  std::string run_, scope_, worker_, nonce_;
  int64_t lease_ms_;
  std::vector<std::string> order_, fields_;
  int64_t claims_ = 0;
  bool cursor_done_ = false;              // the cursor has passed the end (it never comes back)
  std::map<size_t, std::string> tokens_;  // leases held: position -> the value they hold
};

struct FleetProgress {
  int done = 0, total = 0;  // keys with a published result (as last seen) / all keys
  int mine = 0;             // keys this process tuned
  double elapsed_s = 0, eta_s = 0;
  std::string key;  // the key being tuned ("" while waiting)
  std::string worker;
};

struct FleetOptions {
  std::string run_id;
  int rank = 0, world_size = 1;
  double lease_s = 30;            // a claim's expiry; renewed every lease_s / 3 while tuning
  double deadline_s = 24 * 3600;  // the whole run; then an error naming the missing keys
  double poll_s = 1;              // wait between looks while others hold the missing keys
  // The host-wide measurement lock (a file locked with flock): processes on one machine never
  // measure at the same moment. Empty: $TMPDIR/tokamax-measure.lock.
  std::string host_lock_path;
  std::function<void(const FleetProgress&)> progress;
  void validate() const;
};

// Rank and world size from the usual launcher variables: OpenMPI (OMPI_COMM_WORLD_RANK/SIZE),
// Slurm (SLURM_PROCID/SLURM_NTASKS), torchrun (RANK/WORLD_SIZE); nullopt when none is set.
struct LauncherRank {
  int rank = 0, world_size = 1;
  std::string source;
};
std::optional<LauncherRank> launcher_rank();

// Tunes `list` (expanded as Autotuner::tune_all does) together with every other process of the
// run; returns the complete merged result. Error naming the missing keys and their last
// claimants when the deadline passes first; InvalidArgument when the run's inputs differ.
AutotuningResult tune_sharded(const std::vector<BoundArguments>& list, Store& store,
                              const AutotuneOptions& tune_options, const FleetOptions& options);

// A RAII hold on the host-wide measurement lock; waits at most `timeout_s` (Error after that).
std::shared_ptr<void> lock_host_measurement(const std::string& path, double timeout_s);

// The claim protocol simulated with an in-memory store and a virtual clock (no tuning): many
// workers, keys of given costs, some workers dying, store latency and failures. Also XLA's
// split (contiguous shards by count) for comparison.
struct FleetSimulation {
  int workers = 4;
  std::vector<double> costs_ms;  // per key, in the list's order
  double die_fraction = 0;       // workers that die, each at a random moment of the run
  double lease_ms = 30000, poll_ms = 1000;
  double latency_ms = 0;      // per store command
  double failure_rate = 0;    // per store command
  bool count_shards = false;  // XLA's split instead of claims
  uint64_t seed = 1;
};
struct FleetSimulationResult {
  std::vector<double> finish_ms;  // per worker: when its last tuning ended (dead: when it died)
  std::vector<bool> died;
  int keys_published = 0;  // distinct keys with a result at the end
  // Keys whose result was published by exactly one worker, and by more than one (a key tuned
  // twice: a lease that expired while its holder was alive).
  int keys_published_once = 0, keys_published_more = 0;
  int tunings_started = 0;  // including those lost with a dead worker
  int64_t store_operations = 0;
  std::map<std::string, int64_t> operations_by_command;
  double makespan_ms = 0;                        // the last result's time
  double mean_finish_ms = 0, max_finish_ms = 0;  // over the workers that survived
};
FleetSimulationResult simulate_fleet(const FleetSimulation& sim);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
