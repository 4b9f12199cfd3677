// This machine's measured ceilings (peak FMA / bf16-dot rates, memory bandwidth), each the
// median of several runs. Benchmarks report results as a percentage of these.
#pragma once

#include <memory>
#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/json.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct Roofline {
  int threads = 1;              // "all threads" = this many
  double f32_gflops_1core = 0;  // peak f32 FMA rate, one core
  double f32_gflops_all = 0;
  double bf16_gflops_1core = 0;  // 0 where the ISA has no bf16 dot
  double bf16_gflops_all = 0;
  // Which unit the bf16 ceiling is: "amx" (tiles, where the kernels use them), "avx512_bf16"
  // (vdpbf16ps) or "" (none).
  std::string bf16_dot_unit;
  double read_gbps_1core = 0;  // large streaming read
  double read_gbps_all = 0;
  double copy_gbps_all = 0;  // large copy (non-temporal stores), bytes read + written
  Json to_json() const;
};

Roofline measure_roofline();

// The memory-read ceiling as a probe a benchmark times beside its own rows: one pass streams
// a buffer far larger than the last-level cache on `threads` threads at once. On a shared
// machine the bandwidth drifts by tens of percent within a minute (a neighbour's traffic), so
// "percent of bandwidth" is only meaningful against a ceiling measured in the same minute.
// `threads` is clamped to the threads the process's pool has.
class ReadProbe {
 public:
  explicit ReadProbe(int threads);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;
  // False where no streaming-read loop exists for this CPU (no AVX2); the passes are then
  // no-ops.
  bool available() const;
  int threads() const { return threads_; }
  double bytes_per_pass() const;  // all threads together
  // Thread t's buffer (floats_per_thread() floats of 1.0), e.g. the source of a copy loop.
  const float* thread_buffer(int t) const;
  int64_t floats_per_thread() const;
  void run_pass() const;  // one read of every thread's buffer, threads in parallel
  // One copy of every thread's buffer into a destination of the same size (allocated on first
  // use), threads in parallel: the ceiling of ops that read and write (bytes_per_pass() read
  // and as many written).
  void run_copy_pass() const;
  // One thread's pass over its own buffer (for a one-core measurement).
  void run_pass_on(int thread) const;

 private:
  struct Buffer;
  int threads_;
  std::unique_ptr<Buffer> buf_;
};

// Measured once per process (the larger of two measurements per ceiling), then reused.
const Roofline& cached_roofline();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
