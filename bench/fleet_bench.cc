// Fleet tuning's costs, measured (issue: store overhead per tuned key under 5 ms on loopback;
// makespan balance against XLA's count split).
//
// 1. Store overhead per key: the claim protocol's whole cycle for one key (cursor, listing,
//    lease, one renewal, publishing a result of realistic size, release, the progress count)
//    against a real redis-server on loopback, with 1 and 4 workers at once (threads, each with
//    its own connection). Timed in interleaved rounds beside the floor: one GET round trip, the
//    cheapest command, times the cycle's command count.
// 2. Makespan: 4 processes, 40 keys of which 4 cost 10x, adjacent in the list; the simulation's
//    deterministic costs, cost-ordered claims against contiguous shards by count.
//
// Usage: tokamax_fleet_bench [--url redis://...] [--keys N] [--rounds R]
// (without --url it starts its own redis-server on a free loopback port).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/fleet/redis_server.h"
#include "tokamax/tokamax.h"

namespace tk = tokamax;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One worker's protocol over a run of `keys` keys shared with `workers` - 1 others; returns
// the commands it sent and the keys it tuned.
void worker_cycle(const std::string& url, const std::string& run,
                  const std::vector<std::string>& ids, const std::string& value, int64_t* ops,
                  int* tuned) {
  auto store = tk::open_store(url);
  tk::ClaimProtocol p(*store, run, "bench", "w", 30000);
  p.join(ids, ids);
  while (const auto i = p.claim_next()) {
    p.renew(*i);
    p.publish(*i, value);
    p.remaining();  // the runner's progress count
    ++*tuned;
  }
  *ops = store->operations();
}

struct Round {
  double ms_per_key = 0, ops_per_key = 0, floor_ms_per_key = 0;
};

Round run_round(const std::string& url, int workers, int keys, int round) {
  std::vector<std::string> ids;
  for (int i = 0; i < keys; ++i) ids.push_back("ragged_dot/native/key" + std::to_string(i));
  // A published result is an AutotuningResult of one key with every candidate's samples: tens
  // of KB (a smoke key's is about 20 KB).
  const std::string value(20000, 'x');
  const std::string run = "bench" + std::to_string(workers) + "_" + std::to_string(round);
  std::vector<int64_t> ops(workers);
  std::vector<int> tuned(workers);
  const double t0 = now_s();
  std::vector<std::thread> ts;
  for (int w = 0; w < workers; ++w)
    ts.emplace_back(worker_cycle, url, run, ids, value, &ops[w], &tuned[w]);
  for (auto& t : ts) t.join();
  const double elapsed = now_s() - t0;
  Round r;
  int64_t total_ops = 0;
  for (int64_t o : ops) total_ops += o;
  // Per key of one worker's sequence: the wall time a process spends on the store per key it
  // tunes (workers run side by side, so each worker's share is elapsed / its keys).
  r.ms_per_key = elapsed * 1e3 * workers / keys;
  r.ops_per_key = static_cast<double>(total_ops) / keys;
  // The floor, right after: as many GET round trips as the cycle sent per key.
  auto store = tk::open_store(url);
  const int n = static_cast<int>(r.ops_per_key * 200);
  const double f0 = now_s();
  for (int i = 0; i < n; ++i) store->get("tokamax:floor");
  r.floor_ms_per_key = (now_s() - f0) * 1e3 / 200;
  // Clean up the run's keys.
  for (const auto& k : store->keys("tokamax:{" + run + "}*")) store->del(k);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string url;
  int keys = 400, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--url")) url = argv[i + 1];
    if (!std::strcmp(argv[i], "--keys")) keys = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  std::unique_ptr<tk::testing::RedisServer> server;
  if (url.empty()) {
    const auto dir = std::filesystem::temp_directory_path() / "tokamax_fleet_bench";
    server = std::make_unique<tk::testing::RedisServer>(dir.string());
    if (!server->running()) {
      std::fprintf(stderr, "could not start redis-server; give --url\n");
      return 1;
    }
    url = server->url();
  }
  std::printf("store overhead per tuned key, %s, %d keys, %d interleaved rounds\n", url.c_str(),
              keys, rounds);
  std::printf("%-8s %-10s %22s %22s %10s\n", "workers", "round", "store ms per key",
              "floor (GET RTT x ops)", "ops/key");
  for (int round = 0; round < rounds; ++round) {
    for (int workers : {1, 4}) {
      const Round r = run_round(url, workers, keys, round);
      std::printf("%-8d %-10d %22.3f %22.3f %10.1f\n", workers, round, r.ms_per_key,
                  r.floor_ms_per_key, r.ops_per_key);
    }
  }

  std::printf("\nmakespan, 4 processes, 40 keys (4 at 10x the rest, adjacent in the list)\n");
  for (bool count : {false, true}) {
    tk::FleetSimulation sim;
    sim.workers = 4;
    sim.costs_ms.assign(40, 1000);
    for (int i = 0; i < 4; ++i) sim.costs_ms[i] = 10000;
    sim.count_shards = count;
    sim.poll_ms = 100;
    const auto r = tk::simulate_fleet(sim);
    std::printf("%-34s last %.1f s, mean %.1f s, last/mean %.2f\n",
                count ? "contiguous shards by count (XLA)" : "cost-ordered claims",
                r.max_finish_ms / 1e3, r.mean_finish_ms / 1e3, r.max_finish_ms / r.mean_finish_ms);
  }
  return 0;
}
