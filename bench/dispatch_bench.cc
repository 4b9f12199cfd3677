// The dispatch hot path: resolving a config that is already in memory (disk cache loaded /
// AutotuningScope) must cost well under a microsecond. Through the public API only: a whole
// tiny ragged_dot call (bind, ladder, output allocation, kernel) against its kernel alone on
// the same config, so that the difference is the framework's cost per call; and the ladder
// alone on a made call.
#include <benchmark/benchmark.h>

#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

// A small ragged_dot call, the native implementation and the same call made by the family.
struct Setup {
  Tensor x = Tensor::randn({16, 64}, DType::kF32, 0);
  Tensor w = Tensor::randn({4, 64, 64}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 4, 4, 4};
  const OpFamily& fam = find_family("ragged_dot");
  std::shared_ptr<const Implementation> native = fam.implementation("native");
  std::unique_ptr<CallBase> made =
      fam.make_call(fam.bind_json(Json{{"lhs", "f32[16,64]"},
                                       {"rhs", "f32[4,64,64]"},
                                       {"group_sizes", {{"num_groups", 4}, {"total_size", 16}}}},
                                  ""),
                    0);
  Config config = native->heuristics_config(*made);
};

void BM_WholeCall_ScopeHit(benchmark::State& state) {
  Setup s;
  AutotuningResult r;
  AutotuningData d;
  BenchmarkData b;
  b.median_ms = 1;
  d.set(s.config, b);
  r.add(s.made->bound.with_implementation("native"), d);
  AutotuningScope scope(r);
  for (auto _ : state) {
    Tensor out = ragged_dot(s.x, s.w, s.sizes, {.implementation = "native"});
    benchmark::DoNotOptimize(out.data());
  }
  const Resolution res = resolve_config(s.fam, *s.native, *s.made, std::nullopt);
  if (res.rung != Rung::kScope) state.SkipWithError("expected a scope hit");
}
BENCHMARK(BM_WholeCall_ScopeHit);

void BM_KernelOnly(benchmark::State& state) {
  Setup s;
  for (auto _ : state) s.native->run(*s.made, s.config, nullptr);
}
BENCHMARK(BM_KernelOnly);

void BM_ResolveOnly_DiskCacheHit(benchmark::State& state) {
  Setup s;
  DiskCache::global().put_memory(*s.native, s.made->bound, s.config);
  for (auto _ : state) {
    Resolution res = resolve_config(s.fam, *s.native, *s.made, std::nullopt);
    benchmark::DoNotOptimize(res);
    if (res.rung != Rung::kDiskCache) state.SkipWithError("expected a cache hit");
  }
}
BENCHMARK(BM_ResolveOnly_DiskCacheHit);

}  // namespace
