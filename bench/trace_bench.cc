// The cost of the trace recorder per op call. With tracing off dispatch pays one relaxed atomic
// load; with a TraceSession live it builds the payload JSON and appends one event under a mutex.
// Run: build/release/bench/tokamax_bench --benchmark_filter='BM_TinyRaggedDot|BM_TracingOff'

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "tokamax/tokamax.h"

namespace {

using namespace tokamax;

// A call so small (1 row, 8x8 weights) that the framework's per-call cost dominates.
void BM_TinyRaggedDot(benchmark::State& state) {
  const bool traced = state.range(0) != 0;
  const Tensor x = Tensor::randn({1, 8}, DType::kF32, 0);
  const Tensor w = Tensor::randn({1, 8, 8}, DType::kF32, 1);
  const std::vector<int32_t> sizes = {1};
  const auto path = std::filesystem::temp_directory_path() /
                    ("tokamax_trace_bench_" + std::to_string(getpid()) + ".json");
  // The first call outside the timed loop: cache-miss warning, thread pool start.
  benchmark::DoNotOptimize(ragged_dot(x, w, sizes));
  std::optional<TraceSession> session;
  if (traced) session.emplace(path.string());
  if (tracing_enabled() != traced) state.SkipWithError("TOKAMAX_TRACE is set; unset it");
  for (auto _ : state) {
    Tensor y = ragged_dot(x, w, sizes);
    benchmark::DoNotOptimize(y);
  }
  if (session) {
    state.counters["events"] = static_cast<double>(session->num_events());
    session->close();
    std::filesystem::remove(path);
  }
}
BENCHMARK(BM_TinyRaggedDot)->ArgName("tracing")->Arg(0)->Arg(1);

// What tracing-off adds to every call: the check dispatch makes inline (one relaxed load of an
// internal flag; `objdump -d` shows a movzbl + test + branch), timed here through the exported
// function that reads the same flag, so an upper bound (it adds a call through the PLT).
void BM_TracingOffCheck(benchmark::State& state) {
  if (calls_observed()) state.SkipWithError("tracing is on; unset TOKAMAX_TRACE");
  for (auto _ : state) benchmark::DoNotOptimize(calls_observed());
}
BENCHMARK(BM_TracingOffCheck);

}  // namespace
