// The Redis store: one hiredis connection per object, guarded by a mutex (a lease's renewal
// thread shares it with the tuner). Every wait is bounded: the connection by connect_timeout_s,
// each reply by command_timeout_s. A connection that failed is dropped and re-opened (one
// attempt, bounded the same way) by the next command, so a Redis restarted mid-run is used again.
#include "fleet/redis_store.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cmath>
#include <mutex>

namespace tokamax {

namespace {

timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - std::floor(s)) * 1e6);
  return tv;
}

// Compare-and-expire and compare-and-delete, atomic on the server.
constexpr const char* kRenewScript =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
constexpr const char* kReleaseScript =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";

// SET NX PX and the in-flight listing in one step, so that a claim is never unlisted.
constexpr const char* kClaimScript =
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "redis.call('hset', KEYS[2], ARGV[3], ARGV[1]) return 1 else return 0 end";
constexpr const char* kHashDeleteScript =
    "if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then "
    "return redis.call('hdel', KEYS[1], ARGV[1]) else return 0 end";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisStore : public Store {
 public:
  RedisStore(const StoreUrl& u, const StoreOptions& o) : Store(u.prefix), url_(u), options_(o) {
    std::lock_guard<std::mutex> lock(mu_);
    connect();
  }
  ~RedisStore() override {
    if (ctx_) redisFree(ctx_);
  }

  std::string describe() const override { return url_.str(); }

  std::optional<std::string> get(const std::string& key) override {
    Reply r = command({"GET", key});
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    return string_of(*r, "GET");
  }
  void set(const std::string& key, const std::string& value) override {
    command({"SET", key, value});
  }
  bool set_if_absent(const std::string& key, const std::string& value, int64_t ttl_ms) override {
    Reply r = ttl_ms > 0 ? command({"SET", key, value, "NX", "PX", std::to_string(ttl_ms)})
                         : command({"SET", key, value, "NX"});
    return r->type != REDIS_REPLY_NIL;
  }
  bool renew_if_equal(const std::string& key, const std::string& value, int64_t ttl_ms) override {
    return integer_of(*command({"EVAL", kRenewScript, "1", key, value, std::to_string(ttl_ms)}),
                      "EVAL renew") == 1;
  }
  bool delete_if_equal(const std::string& key, const std::string& value) override {
    return integer_of(*command({"EVAL", kReleaseScript, "1", key, value}), "EVAL release") == 1;
  }
  bool claim(const std::string& lease_key, const std::string& token, int64_t ttl_ms,
             const std::string& list_key, const std::string& field) override {
    return integer_of(*command({"EVAL", kClaimScript, "2", lease_key, list_key, token,
                                std::to_string(ttl_ms), field}),
                      "EVAL claim") == 1;
  }
  bool hash_delete_if_equal(const std::string& key, const std::string& field,
                            const std::string& value) override {
    return integer_of(*command({"EVAL", kHashDeleteScript, "1", key, field, value}),
                      "EVAL hdel_if") == 1;
  }
  void del(const std::string& key) override { command({"DEL", key}); }
  int64_t increment(const std::string& key) override {
    return integer_of(*command({"INCR", key}), "INCR");
  }
  void hash_set(const std::string& key, const std::string& field,
                const std::string& value) override {
    command({"HSET", key, field, value});
  }
  std::optional<std::string> hash_get(const std::string& key, const std::string& field) override {
    Reply r = command({"HGET", key, field});
    if (r->type == REDIS_REPLY_NIL) return std::nullopt;
    return string_of(*r, "HGET");
  }
  bool hash_exists(const std::string& key, const std::string& field) override {
    return integer_of(*command({"HEXISTS", key, field}), "HEXISTS") == 1;
  }
  void hash_del(const std::string& key, const std::string& field) override {
    command({"HDEL", key, field});
  }
  int64_t hash_len(const std::string& key) override {
    return integer_of(*command({"HLEN", key}), "HLEN");
  }
  bool exists(const std::string& key) override {
    return integer_of(*command({"EXISTS", key}), "EXISTS") == 1;
  }
  std::vector<std::string> hash_fields(const std::string& key) override {
    Reply r = command({"HKEYS", key});
    std::vector<std::string> out;
    for (size_t i = 0; i < array_of(*r, "HKEYS"); ++i)
      out.push_back(string_of(*r->element[i], "HKEYS"));
    return out;
  }
  std::vector<std::string> hash_random_fields(const std::string& key, int count) override {
    Reply r = command({"HRANDFIELD", key, std::to_string(std::max(count, 0))});
    std::vector<std::string> out;
    if (r->type == REDIS_REPLY_NIL) return out;
    for (size_t i = 0; i < array_of(*r, "HRANDFIELD"); ++i)
      out.push_back(string_of(*r->element[i], "HRANDFIELD"));
    return out;
  }
  std::map<std::string, std::string> hash_get_all(const std::string& key) override {
    Reply r = command({"HGETALL", key});
    std::map<std::string, std::string> out;
    const size_t n = array_of(*r, "HGETALL");
    for (size_t i = 0; i + 1 < n; i += 2)
      out[string_of(*r->element[i], "HGETALL")] = string_of(*r->element[i + 1], "HGETALL");
    return out;
  }
  std::vector<std::string> keys(const std::string& pattern) override {
    std::vector<std::string> out;
    std::string cursor = "0";
    // SCAN visits each key at least once in a bounded number of calls; the cap guards against a
    // store that never returns cursor 0.
    for (int calls = 0; calls < 100000; ++calls) {
      Reply r = command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
      if (array_of(*r, "SCAN") != 2) bad_reply("SCAN");
      cursor = string_of(*r->element[0], "SCAN");
      for (size_t i = 0; i < array_of(*r->element[1], "SCAN"); ++i)
        out.push_back(string_of(*r->element[1]->element[i], "SCAN"));
      if (cursor == "0") break;
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }

 private:
  void connect() {
    if (ctx_) {
      redisFree(ctx_);
      ctx_ = nullptr;
    }
    redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port,
                                              to_timeval(options_.connect_timeout_s));
    if (!c || c->err) {
      const std::string why = c ? c->errstr : "out of memory";
      if (c) redisFree(c);
      throw StoreError(describe() + ": cannot connect: " + why);
    }
    redisSetTimeout(c, to_timeval(options_.command_timeout_s));
    ctx_ = c;
    try {
      // HRANDFIELD (the sweep) needs Redis 6.2; an older server is refused here, not by a
      // sweep that fails until the deadline.
      const Reply info = raw({"INFO", "server"});
      const std::string text = string_of(*info, "INFO");
      const auto at = text.find("redis_version:");
      int major = 0, minor = 0;
      if (at == std::string::npos ||
          std::sscanf(text.c_str() + at + 14, "%d.%d", &major, &minor) != 2) {
        throw StoreError(describe() + ": INFO does not name a redis_version");
      }
      if (major < 6 || (major == 6 && minor < 2)) {
        throw StoreError(describe() + ": Redis " + std::to_string(major) + "." +
                         std::to_string(minor) + " is too old (6.2 or later is needed)");
      }
      if (url_.db != 0) raw({"SELECT", std::to_string(url_.db)});
    } catch (...) {
      // Never keep a connection on the wrong database or an unusable server.
      if (ctx_) redisFree(ctx_);
      ctx_ = nullptr;
      throw;
    }
  }

  [[noreturn]] void bad_reply(const char* what) const {
    throw StoreError(describe() + ": " + what + ": unexpected reply type");
  }
  std::string string_of(const redisReply& r, const char* what) const {
    if (r.type != REDIS_REPLY_STRING && r.type != REDIS_REPLY_STATUS) bad_reply(what);
    return std::string(r.str, r.len);
  }
  int64_t integer_of(const redisReply& r, const char* what) const {
    if (r.type != REDIS_REPLY_INTEGER) bad_reply(what);
    return r.integer;
  }
  size_t array_of(const redisReply& r, const char* what) const {
    if (r.type != REDIS_REPLY_ARRAY) bad_reply(what);
    return r.elements;
  }

  // One command on the live connection; the connection is dropped on any transport error.
  Reply raw(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    ++operations_;
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (!r) {
      const std::string why = ctx_->errstr[0] ? ctx_->errstr : "no reply";
      redisFree(ctx_);
      ctx_ = nullptr;
      throw StoreError(describe() + ": " + args[0] + " failed: " + why + " (timeouts: connect " +
                       fmt_s(options_.connect_timeout_s) + ", command " +
                       fmt_s(options_.command_timeout_s) + ")");
    }
    Reply reply(r);
    if (reply->type == REDIS_REPLY_ERROR) {
      throw StoreError(describe() + ": " + args[0] + ": " + std::string(r->str, r->len));
    }
    return reply;
  }
  static std::string fmt_s(double s) {
    char buf[32];
    snprintf(buf, sizeof buf, "%g s", s);
    return buf;
  }

  Reply command(const std::vector<std::string>& args) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ctx_) connect();
    return raw(args);
  }

  StoreUrl url_;
  StoreOptions options_;
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
};

}  // namespace

std::unique_ptr<Store> open_redis_store(const StoreUrl& u, const StoreOptions& options) {
  return std::make_unique<RedisStore>(u, options);
}

}  // namespace tokamax
