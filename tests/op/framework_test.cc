// The op framework with fake ops: dispatch, every rung of the ladder under every policy, scopes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "tests/op/fake_ops.h"
#include "tests/test_seed.h"

namespace tokamax {
namespace {

using testing::fake;
using testing::fake_call;
using testing::TileConfig;

// A result holding one entry: `config` for `bound`.
AutotuningResult one_entry(const BoundArguments& bound, const Config& config) {
  AutotuningResult res;
  AutotuningData d;
  d.set(config, BenchmarkData{.median_ms = 1.0});
  res.add(bound, d);
  return res;
}

class Framework : public ::testing::Test {
 protected:
  testing::ScopedCacheDir cache_{"fw"};
  const std::filesystem::path& dir_ = cache_.path();
};

TEST_F(Framework, DispatchSkipsUnsupportedAndNamedErrorsPropagate) {
  auto c = fake_call();
  EXPECT_EQ(dispatch(fake(), *c, {}), "one_field");  // picky is skipped
  EXPECT_THROW(dispatch(fake(), *c, {.implementation = "picky"}), Unsupported);
  EXPECT_THROW(dispatch(fake(), *c, {.implementation = "nope"}), InvalidArgument);
  EXPECT_THROW(dispatch(fake(), *c, {.config = Config::make(TileConfig{2})}), InvalidArgument);
  const Explanation e = explain(fake(), *c, {});
  ASSERT_EQ(e.skipped.size(), 1u);
  EXPECT_EQ(e.skipped[0].first, "picky");
  EXPECT_NE(e.skipped[0].second.find("refuses"), std::string::npos);
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(c->outputs[0].get(i), 2 * c->x.get(i));
}

TEST_F(Framework, LadderRungs) {
  auto c = fake_call();
  const auto& one = *fake().one;
  // 1. explicit
  EXPECT_EQ(resolve_config(fake(), one, *c, Config::make(TileConfig{4})).rung, Rung::kExplicit);
  // 2. nothing to tune: no lookup, even with policy error
  {
    CacheMissPolicyScope p(CacheMissPolicy::kError);
    EXPECT_EQ(resolve_config(fake(), *fake().implementation("nothing"), *c, std::nullopt).rung,
              Rung::kNullConfig);
    // 5. error policy
    EXPECT_THROW(resolve_config(fake(), one, *c, std::nullopt), CacheMiss);
  }
  // 5. heuristics policy (default)
  Resolution r = resolve_config(fake(), one, *c, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kHeuristics);
  EXPECT_EQ(r.config.get<TileConfig>().tile, 1);
  // 4. disk cache (user dir), written through dump_cache.
  AutotuningResult res;
  AutotuningData d;
  d.set(Config::make(TileConfig{2}), BenchmarkData{.median_ms = 1.0});
  d.set(Config::make(TileConfig{4}), BenchmarkData{.median_ms = 2.0});
  res.add(c->bound.with_implementation("one_field"), d);
  res.dump_cache();
  r = resolve_config(fake(), one, *c, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kDiskCache);
  EXPECT_EQ(r.config.get<TileConfig>().tile, 2);
  EXPECT_NE(r.detail.find("fake_one_field.json"), std::string::npos);
  // 3. scopes beat the cache; nested, innermost first; misses fall through.
  AutotuningResult outer, inner;
  AutotuningData d3, d4;
  d3.set(Config::make(TileConfig{3}), BenchmarkData{.median_ms = 1.0});
  d4.set(Config::make(TileConfig{4}), BenchmarkData{.median_ms = 1.0});
  outer.add(c->bound.with_implementation("one_field"), d3);
  auto other = fake_call(32);
  inner.add(other->bound.with_implementation("one_field"), d4);
  {
    AutotuningScope s1(outer);
    EXPECT_EQ(resolve_config(fake(), one, *c, std::nullopt).config.get<TileConfig>().tile, 3);
    {
      AutotuningScope s2(inner);
      r = resolve_config(fake(), one, *c, std::nullopt);
      EXPECT_EQ(r.rung, Rung::kScope);
      EXPECT_EQ(r.config.get<TileConfig>().tile, 3);  // inner has no entry for this key
      EXPECT_EQ(resolve_config(fake(), one, *other, std::nullopt).config.get<TileConfig>().tile, 4);
      AutotuningScope s3(outer | inner);
      EXPECT_EQ(resolve_config(fake(), one, *other, std::nullopt).detail, "AutotuningScope#3");
    }
    EXPECT_EQ(resolve_config(fake(), one, *other, std::nullopt).rung, Rung::kHeuristics);
  }
  EXPECT_EQ(resolve_config(fake(), one, *c, std::nullopt).rung, Rung::kDiskCache);
}

// A forward asked for its residuals (a training step's) with no entry of its own takes the entry
// of the same call without them, from the disk cache or a scope; an entry of its own wins; a
// call without residuals never takes one with them.
TEST_F(Framework, ResidualsCallBorrowsTheEntryWithoutThem) {
  const OpFamily& norm = find_family("layer_norm");
  const Implementation& native = *norm.implementation("native");
  const Json spec = {{"x", "f32[64,256]"}, {"scale", "f32[256]"}, {"subtract_mean", false}};
  Json with = spec;
  with["return_residuals"] = true;
  auto plain_call = norm.make_call(norm.bind_json(spec, ""), fresh_seed());
  auto train_call = norm.make_call(norm.bind_json(with, ""), fresh_seed());
  ASSERT_EQ(resolve_config(norm, native, *train_call, std::nullopt).rung, Rung::kHeuristics);
  const Config heuristics = native.heuristics_config(*train_call);
  // A config the heuristics would not pick: any other valid rows_per_item.
  const Json other_json = {{"rows_per_item", heuristics.json().value("rows_per_item", 1) + 3}};
  const Config other = native.config_from_json(other_json);
  const AutotuningResult res = one_entry(plain_call->bound.with_implementation("native"), other);
  res.dump_cache();
  Resolution r = resolve_config(norm, native, *train_call, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kDiskCache);
  EXPECT_EQ(r.config.json(), other.json());
  EXPECT_NE(r.detail.find("the entry of the plain call"), std::string::npos) << r.detail;
  {
    AutotuningScope scope(res);
    r = resolve_config(norm, native, *train_call, std::nullopt);
    EXPECT_EQ(r.rung, Rung::kScope);
    EXPECT_EQ(r.config.json(), other.json());
  }
  // Its own entry wins.
  AutotuningResult own;
  AutotuningData d2;
  d2.set(heuristics, BenchmarkData{.median_ms = 1.0});
  own.add(train_call->bound.with_implementation("native"), d2);
  own.dump_cache();
  r = resolve_config(norm, native, *train_call, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kDiskCache);
  EXPECT_EQ(r.config.json(), heuristics.json());
  EXPECT_EQ(r.detail.find("the entry of the plain call"), std::string::npos) << r.detail;
  // Never the other way.
  DiskCache::global().clear();
  std::filesystem::remove_all(dir_);
  own.dump_cache();
  EXPECT_EQ(resolve_config(norm, native, *plain_call, std::nullopt).rung, Rung::kHeuristics);
}

// A call on pre-packed weights (ragged_dot's packed_rhs, an argument variant of the family) with
// no entry of its own takes the plain call's: `bench` right after `autotune --into-cache` looks
// up the packed rows' keys too.
TEST_F(Framework, PackedVariantBorrowsThePlainCallsEntry) {
  const OpFamily& rd = find_family("ragged_dot");
  const Implementation& native = *rd.implementation("native");
  const Json spec = {{"lhs", "f32[19,32]"}, {"rhs", "f32[3,32,24]"}, {"group_sizes", {7, 0, 12}}};
  Json packed_spec = spec;
  packed_spec["packed_rhs"] = true;
  auto plain_call = rd.make_call(rd.bind_json(spec, ""), fresh_seed());
  auto packed_call = rd.make_call(rd.bind_json(packed_spec, ""), fresh_seed());
  ASSERT_NE(plain_call->bound.key(), packed_call->bound.key());
  ASSERT_EQ(resolve_config(rd, native, *packed_call, std::nullopt).rung, Rung::kHeuristics);
  Json other = native.heuristics_config(*plain_call).json();
  other["mr"] = other.value("mr", 8) == 8 ? 14 : 8;
  other["mc"] = other["mr"];
  const Config tuned = native.config_from_json(other);
  one_entry(plain_call->bound.with_implementation("native"), tuned).dump_cache();
  const Resolution r = resolve_config(rd, native, *packed_call, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kDiskCache);
  EXPECT_EQ(r.config.json(), tuned.json());
  EXPECT_NE(r.detail.find("the entry of the plain call"), std::string::npos) << r.detail;
}

// A miss is recorded once per key however often the call runs (one warning line for the
// process, each key at debug level); a made call's preparation (a backward's forward) misses
// nothing, since it takes the heuristics without a lookup.
TEST_F(Framework, MissesAreCountedOncePerKeyAndNotForMadeCalls) {
  const auto count = [](const std::string& family) {
    size_t n = 0;
    for (const MissedKey& k : missed_keys()) n += k.family == family;
    return n;
  };
  const size_t fake_before = count(fake().name());
  auto c = fake_call(77);  // a key no other test of the process runs
  for (int i = 0; i < 3; ++i) dispatch(fake(), *c, {});
  EXPECT_EQ(count(fake().name()), fake_before + 1);
  const std::vector<MissedKey> keys = missed_keys();
  bool found = false;
  for (const MissedKey& k : keys) found |= k.key == c->bound.key();
  EXPECT_TRUE(found);

  const OpFamily& vjp = find_family("layer_norm_vjp");
  const size_t norm_before = count("layer_norm");
  const Json spec = {{"x", "f32[5,37]"}, {"scale", "f32[37]"}, {"dy", "f32[5,37]"},
                     {"mean", "f32[5]"}, {"rstd", "f32[5]"},   {"subtract_mean", false}};
  vjp.make_call(vjp.bind_json(spec, ""), fresh_seed());
  EXPECT_EQ(count("layer_norm"), norm_before);
}

// ConfigSourceScope(kHeuristics) skips scopes and the disk cache (the PyTorch ops' default);
// ConfigQuery records what dispatch would choose and runs nothing, under any miss policy.
TEST_F(Framework, HeuristicsOnlySourceAndConfigQuery) {
  auto c = fake_call();
  const auto& one = *fake().one;
  AutotuningResult res;
  AutotuningData d;
  d.set(Config::make(TileConfig{2}), BenchmarkData{.median_ms = 1.0});
  res.add(c->bound.with_implementation("one_field"), d);
  res.dump_cache();
  ASSERT_EQ(resolve_config(fake(), one, *c, std::nullopt).rung, Rung::kDiskCache);
  {
    ConfigSourceScope h(ConfigSource::kHeuristics);
    EXPECT_EQ(config_source(), ConfigSource::kHeuristics);
    const Resolution r = resolve_config(fake(), one, *c, std::nullopt);
    EXPECT_EQ(r.rung, Rung::kHeuristics);
    EXPECT_EQ(r.config.get<TileConfig>().tile, 1);
    {
      ConfigSourceScope l(ConfigSource::kLadder);
      EXPECT_EQ(resolve_config(fake(), one, *c, std::nullopt).rung, Rung::kDiskCache);
    }
    EXPECT_EQ(resolve_config(fake(), one, *c, Config::make(TileConfig{4})).rung, Rung::kExplicit);
  }
  EXPECT_EQ(config_source(), ConfigSource::kLadder);

  for (int64_t i = 0; i < c->outputs[0].size(); ++i) c->outputs[0].set(i, NAN);
  CacheMissPolicyScope p(CacheMissPolicy::kError);  // a query never throws CacheMiss
  auto miss = fake_call(32);
  ConfigQuery q;
  EXPECT_EQ(dispatch(fake(), *c, {}), "one_field");
  EXPECT_EQ(dispatch(fake(), *miss, {}), "one_field");
  ASSERT_EQ(q.calls().size(), 2u);
  EXPECT_EQ(q.calls()[0].family, "fake");
  EXPECT_EQ(q.calls()[0].implementation, "one_field");
  EXPECT_EQ(q.calls()[0].heuristics.get<TileConfig>().tile, 1);
  EXPECT_EQ(q.calls()[0].ladder.rung, Rung::kDiskCache);
  EXPECT_EQ(q.calls()[0].ladder.config.get<TileConfig>().tile, 2);
  EXPECT_EQ(q.calls()[1].ladder.rung, Rung::kHeuristics);
  EXPECT_TRUE(std::isnan(c->outputs[0].get(0)));  // nothing ran
}

TEST_F(Framework, AllFailedEntryIsAMiss) {
  auto c = fake_call(16);
  AutotuningResult res;
  AutotuningData d;
  d.set_failure(Config::make(TileConfig{2}), {FailureKind::kWrongResult, "x"});
  res.add(c->bound.with_implementation("one_field"), d);
  AutotuningScope s(res);
  EXPECT_EQ(resolve_config(fake(), *fake().one, *c, std::nullopt).rung, Rung::kHeuristics);
}

TEST_F(Framework, AutotunePolicyTunesAndPersists) {
  auto c = fake_call(48);
  CacheMissPolicyScope p(CacheMissPolicy::kAutotune);
  const Resolution r = resolve_config(fake(), *fake().one, *c, std::nullopt);
  EXPECT_EQ(r.rung, Rung::kAutotuned);
  EXPECT_EQ(r.config.get<TileConfig>().tile, 3);
  EXPECT_TRUE(std::filesystem::exists(dir_ / device_kind() / "fake_one_field.json"));
  EXPECT_EQ(resolve_config(fake(), *fake().one, *c, std::nullopt).rung, Rung::kDiskCache);
}

TEST_F(Framework, PolicyFromEnvironmentAndBadValue) {
  auto c = fake_call(24);
  setenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", "error", 1);
  EXPECT_THROW(resolve_config(fake(), *fake().one, *c, std::nullopt), CacheMiss);
  setenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", "sometimes", 1);
  EXPECT_THROW(resolve_config(fake(), *fake().one, *c, std::nullopt), InvalidArgument);
  {
    CacheMissPolicyScope p(CacheMissPolicy::kHeuristics);  // scoped override wins
    EXPECT_EQ(resolve_config(fake(), *fake().one, *c, std::nullopt).rung, Rung::kHeuristics);
  }
  unsetenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK");
}

TEST_F(Framework, BoundArgumentsRoundTrip) {
  auto c = fake_call(8);
  const std::vector<BoundArguments> list = {c->bound.with_implementation("one_field"), c->bound};
  const auto back = BoundArguments::loads_list(BoundArguments::dumps_list(list));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].key(), list[0].key());
  EXPECT_EQ(back[0].implementation(), "one_field");
  EXPECT_THROW(BoundArguments::loads_list("[{\"op\": {\"family\": \"fake\"}, \"argu"),
               InvalidArgument);
  EXPECT_THROW(BoundArguments::loads_list("[{\"op\": {\"family\": \"nope\"}, \"arguments\": {}}]"),
               InvalidArgument);
  EXPECT_THROW(BoundArguments::loads_list("[{\"op\": {\"family\": \"fake\", \"implementation\": "
                                          "\"zzz\"}, \"arguments\": {\"x\": \"f32[2]\"}}]"),
               InvalidArgument);
  EXPECT_THROW(BoundArguments::loads_list("{}"), InvalidArgument);
}

TEST_F(Framework, CallRecorderCapturesCalls) {
  auto c = fake_call(8);
  CallRecorder rec;
  dispatch(fake(), *c, {});
  dispatch(fake(), *c, {.implementation = "nothing"});
  ASSERT_EQ(rec.calls().size(), 2u);
  EXPECT_EQ(rec.calls()[1].implementation(), "nothing");
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

enum class Fruit { kApple, kPear, kFig };
constexpr EnumNames<Fruit, 3> kFruits{
    "fruit", {{{Fruit::kApple, "apple"}, {Fruit::kPear, "pear"}, {Fruit::kFig, "fig"}}}};

TEST(EnumNames, NameAndParseFromOneTable) {
  for (Fruit f : {Fruit::kApple, Fruit::kPear, Fruit::kFig})
    EXPECT_EQ(kFruits.parse(kFruits.name(f)), f);
  static_assert(kFruits.name(Fruit::kPear) == "pear");
  try {
    kFruits.parse("plum");
    FAIL() << "parsed an unknown name";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fruit 'plum': expected apple, pear or fig"),
              std::string::npos)
        << e.what();
  }
  // The library's own tables: an unknown activation names the argument and every choice.
  EXPECT_THROW(parse_activation("tanh"), InvalidArgument);
  EXPECT_EQ(activation_name(parse_activation("gelu_tanh")), "gelu_tanh");
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

struct TwoInts {
  int a = 0, b = 0;
};
// b is not a size: it declares its own range.
constexpr ConfigFields<TwoInts, 2> kTwoInts{"test config",
                                            {{{"a", &TwoInts::a}, {"b", &TwoInts::b, -100, 100}}}};

TEST(ConfigFields, EncodeDecodeAndNameTheFields) {
  const TwoInts v = kTwoInts.from_json(kTwoInts.to_json(TwoInts{3, -4}));
  EXPECT_EQ(v.a, 3);
  EXPECT_EQ(v.b, -4);
  EXPECT_EQ(kTwoInts.names(), (std::vector<std::string>{"a", "b"}));
  for (const char* bad : {R"({"a":1})", R"({"a":1,"b":"x"})", R"([1,2])", R"({"a":1.5,"b":2})",
                          R"({"a":1,"b":2,"zz":3})"}) {
    try {
      kTwoInts.from_json(parse_json(bad, "test"));
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("test config"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("expected integer fields a, b"), std::string::npos)
          << e.what();
    }
  }
}

// TypedFamily: the spec's arguments from the field list, with errors that name them.
TEST(TypedFamily, SpecsAreCheckedAgainstTheFields) {
  auto message = [](const Json& args) {
    try {
      fake().bind_json(args, "");
    } catch (const InvalidArgument& e) {
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({{"x", "f32[4]"}, {"y", 1}}),
            "fake arguments: unknown argument 'y'; expected x, num_threads");
  EXPECT_EQ(message(Json::object()), "fake arguments: missing 'x'");
  EXPECT_NE(message({{"x", 3}}).find("'x' = 3: expected a ShapeDtype string"), std::string::npos);
  EXPECT_NE(message({{"x", "f32[4]"}, {"num_threads", 0}}).find("num_threads = 0"),
            std::string::npos);
  EXPECT_NE(message({{"x", "f32[2,2]"}}).find("expected f32[n]"), std::string::npos);
  EXPECT_NE(message(Json::array()).find("expected a JSON object"), std::string::npos);
  // Absent num_threads is the library's; the key always holds it.
  const BoundArguments b = fake().bind_json({{"x", "f32[4]"}}, "nothing");
  EXPECT_EQ(b.arguments(), (Json{{"x", "f32[4]"}, {"num_threads", num_threads()}}));
  EXPECT_EQ(b.implementation(), "nothing");
}

TEST(TypedFamily, MadeCallsHaveSeededInputsAndOwnOutputs) {
  const BoundArguments b = fake().bind_json({{"x", "f32[37]"}, {"num_threads", 1}}, "");
  auto c1 = fake().make_call(b, 7), c2 = fake().make_call(b, 7), c3 = fake().make_call(b, 8);
  const auto& x1 = call_as<testing::FakeCall>(*c1).x;
  const Tensor expected = Tensor::randn({37}, DType::kF32, 7);
  for (int64_t i = 0; i < 37; ++i) {
    EXPECT_EQ(x1.data_as<float>()[i], expected.data_as<float>()[i]);
    EXPECT_EQ(call_as<testing::FakeCall>(*c2).x.data_as<float>()[i], x1.data_as<float>()[i]);
  }
  EXPECT_NE(call_as<testing::FakeCall>(*c3).x.data_as<float>()[0], x1.data_as<float>()[0]);
  ASSERT_EQ(c1->outputs.size(), 1u);
  EXPECT_EQ(c1->outputs[0].spec(), (ShapeDtype{{37}, DType::kF32}));
  EXPECT_NE(c1->outputs[0].data(), c2->outputs[0].data());
  EXPECT_EQ(c1->bound.key(), b.key());
  EXPECT_EQ(c1->num_threads, 1);
}

TEST(TypedFamily, PublicCallPathBindsAllocatesAndDispatches) {
  Tensor x = Tensor::randn({5}, DType::kF32, 3);
  testing::FakeCall c;
  c.x = x.view();
  c.num_threads = 0;
  std::vector<Tensor> out = fake().run(c, {.implementation = "nothing"});
  ASSERT_EQ(out.size(), 1u);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(out[0].data_as<float>()[i], 2 * x.data_as<float>()[i]);
  EXPECT_EQ(c.bound.key(), fake().bind_json({{"x", "f32[5]"}}, "").key());
  testing::FakeCall bad;
  bad.x = Tensor::randn({2, 2}, DType::kF32, 1).view();
  EXPECT_THROW(fake().run(bad, {}), InvalidArgument);
}

struct OtherCall : CallBase {};

TEST(CallAs, ChecksTheCallType) {
  OtherCall other;
  CallBase& base = other;
  EXPECT_EQ(&call_as<OtherCall>(base), &other);
  struct ThirdCall : CallBase {};
  EXPECT_THROW(call_as<ThirdCall>(base), Error);
}

}  // namespace
}  // namespace tokamax
