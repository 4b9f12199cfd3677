// This machine's measured ceilings (peak FMA / bf16-dot rates, memory bandwidth), each the
// median of several runs. Benchmarks report results as a percentage of these.
#pragma once

#include <memory>
#include <string>
#include <vector>

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
  // One-way time (ns) of a cache line handed back and forth between the pool's first two
  // threads; 0 with one thread. Tens of ns where they share a last-level cache; well over a
  // hundred where they sit on different dies, which also gives them separate paths to memory
  // (a 2-vCPU Zen 4 VM moved between the two from minute to minute: docs/performance-log.md,
  // "layer_norm and rms_norm", fourteenth measurement round).
  double core_to_core_ns = 0;
  // Signs that the machine was busy while these were measured (empty: none seen): the all-core
  // FMA rate short of the cores times the one-core rate, or two measurements that disagree.
  // A neighbour only ever lowers a ceiling, and every percentage against a lowered one rises.
  std::vector<std::string> warnings;
  bool busy() const { return !warnings.empty(); }
  // "busy" and "warnings" included; from_json reads what to_json writes (InvalidArgument
  // naming a missing or mistyped field).
  Json to_json() const;
  static Roofline from_json(const Json& j, const std::string& source);
};

// Appends to r.warnings when the all-core FMA rate (f32, and the bf16 dot's) is below
// `margin` times the one-core rate times the cores the threads run on (SMT siblings share
// their core's FMA units, so `cores` is min(threads, physical cores)).
void check_core_scaling(Roofline& r, int cores, double margin = 0.8);

// The ceilings this kind of machine is known to reach: `shipped` (data/autotuning/<kind>/
// roofline.json, measured on a quiet machine of the kind) and the last quiet measurement here
// (<user cache dir>/<kind>/roofline.json). Where `now` is outside [1/(1+tolerance), 1+tolerance]
// times one of them on a compute ceiling (memory ceilings: the last quiet ones only, twice the
// tolerance), one line each saying which, by how much and which figure the percentages use.
std::vector<std::string> compare_with_known_ceilings(const Roofline& now, double tolerance = 0.25);
// Records `r` as the last quiet measurement of this machine (atomically; nothing when r.busy()).
void remember_ceilings(const Roofline& r);
std::string known_ceilings_path(const std::string& dir);  // <dir>/<device kind>/roofline.json

Roofline measure_roofline();

// The memory-read ceiling as a probe a benchmark times beside its own rows: one pass streams
// a buffer far larger than the last-level cache on `threads` threads at once. On a shared
// machine the bandwidth drifts by tens of percent within a minute (a neighbour's traffic), so
// "percent of bandwidth" is only meaningful against a ceiling measured in the same minute.
// `threads` is clamped to the threads the process's pool has.
// Probes alive at the same time share their buffer (four times the last-level cache for each
// L3 the threads may use, at least 64 MiB a thread, and as much again for a copy's destination:
// gigabytes where a VM reports its socket's L3), each splitting it among its own threads: first
// touching it is most of the time a benchmark run spends outside its rows, so a caller that
// times several ceilings in a row (cached_roofline, `tokamax bench`) holds one probe across
// them. Probes sharing a buffer share the copy's destination too: copy passes of two such
// probes at the same time write the same floats (all 1.0; nothing reads them).
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
  // Thread t's share of the probe's buffer (floats_per_thread() floats of 1.0; the threads'
  // shares together are the buffer, four times the last-level cache or more), e.g. the source
  // of a copy loop.
  const float* thread_buffer(int t) const;
  int64_t floats_per_thread() const;
  void run_pass() const;  // one read of every thread's buffer, threads in parallel
  // One copy of every thread's buffer into a destination of the same size (allocated on first
  // use), threads in parallel: the ceiling of ops that read and write (bytes_per_pass() read
  // and as many written).
  void run_copy_pass() const;
  // One thread's pass over its own buffer, and its copy.
  void run_pass_on(int thread) const;
  void run_copy_pass_on(int thread) const;
  // The calling thread reads every thread's buffer (whole_bytes(), at least four times the
  // last-level cache): the one-core read ceiling.
  void run_whole_pass_on_one_thread() const;
  double whole_bytes() const;

 private:
  struct Buffer;
  // The live probes' buffer if it is large enough for `threads` threads, else a new one.
  static std::shared_ptr<Buffer> buffer_for(int threads);
  int threads_;
  std::shared_ptr<Buffer> buf_;  // shared with the other live probes
};

// Measured once per process (the larger of two measurements per ceiling), then reused.
const Roofline& cached_roofline();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
