// A persistent thread pool for kernels: parallel_for over work items with low start-up cost
// (workers spin briefly before sleeping, so back-to-back small calls do not pay for wake-ups).
// Internal: the one pool of the library (kernels, the roofline probes and the autotuner's
// parallel preparation); not part of the public API.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tokamax {

class ThreadPool {
 public:
  // Error naming the thread count when a thread cannot be started (a memory or process limit).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Who runs a share whose worker has not started it by the time the caller finished its own.
  enum class Shares {
    // Every share on its own thread: the caller waits for each worker (the roofline probes,
    // whose shares must run at once to measure the machine; the cache flush and
    // wake_threads, which are there to reach every thread).
    kEveryThread,
    // The caller runs it. A worker asleep (after the pool sat idle for more than its spin)
    // takes a wake-up to start; in a VM that measured up to 1-1.4 ms (a decode step of 1 MiB of
    // KV after a 20 ms pause, 2 threads: 1.28-1.41 ms a call against 53 us back to back), and
    // parallel_for's caller had by then taken every item itself: it waited only for the
    // worker to find nothing to do.
    kCallerTakesLate,
  };
  // Runs fn(share) for share in [0, threads) (the caller runs share 0), worker i running share
  // i, and returns when all have run, every one in the caller's floating-point mode
  // (flush-to-zero, rounding: float_mode.h). threads is clamped to [1, size()]. An exception
  // from a share is rethrown after every share has run: one of the caller's shares' (its own,
  // then any late one it ran) before the workers' first. Called from inside a run (nested: a kernel
  // inside a job of the autotuner's preparation), it runs fn(0), ..., fn(threads - 1) inline on the
  // calling thread.
  void run(int threads, const std::function<void(int)>& fn, Shares shares = Shares::kEveryThread);

  // The process-wide pool used by kernels, grown on demand to num_threads().
  static ThreadPool& global();
  // Whether the calling thread is running a share of a run (a run() from it goes inline).
  static bool in_job();

 private:
  void worker_loop(int index);
  void stop_workers();
  // Takes share i of run `generation` for the calling thread: false when another thread has.
  bool claim(int i, uint64_t generation);
  // Marks a share done; the last one wakes the caller if it sleeps.
  void finish_share();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::mutex run_mu_;  // one run() at a time
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // shares of the current run not yet done (the caller's aside)
  // Per worker index: the last run whose share was taken (by the worker or the caller).
  std::unique_ptr<std::atomic<uint64_t>[]> claims_;
  int active_threads_ = 0;
  const std::function<void(int)>* fn_ = nullptr;
  uint32_t float_mode_ = 0;  // the caller's (float_mode.h): workers run the job in it
  std::exception_ptr error_;
  bool stop_ = false;
};

// Splits [0, n) items over `threads` workers with dynamic scheduling (an atomic counter), so
// skewed item costs still balance. fn(item, thread_index). A thread claims the lowest item not
// yet claimed only when it is about to run it, and runs its items one at a time: an item may
// wait for items below it (kernels::run_shared_strips does), never for one above.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn);

// Counts this thread's entries into the library from code outside it: dispatch (every op call)
// and parallel_for / ThreadPool::run outside a pool job bump it. Per-thread CPU state that the
// caller's other code may change between two of our calls is reloaded when the count has moved:
// AMX's tile configuration, which torch's and oneDNN's bf16 kernels release after use (a tile
// instruction after TILERELEASE faults with SIGILL). A pool worker runs only library code: its
// count stays put and its state is loaded once.
uint64_t thread_entry_epoch();
void bump_thread_entry_epoch();

}  // namespace tokamax
