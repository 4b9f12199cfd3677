// Timing and cache flushing.
#include "tokamax/autotuning/measurement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/thread_pool.h"
#include "tokamax/core/device.h"
#include "tokamax/core/error.h"
#include "tokamax/core/shape_dtype.h"
#include "tokamax/core/tensor.h"

namespace tokamax {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}
}  // namespace

SampleStats SampleStats::of(std::vector<double> samples) {
  SampleStats s;
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  s.samples_ms = std::move(samples);
  s.median_ms = quantile(sorted, 0.5);
  s.q1_ms = quantile(sorted, 0.25);
  s.q3_ms = quantile(sorted, 0.75);
  s.min_ms = sorted.empty() ? 0 : sorted.front();
  return s;
}

int64_t flush_cache_bytes() { return std::max<int64_t>(2 * device_info().l3_bytes, 8 << 20); }

void evict_range(const void* data, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  const char* p = static_cast<const char*>(data);
  for (size_t i = 0; i < bytes; i += 64) _mm_clflush(p + i);
  if (bytes > 0) _mm_clflush(p + bytes - 1);
  _mm_mfence();
#else
  (void)data;
  (void)bytes;
#endif
}

void flush_cache() {
  static std::once_flag once;
  static std::unique_ptr<Tensor> buffer;
  std::call_once(once, [] {
    buffer = std::make_unique<Tensor>(Tensor::zeros({flush_cache_bytes() / 8}, DType::kF64));
  });
  const double* p = buffer->data_as<double>();
  const int64_t n = buffer->size();
  // Read-only, one load per line: the cache ends up full of clean lines. (A read-modify-write
  // flush leaves it full of dirty lines whose write-back then competes with the measured
  // kernel for memory bandwidth, penalizing exactly the memory-bound kernels.) Every thread
  // reads a contiguous share of the lines; each share also sweeps that core's private caches
  // (its L2 kept up to 2 MiB of the last call's data on Sapphire Rapids, whose L3 does not
  // hold what the L2s hold).
  ThreadPool& pool = ThreadPool::global();
  const int threads = pool.size();
  const int64_t lines = (n + 7) / 8;
  pool.run(threads, [&](int t) {
    double sum = 0;
    for (int64_t l = lines * t / threads; l < lines * (t + 1) / threads; ++l) sum += p[l * 8];
    asm volatile("" ::"x"(sum) : "memory");
  });
}

void wake_threads() {
  ThreadPool& pool = ThreadPool::global();
  pool.run(pool.size(), [](int) {});
}

SampleStats time_callable(const std::function<void()>& fn, const TimingOptions& o) {
  for (int i = 0; i < o.warmup; ++i) fn();
  int per = std::max(1, o.calls_per_sample);
  if (o.calls_per_sample == 0 && !o.cold_cache) {
    // Batch tiny calls so that clock resolution and call overhead do not dominate a sample.
    const double t0 = now_seconds();
    fn();
    const double one = now_seconds() - t0;
    per = one > 20e-6 ? 1
                      : static_cast<int>(std::min(1000.0, std::ceil(20e-6 / std::max(one, 1e-8))));
  }
  std::vector<double> samples;
  const double start = now_seconds();
  while (true) {
    if (o.cold_cache) flush_cache();
    const double t0 = now_seconds();
    for (int i = 0; i < per; ++i) fn();
    const double dt = now_seconds() - t0;
    samples.push_back(dt * 1e3 / per);
    const double elapsed = now_seconds() - start;
    const int n = static_cast<int>(samples.size());
    if (n >= o.max_samples) break;
    if (n >= o.min_samples && elapsed >= o.min_time_s) break;
    if (n >= 3 && elapsed >= o.max_time_s) break;
  }
  return SampleStats::of(std::move(samples));
}

double call_tensor_bytes(const CallBase& call) {
  double bytes = 0;
  for (const ShapeDtype& a : array_arguments(call.bound.arguments()))
    bytes += static_cast<double>(a.bytes());
  for (const TensorView& o : call.outputs) bytes += static_cast<double>(o.spec().bytes());
  return bytes;
}

bool measured_cold(const OpFamily& family, const CallBase& call) {
  if (!family.memory_bound(call)) return false;
  const double counted = family.cost(call).bytes;
  const double bytes = counted > 0 ? counted : call_tensor_bytes(call);
  return bytes >= static_cast<double>(std::max<int64_t>(device_info().l2_bytes, 256 << 10));
}

}  // namespace tokamax
