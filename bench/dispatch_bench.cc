// The dispatch hot path: resolving a config that is already in memory (disk cache loaded /
// AutotuningScope) must cost well under a microsecond. Measures bind + ladder, and a whole
// tiny ragged_dot call for scale.
#include <benchmark/benchmark.h>

#include "ops/ragged_dot/base.h"
#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

// A small ragged_dot call and the native implementation.
struct Setup {
  Tensor x = Tensor::randn({16, 64}, DType::kF32, 0);
  Tensor w = Tensor::randn({4, 64, 64}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 4, 4, 4};
  const rdot::Family& fam = rdot::family();
  std::shared_ptr<const Implementation> native = fam.implementation("native");
  rdot::RaggedDotCall probe;
  Setup() { bind(probe); }
  void bind(rdot::RaggedDotCall& c) const {
    rdot::bind_call(c, x, w.spec(), sizes, RaggedDimNums::kForward, {});
  }
};

void BM_BindAndResolve_ScopeHit(benchmark::State& state) {
  Setup s;
  const auto& fam = s.fam;
  const auto& native = s.native;
  const auto& probe = s.probe;
  AutotuningResult r;
  AutotuningData d;
  BenchmarkData b;
  b.median_ms = 1;
  d.set(native->heuristics_config(probe), b);
  r.add(probe.bound.with_implementation("native"), d);
  AutotuningScope scope(r);
  for (auto _ : state) {
    rdot::RaggedDotCall c;
    s.bind(c);
    Resolution res = resolve_config(fam, *native, c, std::nullopt);
    benchmark::DoNotOptimize(res);
    if (res.rung != Rung::kScope) state.SkipWithError("expected a scope hit");
  }
}
BENCHMARK(BM_BindAndResolve_ScopeHit);

void BM_BindAndResolve_DiskCacheHit(benchmark::State& state) {
  Setup s;
  DiskCache::global().put_memory(*s.native, s.probe.bound, s.native->heuristics_config(s.probe));
  for (auto _ : state) {
    rdot::RaggedDotCall c;
    s.bind(c);
    Resolution res = resolve_config(s.fam, *s.native, c, std::nullopt);
    benchmark::DoNotOptimize(res);
    if (res.rung != Rung::kDiskCache) state.SkipWithError("expected a cache hit");
  }
}
BENCHMARK(BM_BindAndResolve_DiskCacheHit);

void BM_ResolveOnly_DiskCacheHit(benchmark::State& state) {
  Setup s;
  DiskCache::global().put_memory(*s.native, s.probe.bound, s.native->heuristics_config(s.probe));
  for (auto _ : state) {
    Resolution res = resolve_config(s.fam, *s.native, s.probe, std::nullopt);
    benchmark::DoNotOptimize(res);
  }
}
BENCHMARK(BM_ResolveOnly_DiskCacheHit);

}  // namespace
