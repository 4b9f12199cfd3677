// Seeds for random test inputs: fresh on every run, yet reproducible. A run draws one base seed
// (or takes TOKAMAX_TEST_SEED=N) and prints it with every failure; each test's seeds derive from
// the base and the test's name, so `TOKAMAX_TEST_SEED=N tokamax_tests --gtest_filter=ThatTest`
// regenerates exactly the inputs of the failing case, whatever ran before it.
#pragma once

#include <gtest/gtest.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "tokamax/core/json.h"

namespace tokamax::testing_seed {

inline uint64_t base_seed() {
  static const uint64_t base = [] {
    if (const char* env = std::getenv("TOKAMAX_TEST_SEED"); env && *env) {
      uint64_t seed = 0;
      const char* end = env + std::strlen(env);
      const auto [ptr, ec] = std::from_chars(env, end, seed);
      if (ec != std::errc() || ptr != end) {
        std::fprintf(stderr, "TOKAMAX_TEST_SEED='%s': expected a decimal 64-bit integer\n", env);
        std::exit(2);
      }
      return seed;
    }
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return base;
}

// Prints the base seed under every failed assertion.
class SeedPrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "  (inputs from TOKAMAX_TEST_SEED=%llu)\n",
                   static_cast<unsigned long long>(base_seed()));
    }
  }
};

inline const bool kPrinterInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedPrinter);
  return true;
}();

}  // namespace tokamax::testing_seed

namespace tokamax {

// The next seed of the current test: a stream keyed by (base seed, test name).
inline uint64_t fresh_seed() {
  static std::string test;
  static std::mt19937_64 rng;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name =
      info ? std::string(info->test_suite_name()) + "." + info->name() : std::string();
  if (name != test) {
    test = name;
    rng.seed(testing_seed::base_seed() ^ hash64(name));
  }
  return rng();
}

}  // namespace tokamax
