// Concurrency (issue 15, item 7): processes merging into one cache file through the command's
// --into-cache, and threads calling ops while others apply scopes, reload the disk cache and
// write to it. Nothing lost, no torn file, every call's result right. CI runs these under
// ThreadSanitizer (label `threads`, the `tsan` preset: `make tsan`).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/op/fake_ops.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

namespace fs = std::filesystem;

TEST(Concurrency, ProcessesMergingIntoOneCacheFileLoseNothing) {
  testing::ScopedCacheDir cache("conc_cli");
  const std::string dir = cache.path().string();
  // Four commands at once, four keys (spec x thread count) of one op and implementation: one
  // file, merged under its lock by each.
  std::string cmd;
  const std::vector<std::string> runs = {
      "--spec smoke_decode --threads 1", "--spec smoke_decode --threads 2",
      "--spec smoke_f32 --threads 1", "--spec smoke_f32 --threads 2"};
  for (const std::string& r : runs) {
    cmd += std::string(TOKAMAX_CLI) + " autotune --op ragged_dot " + r +
           " --impl native --budget-s 5 --into-cache --cache-dir " + dir + " >/dev/null 2>&1 & ";
  }
  cmd += "fail=0; for p in $(jobs -p); do wait $p || fail=1; done; exit $fail";
  const int status = std::system(("bash -c '" + cmd + "'").c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string file = cache_file_path(dir, device_kind(), "ragged_dot", "native");
  const CacheFile f = CacheFile::from_json(read_json_file(file), file);  // not torn
  EXPECT_EQ(f.entries.size(), runs.size());
  for (const auto& e : fs::directory_iterator(fs::path(file).parent_path())) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "left behind: " << name;
    EXPECT_EQ(name.find(".corrupt-"), std::string::npos) << "moved aside: " << name;
  }
}

TEST(Concurrency, CallsWhileScopesAndCachesChange) {
  testing::ScopedCacheDir cache("conc_threads");
  const Tensor x = Tensor::randn({24, 32}, DType::kF32, 1);
  const Tensor w = Tensor::randn({3, 32, 40}, DType::kF32, 2);
  const std::vector<int32_t> sizes = {8, 0, 16};
  RaggedDotOptions ref_options;
  ref_options.implementation = "reference";
  const Tensor want = ragged_dot(x, w, sizes, ref_options);
  RaggedDotOptions native;
  native.implementation = "native";
  // A result for this key: another valid config than the heuristics'.
  const OpFamily& fam = find_family("ragged_dot");
  const auto impl = fam.implementation("native");
  BoundArguments bound;
  {
    CallRecorder rec;
    ragged_dot(x, w, sizes, native);
    ASSERT_EQ(rec.calls().size(), 1u);
    bound = rec.calls()[0];
  }
  AutotuningData d;
  d.set(impl->config_from_json({{"mr", 2}, {"mc", 4}, {"kc", 8}, {"nc", 64}}),
        BenchmarkData{.median_ms = 1});
  AutotuningResult result;
  result.add(bound, d);
  std::atomic<bool> stop{false};
  std::atomic<int> calls{0}, wrong{0}, errors{0};
  auto check = [&](const Tensor& y) {
    for (int64_t i = 0; i < y.size(); ++i) {
      const double a = y.data_as<float>()[i], b = want.data_as<float>()[i];
      if (std::abs(a - b) > 1e-3 * (1 + std::abs(b))) {
        ++wrong;
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {  // callers, some inside scopes of their own
    threads.emplace_back([&, t] {
      while (!stop) {
        try {
          if (t == 0) {
            const AutotuningScope scope(result);
            check(ragged_dot(x, w, sizes, native));
          } else {
            check(ragged_dot(x, w, sizes, native));
          }
          ++calls;
        } catch (const std::exception&) {
          ++errors;
        }
      }
    });
  }
  threads.emplace_back([&] {  // the disk cache written and reloaded
    int n = 0;
    while (!stop) {
      result.dump_cache();
      if (++n % 2 == 0) DiskCache::global().clear();
    }
  });
  threads.emplace_back([&] {  // scopes loaded and dropped on another thread
    while (!stop) {
      const AutotuningResult loaded = AutotuningResult::loads(result.dumps());
      const AutotuningScope scope(loaded);
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GT(calls.load(), 10);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(errors.load(), 0);
  const std::string file =
      cache_file_path(cache.path().string(), device_kind(), "ragged_dot", "native");
  EXPECT_EQ(CacheFile::from_json(read_json_file(file), file).entries.size(), 1u);
}

// A scope destroyed on another thread than the one that made it (a Python generator resumed
// elsewhere exits its `with` there): it leaves the making thread's stack, and neither thread's
// later calls crash (the destructor resized the destroying thread's stack, to a depth from the
// other: null scopes that the next call read).
TEST(Concurrency, ScopeDestroyedOnAnotherThread) {
  const Tensor x = Tensor::randn({8, 16}, DType::kF32, 1);
  const Tensor w = Tensor::randn({2, 16, 24}, DType::kF32, 2);
  const std::vector<int32_t> sizes = {5, 3};
  RaggedDotOptions native;
  native.implementation = "native";
  BoundArguments bound;
  {
    CallRecorder rec;
    ragged_dot(x, w, sizes, native);
    bound = rec.calls()[0];
  }
  AutotuningData d;
  d.set(find_family("ragged_dot")
            .implementation("native")
            ->config_from_json({{"mr", 2}, {"mc", 4}, {"kc", 8}, {"nc", 64}}),
        BenchmarkData{.median_ms = 1});
  AutotuningResult result;
  result.add(bound, d);
  const OpFamily& fam = find_family("ragged_dot");
  const auto call = fam.make_call(bound, 1);
  const auto in_scope = [&] {
    return resolve_config(fam, *fam.implementation("native"), *call, std::nullopt).rung ==
           Rung::kScope;
  };
  std::unique_ptr<AutotuningScope> outer, inner;
  std::thread maker([&] {
    outer = std::make_unique<AutotuningScope>(result);
    inner = std::make_unique<AutotuningScope>(result);
  });
  maker.join();
  // Destroyed here, on the main thread, which has scopes of its own.
  {
    const AutotuningScope mine(result);
    EXPECT_TRUE(in_scope());
    inner.reset();
    outer.reset();
    EXPECT_TRUE(in_scope());  // this thread's own scope is still there
    EXPECT_NO_THROW(ragged_dot(x, w, sizes, native));
  }
  EXPECT_FALSE(in_scope());
  EXPECT_NO_THROW(ragged_dot(x, w, sizes, native));
  // And the other way: made here, destroyed on a thread with none.
  auto here = std::make_unique<AutotuningScope>(result);
  EXPECT_TRUE(in_scope());
  std::thread([&] { here.reset(); }).join();
  EXPECT_FALSE(in_scope());
  EXPECT_NO_THROW(ragged_dot(x, w, sizes, native));
}

}  // namespace
}  // namespace tokamax
