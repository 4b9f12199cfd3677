// Does this machine overlap a memory read stream with arithmetic on the data read? Memory-bound
// kernels (attention decode, the norms) read a stream and compute on each piece of it; their
// share of the read ceiling depends on whether the compute hides under the reads (time = max)
// or adds to them (time = sum). A plain program, interleaved rounds, every thread streaming its
// own buffer (larger than the last-level cache) at once:
//   read      the stream alone (vector loads summed), GB/s over all threads;
//   compute   the same loop over an L1-resident KiB, ns per KiB per thread, less the same loop
//             without the FMAs (its loads and sums, which the read pays too);
//   both      the stream with the compute after each KiB, without software prefetch;
//   both+pf   the same, each KiB also prefetching the KiB --ahead KiB on (default 16) with
//             --hint (t1, into L2, by default; t0 into L1);
//   batch     each 16 KiB read first with loads alone (one a line), then the compute of its
//             KiBs from cache: the serial schedule, for comparison;
// for several amounts of compute per KiB (--work: groups of 12 FMAs that use the data). It
// prints per round-median ns per KiB a thread, the stream's share of the read rate (the faster
// of both and both+pf), and for each schedule the overlap: (read + compute - time) / compute, 1
// when the compute hides entirely under the reads, 0 when the two add up, below 0 when together
// they take longer than one after the other.
// Usage: tokamax_overlap_bench [--rounds N (1-1000)] [--threads T (1 to the cores)] [--work
// W[,W...] (0-1024)] [--hint t0|t1] [--ahead KiB (1-1024)]
// What it showed on a Sapphire Rapids VM (2 threads, 2026-12-06; `--rounds 5 --work 4,8,12,16`
// twice and `--rounds 3 --work 8,12,16` once, each with --hint t0 and t1, --ahead 16): at W = 8
// (compute 11-12 ns a KiB against a 72-74 ns read) t0 took 79-83 ns a KiB (88-94% of the read
// rate) against 97-98 for t1 in all three; at W = 12 and 16 the lead changed from run to run
// (t0 96-109 against t1 102-105; t0 96-121 against t1 105-106). t1 at 4, 16 or 64 KiB ahead
// measured alike, t0 at 4 or 64 KiB slower than at 16 (64 KiB does not stay in L1).
#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kernels/prefetch.h"
#include "tokamax/core/device.h"
#include "tokamax/core/tensor.h"

namespace {

namespace kernels = tokamax::kernels;
using Clock = std::chrono::steady_clock;
constexpr int64_t kChunkFloats = 256;  // 1 KiB

enum class Mode { kRead, kCompute, kBoth, kBothPrefetch, kBatch };

// both+pf's prefetch: the hint (into L1, or into L2 and below) and how far ahead, in KiB.
struct Prefetch {
  bool l1 = false;
  int64_t ahead_kib = 16;
};

// Reads `chunks` KiB from p (or the same KiB again and again for kCompute) and after each
// runs `work` groups of 12 FMAs on accumulators that depend on the chunk's sum (as decode's
// q k^T does on K). AVX2 + FMA: runs on every CPU the library's vector kernels run on.
__attribute__((target("avx2,fma"))) float stream(const float* p, int64_t chunks, int work,
                                                 Mode mode, Prefetch pf) {
  __m256 acc[12];
  for (__m256& a : acc) a = _mm256_set1_ps(1.0f);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  const bool compute = mode != Mode::kRead;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* q = mode == Mode::kCompute ? p : p + c * kChunkFloats;
    if (mode == Mode::kBatch && c % 16 == 0) {
      // Touch the next 16 KiB with loads alone (one per line), then compute on it from cache.
      __m256 t0 = _mm256_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
      for (int64_t i = 0; i < 16 * kChunkFloats && c * kChunkFloats + i < chunks * kChunkFloats;
           i += 64) {
        t0 = _mm256_add_ps(t0, _mm256_load_ps(q + i));
        t1 = _mm256_add_ps(t1, _mm256_load_ps(q + i + 16));
        t2 = _mm256_add_ps(t2, _mm256_load_ps(q + i + 32));
        t3 = _mm256_add_ps(t3, _mm256_load_ps(q + i + 48));
      }
      s2 = _mm256_add_ps(s2, _mm256_add_ps(_mm256_add_ps(t0, t1), _mm256_add_ps(t2, t3)));
    }
    if (mode == Mode::kBothPrefetch) {
      const char* f = reinterpret_cast<const char*>(q) + (pf.ahead_kib << 10);
      for (int l = 0; l < 16; ++l) {
        if (pf.l1) {
          kernels::prefetch_t0(f + 64 * l);
        } else {
          kernels::prefetch_t1(f + 64 * l);
        }
      }
    }
    for (int64_t i = 0; i < kChunkFloats; i += 32) {
      s0 = _mm256_add_ps(s0, _mm256_load_ps(q + i));
      s1 = _mm256_add_ps(s1, _mm256_load_ps(q + i + 8));
      s2 = _mm256_add_ps(s2, _mm256_load_ps(q + i + 16));
      s3 = _mm256_add_ps(s3, _mm256_load_ps(q + i + 24));
    }
    if (compute) {
      for (int w = 0; w < work; ++w) {
        for (__m256& a : acc) a = _mm256_fmadd_ps(a, s0, s1);
      }
    }
  }
  __m256 t = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  for (const __m256& a : acc) t = _mm256_add_ps(t, a);
  alignas(32) float v[8];
  _mm256_store_ps(v, t);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  // One thread a core at most: the measurement is of each core's own stream.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = cores;
  std::vector<int> works = {0, 2, 4, 8, 16};
  Prefetch pf;
  std::string hint = "t1";
  CLI::App app{"whether a memory read stream overlaps the arithmetic on the data it reads"};
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "streaming threads")->check(CLI::Range(1, cores));
  app.add_option("--work", works, "groups of 12 FMAs per KiB (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(0, 1024));
  app.add_option("--hint", hint, "both+pf's prefetch: t1 (into L2) or t0 (into L1)")
      ->check(CLI::IsMember({"t0", "t1"}));
  app.add_option("--ahead", pf.ahead_kib, "both+pf's prefetch distance in KiB")
      ->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  pf.l1 = hint == "t0";
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("this CPU has no AVX2 + FMA: nothing to measure\n");
    return 0;
  }
  // Each thread's buffer: at least 256 MiB and, all threads together, four times the last-level
  // cache (as ReadProbe sizes its buffer where one L3 serves every CPU), so no pass finds its
  // data cached.
  const int64_t l3 = tokamax::device_info().l3_bytes;
  const int64_t bytes = std::max<int64_t>(256 << 20, 4 * l3 / threads) / 1024 * 1024;
  const int64_t chunks = bytes / 1024;
  std::vector<tokamax::Tensor> bufs;
  for (int t = 0; t < threads; ++t) {
    // --ahead KiB past the end: the prefetch's reach (never read).
    bufs.push_back(
        tokamax::Tensor::full({(bytes + (pf.ahead_kib << 10)) / 4}, tokamax::DType::kF32, 1.0));
  }
  std::printf(
      "%d threads, %lld MiB a thread, %d rounds (medians over rounds; per thread); both+pf: "
      "prefetch%s %lld KiB ahead\n",
      threads, static_cast<long long>(bytes >> 20), rounds, hint.c_str(),
      static_cast<long long>(pf.ahead_kib));
  std::printf("%6s %10s %12s %10s %12s %10s %12s %10s %12s %10s\n", "work", "read GB/s",
              "compute ns", "both ns", "read share", "overlap", "both+pf ns", "overlap", "batch ns",
              "overlap");
  volatile float sink = 0;  // keeps the sums (and so the loads) alive
  for (int work : works) {
    // Each round: the read, the compute, its floor (the compute loop without FMAs), both, both
    // with the prefetch, the batch schedule.
    const Mode modes[] = {Mode::kRead, Mode::kCompute,      Mode::kCompute,
                          Mode::kBoth, Mode::kBothPrefetch, Mode::kBatch};
    const int works_of[] = {work, work, 0, work, work, work};
    std::vector<double> ns[6];  // per row: ns per KiB a thread, one a round
    for (int r = 0; r < rounds; ++r) {
      for (int m = 0; m < 6; ++m) {
        std::barrier sync(threads);
        std::vector<double> took(threads);
        std::vector<float> sums(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            sync.arrive_and_wait();
            const auto t0 = Clock::now();
            sums[t] = stream(bufs[t].data_as<float>(), chunks, works_of[m], modes[m], pf);
            took[t] = std::chrono::duration<double>(Clock::now() - t0).count();
          });
        }
        for (std::thread& th : pool) th.join();
        for (float s : sums) sink = sink + s;
        ns[m].push_back(*std::max_element(took.begin(), took.end()) * 1e9 / chunks);
      }
    }
    const double read = median(ns[0]);
    const double compute = std::max(0.0, median(ns[1]) - median(ns[2]));
    const double both = median(ns[3]), both_pf = median(ns[4]), batch = median(ns[5]);
    // Without FMAs (W = 0) there is no compute to hide: no overlap printed.
    auto overlap = [&](double t) {
      return work > 0 && compute > 0 ? std::to_string((read + compute - t) / compute).substr(0, 5)
                                     : std::string("-");
    };
    std::printf("%6d %10.1f %12.1f %10.1f %11.0f%% %10s %12.1f %10s %12.1f %10s\n", work,
                1024.0 * threads / read, compute, both, 100 * read / std::min(both, both_pf),
                overlap(both).c_str(), both_pf, overlap(both_pf).c_str(), batch,
                overlap(batch).c_str());
  }
  return 0;
}
