// The roofline measurement: peak loops timed on 1 and all threads; memory loops over buffers
// far larger than the last-level cache.
#include "tokamax/autotuning/roofline.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <optional>
#include <vector>

#include "autotuning/roofline_kernels.h"
#include "core/cache_topology.h"
#include "core/handoff.h"
#include "core/json_field.h"
#include "core/thread_pool.h"
#include "kernels/microkernels.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/autotuning/measurement.h"
#include "tokamax/core/device.h"
#include "tokamax/core/log.h"
#include "tokamax/core/strings.h"
#include "tokamax/core/tensor.h"
#include "tokamax/core/version.h"

namespace tokamax {
namespace {

constexpr int kRuns = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs body(thread) on `threads` threads at once kRuns times; returns the median of
// work_per_thread * threads / seconds.
template <class Body>
double rate(int threads, double work_per_thread, Body body) {
  std::vector<double> rates;
  std::atomic<float> sink{0};
  ThreadPool& pool = ThreadPool::global();
  for (int r = 0; r < kRuns + 1; ++r) {
    const double t0 = now_seconds();
    pool.run(threads, [&](int t) { sink.store(body(t), std::memory_order_relaxed); });
    const double dt = now_seconds() - t0;
    if (r > 0) rates.push_back(work_per_thread * threads / dt);  // run 0 warms up
  }
  return median(rates);
}

// The one-way hand-off time of a cache line between the pool's threads 0 and 1 (ns), the
// median of kRuns runs of kPasses round trips (core/handoff.h); 0 with fewer than two threads or
// where the two shares did not run at once (from inside a pool job, or a share that waited
// more than a second for the other).
double core_to_core_ns(int threads) {
  if (threads < 2) return 0;
  constexpr int64_t kPasses = 20000;
  std::vector<double> times;
  for (int r = 0; r < kRuns; ++r) {
    const double ns = pool_handoff_ns(1, kPasses, kPasses / 10, 1.0);
    if (ns <= 0) return 0;
    times.push_back(ns);
  }
  return median(times);
}

}  // namespace

struct ReadProbe::Buffer {
  int64_t floats = 0;  // in all; 0 where no read loop exists (no AVX2)
  Tensor data;
  Tensor copy_dst;  // run_copy_pass's destination, never read
  std::once_flag copy_once;
  std::atomic<float> sink{0};  // keeps the sums (and so the reads) alive
};

namespace {
// The buffer's floats for `threads` threads: four times the last-level cache for each L3 the
// threads may stream through, and at least 64 MiB a thread, so no pass finds its data cached.
// With only twice the L3 a one-thread pass read 3-20% faster here than over 256 MiB (the L3's
// replacement keeps part of a buffer across passes); with four it did not. Where one L3 serves
// every CPU, four of it in all, not a thread: a VM may report its host socket's (480 MiB on a
// Sapphire Rapids VM: 3.8 GB a pass on 2 threads at four a thread, and as much again for the
// copy's destination, first touching them most of a minute). Elsewhere (a Zen chip's L3 per
// 8-core die, a server's per socket) the threads may each run on their own L3: four a thread.
int64_t probe_floats(int threads) {
  const int64_t l3 = device_info().l3_bytes;
  const int64_t bytes = last_level_cache_serves_all_cpus()
                            ? std::max<int64_t>((int64_t{64} << 20) * threads, 4 * l3)
                            : std::max<int64_t>(int64_t{64} << 20, 4 * l3) * threads;
  return (bytes + 255) / 256 * 64;  // whole 64-float blocks
}

// The threads the roofline's all-thread rows and the bench's probe run on.
int roofline_threads() { return std::min(num_threads(), ThreadPool::global().size()); }
}  // namespace

// Clamped like ThreadPool::run, so bytes_per_pass counts only the threads that read.
ReadProbe::ReadProbe(int threads)
    : threads_(std::clamp(threads, 1, ThreadPool::global().size())), buf_(buffer_for(threads_)) {}

std::shared_ptr<ReadProbe::Buffer> ReadProbe::buffer_for(int threads) {
  // The buffers of the live probes (none when no probe is alive: they are not kept past it).
  static std::mutex mu;
  static std::weak_ptr<Buffer> live;
  const bool can_read = device_info().isa.has_avx2_fma();
  const int64_t floats = can_read ? probe_floats(threads) : 0;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Buffer> buf = live.lock();
  if (buf && buf->floats >= floats) return buf;
  buf = std::make_shared<Buffer>();
  live = buf;
  buf->floats = floats;
  if (floats == 0) return buf;
  // Filled by `threads` threads, each its own share: first touching a page is the kernel's
  // (and on a VM the host's) work, which the threads do side by side.
  buf->data = Tensor({floats}, DType::kF32);
  float* data = buf->data.data_as<float>();
  const int64_t share = (floats + threads - 1) / threads;
  ThreadPool::global().run(threads, [&](int t) {
    const int64_t begin = std::min(floats, share * t);
    std::fill(data + begin, data + std::min(floats, begin + share), 1.0f);
  });
  return buf;
}

ReadProbe::~ReadProbe() = default;

bool ReadProbe::available() const { return buf_->floats > 0; }

double ReadProbe::whole_bytes() const { return static_cast<double>(buf_->floats) * 4; }

// The whole buffer split among this probe's threads (in whole 16-float vectors).
int64_t ReadProbe::floats_per_thread() const { return buf_->floats / threads_ / 16 * 16; }

double ReadProbe::bytes_per_pass() const {
  return static_cast<double>(floats_per_thread()) * 4 * threads_;
}

const float* ReadProbe::thread_buffer(int t) const {
  return buf_->data.data_as<float>() + floats_per_thread() * t;
}

void ReadProbe::run_pass_on(int thread) const {
  if (!available()) return;
  buf_->sink.store(roofline::read_f32_avx2(thread_buffer(thread), floats_per_thread()),
                   std::memory_order_relaxed);
}

void ReadProbe::run_whole_pass_on_one_thread() const {
  if (!available()) return;
  buf_->sink.store(roofline::read_f32_avx2(buf_->data.data_as<float>(), buf_->floats),
                   std::memory_order_relaxed);
}

void ReadProbe::run_pass() const {
  ThreadPool::global().run(threads_, [&](int t) { run_pass_on(t); });
}

void ReadProbe::run_copy_pass_on(int thread) const {
  if (!available()) return;
  // Not zeroed: each pass writes all of it, the first one touching its pages (the threads'
  // shares side by side; the measurements discard a first pass as warm-up).
  std::call_once(buf_->copy_once, [&] { buf_->copy_dst = Tensor({buf_->floats}, DType::kF32); });
  const int64_t n = floats_per_thread();
  roofline::copy_f32_avx2(thread_buffer(thread), buf_->copy_dst.data_as<float>() + n * thread, n);
}

void ReadProbe::run_copy_pass() const {
  ThreadPool::global().run(threads_, [&](int t) { run_copy_pass_on(t); });
}

Json Roofline::to_json() const {
  return {{"threads", threads},
          {"f32_fma_gflops_1core", f32_gflops_1core},
          {"f32_fma_gflops_all", f32_gflops_all},
          {"bf16_dot_gflops_1core", bf16_gflops_1core},
          {"bf16_dot_gflops_all", bf16_gflops_all},
          {"bf16_dot_unit", bf16_dot_unit},
          {"mem_read_gbps_1core", read_gbps_1core},
          {"mem_read_gbps_all", read_gbps_all},
          {"mem_copy_gbps_all", copy_gbps_all},
          {"core_to_core_ns", core_to_core_ns},
          {"busy", busy()},
          {"warnings", warnings}};
}

Roofline Roofline::from_json(const Json& j, const std::string& source) {
  const std::string what = "roofline (" + source + ")";
  Roofline r;
  r.threads = json_field<int>(j, "threads", what);
  r.f32_gflops_1core = json_field<double>(j, "f32_fma_gflops_1core", what);
  r.f32_gflops_all = json_field<double>(j, "f32_fma_gflops_all", what);
  r.bf16_gflops_1core = json_field<double>(j, "bf16_dot_gflops_1core", what);
  r.bf16_gflops_all = json_field<double>(j, "bf16_dot_gflops_all", what);
  r.bf16_dot_unit = json_field<std::string>(j, "bf16_dot_unit", what);
  r.read_gbps_1core = json_field<double>(j, "mem_read_gbps_1core", what);
  r.read_gbps_all = json_field<double>(j, "mem_read_gbps_all", what);
  r.copy_gbps_all = json_field<double>(j, "mem_copy_gbps_all", what);
  if (j.contains("core_to_core_ns"))
    r.core_to_core_ns = json_field<double>(j, "core_to_core_ns", what);
  if (j.contains("warnings"))
    r.warnings = json_field<std::vector<std::string>>(j, "warnings", what);
  return r;
}

void check_core_scaling(Roofline& r, int cores, double margin) {
  cores = std::max(1, std::min(cores, r.threads));
  if (cores < 2) return;
  const auto check = [&](const char* name, double one, double all) {
    if (one <= 0 || all <= 0 || all >= margin * cores * one) return;
    r.warnings.push_back(fmt::format(
        "busy machine: the {} rate on all {} threads ({:.1f} GFLOP/s) is {:.2f}x the one-core "
        "rate ({:.1f}), where {} cores should give about {}x; another process is using the "
        "cores and every percentage of this ceiling reads high",
        name, r.threads, all, all / one, one, cores, cores));
  };
  check("f32 FMA", r.f32_gflops_1core, r.f32_gflops_all);
  check("bf16 dot", r.bf16_gflops_1core, r.bf16_gflops_all);
}

std::string known_ceilings_path(const std::string& dir) {
  return dir + "/" + device_kind() + "/roofline.json";
}

namespace {

// A known ceilings file, or nothing (missing; unreadable ones are skipped with a warning).
std::optional<Roofline> read_known_ceilings(const std::string& path, std::string* when) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    const Json j = read_json_file(path);
    *when = j.value("measured", std::string());
    return Roofline::from_json(j.at("roofline"), path);
  } catch (const std::exception& e) {
    log_once("roofline", LogLevel::kWarning,
             "ignoring the known ceilings file " + path + ": " + e.what());
    return std::nullopt;
  }
}

}  // namespace

std::vector<std::string> compare_with_known_ceilings(const Roofline& now, double tolerance) {
  std::vector<std::string> out;
  // Memory ceilings against this machine's own last quiet figures only, and with twice the
  // tolerance: they depend on the host (a VM's two vCPUs on one die or on two read 40-45 or
  // 65-72 GB/s on Zen 4), where the compute ceilings are the chip kind's.
  const auto compare = [&](const std::string& path, const char* which, bool memory_too) {
    std::string when;
    const auto known = read_known_ceilings(path, &when);
    if (!known || known->threads != now.threads) return;
    const auto one = [&](const char* name, bool memory, double was, double is) {
      const char* unit = memory ? "GB/s" : "GFLOP/s";
      const double tol = memory ? 2 * tolerance : tolerance;
      if (was <= 0 || is <= 0 || (is / was >= 1 / (1 + tol) && is / was <= 1 + tol)) return;
      out.push_back(fmt::format(
          "the {} ceiling measured now ({:.1f} {}) is {:.2f}x the {} one ({:.1f}{}{}): {}; {}",
          name, is, unit, is / was, which, was, when.empty() ? "" : ", ", when,
          is < was ? "the machine may be busy" : "the other figure came from a busier machine",
          memory ? "cold rows use the ceiling timed in their own rounds"
                 : fmt::format("the percentages use {:.1f}", is)));
    };
    one("f32 FMA", false, known->f32_gflops_all, now.f32_gflops_all);
    one("bf16 dot", false, known->bf16_gflops_all, now.bf16_gflops_all);
    if (!memory_too) return;
    one("memory read", true, known->read_gbps_all, now.read_gbps_all);
    one("memory copy", true, known->copy_gbps_all, now.copy_gbps_all);
  };
  compare(known_ceilings_path(shipped_cache_dir()), "shipped", false);
  compare(known_ceilings_path(user_cache_dir()), "last quiet", true);
  return out;
}

void remember_ceilings(const Roofline& r) {
  if (r.busy()) return;
  try {
    const std::string path = known_ceilings_path(user_cache_dir());
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    const Json j = {{"device_kind", device_kind()},
                    {"measured", utc_now()},
                    {"tokamax_version", library_version()},
                    {"roofline", r.to_json()}};
    write_file_atomic(path, j.dump(1));
  } catch (const std::exception& e) {
    log_once("roofline", LogLevel::kWarning,
             std::string("could not record this machine's ceilings: ") + e.what());
  }
}

Roofline measure_roofline() {
  const DeviceInfo& dev = device_info();
  Roofline r;
  r.threads = roofline_threads();
  const int64_t iters = 4'000'000;  // ~50 ms per run at peak
  if (dev.isa.has_avx512()) {
    const double flops = static_cast<double>(iters) * 12 * 16 * 2;
    r.f32_gflops_1core = rate(1, flops, [&](int) { return roofline::fma_f32_avx512(iters); }) / 1e9;
    r.f32_gflops_all =
        rate(r.threads, flops, [&](int) { return roofline::fma_f32_avx512(iters); }) / 1e9;
  }
  if (dev.isa.has_avx2_fma()) {
    const double flops = static_cast<double>(iters) * 12 * 8 * 2;
    // On some chips (Zen 4) 256-bit FMAs reach the same or a higher rate: take the best ISA.
    r.f32_gflops_1core =
        std::max(r.f32_gflops_1core,
                 rate(1, flops, [&](int) { return roofline::fma_f32_avx2(iters); }) / 1e9);
    r.f32_gflops_all =
        std::max(r.f32_gflops_all,
                 rate(r.threads, flops, [&](int) { return roofline::fma_f32_avx2(iters); }) / 1e9);
  }
  if (kernels::best_kernels().amx) {
    // The bf16 dot the kernels use: AMX tiles (16 cycles per TDPBF16PS, 16K flops each).
    const int64_t amx_iters = iters / 16;
    const double flops = static_cast<double>(amx_iters) * 4 * 16384;
    r.bf16_dot_unit = "amx";
    r.bf16_gflops_1core =
        rate(1, flops, [&](int) { return roofline::dot_bf16_amx(amx_iters); }) / 1e9;
    r.bf16_gflops_all =
        rate(r.threads, flops, [&](int) { return roofline::dot_bf16_amx(amx_iters); }) / 1e9;
  } else if (dev.isa.has_avx512_bf16()) {
    r.bf16_dot_unit = "avx512_bf16";
    const double flops = static_cast<double>(iters) * 12 * 16 * 4;
    r.bf16_gflops_1core =
        rate(1, flops, [&](int) { return roofline::dot_bf16_avx512(iters); }) / 1e9;
    r.bf16_gflops_all =
        rate(r.threads, flops, [&](int) { return roofline::dot_bf16_avx512(iters); }) / 1e9;
  }
  const ReadProbe probe(r.threads);
  if (probe.available()) {
    const double per_thread_bytes = 4.0 * static_cast<double>(probe.floats_per_thread());
    r.read_gbps_1core = rate(1, probe.whole_bytes(),
                             [&](int) {
                               probe.run_whole_pass_on_one_thread();
                               return 0.f;
                             }) /
                        1e9;
    r.read_gbps_all = rate(r.threads, per_thread_bytes,
                           [&](int t) {
                             probe.run_pass_on(t);
                             return 0.f;
                           }) /
                      1e9;
    r.copy_gbps_all = rate(r.threads, 2 * per_thread_bytes,
                           [&](int t) {
                             probe.run_copy_pass_on(t);
                             return 0.f;
                           }) /
                      1e9;
  }
  r.core_to_core_ns = core_to_core_ns(r.threads);
  return r;
}

const Roofline& cached_roofline() {
  // Two measurements, the larger median of each: on a shared machine a neighbour's burst
  // lowers a measurement and never raises it, so the larger one is nearer the ceiling.
  static const Roofline r = [] {
    // One probe held across both: they share its buffers instead of first touching their own.
    const ReadProbe shared(roofline_threads());
    const Roofline a = measure_roofline(), b = measure_roofline();
    Roofline m = a;
    m.f32_gflops_1core = std::max(a.f32_gflops_1core, b.f32_gflops_1core);
    m.f32_gflops_all = std::max(a.f32_gflops_all, b.f32_gflops_all);
    m.bf16_gflops_1core = std::max(a.bf16_gflops_1core, b.bf16_gflops_1core);
    m.bf16_gflops_all = std::max(a.bf16_gflops_all, b.bf16_gflops_all);
    m.read_gbps_1core = std::max(a.read_gbps_1core, b.read_gbps_1core);
    m.read_gbps_all = std::max(a.read_gbps_all, b.read_gbps_all);
    m.copy_gbps_all = std::max(a.copy_gbps_all, b.copy_gbps_all);
    // A latency: the lower one (a neighbour only adds to it), of those measured (0: not).
    m.core_to_core_ns = a.core_to_core_ns > 0 && b.core_to_core_ns > 0
                            ? std::min(a.core_to_core_ns, b.core_to_core_ns)
                            : std::max(a.core_to_core_ns, b.core_to_core_ns);
    check_core_scaling(m,
                       device_info().physical_cores > 0 ? device_info().physical_cores : m.threads);
    // Two measurements a second apart that disagree: the machine changed under them.
    const auto spread = [&](const char* name, double x, double y) {
      if (x > 0 && y > 0 && std::max(x, y) > 1.2 * std::min(x, y))
        m.warnings.push_back(fmt::format(
            "unsteady machine: two measurements of the {} ceiling a second apart gave {:.1f} "
            "and {:.1f} (the larger is used)",
            name, x, y));
    };
    spread("f32 FMA", a.f32_gflops_all, b.f32_gflops_all);
    spread("memory read", a.read_gbps_all, b.read_gbps_all);
    return m;
  }();
  return r;
}

}  // namespace tokamax
