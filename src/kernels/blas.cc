// OpenBLAS's core type against this CPU's (tokamax/core/blas.h).
#include "kernels/blas.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tokamax/core/device.h"
#include "tokamax/core/log.h"

namespace tokamax {

namespace {

constexpr const char* kDetectedVar = "TOKAMAX_BLAS_DETECTED";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

// OpenBLAS's x86-64 core types by the newest vector ISA their sgemm kernels use: SSE (0), AVX (1),
// AVX2 + FMA (2), AVX-512 (3), AVX-512 BF16 (4), AMX (5). A name not here (a newer OpenBLAS's,
// another vendor's) is never called weaker.
int rank_of(const std::string& core) {
  static const std::pair<const char*, int> kRanks[] = {
      {"katmai", 0},        {"coppermine", 0},    {"northwood", 0},  {"prescott", 0},
      {"banias", 0},        {"core2", 0},         {"penryn", 0},     {"dunnington", 0},
      {"nehalem", 0},       {"atom", 0},          {"athlon", 0},     {"opteron", 0},
      {"opteron(sse3)", 0}, {"barcelona", 0},     {"nano", 0},       {"bobcat", 0},
      {"sandybridge", 1},   {"bulldozer", 1},     {"piledriver", 2}, {"steamroller", 2},
      {"excavator", 2},     {"haswell", 2},       {"zen", 2},        {"skylakex", 3},
      {"cooperlake", 4},    {"sapphirerapids", 5}};
  const std::string l = lower(core);
  for (const auto& [name, rank] : kRanks) {
    if (l == name) return rank;
  }
  return -1;
}

// The newest OpenBLAS core type whose kernels this CPU runs.
std::string best_core() {
  const IsaFeatures& isa = device_info().isa;
  if (isa.has_avx512_bf16() && isa.amx_bf16) return "SapphireRapids";
  if (isa.has_avx512_bf16()) return "Cooperlake";
  if (isa.has_avx512()) return "SkylakeX";
  if (isa.has_avx2_fma()) return "Haswell";
  return "";
}

}  // namespace

bool BlasInfo::weaker() const {
  const int r = rank_of(core), b = rank_of(best);
  return r >= 0 && b >= 0 && r < b;
}

std::string BlasInfo::str() const {
  std::string s = "OpenBLAS " + core;
  if (core_from_env) {
    s += " (OPENBLAS_CORETYPE";
    if (!detected.empty()) s += "; it took this CPU for " + detected;
    s += ")";
  }
  if (weaker()) s += "; this CPU runs " + best + ": set OPENBLAS_CORETYPE=" + best;
  return s;
}

Json BlasInfo::to_json() const {
  return {{"library", "OpenBLAS"},          {"config", config},     {"core", core},
          {"core_from_env", core_from_env}, {"detected", detected}, {"best_core", best}};
}

BlasInfo blas_info() {
  BlasInfo c;
  const char* config = openblas_get_config();
  c.config = config ? config : "";
  const char* name = openblas_get_corename();
  c.core = name ? name : "";
  c.best = best_core();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  c.core_from_env = env && *env;
  // Asked for the best core type (by reexec_with_best_blas) and given an older one: this build
  // lacks its kernels (Debian's OpenBLAS 0.3.21 on a Sapphire Rapids VM runs Cooperlake's under
  // OPENBLAS_CORETYPE=SapphireRapids), so the older one is the best it has here.
  if (c.core_from_env && lower(env) == lower(c.best) && rank_of(c.core) >= 0 &&
      rank_of(c.core) < rank_of(c.best))
    c.best = c.core;
  if (const char* d = std::getenv(kDetectedVar); c.core_from_env && d) c.detected = d;
  return c;
}

void reexec_with_best_blas(char** argv) {
  const BlasInfo c = blas_info();
  if (c.core_from_env || !c.weaker()) return;  // a value the user set is kept
  // OpenBLAS reads the variable once, when it is loaded: only a new process image sees it.
  setenv("OPENBLAS_CORETYPE", c.best.c_str(), 1);
  setenv(kDetectedVar, c.core.c_str(), 1);
  execv("/proc/self/exe", argv);
  const int err = errno;
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kDetectedVar);
  log_message("blas", LogLevel::kWarning,
              std::string("could not re-execute with OPENBLAS_CORETYPE=") + c.best + " (" +
                  std::strerror(err) + ")");
}

namespace kernels {

void use_blas(int threads) {
  openblas_set_num_threads(std::max(1, threads));
  static const bool warned = [] {
    const BlasInfo c = blas_info();
    if (c.weaker()) {
      log_message("blas", LogLevel::kWarning,
                  "the baselines' OpenBLAS runs its " + c.core +
                      " kernels on this CPU, which runs " + c.best + "'s: set OPENBLAS_CORETYPE=" +
                      c.best + " before the program starts for OpenBLAS at its speed here");
    }
    return true;
  }();
  (void)warned;
}

}  // namespace kernels
}  // namespace tokamax
