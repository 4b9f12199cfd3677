// The BLAS that tokamax's baselines (the `composed` and `blas` implementations) run: OpenBLAS,
// and which of its kernel sets it uses. A DYNAMIC_ARCH OpenBLAS picks its kernels once, when it
// is loaded, from the CPU model, and a model it does not know gets an old core type: Debian
// bookworm's 0.3.21 takes Emerald Rapids (family 6, model 207) for Prescott, whose SSE3 sgemm
// ran at 10-14 GFLOP/s there against 122 for its SkylakeX kernels (one core, 1024 x 2048 x
// 1024). A baseline that slow makes every "vs composed" ratio several times too kind, so the
// tokamax command starts itself again with OPENBLAS_CORETYPE set (reexec_with_best_blas), and a
// program that links the library is warned once, by its first baseline call.
#pragma once

#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/json.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct BlasInfo {
  std::string config;  // openblas_get_config()
  std::string core;    // the core type whose kernels run (openblas_get_corename())
  // The newest core type this CPU runs ("" where none is known), or where OpenBLAS was asked
  // for it and ran an older one (a build without its kernels), that older one.
  std::string best;
  std::string detected;        // what OpenBLAS took the CPU for, when reexec_with_best_blas set it
  bool core_from_env = false;  // OPENBLAS_CORETYPE chose `core`
  // `core` is a known older core type than `best`.
  bool weaker() const;
  std::string str() const;  // one line for people
  Json to_json() const;
};
BlasInfo blas_info();

// For a program's main(), first thing: when OpenBLAS runs a weaker core type than this CPU has
// and OPENBLAS_CORETYPE is unset, sets it (and TOKAMAX_BLAS_DETECTED, what OpenBLAS picked
// itself) and executes /proc/self/exe again with the same arguments (OpenBLAS reads the variable
// only when it is loaded). Returns when nothing needed doing, or when the exec failed (logged).
void reexec_with_best_blas(char** argv);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
