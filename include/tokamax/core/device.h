// DeviceInfo: what this CPU is and can do (vendor, microarchitecture, ISA features, caches,
// cores, threads), read from CPUID and the OS once per process; and device_kind(), the stable
// name under which tuning data for this kind of chip is stored.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct IsaFeatures {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_vnni = false, amx_bf16 = false;
  bool neon = false, sve = false;
  // The x86 ISA levels tokamax's kernels are built for.
  bool has_avx2_fma() const { return avx2 && fma; }
  bool has_avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && fma; }
  bool has_avx512_bf16() const { return has_avx512() && avx512_bf16; }
};

struct DeviceInfo {
  std::string arch;        // "x86_64", "aarch64"
  std::string vendor;      // "AuthenticAMD", "GenuineIntel"
  std::string model_name;  // CPUID brand string
  std::string
      microarch;  // zen4, zen3, sapphirerapids, icelake-server, skylake-x, haswell, generic...
  int family = 0, model = 0;
  IsaFeatures isa;
  int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int physical_cores = 0;
  int threads_available = 0;  // CPUs in this process's affinity mask
  std::string kind;           // device_kind() at detection time

  // The kernels' per-vendor choices (the norms' prefetch, decode's prefetch form) ask this.
  bool is_intel() const { return vendor == "GenuineIntel"; }
  nlohmann::json to_json() const;
};

// Detected once, then cached. Thread-safe.
const DeviceInfo& device_info();
// Lowercase snake_case name of the kind of chip, e.g. "amd_epyc_zen4". TOKAMAX_DEVICE_KIND
// overrides it (read once per process), to inspect or prepare data for another kind of machine.
std::string device_kind();
// Threads tokamax's kernels use: set_num_threads(n) if called, else TOKAMAX_NUM_THREADS, else
// threads_available. Part of every cache key, because it changes which config wins.
int num_threads();
void set_num_threads(int n);  // n <= 0 restores the default
// The kernel set the native implementations run ("avx512_amx", "avx512", "avx2", "portable"):
// the widest this CPU has, capped by TOKAMAX_ISA (portable, avx2, avx512 or amx; read once).
std::string kernel_set();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
