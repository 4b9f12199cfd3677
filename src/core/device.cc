// CPU detection from CPUID and Linux sysfs.
#include "tokamax/core/device.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "core/cache_topology.h"
#include "tokamax/core/error.h"
#include "tokamax/core/limits.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TOKAMAX_X86 1
#elif defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tokamax {
namespace {

#ifdef TOKAMAX_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}
bool xgetbv_ok(unsigned mask) {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & mask) == mask;
}
#endif

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// The first word of file `name` of cpu0's cache at `level` (data: the data or unified one, else
// the unified one), from sysfs; "" where there is none.
std::string read_cache_file(int level, bool data, const char* name) {
  for (int idx = 0; idx < 8; ++idx) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
    std::ifstream lf(base + "level"), tf(base + "type"), vf(base + name);
    int lvl = 0;
    std::string type, value;
    if (!(lf >> lvl) || !(tf >> type) || !(vf >> value)) continue;
    if (lvl != level) continue;
    if (data && type == "Instruction") continue;
    if (!data && type != "Unified") continue;
    return value;
  }
  return "";
}

int64_t read_cache_size(int level, bool data) {
  const std::string size = read_cache_file(level, data, "size");
  int64_t v = std::atoll(size.c_str());
  if (!size.empty() && (size.back() == 'K')) v *= 1024;
  if (!size.empty() && (size.back() == 'M')) v *= 1024 * 1024;
  return v;
}

int count_physical_cores() {
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < 4096; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream pf(base + "physical_package_id"), cf(base + "core_id");
    int pkg = 0, core = 0;
    if (!(pf >> pkg) || !(cf >> core)) {
      if (cpu > 0 &&
          access(("/sys/devices/system/cpu/cpu" + std::to_string(cpu)).c_str(), F_OK) != 0)
        break;
      continue;
    }
    cores.insert({pkg, core});
  }
  if (cores.empty()) return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return static_cast<int>(cores.size());
}

int affinity_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string microarch_of(const DeviceInfo& d) {
  if (d.vendor == "AuthenticAMD") {
    if (d.family == 0x19) {
      // Zen 4: models 0x10-0x1f (Genoa), 0x60-0x7f (Phoenix/Raphael), 0xa0-0xaf (Bergamo).
      if ((d.model >= 0x10 && d.model <= 0x1f) || (d.model >= 0x60 && d.model <= 0xaf))
        return "zen4";
      return "zen3";
    }
    if (d.family == 0x1a) return "zen5";
    if (d.family == 0x17) return "zen2";
    return "amd_generic";
  }
  if (d.is_intel() && d.family == 6) {
    switch (d.model) {
      case 0x8f:
        return "sapphirerapids";
      case 0xcf:
        return "emeraldrapids";
      case 0x6a:
      case 0x6c:
        return "icelake-server";
      case 0x55:
        return d.isa.avx512_bf16 ? "cooperlake" : "skylake-x";
      case 0x3c:
      case 0x3f:
      case 0x45:
      case 0x46:
        return "haswell";
      case 0x3d:
      case 0x47:
      case 0x4f:
      case 0x56:
        return "broadwell";
      case 0x4e:
      case 0x5e:
      case 0x8e:
      case 0x9e:
        return "skylake";
      default:
        break;
    }
    if (d.isa.amx_bf16) return "sapphirerapids";
    if (d.isa.has_avx512()) return "intel_avx512";
    return "intel_generic";
  }
  return "generic";
}

std::string snake(const std::string& s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      out += static_cast<char>(std::tolower(u));
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

std::string kind_of(const DeviceInfo& d) {
  std::string brand;
  const std::string m = d.model_name;
  if (m.find("EPYC") != std::string::npos)
    brand = "amd_epyc";
  else if (m.find("Ryzen") != std::string::npos)
    brand = "amd_ryzen";
  else if (m.find("Xeon") != std::string::npos)
    brand = "intel_xeon";
  else if (m.find("Core") != std::string::npos)
    brand = "intel_core";
  else if (d.vendor == "AuthenticAMD")
    brand = "amd";
  else if (d.is_intel())
    brand = "intel";
  else
    brand = snake(d.arch.empty() ? "cpu" : d.arch);
  std::string arch = snake(d.microarch);
  if (arch.rfind("amd_", 0) == 0 || arch.rfind("intel_", 0) == 0)
    arch = arch.substr(arch.find('_') + 1);
  return brand + "_" + arch;
}

DeviceInfo detect() {
  DeviceInfo d;
#ifdef TOKAMAX_X86
  d.arch = "x86_64";
  Regs r0 = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &r0.b, 4);
  std::memcpy(vendor + 4, &r0.d, 4);
  std::memcpy(vendor + 8, &r0.c, 4);
  d.vendor = vendor;
  const unsigned max_leaf = r0.a;
  Regs r1 = cpuid(1);
  const unsigned base_family = (r1.a >> 8) & 0xf, base_model = (r1.a >> 4) & 0xf;
  d.family =
      static_cast<int>(base_family == 0xf ? base_family + ((r1.a >> 20) & 0xff) : base_family);
  d.model = static_cast<int>((base_family == 0x6 || base_family == 0xf)
                                 ? (((r1.a >> 16) & 0xf) << 4) | base_model
                                 : base_model);
  const bool osxsave = (r1.c >> 27) & 1;
  const bool ymm_os = osxsave && xgetbv_ok(0x6);
  const bool zmm_os = osxsave && xgetbv_ok(0xe6);
  d.isa.sse42 = (r1.c >> 20) & 1;
  d.isa.avx = ((r1.c >> 28) & 1) && ymm_os;
  d.isa.fma = ((r1.c >> 12) & 1) && ymm_os;
  d.isa.f16c = ((r1.c >> 29) & 1) && ymm_os;
  if (max_leaf >= 7) {
    Regs r7 = cpuid(7, 0);
    Regs r71 = cpuid(7, 1);
    d.isa.avx2 = ((r7.b >> 5) & 1) && ymm_os;
    d.isa.avx512f = ((r7.b >> 16) & 1) && zmm_os;
    d.isa.avx512dq = ((r7.b >> 17) & 1) && zmm_os;
    d.isa.avx512bw = ((r7.b >> 30) & 1) && zmm_os;
    d.isa.avx512vl = ((r7.b >> 31) & 1) && zmm_os;
    d.isa.avx512_vnni = ((r7.c >> 11) & 1) && zmm_os;
    d.isa.avx512_bf16 = ((r71.a >> 5) & 1) && zmm_os;
    d.isa.amx_bf16 = (r7.d >> 22) & 1;
  }
  Regs e0 = cpuid(0x80000000);
  if (e0.a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r.a, 4);
      std::memcpy(brand + 16 * i + 4, &r.b, 4);
      std::memcpy(brand + 16 * i + 8, &r.c, 4);
      std::memcpy(brand + 16 * i + 12, &r.d, 4);
    }
    d.model_name = trim(brand);
  }
#elif defined(__aarch64__)
  d.arch = "aarch64";
  d.isa.neon = true;  // mandatory in AArch64
#ifdef HWCAP_SVE
  d.isa.sve = (getauxval(AT_HWCAP) & HWCAP_SVE) != 0;
#endif
#else
  d.arch = "unknown";
#endif
  d.microarch = microarch_of(d);
  d.l1d_bytes = read_cache_size(1, true);
  d.l2_bytes = read_cache_size(2, false);
  d.l3_bytes = read_cache_size(3, false);
  if (d.l1d_bytes == 0) d.l1d_bytes = 32 << 10;
  if (d.l2_bytes == 0) d.l2_bytes = 1 << 20;
  if (d.l3_bytes == 0) d.l3_bytes = 32 << 20;
  d.physical_cores = count_physical_cores();
  d.threads_available = affinity_threads();
  d.kind = kind_of(d);
  return d;
}

std::atomic<int> g_num_threads{0};

}  // namespace

bool last_level_cache_serves_all_cpus() {
  static const bool all = [] {
    const std::string list = read_cache_file(3, false, "shared_cpu_list");
    if (list.empty()) return false;
    int64_t cpus = 0;  // "0-7,16-23" -> 16
    std::stringstream ss(list);
    for (std::string part; std::getline(ss, part, ',');) {
      const size_t dash = part.find('-');
      cpus += dash == std::string::npos
                  ? 1
                  : std::atoll(part.c_str() + dash + 1) - std::atoll(part.c_str()) + 1;
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 && cpus >= online;
  }();
  return all;
}

nlohmann::json DeviceInfo::to_json() const {
  nlohmann::json isa_json = {{"sse4.2", isa.sse42},
                             {"avx", isa.avx},
                             {"avx2", isa.avx2},
                             {"fma", isa.fma},
                             {"f16c", isa.f16c},
                             {"avx512f", isa.avx512f},
                             {"avx512bw", isa.avx512bw},
                             {"avx512vl", isa.avx512vl},
                             {"avx512dq", isa.avx512dq},
                             {"avx512_bf16", isa.avx512_bf16},
                             {"avx512_vnni", isa.avx512_vnni},
                             {"amx-bf16", isa.amx_bf16},
                             {"neon", isa.neon},
                             {"sve", isa.sve}};
  return {{"arch", arch},
          {"vendor", vendor},
          {"model_name", model_name},
          {"microarch", microarch},
          {"family", family},
          {"model", model},
          {"isa", isa_json},
          {"l1d_bytes", l1d_bytes},
          {"l2_bytes", l2_bytes},
          {"l3_bytes", l3_bytes},
          {"physical_cores", physical_cores},
          {"threads_available", threads_available},
          {"num_threads", num_threads()},
          {"device_kind", device_kind()}};
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = detect();
  return info;
}

std::string device_kind() {
  // Read once: the kind is on the dispatch hot path and must not change under a running program.
  static const std::string kind = [] {
    if (const char* env = std::getenv("TOKAMAX_DEVICE_KIND"); env && *env) {
      const std::string k = snake(env);
      if (k.empty()) {
        throw InvalidArgument("TOKAMAX_DEVICE_KIND='" + std::string(env) +
                              "' has no letters or digits");
      }
      return k;
    }
    return device_info().kind;
  }();
  return kind;
}

int num_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  static const int from_env = [] {
    const char* env = std::getenv("TOKAMAX_NUM_THREADS");
    if (!env || !*env) return 0;
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (*end != '\0' || v <= 0 || v > kMaxThreads) {
      throw InvalidArgument("TOKAMAX_NUM_THREADS='" + std::string(env) +
                            "': expected an integer in [1, " + std::to_string(kMaxThreads) + "]");
    }
    return static_cast<int>(v);
  }();
  return from_env > 0 ? from_env : device_info().threads_available;
}

void set_num_threads(int n) { g_num_threads.store(n > 0 ? n : 0, std::memory_order_relaxed); }

}  // namespace tokamax
