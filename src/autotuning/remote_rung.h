// The ladder's remote rung as the autotuning layer sees it: a fleet's shared store of tuned
// configs, after the local disk cache. The fleet layer (src/fleet/remote_cache.cc) installs
// its remote cache here (install_remote_rung, op/builtins.h), so that this layer, which the
// fleet's sharded tuning builds on, includes nothing from it.
#pragma once

#include <optional>
#include <string>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/op/op.h"

namespace tokamax {

class RemoteRung {
 public:
  virtual ~RemoteRung() = default;
  virtual std::optional<Config> lookup(const Implementation& impl, const BoundArguments& bound,
                                       std::string* detail) const = 0;
  // Publishes a result tuned here to the fleet (logs its own failures).
  virtual void publish(const AutotuningResult& result) const = 0;
};

// The installed rung, or null (no fleet layer linked in).
const RemoteRung* remote_rung();
void set_remote_rung(const RemoteRung* rung);

}  // namespace tokamax
