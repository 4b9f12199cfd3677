// Internal: the thread-local stack of AutotuningScope overlays, read by the ladder.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokamax/op/config.h"

namespace tokamax {

struct ScopeOverlay {
  std::string device_kind;
  std::string name;
  struct Winner {
    Config config;
    std::string evidence;  // the tuner's evidence for it, one line ("" when none was recorded)
  };
  // "family/implementation" -> key -> winning config.
  std::unordered_map<std::string, std::unordered_map<std::string, Winner>> winners;
};

// One thread's scopes, innermost last. Only the owning thread pushes and reads; a scope
// destroyed on another thread erases itself under the lock.
struct ScopeStack {
  std::mutex mu;
  std::vector<std::shared_ptr<const ScopeOverlay>> scopes;
  std::atomic<size_t> size{0};  // scopes.size(): the common empty case takes no lock
};

// This thread's active scopes, innermost last (a copy: another thread may remove one).
std::vector<std::shared_ptr<const ScopeOverlay>> active_scopes();

}  // namespace tokamax
