// How long a cache line takes to pass between the pool's threads, for code inside the library:
// the roofline reports it (`tokamax device --roofline`: core to core), and kernels whose best
// work split depends on whether their threads share a last-level cache ask it at call time. A
// VM's vCPUs can move between dies from minute to minute while its sysfs reports one L3 for all
// of them (last_level_cache_serves_all_cpus), so the time is measured, not read.
#pragma once

#include <cstdint>

namespace tokamax {

// The one-way hand-off time (ns) of a cache line between the global pool's threads 0 and
// `other`: `passes` round trips timed on thread 0 after `warmup` untimed ones. 0 where the two
// did not run at once: `other` out of the pool, a call from inside a pool job (its shares run
// one after another on the calling thread), or a share that waited past `give_up_s` for the
// other (a worker's wake-up in a VM can take over a millisecond).
double pool_handoff_ns(int other, int64_t passes, int64_t warmup, double give_up_s);

// Threads sharing a last-level cache hand a line over in tens of nanoseconds; across dies or
// sockets it takes well over 100 (Zen 4 VM: 27-54 ns on one die, 156-186 ns across two).
constexpr double kSharedCacheHandoffNs = 90;

// Whether the pool's threads [0, threads) were found to share one last-level cache: each
// other thread hands a line to thread 0 in under kSharedCacheHandoffNs in one of up to 3 short
// runs (a preempted run does not count against it). False for fewer than two threads, from inside
// a pool job, or when a run could not be timed. Costs a few microseconds a thread on one die
// (the workers' wake-up aside, which the caller's next parallel_for would otherwise pay).
bool pool_threads_share_cache(int threads);

}  // namespace tokamax
