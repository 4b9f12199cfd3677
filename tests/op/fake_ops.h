// Test-only op family "fake": out = 2 * x, with implementations that exercise every path of the
// framework and the autotuner (as tokamax's own tests do with fake ops).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tokamax/tokamax.h"

namespace tokamax::testing {

struct FakeCall : CallBase {
  TensorView x;  // f32[n]
};

struct TileConfig {
  int tile = 1;
  Json to_json() const { return {{"tile", tile}}; }
  static TileConfig from_json(const Json& j) { return {j.at("tile").get<int>()}; }
  bool operator==(const TileConfig&) const = default;
};

inline void spin_us(double us) {
  const double end = now_seconds() + us * 1e-6;
  while (now_seconds() < end) {
  }
}

inline void write_double(FakeCall& c) {
  const TensorView& o = c.outputs.at(0);
  for (int64_t i = 0; i < c.x.size(); ++i) o.data_as<float>()[i] = 2 * c.x.data_as<float>()[i];
}

// Configs tile 1..4; tile 3 is fastest; prepare is counted.
class OneField : public TypedImplementation<FakeCall, TileConfig> {
 public:
  mutable std::atomic<int> prepares{0};
  std::string name() const override { return "one_field"; }
  std::vector<std::string> config_fields() const override { return {"tile"}; }
  TileConfig heuristics(const FakeCall&) const override { return {1}; }
  std::vector<TileConfig> search_space(const FakeCall&) const override {
    return {{4}, {2}, {3}, {1}};
  }
  std::shared_ptr<const Prepared> prepare(const CallBase&, const Config&) const override {
    prepares++;
    return nullptr;
  }
  void run_call(FakeCall& call, const TileConfig& c, const Prepared*) const override {
    spin_us(30 + 60 * std::abs(c.tile - 3));
    write_double(call);
  }
};

// A config whose behaviour is broken in a given way.
class Broken : public TypedImplementation<FakeCall, TileConfig> {
 public:
  enum Mode { kSleep, kOutOfBounds, kUnwritten, kWrong, kThrows };
  Broken(std::string name, Mode mode) : name_(std::move(name)), mode_(mode) {}
  std::string name() const override { return name_; }
  TileConfig heuristics(const FakeCall&) const override { return {0}; }
  std::vector<TileConfig> search_space(const FakeCall&) const override { return {{1}}; }
  void run_call(FakeCall& call, const TileConfig& c, const Prepared*) const override {
    write_double(call);
    if (c.tile == 0) return;  // the heuristics config is fine
    float* o = call.outputs[0].data_as<float>();
    switch (mode_) {
      case kSleep:
        std::this_thread::sleep_for(std::chrono::seconds(2));  // past any test's timeout
        break;
      case kOutOfBounds:
        o[call.x.size() + 3] = 1.0f;
        break;
      case kUnwritten:
        o[1] = std::nanf("");
        break;
      case kWrong:
        o[2] += 1.0f;
        break;
      case kThrows:
        throw std::runtime_error("boom");
    }
  }

 private:
  std::string name_;
  Mode mode_;
};

class Nothing : public TypedImplementation<FakeCall, void> {
 public:
  std::string name() const override { return "nothing"; }
  void run_call(FakeCall& call, const Prepared*) const override { write_double(call); }
};

class Picky : public TypedImplementation<FakeCall, void> {  // never supports anything
 public:
  std::string name() const override { return "picky"; }
  void check_call(const FakeCall&) const override {
    throw Unsupported("picky refuses every shape");
  }
  void run_call(FakeCall&, const Prepared*) const override {}
};

// The whole family: its call above, one argument, bind, output specs and tolerance; the
// framework (TypedFamily) does the rest.
class FakeFamily : public TypedFamily<FakeCall> {
 public:
  const std::shared_ptr<OneField> one;
  FakeFamily() : FakeFamily(std::make_shared<OneField>()) {}
  explicit FakeFamily(std::shared_ptr<OneField> one_field)
      : TypedFamily("fake", {Args<FakeCall>::input("x", &FakeCall::x)}, std::make_shared<Nothing>(),
                    {std::make_shared<Picky>(), one_field, std::make_shared<Nothing>(),
                     std::make_shared<Broken>("sleepy", Broken::kSleep),
                     std::make_shared<Broken>("oob", Broken::kOutOfBounds),
                     std::make_shared<Broken>("unwritten", Broken::kUnwritten),
                     std::make_shared<Broken>("wrong", Broken::kWrong),
                     std::make_shared<Broken>("throws", Broken::kThrows)}),
        one(std::move(one_field)) {}
  void bind(FakeCall& c) const override {
    if (c.x.rank() != 1 || c.x.dtype() != DType::kF32)
      throw InvalidArgument("fake: x has spec " + c.x.spec().str() + "; expected f32[n]");
  }
  std::vector<ShapeDtype> output_specs(const FakeCall& c) const override { return {c.x.spec()}; }
  Tolerance tolerance_of(const FakeCall&) const override { return {1e-6, 1e-6, 0}; }
  std::vector<ArgSpec> arg_specs() const override {
    return {ArgSpec{"fake", "small", {{"x", "f32[64]"}}, {"smoke"}}};
  }
};

inline FakeFamily& fake() {
  static std::shared_ptr<FakeFamily> f = [] {
    auto p = std::make_shared<FakeFamily>();
    register_family(p);
    return p;
  }();
  return *f;
}

inline std::unique_ptr<FakeCall> fake_call(int64_t n = 64) {
  auto base =
      fake().make_call(fake().bind_json({{"x", ShapeDtype{{n}, DType::kF32}.str()}}, ""), 1);
  return std::unique_ptr<FakeCall>(static_cast<FakeCall*>(base.release()));
}

// Points the user cache at a fresh temporary directory for one test, and back afterwards.
class ScopedCacheDir {
 public:
  explicit ScopedCacheDir(const std::string& tag)
      : dir_(std::filesystem::temp_directory_path() /
             ("tokamax_" + tag + "_" + std::to_string(getpid()))) {
    if (const char* old = std::getenv("TOKAMAX_CACHE_DIR")) previous_ = old;
    std::filesystem::remove_all(dir_);
    setenv("TOKAMAX_CACHE_DIR", dir_.c_str(), 1);
    DiskCache::global().clear();
  }
  ~ScopedCacheDir() {
    std::filesystem::remove_all(dir_);
    if (previous_)
      setenv("TOKAMAX_CACHE_DIR", previous_->c_str(), 1);
    else
      unsetenv("TOKAMAX_CACHE_DIR");
    DiskCache::global().clear();
  }
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::optional<std::string> previous_;
};

}  // namespace tokamax::testing
