// The remote cache rung (see tokamax/fleet/remote_cache.h).
#include "tokamax/fleet/remote_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "autotuning/remote_rung.h"
#include "op/builtins.h"
#include "tokamax/core/device.h"
#include "tokamax/core/json.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"
#include "tokamax/op/op.h"

namespace tokamax {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

RemoteCache& RemoteCache::global() {
  static RemoteCache* c = new RemoteCache;  // never destroyed: used from static destructors' time
  return *c;
}

void RemoteCache::configure(const std::string& url, RemoteCacheOptions options) {
  if (!url.empty()) parse_store_url(url);  // InvalidArgument now, not at the first call
  std::call_once(env_once_, [] {});        // the environment no longer applies
  std::unique_lock<std::shared_mutex> lock(mu_);
  url_ = url;
  options_ = options;
  store_.reset();
  down_until_ = 0;
  known_.clear();
  enabled_.store(!url.empty(), std::memory_order_release);
}

void RemoteCache::configure_from_env() {
  const char* env = std::getenv("TOKAMAX_REMOTE_CACHE");
  if (!env || !*env) return;
  try {
    parse_store_url(env);
  } catch (const InvalidArgument& e) {
    TOKAMAX_LOG("remote_cache", kWarning, std::string("TOKAMAX_REMOTE_CACHE ignored: ") + e.what());
    return;
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  url_ = env;
  enabled_.store(true, std::memory_order_release);
}

bool RemoteCache::enabled() {
  std::call_once(env_once_, [this] { configure_from_env(); });
  return enabled_.load(std::memory_order_acquire);
}

std::string RemoteCache::url() {
  enabled();
  std::shared_lock<std::shared_mutex> lock(mu_);
  return url_;
}

void RemoteCache::clear() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  known_.clear();
  down_until_ = 0;
}

std::string RemoteCache::hash_key(const std::string& prefix, const std::string& family,
                                  const Implementation& impl, const std::string& kind) {
  return fmt::format("{}cache:{{{}}}:{}/{}@v{}:{}", prefix, kind.empty() ? device_kind() : kind,
                     family, impl.name(), impl.version(), library_version());
}

void RemoteCache::back_off(const std::string& why) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Threads whose lookups met the same slow store together: one warning, one back-off period.
  if (!store_ && now_s() < down_until_) return;
  store_.reset();
  down_until_ = now_s() + options_.backoff_s;
  TOKAMAX_LOG("remote_cache", kWarning,
              fmt::format("{}; local cache only for {:g} s", why, options_.backoff_s));
}

std::shared_ptr<Store> RemoteCache::store() {
  std::string url;
  StoreOptions so;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (store_) return store_;
    if (now_s() < down_until_) return nullptr;
    url = url_;
    so = options_.store;
  }
  // Opened outside the lock (the connection is made by the first lookup, within its bound); a
  // second thread racing here opens its own and the first one kept wins.
  try {
    std::shared_ptr<Store> s = open_store(url, so);
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (!store_) store_ = std::move(s);
    return store_;
  } catch (const std::exception& e) {
    back_off(e.what());
    return nullptr;
  }
}

std::optional<Config> RemoteCache::lookup(const Implementation& impl, const BoundArguments& bound,
                                          std::string* detail) {
  if (!enabled()) return std::nullopt;
  const std::string id = hash_key("", bound.family(), impl) + "|" + bound.key();
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = known_.find(id);
    if (it != known_.end() && (it->second.config || now_s() < it->second.expires)) {
      if (it->second.config && detail) *detail = it->second.detail;
      return it->second.config;
    }
  }
  const std::shared_ptr<Store> s = store();
  if (!s) return std::nullopt;
  Known k;
  const double t0 = now_s();
  double slow_s = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    slow_s = options_.store.command_timeout_s / 2;
  }
  try {
    const auto v = s->hash_get(hash_key(s->prefix(), bound.family(), impl), bound.key());
    if (v) {
      const Json j = parse_json(*v, s->describe() + " entry " + bound.key());
      k.config = impl.config_from_json(j.at("config"));
      k.detail = s->describe();
      if (j.contains("by") && j["by"].is_string())
        k.detail += " (tuned by " + j["by"].get<std::string>() + ")";
      if (j.contains("evidence") && j["evidence"].is_string())
        k.detail += "; tuned: " + j["evidence"].get<std::string>();
    }
  } catch (const StoreError& e) {
    back_off(e.what());
    return std::nullopt;
  } catch (const std::exception& e) {
    // A corrupt or foreign entry, or a key of another type (StoreKeyError): a warning, then the
    // next rung (as for a local cache file), and the store kept: it answered.
    TOKAMAX_LOG("remote_cache", kWarning, std::string("unusable entry ignored: ") + e.what());
    k.config.reset();
  }
  if (now_s() - t0 > slow_s) {
    back_off(fmt::format("{} answered in {:.0f} ms, too slow for the call path", s->describe(),
                         (now_s() - t0) * 1e3));
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  k.expires = now_s() + options_.miss_ttl_s;
  known_[id] = k;
  if (k.config && detail) *detail = k.detail;
  return k.config;
}

int RemoteCache::publish(const AutotuningResult& result, Store* store) {
  std::shared_ptr<Store> own;
  if (!store) {
    if (!enabled()) return 0;
    own = this->store();
    if (!own) return 0;
    store = own.get();
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  int n = 0;
  try {
    for (const auto& [bound, data] : result.data()) {
      if (!data.has_success()) continue;
      const auto impl = find_family(bound.family()).implementation(bound.implementation());
      const auto& best = data.fastest();
      Json v = {{"config", best.config.json()}, {"by", std::string(host)}};
      if (best.benchmark && best.benchmark->evidence)
        v["evidence"] = best.benchmark->evidence->summary();
      try {
        store->hash_set(hash_key(store->prefix(), bound.family(), *impl, result.device_kind()),
                        bound.key(), v.dump());
        ++n;
      } catch (const StoreKeyError& e) {
        // That entry's hash holds another writer's value: the others are still published.
        TOKAMAX_LOG("remote_cache", kWarning, std::string("not published: ") + e.what());
      }
    }
  } catch (const std::exception& e) {
    TOKAMAX_LOG(
        "remote_cache", kWarning,
        fmt::format("publishing to the remote cache failed after {} entries: {}", n, e.what()));
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  known_.clear();  // what was published must be read, not a remembered miss
  return n;
}

namespace {
// The remote cache as the ladder's remote rung (autotuning/remote_rung.h).
class Rung : public RemoteRung {
 public:
  std::optional<Config> lookup(const Implementation& impl, const BoundArguments& bound,
                               std::string* detail) const override {
    return RemoteCache::global().lookup(impl, bound, detail);
  }
  void publish(const AutotuningResult& result) const override {
    RemoteCache::global().publish(result);
  }
};
}  // namespace

void install_remote_rung() {
  static const Rung rung;
  set_remote_rung(&rung);
}

}  // namespace tokamax
