// The autotuner and autotuning data: failures with reasons, timeouts, selection, tie-break,
// merges, JSON round trips, the disk cache under concurrent writers and corrupt files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/op/fake_ops.h"

namespace tokamax {
namespace {

using testing::fake;
using testing::fake_call;
using testing::TileConfig;

AutotuneOptions quick() {
  AutotuneOptions o;
  o.rounds.first_rounds = 2;
  o.rounds.max_rounds = 6;
  o.sample_min_ms = 0.2;
  o.measure_budget_s = 3;
  o.candidate_timeout_s = 0.5;  // a loaded CI machine can take tens of ms to start a thread
  return o;
}

BoundArguments bound(const std::string& impl, int64_t n = 64) {
  return fake_call(n)->bound.with_implementation(impl);
}

TEST(Autotuner, FindsFastestAndMeasuresEveryCandidate) {
  const AutotuningData d = Autotuner(quick()).tune(bound("one_field"));
  EXPECT_EQ(d.entries().size(), 4u);
  for (const auto& [k, e] : d.entries()) {
    ASSERT_TRUE(e.benchmark) << k;
    EXPECT_GE(e.benchmark->samples_ms.size(), 2u);
    EXPECT_EQ(e.benchmark->samples_ms.size(), e.benchmark->ratios.size());
  }
  EXPECT_EQ(d.fastest().config.get<TileConfig>().tile, 3) << d.to_json().dump(1);
}

TEST(Autotuner, HeuristicsConfigIsAlwaysAFinalist) {
  // one_field: tile 3 fastest, tiles 2 and 4 next, the heuristics config (tile 1) slowest.
  AutotuneOptions o = quick();
  o.rounds.finalists = 1;
  const AutotuningData d = Autotuner(o).tune(bound("one_field"));
  auto finalist = [&](int tile) {
    return d.entries().at(Config::make(TileConfig{tile}).str()).benchmark->finalist;
  };
  EXPECT_TRUE(finalist(3));
  EXPECT_TRUE(finalist(1));  // last in the first pass, re-measured anyway
  EXPECT_FALSE(finalist(2));
  EXPECT_FALSE(finalist(4));
  EXPECT_EQ(d.fastest().config.get<TileConfig>().tile, 3);
  // JSON keeps the flag (files written before it existed read as not finalists).
  const Json j = d.entries().at(Config::make(TileConfig{1}).str()).benchmark->to_json();
  EXPECT_TRUE(BenchmarkData::from_json(j).finalist);
  Json old = j;
  old.erase("finalist");
  EXPECT_FALSE(BenchmarkData::from_json(old).finalist);
  // The decision: tile 3 (a fifth of the heuristics config's time) chosen, confidently.
  const auto& win = d.fastest();
  ASSERT_TRUE(win.benchmark->chosen);
  ASSERT_TRUE(win.benchmark->evidence);
  EXPECT_TRUE(win.benchmark->evidence->confident) << win.benchmark->evidence->summary();
  EXPECT_LT(win.benchmark->evidence->hi, 0.9);
  // The evidence and the rounds survive JSON.
  const BenchmarkData back = BenchmarkData::from_json(win.benchmark->to_json());
  EXPECT_TRUE(back.chosen);
  ASSERT_TRUE(back.evidence);
  EXPECT_EQ(back.evidence->to_json(), win.benchmark->evidence->to_json());
  EXPECT_EQ(back.sample_rounds, win.benchmark->sample_rounds);
  EXPECT_EQ(back.ratios.size(), win.benchmark->ratios.size());
}

// A candidate halved away before any of its rounds was accepted has no median ratio (NaN):
// written as null, read back as NaN (a number there would be made up).
TEST(Autotuner, CandidateWithoutAcceptedRoundsRoundTrips) {
  BenchmarkData b;
  b.median_ms = 2;
  b.samples_ms = {2.5, 2.0};
  b.sample_rounds = {1, 2};
  b.ratios = {std::nan(""), std::nan("")};
  b.ratio = b.ratio_lo = b.ratio_hi = std::nan("");
  b.stage = 1;
  const Json j = b.to_json();
  EXPECT_TRUE(j["ratio"].is_null()) << j.dump();
  const BenchmarkData back = BenchmarkData::from_json(j);
  EXPECT_TRUE(std::isnan(back.ratio));
  EXPECT_TRUE(std::isnan(back.ratio_lo));
  EXPECT_TRUE(std::isnan(back.ratios[1]));
  EXPECT_EQ(back.rounds, 0);
  Json bad = j;
  bad["ratio"] = "fast";
  EXPECT_THROW(BenchmarkData::from_json(bad), InvalidArgument);
  // With sample_rounds, every round field is required: a missing one is a named error, not a
  // JSON library exception (the cache-file fuzzer found "ratios" renamed in a cache entry).
  for (const char* field : {"ratios", "ratio", "ratio_ci", "rounds", "stage"}) {
    Json missing = j;
    missing.erase(field);
    EXPECT_THROW(BenchmarkData::from_json(missing), InvalidArgument) << field;
  }
}

// A measuring budget too small for the rounds to reach every candidate: the ones never sampled
// keep their checked run's time (one sample), not a median of 0 ms; and with no round accepted
// the heuristics config is kept (chosen, the reason in its evidence), not the fastest single run
// (tile 3, a fifth of its time here: single runs are no evidence on a shared machine).
TEST(Autotuner, CandidatesTheBudgetNeverReachedKeepTheirCheckedRun) {
  AutotuneOptions o = quick();
  o.fix_measure_budget(1e-4);
  const AutotuningData d = Autotuner(o).tune(bound("one_field"));
  ASSERT_EQ(d.entries().size(), 4u);
  for (const auto& [k, e] : d.entries()) {
    ASSERT_TRUE(e.benchmark) << k;
    EXPECT_GT(e.benchmark->median_ms, 0) << k;
    EXPECT_FALSE(e.benchmark->samples_ms.empty()) << k;
  }
  const auto& kept = d.fastest();
  EXPECT_EQ(kept.config.get<TileConfig>().tile, 1) << d.to_json().dump(1);
  ASSERT_TRUE(kept.benchmark->chosen);
  ASSERT_TRUE(kept.benchmark->evidence);
  EXPECT_FALSE(kept.benchmark->evidence->confident);
  const std::string why = kept.benchmark->evidence->summary();
  EXPECT_NE(why.find("measuring budget"), std::string::npos) << why;
  EXPECT_NE(why.find("--measure-budget-s"), std::string::npos) << why;
  // The decision survives the JSON round trip.
  const AutotuningData back =
      AutotuningData::from_json(d.to_json(), *fake().implementation("one_field"));
  EXPECT_EQ(back.fastest().config.get<TileConfig>().tile, 1);
}

// A key whose rounds outlast measure_budget_s gets budget_rounds rounds' time (up to
// measure_budget_max_s): the same 0.1 ms budget that measured nothing above now gives every
// candidate accepted rounds.
TEST(Autotuner, SlowKeysGetTheirRoundsTime) {
  AutotuneOptions o = quick();
  o.measure_budget_s = 1e-4;
  o.measure_budget_max_s = 30;
  // Many rounds' time, capped at 30 s (max_rounds ends it sooner): the checked runs that size
  // the estimate are a few fake calls, and a preemption must not use up the budget.
  o.budget_rounds = 1000;
  o.rounds.stray = o.rounds.bracket = 10;  // accept every segment: a loaded machine is fine here
  const AutotuningData d = Autotuner(o).tune(bound("one_field"));
  ASSERT_EQ(d.entries().size(), 4u);
  for (const auto& [k, e] : d.entries()) {
    ASSERT_TRUE(e.benchmark) << k;
    EXPECT_GE(e.benchmark->rounds, 1) << k << "\n" << d.to_json().dump(1);
  }
}

TEST(Autotuner, CandidatesDeterministicHeuristicsFirst) {
  const auto c = Autotuner(quick()).candidates(bound("one_field"));
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].get<TileConfig>().tile, 1);
  EXPECT_EQ(c[1].get<TileConfig>().tile, 2);
  EXPECT_EQ(c[3].get<TileConfig>().tile, 4);
}

struct FailCase {
  const char* impl;
  FailureKind kind;
};
void PrintTo(const FailCase& c, std::ostream* os) { *os << c.impl; }

class Failures : public ::testing::TestWithParam<FailCase> {};

TEST_P(Failures, RecordedWithReason) {
  const AutotuningData d = Autotuner(quick()).tune(bound(GetParam().impl));
  const auto& bad = d.entries().at(Config::make(TileConfig{1}).str());
  ASSERT_TRUE(bad.failure);
  EXPECT_EQ(bad.failure->kind, GetParam().kind) << bad.failure->message;
  EXPECT_FALSE(bad.failure->message.empty());
  EXPECT_TRUE(
      d.entries().at(Config::make(TileConfig{0}).str()).benchmark);  // the good one measured
  EXPECT_EQ(d.fastest().config.get<TileConfig>().tile, 0);
}

INSTANTIATE_TEST_SUITE_P(FakeOps, Failures,
                         ::testing::Values(FailCase{"sleepy", FailureKind::kTimeout},
                                           FailCase{"oob", FailureKind::kOutOfBounds},
                                           FailCase{"unwritten", FailureKind::kUnwritten},
                                           FailCase{"wrong", FailureKind::kWrongResult},
                                           FailCase{"throws", FailureKind::kException}),
                         [](const auto& info) { return std::string(info.param.impl); });

TEST(Autotuner, WrongResultNamesWorstError) {
  const AutotuningData d = Autotuner(quick()).tune(bound("wrong"));
  const std::string m = d.entries().at(Config::make(TileConfig{1}).str()).failure->message;
  EXPECT_NE(m.find("worst abs error 1 at flat index 2"), std::string::npos) << m;
  // Numbers as people write them (fmt's shortest form), not std::to_string's 0.000001.
  EXPECT_NE(m.find("atol 1e-06 rtol 1e-06"), std::string::npos) << m;
}

TEST(Autotuner, UnsupportedThrowsAndTuneAllSkipsIt) {
  EXPECT_THROW(Autotuner(quick()).tune(bound("picky")), Unsupported);
  const AutotuningResult r = Autotuner(quick()).tune_all({bound("picky"), bound("nothing")});
  ASSERT_EQ(r.data().size(), 1u);
  EXPECT_EQ(r.data()[0].first.implementation(), "nothing");
}

TEST(Autotuner, BudgetsAndBadOptions) {
  AutotuneOptions o = quick();
  o.max_candidates = 2;
  const AutotuningData d = Autotuner(o).tune(bound("one_field"));
  int skipped = 0;
  for (const auto& [k, e] : d.entries())
    skipped += e.failure && e.failure->kind == FailureKind::kSkipped;
  EXPECT_EQ(skipped, 2);
  EXPECT_TRUE(d.entries().at(Config::make(TileConfig{1}).str()).benchmark);  // heuristics kept
  o = quick();
  o.budget_s = 0;
  EXPECT_THROW(Autotuner{o}, InvalidArgument);
  o = quick();
  o.max_candidates = 0;
  EXPECT_THROW(Autotuner{o}, InvalidArgument);
  o = quick();
  // Progress by key: before each and after the last, the ETA from the pace of the keys done.
  std::vector<AutotuneProgress> seen;
  o.progress = [&](const AutotuneProgress& p) { seen.push_back(p); };
  Autotuner(o).tune_all({bound("one_field", 40), bound("one_field", 48)});
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].done, 0);
  EXPECT_EQ(seen[0].eta_s, -1);  // no pace yet
  EXPECT_EQ(seen[0].key, "fake/one_field");
  EXPECT_EQ(seen[1].done, 1);
  EXPECT_GE(seen[1].eta_s, 0);
  EXPECT_NEAR(seen[1].eta_s, seen[1].elapsed_s, 1e-9);  // one key done, one left
  EXPECT_EQ(seen[2].done, 2);
  EXPECT_EQ(seen[2].total, 2);
  EXPECT_EQ(seen[2].eta_s, 0);
  EXPECT_TRUE(seen[2].key.empty());
}

TEST(Autotuner, IdenticalKeysTunedOnceAcrossThreads) {
  auto& one = *fake().one;
  const int before = one.prepares.load();
  const BoundArguments b = bound("one_field", 128);
  std::vector<std::thread> ts;
  std::vector<AutotuningData> out(4);
  for (int i = 0; i < 4; ++i) ts.emplace_back([&, i] { out[i] = Autotuner(quick()).tune(b); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(one.prepares.load() - before, 4);  // one tuning run: 4 candidates prepared once
  for (int i = 1; i < 4; ++i) EXPECT_EQ(out[i].to_json(), out[0].to_json());
}

TEST(AutotuningData, SelectionIsDeterministicWithTieBreakOnScratch) {
  auto mk = [](double ms, int64_t scratch) {
    BenchmarkData b;
    b.median_ms = ms;
    b.scratch_bytes = scratch;
    return b;
  };
  AutotuningData d;
  d.set(Config::make(TileConfig{1}), mk(1.000, 1000));
  d.set(Config::make(TileConfig{2}), mk(1.005, 10));  // within 1% and less scratch: wins
  d.set(Config::make(TileConfig{3}), mk(1.5, 0));     // outside the window
  EXPECT_EQ(d.fastest().config.get<TileConfig>().tile, 2);
  AutotuningData e;  // same data inserted in another order: same winner
  e.set(Config::make(TileConfig{3}), mk(1.5, 0));
  e.set(Config::make(TileConfig{2}), mk(1.005, 10));
  e.set(Config::make(TileConfig{1}), mk(1.000, 1000));
  EXPECT_EQ(e.fastest().config, d.fastest().config);
  // The 2 us floor of the window for tiny kernels.
  AutotuningData f;
  f.set(Config::make(TileConfig{1}), mk(0.0100, 50));
  f.set(Config::make(TileConfig{2}), mk(0.0115, 5));
  EXPECT_EQ(f.fastest().config.get<TileConfig>().tile, 2);
  // Finalists were measured side by side; a non-finalist's faster first-pass median (taken in
  // another minute) does not beat them.
  AutotuningData g;
  auto fin = [&](double ms, int64_t scratch) {
    BenchmarkData b = mk(ms, scratch);
    b.finalist = true;
    return b;
  };
  g.set(Config::make(TileConfig{1}), mk(0.5, 0));
  g.set(Config::make(TileConfig{2}), fin(1.0, 100));
  g.set(Config::make(TileConfig{3}), fin(1.004, 10));  // tie window applies among finalists
  g.set(Config::make(TileConfig{4}), fin(2.0, 0));
  EXPECT_EQ(g.fastest().config.get<TileConfig>().tile, 3);
  AutotuningData none;
  none.set_failure(Config::make(TileConfig{1}), {FailureKind::kTimeout, "slow"});
  EXPECT_THROW(none.fastest(), Error);
  EXPECT_EQ(none.best_median_ms(), 0);
  // What a report shows: the fastest competing median (the non-finalist's 0.5 does not compete)
  // and the window above it.
  EXPECT_EQ(g.best_median_ms(), 1.0);
  EXPECT_FALSE(g.competes(g.entries().at(Config::make(TileConfig{1}).str())));
  EXPECT_TRUE(g.competes(g.entries().at(Config::make(TileConfig{4}).str())));
  EXPECT_TRUE(d.competes(d.entries().at(Config::make(TileConfig{3}).str())));  // no finalists
  EXPECT_EQ(d.best_median_ms(), 1.0);
  EXPECT_DOUBLE_EQ(tie_window_ms(1.0), 0.01);    // 1%
  EXPECT_DOUBLE_EQ(tie_window_ms(0.05), 0.002);  // the 2 us floor
}

TEST(AutotuningData, HeuristicsConfigIsMarkedInResultFiles) {
  const AutotuningData d = Autotuner(quick()).tune(bound("one_field"));
  ASSERT_TRUE(d.heuristics());
  const Json j = d.to_json();
  const std::string h = Config::make(TileConfig{1}).str();
  for (const auto& [k, v] : j.items()) EXPECT_EQ(v.contains("heuristics"), k == h) << k;
  EXPECT_EQ(j[h]["heuristics"], true);
  const auto impl = fake().implementation("one_field");
  const AutotuningData back = AutotuningData::from_json(j, *impl);
  ASSERT_TRUE(back.heuristics());
  EXPECT_EQ(back.heuristics()->str(), h);
  // Through a whole result file, and through a merge with data that does not know it.
  AutotuningResult r;
  r.add(bound("one_field"), d);
  const AutotuningResult loaded = AutotuningResult::loads(r.dumps());
  ASSERT_TRUE(loaded.data()[0].second.heuristics());
  EXPECT_EQ(loaded.data()[0].second.heuristics()->str(), h);
  EXPECT_EQ((back | AutotuningData()).heuristics()->str(), h);
  EXPECT_EQ((AutotuningData() | back).heuristics()->str(), h);
  // A failed heuristics config is marked too; a file without marks has none; a bad mark is an
  // error naming the config.
  const Json failed = {
      {h, {{"failure", {{"kind", "timeout"}, {"message", "slow"}}}, {"heuristics", true}}}};
  const AutotuningData f = AutotuningData::from_json(failed, *impl);
  ASSERT_TRUE(f.heuristics());
  EXPECT_TRUE(f.entries().at(h).failure);
  EXPECT_EQ(f.to_json(), failed);
  Json unmarked = j;
  unmarked[h].erase("heuristics");
  EXPECT_FALSE(AutotuningData::from_json(unmarked, *impl).heuristics());
  Json bad = j;
  bad[h]["heuristics"] = "yes";
  try {
    AutotuningData::from_json(bad, *impl);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(h), std::string::npos) << e.what();
  }
  // The disk cache keeps winners only, not the mark.
  EXPECT_FALSE(d.successes().heuristics());
}

TEST(AutotuningResult, JsonRoundTripAndMerge) {
  const BoundArguments b = bound("one_field", 20);
  AutotuningResult a("kind_a"), c("kind_a"), other("kind_b");
  AutotuningData d1, d2;
  d1.set(Config::make(TileConfig{1}), BenchmarkData{.median_ms = 3, .samples_ms = {3, 3}});
  d1.set_failure(Config::make(TileConfig{2}), {FailureKind::kWrongResult, "bad"});
  d2.set(Config::make(TileConfig{1}), BenchmarkData{.median_ms = 1});
  a.add(b, d1);
  c.add(b, d2);
  const AutotuningResult back = AutotuningResult::loads(a.dumps());
  EXPECT_EQ(back.dumps(), a.dumps());
  EXPECT_EQ(back.data()[0].second.entries().at(Config::make(TileConfig{2}).str()).failure->kind,
            FailureKind::kWrongResult);
  const AutotuningResult m = a | c;
  ASSERT_EQ(m.data().size(), 1u);
  EXPECT_EQ(m.data()[0].second.entries().at(Config::make(TileConfig{1}).str()).benchmark->median_ms,
            1);  // rhs wins
  EXPECT_TRUE(m.data()[0].second.entries().at(Config::make(TileConfig{2}).str()).failure);  // kept
  EXPECT_THROW(a | other, InvalidArgument);
  const std::string text = a.dumps();
  EXPECT_THROW(AutotuningResult::loads(text.substr(0, text.size() / 2)), InvalidArgument);
  EXPECT_THROW(AutotuningResult::loads("{\"device_kind\": \"x\", \"data\": [[1]]}"),
               InvalidArgument);
  const std::string path = std::filesystem::temp_directory_path() /
                           ("tokamax_res_" + std::to_string(getpid()) + ".json");
  a.dump(path);
  EXPECT_EQ(AutotuningResult::load(path).dumps(), a.dumps());
  std::filesystem::remove(path);
}

TEST(AutotuningResult, CaptureAndTuneFunction) {
  auto c = fake_call(12);
  const AutotuningResult r = autotune([&] { dispatch(fake(), *c, {}); }, quick());
  ASSERT_EQ(r.data().size(), 1u);
  EXPECT_EQ(r.data()[0].first.implementation(), "one_field");
}

class DiskCacheTest : public ::testing::Test {
 protected:
  testing::ScopedCacheDir cache_{"dc"};
  const std::filesystem::path& dir_ = cache_.path();
  std::string file() const { return (dir_ / device_kind() / "fake_one_field.json").string(); }
};

TEST_F(DiskCacheTest, ConcurrentProcessWritersLoseNothing) {
  constexpr int kProcs = 6, kPerProc = 5;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < kPerProc; ++i) {
        std::map<std::string, AutotuningData> entries;
        AutotuningData d;
        d.set(Config::make(TileConfig{p}), BenchmarkData{.median_ms = 1.0 + i});
        entries["key_" + std::to_string(p) + "_" + std::to_string(i)] = d;
        merge_into_cache_file(file(), "fake", *fake().one, device_kind(), entries);
      }
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  const CacheFile f = CacheFile::from_json(read_json_file(file()), file());
  EXPECT_EQ(f.entries.size(), static_cast<size_t>(kProcs * kPerProc));
}

TEST_F(DiskCacheTest, CorruptAndStaleFilesAreIgnored) {
  auto c = fake_call(10);
  std::filesystem::create_directories(std::filesystem::path(file()).parent_path());
  std::ofstream(file()) << "{\"schema_version\": 1, \"entr";
  EXPECT_EQ(resolve_config(fake(), *fake().one, *c, std::nullopt).rung, Rung::kHeuristics);
  // A file of another implementation version.
  CacheFile f;
  f.family = "fake";
  f.implementation = "one_field";
  f.implementation_version = 99;
  f.device_kind = device_kind();
  f.entries[c->bound.key()] = {
      {Config::make(TileConfig{4}).str(), BenchmarkData{.median_ms = 1}.to_json()}};
  write_file_atomic(file(), f.to_json().dump());
  DiskCache::global().clear();
  EXPECT_EQ(resolve_config(fake(), *fake().one, *c, std::nullopt).rung, Rung::kHeuristics);
  f.implementation_version = 1;
  write_file_atomic(file(), f.to_json().dump());
  DiskCache::global().clear();
  const Resolution r = resolve_config(fake(), *fake().one, *c, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kDiskCache);
  EXPECT_EQ(r.config.get<TileConfig>().tile, 4);
}

// A version that is not a whole number fitting an int (a float out of int's range, which the
// conversion would take to undefined behavior; fuzz_cache_file found it) is a clear error.
TEST(CacheFileTest, VersionsMustBeInts) {
  CacheFile f;
  f.family = "fake";
  f.implementation = "one_field";
  f.implementation_version = 1;
  f.device_kind = "cpu";
  EXPECT_EQ(CacheFile::from_json(f.to_json(), "ok").implementation_version, 1);
  for (const char* field : {"schema_version", "implementation_version"}) {
    for (const Json& bad : {Json(1.33e51), Json(2.5), Json(int64_t{1} << 40), Json("1")}) {
      Json j = f.to_json();
      j[field] = bad;
      EXPECT_THROW(CacheFile::from_json(j, "fuzzed"), InvalidArgument) << field << " " << bad;
    }
  }
}

}  // namespace
}  // namespace tokamax
