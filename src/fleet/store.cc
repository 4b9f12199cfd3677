// Store URLs, open_store and the in-memory store (see tokamax/fleet/store.h).
#include "tokamax/fleet/store.h"

#include <fnmatch.h>

#include <chrono>
#include <climits>
#include <set>
#include <unordered_map>

#include "fleet/redis_store.h"
#include "tokamax/core/log.h"

namespace tokamax {

namespace {

int parse_int_part(const std::string& url, const std::string& what, const std::string& s, int lo,
                   int hi) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || v < lo || v > hi) {
    throw InvalidArgument("store URL '" + url + "': " + what + " '" + s +
                          "' is not an integer in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
  }
  return static_cast<int>(v);
}

}  // namespace

std::string StoreUrl::str() const {
  if (scheme == "mem") return "mem://" + name;
  return "redis://" + host + ":" + std::to_string(port) + "/" + std::to_string(db) +
         (prefix == "tokamax:" ? "" : "?prefix=" + prefix);
}

StoreUrl parse_store_url(const std::string& url) {
  StoreUrl u;
  const auto sep = url.find("://");
  if (sep == std::string::npos) {
    throw InvalidArgument("store URL '" + url +
                          "': expected redis://host:port/db[?prefix=ns] or mem://name");
  }
  u.scheme = url.substr(0, sep);
  std::string rest = url.substr(sep + 3);
  const auto q = rest.find('?');
  std::string query = q == std::string::npos ? "" : rest.substr(q + 1);
  if (q != std::string::npos) rest.resize(q);
  for (size_t start = 0; !query.empty() && start <= query.size();) {
    const size_t amp = std::min(query.find('&', start), query.size());
    const std::string item = query.substr(start, amp - start);
    const auto eq = item.find('=');
    if (eq == std::string::npos || item.substr(0, eq) != "prefix") {
      throw InvalidArgument("store URL '" + url + "': unknown parameter '" + item +
                            "' (the only one is prefix=ns)");
    }
    u.prefix = item.substr(eq + 1);
    start = amp + 1;
  }
  if (u.scheme == "mem") {
    if (rest.empty()) throw InvalidArgument("store URL '" + url + "': mem:// needs a name");
    u.name = rest;
    return u;
  }
  if (u.scheme != "redis") {
    throw InvalidArgument("store URL '" + url + "': scheme '" + u.scheme +
                          "' is not supported (redis:// or mem://)");
  }
  if (rest.find('@') != std::string::npos) {
    throw InvalidArgument("store URL '" + url +
                          "': credentials in the URL are not supported (use a loopback or "
                          "firewalled Redis)");
  }
  const auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos && slash + 1 < rest.size())
    u.db = parse_int_part(url, "database", rest.substr(slash + 1), 0, 1 << 20);
  const auto colon = hostport.rfind(':');
  if (colon != std::string::npos) {
    u.port = parse_int_part(url, "port", hostport.substr(colon + 1), 1, 65535);
    hostport.resize(colon);
  }
  if (!hostport.empty()) u.host = hostport;
  return u;
}

std::unique_ptr<Store> open_store(const std::string& url, const StoreOptions& options) {
  if (!(options.connect_timeout_s > 0) || !(options.command_timeout_s > 0)) {
    throw InvalidArgument("store timeouts must be > 0 s (connect " +
                          std::to_string(options.connect_timeout_s) + ", command " +
                          std::to_string(options.command_timeout_s) + ")");
  }
  if (options.max_value_bytes < 1 || options.max_reply_bytes < 1) {
    throw InvalidArgument("store size limits must be >= 1 byte (value " +
                          std::to_string(options.max_value_bytes) + ", reply " +
                          std::to_string(options.max_reply_bytes) + ")");
  }
  const StoreUrl u = parse_store_url(url);
  if (u.scheme == "mem") return std::make_unique<MemoryStore>(u.name, u.prefix);
  return open_redis_store(u, options);
}

// ---- MemoryStore -------------------------------------------------------------------------------

struct MemoryStore::Data {
  struct Value {
    std::string str;
    std::map<std::string, std::string> hash;
    bool is_hash = false;
    int64_t expires_ms = 0;  // 0: never
  };
  std::mutex mu;
  std::unordered_map<std::string, Value> values;
  int64_t now_ms = 0;  // the current command's time
  // An expired key vanishes when a command looks at it (Redis's own expiry, on the store's
  // clock, not the clients').
  bool expired(const Value& v) const { return v.expires_ms && v.expires_ms <= now_ms; }
};

namespace {

std::mutex g_registry_mu;
std::unordered_map<std::string, std::shared_ptr<MemoryStore::Data>>& registry() {
  static auto* r = new std::unordered_map<std::string, std::shared_ptr<MemoryStore::Data>>;
  return *r;
}

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

MemoryStore::MemoryStore(const std::string& name, std::string prefix)
    : Store(std::move(prefix)), name_(name), now_ms_(steady_ms) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto& d = registry()[name];
  if (!d) d = std::make_shared<Data>();
  data_ = d;
}

void MemoryStore::reset(const std::string& name) {
  std::shared_ptr<Data> d;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = registry().find(name);
    if (it == registry().end()) return;
    d = it->second;
  }
  std::lock_guard<std::mutex> lock(d->mu);
  d->values.clear();
}

void MemoryStore::set_faults(Faults faults) {
  faults_ = std::move(faults);
  rng_.seed(faults_.seed);
}

std::unique_lock<std::mutex> MemoryStore::begin(const char* command) {
  std::unique_lock<std::mutex> lock(data_->mu);
  ++operations_;
  ++counts_[command];
  if (faults_.latency_ms > 0 && faults_.on_latency) faults_.on_latency(faults_.latency_ms);
  if (faults_.failure_rate > 0 &&
      std::uniform_real_distribution<double>(0, 1)(rng_) < faults_.failure_rate) {
    throw StoreError(describe() + ": " + command + " failed (injected fault)");
  }
  data_->now_ms = now_ms_();
  return lock;
}

namespace {
MemoryStore::Data::Value* find_value(MemoryStore::Data& d, const std::string& key, bool hash,
                                     const std::string& where) {
  auto it = d.values.find(key);
  if (it == d.values.end()) return nullptr;
  if (d.expired(it->second)) {
    d.values.erase(it);
    return nullptr;
  }
  if (it->second.is_hash != hash) {
    throw StoreKeyError(where + ": key '" + key + "' holds the wrong kind of value (WRONGTYPE)",
                        key);
  }
  return &it->second;
}

// The live value under key if it is of the kind asked for; a key of another kind holds no value
// a compare-and-act operation looks for (as the Redis store's scripts check the type).
MemoryStore::Data::Value* find_kind(MemoryStore::Data& d, const std::string& key, bool hash) {
  auto it = d.values.find(key);
  if (it == d.values.end() || d.expired(it->second) || it->second.is_hash != hash) return nullptr;
  return &it->second;
}
}  // namespace

std::optional<std::string> MemoryStore::get(const std::string& key) {
  auto lock = begin("GET");
  if (auto* v = find_value(*data_, key, false, describe())) return v->str;
  return std::nullopt;
}

void MemoryStore::set(const std::string& key, const std::string& value) {
  auto lock = begin("SET");
  data_->values[key] = Data::Value{value, {}, false, 0};
}

bool MemoryStore::set_if_absent(const std::string& key, const std::string& value, int64_t ttl_ms) {
  auto lock = begin("SET NX");
  auto it = data_->values.find(key);
  if (it != data_->values.end() && !data_->expired(it->second)) return false;
  data_->values[key] = Data::Value{value, {}, false, ttl_ms > 0 ? now_ms_() + ttl_ms : 0};
  return true;
}

bool MemoryStore::renew_if_equal(const std::string& key, const std::string& value, int64_t ttl_ms) {
  auto lock = begin("EVAL renew");
  auto* v = find_kind(*data_, key, false);
  if (!v || v->str != value) return false;
  v->expires_ms = now_ms_() + ttl_ms;
  return true;
}

bool MemoryStore::delete_if_equal(const std::string& key, const std::string& value) {
  auto lock = begin("EVAL release");
  auto* v = find_kind(*data_, key, false);
  if (!v || v->str != value) return false;
  data_->values.erase(key);
  return true;
}

bool MemoryStore::claim(const std::string& lease_key, const std::string& token, int64_t ttl_ms,
                        const std::string& list_key, const std::string& field) {
  auto lock = begin("EVAL claim");
  auto* list = find_value(*data_, list_key, true, describe());  // WRONGTYPE before any change
  auto it = data_->values.find(lease_key);
  if (it != data_->values.end() && !data_->expired(it->second)) {
    if (!it->second.is_hash) return false;
    TOKAMAX_LOG("fleet", kWarning,
                describe() + ": '" + lease_key +
                    "' held a value of another type than a lease (another writer's); replaced by "
                    "this process's lease");
  }
  data_->values[lease_key] = Data::Value{token, {}, false, ttl_ms > 0 ? data_->now_ms + ttl_ms : 0};
  if (!list) {
    list = &data_->values[list_key];
    list->is_hash = true;
  }
  list->hash[field] = token;
  return true;
}

bool MemoryStore::hash_delete_if_equal(const std::string& key, const std::string& field,
                                       const std::string& value) {
  auto lock = begin("EVAL hdel_if");
  auto* v = find_kind(*data_, key, true);
  if (!v) return false;
  auto it = v->hash.find(field);
  if (it == v->hash.end() || it->second != value) return false;
  v->hash.erase(it);
  return true;
}

void MemoryStore::del(const std::string& key) {
  auto lock = begin("DEL");
  data_->values.erase(key);
}

int64_t MemoryStore::increment(const std::string& key) {
  auto lock = begin("INCR");
  auto* v = find_value(*data_, key, false, describe());
  int64_t n = 0;
  if (v) {
    try {
      n = std::stoll(v->str);
    } catch (const std::exception&) {
      throw StoreKeyError(describe() + ": INCR '" + key + "': value is not an integer", key);
    }
  }
  data_->values[key].str = std::to_string(++n);
  return n;
}

void MemoryStore::hash_set(const std::string& key, const std::string& field,
                           const std::string& value) {
  auto lock = begin("HSET");
  auto* v = find_value(*data_, key, true, describe());
  if (!v) {
    v = &data_->values[key];
    v->is_hash = true;
  }
  v->hash[field] = value;
}

std::optional<std::string> MemoryStore::hash_get(const std::string& key, const std::string& field) {
  auto lock = begin("HGET");
  auto* v = find_value(*data_, key, true, describe());
  if (!v) return std::nullopt;
  auto it = v->hash.find(field);
  if (it == v->hash.end()) return std::nullopt;
  return it->second;
}

bool MemoryStore::hash_exists(const std::string& key, const std::string& field) {
  auto lock = begin("HEXISTS");
  auto* v = find_value(*data_, key, true, describe());
  return v && v->hash.count(field);
}

void MemoryStore::hash_del(const std::string& key, const std::string& field) {
  auto lock = begin("HDEL");
  if (auto* v = find_value(*data_, key, true, describe())) v->hash.erase(field);
}

int64_t MemoryStore::hash_len(const std::string& key) {
  auto lock = begin("HLEN");
  auto* v = find_value(*data_, key, true, describe());
  return v ? static_cast<int64_t>(v->hash.size()) : 0;
}

bool MemoryStore::exists(const std::string& key) {
  auto lock = begin("EXISTS");
  auto it = data_->values.find(key);
  return it != data_->values.end() && !data_->expired(it->second);
}

std::vector<std::string> MemoryStore::hash_fields(const std::string& key) {
  auto lock = begin("HKEYS");
  std::vector<std::string> out;
  if (auto* v = find_value(*data_, key, true, describe())) {
    for (const auto& [f, _] : v->hash) out.push_back(f);
  }
  return out;
}

std::vector<std::string> MemoryStore::hash_random_fields(const std::string& key, int count) {
  auto lock = begin("HRANDFIELD");
  std::vector<std::string> out;
  auto* v = find_value(*data_, key, true, describe());
  if (!v || count <= 0) return out;
  const size_t n = v->hash.size(), k = std::min(n, static_cast<size_t>(count));
  // k distinct positions (Floyd's sampling), then one walk over the map.
  std::set<size_t> picked;
  for (size_t j = n - k; j < n; ++j) {
    const size_t t = std::uniform_int_distribution<size_t>(0, j)(rng_);
    picked.insert(picked.count(t) ? j : t);
  }
  size_t pos = 0;
  for (const auto& [f, _] : v->hash) {
    if (picked.count(pos++)) out.push_back(f);
  }
  return out;
}

Store::HashContents MemoryStore::hash_get_all(const std::string& key) {
  auto lock = begin("HGETALL");
  if (auto* v = find_value(*data_, key, true, describe())) return {v->hash, {}};
  return {};
}

std::vector<std::string> MemoryStore::keys(const std::string& pattern) {
  auto lock = begin("SCAN");
  std::vector<std::string> out;
  for (const auto& [k, v] : data_->values) {
    if (!data_->expired(v) && fnmatch(pattern.c_str(), k.c_str(), 0) == 0) out.push_back(k);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace tokamax
