// The remote cache rung (see tokamax/fleet/remote_cache.h).
#include "tokamax/fleet/remote_cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

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
  std::lock_guard<std::mutex> lock(mu_);
  configured_ = true;
  url_ = url;
  options_ = options;
  store_.reset();
  down_until_ = 0;
  known_.clear();
}

bool RemoteCache::enabled() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!configured_) {
    configured_ = true;
    const char* env = std::getenv("TOKAMAX_REMOTE_CACHE");
    url_ = env ? env : "";
    if (!url_.empty()) {
      try {
        parse_store_url(url_);
      } catch (const InvalidArgument& e) {
        TOKAMAX_LOG("remote_cache", kWarning,
                    std::string("TOKAMAX_REMOTE_CACHE ignored: ") + e.what());
        url_.clear();
      }
    }
  }
  return !url_.empty();
}

std::string RemoteCache::url() {
  enabled();
  std::lock_guard<std::mutex> lock(mu_);
  return url_;
}

void RemoteCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  known_.clear();
  down_until_ = 0;
}

std::string RemoteCache::hash_key(const std::string& prefix, const std::string& family,
                                  const Implementation& impl, const std::string& kind) {
  return fmt::format("{}cache:{{{}}}:{}/{}@v{}:{}", prefix, kind.empty() ? device_kind() : kind,
                     family, impl.name(), impl.version(), library_version());
}

// The store, connected, or null inside a back-off period; mu_ held.
std::unique_ptr<Store> RemoteCache::connect_locked() {
  if (now_s() < down_until_) return nullptr;
  try {
    return open_store(url_, options_.store);
  } catch (const std::exception& e) {
    down_until_ = now_s() + options_.backoff_s;
    TOKAMAX_LOG("remote_cache", kWarning,
                fmt::format("{}; local cache only for {:g} s", e.what(), options_.backoff_s));
    return nullptr;
  }
}

std::optional<Config> RemoteCache::lookup(const Implementation& impl, const BoundArguments& bound,
                                          std::string* detail) {
  if (!enabled()) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const std::string hkey = hash_key("", bound.family(), impl);
  const std::string id = hkey + "|" + bound.key();
  auto it = known_.find(id);
  if (it != known_.end() && (it->second.config || now_s() < it->second.expires)) {
    if (it->second.config && detail) *detail = it->second.detail;
    return it->second.config;
  }
  if (!store_) store_ = connect_locked();
  if (!store_) return std::nullopt;
  Known k;
  try {
    const auto v = store_->hash_get(hash_key(store_->prefix(), bound.family(), impl), bound.key());
    if (v) {
      const Json j = parse_json(*v, store_->describe() + " entry " + bound.key());
      k.config = impl.config_from_json(j.at("config"));
      k.detail = store_->describe();
      if (j.contains("by")) k.detail += " (tuned by " + j["by"].get<std::string>() + ")";
      if (j.contains("evidence") && j["evidence"].is_string())
        k.detail += "; tuned: " + j["evidence"].get<std::string>();
    }
  } catch (const StoreError& e) {
    store_.reset();
    down_until_ = now_s() + options_.backoff_s;
    TOKAMAX_LOG("remote_cache", kWarning,
                fmt::format("{}; local cache only for {:g} s", e.what(), options_.backoff_s));
    return std::nullopt;
  } catch (const std::exception& e) {
    // A corrupt or foreign entry: a warning, then the next rung (as for a local cache file).
    TOKAMAX_LOG("remote_cache", kWarning, std::string("unusable entry ignored: ") + e.what());
    k.config.reset();
  }
  k.expires = now_s() + options_.miss_ttl_s;
  known_[id] = k;
  if (k.config && detail) *detail = k.detail;
  return k.config;
}

int RemoteCache::publish(const AutotuningResult& result, Store* store) {
  std::unique_ptr<Store> own;
  if (!store) {
    if (!enabled()) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    own = connect_locked();
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
      store->hash_set(hash_key(store->prefix(), bound.family(), *impl, result.device_kind()),
                      bound.key(), v.dump());
      ++n;
    }
  } catch (const StoreError& e) {
    TOKAMAX_LOG(
        "remote_cache", kWarning,
        fmt::format("publishing to the remote cache failed after {} entries: {}", n, e.what()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  known_.clear();  // what was published must be read, not a remembered miss
  return n;
}

}  // namespace tokamax
