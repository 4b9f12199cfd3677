// A key-value store shared by the processes of a fleet: what sharded tuning claims work and
// publishes results through (tokamax/fleet/sharded.h), and what the remote cache rung reads
// (TOKAMAX_REMOTE_CACHE). Two implementations: Redis (hiredis; `redis://host:port/db`, one
// connection per store object, every command bounded as a whole by StoreOptions) and an
// in-memory store (one process: tests, the claim-protocol simulation; its clock, latency and
// failures injectable).
//
// The operations are the few the protocols need, each one Redis command (or one short Lua
// script, atomic on the server; hash_get_all reads in pages, one command each). Expiry is the
// store's own (PX): a lease never depends on the clients' clocks agreeing. Every failure to reach
// the store, a timeout, or a reply of the wrong type is a StoreError naming the store and the
// command: an outage, which callers wait out. A key that holds what this library cannot use
// there (another writer's) is a StoreKeyError naming the key: not an outage, for the caller to
// skip that key or refuse it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tokamax/core/error.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

class StoreError : public Error {
 public:
  explicit StoreError(const std::string& what) : Error("StoreError: ", what) {}
};

// The store answered, but `key` holds what this library cannot use there: a value of another
// Redis type (WRONGTYPE: a list or a hash where a string is kept, or the reverse), a string that
// is not an integer where INCR counts, or a value over StoreOptions::max_value_bytes. Waiting does
// not mend it (another writer put it there), so it is bad input, not a StoreError.
class StoreKeyError : public InvalidArgument {
 public:
  StoreKeyError(const std::string& what, std::string key)
      : InvalidArgument(what), key_(std::move(key)) {}
  const std::string& key() const { return key_; }

 private:
  std::string key_;
};

// Each bound covers a whole exchange, not each read: a server that trickles its reply a byte at
// a time cannot stretch a wait past it.
struct StoreOptions {
  // Opening a connection: the TCP connection, then INFO (the version check) and SELECT.
  double connect_timeout_s = 2;
  // One command: waiting for another thread's command on the connection, re-opening the
  // connection if it was dropped, sending, and the whole reply.
  double command_timeout_s = 2;
  // Open the connection at the first command (within its command_timeout_s), not in open_store:
  // a store opened on a call's path costs that call one bound, not two.
  bool connect_lazily = false;
  // The longest value (a string, a hash field's value) read: one whose length header says more
  // is refused before its bytes are read, as a StoreKeyError naming the key (the connection is
  // dropped; the next command opens another). 64 MiB: a run's plan of 100,000 keys is about
  // 20 MB; the remote cache sets 1 MiB (its entries are under 1 KB).
  int64_t max_value_bytes = int64_t{64} << 20;
  // The longest whole reply (a page of a hash, say), refused likewise.
  int64_t max_reply_bytes = int64_t{1} << 30;
};

// Where a store is and how its keys are named: `redis://host:port/db?prefix=ns` (port 6379 and
// db 0 by default; the prefix, default "tokamax:", starts every key this library writes, so
// several users can share one Redis). `mem://name` is the in-memory store `name` of this
// process (tests).
struct StoreUrl {
  std::string scheme;  // "redis" or "mem"
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string prefix = "tokamax:";
  std::string name;  // mem://name
  std::string str() const;
};
// InvalidArgument naming the URL and what is wrong with it.
StoreUrl parse_store_url(const std::string& url);

class Store {
 public:
  virtual ~Store() = default;
  // For messages: the URL without credentials.
  virtual std::string describe() const = 0;
  // The namespace prefix of every key (from the URL).
  const std::string& prefix() const { return prefix_; }

  virtual std::optional<std::string> get(const std::string& key) = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // SET key value NX [PX ttl_ms]: true when the key was absent and now holds `value` (expiring
  // after ttl_ms when > 0).
  virtual bool set_if_absent(const std::string& key, const std::string& value,
                             int64_t ttl_ms = 0) = 0;
  // A lease's renewal: key expires ttl_ms from now if it still holds `value`; false if it does
  // not (expired, or taken over by another holder). In this and the other compare-and-act
  // operations, a key of another type does not hold `value`: false, not a StoreKeyError.
  virtual bool renew_if_equal(const std::string& key, const std::string& value, int64_t ttl_ms) = 0;
  // A claim: SET lease_key token NX PX ttl_ms and, if it was set, HSET list_key field token,
  // atomically (one script on Redis; both keys must share a hash tag on a cluster). A lease_key
  // of another type than a string holds no lease (another writer's value): it is replaced, with
  // a warning naming it. A list_key of another type than a hash: StoreKeyError, nothing changed.
  virtual bool claim(const std::string& lease_key, const std::string& token, int64_t ttl_ms,
                     const std::string& list_key, const std::string& field) = 0;
  // HDEL key field if the field still holds `value`.
  virtual bool hash_delete_if_equal(const std::string& key, const std::string& field,
                                    const std::string& value) = 0;
  // Deletes key if it still holds `value`.
  virtual bool delete_if_equal(const std::string& key, const std::string& value) = 0;
  virtual void del(const std::string& key) = 0;
  virtual int64_t increment(const std::string& key) = 0;  // INCR: the new value
  virtual void hash_set(const std::string& key, const std::string& field,
                        const std::string& value) = 0;
  virtual std::optional<std::string> hash_get(const std::string& key, const std::string& field) = 0;
  virtual bool hash_exists(const std::string& key, const std::string& field) = 0;
  virtual void hash_del(const std::string& key, const std::string& field) = 0;
  virtual int64_t hash_len(const std::string& key) = 0;  // HLEN
  virtual bool exists(const std::string& key) = 0;
  virtual std::vector<std::string> hash_fields(const std::string& key) = 0;
  // Up to `count` distinct fields picked at random (HRANDFIELD): a sweep's sample.
  virtual std::vector<std::string> hash_random_fields(const std::string& key, int count) = 0;
  // Every field and value of a hash, read in pages (HSCAN), each page one command with its own
  // deadline. A field whose value is over max_value_bytes is not read: its name goes to
  // `oversized`, for the caller to decide (a run drops and re-tunes it; `cache show` names it)
  // rather than one foreign value refusing the whole hash.
  struct HashContents {
    std::map<std::string, std::string> values;
    std::vector<std::string> oversized;
  };
  virtual HashContents hash_get_all(const std::string& key) = 0;
  // Keys matching a glob pattern (SCAN; for `tokamax cache show --store`).
  virtual std::vector<std::string> keys(const std::string& pattern) = 0;

  // Commands sent so far by this object (the simulation's and the benchmark's count).
  int64_t operations() const { return operations_.load(std::memory_order_relaxed); }

 protected:
  explicit Store(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string prefix_;
  std::atomic<int64_t> operations_{0};
};

// Opens the store at `url` (connects for Redis: StoreError when it cannot within the timeout;
// InvalidArgument for options out of range).
std::unique_ptr<Store> open_store(const std::string& url, const StoreOptions& options = {});

// The in-memory store: one map per name in the process, shared by every MemoryStore object of
// that name. Thread-safe (commands, counts and faults under the shared map's lock). Its clock
// (ms) and faults are settable (before use) for tests and simulations.
class MemoryStore : public Store {
 public:
  struct Faults {
    double failure_rate = 0;                 // each command throws StoreError with this probability
    double latency_ms = 0;                   // added to `now` (through on_latency) per command
    std::function<void(double)> on_latency;  // default: none (the simulation advances its clock)
    uint64_t seed = 1;
  };
  explicit MemoryStore(const std::string& name = "default", std::string prefix = "tokamax:");
  // The clock expiry reads (ms); default: steady_clock.
  void set_clock(std::function<int64_t()> now_ms) { now_ms_ = std::move(now_ms); }
  void set_faults(Faults faults);
  // Commands sent by this object, by command.
  const std::map<std::string, int64_t>& operation_counts() const { return counts_; }
  // Drops every key of every MemoryStore named `name`.
  static void reset(const std::string& name);

  std::string describe() const override { return "mem://" + name_; }
  std::optional<std::string> get(const std::string& key) override;
  void set(const std::string& key, const std::string& value) override;
  bool set_if_absent(const std::string& key, const std::string& value, int64_t ttl_ms) override;
  bool renew_if_equal(const std::string& key, const std::string& value, int64_t ttl_ms) override;
  bool delete_if_equal(const std::string& key, const std::string& value) override;
  bool claim(const std::string& lease_key, const std::string& token, int64_t ttl_ms,
             const std::string& list_key, const std::string& field) override;
  bool hash_delete_if_equal(const std::string& key, const std::string& field,
                            const std::string& value) override;
  void del(const std::string& key) override;
  int64_t increment(const std::string& key) override;
  void hash_set(const std::string& key, const std::string& field,
                const std::string& value) override;
  std::optional<std::string> hash_get(const std::string& key, const std::string& field) override;
  bool hash_exists(const std::string& key, const std::string& field) override;
  void hash_del(const std::string& key, const std::string& field) override;
  int64_t hash_len(const std::string& key) override;
  bool exists(const std::string& key) override;
  std::vector<std::string> hash_fields(const std::string& key) override;
  std::vector<std::string> hash_random_fields(const std::string& key, int count) override;
  HashContents hash_get_all(const std::string& key) override;
  std::vector<std::string> keys(const std::string& pattern) override;

  struct Data;

 private:
  // Counts the command, applies the faults; the returned lock holds the shared map.
  std::unique_lock<std::mutex> begin(const char* command);
  std::string name_;
  std::shared_ptr<Data> data_;
  std::function<int64_t()> now_ms_;
  Faults faults_;
  std::mt19937_64 rng_;
  std::map<std::string, int64_t> counts_;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
