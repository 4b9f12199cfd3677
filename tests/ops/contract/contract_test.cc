// What every op promises whatever its implementation (docs/ops.md, "NaN, Inf and determinism"),
// checked over every registered family, forward and backward, on its `smoke` workloads:
// - NaN and Inf: a NaN put into one element of a floating input reaches every output element
//   that depends on it (the reference's outputs that change when that element changes), and
//   every implementation's NaN outputs are the reference's; an Inf makes the same outputs
//   non-finite in every implementation as in the reference. The one documented exception: in
//   attention with masking, a NaN or Inf in v (and, backward, in any input) may also reach rows
//   or positions that the mask separates from it (0 x NaN in a product of the probabilities).
// - Determinism: identical inputs and thread count give bit-identical outputs, 200 calls in a
//   row and 200 calls from 8 threads at once.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "autotuning/output_check.h"
#include "ops/elements.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

struct Case {
  std::shared_ptr<const OpFamily> family;
  ArgSpec spec;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.family->name() << "/" << c.spec.name; }

std::vector<Case> smoke_cases() {
  std::vector<Case> out;
  for (const auto& f : families()) {
    for (const ArgSpec& s : f->arg_specs()) {
      if (s.has_tag("smoke")) out.push_back({f, s});
    }
  }
  // The attention backward with many work items of unequal size (causal), where items taken
  // dynamically once landed in different threads' accumulators from call to call.
  const std::string vjp = "dot_product_attention_vjp";
  out.push_back(
      {std::shared_ptr<const OpFamily>(std::shared_ptr<const OpFamily>{}, &find_family(vjp)),
       ArgSpec{vjp,
               "causal_many_items",
               {{"q", "f32[2,96,4,32]"},
                {"k", "f32[2,96,2,32]"},
                {"v", "f32[2,96,2,32]"},
                {"out", "f32[2,96,4,32]"},
                {"lse", "f32[2,4,96]"},
                {"dout", "f32[2,96,4,32]"},
                {"is_causal", true}},
               {"determinism"}}});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = info.param.family->name() + "_" + info.param.spec.name;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

// An implementation ready to run on a call: its heuristics config and prepared state.
struct Runner {
  std::shared_ptr<const Implementation> impl;
  Config config;
  std::shared_ptr<const Prepared> prepared;
};

std::vector<Runner> runners(const OpFamily& family, const CallBase& call) {
  std::vector<Runner> out;
  std::vector<std::shared_ptr<const Implementation>> impls = family.implementations();
  impls.push_back(family.reference());
  for (const auto& impl : impls) {
    if (!impl->supported_on(device_info())) continue;
    try {
      impl->validate(call);
    } catch (const Unsupported&) {
      continue;
    }
    Runner r{impl, impl->heuristics_config(call), nullptr};
    r.prepared = impl->prepare(call, r.config);
    out.push_back(std::move(r));
  }
  return out;
}

// Every output's bytes after one run.
std::vector<std::vector<uint8_t>> run_bytes(const Runner& r, CallBase& call) {
  r.impl->run(call, r.config, r.prepared.get());
  std::vector<std::vector<uint8_t>> out;
  for (const TensorView& v : call.outputs) {
    const auto* p = static_cast<const uint8_t*>(v.data());
    out.emplace_back(p, p + v.spec().bytes());
  }
  return out;
}

std::vector<std::vector<double>> run_values(const Runner& r, CallBase& call) {
  r.impl->run(call, r.config, r.prepared.get());
  std::vector<std::vector<double>> out;
  for (const TensorView& v : call.outputs) out.push_back(to_f64(v));
  return out;
}

// Which outputs of an op may take a NaN from more elements than the reference's: attention's
// masked positions meet it as 0 x NaN in a product: forward, from v; backward, from any input
// (a masked position's zero dS multiplies its k into dq and its row's q into dk).
bool may_reach_masked(const Case& c, const std::string& input) {
  const std::string& f = c.family->name();
  if (f.rfind("dot_product_attention", 0) != 0) return false;
  const Json& a = c.spec.arguments;
  const bool masking = (a.contains("is_causal") && a["is_causal"] == true) ||
                       (a.contains("mask") && !a["mask"].is_null()) ||
                       (a.contains("kv_seq_lengths") && !a["kv_seq_lengths"].is_null()) ||
                       (a.contains("local_window_size") && !a["local_window_size"].is_null());
  return masking && (input == "v" || f != "dot_product_attention");
}

// The name of owned input i: the order of the family's array arguments that the spec holds.
std::vector<std::string> input_names(const Case& c) {
  std::vector<std::string> out;
  const Json d = c.family->description();
  for (const Json& a : d.at("arguments")) {
    const std::string kind = a.at("kind").get<std::string>();
    if (kind != "array" && kind != "optional_array") continue;
    const std::string name = a.at("name").get<std::string>();
    if (c.spec.arguments.contains(name) && !c.spec.arguments[name].is_null()) out.push_back(name);
  }
  return out;
}

class Contract : public ::testing::TestWithParam<Case> {};

TEST_P(Contract, NanAndInfReachWhatDependsOnThemInEveryImplementation) {
  const Case& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto call = c.family->make_call(c.family->bind_json(c.spec.arguments, ""), seed);
  std::vector<Runner> rs = runners(*c.family, *call);
  const Runner* ref = nullptr;
  for (const Runner& r : rs) {
    if (r.impl->name() == "reference") ref = &r;
  }
  ASSERT_NE(ref, nullptr);
  const std::vector<std::string> names = input_names(c);
  std::vector<Tensor*> inputs;
  std::vector<std::string> input_name;
  {
    const size_t n = call->owned.size() - call->outputs.size();
    ASSERT_EQ(n, names.size()) << "made call's inputs against the description's arrays";
    for (size_t i = 0; i < n; ++i) {
      Tensor& t = call->owned[i];
      if (!is_floating(t.dtype()) || t.size() == 0) continue;
      inputs.push_back(&t);
      input_name.push_back(names[i]);
    }
  }
  const auto base = run_values(*ref, *call);
  std::mt19937_64 rng(seed);
  for (size_t in = 0; in < inputs.size(); ++in) {
    Tensor& x = *inputs[in];
    const TensorView xv = x.view();
    for (int trial = 0; trial < 3; ++trial) {
      const int64_t e = static_cast<int64_t>(rng() % static_cast<uint64_t>(x.size()));
      const float was = load_f32(xv, e);
      SCOPED_TRACE(input_name[in] + " element " + std::to_string(e));
      // The outputs that depend on element e: those the reference changes when it changes.
      store_f32(xv, e, was + 1.0f + 2.0f * std::abs(was));
      const auto moved = run_values(*ref, *call);
      for (const float special : {NAN, INFINITY}) {
        const bool nan = std::isnan(special);
        store_f32(xv, e, special);
        const auto want = run_values(*ref, *call);
        for (const Runner& r : rs) {
          const auto got = &r == ref ? want : run_values(r, *call);
          for (size_t o = 0; o < got.size(); ++o) {
            int bad = 0;
            for (size_t i = 0; i < got[o].size(); ++i) {
              const bool w = nan ? std::isnan(want[o][i]) : !std::isfinite(want[o][i]);
              const bool g = nan ? std::isnan(got[o][i]) : !std::isfinite(got[o][i]);
              const bool dep =
                  moved[o][i] != base[o][i] && !(std::isnan(moved[o][i]) && std::isnan(base[o][i]));
              if (nan && &r == ref && dep && !w && bad++ < 3) {
                ADD_FAILURE() << "reference output " << o << "[" << i
                              << "] depends on the element but is not NaN: " << want[o][i];
              }
              const bool extra_ok = may_reach_masked(c, input_name[in]) && g && !w;
              if (g != w && !extra_ok && bad++ < 3) {
                ADD_FAILURE() << r.impl->name() << " output " << o << "[" << i << "] " << got[o][i]
                              << " where the reference has " << want[o][i] << " ("
                              << (nan ? "NaN" : "Inf") << " input)";
              }
            }
          }
        }
      }
      store_f32(xv, e, was);
    }
  }
}

TEST_P(Contract, BitIdenticalAcrossRepeatsAndConcurrentCallers) {
  const Case& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto call = c.family->make_call(c.family->bind_json(c.spec.arguments, ""), seed);
  for (const Runner& r : runners(*c.family, *call)) {
    // The larger cases are for the kernels' work split; the scalar reference has none (and
    // runs its smoke cases above).
    if (!c.spec.has_tag("smoke") && r.impl->name() == "reference") continue;
    SCOPED_TRACE(r.impl->name());
    const auto first = run_bytes(r, *call);
    int differ = 0;
    for (int i = 0; i < 199; ++i) differ += run_bytes(r, *call) != first;
    EXPECT_EQ(differ, 0) << "of 199 sequential calls";
    // 8 callers at once, 25 calls each, each into outputs of its own.
    std::atomic<int> concurrent_differ{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        // The same inputs (made from the same seed), prepared for this caller's call.
        auto own = c.family->make_call(c.family->bind_json(c.spec.arguments, ""), seed);
        Runner mine = r;
        mine.prepared = r.impl->prepare(*own, r.config);
        for (int i = 0; i < 25; ++i) concurrent_differ += run_bytes(mine, *own) != first;
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(concurrent_differ.load(), 0) << "of 200 calls from 8 threads";
  }
}

INSTANTIATE_TEST_SUITE_P(Smoke, Contract, ::testing::ValuesIn(smoke_cases()), case_name);

}  // namespace
}  // namespace tokamax
