// Google Benchmark targets for ragged_dot: every implementation on the smoke and primary specs,
// with pre-packed weights for native (packing is done once, as in a model). `tokamax bench`
// prints the same comparison with ratios and roofline percentages.
#include <benchmark/benchmark.h>

#include "ops/ragged_dot/base.h"
#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

void run(benchmark::State& state, const ArgSpec& spec, const std::string& impl_name) {
  const auto& fam = rdot::family();
  auto call = fam.make_call(fam.bind_json(spec.arguments, ""), 0);
  auto& c = static_cast<rdot::RaggedDotCall&>(*call);
  const auto impl = fam.implementation(impl_name);
  const Resolution r = resolve_config(fam, *impl, c, std::nullopt);
  auto prepared = impl->prepare(c, r.config);
  for (auto _ : state) impl->run(c, r.config, prepared.get());
  state.counters["GFLOP/s"] =
      benchmark::Counter(rdot::call_flops(c), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(rdot::weight_bytes(c), benchmark::Counter::kIsIterationInvariantRate);
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
