// Whether the bf16 dot pays (bf16_dot.h): per microarchitecture, or the peak loops timed once.
#include "autotuning/bf16_dot.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "autotuning/roofline_kernels.h"
#include "kernels/microkernels.h"
#include "tokamax/autotuning/measurement.h"
#include "tokamax/core/device.h"
#include "tokamax/core/error.h"

namespace tokamax {

using kernels::best_kernels;

bool bf16_dot_pays() {
  static const bool pays = [] {
    if (const char* env = std::getenv("TOKAMAX_BF16_DOT"); env && *env) {
      const std::string s = env;
      if (s != "0" && s != "1")
        throw InvalidArgument("TOKAMAX_BF16_DOT='" + s + "': expected 0 or 1");
      return s == "1" && best_kernels().bf16 != nullptr;
    }
    if (best_kernels().bf16 == nullptr) return false;
    if (best_kernels().amx) return true;  // ~15x the f32 FMA's flops (microkernels_amx.cc)
    // Measured by `tokamax device --roofline`: Zen 4 runs vdpbf16ps at twice the f32 FMA's
    // flops, Sapphire and Emerald Rapids at half of them (84 vs 165 GFLOP/s a core).
    const std::string& arch = device_info().microarch;
    if (arch.rfind("zen", 0) == 0) return true;
    if (arch == "sapphirerapids" || arch == "emeraldrapids") return false;
    // Any other CPU: both peak loops briefly (a few milliseconds, once per process).
    TimingOptions t;
    t.warmup = 1;
    t.min_samples = 3;
    t.min_time_s = 0;
    t.calls_per_sample = 1;
    constexpr int64_t kIters = 100000;
    volatile float sink = 0;
    const double fma_ms =
        time_callable([&] { sink = sink + roofline::fma_f32_avx512(kIters); }, t).min_ms;
    const double dot_ms =
        time_callable([&] { sink = sink + roofline::dot_bf16_avx512(kIters); }, t).min_ms;
    // Per iteration the dot does twice the FMA loop's flops.
    return 2 * fma_ms > 1.1 * dot_ms;
  }();
  return pays;
}

bool vector_bf16_dot_pays() {
  return bf16_dot_pays() && !best_kernels().amx && best_kernels().dot_stream_t != nullptr;
}

}  // namespace tokamax
