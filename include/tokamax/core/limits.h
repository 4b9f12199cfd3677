// Limits on what the library reads from outside (files, environment, command line): each is
// checked before anything is allocated or parsed on the strength of the value, so that a
// corrupt or hostile file ends in an InvalidArgument naming the file and the limit instead of a
// crash, a hang or an allocation of gigabytes. The values are far above anything tokamax
// writes itself or any real workload needs; see README.md ("Limits").
#pragma once

#include <cstdint>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// Nesting of JSON arrays and objects. tokamax's own files nest 6 deep; a Chrome trace of
// another tool rarely more than 10. Deep nesting would otherwise recurse without bound
// (destructors, dumps, error messages).
inline constexpr int kMaxJsonDepth = 256;
// Bytes of any file read (cache, result, bound-args, bench, trace files), and of a gzip
// trace's decompressed text.
inline constexpr int64_t kMaxInputFileBytes = int64_t{1} << 30;
// Elements of one array in an argument spec from a file (ragged_dot's group_sizes list), and
// groups of a {"num_groups": G, "total_size": M} spec.
inline constexpr int64_t kMaxSpecGroups = int64_t{1} << 20;
// Rows a {"num_groups": G, "total_size": M} spec spreads over its groups (group sizes are
// int32).
inline constexpr int64_t kMaxSpecGroupTotal = (int64_t{1} << 31) - 1;
// Dimensions of one ShapeDtype (rank), and elements of one tensor, of an argument spec read
// from a file: a spec's tensors are allocated when it is benchmarked or tuned.
inline constexpr int kMaxSpecRank = 16;
inline constexpr int64_t kMaxSpecElements = int64_t{1} << 36;
// Samples of one config in a result or cache file (evaluation_times_ms, its rounds and
// ratios): the tuner keeps at most a few hundred.
inline constexpr int64_t kMaxSamplesPerConfig = int64_t{1} << 20;
// Threads (--threads, TOKAMAX_NUM_THREADS, a key's num_threads).
inline constexpr int kMaxThreads = 4096;

}  // namespace tokamax
TOKAMAX_PUBLIC_END
