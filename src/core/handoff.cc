// The cache-line hand-off probe (handoff.h).
#include "core/handoff.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/thread_pool.h"

namespace tokamax {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double pool_handoff_ns(int other, int64_t passes, int64_t warmup, double give_up_s) {
  ThreadPool& pool = ThreadPool::global();
  if (other < 1 || other >= pool.size() || passes < 1 || ThreadPool::in_job()) return 0;
  struct alignas(64) Line {
    std::atomic<int64_t> ball{0};
  };
  Line line;
  std::atomic<bool> gave_up{false};
  const auto start = std::chrono::steady_clock::now();
  // Spins until the ball reads `value`; false once either share has waited past give_up_s.
  auto await = [&](int64_t value) {
    for (int64_t spins = 1; line.ball.load(std::memory_order_acquire) != value; ++spins) {
      if (gave_up.load(std::memory_order_relaxed)) return false;
      if (spins % 1024 == 0 && seconds_since(start) > give_up_s) {
        gave_up.store(true, std::memory_order_relaxed);
        return false;
      }
    }
    return true;
  };
  double seconds = 0;
  const int64_t total = warmup + passes;
  pool.run(other + 1, [&](int share) {
    if (share != 0 && share != other) return;
    const int t = share == 0 ? 0 : 1;
    std::chrono::steady_clock::time_point t0;
    for (int64_t i = 0; i < total; ++i) {
      if (t == 0 && i == warmup) t0 = std::chrono::steady_clock::now();
      // Thread t moves the ball from 2i + t to 2i + t + 1.
      if (!await(2 * i + t)) return;
      line.ball.store(2 * i + t + 1, std::memory_order_release);
    }
    // Thread 0's last round trip ends when thread 1 has answered it.
    if (t == 0 && await(2 * total)) seconds = seconds_since(t0);
  });
  if (gave_up.load()) return 0;
  return seconds / (2.0 * static_cast<double>(passes)) * 1e9;
}

bool pool_threads_share_cache(int threads) {
  threads = std::min(threads, ThreadPool::global().size());
  if (threads < 2) return false;
  for (int t = 1; t < threads; ++t) {
    // Up to 3 runs, the first under the bound deciding (a preempted run only reads slower).
    bool under = false;
    for (int run = 0; run < 3 && !under; ++run) {
      const double ns = pool_handoff_ns(t, 32, 8, 0.01);
      if (ns <= 0) return false;
      under = ns < kSharedCacheHandoffNs;
    }
    if (!under) return false;
  }
  return true;
}

}  // namespace tokamax
