// Linked against the static archive (tokamax_static), where the linker keeps only the object
// files something references: the built-in family must be registered and the ladder's disk-cache
// rung installed all the same (they are wired by explicit calls, not static initializers), and
// a call must compute what the reference does; and TOKAMAX_TRACE must record the calls (the
// recorder's file, which nothing references, was dropped with the static initializer that
// started it: the Python module, linked so, wrote no trace at all). Not a gtest binary: it
// references as little of the library as a user program would.
#include <limits.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tokamax/tokamax.h"

namespace {
int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}
std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// This program again, as `--traced-call` (one op call, then a plain return: the trace is left
// to the library's exit), with TOKAMAX_TRACE=`trace`; its exit status, its stderr in `err`.
int run_traced_child(const std::string& trace, const std::string& err) {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  const std::string cmd =
      "TOKAMAX_TRACE='" + trace + "' '" + self + "' --traced-call 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void traced_call() {
  using namespace tokamax;
  const Tensor x = Tensor::randn({4, 8}, DType::kF32, 1);
  const Tensor w = Tensor::randn({2, 8, 8}, DType::kF32, 2);
  const std::vector<int32_t> sizes = {1, 3};
  (void)ragged_dot(x, w, sizes);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tokamax;
  if (argc > 1 && std::string(argv[1]) == "--traced-call") {
    traced_call();
    return 0;
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tokamax_static_" + std::to_string(static_cast<long>(getpid())));
  setenv("TOKAMAX_CACHE_DIR", dir.c_str(), 1);

  bool found = false;
  for (const auto& f : families()) found = found || f->name() == "ragged_dot";
  expect(found, "the built-in ragged_dot family is registered");

  const OpFamily& fam = find_family("ragged_dot");
  auto call = fam.make_call(
      fam.bind_json(find_arg_specs("ragged_dot", "smoke_f32")[0].arguments, "native"), 1);
  const auto native = fam.implementation("native");
  // A config only the disk-cache rung can return: one of the search space, not the heuristics'.
  const Config heuristic = native->heuristics_config(*call);
  Config cached = heuristic;
  for (const Config& c : native->autotuning_configs(*call)) {
    if (!(c == heuristic)) cached = c;
  }
  expect(!(cached == heuristic), "the search space has a config besides the heuristics'");
  DiskCache::global().put_memory(*native, call->bound.with_implementation("native"), cached);
  const Explanation e = explain(fam, *call, CallOptions{"native", std::nullopt});
  expect(
      e.resolution.rung == Rung::kDiskCache,
      "the disk-cache rung is installed (rung: " + std::string(rung_name(e.resolution.rung)) + ")");
  expect(e.resolution.config == cached, "the cached config is used");

  Tensor x = Tensor::randn({9, 33}, DType::kF32, 2);
  Tensor w = Tensor::randn({3, 33, 17}, DType::kF32, 3);
  const std::vector<int32_t> sizes = {4, 0, 5};
  const Tensor got = ragged_dot(x, w, sizes, {.implementation = "native"});
  const Tensor want = ragged_dot(x, w, sizes, {.implementation = "reference"});
  double worst = 0;
  for (int64_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got.get(i) - want.get(i)));
  expect(worst < 1e-4,
         "native agrees with the reference (max error " + std::to_string(worst) + ")");

  // TOKAMAX_TRACE: the call recorded, the trace completed at exit.
  std::filesystem::create_directories(dir);
  const std::string trace = (dir / "trace.json").string(), err = (dir / "err.txt").string();
  expect(run_traced_child(trace, err) == 0, "the traced run succeeds: " + read_text(err));
  const std::string text = read_text(trace);
  expect(text.find("\"name\":\"ragged_dot/") != std::string::npos && text.size() > 4 &&
             text.compare(text.size() - 4, 4, "\n]}\n") == 0,
         "TOKAMAX_TRACE wrote a complete trace of the call: '" + text.substr(0, 200) + "'");
  // One that cannot be written is said on stderr at exit (not only logged at the first call),
  // whatever the program does: it cannot be created, or not renamed into place.
  for (const std::string& bad : {std::string("/proc/tokamax/trace.json"), dir.string()}) {
    run_traced_child(bad, err);
    const std::string said = read_text(err);
    expect(said.find("tokamax: TOKAMAX_TRACE: no trace written: ") != std::string::npos &&
               said.find(bad) != std::string::npos,
           "an unwritable TOKAMAX_TRACE=" + bad + " is said at exit: '" + said + "'");
  }

  std::filesystem::remove_all(dir);
  if (failures == 0) std::printf("static link: ok\n");
  return failures == 0 ? 0 : 1;
}
