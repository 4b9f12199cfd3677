// The disk cache: file format, locked merging writes, lazy loading and lookups.
#include "tokamax/autotuning/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "core/json_field.h"
#include "tokamax/core/log.h"

namespace tokamax {

namespace fs = std::filesystem;

std::string shipped_cache_dir() {
  if (const char* env = std::getenv("TOKAMAX_DATA_DIR"); env && *env) return env;
  std::error_code ec;
  if (fs::is_directory(TOKAMAX_SOURCE_DATA_DIR, ec)) return TOKAMAX_SOURCE_DATA_DIR;
  return TOKAMAX_INSTALL_DATA_DIR;
}

std::string user_cache_dir() {
  if (const char* env = std::getenv("TOKAMAX_CACHE_DIR"); env && *env) return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/tokamax";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/tokamax";
  return ".tokamax-cache";
}

namespace {
// A device kind, op or implementation name as a path component: it may come from a file (a
// result's device_kind), and "../../x" must not lead out of the cache directory.
const std::string& path_component(const std::string& s, const char* what) {
  const bool safe = !s.empty() && s != "." && s != ".." &&
                    s.find_first_not_of(
                        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                        "0123456789_-.") == std::string::npos;
  if (!safe) {
    throw InvalidArgument(std::string(what) + " '" + s.substr(0, 100) +
                          "' cannot name a cache file; expected letters, digits, '_', '-' and "
                          "'.' (not '.' or '..')");
  }
  return s;
}
}  // namespace

std::string cache_file_path(const std::string& dir, const std::string& kind,
                            const std::string& family, const std::string& implementation) {
  return dir + "/" + path_component(kind, "device kind") + "/" + path_component(family, "op") +
         "_" + path_component(implementation, "implementation") + ".json";
}

Json CacheFile::to_json() const {
  Json e = Json::object();
  for (const auto& [k, v] : entries) e[k] = v;
  return {{"schema_version", schema_version},
          {"tokamax_version", tokamax_version},
          {"family", family},
          {"implementation", implementation},
          {"implementation_version", implementation_version},
          {"device_kind", device_kind},
          {"entries", e}};
}

void CacheFile::check_versions(const Implementation& impl) const {
  if (schema_version != kCacheSchemaVersion) {
    throw InvalidArgument("schema version " + std::to_string(schema_version) +
                          ", this library reads " + std::to_string(kCacheSchemaVersion));
  }
  if (implementation_version != impl.version()) {
    throw InvalidArgument("written for implementation version " +
                          std::to_string(implementation_version) + " of " + impl.name() +
                          ", this is version " + std::to_string(impl.version()));
  }
}

CacheFile CacheFile::from_json(const Json& j, const std::string& source) {
  const std::string what = "cache file " + source;
  auto bad = [&](const std::string& why) { return InvalidArgument(what + ": " + why); };
  if (!j.is_object()) throw bad("not a JSON object");
  CacheFile f;
  f.schema_version = json_field<int>(j, "schema_version", what);
  if (j.contains("tokamax_version"))
    f.tokamax_version = json_field<std::string>(j, "tokamax_version", what);
  f.family = json_field<std::string>(j, "family", what);
  f.implementation = json_field<std::string>(j, "implementation", what);
  f.implementation_version = json_field<int>(j, "implementation_version", what);
  f.device_kind = json_field<std::string>(j, "device_kind", what);
  if (!j.contains("entries") || !j["entries"].is_object())
    throw bad("'entries' is missing or not an object");
  for (const auto& [k, v] : j["entries"].items()) {
    if (!v.is_object()) throw bad("entry for key " + k.substr(0, 100) + " is not an object");
    f.entries[k] = v;
  }
  return f;
}

namespace {

class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    // An error naming the directory, not the filesystem library's own exception text.
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    if (ec) {
      throw InvalidArgument("cannot create the cache directory '" +
                            fs::path(path).parent_path().string() + "': " + ec.message());
    }
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot open lock file " + path + ".lock: " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        throw Error("cannot lock " + path + ".lock: " + std::strerror(errno));
      }
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

void warn_once(const std::string& message) { log_once("cache", LogLevel::kWarning, message); }

// Reads a cache file for impl; nullopt if missing (most devices have no shipped file: no
// warning), nullopt with one warning if corrupt or stale.
std::optional<CacheFile> read_cache_file(const std::string& path, const Implementation& impl) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return std::nullopt;
  }
  try {
    CacheFile f = CacheFile::from_json(read_json_file(path), path);
    f.check_versions(impl);
    return f;
  } catch (const std::exception& e) {
    warn_once("ignoring cache file " + path + ": " + e.what());
    return std::nullopt;
  }
}

}  // namespace

void merge_into_cache_file(const std::string& path, const std::string& family,
                           const Implementation& impl, const std::string& kind,
                           const std::map<std::string, AutotuningData>& entries) {
  FileLock lock(path);
  CacheFile f;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    try {
      f = CacheFile::from_json(read_json_file(path), path);
      f.check_versions(impl);
    } catch (const std::exception& e) {
      // Replacing it would lose what it holds (a hand edit gone wrong, another version's
      // entries): kept under another name for its owner, and said where.
      const std::string aside = move_aside(path);
      TOKAMAX_LOG("cache", kWarning,
                  "cache file " + path + " cannot be merged into (" + e.what() +
                      "); moved it aside to " + aside + " and writing a new one");
      f = CacheFile{};
    }
  }
  f.schema_version = kCacheSchemaVersion;
  f.tokamax_version = library_version();
  f.family = family;
  f.implementation = impl.name();
  f.implementation_version = impl.version();
  f.device_kind = kind;
  for (const auto& [key, data] : entries) {
    Json& slot = f.entries[key];
    if (!slot.is_object()) slot = Json::object();
    const Json configs = data.successes().to_json();  // named: items() must not outlive it
    for (const auto& [cfg, v] : configs.items()) slot[cfg] = v;
  }
  write_file_atomic(path, f.to_json().dump(1));
}

namespace {

struct Loaded {
  std::unordered_map<std::string, std::pair<Config, std::string>>
      winners;  // key -> (config, source)
};

struct CacheState {
  std::shared_mutex mu;
  std::unordered_map<const Implementation*, Loaded> loaded;
  std::unordered_map<const Implementation*, std::unordered_map<std::string, Config>> memory;
};

CacheState& state() {
  static CacheState s;
  return s;
}

Loaded load_for(const Implementation& impl, const std::string& family) {
  Loaded l;
  const std::string kind = device_kind();
  for (const std::string& dir : {shipped_cache_dir(), user_cache_dir()}) {
    const std::string path = cache_file_path(dir, kind, family, impl.name());
    auto f = read_cache_file(path, impl);
    if (!f) continue;
    for (const auto& [key, configs] : f->entries) {
      try {
        AutotuningData d = AutotuningData::from_json(configs, impl);
        if (!d.has_success()) continue;  // every config failed: a miss
        const auto& best = d.fastest();
        l.winners[key] = {best.config,
                          best.benchmark->evidence
                              ? path + "; tuned: " + best.benchmark->evidence->summary()
                              : path};
      } catch (const std::exception& e) {
        warn_once("ignoring an entry of cache file " + path + ": " + e.what());
      }
    }
  }
  return l;
}

}  // namespace

DiskCache& DiskCache::global() {
  static DiskCache c;
  return c;
}

std::optional<Config> DiskCache::lookup(const Implementation& impl, const BoundArguments& bound,
                                        std::string* source) {
  CacheState& s = state();
  {
    std::shared_lock<std::shared_mutex> lock(s.mu);
    if (auto m = s.memory.find(&impl); m != s.memory.end()) {
      if (auto it = m->second.find(bound.key()); it != m->second.end()) {
        if (source) *source = "in-memory autotuning result";
        return it->second;
      }
    }
    if (auto l = s.loaded.find(&impl); l != s.loaded.end()) {
      auto it = l->second.winners.find(bound.key());
      if (it == l->second.winners.end()) return std::nullopt;
      if (source) *source = it->second.second;
      return it->second.first;
    }
  }
  Loaded fresh = load_for(impl, bound.family());
  std::unique_lock<std::shared_mutex> lock(s.mu);
  auto [pos, inserted] = s.loaded.emplace(&impl, std::move(fresh));
  auto it = pos->second.winners.find(bound.key());
  if (it == pos->second.winners.end()) return std::nullopt;
  if (source) *source = it->second.second;
  return it->second.first;
}

void DiskCache::put_memory(const Implementation& impl, const BoundArguments& bound,
                           const Config& config) {
  CacheState& s = state();
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.memory[&impl][bound.key()] = config;
}

void DiskCache::clear() {
  CacheState& s = state();
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.loaded.clear();
}

}  // namespace tokamax
