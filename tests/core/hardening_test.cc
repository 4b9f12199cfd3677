// Bad and hostile input from outside (issue 15): each test is a defect found by trying the
// library as a new user would, kept from coming back. Limits: tokamax/core/limits.h.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/thread_pool.h"
#include "tests/expect_error.h"
#include "tests/op/fake_ops.h"
#include "tests/sanitizers.h"
#include "tokamax/core/limits.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

using testing::expect_invalid_argument;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : dir_(fs::temp_directory_path() / ("tokamax_hard_" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~TempDir() { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  fs::path dir_;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// ---------------------------------------------------------------------------------------------
// JSON and files.

// A result file of one ragged_dot key with one config, whose benchmark entry holds `fields`.
std::string result_file_with(const std::string& fields) {
  return "{\"device_kind\": \"x\", \"tokamax_version\": \"0.1.0\", \"data\": [[{\"op\": "
         "{\"family\": \"ragged_dot\", \"implementation\": \"native\"}, \"arguments\": "
         "{\"lhs\": \"f32[8,64]\", \"rhs\": \"f32[2,64,64]\", \"group_sizes\": [5, 3], "
         "\"num_threads\": 2}}, {\"{\\\"kc\\\":64,\\\"mc\\\":6,\\\"mr\\\":6,\\\"nc\\\":64}\": "
         "{" +
         fields + "}}]]}";
}

TEST(Hardening, ResultFileIntegerFieldsTakeIntegersInRangeOnly) {
  // Found by fuzz_result_file: scratch_bytes 1e42 was cast to int64_t (undefined; UBSan's
  // float-cast-overflow).
  auto result = [](const std::string& scratch) {
    return result_file_with("\"median_ms\": 0.01, \"scratch_bytes\": " + scratch +
                            ", \"cold_cache\": false, \"finalist\": true, \"heuristics\": true");
  };
  EXPECT_NO_THROW(AutotuningResult::loads(result("1024")));
  expect_invalid_argument([&] { AutotuningResult::loads(result("1.025e42")); },
                          "field 'scratch_bytes' is 1.025e+42, expected an integer in [");
  expect_invalid_argument([&] { AutotuningResult::loads(result("-1e30")); },
                          "field 'scratch_bytes' is -1e+30");
}

// Found by fuzz_cache_file: a list of integers (sample_rounds) holding 2e124 was cast to int
// element by element (UBSan's float-cast-overflow inside nlohmann's array conversion).
TEST(Hardening, IntegerListFieldsTakeIntegersInRangeOnly) {
  auto result = [](const std::string& rounds) {
    return result_file_with(
        "\"median_ms\": 0.01, \"evaluation_times_ms\": [0.01], \"sample_rounds\": " + rounds +
        ", \"ratios\": [1.0], \"ratio\": 1.0, \"ratio_ci\": [1.0, 1.0], \"rounds\": 1, "
        "\"stage\": 1");
  };
  expect_invalid_argument([&] { AutotuningResult::loads(result("[2e124]")); },
                          "field 'sample_rounds' element 0 is 2e+124, expected an integer in [");
  expect_invalid_argument([&] { AutotuningResult::loads(result("[1.5]")); },
                          "field 'sample_rounds' element 0 is 1.5");
  try {
    AutotuningResult::loads(result("[0]"));
  } catch (const InvalidArgument& e) {
    // Whatever else the minimal entry lacks, its sample_rounds are read.
    EXPECT_EQ(std::string(e.what()).find("sample_rounds"), std::string::npos) << e.what();
  }
}

TEST(Hardening, DeepJsonIsRefusedBeforeParsing) {
  // 100,000 levels crashed `cache verify`, `trace extract`, --bound-args (SIGSEGV).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_invalid_argument([&] { parse_json(deep, "'deep.json'"); },
                          "'deep.json' nests deeper than 256 levels at byte 257");
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_NO_THROW(parse_json(ok, "ok"));
  // Brackets inside strings do not count.
  EXPECT_NO_THROW(parse_json("[\"" + std::string(1000, '[') + "\"]", "strings"));
  EXPECT_THROW(AutotuningResult::loads(deep), InvalidArgument);
  EXPECT_THROW(BoundArguments::loads_list(deep, "deep"), InvalidArgument);
  EXPECT_NO_THROW(extract_bound_args(deep, "deep.json"));  // reported, not fatal
  // Found by fuzz_json: a number beyond double's range escaped as nlohmann's out_of_range.
  expect_invalid_argument([&] { parse_json("[1e400]", "'big.json'"); },
                          "unreadable JSON in 'big.json': [json.exception.out_of_range.406]");
}

TEST(Hardening, ReadFileRefusesDirectoriesAndHugeFiles) {
  TempDir t;
  fs::create_directories(t.path("adir"));
  // A directory was read as empty and reported as "malformed JSON".
  expect_invalid_argument([&] { read_json_file(t.path("adir")); }, "is a directory");
  // A sparse file one byte over the limit: refused from its size, nothing read.
  const std::string big = t.path("big.json");
  const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kMaxInputFileBytes + 1), 0);
  ::close(fd);
  const auto start = std::chrono::steady_clock::now();
  expect_invalid_argument([&] { read_file(big); }, "kMaxInputFileBytes");
  EXPECT_LT(seconds_since(start), 1.0);
}

TEST(Hardening, GzipTraceIsBoundedByItsDecompressedSize) {
  // A few MB of gzip expanded to gigabytes in memory.
  TempDir t;
  const std::string path = t.path("bomb.json.gz");
  gzFile gz = gzopen(path.c_str(), "wb1");
  ASSERT_NE(gz, nullptr);
  const std::string zeros(1 << 20, ' ');
  for (int64_t done = 0; done <= kMaxInputFileBytes; done += static_cast<int64_t>(zeros.size()))
    ASSERT_EQ(gzwrite(gz, zeros.data(), static_cast<unsigned>(zeros.size())),
              static_cast<int>(zeros.size()));
  gzclose(gz);
  ASSERT_LT(fs::file_size(path), kMaxInputFileBytes / 100);
  expect_invalid_argument([&] { read_trace_file(path); }, "gzip text is larger than");
}

// ---------------------------------------------------------------------------------------------
// Payload scanning.

TEST(Hardening, PayloadScanIsLinear) {
  // Repeated "tokamax:{" took 5.9 s at 360 KB (every marker scanned to the end).
  std::string s;
  while (s.size() < 4 * 360 * 1024) s += "tokamax:{";
  auto start = std::chrono::steady_clock::now();
  const auto spans = find_payloads(s);
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_EQ(spans.size(), s.size() / 9);
  for (const PayloadSpan& p : spans) EXPECT_FALSE(p.error.empty());
  // Markers inside the strings of an unbalanced payload, each opening a string of its own.
  std::string q;
  while (q.size() < 4 * 360 * 1024) q += "tokamax:{\"tokamax:{\\\"";
  start = std::chrono::steady_clock::now();
  const auto qspans = find_payloads(q);
  EXPECT_LT(seconds_since(start), 1.0);
  EXPECT_FALSE(qspans.empty());
  // A complete payload after unbalanced ones is still found.
  const std::string tail = R"({"b":2})";
  const auto last = find_payloads(s + " tokamax:" + tail);
  ASSERT_FALSE(last.empty());
  EXPECT_TRUE(last.back().error.empty()) << last.back().error;
}

// ---------------------------------------------------------------------------------------------
// Sizes from files.

Json ragged_args(const Json& group_sizes) {
  return {{"lhs", "f32[8,64]"}, {"rhs", "f32[2,64,64]"}, {"group_sizes", group_sizes}};
}

TEST(Hardening, GroupSizesFromFilesAreChecked) {
  const OpFamily& f = find_family("ragged_dot");
  // 2^32 + 1 wrapped to 1: another key.
  expect_invalid_argument(
      [&] {
        f.bind_json(ragged_args({int64_t{4294967297}, 3}), "");
      },
      "group size #0 = 4294967297; expected an integer in [0, 2147483647]");
  expect_invalid_argument([&] { f.bind_json(ragged_args({-1, 3}), ""); }, "expected >= 0");
  // total_size was spread over the groups before the sum was checked: 2 GB for 250M rows.
  const auto start = std::chrono::steady_clock::now();
  expect_invalid_argument(
      [&] {
        f.bind_json(ragged_args({{"num_groups", 2}, {"total_size", 250000000}}), "");
      },
      "total_size = 250000000 exceeds the 8 rows of lhs");
  EXPECT_LT(seconds_since(start), 0.5);
  expect_invalid_argument(
      [&] {
        f.bind_json(ragged_args({{"num_groups", 2}, {"total_size", int64_t{1} << 40}}), "");
      },
      "total_size = 1099511627776; expected at most 2147483647");
  expect_invalid_argument(
      [&] {
        f.bind_json(ragged_args({{"num_groups", int64_t{1} << 30}, {"total_size", 8}}), "");
      },
      "num_groups = 1073741824; expected at most 1048576");
  EXPECT_NO_THROW(f.bind_json(ragged_args({{"num_groups", 2}, {"total_size", 8}}), ""));
}

TEST(Hardening, TensorSpecsFromFilesAreBounded) {
  const OpFamily& f = find_family("ragged_dot");
  Json a = ragged_args({1, 3});
  a["lhs"] = "f32[1000000000,1000000000]";
  expect_invalid_argument([&] { f.bind_json(a, ""); }, "expected at most 16 and 68719476736");
  std::string rank17 = "f32[1";
  for (int i = 1; i < 17; ++i) rank17 += ",1";
  a["lhs"] = rank17 + "]";
  expect_invalid_argument([&] { f.bind_json(a, ""); }, "has 17 dimensions");
}

TEST(Hardening, ConfigFieldsOutOfRangeAreRefused) {
  const auto impl = find_family("ragged_dot").implementation("native");
  expect_invalid_argument(
      [&] {
        impl->config_from_json({{"mr", 4}, {"mc", 8}, {"kc", 2000000000}, {"nc", 2147483616}});
      },
      "field 'kc' = 2000000000; expected an integer in [1, 65536]");
  // 2^32 + 8 would have been read as 8.
  expect_invalid_argument(
      [&] {
        impl->config_from_json({{"mr", 4}, {"mc", 8}, {"kc", 4294967304}, {"nc", 64}});
      },
      "expected an integer in [1, 65536]");
  expect_invalid_argument(
      [&] {
        impl->config_from_json({{"mr", 4}, {"mc", 8}, {"kc", 0}, {"nc", 64}});
      },
      "expected an integer in [1, 65536]");
  // In range one by one, but their blocks would need gigabytes of scratch.
  expect_invalid_argument(
      [&] {
        impl->config_from_json({{"mr", 4}, {"mc", 65532}, {"kc", 8192}, {"nc", 64}});
      },
      "mc * kc and kc * nc at most");
}

TEST(Hardening, OutOfRangeCachedConfigFallsThroughToHeuristics) {
  testing::ScopedCacheDir cache("hard_cfg");
  const Tensor x = Tensor::randn({8, 64}, DType::kF32, 1);
  const Tensor w = Tensor::randn({2, 64, 64}, DType::kF32, 2);
  const std::vector<int32_t> sizes = {3, 5};
  const OpFamily& fam = find_family("ragged_dot");
  const auto impl = fam.implementation("native");
  const BoundArguments b = fam.bind_json({{"lhs", "f32[8,64]"},
                                          {"rhs", "f32[2,64,64]"},
                                          {"group_sizes", {{"num_groups", 2}, {"total_size", 8}}},
                                          {"num_threads", num_threads()}},
                                         "native");
  CacheFile f;
  f.family = "ragged_dot";
  f.implementation = "native";
  f.implementation_version = impl->version();
  f.device_kind = device_kind();
  f.entries[b.key()] = {{R"({"kc":2000000000,"mc":8,"mr":4,"nc":2147483616})",
                         BenchmarkData{.median_ms = 1}.to_json()}};
  write_file_atomic(cache_file_path(cache.path().string(), device_kind(), "ragged_dot", "native"),
                    f.to_json().dump());
  DiskCache::global().clear();
  // The call succeeds on the heuristics config (it failed with bad_alloc).
  RaggedDotOptions o;
  o.implementation = "native";
  const Tensor y = ragged_dot(x, w, sizes, o);
  EXPECT_EQ(y.shape(), (Shape{8, 64}));
}

// ---------------------------------------------------------------------------------------------
// Null data pointers.

TEST(Hardening, NullDataPointersAreInvalidArguments) {
  const Tensor x = Tensor::randn({8, 64}, DType::kF32, 1);
  const Tensor w = Tensor::randn({2, 64, 64}, DType::kF32, 2);
  const std::vector<int32_t> sizes = {3, 5};
  const TensorView null_x(nullptr, DType::kF32, {8, 64});
  const TensorView null_w(nullptr, DType::kF32, {2, 64, 64});
  expect_invalid_argument([&] { ragged_dot(null_x, w, sizes); }, "'lhs' f32[8,64] has a null");
  expect_invalid_argument([&] { ragged_dot(x, null_w, sizes); }, "'rhs' f32[2,64,64] has a null");
  expect_invalid_argument([&] { ragged_dot(x, w, TensorView(nullptr, DType::kI32, {2})); },
                          "group_sizes i32[2] has a null data pointer");
  expect_invalid_argument([&] { pack_rhs(null_w); }, "pack_rhs: rhs f32[2,64,64] has a null");
  const Tensor dout = Tensor::randn({8, 64}, DType::kF32, 3);
  expect_invalid_argument(
      [&] {
        ragged_dot_vjp(x, w, sizes, TensorView(nullptr, DType::kF32, {8, 64}));
      },
      "dout f32[8,64] has a null");
  // Pre-packed weights leave the logical rhs without data: that is not a null pointer.
  EXPECT_NO_THROW(ragged_dot(x, pack_rhs(w), sizes));
  // Empty arrays need no data.
  EXPECT_NO_THROW(
      ragged_dot(TensorView(nullptr, DType::kF32, {0, 64}), w, std::vector<int32_t>{0, 0}));
  const Tensor gw = Tensor::randn({64, 2, 32}, DType::kF32, 4);
  expect_invalid_argument([&] { gated_linear_unit(null_x, gw); }, "has a null data pointer");
  expect_invalid_argument(
      [&] {
        pack_glu_weights(TensorView(nullptr, DType::kF32, {64, 2, 32}));
      },
      "pack_glu_weights: w f32[64,2,32] has a null");
  EXPECT_NO_THROW(gated_linear_unit(x, pack_glu_weights(gw)));
}

// ---------------------------------------------------------------------------------------------
// Threads.

TEST(Hardening, ThreadPoolThatCannotStartItsThreadsThrows) {
  // Under an address-space limit the 1000th thread cannot get its stack. The pool's
  // constructor hung (its unwinding waited for workers that were never told to stop). In a
  // child process, so the limit stays there; alarm() turns a hang into a failure.
  if (testing::kUnderSanitizer) GTEST_SKIP() << "an address-space limit under a sanitizer";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    rlimit lim{};
    getrlimit(RLIMIT_AS, &lim);
    lim.rlim_cur = rlim_t{2} << 30;  // 2 GiB: 8 MiB stacks run out after ~250 threads
    setrlimit(RLIMIT_AS, &lim);
    try {
      ThreadPool pool(1000);
      _exit(3);  // all started: the limit did not bite (not a failure of the pool)
    } catch (const Error& e) {
      _exit(std::string(e.what()).find("of 1000") != std::string::npos ? 0 : 4);
    } catch (...) {
      _exit(5);
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << " (a hang?)";
  EXPECT_TRUE(WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3) << WEXITSTATUS(status);
}

// ---------------------------------------------------------------------------------------------
// Files written.

TEST(Hardening, TraceTemporaryFileDoesNotFollowPlantedLinks) {
  TempDir t;
  const std::string victim = t.path("victim.txt");
  std::ofstream(victim) << "precious";
  const std::string trace = t.path("trace.json");
  // The names the writer used to pick: <path>.tmp.<pid>.<counter>.
  for (int i = 0; i < 8; ++i) {
    fs::create_symlink(victim,
                       trace + ".tmp." + std::to_string(getpid()) + "." + std::to_string(i));
  }
  {
    TraceSession s(trace);
    ragged_dot(Tensor::randn({4, 8}, DType::kF32, 1), Tensor::randn({1, 8, 8}, DType::kF32, 2),
               std::vector<int32_t>{4});
  }
  std::ifstream in(victim);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious");
  EXPECT_NO_THROW(read_json_file(trace));
}

TEST(Hardening, TempFilesAreCreatedExclusively) {
  TempDir t;
  std::string a, b;
  const int fa = create_temp_file(t.path("x.json"), &a),
            fb = create_temp_file(t.path("x.json"), &b);
  ::close(fa);
  ::close(fb);
  EXPECT_NE(a, b);
  EXPECT_EQ(fs::path(a).parent_path(), fs::path(t.path("x.json")).parent_path());
  expect_invalid_argument([&] { check_writable(t.path("")); }, "is a directory");
  expect_invalid_argument([&] { check_writable("/proc/no/such/dir/x.json"); },
                          "cannot create the directory of '/proc/no/such/dir/x.json'");
  EXPECT_NO_THROW(check_writable(t.path("sub/out.json")));
}

TEST(Hardening, DeviceKindFromAFileCannotLeaveTheCacheDirectory) {
  TempDir t;
  const std::string text = R"({"device_kind": "../../escaped", "data": []})";
  const AutotuningResult r = AutotuningResult::loads(text);
  AutotuningResult with_data("../../escaped");
  const OpFamily& fam = find_family("ragged_dot");
  AutotuningData d;
  d.set(fam.implementation("native")->config_from_json(
            {{"mr", 4}, {"mc", 8}, {"kc", 64}, {"nc", 64}}),
        BenchmarkData{.median_ms = 1});
  with_data.add(fam.bind_json(ragged_args({3, 5}), "native"), d);
  expect_invalid_argument([&] { with_data.dump_cache(t.path("cache")); },
                          "device kind '../../escaped' cannot name a cache file");
  EXPECT_FALSE(fs::exists(t.path("escaped")));
  EXPECT_TRUE(r.data().empty());
  expect_invalid_argument([&] { cache_file_path("/c", "x", "..", "native"); }, "op '..'");
}

// A cache directory that cannot be made was a raw std::filesystem error from dump_cache; it is
// bad input naming the directory.
TEST(Hardening, CacheDirectoryThatCannotBeMadeIsNamed) {
  AutotuningResult r(device_kind());
  const OpFamily& fam = find_family("ragged_dot");
  AutotuningData d;
  d.set(fam.implementation("native")->config_from_json(
            {{"mr", 4}, {"mc", 8}, {"kc", 64}, {"nc", 64}}),
        BenchmarkData{.median_ms = 1});
  r.add(fam.bind_json(ragged_args({3, 5}), "native"), d);
  expect_invalid_argument([&] { r.dump_cache("/proc/no/such/cache"); },
                          "cannot create the cache directory '/proc/no/such/cache/");
}

TEST(Hardening, CorruptCacheFileIsMovedAsideBeforeBeingReplaced) {
  testing::ScopedCacheDir cache("hard_aside");
  const OpFamily& fam = find_family("ragged_dot");
  const auto impl = fam.implementation("native");
  const std::string path =
      cache_file_path(cache.path().string(), device_kind(), "ragged_dot", "native");
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "{\"schema_version\": 1, \"entries\": {\"hand edited";
  AutotuningData d;
  d.set(impl->config_from_json({{"mr", 4}, {"mc", 8}, {"kc", 64}, {"nc", 64}}),
        BenchmarkData{.median_ms = 1});
  merge_into_cache_file(path, "ragged_dot", *impl, device_kind(),
                        {{fam.bind_json(ragged_args({3, 5}), "").key(), d}});
  int aside = 0;
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ragged_dot_native.json.corrupt-", 0) != 0) continue;
    ++aside;
    std::ifstream in(e.path());
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(content, "{\"schema_version\": 1, \"entries\": {\"hand edited");
  }
  EXPECT_EQ(aside, 1);
  EXPECT_EQ(CacheFile::from_json(read_json_file(path), path).entries.size(), 1u);
}

}  // namespace
}  // namespace tokamax
