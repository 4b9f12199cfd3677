// Internal: the thread-local stack of AutotuningScope overlays, read by the ladder.
#pragma once

#include <memory>
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

const std::vector<std::shared_ptr<const ScopeOverlay>>& active_scopes();

}  // namespace tokamax
