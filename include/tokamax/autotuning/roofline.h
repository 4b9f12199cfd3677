// This machine's measured ceilings (peak FMA / bf16-dot rates, memory bandwidth), each the
// median of several runs. Benchmarks report results as a percentage of these.
#pragma once

#include "tokamax/core/json.h"

namespace tokamax {

struct Roofline {
  int threads = 1;              // "all threads" = this many
  double f32_gflops_1core = 0;  // peak f32 FMA rate, one core
  double f32_gflops_all = 0;
  double bf16_gflops_1core = 0;  // 0 where the ISA has no bf16 dot
  double bf16_gflops_all = 0;
  double read_gbps_1core = 0;  // large streaming read
  double read_gbps_all = 0;
  double copy_gbps_all = 0;  // large copy, bytes read + written
  Json to_json() const;
};

Roofline measure_roofline();
// Measured once per process (the larger of two measurements per ceiling), then reused.
const Roofline& cached_roofline();

}  // namespace tokamax
