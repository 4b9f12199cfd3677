// Measurement: the one place where tokamax reads clocks. Timing of callables (warm-up, repeat
// until a minimum count and a minimum time, median and interquartile range) and a last-level
// cache flush for cold-cache measurements. Used by the autotuner, `tokamax bench` and the
// roofline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

double now_seconds();  // monotonic

struct SampleStats {
  std::vector<double> samples_ms;
  double median_ms = 0, q1_ms = 0, q3_ms = 0, min_ms = 0;
  double iqr_ms() const { return q3_ms - q1_ms; }
  static SampleStats of(std::vector<double> samples_ms);
};

struct TimingOptions {
  int warmup = 2;
  int min_samples = 10;
  double min_time_s = 0.1;
  int max_samples = 1000;
  double max_time_s = 5.0;  // stop early when a very slow call would exceed this
  bool cold_cache = false;  // flush the last-level cache before every sample (not timed)
  // Calls timed together as one sample; 0 = choose so that a sample takes >= ~20 us (warm only).
  int calls_per_sample = 0;
};

// Times fn(); each sample is the per-call time in milliseconds.
SampleStats time_callable(const std::function<void()>& fn, const TimingOptions& options);

// Evicts the caches by streaming through a buffer twice the last-level cache's size, every
// thread of the kernels' pool reading its share: the cores the pool runs on have their own
// caches swept too (each share is far larger than an L2), and the pool's workers are left
// running (see wake_threads).
void flush_cache();
// Runs an empty job on every thread of the kernels' pool, so that a call timed next finds its
// workers spinning, as back-to-back calls do, rather than asleep: after a pause longer than
// their spin (a cache flush) a worker's wake-up took up to milliseconds in a VM, and a
// memory-bound call measured with it measured the wake-up. Not timed by the caller.
void wake_threads();
// Evicts [data, data + bytes) from every cache level (a flush of each line; written-back where
// dirty): a cold start for a call whose inputs are small next to the last-level cache, at a
// cost in proportion to them rather than to the cache. No-op where the CPU has no such
// instruction.
void evict_range(const void* data, size_t bytes);
// The size of the buffer flush_cache() streams through.
int64_t flush_cache_bytes();

// The bytes of a call's tensors, each input read once and each output written once: the least
// any implementation moves (for a family that counts no traffic of its own).
double call_tensor_bytes(const CallBase& call);
// Whether a call is measured after a cache flush (cold) or back to back (warm), by the
// autotuner and by `tokamax bench --cache-state auto`: cold when its family calls it
// memory-bound and it moves at least one core's L2, whose data a model streams from memory (a
// decode step's weights); warm otherwise, as a model calls a small op whose inputs the op
// before it just wrote (measured cold, a 77-element layer_norm timed the workers' wake-up).
bool measured_cold(const OpFamily& family, const CallBase& call);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
