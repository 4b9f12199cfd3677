// The remote cache rung of the resolution ladder: with TOKAMAX_REMOTE_CACHE=redis://... (or
// RemoteCache::global().configure), a call that the scopes and the local disk cache cannot serve
// reads the fleet's shared store (read-through, kept in memory, misses too for a while), and
// tuning in this process (`autotune --into-cache`, the autotune miss policy) publishes there.
//
// Entries live in one hash per (device kind, family, implementation and its version, library
// version): <prefix>cache:{<device kind>}:<family>/<implementation>@v<N>:<version>, field = the
// canonical key, value = {"config": ..., "evidence": ..., "by": ...}. A different device kind or
// version never reads another's entries.
//
// Without a remote cache the rung costs one atomic load. With one, a key's first lookup (and
// one per miss_ttl_s after a miss) is one round trip, made without holding any lock other calls
// need. A lookup waits for the store at most the command timeout (0.5 s) as a whole: opening the
// connection (at the first lookup) and waiting for another thread's lookup on it included, so
// threads that meet a slow store each wait that long at most, not in turn. A store that is down
// costs that once: the failure is logged and the rung is skipped for a back-off period
// (local-only operation); so does a lookup slower than the command timeout's half (a store too
// slow to sit on the call path). Never a hang, never an error for a call that the local ladder
// can serve.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/core/export.h"
#include "tokamax/fleet/store.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct RemoteCacheOptions {
  // Short timeouts: a call waits on them at most once per back-off. The connection is opened by
  // the first lookup, within its 0.5 s. An entry over 1 MiB is refused unread (entries are under
  // 1 KB; a larger one is not this library's, and reading it would cost the call).
  StoreOptions store{0.5, 0.5, /*connect_lazily=*/true, /*max_value_bytes=*/int64_t{1} << 20};
  double backoff_s = 60;   // after a failure, the store is not asked again for this long
  double miss_ttl_s = 30;  // a miss is remembered this long (then asked again)
};

class RemoteCache {
 public:
  static RemoteCache& global();
  // Uses the store at `url` ("" = none); configured from TOKAMAX_REMOTE_CACHE on first use.
  void configure(const std::string& url, RemoteCacheOptions options = {});
  bool enabled();
  std::string url();
  // The stored winner for bound (its implementation) on this device kind and version.
  std::optional<Config> lookup(const Implementation& impl, const BoundArguments& bound,
                               std::string* detail);
  // Publishes every key's winner of `result` (of this device kind); returns how many. Errors
  // are logged, not thrown (the local cache has them). With `store`, writes there instead.
  int publish(const AutotuningResult& result, Store* store = nullptr);
  // Forgets what was read (tests).
  void clear();

  // The hash holding the entries of (impl, family) for `kind` (the current device kind when
  // empty).
  static std::string hash_key(const std::string& prefix, const std::string& family,
                              const Implementation& impl, const std::string& kind = "");

 private:
  RemoteCache() = default;
  void configure_from_env();
  // The store, connected (or null inside a back-off period).
  std::shared_ptr<Store> store();
  void back_off(const std::string& why);
  std::once_flag env_once_;
  std::atomic<bool> enabled_{false};
  std::shared_mutex mu_;  // everything below
  std::string url_;
  RemoteCacheOptions options_;
  std::shared_ptr<Store> store_;
  double down_until_ = 0;
  struct Known {
    std::optional<Config> config;
    std::string detail;
    double expires = 0;  // misses only
  };
  std::unordered_map<std::string, Known> known_;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
