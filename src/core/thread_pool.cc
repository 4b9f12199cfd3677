// ThreadPool implementation.
#include "core/thread_pool.h"

#include <algorithm>
#include <memory>
#include <system_error>

#include "core/float_mode.h"
#include "tokamax/core/device.h"
#include "tokamax/core/error.h"

namespace tokamax {

namespace {
// Whether this thread is running a pool job (a worker's share, or the caller's share inside
// run()): a run() from there is nested and runs inline, as OpenMP runs nested regions when
// nesting is off. Waiting for the pool from inside it would deadlock (run() is one job at a
// time), and the outer run already has every thread busy.
thread_local bool in_pool_job = false;
thread_local uint64_t t_entry_epoch = 0;

struct InPoolJob {
  bool previous = in_pool_job;
  InPoolJob() { in_pool_job = true; }
  ~InPoolJob() { in_pool_job = previous; }
};
}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : claims_(std::make_unique<std::atomic<uint64_t>[]>(
          static_cast<size_t>(std::max(1, num_threads)))) {
  try {
    for (int i = 1; i < std::max(1, num_threads); ++i) {
      workers_.emplace_back([this, i] { worker_loop(i); });
    }
  } catch (const std::system_error& e) {
    // The threads started so far are stopped and joined here: unwinding with them joinable
    // would terminate the process, and they would wait forever for a pool that never runs.
    const size_t started = workers_.size();
    stop_workers();
    throw Error("cannot start thread " + std::to_string(started + 1) + " of " +
                std::to_string(num_threads) + " (" + e.what() +
                "); expected fewer threads (--threads, TOKAMAX_NUM_THREADS, set_num_threads)");
  }
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  while (true) {
    // Spin a little first: kernels are often called back to back.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return generation_.load() != seen; });
    seen = generation_.load();
    if (stop_) return;
    const bool participate = index < active_threads_;
    const auto* fn = fn_;
    const uint32_t mode = float_mode_;
    lock.unlock();
    // The share may have been taken by the caller (kCallerTakesLate) while this worker woke;
    // fn is then not touched (the run, and fn with it, may be over).
    if (participate && claim(index, seen)) {
      try {
        const InPoolJob job;
        const ScopedFloatMode in_callers_mode(mode);
        (*fn)(index);
      } catch (...) {
        std::lock_guard<std::mutex> elock(mu_);
        if (!error_) error_ = std::current_exception();
      }
      finish_share();
    }
  }
}

bool ThreadPool::claim(int i, uint64_t generation) {
  uint64_t last = claims_[i].load(std::memory_order_relaxed);
  // Generations only grow: a share already at `generation` (or later) is someone else's.
  while (last < generation) {
    if (claims_[i].compare_exchange_weak(last, generation, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void ThreadPool::finish_share() {
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

bool ThreadPool::in_job() { return in_pool_job; }

void ThreadPool::run(int threads, const std::function<void(int)>& fn, Shares shares) {
  threads = std::clamp(threads, 1, size());
  if (in_pool_job) {
    for (int t = 0; t < threads; ++t) fn(t);
    return;
  }
  ++t_entry_epoch;
  if (threads == 1) {
    const InPoolJob job;
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    float_mode_ = float_mode();
    active_threads_ = threads;
    error_ = nullptr;
    pending_.store(threads - 1);
    generation = generation_.fetch_add(1, std::memory_order_release) + 1;
  }
  cv_.notify_all();
  std::exception_ptr mine;
  auto run_share = [&](int i) {
    try {
      const InPoolJob job;
      fn(i);
    } catch (...) {
      if (!mine) mine = std::current_exception();
    }
  };
  run_share(0);
  if (shares == Shares::kCallerTakesLate) {
    for (int i = 1; i < threads; ++i) {
      if (claim(i, generation)) {
        run_share(i);
        finish_share();
      }
    }
  }
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0 && spin < 200000; ++spin) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.load() == 0; });
  fn_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

ThreadPool& ThreadPool::global() {
  static std::mutex mu;
  // Pools are never destroyed: a caller may still be inside run() of a smaller pool when
  // set_num_threads() asks for a bigger one. Growing is rare; the old pool just idles. Not at
  // exit either (the vector is leaked on purpose): a child forked while workers slept on the
  // condition variable hung in its destructor at exit(), waiting for waiters that exist only in
  // the parent.
  static auto* pools = new std::vector<std::unique_ptr<ThreadPool>>;
  const int want = num_threads();
  std::lock_guard<std::mutex> lock(mu);
  if (pools->empty() || pools->back()->size() < want)
    pools->push_back(std::make_unique<ThreadPool>(want));
  return *pools->back();
}

uint64_t thread_entry_epoch() { return t_entry_epoch; }

void bump_thread_entry_epoch() { ++t_entry_epoch; }

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  threads = static_cast<int>(std::min<int64_t>(threads, n));
  if (threads <= 1) {
    if (!in_pool_job) ++t_entry_epoch;
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  std::atomic<int64_t> next{0};
  ThreadPool::global().run(
      threads,
      [&](int t) {
        for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
             i = next.fetch_add(1, std::memory_order_relaxed)) {
          fn(i, t);
        }
      },
      ThreadPool::Shares::kCallerTakesLate);
}

}  // namespace tokamax
