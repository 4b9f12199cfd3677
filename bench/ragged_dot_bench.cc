// Google Benchmark targets for ragged_dot: native and blas on the smoke and primary specs, called
// as users call them (unpacked weights; native packs or streams inside the timed call), through
// the framework only. `tokamax bench` prints the same comparison with the pre-packed call, ratios
// and roofline percentages.
#include <benchmark/benchmark.h>

#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

void run(benchmark::State& state, const ArgSpec& spec, const std::string& impl_name) {
  const OpFamily& fam = find_family(spec.family);
  auto call = fam.make_call(fam.bind_json(spec.arguments, ""), 0);
  CallBase& c = *call;
  const CallCost cost = fam.cost(c);
  const auto impl = fam.implementation(impl_name);
  const Resolution r = resolve_config(fam, *impl, c, std::nullopt);
  auto prepared = impl->prepare(c, r.config);
  for (auto _ : state) impl->run(c, r.config, prepared.get());
  state.counters["GFLOP/s"] =
      benchmark::Counter(cost.flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(cost.bytes, benchmark::Counter::kIsIterationInvariantRate);
}

const int registered = [] {
  for (const auto& tag : {"smoke", "primary"}) {
    for (const ArgSpec& s : find_arg_specs("ragged_dot", "", tag)) {
      for (const char* impl : {"native", "blas"}) {
        benchmark::RegisterBenchmark(("ragged_dot/" + s.name + "/" + impl).c_str(),
                                     [s, impl](benchmark::State& st) { run(st, s, impl); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  return 0;
}();

}  // namespace
