// The claim protocol's simulation (simulate_fleet in tokamax/fleet/sharded.h): many workers
// running the real ClaimProtocol against in-memory stores on a virtual clock, with no tuning, so
// that its load balance, its recovery from dead workers and its store traffic can be measured
// (and compared with XLA's split by count) without a fleet or a Redis server.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokamax/fleet/sharded.h"
#include "tokamax/fleet/store.h"

namespace tokamax {

namespace {

// XLA's split: worker r tunes the contiguous r-th slice of the list, by count.
void simulate_count_shards(const FleetSimulation& sim, FleetSimulationResult& out) {
  const int w = sim.workers;
  const size_t n = sim.costs_ms.size();
  for (int r = 0; r < w; ++r) {
    const size_t lo = n * r / w, hi = n * (r + 1) / w;
    for (size_t i = lo; i < hi; ++i) out.finish_ms[r] += sim.costs_ms[i];
    out.tunings_started += static_cast<int>(hi - lo);
  }
  out.keys_published = static_cast<int>(n);
  out.makespan_ms = *std::max_element(out.finish_ms.begin(), out.finish_ms.end());
}

// The simulated run's keys: their plan order and what each costs to tune.
struct SimPlan {
  std::vector<std::string> order;
  std::unordered_map<std::string, double> cost;
};

SimPlan plan_of(const std::vector<double>& costs_ms) {
  const size_t n = costs_ms.size();
  std::vector<std::string> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = "key" + std::to_string(i);
  // The plan: largest estimated cost first (the simulation's estimate is exact).
  SimPlan plan;
  plan.order = ids;
  for (size_t i = 0; i < n; ++i) plan.cost[ids[i]] = costs_ms[i];
  std::stable_sort(plan.order.begin(), plan.order.end(),
                   [&](const auto& a, const auto& b) { return plan.cost[a] > plan.cost[b]; });
  return plan;
}

// One simulated process: its own connection to the shared in-memory store, and the key it holds.
struct SimWorker {
  std::unique_ptr<MemoryStore> store;
  std::unique_ptr<ClaimProtocol> proto;
  std::optional<size_t> holding;
  double finish_at = 0, die_at = 1e300;
  double idle_poll = 0;
  bool joined = false;
  bool done = false;
};

// The workers, their stores on the virtual clock `now`, each command's latency added to
// `charged` (the sender's next step comes that much later).
std::vector<SimWorker> make_workers(const FleetSimulation& sim, const std::string& name,
                                    double& now, double& charged) {
  std::vector<SimWorker> ws(sim.workers);
  for (int k = 0; k < sim.workers; ++k) {
    SimWorker& wk = ws[k];
    wk.store = std::make_unique<MemoryStore>(name);
    wk.store->set_clock([clock = &now] { return static_cast<int64_t>(*clock); });
    MemoryStore::Faults f;
    f.failure_rate = sim.failure_rate;
    f.latency_ms = sim.latency_ms;
    f.on_latency = [latency = &charged](double ms) { *latency += ms; };
    f.seed = sim.seed * 7919 + k;
    wk.store->set_faults(f);
    // (std::string("w") += ...: GCC 12 warns -Wrestrict on "w" + std::to_string(k) here.)
    std::string owner = "w";
    owner += std::to_string(k);
    wk.proto = std::make_unique<ClaimProtocol>(*wk.store, "sim", "scope", owner,
                                               static_cast<int64_t>(sim.lease_ms));
  }
  return ws;
}

// Each dying worker dies at a random moment before the work could be done.
void schedule_deaths(const FleetSimulation& sim, double total, std::mt19937_64& rng,
                     std::vector<SimWorker>& ws) {
  const int w = sim.workers;
  std::uniform_real_distribution<double> unit(0, 1);
  const int dying = static_cast<int>(std::round(sim.die_fraction * w));
  std::vector<int> perm(w);
  for (int i = 0; i < w; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int k = 0; k < dying; ++k) ws[perm[k]].die_at = unit(rng) * total / w;
}

// Worker k's step at time t, as the runner's loop takes it: publish the key it finished, renew
// the lease of the one it holds, claim the next one or wait for the others. Returns when its
// next step is due (before latency), or -1 when it is done.
double step(const FleetSimulation& sim, const SimPlan& plan, SimWorker& wk, int k, double t,
            std::vector<int>& publications, FleetSimulationResult& out) {
  const double renew_every = sim.lease_ms / 3;
  double next = -1;
  try {
    if (!wk.joined) {
      wk.proto->join(plan.order, plan.order);
      wk.joined = true;
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
      wk.finish_at = t + plan.cost.at(wk.proto->order()[*i]);
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
  return next;
}

// What the store holds at the end, and what the workers sent it.
void count_store(const std::string& name, const std::vector<SimWorker>& ws,
                 const std::vector<int>& publications, FleetSimulationResult& out) {
  MemoryStore check(name);
  const auto results = check.hash_get_all("tokamax:{sim}:scope:results").values;
  out.keys_published = static_cast<int>(results.size());
  for (int p : publications) {
    out.keys_published_once += p == 1;
    out.keys_published_more += p > 1;
  }
  for (const auto& wk : ws) {
    out.store_operations += wk.store->operations();
    for (const auto& [c, m] : wk.store->operation_counts()) out.operations_by_command[c] += m;
  }
}

// The claim protocol as a discrete-event simulation: each worker's next step is an event on the
// virtual clock, taken in time order.
void simulate_claims(const FleetSimulation& sim, FleetSimulationResult& out) {
  const int w = sim.workers;
  double now = 0;
  const std::string name = "simulate_fleet";
  MemoryStore::reset(name);
  std::mt19937_64 rng(sim.seed);
  const SimPlan plan = plan_of(sim.costs_ms);
  double total = 0;
  for (double c : sim.costs_ms) total += c;
  // Latency is charged to the worker that sent the command: its next step is that much later.
  double charged = 0;
  std::vector<SimWorker> ws = make_workers(sim, name, now, charged);
  schedule_deaths(sim, total, rng, ws);
  using Event = std::pair<double, int>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> q;
  std::vector<int> publications(sim.costs_ms.size(), 0);  // per plan position
  for (int k = 0; k < w; ++k) q.push({0, k});
  while (!q.empty()) {
    auto [t, k] = q.top();
    q.pop();
    now = t;
    SimWorker& wk = ws[k];
    if (t >= wk.die_at) {
      out.died[k] = true;
      out.finish_ms[k] = wk.die_at;
      continue;
    }
    charged = 0;
    const double next = step(sim, plan, wk, k, t, publications, out);
    if (next >= 0) q.push({next + charged, k});
  }
  count_store(name, ws, publications, out);
  out.makespan_ms = now;
  MemoryStore::reset(name);
}

}  // namespace

FleetSimulationResult simulate_fleet(const FleetSimulation& sim) {
  const int w = sim.workers;
  FleetSimulationResult out;
  out.finish_ms.assign(w, 0);
  out.died.assign(w, false);
  if (sim.count_shards) {
    simulate_count_shards(sim, out);
  } else {
    simulate_claims(sim, out);
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
