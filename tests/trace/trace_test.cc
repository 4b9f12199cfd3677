// The trace layer: recording (TraceSession, nesting, threads, errors), extraction (brace
// balancing, malformed / unknown / incompatible payloads, truncated and merged traces), and
// the offline-tuning round trip: trace a run, extract, tune, apply, trace again.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <set>
#include <thread>

#include "tests/expect_error.h"
#include "tests/op/fake_ops.h"

namespace tokamax {
namespace {

using testing::fake;
using testing::FakeCall;
using testing::ScopedCacheDir;

// A path in the temporary directory, removed when the test ends (also when it fails).
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("tokamax_trace_" + std::to_string(getpid()) + "_" + name))
                  .string()) {}
  ~TempPath() { std::filesystem::remove(path_); }
  operator const std::string&() const { return path_; }  // NOLINT: used where a path is
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// The op events ("ph": "X") of a trace file; the file must be valid JSON.
std::vector<Json> op_events(const std::string& path) {
  const Json doc = read_json_file(path);
  std::vector<Json> out;
  for (const Json& e : doc.at("traceEvents")) {
    if (e.value("ph", "") == "X") out.push_back(e);
  }
  return out;
}

// The payload objects of one event, outermost first.
std::vector<Json> payloads_of(const Json& event) {
  const std::string s = event.at("args").at("payload").get<std::string>();
  std::vector<Json> out;
  for (const PayloadSpan& p : find_payloads(s)) {
    EXPECT_TRUE(p.error.empty()) << p.error;
    out.push_back(Json::parse(s.substr(p.begin, p.end - p.begin)));
  }
  return out;
}

// An op family whose only implementation calls the fake op from inside its run: the nesting
// case (a fused op built from other ops).
struct OuterCall : CallBase {
  Tensor x;
};
class Composite : public Implementation {
 public:
  std::string name() const override { return "composite"; }
  void run(CallBase& base, const Config&, const Prepared*) const override {
    auto& c = static_cast<OuterCall&>(base);
    auto inner = fake().make_call(fake().bind_json({{"x", c.x.spec().str()}}, ""), 3);
    dispatch(fake(), *inner, {});
    std::copy_n(inner->outputs[0].data_as<float>(), c.x.size(), c.outputs[0].data_as<float>());
  }
};
class OuterFamily : public OpFamily {
 public:
  std::string name() const override { return "fake_outer"; }
  std::vector<std::shared_ptr<const Implementation>> implementations() const override {
    return {std::make_shared<Composite>()};
  }
  std::shared_ptr<const Implementation> reference() const override {
    return std::make_shared<Composite>();
  }
  BoundArguments bind_json(const Json& a, const std::string& impl) const override {
    return BoundArguments("fake_outer", impl,
                          {{"x", a.at("x").get<std::string>()}, {"num_threads", 1}});
  }
  std::unique_ptr<CallBase> make_call(const BoundArguments& b, uint64_t seed) const override {
    auto c = std::make_unique<OuterCall>();
    const ShapeDtype x = ShapeDtype::parse(b.arguments()["x"].get<std::string>());
    c->x = Tensor::randn(x.shape, DType::kF32, seed);
    out_ = Tensor(x.shape, DType::kF32);
    c->outputs = {out_.view()};
    c->bound = b;
    return c;
  }
  Tolerance tolerance(const CallBase&) const override { return {}; }

 private:
  mutable Tensor out_;
};
const OuterFamily& outer() {
  static std::shared_ptr<OuterFamily> f = [] {
    auto p = std::make_shared<OuterFamily>();
    register_family(p);
    return p;
  }();
  return *f;
}

TEST(Trace, CallPayloadIsCanonicalJson) {
  auto call = testing::fake_call(5);
  Resolution r;
  r.config = Config::make(testing::TileConfig{7});
  r.rung = Rung::kDiskCache;
  const std::string p = call_payload(call->bound.with_implementation("one_field"), r);
  ASSERT_EQ(p.rfind(kPayloadMarker, 0), 0u);
  const Json j = Json::parse(p.substr(kPayloadMarker.size()));
  EXPECT_EQ(p.substr(kPayloadMarker.size()), canonical_dump(j));
  EXPECT_EQ(j["op"]["rung"], "disk_cache");
  EXPECT_EQ(j["op"]["config"]["tile"], 7);
  EXPECT_EQ(j["tokamax_version"], library_version());
  EXPECT_EQ(BoundArguments::from_json(j).key(), call->bound.key());
}

TEST(Trace, OffWithoutSession) {
  ASSERT_TRUE(env_trace_path().empty()) << "run the tests without TOKAMAX_TRACE";
  EXPECT_FALSE(tracing_enabled());
  const TempPath path("scoped.json");
  {
    TraceSession s(path);
    EXPECT_TRUE(tracing_enabled());
  }
  EXPECT_FALSE(tracing_enabled());
  EXPECT_TRUE(op_events(path).empty());
}

TEST(Trace, EventsAreCompleteChromeEvents) {
  ScopedCacheDir cache("trace_events");
  const TempPath path("events.json");
  auto call = testing::fake_call(16);
  {
    TraceSession s(path);
    // Until the session ends only a temporary file exists: no half trace under the final name.
    EXPECT_FALSE(std::filesystem::exists(path.str()));
    dispatch(fake(), *call, {});
    EXPECT_EQ(s.num_events(), 1);
  }
  const auto events = op_events(path);
  ASSERT_EQ(events.size(), 1u);
  const Json& e = events[0];
  EXPECT_EQ(e["name"], "fake/one_field");
  EXPECT_EQ(e["pid"].get<int64_t>(), getpid());
  EXPECT_TRUE(e["tid"].is_number_integer());
  EXPECT_GT(e["ts"].get<double>(), 0);
  EXPECT_GE(e["dur"].get<double>(), 0);
  const auto p = payloads_of(e);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0]["format"], kPayloadFormat);
  EXPECT_EQ(p[0]["op"]["family"], "fake");
  EXPECT_EQ(p[0]["op"]["implementation"], "one_field");
  EXPECT_EQ(p[0]["op"]["rung"], "heuristics");
  EXPECT_EQ(p[0]["op"]["config"], Json({{"tile", 1}}));
  EXPECT_EQ(p[0]["arguments"], call->bound.arguments());
  // No leftover temporary file next to the trace.
  for (const auto& f :
       std::filesystem::directory_iterator(std::filesystem::path(path.str()).parent_path()))
    EXPECT_EQ(f.path().string().find(path.str() + ".tmp"), std::string::npos) << f.path();
}

TEST(Trace, NestedPayloadsOutermostFirst) {
  ScopedCacheDir cache("trace_nested");
  const TempPath path("nested.json");
  auto call = outer().make_call(outer().bind_json({{"x", "f32[8]"}}, ""), 1);
  {
    TraceSession s(path);
    dispatch(outer(), *call, {});
  }
  EXPECT_TRUE(enclosing_payload().empty());  // restored after the call
  const auto events = op_events(path);
  ASSERT_EQ(events.size(), 2u);
  // The inner call finishes first and carries "outer/inner".
  const auto inner = payloads_of(events[0]);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(inner[0]["op"]["family"], "fake_outer");
  EXPECT_EQ(inner[1]["op"]["family"], "fake");
  EXPECT_EQ(events[0]["name"], "fake/one_field");
  const auto own = payloads_of(events[1]);
  ASSERT_EQ(own.size(), 1u);
  EXPECT_EQ(own[0]["op"]["family"], "fake_outer");
  // The inner span lies inside the outer one.
  EXPECT_GE(events[0]["ts"].get<double>(), events[1]["ts"].get<double>());
  EXPECT_LE(events[0]["ts"].get<double>() + events[0]["dur"].get<double>(),
            events[1]["ts"].get<double>() + events[1]["dur"].get<double>() + 1e-3);

  // Extraction finds both ops once each; the first event's "outer/inner" chain gives outer first.
  const ExtractReport r = extract_bound_args_file(path);
  ASSERT_EQ(r.bound_args.size(), 2u);
  EXPECT_EQ(r.bound_args[0].family(), "fake_outer");
  EXPECT_EQ(r.bound_args[1].family(), "fake");
  EXPECT_EQ(r.payloads, 3);
  EXPECT_EQ(r.duplicates, 1);

  // The summary counts each call under its own (last) payload, and the inner one as nested:
  // its time is inside the outer call's.
  const std::vector<TraceCallGroup> groups = summarize_trace(read_json_file(path), path).groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].op, "fake/one_field");
  EXPECT_EQ(groups[0].calls, 1);
  EXPECT_EQ(groups[0].nested_calls, 1);
  EXPECT_EQ(groups[0].nested_us, events[0]["dur"].get<double>());
  EXPECT_EQ(groups[0].key, canonical_dump(inner[1]["arguments"]));
  EXPECT_EQ(groups[1].op, "fake_outer/composite");
  EXPECT_EQ(groups[1].nested_calls, 0);
  EXPECT_EQ(groups[1].total_us, events[1]["dur"].get<double>());
}

TEST(TraceSummary, GroupsByOpKeyConfigAndRungAndSkipsOtherEvents) {
  auto event = [](const std::string& name, const Json& payload, double dur) {
    return Json{{"ph", "X"},
                {"name", name},
                {"dur", dur},
                {"args", {{"payload", "tokamax:" + payload.dump()}}}};
  };
  const Json a = {{"op", {{"config", {{"tile", 1}}}, {"rung", "scope"}}},
                  {"arguments", {{"n", 1}}}};
  Json b = a;
  b["op"]["rung"] = "heuristics";
  const Json doc = {{"traceEvents",
                     {event("f/i", a, 10),
                      event("f/i", a, 5),
                      event("f/i", b, 1),
                      {{"ph", "X"}, {"name", "other tool"}, {"dur", 99}},
                      {{"ph", "M"}, {"name", "process_name"}},
                      event("f/i", {{"op", 3}}, 7),
                      42}}};
  const TraceSummary summary = summarize_trace(doc, "doc");
  const std::vector<TraceCallGroup>& groups = summary.groups;
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].rung, "heuristics");
  EXPECT_EQ(groups[0].calls, 1);
  EXPECT_EQ(groups[1].rung, "scope");
  EXPECT_EQ(groups[1].calls, 2);
  EXPECT_EQ(groups[1].total_us, 15);
  EXPECT_EQ(groups[1].config, "{\"tile\":1}");
  EXPECT_EQ(groups[1].key, "{\"n\":1}");
  // The bare list form is a trace too; anything else is not.
  EXPECT_EQ(summarize_trace(doc["traceEvents"], "list").groups.size(), 2u);
  try {
    summarize_trace(Json{{"events", 1}}, "not_a_trace.json");
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not_a_trace.json: not a Chrome trace"), std::string::npos)
        << e.what();
  }
}

// A tokamax event whose field has the wrong type was read as blank or 0 (a numeric name gave an
// op without a name, a string dur a call of no time) without a word. Such events are left out
// and counted per field, with what was expected and the first of them; other tools' events
// are still passed over in silence.
TEST(TraceSummary, MistypedFieldsAreWarnedAboutNotReadAsBlankOrZero) {
  const Json payload = {{"op", {{"config", {{"tile", 1}}}, {"rung", "scope"}}},
                        {"arguments", {{"n", 1}}}};
  auto event = [&](const Json& name, const Json& dur, const Json& p) {
    return Json{
        {"ph", "X"}, {"name", name}, {"dur", dur}, {"args", {{"payload", "tokamax:" + p.dump()}}}};
  };
  Json no_dur = event("f/i", 1, payload);
  no_dur.erase("dur");
  Json bad_rung = payload;
  bad_rung["op"]["rung"] = 7;
  Json bad_config = payload;
  bad_config["op"]["config"] = "tile=1";
  const Json events = {
      event("f/i", 10, payload),
      event(5, 10, payload),
      event("f/i", "long", payload),
      event(Json(), 3, payload),
      no_dur,
      event("f/i", 2, bad_rung),
      event("f/i", 2, bad_config),
      {{"ph", 1}, {"args", {{"payload", "tokamax:" + payload.dump()}}}},
      {{"ph", "X"}, {"name", "f/i"}, {"dur", 1}, {"args", {{"payload", "tokamax:{\"op\": tru"}}}},
      {{"ph", "X"}, {"name", 5}, {"dur", "x"}, {"args", {{"code", 1}}}}};
  const TraceSummary s = summarize_trace({{"traceEvents", events}}, "t.json");
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].op, "f/i");
  EXPECT_EQ(s.groups[0].calls, 1);
  EXPECT_EQ(s.groups[0].total_us, 10);
  EXPECT_EQ(s.skipped, 8);
  const std::vector<std::string> want = {
      "t.json: skipped 2 tokamax events: 'name' is missing or not a string, expected the op's "
      "name (the first: event #1, 'name': 5)",
      "t.json: skipped 2 tokamax events: 'dur' is missing or not a number, expected microseconds "
      "(the first: event #2, 'dur': \"long\")",
      "t.json: skipped 1 tokamax event: the payload's 'op.rung' is not a string, expected a "
      "rung's name (the first: event #5, 'rung': 7)",
      "t.json: skipped 1 tokamax event: the payload's 'op.config' is not an object, expected an "
      "object (the first: event #6, 'config': \"tile=1\")",
      "t.json: skipped 1 tokamax event: 'ph' is missing or not a string, expected \"X\" (the "
      "first: event #7, 'ph': 1)",
      "t.json: skipped 1 tokamax event: its payload is not a JSON object, expected "
      "tokamax:{...} (the first: event #8)"};
  EXPECT_EQ(s.warnings, want);
}

// The streamed summary (one event at a time, from a text or a file, gzip-compressed too) is the
// summary of the parsed document, and refuses what parse_json refuses with its messages.
TEST(TraceSummary, StreamedFromTextOrFileAsFromTheParsedDocument) {
  auto event = [](const Json& name, const Json& dur, const std::string& rung, int n) {
    const Json p = {{"op", {{"config", {{"tile", n}}}, {"rung", rung}}},
                    {"arguments", {{"n", n}, {"s", "a \"quoted\" {brace"}}}};
    return Json{{"ph", "X"},
                {"name", name},
                {"dur", dur},
                {"args", {{"payload", "tokamax:{\"op\":{}}/tokamax:" + p.dump()}}}};
  };
  Json events = Json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"args", {{"name", "tokamax (k)"}}}});
  for (int i = 0; i < 40; ++i)
    events.push_back(event("f/i", 1.5 * i, i % 3 ? "scope" : "cache", i % 4));
  events.push_back(event(7, 1, "scope", 1));
  events.push_back({{"ph", "X"}, {"name", "other"}, {"args", {{"deep", {{{"a", {1, {2}}}}}}}}});
  events.push_back(42);
  const Json doc = {{"displayTimeUnit", "ms"}, {"traceEvents", events}, {"z", {{"x", 1}}}};
  const TraceSummary want = summarize_trace(doc, "t");
  ASSERT_EQ(want.groups.size(), 8u);
  auto same = [&](const TraceSummary& got) {
    ASSERT_EQ(got.groups.size(), want.groups.size());
    for (size_t i = 0; i < got.groups.size(); ++i) {
      EXPECT_EQ(got.groups[i].op, want.groups[i].op);
      EXPECT_EQ(got.groups[i].key, want.groups[i].key);
      EXPECT_EQ(got.groups[i].config, want.groups[i].config);
      EXPECT_EQ(got.groups[i].rung, want.groups[i].rung);
      EXPECT_EQ(got.groups[i].calls, want.groups[i].calls);
      EXPECT_EQ(got.groups[i].total_us, want.groups[i].total_us);
      EXPECT_EQ(got.groups[i].nested_calls, want.groups[i].nested_calls);
    }
    EXPECT_EQ(got.warnings, want.warnings);
    EXPECT_EQ(got.device_kind, "k");
  };
  same(summarize_trace_text(doc.dump(), "t"));
  same(summarize_trace_text(doc.dump(2), "t"));
  same(summarize_trace_text(events.dump(), "t"));  // the bare list form
  const TempPath plain("stream.json"), gz("stream.json.gz");
  write_file_atomic(plain, doc.dump(1));
  same(summarize_trace_file(plain, nullptr, "t"));
  {
    const std::string text = doc.dump();
    gzFile g = gzopen(gz.str().c_str(), "wb");
    ASSERT_NE(g, nullptr);
    gzwrite(g, text.data(), static_cast<unsigned>(text.size()));
    gzclose(g);
  }
  std::vector<std::string> file_warnings;
  same(summarize_trace_file(gz, &file_warnings, "t"));
  EXPECT_TRUE(file_warnings.empty());
  // A gzip stream cut short: its warning, and the parse error of the text it ends with.
  const std::string bytes = read_file(gz);
  write_file_atomic(gz, bytes.substr(0, bytes.size() / 2));
  file_warnings.clear();
  testing::expect_invalid_argument([&] { summarize_trace_file(gz, &file_warnings); },
                                   ("malformed JSON in " + gz.str() + " at byte").c_str());
  ASSERT_EQ(file_warnings.size(), 1u);
  EXPECT_NE(file_warnings[0].find("gzip stream truncated after"), std::string::npos);

  // What parse_json refuses, with its messages: malformed text, numbers beyond double, nesting
  // beyond kMaxJsonDepth; and what is not a trace. A repeated "traceEvents" (a parsed document
  // keeps the last) is refused rather than read otherwise.
  testing::expect_invalid_argument([&] { summarize_trace_text("[{\"ph\": }]", "cut.json"); },
                                   "malformed JSON in cut.json at byte 9");
  testing::expect_invalid_argument(
      [&] { summarize_trace_text("[1e400]", "big.json"); },
      "unreadable JSON in big.json: [json.exception.out_of_range.406]");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  testing::expect_invalid_argument([&] { summarize_trace_text(deep, "deep.json"); },
                                   "JSON in deep.json nests deeper than 256 levels at byte 257");
  testing::expect_invalid_argument(
      [&] { summarize_trace_text(R"({"events": 1})", "not_a_trace.json"); },
      "not_a_trace.json: not a Chrome trace");
  testing::expect_invalid_argument(
      [&] { summarize_trace_text(R"({"traceEvents": [], "traceEvents": 1})", "twice.json"); },
      "JSON in twice.json has a second \"traceEvents\" member at byte");
  testing::expect_invalid_argument([&] { summarize_trace_file("/no/such/trace.json"); },
                                   "cannot open '/no/such/trace.json'");
}

TEST(Trace, ThrowingCallIsRecordedWithItsError) {
  ScopedCacheDir cache("trace_throw");
  const TempPath path("throw.json");
  auto call = testing::fake_call(16);
  {
    TraceSession s(path);
    CallOptions o;
    o.implementation = "throws";
    o.config = Config::make(testing::TileConfig{1});
    EXPECT_THROW(dispatch(fake(), *call, o), std::runtime_error);
    EXPECT_TRUE(enclosing_payload().empty());
  }
  const auto events = op_events(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["args"]["error"], "boom");
  EXPECT_EQ(payloads_of(events[0])[0]["op"]["rung"], "explicit");
}

TEST(Trace, ManyThreadsNoLossNoCorruption) {
  ScopedCacheDir cache("trace_threads");
  const TempPath path("threads.json");
  const int kThreads = 4, kCalls = 60;
  {
    TraceSession s(path);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([t] {
        for (int i = 0; i < kCalls; ++i) {
          auto c = testing::fake_call(8 + t);  // one key per thread
          dispatch(fake(), *c, {});
        }
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(s.num_events(), kThreads * kCalls);
  }
  const auto events = op_events(path);  // parses: the file is valid JSON
  ASSERT_EQ(events.size(), static_cast<size_t>(kThreads * kCalls));
  std::set<int64_t> tids;
  std::map<std::string, int> per_key;
  for (const Json& e : events) {
    tids.insert(e["tid"].get<int64_t>());
    const auto p = payloads_of(e);
    ASSERT_EQ(p.size(), 1u);
    per_key[p[0]["arguments"]["x"].get<std::string>()]++;
  }
  EXPECT_EQ(tids.size(), static_cast<size_t>(kThreads));
  ASSERT_EQ(per_key.size(), static_cast<size_t>(kThreads));
  for (const auto& [k, n] : per_key) EXPECT_EQ(n, kCalls) << k;
  EXPECT_EQ(extract_bound_args_file(path).bound_args.size(), static_cast<size_t>(kThreads));
}

TEST(Trace, ProcessThatDiesLeavesAReadableTemporaryFile) {
  ScopedCacheDir cache("trace_crash");
  const TempPath path("crash.json");
  auto call = testing::fake_call(6);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TraceSession s(path);
    dispatch(fake(), *call, {});
    dispatch(fake(), *call, {});
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    dispatch(fake(), *call, {});  // more than 100 ms after the last flush: flushes all three
    std::_Exit(0);                // no destructors: the session never ends
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_FALSE(std::filesystem::exists(path.str()));
  const std::string prefix = path.str() + ".tmp." + std::to_string(child) + ".";
  std::string tmp;
  for (const auto& f :
       std::filesystem::directory_iterator(std::filesystem::path(path.str()).parent_path())) {
    if (f.path().string().rfind(prefix, 0) == 0) tmp = f.path().string();
  }
  ASSERT_FALSE(tmp.empty()) << "no " << prefix << "*";
  const ExtractReport r = extract_bound_args_file(tmp);
  std::filesystem::remove(tmp);
  EXPECT_FALSE(r.valid_json);  // no footer
  EXPECT_EQ(r.payloads, 3);
  ASSERT_EQ(r.bound_args.size(), 1u);
  EXPECT_EQ(r.bound_args[0].key(), call->bound.key());
}

TEST(Trace, ForkedChildLeavesTheParentsTraceAlone) {
  ScopedCacheDir cache("trace_fork");
  const TempPath path("forked.json");
  auto call = testing::fake_call(6);
  {
    TraceSession s(path);
    dispatch(fake(), *call, {});
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The child's calls must not reach the parent's session, and its exit (which flushes
      // every stdio stream) must not write the copied buffer into the parent's file.
      for (int i = 0; i < 5; ++i) dispatch(fake(), *call, {});
      std::exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    dispatch(fake(), *call, {});
  }
  const auto events = op_events(path);  // valid JSON
  ASSERT_EQ(events.size(), 2u);
  for (const Json& e : events) EXPECT_EQ(e["pid"].get<int64_t>(), getpid());
}

TEST(Trace, TwoSessionsBothRecord) {
  ScopedCacheDir cache("trace_two");
  const TempPath a("a.json"), b("b.json");
  auto call = testing::fake_call(4);
  {
    TraceSession sa(a);
    dispatch(fake(), *call, {});
    {
      TraceSession sb(b);
      dispatch(fake(), *call, {});
    }
    dispatch(fake(), *call, {});
  }
  EXPECT_EQ(op_events(a).size(), 3u);
  EXPECT_EQ(op_events(b).size(), 1u);
}

TEST(Trace, UnwritablePathIsInvalidArgument) {
  EXPECT_THROW(TraceSession("/proc/no/such/dir/trace.json"), InvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Brace balancing.

std::vector<std::string> spans_text(std::string_view s) {
  std::vector<std::string> out;
  for (const PayloadSpan& p : find_payloads(s))
    out.push_back(p.error.empty() ? std::string(s.substr(p.begin, p.end - p.begin))
                                  : "ERROR@" + std::to_string(p.marker));
  return out;
}

TEST(FindPayloads, BracesInsideStringsDoNotCount) {
  const std::string a = R"({"s":"}}}{","t":"\"}\\"})";
  EXPECT_EQ(spans_text("tokamax:" + a), std::vector<std::string>{a});
  // Escaped backslash right before a closing quote, then a real closing brace.
  const std::string b = R"({"k":"a\\","n":{"m":"{"}})";
  EXPECT_EQ(spans_text("x tokamax:" + b + " trailing }"), std::vector<std::string>{b});
}

TEST(FindPayloads, NestedChainsAndMarkersInsideStrings) {
  const std::string outer = R"({"doc":"see tokamax:{not a payload}"})";
  const std::string inner = R"({"op":{"family":"x"}})";
  EXPECT_EQ(spans_text("tokamax:" + outer + "/tokamax:" + inner),
            (std::vector<std::string>{outer, inner}));
}

TEST(FindPayloads, ProseTruncationAndEmpty) {
  EXPECT_TRUE(spans_text("tokamax: a word, tokamax:ragged_dot").empty());
  EXPECT_TRUE(spans_text("").empty());
  EXPECT_EQ(spans_text(R"(tokamax:{"a":{"b":1})"), std::vector<std::string>{"ERROR@0"});
  // A truncated payload does not hide a later complete one: the search resumes after the
  // marker, whether the cut left a brace or a string open.
  EXPECT_EQ(spans_text(R"(tokamax:{"a":"}"  tokamax:{"b":2})"),
            (std::vector<std::string>{"ERROR@0", R"({"b":2})"}));
  EXPECT_EQ(spans_text(R"(tokamax:{"a":{ tokamax:{"b":2})"),
            (std::vector<std::string>{"ERROR@0", R"({"b":2})"}));
}

// ---------------------------------------------------------------------------------------------
// Extraction from traces written by other tools and from bad files.

std::string payload_for(const Json& arguments, const std::string& family = "fake",
                        int format = kPayloadFormat) {
  return std::string(kPayloadMarker) + Json({{"format", format},
                                             {"tokamax_version", "0.1.0"},
                                             {"op",
                                              {{"family", family},
                                               {"implementation", "one_field"},
                                               {"config", {{"tile", 2}}},
                                               {"rung", "scope"}}},
                                             {"arguments", arguments}})
                                           .dump();
}

Json event(const std::string& name, const std::string& payload) {
  return {{"name", name},
          {"ph", "X"},
          {"ts", 1},
          {"dur", 2},
          {"pid", 1},
          {"tid", 1},
          {"args", {{"payload", payload}}}};
}

TEST(Extract, MixedTraceCountsEveryKindOfPayload) {
  fake();
  const Json good = {{"x", "f32[64]"}, {"num_threads", 1}};
  Json events = Json::array();
  events.push_back({{"name", "python"}, {"ph", "X"}, {"args", {{"code", "d = {'}': 1}"}}}});
  events.push_back(event("fake/one_field", payload_for(good)));
  events.push_back(event("fake/one_field", payload_for(good)));  // duplicate
  events.push_back(event("bad", "tokamax:{\"format\":1,\"op\":}"));
  events.push_back(event("unknown", payload_for(good, "no_such_op")));
  events.push_back(event("future", payload_for(good, "fake", 99)));
  events.push_back(event("invalid", payload_for({{"x", "f32[-3]"}})));
  events.push_back(event("other", payload_for({{"x", "f32[7]"}})));
  const std::string text = Json({{"traceEvents", events}}).dump();

  const ExtractReport r = extract_bound_args(text, "mixed.json");
  EXPECT_TRUE(r.valid_json);
  EXPECT_TRUE(r.chrome_trace);
  EXPECT_EQ(r.events, 8);
  EXPECT_EQ(r.payloads, 7);
  ASSERT_EQ(r.bound_args.size(), 2u);
  EXPECT_EQ(r.bound_args[0].arguments()["x"], "f32[64]");
  EXPECT_EQ(r.bound_args[0].implementation(), "one_field");
  EXPECT_EQ(r.bound_args[0].to_json()["op"].count("config"), 0u);  // configs stripped
  EXPECT_EQ(r.duplicates, 1);
  EXPECT_EQ(r.malformed, 1);
  EXPECT_EQ(r.unknown_op, 1);
  EXPECT_EQ(r.incompatible, 1);
  EXPECT_EQ(r.invalid, 1);
  ASSERT_EQ(r.warnings.size(), 4u);
  // Each warning names the event and the position in its string.
  EXPECT_NE(r.warnings[0].find("event #3 'bad'"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("offset 0"), std::string::npos) << r.warnings[0];
  EXPECT_NE(r.warnings[1].find("no_such_op"), std::string::npos) << r.warnings[1];
  EXPECT_NE(r.warnings[2].find("format 99"), std::string::npos) << r.warnings[2];

  ExtractOptions only;
  only.op = "fake_outer";
  outer();
  const ExtractReport f = extract_bound_args(text, "mixed.json", only);
  EXPECT_TRUE(f.bound_args.empty());
  EXPECT_EQ(f.other_ops, 5);
}

TEST(Extract, MergedListFormAndTruncatedTrace) {
  fake();
  Json events = Json::array();
  for (int n : {3, 5, 9})
    events.push_back(event("fake", payload_for({{"x", ShapeDtype{{n}, DType::kF32}.str()}})));
  // The bare-list form other tools write.
  const std::string list = events.dump();
  EXPECT_EQ(extract_bound_args(list, "list.json").bound_args.size(), 3u);
  // Cut in the middle of the last event: the first two survive.
  const std::string cut = list.substr(0, list.rfind("f32[9]"));
  const ExtractReport r = extract_bound_args(cut, "cut.json");
  EXPECT_FALSE(r.valid_json);
  ASSERT_EQ(r.bound_args.size(), 2u);
  EXPECT_EQ(r.bound_args[1].arguments()["x"], "f32[5]");
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(r.warnings[0].find("cut.json"), std::string::npos);
}

TEST(Extract, SeveralTracesDedupeAcrossFiles) {
  fake();
  const TempPath a("multi_a.json"), b("multi_b.json");
  auto trace_of = [](std::vector<int> ns) {
    Json events = Json::array();
    for (int n : ns)
      events.push_back(event("fake", payload_for({{"x", ShapeDtype{{n}, DType::kF32}.str()}})));
    return Json({{"traceEvents", events}}).dump();
  };
  write_file_atomic(a, trace_of({3, 5}));
  write_file_atomic(b, trace_of({5, 7}));
  const ExtractReport r = extract_bound_args_files({a, b});
  ASSERT_EQ(r.bound_args.size(), 3u);
  EXPECT_EQ(r.duplicates, 1);
  EXPECT_EQ(r.events, 4);
  EXPECT_TRUE(r.valid_json);
  write_file_atomic(b, trace_of({9}).substr(0, 40));  // truncated: no complete payload
  const ExtractReport t = extract_bound_args_files({a, b});
  EXPECT_EQ(t.bound_args.size(), 2u);
  EXPECT_FALSE(t.valid_json);
}

TEST(Extract, ManyBadPayloadsAreCountedNotAllListed) {
  Json events = Json::array();
  for (int i = 0; i < 250; ++i) events.push_back(event("bad", "tokamax:{\"format\":"));
  const ExtractReport r = extract_bound_args(Json({{"traceEvents", events}}).dump(), "bad.json");
  EXPECT_EQ(r.malformed, 250);
  ASSERT_EQ(r.warnings.size(), 101u);
  EXPECT_EQ(r.warnings.back(), "150 more skipped payloads not listed");
}

TEST(Extract, NotATrace) {
  const ExtractReport bin = extract_bound_args(std::string("\x7f"
                                                           "ELF\x02\x01\x01\0\0",
                                                           9),
                                               "a.out");
  EXPECT_TRUE(bin.bound_args.empty());
  EXPECT_FALSE(bin.valid_json);
  EXPECT_NE(bin.warnings.back().find("does not look like a Chrome trace"), std::string::npos);
  const ExtractReport obj = extract_bound_args(R"({"hello": "world"})", "x.json");
  EXPECT_TRUE(obj.bound_args.empty());
  EXPECT_FALSE(obj.chrome_trace);
  EXPECT_THROW(extract_bound_args("[]", "x", {.op = "no_such_op"}), InvalidArgument);
}

// Extraction streams too: the events are scanned as they are parsed, the other top-level members
// after them; a text that turns out not to be JSON partway is scanned leniently from the start,
// as it was when it was parsed whole (nothing of the events seen before the cut is counted twice).
TEST(Extract, StreamedEventsThenTopLevelMembersAndLenientAfterACut) {
  fake();
  Json events = Json::array();
  for (int n : {3, 5, 3})
    events.push_back(event("fake", payload_for({{"x", ShapeDtype{{n}, DType::kF32}.str()}})));
  const Json doc = {{"a_meta", payload_for({{"x", "f32[7]"}})},
                    {"traceEvents", events},
                    {"z_meta", {{"k", payload_for({{"x", "f32[5]"}})}}}};
  const ExtractReport r = extract_bound_args(doc.dump(), "m.json");
  EXPECT_TRUE(r.valid_json);
  EXPECT_TRUE(r.chrome_trace);
  EXPECT_EQ(r.events, 3);
  ASSERT_EQ(r.bound_args.size(), 3u);  // events first, then the members in name order
  EXPECT_EQ(r.bound_args[0].arguments()["x"], "f32[3]");
  EXPECT_EQ(r.bound_args[1].arguments()["x"], "f32[5]");
  EXPECT_EQ(r.bound_args[2].arguments()["x"], "f32[7]");
  EXPECT_EQ(r.duplicates, 2);
  const std::string text = doc.dump();
  const ExtractReport cut = extract_bound_args(text.substr(0, text.rfind("z_meta")), "cut.json");
  EXPECT_FALSE(cut.valid_json);
  EXPECT_EQ(cut.events, 0);  // not counted: the text is not JSON
  EXPECT_EQ(cut.duplicates, 1);
  ASSERT_EQ(cut.bound_args.size(), 3u);  // in the text's order
  EXPECT_EQ(cut.bound_args[0].arguments()["x"], "f32[7]");
  ASSERT_FALSE(cut.warnings.empty());
  EXPECT_NE(cut.warnings[0].find("malformed JSON in cut.json"), std::string::npos)
      << cut.warnings[0];
}

// ---------------------------------------------------------------------------------------------
// The round trip on the real op: trace, extract, tune (small budget), apply, trace again.

// Few, short samples: these tests check what is tuned, not how well.
AutotuneOptions quick_tuning() {
  AutotuneOptions o;
  o.rounds.first_rounds = 1;
  o.rounds.max_rounds = 2;
  // The fake op's configs differ by large factors: two rounds decide them in a quick test.
  o.rounds.min_confident_rounds = 2;
  o.sample_min_ms = 0.2;
  return o;
}

TEST(OfflineTuning, RoundTripShowsScopeRung) {
  ScopedCacheDir cache("trace_round_trip");
  const Tensor x = Tensor::randn({24, 40}, DType::kF32, 1);
  const Tensor w1 = Tensor::randn({3, 40, 24}, DType::kF32, 2);
  const Tensor w2 = Tensor::randn({3, 24, 16}, DType::kF32, 3);
  const std::vector<int32_t> sizes = {10, 0, 14};
  auto model = [&] {
    const Tensor h = ragged_dot(x, w1, sizes, {.activation = Activation::kRelu});
    return ragged_dot(h, w2, sizes);
  };
  const TempPath t1("rt1.json"), t2("rt2.json");
  {
    TraceSession s(t1);
    model();
    model();
  }
  const ExtractReport r = extract_bound_args_file(t1);
  ASSERT_EQ(r.bound_args.size(), 2u) << r.summary();
  EXPECT_EQ(r.duplicates, 2);
  // Through the file format the CLI uses.
  const auto list = BoundArguments::loads_list(BoundArguments::dumps_list(r.bound_args));

  AutotuneOptions o = quick_tuning();
  o.max_candidates = 4;
  o.budget_s = 60;
  const AutotuningResult tuned = Autotuner(o).tune_all(list);
  ASSERT_EQ(tuned.data().size(), 2u);
  const AutotuningResult loaded = AutotuningResult::loads(tuned.dumps());
  {
    AutotuningScope scope(loaded);
    TraceSession s(t2);
    const Tensor y = model();
    const Tensor ref = [&] {
      const Tensor h = ragged_dot(x, w1, sizes,
                                  {.activation = Activation::kRelu, .implementation = "reference"});
      return ragged_dot(h, w2, sizes, {.implementation = "reference"});
    }();
    for (int64_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y.get(i), ref.get(i), 1e-3);
  }
  const auto events = op_events(t2);
  int tuned_calls = 0;
  for (const Json& e : events) {
    if (e["name"] != "ragged_dot/native") continue;
    const Json p = payloads_of(e).back();
    EXPECT_EQ(p["op"]["rung"], "scope");
    const BoundArguments b = BoundArguments::from_json(p);
    const AutotuningData* d = loaded.find(b);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(p["op"]["config"], d->fastest().config.json());
    ++tuned_calls;
  }
  EXPECT_EQ(tuned_calls, 2);
}

TEST(OfflineTuning, CaptureSkipsKeysAlreadyTunedUnlessAskedNot) {
  ScopedCacheDir cache("trace_capture");
  const AutotuneOptions o = quick_tuning();
  auto fn = [] {
    auto a = testing::fake_call(32);
    dispatch(fake(), *a, {});
    dispatch(fake(), *a, {});  // same key: tuned once
    auto b = outer().make_call(outer().bind_json({{"x", "f32[16]"}}, ""), 1);
    dispatch(outer(), *b, {});  // composite (nothing to tune) calls fake on f32[16]
  };
  const AutotuningResult first = autotune(fn, o);
  ASSERT_EQ(first.data().size(), 2u);  // fake f32[32] and the nested fake f32[16]
  for (const auto& [b, d] : first.data()) {
    EXPECT_EQ(b.family(), "fake");
    EXPECT_EQ(d.fastest().config.get<testing::TileConfig>().tile, 3);
  }
  {
    AutotuningScope scope(first);
    EXPECT_TRUE(autotune(fn, o).data().empty());
    AutotuneOptions again = o;
    again.ignore_cache = true;
    // Ignoring the cache also measures the composite (null config).
    EXPECT_EQ(autotune(fn, again).data().size(), 3u);
  }
}

TEST(OfflineTuning, AllImplementationsLeavesOutTheTunedOnes) {
  ScopedCacheDir cache("trace_capture_all_impls");
  AutotuneOptions o = quick_tuning();
  o.candidate_timeout_s = 0.02;  // the fake family's broken implementations fail fast
  auto fn = [] {
    auto a = testing::fake_call(32);
    dispatch(fake(), *a, {});
  };
  const AutotuningResult first = autotune(fn, o);
  ASSERT_EQ(first.data().size(), 1u);
  EXPECT_EQ(first.data()[0].first.implementation(), "one_field");
  AutotuningScope scope(first);
  o.all_implementations = true;
  const AutotuningResult rest = autotune(fn, o);
  EXPECT_FALSE(rest.data().empty());
  for (const auto& [b, d] : rest.data()) EXPECT_NE(b.implementation(), "one_field");
}

TEST(OfflineTuning, CaptureOnThreadsTheFunctionStarts) {
  ScopedCacheDir cache("trace_capture_threads");
  AutotuneOptions o = quick_tuning();
  auto fn = [] {
    std::vector<std::thread> ts;
    for (int n : {12, 13}) {
      ts.emplace_back([n] {
        auto c = testing::fake_call(n);
        dispatch(fake(), *c, {});
      });
    }
    for (auto& t : ts) t.join();
  };
  EXPECT_TRUE(autotune(fn, o).data().empty());  // the calling thread made no call
  EXPECT_FALSE(calls_observed());
  o.capture_all_threads = true;
  const AutotuningResult r = autotune(fn, o);
  EXPECT_FALSE(calls_observed());  // the recorder is gone: back to the one-load path
  std::set<std::string> keys;
  for (const auto& [b, d] : r.data()) keys.insert(b.arguments()["x"].get<std::string>());
  EXPECT_EQ(keys, (std::set<std::string>{"f32[12]", "f32[13]"}));
}

}  // namespace
}  // namespace tokamax
