// The disk cache: shipped data/autotuning/<device_kind>/<family>_<implementation>.json, then the
// user cache directory (TOKAMAX_CACHE_DIR, else $XDG_CACHE_HOME/tokamax, else ~/.cache/tokamax);
// later overrides earlier; loaded lazily; plus in-memory results of tuning done in this process.
// File format:
//   {"schema_version": 1, "tokamax_version": "...", "family": F, "implementation": I,
//    "implementation_version": N, "device_kind": D, "entries": {key: {config: BenchmarkData}}}
// A file of another schema or implementation version, or a corrupt one, is ignored with one
// warning. Writes take an exclusive lock on <file>.lock, re-read, merge and rename atomically, so
// concurrent writers (threads or processes) lose nothing.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

inline constexpr int kCacheSchemaVersion = 1;

std::string shipped_cache_dir();  // TOKAMAX_DATA_DIR, installed data, or the source tree's
std::string user_cache_dir();
std::string cache_file_path(const std::string& dir, const std::string& device_kind,
                            const std::string& family, const std::string& implementation);

struct CacheFile {
  std::string family, implementation, device_kind, tokamax_version;
  int schema_version = kCacheSchemaVersion;
  int implementation_version = 1;
  std::map<std::string, Json> entries;  // key -> {config: BenchmarkData}
  Json to_json() const;
  // Throws InvalidArgument on malformed content.
  static CacheFile from_json(const Json& j, const std::string& source);
  // Throws InvalidArgument saying why this library ignores the file's entries for `impl`: a
  // schema or implementation version other than its own. (The lookup logs the same reason once
  // and skips the file; `tokamax cache verify` reports it.)
  void check_versions(const Implementation& impl) const;
};

// Merges `entries` (key -> AutotuningData successes) into the file at `path` under a lock.
void merge_into_cache_file(const std::string& path, const std::string& family,
                           const Implementation& impl, const std::string& device_kind,
                           const std::map<std::string, AutotuningData>& entries);

class DiskCache {
 public:
  static DiskCache& global();
  // The winning config for bound (its implementation) on this device kind, if any. `source`
  // says which file (or "memory").
  std::optional<Config> lookup(const Implementation& impl, const BoundArguments& bound,
                               std::string* source);
  // In-memory results (autotune on miss); also written to the user cache by the caller.
  void put_memory(const Implementation& impl, const BoundArguments& bound, const Config& config);
  // Forgets everything loaded (tests; after the files changed).
  void clear();
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
