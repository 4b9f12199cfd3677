// The Redis store: one connection per object, used by one thread at a time (a lease's renewal
// thread shares it with the tuner; the remote cache rung, every thread that looks a key up).
//
// Time. hiredis makes the TCP connection, formats each command and parses each reply; the waits
// are this file's own (poll on a non-blocking socket), so that each command is bounded by one
// deadline rather than each read by a timeout: a server that trickles a reply a byte at a time
// cannot stretch a command past command_timeout_s, as it could with the socket's receive timeout
// (hiredis's bound), which starts again with every byte. Waiting for the connection counts against
// that deadline too, so that threads do not queue past their bound behind a slow reply. One
// connection suffices (a remote lookup is one round trip per key and process, 0.07-0.10 ms on
// loopback): a pool would multiply the connections a fleet of processes opens to one Redis, and
// a fast failure while another lookup is in flight would give a call another config by the
// timing of another thread's. Opening the store (TCP connect, INFO, SELECT) is bounded by
// connect_timeout_s as a whole; a command that finds no connection opens one within its own
// deadline.
//
// Size. Each reply is checked as it arrives (ReplyScanner), before hiredis's reader sees it: a
// value over max_value_bytes is refused from its length header, unread.
//
// A connection that failed (a transport error, a timeout, a reply that is not RESP or too large)
// is dropped, so that a late reply is never read as the next command's, and the next command
// re-opens it: a Redis restarted mid-run is used again.
#include "fleet/redis_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>

#include "tokamax/core/log.h"

namespace tokamax {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point after(double s) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

double seconds_until(Clock::time_point t) {
  return std::chrono::duration<double>(t - Clock::now()).count();
}

timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - std::floor(s)) * 1e6);
  return tv;
}

// getaddrinfo's first IPv4 or IPv6 address of `host`, numeric.
std::string lookup_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) throw StoreError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owned(found, freeaddrinfo);
  for (const addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    char numeric[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, numeric, sizeof numeric, nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      return numeric;
    }
  }
  throw StoreError("cannot resolve host '" + host + "': no IPv4 or IPv6 address");
}

// Compare-and-expire and compare-and-delete, atomic on the server. A key of another type (another
// writer's) does not hold the value: 0, where GET or HGET on it would fail the script.
constexpr const char* kRenewScript =
    "if redis.call('type', KEYS[1]).ok == 'string' and redis.call('get', KEYS[1]) == ARGV[1] "
    "then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
constexpr const char* kReleaseScript =
    "if redis.call('type', KEYS[1]).ok == 'string' and redis.call('get', KEYS[1]) == ARGV[1] "
    "then return redis.call('del', KEYS[1]) else return 0 end";
constexpr const char* kHashDeleteScript =
    "if redis.call('type', KEYS[1]).ok == 'hash' and redis.call('hget', KEYS[1], ARGV[1]) == "
    "ARGV[2] then return redis.call('hdel', KEYS[1], ARGV[1]) else return 0 end";

// SET NX PX and the in-flight listing in one step, so that a claim is never unlisted. The list's
// type is checked first: a script's error does not undo what it did before. A lease key of
// another type is no lease (SET NX would keep it forever, and its key unclaimed): replaced, and
// 2 returned so that the replacement is named in a warning.
constexpr const char* kClaimScript =
    "local list = redis.call('type', KEYS[2]).ok "
    "if list ~= 'none' and list ~= 'hash' then "
    "return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. list .. ', not a hash') "
    "end "
    "local lease, replaced = redis.call('type', KEYS[1]).ok, 0 "
    "if lease ~= 'none' and lease ~= 'string' then redis.call('del', KEYS[1]) replaced = 1 end "
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
    "redis.call('hset', KEYS[2], ARGV[3], ARGV[1]) return 1 + replaced else return 0 end";

// One page of HSCAN with the values over a size limit left on the server: their fields are
// listed apart, so that one oversized value (another writer's) costs its own field, not the hash.
constexpr const char* kHashPageScript =
    "local r = redis.call('hscan', KEYS[1], ARGV[1], 'COUNT', ARGV[2]) "
    "local page, big, limit = {}, {}, tonumber(ARGV[3]) "
    "for i = 1, #r[2], 2 do "
    "if string.len(r[2][i + 1]) > limit then big[#big + 1] = r[2][i] "
    "else page[#page + 1] = r[2][i] page[#page + 1] = r[2][i + 1] end "
    "end "
    "return {r[1], page, big}";

// SCAN and HSCAN visit each element at least once in a bounded number of calls; the cap guards
// against a store that never returns cursor 0.
constexpr int kMaxScanCalls = 100000;

// Walks a RESP2 reply as its bytes arrive, ahead of hiredis's reader, to refuse one that breaks
// a bound before the bytes it announces are read: a value longer than the value limit (from its
// $<length> header), a reply longer than the reply limit, an array of more than kMaxElements
// (hiredis 0.14 allocates an array's element pointers from its header: "*2000000000" would ask
// for 16 GB), or nested deeper than kMaxDepth (no reply of the commands used here is deeper
// than 2). A type other than RESP2's five is refused too (RESP3's, which hiredis 0.14 does not
// parse), and so is a length or an integer that is not a whole int64. It also tells where the
// reply ends, so that the reader is fed exactly one reply.
class ReplyScanner {
 public:
  static constexpr int64_t kMaxElements = int64_t{1} << 20;
  static constexpr size_t kMaxDepth = 4;
  enum class State { kMore, kDone, kTooLarge, kMalformed };

  ReplyScanner(int64_t max_value_bytes, int64_t max_reply_bytes)
      : max_value_(max_value_bytes), max_reply_(max_reply_bytes) {}

  // Consumes the bytes of p[0, n) that belong to the reply (*used of them): kDone when it ended
  // there, kMore when it goes on; kTooLarge or kMalformed (why() says how) as soon as it breaks a
  // bound, before the bytes its header announces.
  State feed(const char* p, size_t n, size_t* used) {
    size_t i = 0;
    State state = State::kMore;
    while (i < n && state == State::kMore) {
      if (body_left_ > 0) {  // a bulk string's body and its CRLF
        const size_t take = static_cast<size_t>(std::min<int64_t>(body_left_, n - i));
        i += take;
        body_left_ -= static_cast<int64_t>(take);
        if (body_left_ == 0) state = element_done();
        continue;
      }
      const char* nl = static_cast<const char*>(std::memchr(p + i, '\n', n - i));
      const size_t end = nl ? static_cast<size_t>(nl - p) + 1 : n;
      line_.append(p + i, end - i);
      total_ += static_cast<int64_t>(end - i);
      i = end;
      if (total_ > max_reply_) {
        state = too_large("a reply of more than " + std::to_string(max_reply_) + " bytes");
      } else if (static_cast<int64_t>(line_.size()) > std::min(max_value_, max_reply_) + 32) {
        state = too_large("a line of more than " + std::to_string(line_.size()) + " bytes");
      } else if (nl && line_.size() >= 2 && line_[line_.size() - 2] == '\r') {
        state = header();  // a line ends only at CRLF (a lone LF is part of it, as for hiredis)
        line_.clear();
      }
    }
    *used = i;
    return state;
  }
  const std::string& why() const { return why_; }

 private:
  State too_large(const std::string& why) {
    why_ = why;
    return State::kTooLarge;
  }
  State malformed(const std::string& why) {
    why_ = why;
    return State::kMalformed;
  }

  // A complete header line in line_ (CRLF included).
  State header() {
    if (line_.size() < 3) return malformed("an empty line");
    const char type = line_[0];
    const std::string_view body(line_.data() + 1, line_.size() - 3);
    if (type == '+' || type == '-') return element_done();
    if (type == ':') {
      // Checked here: hiredis 0.14 reads an integer without checking its range (a signed
      // overflow, undefined, for 20 digits).
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
      if (body.empty() || ec != std::errc() || end != body.data() + body.size()) {
        return malformed("an integer that is not one: '" + std::string(body) + "'");
      }
      return element_done();
    }
    if (type != '$' && type != '*') {
      char shown[8];
      std::snprintf(shown, sizeof shown,
                    std::isprint(static_cast<unsigned char>(type)) ? "%c" : "\\x%02x",
                    static_cast<unsigned char>(type));
      return malformed(std::string("a reply of unknown type '") + shown + "'");
    }
    int64_t len = 0;
    const auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), len);
    if (body.empty() || ec != std::errc() || end != body.data() + body.size() || len < -1) {
      return malformed("a length that is not a count: '" + std::string(body) + "'");
    }
    if (len == -1) return element_done();  // nil
    if (type == '$') {
      if (len > max_value_) {
        return too_large("a value of " + std::to_string(len) + " bytes, over the limit of " +
                         std::to_string(max_value_));
      }
      if (len > max_reply_ - total_ - 2) {  // total_ <= max_reply_ here: no overflow
        return too_large("a reply of more than " + std::to_string(max_reply_) + " bytes");
      }
      body_left_ = len + 2;
      total_ += len + 2;
      return State::kMore;
    }
    if (len > kMaxElements) {
      return malformed("an array of " + std::to_string(len) + " elements (at most " +
                       std::to_string(kMaxElements) + ")");
    }
    if (len == 0) return element_done();
    if (open_.size() == kMaxDepth) {
      return malformed("arrays nested deeper than " + std::to_string(kMaxDepth));
    }
    open_.push_back(len);
    return State::kMore;
  }

  // One element (or the reply) ended: kDone when it closed every open array.
  State element_done() {
    while (!open_.empty()) {
      if (--open_.back() > 0) return State::kMore;
      open_.pop_back();
    }
    return State::kDone;
  }

  const int64_t max_value_, max_reply_;
  std::string line_;           // the header line read so far
  int64_t body_left_ = 0;      // bytes of a bulk string's body (and CRLF) still to come
  int64_t total_ = 0;          // bytes of the reply so far, bodies counted from their headers
  std::vector<int64_t> open_;  // elements still to come in each open array, outermost first
  std::string why_;
};

// The connection's use by one thread at a time, taken by a deadline. Not std::timed_mutex: its
// timed lock is pthread_mutex_clocklock, which clang 14's ThreadSanitizer does not intercept, so
// that each unlock after one reads to it as the unlock of an unlocked mutex.
class Gate {
 public:
  void enter() {
    std::unique_lock<std::mutex> lock(mu_);
    free_.wait(lock, [this] { return !busy_; });
    busy_ = true;
  }
  // False when another thread still holds it at `deadline`.
  bool enter_by(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!free_.wait_until(lock, deadline, [this] { return !busy_; })) return false;
    busy_ = true;
    return true;
  }
  void leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    free_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable free_;
  bool busy_ = false;
};

// Leaves the gate when it goes (entered by the caller).
class InGate {
 public:
  explicit InGate(Gate& g) : g_(g) {}
  ~InGate() { g_.leave(); }
  InGate(const InGate&) = delete;
  InGate& operator=(const InGate&) = delete;

 private:
  Gate& g_;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;
struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};
using Reader = std::unique_ptr<redisReader, ReaderDeleter>;

class RedisStore : public Store {
 public:
  // On a socket already connected (`fd`, taken over; tests and the fuzzer): the handshake is made
  // on it, and a connection lost is not re-opened.
  RedisStore(int fd, const StoreUrl& u, const StoreOptions& o)
      : Store(u.prefix), url_(u), options_(o), reader_(redisReaderCreate()), reconnectable_(false) {
    gate_.enter();
    const InGate in(gate_);
    adopt(fd, after(options_.connect_timeout_s));
  }
  RedisStore(const StoreUrl& u, const StoreOptions& o)
      : Store(u.prefix), url_(u), options_(o), reader_(redisReaderCreate()) {
    if (options_.connect_lazily) return;
    gate_.enter();
    const InGate in(gate_);
    connect(after(options_.connect_timeout_s));
  }
  ~RedisStore() override {
    if (fd_ >= 0) ::close(fd_);
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
    const int64_t r = integer_of(*command({"EVAL", kClaimScript, "2", lease_key, list_key, token,
                                           std::to_string(ttl_ms), field}),
                                 "EVAL claim");
    if (r == 2) {
      TOKAMAX_LOG("fleet", kWarning,
                  describe() + ": '" + lease_key +
                      "' held a value of another type than a lease (another writer's); "
                      "replaced by this process's lease");
    }
    return r >= 1;
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
  // In pages (HSCAN in a script that leaves the oversized values on the server), each one
  // command with its own deadline: a run's results (thousands of keys, 20 KB each) are not one
  // reply that must arrive whole within one command's bound.
  HashContents hash_get_all(const std::string& key) override {
    HashContents out;
    std::string cursor = "0";
    const std::string limit = std::to_string(options_.max_value_bytes);
    for (int calls = 0; calls < kMaxScanCalls; ++calls) {
      Reply r = command({"EVAL", kHashPageScript, "1", key, cursor, "1000", limit});
      if (array_of(*r, "HSCAN") != 3) bad_reply("HSCAN");
      cursor = string_of(*r->element[0], "HSCAN");
      const redisReply& page = *r->element[1];
      const size_t n = array_of(page, "HSCAN");
      if (n % 2 != 0) bad_reply("HSCAN");
      for (size_t i = 0; i < n; i += 2) {
        out.values[string_of(*page.element[i], "HSCAN")] = string_of(*page.element[i + 1], "HSCAN");
      }
      const redisReply& big = *r->element[2];
      for (size_t i = 0; i < array_of(big, "HSCAN"); ++i)
        out.oversized.push_back(string_of(*big.element[i], "HSCAN"));
      if (cursor == "0") break;
    }
    // HSCAN may return a field twice (a rehash between pages).
    std::sort(out.oversized.begin(), out.oversized.end());
    out.oversized.erase(std::unique(out.oversized.begin(), out.oversized.end()),
                        out.oversized.end());
    return out;
  }
  std::vector<std::string> keys(const std::string& pattern) override {
    std::vector<std::string> out;
    std::string cursor = "0";
    for (int calls = 0; calls < kMaxScanCalls; ++calls) {
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
  // A new connection (the old one dropped) and its handshake, all by `deadline`.
  void connect(Clock::time_point deadline) {
    drop();
    if (!reconnectable_) {
      throw StoreError(describe() +
                       ": the connection was lost (a store on a given socket is not "
                       "re-opened)");
    }
    const double left = seconds_until(deadline);
    if (left <= 0) throw StoreError(describe() + ": cannot connect: no time left" + timeouts());
    std::string address;
    try {
      address = resolve_host(url_.host, left);
    } catch (const StoreError& e) {
      throw StoreError(describe() + ": cannot connect: " + e.what());
    }
    const double rest = seconds_until(deadline);
    if (rest <= 0) throw StoreError(describe() + ": cannot connect: no time left" + timeouts());
    redisContext* c = redisConnectWithTimeout(address.c_str(), url_.port, to_timeval(rest));
    if (!c || c->err) {
      const std::string why = c ? c->errstr : "out of memory";
      if (c) redisFree(c);
      throw StoreError(describe() + ": cannot connect: " + why);
    }
    adopt(redisFreeKeepFd(c), deadline);  // this file does the socket's I/O from here on
  }

  // Takes over a connected socket and makes the handshake on it, by deadline.
  void adopt(int fd, Clock::time_point deadline) {
    fd_ = fd;
    const int flags = fcntl(fd_, F_GETFL);
    if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) {
      const std::string why = std::strerror(errno);
      drop();
      throw StoreError(describe() + ": cannot connect: " + why);
    }
    // HRANDFIELD (the sweep) needs Redis 6.2; an older server is refused here, not by a
    // sweep that fails until the deadline.
    try {
      const Reply info = roundtrip({"INFO", "server"}, deadline, /*handshake=*/true);
      const auto [major, minor] = redis_version(string_of(*info, "INFO"));
      if (major < 6 || (major == 6 && minor < 2)) {
        throw StoreError(describe() + ": Redis " + std::to_string(major) + "." +
                         std::to_string(minor) + " is too old (6.2 or later is needed)");
      }
      if (url_.db != 0) roundtrip({"SELECT", std::to_string(url_.db)}, deadline, true);
    } catch (...) {
      // Never keep a connection on the wrong database or an unusable server.
      drop();
      throw;
    }
  }

  // "redis_version:MAJOR.MINOR" of an INFO reply. Parsed with from_chars, not sscanf's %d, whose
  // result for a number out of int's range (a server's to choose) is undefined.
  std::pair<int, int> redis_version(const std::string& info) const {
    constexpr std::string_view kField = "redis_version:";
    const auto at = info.find(kField);
    int major = 0, minor = 0;
    const char* p = at == std::string::npos ? nullptr : info.data() + at + kField.size();
    const char* end = info.data() + info.size();
    if (p) {
      const auto a = std::from_chars(p, end, major);
      if (a.ec == std::errc() && a.ptr < end && *a.ptr == '.' &&
          std::from_chars(a.ptr + 1, end, minor).ec == std::errc()) {
        return {major, minor};
      }
    }
    throw StoreError(describe() + ": INFO does not name a redis_version");
  }

  // Closes the connection and forgets whatever part of a reply was read.
  void drop() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    reader_.reset(redisReaderCreate());
    ahead_.clear();
  }

  std::string timeouts() const {
    return " (timeouts, each bounding a whole exchange: connect " +
           fmt_s(options_.connect_timeout_s) + ", command " + fmt_s(options_.command_timeout_s) +
           ")";
  }
  // The connection is unusable: dropped, and the command fails.
  [[noreturn]] void transport_failure(const std::string& what, const std::string& why) {
    drop();
    throw StoreError(describe() + ": " + what + " failed: " + why + timeouts());
  }

  // Until fd_ is ready for `events` (or has failed: the next send or recv says how), by deadline.
  void wait_for(short events, Clock::time_point deadline, const std::string& what) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        transport_failure(what, events == POLLOUT ? "timed out sending the command"
                                                  : "timed out before the whole reply came");
      }
      // Rounded up: a timeout of 0 would not wait at all.
      const int ms = static_cast<int>(std::min<int64_t>((left + 999) / 1000, INT_MAX));
      pollfd p{fd_, events, 0};
      const int r = ::poll(&p, 1, ms);
      if (r > 0) return;
      if (r < 0 && errno != EINTR) transport_failure(what, std::strerror(errno));
    }
  }

  void send_command(const std::vector<std::string>& args, Clock::time_point deadline) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    char* formatted = nullptr;
    const int len =
        redisFormatCommandArgv(&formatted, static_cast<int>(args.size()), argv.data(), lens.data());
    if (len < 0) throw StoreError(describe() + ": " + args[0] + ": out of memory");
    const std::unique_ptr<char, void (*)(char*)> owned(formatted, redisFreeCommand);
    for (size_t sent = 0; sent < static_cast<size_t>(len);) {
      const ssize_t n = ::send(fd_, formatted + sent, len - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_for(POLLOUT, deadline, args[0]);
      } else if (n < 0 && errno != EINTR) {
        transport_failure(args[0], std::strerror(errno));
      }
    }
  }

  // The next whole reply to `args`, by deadline: the scanner checks the bytes as they come, and
  // hiredis's reader is fed exactly the reply's bytes (any after it wait for the next command).
  Reply read_reply(const std::vector<std::string>& args, Clock::time_point deadline,
                   int64_t max_value_bytes, int64_t max_reply_bytes) {
    const std::string& what = args[0];
    ReplyScanner scan(max_value_bytes, max_reply_bytes);
    std::string chunk;
    chunk.swap(ahead_);
    for (;;) {
      if (!chunk.empty()) {
        size_t used = 0;
        const ReplyScanner::State state = scan.feed(chunk.data(), chunk.size(), &used);
        if (state == ReplyScanner::State::kTooLarge) too_large(args, scan.why());
        if (state == ReplyScanner::State::kMalformed) {
          transport_failure(what, "not a Redis reply: " + scan.why());
        }
        if (redisReaderFeed(reader_.get(), chunk.data(), used) != REDIS_OK) {
          transport_failure(what, "out of memory");
        }
        if (state == ReplyScanner::State::kDone) {
          ahead_.assign(chunk, used, std::string::npos);
          void* r = nullptr;
          if (redisReaderGetReply(reader_.get(), &r) != REDIS_OK || !r) {
            transport_failure(what, std::string("not a Redis reply: ") +
                                        (r ? "" : "hiredis found it incomplete ") +
                                        reader_->errstr);
          }
          return Reply(static_cast<redisReply*>(r));
        }
      }
      wait_for(POLLIN, deadline, what);
      chunk.resize(65536);
      const ssize_t n = ::recv(fd_, chunk.data(), chunk.size(), 0);
      chunk.resize(n > 0 ? static_cast<size_t>(n) : 0);
      if (n == 0) {
        transport_failure(what, "the server closed the connection");
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        transport_failure(what, std::strerror(errno));
      }
    }
  }

  // A reply over a size limit: its bytes are left unread (the connection dropped: the rest of
  // the reply is on its way), and the key is named.
  [[noreturn]] void too_large(const std::vector<std::string>& args, const std::string& why) {
    drop();
    const std::vector<std::string> keys = keys_of(args);
    const std::string msg =
        describe() + ": " + args[0] + (keys.empty() ? "" : " '" + keys[0] + "'") + ": " + why +
        " (StoreOptions max_value_bytes " + std::to_string(options_.max_value_bytes) +
        ", max_reply_bytes " + std::to_string(options_.max_reply_bytes) + "); not read";
    if (keys.empty()) throw StoreError(msg);
    throw StoreKeyError(msg, keys[0]);
  }

  // The keys a command names (for errors): a script's KEYS, else a key command's first argument.
  static std::vector<std::string> keys_of(const std::vector<std::string>& args) {
    if (args[0] == "EVAL") {
      const size_t n = std::min<size_t>(std::stoul(args[2]), args.size() - 3);
      return {args.begin() + 3, args.begin() + 3 + static_cast<ptrdiff_t>(n)};
    }
    if (args[0] == "INFO" || args[0] == "SELECT" || args[0] == "SCAN") return {};
    return {args[1]};
  }

  // An error reply: a StoreKeyError when a key holds what the command cannot use (another
  // writer's value: waiting will not mend it), else a StoreError.
  [[noreturn]] void error_reply(const std::vector<std::string>& args, const redisReply& reply) {
    const std::string text(reply.str, reply.len);
    const std::vector<std::string> keys = keys_of(args);
    const bool wrong_type = text.find("WRONGTYPE") != std::string::npos;
    const bool not_integer = args[0] == "INCR" && text.find("not an integer") != std::string::npos;
    if (keys.empty() || (!wrong_type && !not_integer)) {
      throw StoreError(describe() + ": " + args[0] + ": " + text);
    }
    // The key the server's message names (the claim script's does), else the first.
    std::string key = keys[0];
    for (const auto& k : keys) {
      if (text.find(k) != std::string::npos) key = k;
    }
    throw StoreKeyError(describe() + ": " + args[0] + " '" + key + "': " + text +
                            " (a value this library did not write there)",
                        key);
  }

  // One command on the live connection: sent and its whole reply read by `deadline`. The
  // handshake's replies (INFO, SELECT) are no values of the store: a fixed 1 MiB bounds them.
  Reply roundtrip(const std::vector<std::string>& args, Clock::time_point deadline,
                  bool handshake = false) {
    ++operations_;
    send_command(args, deadline);
    constexpr int64_t kHandshakeLimit = int64_t{1} << 20;
    Reply reply =
        handshake ? read_reply(args, deadline, kHandshakeLimit, kHandshakeLimit)
                  : read_reply(args, deadline, options_.max_value_bytes, options_.max_reply_bytes);
    if (reply->type == REDIS_REPLY_ERROR) error_reply(args, *reply);
    return reply;
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
  static std::string fmt_s(double s) {
    char buf[32];
    snprintf(buf, sizeof buf, "%g s", s);
    return buf;
  }

  // One command, by one deadline that covers the wait for the connection (another thread's
  // command) and re-opening it if it was dropped.
  Reply command(const std::vector<std::string>& args) {
    const Clock::time_point deadline = after(options_.command_timeout_s);
    if (!gate_.enter_by(deadline)) {
      throw StoreError(describe() + ": " + args[0] +
                       " failed: timed out waiting for another thread's command" + timeouts());
    }
    const InGate in(gate_);
    if (fd_ < 0) connect(std::min(deadline, after(options_.connect_timeout_s)));
    return roundtrip(args, deadline);
  }

  StoreUrl url_;
  StoreOptions options_;
  Gate gate_;  // everything below
  int fd_ = -1;
  Reader reader_;
  const bool reconnectable_ = true;
  std::string ahead_;  // bytes read past the last reply (a server's extra bytes): the next one's
};

}  // namespace

std::unique_ptr<Store> open_redis_store(const StoreUrl& u, const StoreOptions& options) {
  return std::make_unique<RedisStore>(u, options);
}

std::unique_ptr<Store> open_redis_store_on_fd(int fd, const std::string& name,
                                              const StoreOptions& options) {
  StoreUrl u;
  u.scheme = "redis";
  u.host = name;
  return std::make_unique<RedisStore>(fd, u, options);
}

std::string resolve_host(const std::string& host, double timeout_s, const HostLookup& lookup) {
  in6_addr any;
  if (inet_pton(AF_INET, host.c_str(), &any) == 1 || inet_pton(AF_INET6, host.c_str(), &any) == 1)
    return host;
  // Shared with the lookup's thread, which may outlive this call.
  struct Pending {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string address, error;
  };
  auto pending = std::make_shared<Pending>();
  std::thread([pending, host, lookup] {
    std::string address, error;
    try {
      address = lookup ? lookup(host) : lookup_host(host);
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->address = std::move(address);
    pending->error = std::move(error);
    pending->done = true;
    pending->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(pending->mu);
  if (!pending->cv.wait_until(lock, after(std::max(0.0, timeout_s)),
                              [&] { return pending->done; })) {
    throw StoreError(fmt::format("cannot resolve host '{}' within {:.3g} s", host, timeout_s));
  }
  if (!pending->error.empty()) throw StoreError(pending->error);
  return pending->address;
}

}  // namespace tokamax
