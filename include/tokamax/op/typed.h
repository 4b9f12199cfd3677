// Typed bases for a family's implementations: the framework's virtuals (which see a CallBase
// and a type-erased Config) are written once here, and an implementation writes its own in its
// family's call type and its config struct. The downcasts are checked (call_as), configs are
// wrapped and unwrapped in one place, and decoding a config always validates it.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/op/config.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// Whether every output of a call has zero elements (zero heads, an empty batch): then there is
// nothing to compute, and an implementation is not run at all, so that no kernel has to guard
// its divisions and blockings against the empty dimensions.
inline bool nothing_to_write(const CallBase& call) {
  if (call.outputs.empty()) return false;
  for (const TensorView& v : call.outputs) {
    if (v.size() != 0) return false;
  }
  return true;
}

// An implementation with a config struct ConfigT (to_json, from_json, operator==).
template <class CallT, class ConfigT>
class TypedImplementation : public Implementation {
 public:
  // Throws Unsupported when this implementation cannot serve the call.
  virtual void check_call(const CallT&) const {}
  // Throws InvalidArgument when the config is invalid here (whatever the call).
  virtual void check_config(const ConfigT&) const {}
  virtual ConfigT heuristics(const CallT& call) const = 0;
  // The search space; every config valid for the call.
  virtual std::vector<ConfigT> search_space(const CallT&) const { return {}; }
  virtual int64_t scratch(const CallT&, const ConfigT&) const { return 0; }
  // The cost model (Implementation::estimate_ms); NaN: none.
  virtual double estimate(const CallT&, const ConfigT&) const;
  virtual void run_call(CallT& call, const ConfigT& config, const Prepared* prepared) const = 0;

  bool has_config() const final { return true; }
  void validate(const CallBase& call) const final { check_call(call_as<CallT>(call)); }
  Config heuristics_config(const CallBase& call) const final {
    return Config::make(heuristics(call_as<CallT>(call)));
  }
  std::vector<Config> autotuning_configs(const CallBase& call) const final {
    std::vector<Config> out;
    for (ConfigT& c : search_space(call_as<CallT>(call))) out.push_back(Config::make(std::move(c)));
    return out;
  }
  Config config_from_json(const Json& j) const final {
    ConfigT c = ConfigT::from_json(j);
    check_config(c);
    return Config::make(std::move(c));
  }
  int64_t scratch_bytes(const CallBase& call, const Config& config) const final {
    return scratch(call_as<CallT>(call), config.get<ConfigT>());
  }
  double estimate_ms(const CallBase& call, const Config& config) const final {
    return estimate(call_as<CallT>(call), config.get<ConfigT>());
  }
  void run(CallBase& call, const Config& config, const Prepared* prepared) const final {
    if (nothing_to_write(call)) return;
    run_call(call_as<CallT>(call), config.get<ConfigT>(), prepared);
  }
};

template <class CallT, class ConfigT>
double TypedImplementation<CallT, ConfigT>::estimate(const CallT&, const ConfigT&) const {
  return std::numeric_limits<double>::quiet_NaN();
}

// An implementation with nothing to tune (the null config).
template <class CallT>
class TypedImplementation<CallT, void> : public Implementation {
 public:
  virtual void check_call(const CallT&) const {}
  virtual void run_call(CallT& call, const Prepared* prepared) const = 0;

  bool has_config() const final { return false; }
  void validate(const CallBase& call) const final { check_call(call_as<CallT>(call)); }
  void run(CallBase& call, const Config&, const Prepared* prepared) const final {
    if (nothing_to_write(call)) return;
    run_call(call_as<CallT>(call), prepared);
  }
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
