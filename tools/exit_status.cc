// The one exit-status rule of the `tokamax` command (tools/commands.h, README "Exit status").
#include <fmt/format.h>

#include <typeinfo>

#include "tools/commands.h"

namespace tokamax::cli {

int exit_status_of(const std::exception& e) {
  if (dynamic_cast<const InvalidArgument*>(&e) != nullptr) return kExitBadInput;
  // A reader that let a mistyped JSON field through: still the input's fault.
  if (dynamic_cast<const Json::exception*>(&e) != nullptr) return kExitBadInput;
  return kExitWorkFailed;
}

int report_failed_keys(const AutotuningResult& r) {
  int failed = 0;
  for (const auto& [b, d] : r.data()) {
    if (d.has_success()) continue;
    ++failed;
    fmt::print(stderr, "tokamax: no config of {} / {} ran for key {}\n", b.family(),
               b.implementation(), b.key());
  }
  if (failed == 0 && !r.data().empty()) return kExitSuccess;
  if (r.data().empty())  // every key skipped (the budget ran out, or it failed before tuning)
    fmt::print(stderr, "tokamax: nothing was tuned\n");
  else
    fmt::print(stderr, "tokamax: {} of {} keys have no result\n", failed, r.data().size());
  return kExitWorkFailed;
}

int report_failed_rows(const std::vector<BenchRow>& rows) {
  int failed = 0;
  for (const BenchRow& r : rows) failed += r.rung.rfind("error", 0) == 0;
  if (failed == 0) return kExitSuccess;
  fmt::print(stderr, "tokamax: {} of {} bench rows failed (see their config column)\n", failed,
             rows.size());
  return kExitWorkFailed;
}

}  // namespace tokamax::cli
