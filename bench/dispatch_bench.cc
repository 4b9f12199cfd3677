// The dispatch hot path: resolving a config that is already in memory (disk cache loaded /
// AutotuningScope) must cost well under a microsecond. Measures bind + ladder, and a whole
// tiny ragged_dot call for scale.
#include <benchmark/benchmark.h>

#include "ops/ragged_dot/base.h"
#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

void BM_BindAndResolve_ScopeHit(benchmark::State& state) {
  Tensor x = Tensor::randn({16, 64}, DType::kF32, 0);
  Tensor w = Tensor::randn({4, 64, 64}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 4, 4, 4};
  const auto& fam = rdot::family();
  const auto native = fam.implementation("native");
  rdot::RaggedDotCall probe;
  rdot::bind_call(probe, x, w.spec(), sizes, RaggedDimNums::kForward, {});
  AutotuningResult r;
  AutotuningData d;
  BenchmarkData b;
  b.median_ms = 1;
  d.set(native->heuristics_config(probe), b);
  r.add(probe.bound.with_implementation("native"), d);
  AutotuningScope scope(r);
  for (auto _ : state) {
    rdot::RaggedDotCall c;
    rdot::bind_call(c, x, w.spec(), sizes, RaggedDimNums::kForward, {});
    Resolution res = resolve_config(fam, *native, c, std::nullopt);
    benchmark::DoNotOptimize(res);
    if (res.rung != Rung::kScope) state.SkipWithError("expected a scope hit");
  }
}
BENCHMARK(BM_BindAndResolve_ScopeHit);

void BM_BindAndResolve_DiskCacheHit(benchmark::State& state) {
  Tensor x = Tensor::randn({16, 64}, DType::kF32, 0);
  Tensor w = Tensor::randn({4, 64, 64}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 4, 4, 4};
  const auto& fam = rdot::family();
  const auto native = fam.implementation("native");
  rdot::RaggedDotCall probe;
  rdot::bind_call(probe, x, w.spec(), sizes, RaggedDimNums::kForward, {});
  DiskCache::global().put_memory(*native, probe.bound, native->heuristics_config(probe));
  for (auto _ : state) {
    rdot::RaggedDotCall c;
    rdot::bind_call(c, x, w.spec(), sizes, RaggedDimNums::kForward, {});
    Resolution res = resolve_config(fam, *native, c, std::nullopt);
    benchmark::DoNotOptimize(res);
    if (res.rung != Rung::kDiskCache) state.SkipWithError("expected a cache hit");
  }
}
BENCHMARK(BM_BindAndResolve_DiskCacheHit);

void BM_ResolveOnly_DiskCacheHit(benchmark::State& state) {
  Tensor x = Tensor::randn({16, 64}, DType::kF32, 0);
  Tensor w = Tensor::randn({4, 64, 64}, DType::kF32, 1);
  std::vector<int32_t> sizes = {4, 4, 4, 4};
  const auto& fam = rdot::family();
  const auto native = fam.implementation("native");
  rdot::RaggedDotCall c;
  rdot::bind_call(c, x, w.spec(), sizes, RaggedDimNums::kForward, {});
  DiskCache::global().put_memory(*native, c.bound, native->heuristics_config(c));
  for (auto _ : state) {
    Resolution res = resolve_config(fam, *native, c, std::nullopt);
    benchmark::DoNotOptimize(res);
  }
}
BENCHMARK(BM_ResolveOnly_DiskCacheHit);

}  // namespace
