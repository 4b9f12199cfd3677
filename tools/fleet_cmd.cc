// `tokamax autotune --store`: sharded tuning with the run's other processes, and the store
// variants of `tokamax cache show|merge|verify` (the remote cache's entries).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <stdexcept>

#include "tokamax/fleet/remote_cache.h"
#include "tokamax/fleet/sharded.h"
#include "tools/commands.h"

namespace tokamax::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ProgressPrinter::ProgressPrinter(bool live, double every_s) : live_(live), every_s_(every_s) {}

void ProgressPrinter::line(const std::string& text, bool final) {
  if (live_) {
    fmt::print(stderr, "\r{:<118.118}", text);
    if (final) fmt::print(stderr, "\n");
    return;
  }
  // Not a terminal (a log file, CI): a line now and then, and the last one.
  const double t = now_s();
  if (!final && t - last_s_ < every_s_) return;
  last_s_ = t;
  fmt::print(stderr, "{}\n", text);
}

AutotuningResult autotune_sharded(const std::vector<BoundArguments>& list,
                                  const AutotuneOptions& tune_options, const FleetArgs& args) {
  FleetOptions f;
  f.run_id = args.run_id;
  f.lease_s = args.lease_s;
  f.deadline_s = args.deadline_s;
  f.poll_s = args.poll_s;
  f.host_lock_path = args.host_lock;
  if (args.rank >= 0 || args.world_size > 0) {
    if (args.rank < 0 || args.world_size <= 0)
      throw InvalidArgument("--rank and --world-size go together");
    f.rank = args.rank;
    f.world_size = args.world_size;
  } else if (const auto l = launcher_rank()) {
    f.rank = l->rank;
    f.world_size = l->world_size;
  }
  if (f.run_id.empty()) throw InvalidArgument("--store needs --run-id (the same on every process)");
  auto printer = std::make_shared<ProgressPrinter>(isatty(STDERR_FILENO), 30);
  f.progress = [printer](const FleetProgress& p) {
    printer->line(
        fmt::format("[{}] {}/{} keys ({} mine) {:.0f}s ETA {:.0f}s {}", p.worker, p.done, p.total,
                    p.mine, p.elapsed_s, p.eta_s, p.key.empty() ? "waiting" : p.key),
        p.done == p.total);
  };
  const StoreOptions so{args.command_timeout_s, args.command_timeout_s};
  const auto store = open_store(args.store, so);
  return tune_sharded(list, *store, tune_options, f);
}

namespace {

// Calls `visit(implementation, hash, key, value, error)` for every remote cache entry of the
// families `op` selects (all when empty). A value that cannot be read (over the size limit) or a
// hash of the wrong type (another writer's) is that entry's error, not the command's: the other
// hashes are still listed.
template <typename Visit>
void for_each_store_entry(Store& store, const std::string& op, Visit visit) {
  for (const auto& fam : families()) {
    if (!op.empty() && fam->name() != op) continue;
    for (const auto& impl : fam->implementations()) {
      const std::string h = RemoteCache::hash_key(store.prefix(), fam->name(), *impl);
      Store::HashContents all;
      try {
        all = store.hash_get_all(h);
      } catch (const StoreKeyError& e) {
        visit(*fam, *impl, h, "", "", e.message());
        continue;
      }
      for (const auto& [key, value] : all.values) visit(*fam, *impl, h, key, value, "");
      for (const auto& key : all.oversized) {
        visit(*fam, *impl, h, key, "", "its value is over the store's size limit; not read");
      }
    }
  }
}

}  // namespace

int cache_show_store(const std::string& url, const std::string& op, bool json) {
  if (!op.empty()) find_family(op);
  const auto store = open_store(url);
  Json out = Json::array();
  for_each_store_entry(
      *store, op,
      [&](const OpFamily&, const Implementation& impl, const std::string& h, const std::string& key,
          const std::string& value, const std::string& error) {
        Json e = {{"store", store->describe()},
                  {"hash", h},
                  {"implementation", impl.name()},
                  {"key", key}};
        try {
          if (!error.empty()) throw std::runtime_error(error);
          e["entry"] = parse_json(value, h + " " + key);
        } catch (const std::exception& ex) {
          e["error"] = ex.what();
        }
        out.push_back(e);
      });
  if (json) {
    std::cout << out.dump(2) << "\n";
    return kExitSuccess;
  }
  for (const auto& e : out) {
    fmt::print("{} [{}]\n  key {}\n", e["hash"].get<std::string>(),
               e["implementation"].get<std::string>(), e["key"].get<std::string>());
    if (e.contains("error")) {
      fmt::print("    ERROR {}\n", e["error"].get<std::string>());
    } else {
      fmt::print("    {}\n", e["entry"].dump());
    }
  }
  if (out.empty()) fmt::print("no remote cache entries on {} for {}\n", url, device_kind());
  return kExitSuccess;
}

int cache_merge_into_store(const std::vector<std::string>& files, const std::string& url) {
  AutotuningResult r = AutotuningResult::load(files.at(0));
  for (size_t i = 1; i < files.size(); ++i) r = r | AutotuningResult::load(files[i]);
  const auto store = open_store(url);
  const int n = RemoteCache::global().publish(r, store.get());
  int winners = 0;
  for (const auto& [b, d] : r.data()) winners += d.has_success();
  fmt::print("merged {} files into {} ({} of {} keys published)\n", files.size(), store->describe(),
             n, winners);
  return n == winners ? kExitSuccess : kExitWorkFailed;
}

int cache_verify_store(const std::string& url) {
  const auto store = open_store(url);
  int bad = 0, good = 0;
  for_each_store_entry(
      *store, "",
      [&](const OpFamily& fam, const Implementation& impl, const std::string& h,
          const std::string& key, const std::string& value, const std::string& error) {
        try {
          if (!error.empty()) throw std::runtime_error(error);
          fam.bind_json(parse_json(key, h + " key"), impl.name());
          impl.config_from_json(parse_json(value, h + " " + key).at("config"));
          ++good;
        } catch (const std::exception& e) {
          ++bad;
          fmt::print("BAD  {} {}: {}\n", h, key, e.what());
        }
      });
  fmt::print("{} {} ({} entries for {}, {} bad)\n", bad ? "BAD " : "ok  ", store->describe(),
             good + bad, device_kind(), bad);
  return bad ? kExitWorkFailed : kExitSuccess;
}

}  // namespace tokamax::cli
