// Fleet tuning: store URLs, the in-memory and Redis stores, the claim protocol (deterministic,
// on the in-memory store's settable clock), its simulation at fleet scale, the makespan of
// cost-ordered claims against XLA's count split, and the remote cache rung. The multi-process
// runs of `tokamax autotune --store` are in fleet_cli_test.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "fleet/redis_store.h"
#include "tests/expect_error.h"
#include "tests/fleet/fake_redis.h"
#include "tests/fleet/redis_server.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

std::string scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tokamax_fleet_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Redis tests need redis-server (scripts/install-deps installs it); outside CI they skip.
#define REQUIRE_REDIS()                                                               \
  do {                                                                                \
    if (!testing::have_redis_server()) {                                              \
      if (std::getenv("CI")) FAIL() << "redis-server missing (scripts/install-deps)"; \
      GTEST_SKIP() << "redis-server not installed";                                   \
    }                                                                                 \
  } while (0)

TEST(StoreUrl, ParsesAndRefuses) {
  const StoreUrl u = parse_store_url("redis://10.0.0.5:7000/3?prefix=team:");
  EXPECT_EQ(u.host, "10.0.0.5");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 3);
  EXPECT_EQ(u.prefix, "team:");
  const StoreUrl d = parse_store_url("redis://myhost");
  EXPECT_EQ(d.port, 6379);
  EXPECT_EQ(d.db, 0);
  EXPECT_EQ(d.prefix, "tokamax:");
  EXPECT_EQ(parse_store_url("mem://x").name, "x");
  testing::expect_invalid_argument([&] { parse_store_url("localhost:6379"); }, "expected redis://");
  testing::expect_invalid_argument([&] { parse_store_url("http://h"); }, "scheme 'http'");
  testing::expect_invalid_argument([&] { parse_store_url("redis://h:99999"); }, "port '99999'");
  testing::expect_invalid_argument([&] { parse_store_url("redis://h:1/x"); }, "database 'x'");
  testing::expect_invalid_argument([&] { parse_store_url("redis://u:p@h"); }, "credentials");
  testing::expect_invalid_argument([&] { parse_store_url("redis://h?db=2"); },
                                   "unknown parameter 'db=2'");
}

// The operations the protocols rely on, against any store.
void check_store_semantics(Store& s, const std::function<void(int64_t)>& advance_ms) {
  s.del("k");
  EXPECT_FALSE(s.get("k"));
  EXPECT_TRUE(s.set_if_absent("k", "a", 500));
  EXPECT_FALSE(s.set_if_absent("k", "b", 500));
  EXPECT_EQ(s.get("k").value_or(""), "a");
  EXPECT_FALSE(s.renew_if_equal("k", "b", 500));
  EXPECT_TRUE(s.renew_if_equal("k", "a", 500));
  EXPECT_TRUE(s.exists("k"));
  advance_ms(800);  // past the lease: gone, on the store's clock
  EXPECT_FALSE(s.exists("k"));
  EXPECT_TRUE(s.set_if_absent("k", "b", 0));
  EXPECT_FALSE(s.delete_if_equal("k", "a"));
  EXPECT_TRUE(s.delete_if_equal("k", "b"));
  s.del("n");
  EXPECT_EQ(s.increment("n"), 1);
  EXPECT_EQ(s.increment("n"), 2);
  s.del("h");
  s.hash_set("h", "f1", "v1");
  s.hash_set("h", "f2", std::string("v\0 2", 4));  // binary-safe
  EXPECT_EQ(s.hash_len("h"), 2);
  EXPECT_TRUE(s.hash_exists("h", "f1"));
  EXPECT_EQ(s.hash_get("h", "f2").value_or(""), std::string("v\0 2", 4));
  EXPECT_EQ(s.hash_fields("h"), (std::vector<std::string>{"f1", "f2"}));
  s.hash_del("h", "f1");
  EXPECT_EQ(s.hash_get_all("h").values.size(), 1u);
  EXPECT_FALSE(s.hash_get("h", "f1"));
  EXPECT_EQ(s.keys("h*"), (std::vector<std::string>{"h"}));
  // A key of another type than a command expects (a foreign writer's value) is a StoreKeyError
  // naming it, not an outage (a StoreError); the compare-and-act operations find no match in it.
  try {
    s.get("h");
    ADD_FAILURE() << "GET of a hash";
  } catch (const StoreKeyError& e) {
    EXPECT_EQ(e.key(), "h");
  }
  s.set("str", "not a number");
  EXPECT_THROW(s.hash_get("str", "f"), StoreKeyError);
  EXPECT_THROW(s.increment("str"), StoreKeyError);
  EXPECT_FALSE(s.renew_if_equal("h", "v", 500));
  EXPECT_FALSE(s.delete_if_equal("h", "v"));
  EXPECT_FALSE(s.hash_delete_if_equal("str", "f", "v"));
  // A lease key of another type holds no lease: a claim replaces it. An in-flight list of
  // another type refuses the claim before anything changes.
  s.del("list");
  EXPECT_TRUE(s.claim("h", "token", 500, "list", "0"));
  EXPECT_EQ(s.get("h").value_or(""), "token");
  EXPECT_EQ(s.hash_get("list", "0").value_or(""), "token");
  s.del("lease");
  EXPECT_THROW(s.claim("lease", "t", 500, "str", "0"), StoreKeyError);
  EXPECT_FALSE(s.exists("lease"));
  EXPECT_GT(s.operations(), 20);
}

TEST(MemoryStore, Semantics) {
  MemoryStore::reset("semantics");
  MemoryStore s("semantics");
  int64_t now = 1000;
  s.set_clock([&] { return now; });
  check_store_semantics(s, [&](int64_t ms) { now += ms; });
}

TEST(RedisStore, SemanticsAgainstARealServer) {
  REQUIRE_REDIS();
  testing::RedisServer server(scratch("semantics"));
  ASSERT_TRUE(server.running());
  const auto s = open_store(server.url());
  check_store_semantics(
      *s, [](int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  // A hash read whole in pages (HSCAN): every field once, of a hash past one page.
  for (int i = 0; i < 2500; ++i) s->hash_set("big", std::to_string(i), std::to_string(2 * i));
  const auto all = s->hash_get_all("big").values;
  ASSERT_EQ(all.size(), 2500u);
  EXPECT_EQ(all.at("1234"), "2468");
  // A restarted server is reconnected to by the next command.
  server.stop();
  EXPECT_THROW(s->get("k"), StoreError);
  server.start();
  EXPECT_NO_THROW(s->set("k", "back"));
}

TEST(RedisStore, UnreachableOrSilentStoresFailWithinTheirTimeouts) {
  using clock = std::chrono::steady_clock;
  // Nothing listens: refused at once.
  const int closed = testing::free_port();
  auto t0 = clock::now();
  EXPECT_THROW(open_store("redis://127.0.0.1:" + std::to_string(closed) + "/0"), StoreError);
  EXPECT_LT(std::chrono::duration<double>(clock::now() - t0).count(), 2.5);
  // Listens but never answers (a hung server): the command timeout bounds the wait.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string url = "redis://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/0";
  t0 = clock::now();
  try {
    open_store(url, {0.5, 0.3});  // connects, then waits for INFO's reply
    ADD_FAILURE() << "no error from a server that never answers";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("INFO failed"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(clock::now() - t0).count(), 2.0);
  close(fd);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// getaddrinfo has no timeout: a store named by a host whose DNS server does not answer held
// open_store (and the remote rung) for as long as the resolver waited. The lookup now ends by the
// connection's deadline.
TEST(RedisStore, AHostNameLookupIsBoundedByItsDeadline) {
  EXPECT_EQ(resolve_host("127.0.0.1", 0.1), "127.0.0.1");
  EXPECT_EQ(resolve_host("::1", 0.1), "::1");
  const std::string local = resolve_host("localhost", 10);
  EXPECT_TRUE(local == "127.0.0.1" || local == "::1") << local;
  const auto hang = [](const std::string&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return std::string("127.0.0.1");
  };
  const auto t0 = std::chrono::steady_clock::now();
  try {
    resolve_host("dns.does-not-answer.example", 0.2, hang);
    ADD_FAILURE() << "a lookup that hangs was waited for";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("within 0.2 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_THROW(resolve_host("no-such-host.invalid", 3), StoreError);
  // A store named by its host name: the same store as by its address.
  testing::FakeRedis server(testing::FakeRedis::answer_info_then(
      [](const std::vector<std::string>&) { return testing::FakeRedis::Answer{"$1\r\nv\r\n"}; }));
  std::string by_name = server.url();
  by_name.replace(by_name.find("127.0.0.1"), 9, "localhost");
  if (local == "127.0.0.1") {
    EXPECT_EQ(open_store(by_name)->get("k").value_or(""), "v");
  }
}

// A server that answers a byte every 0.3 s never lets a read time out, so a bound per read
// let one command take minutes. Every command, opening the connection included, now ends by
// one deadline: 1 s here (the checks allow 5 s for a loaded machine).
TEST(RedisStore, ATricklingServerCannotStretchACommandPastItsTimeout) {
  using testing::FakeRedis;
  {
    // The handshake's reply trickled: opening fails within the connect timeout.
    FakeRedis server([](const std::vector<std::string>&) {
      return FakeRedis::Answer{FakeRedis::info_reply(), 0, 0.3};
    });
    const auto t0 = std::chrono::steady_clock::now();
    try {
      open_store(server.url(), {1, 1});
      ADD_FAILURE() << "opened a store whose INFO reply trickles";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("INFO failed: timed out"), std::string::npos)
          << e.what();
    }
    EXPECT_LT(seconds_since(t0), 5);
  }
  // A command's reply trickled (a 100-byte value: 30 s at that pace).
  FakeRedis server(FakeRedis::answer_info_then([](const std::vector<std::string>&) {
    return FakeRedis::Answer{FakeRedis::bulk(std::string(100, 'v')), 0, 0.3};
  }));
  const auto s = open_store(server.url(), {1, 1});
  for (int i = 0; i < 2; ++i) {  // the second after re-opening the dropped connection
    const auto t0 = std::chrono::steady_clock::now();
    try {
      s->get("k");
      ADD_FAILURE() << "a trickled reply was read whole";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("GET failed: timed out"), std::string::npos) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 5);
  }
  // Slow but within the bound: each reply whole after 0.2 s is read.
  FakeRedis slow(FakeRedis::answer_info_then([](const std::vector<std::string>&) {
    return FakeRedis::Answer{FakeRedis::bulk("value"), 0.2, 0};
  }));
  EXPECT_EQ(open_store(slow.url(), {2, 2})->get("k").value_or(""), "value");
}

// Replies are checked as they arrive: a value over the limit is refused from its length header,
// unread, as an error naming the key (the store stays usable); so is what hiredis 0.14 would
// allocate for from a header alone (an array of 2e9 elements: 16 GB of pointers) or cannot
// parse (arrays nested past its depth, RESP3's types).
TEST(RedisStore, RepliesOverTheLimitsAreRefusedUnread) {
  using testing::FakeRedis;
  const std::map<std::string, std::string> replies = {
      {"huge", "$99999999999\r\n"},
      {"fits", FakeRedis::bulk(std::string(1000, 'x'))},
      {"over", FakeRedis::bulk(std::string(1001, 'x'))},
      {"array", "*2000000000\r\n"},
      {"deep", "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"},
      {"resp3", "%1\r\n+a\r\n+b\r\n"},
      {"empty", "\r\n"},
      {"count", "$1x\r\n"},
      {"integer", ":99999999999999999999\r\n"},
  };
  FakeRedis server(FakeRedis::answer_info_then(
      [&](const std::vector<std::string>& c) { return FakeRedis::Answer{replies.at(c.at(1))}; }));
  StoreOptions o;
  o.max_value_bytes = 1000;
  const auto s = open_store(server.url(), o);
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* key : {"huge", "over"}) {
    try {
      s->get(key);
      ADD_FAILURE() << key << " was read";
    } catch (const StoreKeyError& e) {
      EXPECT_EQ(e.key(), key);
      EXPECT_NE(std::string(e.what()).find("over the limit of 1000"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(s->get("fits").value_or(""), std::string(1000, 'x'));
  }
  for (const char* key : {"array", "deep", "resp3", "empty", "count", "integer"}) {
    try {
      s->get(key);
      ADD_FAILURE() << key << " was read";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find("not a Redis reply"), std::string::npos) << e.what();
    }
    EXPECT_EQ(s->get("fits").value_or(""), std::string(1000, 'x'));
  }
  EXPECT_LT(seconds_since(t0), 5);
  testing::expect_invalid_argument(
      [&] {
        open_store(server.url(), {1, 1, false, 0});
      },
      "size limits");
  // A real server: a hash's field over the limit is left unread and named; the other fields of
  // the hash are read (one foreign value used to refuse the whole hash).
  if (!testing::have_redis_server()) return;
  testing::RedisServer redis(scratch("limits"));
  ASSERT_TRUE(redis.running());
  const auto r = open_store(redis.url(), o);
  r->hash_set("h", "small", "v");
  r->hash_set("h", "large", std::string(5000, 'v'));
  r->hash_set("h", "edge", std::string(1000, 'e'));
  const Store::HashContents all = r->hash_get_all("h");
  EXPECT_EQ(all.values,
            (std::map<std::string, std::string>{{"edge", std::string(1000, 'e')}, {"small", "v"}}));
  EXPECT_EQ(all.oversized, std::vector<std::string>{"large"});
  EXPECT_EQ(r->hash_get("h", "small").value_or(""), "v");
  EXPECT_THROW(r->hash_get("h", "large"), StoreKeyError);
}

// A store on a socket given to it (the fuzzer's way in): the handshake and the replies are read
// from what the other end sent; once that stream ends, every command fails and none re-opens.
TEST(RedisStore, OnAGivenSocket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const std::string replies =
      testing::FakeRedis::info_reply() + testing::FakeRedis::bulk("v") + ":7\r\n";
  ASSERT_EQ(write(sv[1], replies.data(), replies.size()), static_cast<ssize_t>(replies.size()));
  shutdown(sv[1], SHUT_WR);
  const auto s = open_redis_store_on_fd(sv[0], "pair", {1, 1});
  EXPECT_EQ(s->describe(), "redis://pair:6379/0");
  EXPECT_EQ(s->get("k").value_or(""), "v");
  EXPECT_EQ(s->increment("n"), 7);
  for (int i = 0; i < 2; ++i) {
    try {
      s->get("k");
      ADD_FAILURE() << "a reply read past the stream's end";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(i == 0 ? "closed" : "not re-opened"), std::string::npos)
          << e.what();
    }
  }
  close(sv[1]);
  // The handshake's version check: too old, or a number out of range (read with sscanf's %d
  // before: undefined).
  for (const auto& [info, why] : std::vector<std::pair<std::string, std::string>>{
           {"redis_version:6.0.9", "is too old"},
           {"redis_version:99999999999.1", "does not name a redis_version"},
           {"redis_version:7", "does not name a redis_version"}}) {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const std::string reply = testing::FakeRedis::bulk(info);
    ASSERT_EQ(write(sv[1], reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
    try {
      open_redis_store_on_fd(sv[0], "pair", {1, 1});
      ADD_FAILURE() << info << " accepted";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    close(sv[1]);
  }
}

// ---- The claim protocol, on the in-memory store's clock ----------------------------------------

struct ProtocolRig {
  explicit ProtocolRig(const std::string& name) {
    MemoryStore::reset(name);
    for (int k = 0; k < 3; ++k) {
      stores.push_back(std::make_unique<MemoryStore>(name));
      stores.back()->set_clock([this] { return now; });
    }
  }
  ClaimProtocol make(int k, const std::vector<std::string>& ids) {
    // Appended, not "w" + to_string(k): GCC 12 warns (-Wrestrict) on that falsely when inlined.
    std::string worker = "w";
    worker += std::to_string(k);
    ClaimProtocol p(*stores[k], "run", "scope", worker, 1000);
    p.join(ids, ids);
    return p;
  }
  int64_t now = 0;
  std::vector<std::unique_ptr<MemoryStore>> stores;
};

TEST(ClaimProtocol, EachKeyOnceAndTheFirstPlansOrderWins) {
  ProtocolRig rig("claims_once");
  auto a = rig.make(0, {"x", "y", "z"});
  auto b = rig.make(1, {"z", "x", "y"});  // its own cost order; the plan's is used
  EXPECT_EQ(b.order(), (std::vector<std::string>{"x", "y", "z"}));
  std::set<size_t> got;
  for (auto* p : {&a, &b, &a}) {
    const auto i = p->claim_next();
    ASSERT_TRUE(i);
    EXPECT_TRUE(got.insert(*i).second) << "position handed out twice";
  }
  EXPECT_FALSE(b.claim_next());  // all three held by live leases
  EXPECT_EQ(a.remaining(), 3);
  for (size_t i : got) (i == 1 ? b : a).publish(i, "r");
  EXPECT_EQ(a.remaining(), 0);
  EXPECT_FALSE(a.claim_next());
  EXPECT_EQ(a.results().values.size(), 3u);
}

TEST(ClaimProtocol, EachScopeHasItsOwnPlan) {
  // Another device kind or library version (another scope) tunes its own copy of the run.
  ProtocolRig rig("claims_scopes");
  auto a = rig.make(0, {"x", "y"});
  ClaimProtocol other(*rig.stores[1], "run", "other_kind@0.2", "w1", 1000);
  other.join({"x", "y", "z"}, {"x", "y", "z"});
  EXPECT_EQ(other.order().size(), 3u);
  ASSERT_TRUE(a.claim_next());
  EXPECT_EQ(other.remaining(), 3);
}

TEST(ClaimProtocol, AReleasedOrLostClaimNeitherBlocksNorClearsAnother) {
  ProtocolRig rig("claims_release");
  auto a = rig.make(0, {"x"});
  auto b = rig.make(1, {"x"});
  ASSERT_EQ(a.claim_next(), 0u);
  a.release(0);  // a transient failure: given up at once
  EXPECT_EQ(b.claim_next(), 0u);
  EXPECT_NE(b.claimant(0).find("w1 (lease live)"), std::string::npos) << b.claimant(0);
  // a's late publish after losing the key neither breaks b's lease nor its listing.
  a.publish(0, "late");
  EXPECT_TRUE(b.renew(0));
  EXPECT_NE(b.claimant(0).find("w1"), std::string::npos) << b.claimant(0);
  // A corrupt result discarded by one process does not remove a good one published since.
  a.discard("x", "something else");
  EXPECT_EQ(a.results().values.at("x"), "late");
}

TEST(ClaimProtocol, DifferentInputsAreRefused) {
  ProtocolRig rig("claims_differ");
  rig.make(0, {"x", "y"});
  testing::expect_invalid_argument([&] { rig.make(1, {"x", "y", "q"}); }, "other bound arguments");
  testing::expect_invalid_argument([&] { rig.make(1, {"x"}); }, "use a new --run-id");
  // A value that is not a plan under the plan's key (a foreign writer).
  rig.stores[0]->set("tokamax:{run}:scope:plan", "not json");
  testing::expect_invalid_argument([&] { rig.make(2, {"x", "y"}); }, "not one this library wrote");
  testing::expect_invalid_argument([&] { ClaimProtocol(*rig.stores[0], "a{b", "s", "w", 1000); },
                                   "run id");
}

TEST(ClaimProtocol, ADeadProcesssKeyIsTakenOverWhenItsLeaseExpires) {
  ProtocolRig rig("claims_dead");
  auto dead = rig.make(0, {"x", "y"});
  auto live = rig.make(1, {"x", "y"});
  ASSERT_EQ(dead.claim_next(), 0u);  // then dies: never renews, never publishes
  ASSERT_EQ(live.claim_next(), 1u);
  rig.now += 600;
  EXPECT_TRUE(live.renew(1));
  EXPECT_FALSE(live.claim_next());  // x's lease is still live
  EXPECT_NE(live.claimant(0).find("w0 (lease live)"), std::string::npos) << live.claimant(0);
  rig.now += 600;  // x's lease expired (1.2 s > 1 s); y's was renewed at 0.6 s
  EXPECT_NE(live.claimant(0).find("w0 (lease expired)"), std::string::npos) << live.claimant(0);
  EXPECT_EQ(live.claim_next(), 0u);
  live.publish(0, "r0");
  live.publish(1, "r1");
  EXPECT_EQ(live.remaining(), 0);
  EXPECT_FALSE(dead.renew(0));  // the lease it lost
}

TEST(ClaimProtocol, APositionHandedOutButNeverClaimedIsFound) {
  ProtocolRig rig("claims_orphan");
  auto p = rig.make(0, {"x", "y", "z"});
  // A process took position 0 from the cursor and died before claiming it.
  rig.stores[1]->increment("tokamax:{run}:scope:cursor");
  std::set<size_t> got;
  while (const auto i = p.claim_next()) {
    got.insert(*i);
    p.publish(*i, "r");
  }
  EXPECT_EQ(got, (std::set<size_t>{0, 1, 2}));
}

// ---- Simulation --------------------------------------------------------------------------------

TEST(FleetSimulation, ThousandWorkersTenThousandKeysFivePercentDying) {
  FleetSimulation sim;
  sim.workers = 1000;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> cost(std::log(20000.0), 1.0);  // ms; median 20 s
  for (int i = 0; i < 10000; ++i) sim.costs_ms.push_back(cost(rng));
  sim.die_fraction = 0.05;
  sim.latency_ms = 0.5;
  sim.failure_rate = 0.001;
  sim.seed = 11;
  const FleetSimulationResult r = simulate_fleet(sim);
  int died = 0;
  for (bool d : r.died) died += d;
  EXPECT_EQ(died, 50);
  // Every key has a result, published by exactly one worker: no key was tuned twice (the dead
  // workers' keys were taken over after their leases expired, and they never published).
  EXPECT_EQ(r.keys_published, 10000);
  EXPECT_EQ(r.keys_published_once, 10000);
  EXPECT_EQ(r.keys_published_more, 0);
  EXPECT_GE(r.tunings_started, 10000);
  const double ops_per_key = static_cast<double>(r.store_operations) / 10000;
  std::printf(
      "1000 workers, 10000 keys, 50 died: %d tunings started (%d lost with the dead), "
      "%.1f store operations per key, makespan %.0f s\n",
      r.tunings_started, r.tunings_started - 10000, ops_per_key, r.makespan_ms / 1000);
  for (const auto& [c, m] : r.operations_by_command)
    std::printf("  %-12s %.2f per key\n", c.c_str(), m / 10000.0);
  EXPECT_LT(ops_per_key, 40);
}

// Keys of skewed cost: 40 keys, 4 of them 10x the rest, at the given positions of the list.
FleetSimulation skewed(bool count_shards, const std::vector<int>& expensive) {
  FleetSimulation sim;
  sim.workers = 4;
  sim.costs_ms.assign(40, 1000);
  for (int i : expensive) sim.costs_ms[i] = 10000;
  sim.count_shards = count_shards;
  sim.poll_ms = 100;
  return sim;
}

double last_over_mean(const FleetSimulationResult& r) { return r.max_finish_ms / r.mean_finish_ms; }

TEST(FleetSimulation, CostOrderedClaimsBalanceSkewedKeys) {
  // Adjacent, as a trace records a model's large layers one after the other: XLA's contiguous
  // split by count gives them all to the first process.
  const std::vector<int> adjacent = {0, 1, 2, 3};
  const FleetSimulationResult dyn = simulate_fleet(skewed(false, adjacent));
  const FleetSimulationResult xla = simulate_fleet(skewed(true, adjacent));
  std::printf(
      "4 processes, 40 keys (4 at 10x, adjacent): last/mean finish %.2f with cost-ordered "
      "claims (makespan %.1f s), %.2f with contiguous shards by count (makespan %.1f s)\n",
      last_over_mean(dyn), dyn.makespan_ms / 1000, last_over_mean(xla), xla.makespan_ms / 1000);
  EXPECT_EQ(dyn.keys_published, 40);
  EXPECT_LE(last_over_mean(dyn), 1.3);
  EXPECT_GE(last_over_mean(xla), 2.0);
  // Anywhere in the list (20 random placements): the claims stay balanced; the count split
  // depends on where the large keys fall.
  std::mt19937_64 rng(3);
  double worst_dyn = 0, sum_xla = 0, worst_xla = 0;
  for (int t = 0; t < 20; ++t) {
    std::vector<int> pos(40);
    for (int i = 0; i < 40; ++i) pos[i] = i;
    std::shuffle(pos.begin(), pos.end(), rng);
    pos.resize(4);
    const double d = last_over_mean(simulate_fleet(skewed(false, pos)));
    const double x = last_over_mean(simulate_fleet(skewed(true, pos)));
    worst_dyn = std::max(worst_dyn, d);
    worst_xla = std::max(worst_xla, x);
    sum_xla += x;
  }
  std::printf(
      "random placements: cost-ordered claims at most %.2f; count split mean %.2f, "
      "worst %.2f\n",
      worst_dyn, sum_xla / 20, worst_xla);
  EXPECT_LE(worst_dyn, 1.3);
}

// ---- The remote cache rung ---------------------------------------------------------------------

TEST(RemoteCache, ServesWhatAnotherProcessPublishedAndFallsBackWhenDown) {
  const OpFamily& fam = find_family("layer_norm");
  const auto spec = find_arg_specs("layer_norm", "layer_norm_smoke").at(0);
  const BoundArguments bound = fam.bind_json(spec.arguments, "native");
  auto call = fam.make_call(bound, 1);
  const auto impl = fam.implementation("native");
  const auto space = impl->autotuning_configs(*call);
  ASSERT_FALSE(space.empty());
  const Config tuned = space.back();

  // "Another process" tuned it: its result published to the store.
  MemoryStore::reset("remote");
  MemoryStore other("remote");
  AutotuningResult r;
  AutotuningData d;
  BenchmarkData bd;
  bd.median_ms = 1;
  d.set(tuned, bd);
  r.add(bound, d);
  EXPECT_EQ(RemoteCache::global().publish(r, &other), 1);

  // Nothing shipped or in the user cache: the local ladder has nothing for it.
  const std::string empty = scratch("remote_empty");
  struct RestoreEnv {
    std::map<std::string, std::optional<std::string>> saved;
    void set(const char* name, const std::string& v) {
      const char* old = std::getenv(name);
      saved[name] = old ? std::optional<std::string>(old) : std::nullopt;
      setenv(name, v.c_str(), 1);
    }
    ~RestoreEnv() {
      for (const auto& [n, v] : saved) v ? setenv(n.c_str(), v->c_str(), 1) : unsetenv(n.c_str());
      DiskCache::global().clear();
      RemoteCache::global().configure("");
    }
  } env;
  env.set("TOKAMAX_DATA_DIR", empty);
  env.set("TOKAMAX_CACHE_DIR", empty);
  DiskCache::global().clear();
  RemoteCache::global().configure("mem://remote");
  CallOptions co;
  co.implementation = "native";
  {
    // No scope, no disk cache entry for this config here: the remote rung answers.
    const Explanation e = explain(fam, *call, co);
    EXPECT_EQ(e.resolution.rung, Rung::kRemoteCache) << e.resolution.detail;
    EXPECT_EQ(e.resolution.config.str(), tuned.str());
    EXPECT_NE(e.resolution.detail.find("mem://remote"), std::string::npos);
  }
  // A corrupt entry is skipped with a warning: the next rung serves.
  other.hash_set(RemoteCache::hash_key("tokamax:", "layer_norm", *impl), bound.key(), "{oops");
  RemoteCache::global().clear();
  EXPECT_EQ(explain(fam, *call, co).resolution.rung, Rung::kHeuristics);

  // A store that is down costs its timeout once, then the back-off skips it.
  const int closed = testing::free_port();
  RemoteCacheOptions o;
  o.store = {0.3, 0.3};
  RemoteCache::global().configure("redis://127.0.0.1:" + std::to_string(closed) + "/0", o);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(explain(fam, *call, co).resolution.rung, Rung::kHeuristics);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// A call of `family`'s spec with nothing local to serve it (no shipped data, no user cache), and
// a config of its space that is not its heuristics': what a lookup served remotely returns.
struct RemoteKey {
  RemoteKey(const std::string& family, const std::string& spec)
      : fam(find_family(family)),
        bound(fam.bind_json(find_arg_specs(family, spec).at(0).arguments, "native")),
        call(fam.make_call(bound, 1)),
        impl(fam.implementation("native")) {
    const auto space = impl->autotuning_configs(*call);
    tuned = space.back();
  }
  // Publishes `tuned` for this key to `store`.
  void publish_to(Store& store) const {
    AutotuningResult r;
    AutotuningData d;
    BenchmarkData bd;
    bd.median_ms = 1;
    d.set(tuned, bd);
    r.add(bound, d);
    EXPECT_EQ(RemoteCache::global().publish(r, &store), 1);
  }
  std::string hash(const Store& store) const {
    return RemoteCache::hash_key(store.prefix(), fam.name(), *impl);
  }
  Rung rung() const {
    CallOptions co;
    co.implementation = "native";
    return explain(fam, *call, co).resolution.rung;
  }
  const OpFamily& fam;
  BoundArguments bound;
  std::unique_ptr<CallBase> call;
  std::shared_ptr<const Implementation> impl;
  Config tuned;
};

// The local ladder emptied (data and cache directories) for a test, restored after it with the
// remote cache unset.
struct LocalLadderEmpty {
  explicit LocalLadderEmpty(const std::string& name) {
    const std::string empty = scratch(name);
    for (const char* v : {"TOKAMAX_DATA_DIR", "TOKAMAX_CACHE_DIR"}) {
      const char* old = std::getenv(v);
      saved[v] = old ? std::optional<std::string>(old) : std::nullopt;
      setenv(v, empty.c_str(), 1);
    }
    DiskCache::global().clear();
  }
  ~LocalLadderEmpty() {
    for (const auto& [n, v] : saved) v ? setenv(n.c_str(), v->c_str(), 1) : unsetenv(n.c_str());
    DiskCache::global().clear();
    RemoteCache::global().configure("");
  }
  std::map<std::string, std::optional<std::string>> saved;
};

// Threads whose lookups meet a slow store (0.4 s a reply) wait at most about the rung's bound
// (0.5 s) each, not in turn behind each other's replies on the one connection (16 in turn:
// over 6 s for the last).
TEST(RemoteCache, ManyThreadsDoNotQueueBehindASlowStore) {
  using testing::FakeRedis;
  const RemoteKey key("layer_norm", "layer_norm_smoke");
  LocalLadderEmpty local("remote_threads");
  FakeRedis server(FakeRedis::answer_info_then([](const std::vector<std::string>&) {
    return FakeRedis::Answer{"$-1\r\n", 0.4, 0};
  }));
  RemoteCache::global().configure(server.url());
  constexpr int kThreads = 16;
  std::vector<double> took(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto t0 = std::chrono::steady_clock::now();
      std::string detail;
      EXPECT_FALSE(RemoteCache::global().lookup(*key.impl, key.bound, &detail));
      took[t] = seconds_since(t0);
    });
  }
  for (auto& t : threads) t.join();
  const double worst = *std::max_element(took.begin(), took.end());
  EXPECT_LT(worst, 2.5) << "a lookup waited " << worst << " s";
  // The store is set aside (too slow): the next lookup does not ask it.
  const int asked = server.commands();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(key.rung(), Rung::kHeuristics);
  EXPECT_LT(seconds_since(t0), 0.3);
  EXPECT_EQ(server.commands(), asked);
}

// A key of another type where the rung expects a hash (a foreign writer's) is that entry's
// problem, with a warning naming it: the next rung serves the call and the store is not set
// aside as if it were down (another family's entry is still served from it).
TEST(RemoteCache, AWrongTypedEntryIsIgnoredNotAnOutage) {
  const RemoteKey norm("layer_norm", "layer_norm_smoke");
  const RemoteKey glu("gated_linear_unit", "glu_smoke");
  LocalLadderEmpty local("remote_wrongtype");
  auto check = [&](Store& store, const std::string& url) {
    glu.publish_to(store);
    store.del(norm.hash(store));
    store.set(norm.hash(store), "a string, not a hash");
    RemoteCache::global().configure(url);
    EXPECT_EQ(norm.rung(), Rung::kHeuristics) << url;
    EXPECT_EQ(glu.rung(), Rung::kRemoteCache) << url;
  };
  MemoryStore::reset("remote_wrongtype");
  MemoryStore mem("remote_wrongtype");
  check(mem, "mem://remote_wrongtype");
  if (!testing::have_redis_server()) return;
  testing::RedisServer server(scratch("remote_wrongtype_redis"));
  ASSERT_TRUE(server.running());
  check(*open_store(server.url()), server.url());
}

// A 50 MB value under a remote cache entry (a valid entry padded) is refused from its length,
// before it is read: not used, and no slower than a miss.
TEST(RemoteCache, AnOversizedEntryIsRefusedBeforeItIsRead) {
  REQUIRE_REDIS();
  const RemoteKey key("layer_norm", "layer_norm_smoke");
  LocalLadderEmpty local("remote_oversized");
  testing::RedisServer server(scratch("remote_oversized_redis"));
  ASSERT_TRUE(server.running());
  const auto store = open_store(server.url());
  key.publish_to(*store);
  Json entry = parse_json(store->hash_get(key.hash(*store), key.bound.key()).value(), "entry");
  entry["by"] = std::string(50 << 20, 'x');
  store->hash_set(key.hash(*store), key.bound.key(), entry.dump());
  RemoteCache::global().configure(server.url());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(key.rung(), Rung::kHeuristics);
  EXPECT_LT(seconds_since(t0), 1.0);
  // The entry at its usual size is served.
  entry["by"] = "host";
  store->hash_set(key.hash(*store), key.bound.key(), entry.dump());
  RemoteCache::global().clear();
  EXPECT_EQ(key.rung(), Rung::kRemoteCache);
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

// tune_sharded in one process on the in-memory store: the merged result; a corrupt value under
// a result's key (a foreign writer, a torn write) is discarded with a warning and its key tuned
// again by the next process of the run.
TEST(TuneSharded, CompletesAndRetunesACorruptResult) {
  MemoryStore::reset("sharded");
  MemoryStore store("sharded");
  std::vector<BoundArguments> list;
  for (const char* spec : {"layer_norm_smoke", "rms_norm_smoke_bf16"}) {
    const auto s = find_arg_specs("layer_norm", spec).at(0);
    list.push_back(find_family("layer_norm").bind_json(s.arguments, "native"));
  }
  AutotuneOptions o;
  o.max_candidates = 2;
  o.measure_budget_s = 0.2;
  FleetOptions f;
  f.run_id = "corrupt";
  f.poll_s = 0.05;
  f.host_lock_path = scratch("sharded") + "/measure.lock";
  const AutotuningResult first = tune_sharded(list, store, o, f);
  ASSERT_EQ(first.data().size(), 2u);
  const std::string results =
      "tokamax:{corrupt}:" + device_kind() + "@" + library_version() + ":results";
  const auto fields = store.hash_fields(results);
  ASSERT_EQ(fields.size(), 2u);
  store.hash_set(results, fields[0], "{\"worker\":\"x\",\"result\":{\"device_kind\":5}}");
  const AutotuningResult second = tune_sharded(list, store, o, f);
  EXPECT_EQ(second.data().size(), 2u);
  const std::string fixed = store.hash_get(results, fields[0]).value_or("");
  EXPECT_NE(fixed.find(std::to_string(getpid())), std::string::npos) << fixed;
  // A store that fails a third of its commands (down and back, again and again): the run
  // retries and completes.
  MemoryStore flaky("sharded");
  MemoryStore::Faults faults;
  faults.failure_rate = 0.3;
  faults.seed = 5;
  flaky.set_faults(faults);
  FleetOptions g = f;
  g.run_id = "flaky";
  const AutotuningResult third = tune_sharded(list, flaky, o, g);
  EXPECT_EQ(third.data().size(), 2u);
  // A run id reused with other inputs: refused before any work.
  list.pop_back();
  testing::expect_invalid_argument([&] { tune_sharded(list, store, o, f); },
                                   "other bound arguments");
}

// Bound arguments of layer_norm (native) by spec, and one that no process can tune: native
// layer_norm normalizes a contiguous axis only (axis 0 of [8, 16] is strided: Unsupported).
std::vector<BoundArguments> norm_keys(bool with_untunable) {
  std::vector<BoundArguments> list;
  const OpFamily& fam = find_family("layer_norm");
  list.push_back(
      fam.bind_json(find_arg_specs("layer_norm", "layer_norm_smoke").at(0).arguments, "native"));
  if (with_untunable) {
    list.push_back(fam.bind_json(
        Json{{"x", "f32[8,16]"}, {"scale", "f32[8]"}, {"subtract_mean", true}, {"axis", 0}},
        "native"));
  }
  return list;
}

FleetOptions fleet_options(const std::string& run, double deadline_s) {
  FleetOptions f;
  f.run_id = run;
  f.poll_s = 0.05;
  f.deadline_s = deadline_s;
  f.host_lock_path = scratch("sharded_" + run) + "/measure.lock";
  return f;
}

AutotuneOptions fast_tuning() {
  AutotuneOptions o;
  o.max_candidates = 2;
  o.measure_budget_s = 0.2;
  return o;
}

std::string run_key(const std::string& run, const std::string& suffix) {
  return "tokamax:{" + run + "}:" + device_kind() + "@" + library_version() + ":" + suffix;
}

// A key of the wrong type in a run's namespace (a foreign writer's) was taken for an outage:
// every process retried it until the deadline. The run's own keys of the wrong type now refuse
// the run at once with an error naming the key; a key's lease of the wrong type is replaced
// and the key tuned.
TEST(TuneSharded, AWrongTypedKeyIsNotAnOutage) {
  const auto list = norm_keys(false);
  auto refused_fast = [&](Store& store, const std::string& run, const std::string& key) {
    const auto t0 = std::chrono::steady_clock::now();
    testing::expect_invalid_argument(
        [&] { tune_sharded(list, store, fast_tuning(), fleet_options(run, 10)); }, key.c_str());
    EXPECT_LT(seconds_since(t0), 5) << key;
  };
  MemoryStore::reset("wrongtype");
  MemoryStore mem("wrongtype");
  mem.set(run_key("m", "results"), "a string, not a hash");
  refused_fast(mem, "m", run_key("m", "results"));
  if (!testing::have_redis_server()) return;
  testing::RedisServer server(scratch("wrongtype_redis"));
  ASSERT_TRUE(server.running());
  const auto redis = open_store(server.url());
  redis->hash_set(run_key("p", "plan"), "a", "hash, not a plan");
  refused_fast(*redis, "p", run_key("p", "plan"));
  redis->set(run_key("r", "results"), "a string, not a hash");
  refused_fast(*redis, "r", run_key("r", "results"));
  redis->set(run_key("i", "inflight"), "a string, not a hash");
  refused_fast(*redis, "i", run_key("i", "inflight"));
  // Key 0's lease as a hash: replaced by a real lease, and the key tuned.
  redis->hash_set(run_key("c", "claim:0"), "a", "hash, not a lease");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tune_sharded(list, *redis, fast_tuning(), fleet_options("c", 20)).data().size(), 1u);
  EXPECT_LT(seconds_since(t0), 15);
}

// A result value over the store's size limit (another writer's) refused the whole run: the hash
// of results could not be read. It is now dropped unread and its key tuned again.
TEST(TuneSharded, AnOversizedResultIsRetunedNotTheRunRefused) {
  REQUIRE_REDIS();
  testing::RedisServer server(scratch("oversized_result_redis"));
  ASSERT_TRUE(server.running());
  StoreOptions o;
  o.max_value_bytes = 64 << 10;
  const auto store = open_store(server.url(), o);
  const auto list = norm_keys(false);
  ASSERT_EQ(tune_sharded(list, *store, fast_tuning(), fleet_options("big", 60)).data().size(), 1u);
  const std::string results = run_key("big", "results");
  const auto fields = store->hash_fields(results);
  ASSERT_EQ(fields.size(), 1u);
  store->hash_set(results, fields[0], std::string(100 << 10, '{'));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tune_sharded(list, *store, fast_tuning(), fleet_options("big", 60)).data().size(), 1u);
  EXPECT_LT(seconds_since(t0), 30);
  const std::string fixed = store->hash_get(results, fields[0]).value_or("");
  EXPECT_LT(fixed.size(), size_t{64} << 10);
  EXPECT_NE(fixed.find(std::to_string(getpid())), std::string::npos) << fixed.substr(0, 200);
}

// A failed marker in the store ({"failed": ...}) is believed only when this process reproduces
// the failure: a forged one over a key that tunes is re-tuned and replaced by its result; a real
// one is confirmed and its key left out, as without a store.
TEST(TuneSharded, AForgedFailedMarkerIsRetunedARealOneConfirmed) {
  MemoryStore::reset("forged");
  MemoryStore store("forged");
  const auto list = norm_keys(true);
  const FleetOptions f = fleet_options("forged", 120);
  const AutotuningResult first = tune_sharded(list, store, fast_tuning(), f);
  ASSERT_EQ(first.data().size(), 1u);  // the untunable key is left out
  const std::string results = run_key("forged", "results");
  const auto values = store.hash_get_all(results).values;
  ASSERT_EQ(values.size(), 2u);
  std::string tunable;
  for (const auto& [field, value] : values) {
    if (value.find("\"failed\"") == std::string::npos) tunable = field;
  }
  ASSERT_FALSE(tunable.empty());
  store.hash_set(results, tunable, R"({"worker":"mallory","failed":"forged"})");
  const AutotuningResult second = tune_sharded(list, store, fast_tuning(), f);
  EXPECT_EQ(second.data().size(), 1u);
  const std::string fixed = store.hash_get(results, tunable).value_or("");
  EXPECT_NE(fixed.find("\"result\""), std::string::npos) << fixed;
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

TEST(LauncherRank, OpenMpiSlurmTorchrun) {
  const char* vars[] = {"OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE",
                        "SLURM_PROCID",
                        "SLURM_NTASKS",
                        "RANK",
                        "WORLD_SIZE"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* v : vars) {
    const char* old = std::getenv(v);
    saved[v] = old ? std::optional<std::string>(old) : std::nullopt;
    unsetenv(v);
  }
  EXPECT_FALSE(launcher_rank());
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  EXPECT_EQ(launcher_rank()->rank, 3);
  EXPECT_EQ(launcher_rank()->source, "RANK/WORLD_SIZE");
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_NTASKS", "2", 1);
  EXPECT_EQ(launcher_rank()->source, "SLURM_PROCID/SLURM_NTASKS");  // before torchrun's
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(launcher_rank()->world_size, 4);
  setenv("OMPI_COMM_WORLD_RANK", "4", 1);
  testing::expect_invalid_argument([] { launcher_rank(); }, "0 <= rank < size");
  setenv("OMPI_COMM_WORLD_RANK", "two", 1);
  testing::expect_invalid_argument([] { launcher_rank(); }, "expected integers");
  for (const auto& [n, v] : saved) v ? setenv(n.c_str(), v->c_str(), 1) : unsetenv(n.c_str());
}

TEST(HostMeasurementLock, OneHolderAtATimeAndBoundedWaits) {
  const std::string path = scratch("host_lock") + "/measure.lock";
  auto held = lock_host_measurement(path, 1);
  // Another holder (flock locks belong to the open file, so a second open in this process
  // contends as another process would) waits at most its timeout.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    lock_host_measurement(path, 0.2);
    ADD_FAILURE() << "a second holder got the lock";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waited"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
  held.reset();
  EXPECT_NO_THROW(lock_host_measurement(path, 0.2));
}

}  // namespace
}  // namespace tokamax
