// DeviceInfo sanity, the roofline, and the CLI's device command.
#include "tokamax/core/device.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/thread_pool.h"
#include "tokamax/autotuning/roofline.h"
#include "tokamax/core/blas.h"
#include "tokamax/core/error.h"
#include "tokamax/core/json.h"

namespace tokamax {
namespace {

std::string run(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *rc = pclose(p);
  return out;
}

TEST(Device, Sane) {
  const DeviceInfo& d = device_info();
  EXPECT_FALSE(device_kind().empty());
  for (char c : device_kind())
    EXPECT_TRUE(std::islower(static_cast<unsigned char>(c)) || std::isdigit(c) || c == '_');
  EXPECT_GT(d.threads_available, 0);
  EXPECT_GT(d.physical_cores, 0);
  EXPECT_GT(d.l1d_bytes, 0);
  if (d.isa.avx512f) {
    EXPECT_TRUE(d.isa.avx2);
  }
  if (d.isa.avx2) {
    EXPECT_TRUE(d.isa.avx);
  }
  if (d.isa.avx512_bf16) {
    EXPECT_TRUE(d.isa.avx512f);
  }
  EXPECT_TRUE(d.to_json().contains("isa"));
}

TEST(Device, RooflinePositiveFinite) {
  const Roofline r = cached_roofline();
  if (!device_info().isa.has_avx2_fma()) GTEST_SKIP() << "roofline loops need AVX2";
  for (double v : {r.f32_gflops_1core, r.f32_gflops_all, r.read_gbps_1core, r.read_gbps_all,
                   r.copy_gbps_all}) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(v, 0);
  }
  // The hand-off latency: 0 with one thread, or where the two shares could not run at once
  // (a loaded machine: each gives up after a second), else a positive time well under the
  // second the shares may wait.
  EXPECT_TRUE(std::isfinite(r.core_to_core_ns));
  EXPECT_GE(r.core_to_core_ns, 0);
  EXPECT_LT(r.core_to_core_ns, 1e9);
  if (r.threads < 2) {
    EXPECT_EQ(r.core_to_core_ns, 0);
  }
  EXPECT_EQ(r.to_json().value("core_to_core_ns", -1.0), r.core_to_core_ns);
  // The bf16 dot's ceiling is measured wherever the CPU has it, but is not always above the f32
  // FMA's: Zen 4 runs vdpbf16ps at twice the f32 FMA's flops, Sapphire/Emerald Rapids at half.
  if (device_info().isa.has_avx512_bf16()) {
    EXPECT_TRUE(std::isfinite(r.bf16_gflops_1core));
    EXPECT_GT(r.bf16_gflops_1core, 0.25 * r.f32_gflops_1core);
  }
}

// A fake measurement of a busy machine: all threads' FMA rate barely above one core's is
// flagged (SMT siblings excepted: one core's units), and so is a ceiling far from the one the
// machine reached when quiet; a busy measurement is not remembered as this machine's.
TEST(Device, BusyMachineIsFlagged) {
  Roofline quiet;
  quiet.threads = 2;
  quiet.f32_gflops_1core = 117;
  quiet.f32_gflops_all = 233;
  quiet.read_gbps_all = 60;
  quiet.copy_gbps_all = 80;
  Roofline busy = quiet;
  busy.f32_gflops_all = 110;  // below the one-core rate: the second core was taken
  check_core_scaling(quiet, 2);
  EXPECT_FALSE(quiet.busy());
  check_core_scaling(busy, 2);
  ASSERT_EQ(busy.warnings.size(), 1u);
  EXPECT_NE(busy.warnings[0].find("busy machine"), std::string::npos) << busy.warnings[0];
  Roofline smt = busy;
  smt.warnings.clear();
  check_core_scaling(smt, 1);  // two threads on one core: nothing to expect
  EXPECT_FALSE(smt.busy());
  // Round trip through the file form.
  const Roofline back = Roofline::from_json(busy.to_json(), "test");
  EXPECT_EQ(back.f32_gflops_all, 110);
  EXPECT_EQ(back.warnings, busy.warnings);
  EXPECT_TRUE(busy.to_json()["busy"].get<bool>());
  EXPECT_THROW(Roofline::from_json(Json{{"threads", 2}}, "test"), InvalidArgument);

  const std::string dir =
      std::filesystem::temp_directory_path() / ("tokamax_ceilings_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  setenv("TOKAMAX_CACHE_DIR", dir.c_str(), 1);
  setenv("TOKAMAX_DATA_DIR", (dir + "/shipped").c_str(), 1);  // no shipped ceilings either
  EXPECT_TRUE(compare_with_known_ceilings(busy).empty());  // nothing known yet
  remember_ceilings(busy);
  EXPECT_FALSE(std::filesystem::exists(known_ceilings_path(dir)));
  remember_ceilings(quiet);
  ASSERT_TRUE(std::filesystem::exists(known_ceilings_path(dir)));
  Roofline now = quiet;
  EXPECT_TRUE(compare_with_known_ceilings(now).empty());
  now.f32_gflops_all = 114;  // every percentage of it would double
  const std::vector<std::string> w = compare_with_known_ceilings(now);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("f32 FMA"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("last quiet"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("the percentages use 114.0"), std::string::npos) << w[0];
  unsetenv("TOKAMAX_CACHE_DIR");
  unsetenv("TOKAMAX_DATA_DIR");
  std::filesystem::remove_all(dir);
}

TEST(Device, ReadProbeStreamsItsBuffer) {
  // A one-thread probe first, then one on every thread of the pool: the second takes the
  // first's buffer where it is large enough (one L3 for every CPU: four of it in all), else
  // one of its own (four L3s a thread), while the first stays alive; ASan (`make asan`) checks
  // that every pass of both stays in its buffer.
  const ReadProbe one(1);
  const ReadProbe probe(ThreadPool::global().size());
  if (!device_info().isa.has_avx2_fma()) {
    EXPECT_FALSE(probe.available());
    GTEST_SKIP() << "read loop needs AVX2";
  }
  ASSERT_TRUE(one.available());
  ASSERT_TRUE(probe.available());
  EXPECT_EQ(probe.threads(), ThreadPool::global().size());
  // At least four times the last-level cache a pass, so no pass is served from the cache, and
  // at least 64 MiB a thread.
  const double l3 = static_cast<double>(device_info().l3_bytes);
  for (const ReadProbe* p : {&one, &probe}) {
    EXPECT_GE(p->bytes_per_pass(), 4.0 * l3);
    EXPECT_GE(p->bytes_per_pass(), p->threads() * 64.0 * (1 << 20));
    EXPECT_LE(p->bytes_per_pass(), p->whole_bytes());
    p->run_pass();
    p->run_copy_pass();
    p->run_whole_pass_on_one_thread();
  }
  // A probe made while another is alive shares its buffer where it is large enough, each
  // pass still over all of it.
  const ReadProbe again(ThreadPool::global().size());
  EXPECT_EQ(again.thread_buffer(0), probe.thread_buffer(0));
  const ReadProbe one_more(1);
  EXPECT_EQ(one_more.thread_buffer(0), probe.thread_buffer(0));
  EXPECT_EQ(one_more.bytes_per_pass(), one_more.whole_bytes());
  one_more.run_copy_pass();
}

TEST(Device, CliPrintsDeviceAndHonoursKindOverride) {
  int rc = 0;
  const std::string out =
      run(std::string("TOKAMAX_DEVICE_KIND='My Test Chip' ") + TOKAMAX_CLI + " device --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  const Json j = Json::parse(out);
  EXPECT_EQ(j["device_kind"], "my_test_chip");
  EXPECT_EQ(run(std::string(TOKAMAX_CLI) + " --version", &rc).find("tokamax"), 0u);
}

// Core types are ranked by the vector ISA of their kernels; names OpenBLAS may add later are
// never called weaker.
TEST(Device, BlasCoreRanks) {
  auto weaker = [](const char* core, const char* best) {
    BlasInfo b;
    b.core = core;
    b.best = best;
    return b.weaker();
  };
  EXPECT_TRUE(weaker("Prescott", "Cooperlake"));
  EXPECT_TRUE(weaker("PRESCOTT", "SkylakeX"));
  EXPECT_TRUE(weaker("Haswell", "SkylakeX"));
  EXPECT_TRUE(weaker("Sandybridge", "Haswell"));
  EXPECT_FALSE(weaker("SkylakeX", "SkylakeX"));
  EXPECT_FALSE(weaker("SapphireRapids", "Cooperlake"));
  EXPECT_FALSE(weaker("Zen5", "SkylakeX"));  // unknown: not weaker
  EXPECT_FALSE(weaker("Prescott", ""));      // nothing better known for this CPU
  EXPECT_NE(blas_info().config.find("OpenBLAS"), std::string::npos);
}

// The command's baselines run OpenBLAS's best kernels for this CPU (it starts itself again with
// OPENBLAS_CORETYPE where OpenBLAS took the CPU for an older one), and a core type the user set
// is kept.
TEST(Device, CliRunsTheBaselinesOnTheBestBlasKernels) {
  int rc = 0;
  const std::string out = run(std::string("env -u OPENBLAS_CORETYPE -u TOKAMAX_BLAS_DETECTED ") +
                                  TOKAMAX_CLI + " device --json",
                              &rc);
  ASSERT_EQ(rc, 0) << out;
  const Json b = Json::parse(out)["blas"];
  BlasInfo info;
  info.core = b["core"].get<std::string>();
  info.best = b["best_core"].get<std::string>();
  EXPECT_FALSE(info.weaker()) << b.dump();
  if (b["core_from_env"].get<bool>()) {
    EXPECT_FALSE(b["detected"].get<std::string>().empty());
  }
  const std::string kept =
      run(std::string("env -u TOKAMAX_BLAS_DETECTED OPENBLAS_CORETYPE=Prescott ") + TOKAMAX_CLI +
              " device --json",
          &rc);
  ASSERT_EQ(rc, 0) << kept;
  const Json k = Json::parse(kept)["blas"];
  EXPECT_EQ(k["core"], "Prescott") << k.dump();
  EXPECT_TRUE(k["core_from_env"].get<bool>());
  EXPECT_EQ(k["detected"], "");
}

}  // namespace
}  // namespace tokamax
