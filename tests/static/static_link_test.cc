// Linked against the static archive (tokamax_static), where the linker keeps only the object
// files something references: the built-in family must be registered and the ladder's disk-cache
// rung installed all the same (they are wired by explicit calls, not static initializers), and
// a call must compute what the reference does. Not a gtest binary: it references as little of
// the library as a user program would.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
}  // namespace

int main() {
  using namespace tokamax;
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

  std::filesystem::remove_all(dir);
  if (failures == 0) std::printf("static link: ok\n");
  return failures == 0 ? 0 : 1;
}
