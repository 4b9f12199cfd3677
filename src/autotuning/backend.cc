// The tuning backend of the resolution ladder (see backend.h).
#include "autotuning/backend.h"

#include <atomic>

#include "autotuning/remote_rung.h"
#include "autotuning/scope_stack.h"
#include "op/builtins.h"
#include "tokamax/autotuning/autotuner.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/core/log.h"
#include "tokamax/op/dispatch.h"

namespace tokamax {

namespace {

class Backend : public TuningBackend {
 public:
  std::optional<Config> scope_lookup(const Implementation& impl, const BoundArguments& bound,
                                     std::string* detail) const override {
    const auto& scopes = active_scopes();
    if (scopes.empty()) return std::nullopt;
    const std::string kind = device_kind();
    const std::string id = bound.family() + "/" + impl.name();
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      if ((*it)->device_kind != kind) continue;
      auto f = (*it)->winners.find(id);
      if (f == (*it)->winners.end()) continue;
      auto c = f->second.find(bound.key());
      if (c == f->second.end()) continue;
      if (detail) {
        *detail = (*it)->name;
        if (!c->second.evidence.empty()) *detail += "; tuned: " + c->second.evidence;
      }
      return c->second.config;
    }
    return std::nullopt;
  }
  std::optional<Config> cache_lookup(const Implementation& impl, const BoundArguments& bound,
                                     std::string* detail) const override {
    return DiskCache::global().lookup(impl, bound, detail);
  }
  std::optional<Config> remote_lookup(const Implementation& impl, const BoundArguments& bound,
                                      std::string* detail) const override {
    const RemoteRung* rung = remote_rung();
    return rung ? rung->lookup(impl, bound, detail) : std::nullopt;
  }
  std::optional<Config> autotune_now(const OpFamily&, const Implementation& impl,
                                     const BoundArguments& bound,
                                     std::string* detail) const override {
    AutotuningData data;
    try {
      data = Autotuner().tune(bound);
    } catch (const std::exception& e) {
      TOKAMAX_LOG("autotune", kWarning,
                  "autotune on cache miss failed for " + bound.key() + ": " + e.what());
      return std::nullopt;
    }
    if (!data.has_success()) return std::nullopt;
    const Config best = data.fastest().config;
    DiskCache::global().put_memory(impl, bound, best);
    AutotuningResult r;
    r.add(bound, data);
    try {
      r.dump_cache();
    } catch (const std::exception& e) {
      TOKAMAX_LOG("cache", kWarning, std::string("could not write the user cache: ") + e.what());
    }
    if (const RemoteRung* rung = remote_rung()) rung->publish(r);  // the fleet's too
    if (detail) *detail = "tuned on cache miss";
    return best;
  }
};

const Backend g_backend;
std::atomic<const RemoteRung*> g_remote_rung{nullptr};

}  // namespace

const RemoteRung* remote_rung() { return g_remote_rung.load(std::memory_order_acquire); }
void set_remote_rung(const RemoteRung* rung) { g_remote_rung.store(rung); }

bool already_tuned(const Implementation& impl, const BoundArguments& bound) {
  return !impl.has_config() || g_backend.scope_lookup(impl, bound, nullptr) ||
         g_backend.cache_lookup(impl, bound, nullptr) ||
         g_backend.remote_lookup(impl, bound, nullptr);
}

void install_autotuning_backend() { set_builtin_tuning_backend(&g_backend); }

}  // namespace tokamax
