// The microkernel sets this CPU can run (portable always; AVX2 and AVX-512 where present), for
// tests that sweep every ISA in one process.
#pragma once

#include <vector>

#include "kernels/microkernels.h"
#include "tokamax/core/device.h"

namespace tokamax::testing {

inline std::vector<const kernels::KernelSet*> runnable_sets() {
  std::vector<const kernels::KernelSet*> sets = {&kernels::portable_kernels()};
  const IsaFeatures& f = device_info().isa;
  if (f.has_avx2_fma() && kernels::avx2_kernels()) sets.push_back(kernels::avx2_kernels());
  if (f.has_avx512_bf16() && kernels::avx512_kernels()) sets.push_back(kernels::avx512_kernels());
  return sets;
}

}  // namespace tokamax::testing
