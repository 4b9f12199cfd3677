// The op entry points through the generic call path: a family (forward or backward) and one of
// its smoke workloads as a template, then random shapes (each dimension 0-9, rank kept or
// changed), dtypes and statics (including extreme and special values), bound as the CLI and the
// bindings bind them; a call made from the bound arguments gets NaN, Inf, huge or tiny values in
// random elements. Every implementation the CPU has runs it. Findings: a crash or sanitizer
// report, an exception other than InvalidArgument or Unsupported, and, where no special value
// went in, an output outside the family's tolerance of the reference's.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autotuning/output_check.h"
#include "fuzz/fuzz_common.h"
#include "ops/elements.h"

namespace tokamax::fuzz {
namespace {

std::string shape_of(FuzzedDataProvider& in, const std::string& spec) {
  ShapeDtype sd = ShapeDtype::parse(spec);
  if (in.ConsumeIntegralInRange(0, 7) == 0) {  // now and then another rank
    sd.shape.resize(static_cast<size_t>(in.ConsumeIntegralInRange(0, 5)), 1);
  }
  for (int64_t& d : sd.shape) {
    // Mostly the template's dimension or a small one; now and then 0 or a huge one (refused
    // before anything is allocated, or a product past int64).
    switch (in.ConsumeIntegralInRange(0, 15)) {
      case 0:
        d = 0;
        break;
      case 1:
        d = int64_t{1} << in.ConsumeIntegralInRange(20, 62);
        break;
      case 2:
      case 3:
      case 4:
        break;
      default:
        d = in.ConsumeIntegralInRange<int64_t>(1, 9);
    }
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0) {
    static const DType kinds[] = {DType::kF32, DType::kBF16, DType::kI32, DType::kBool,
                                  DType::kF64};
    sd.dtype = kinds[in.ConsumeIntegralInRange(0, 4)];
  }
  return sd.str();
}

// A non-finite element where the reference's is finite, or a normwise relative error over the
// reference's finite elements above `bound`: what it is, else nothing.
std::optional<std::string> normwise_failure(const std::vector<TensorView>& outs,
                                            const std::vector<std::vector<double>>& refs,
                                            double bound) {
  for (size_t o = 0; o < outs.size(); ++o) {
    const std::vector<double> got = to_f64(outs[o]);
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!std::isfinite(refs[o][i])) continue;
      if (!std::isfinite(got[i]))
        return "output " + std::to_string(o) + " non-finite at " + std::to_string(i);
      err2 += (got[i] - refs[o][i]) * (got[i] - refs[o][i]);
      ref2 += refs[o][i] * refs[o][i];
    }
    const double normwise = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
    if (normwise > bound) {
      return "output " + std::to_string(o) + " normwise relative error " +
             std::to_string(normwise) + " over " + std::to_string(bound);
    }
  }
  return std::nullopt;
}

Json static_value(FuzzedDataProvider& in, const Json& arg) {
  const std::string kind = arg.at("kind").get<std::string>();
  switch (in.ConsumeIntegralInRange(0, 9)) {
    case 0:
      return Json();
    case 1:
      return in.ConsumeBool();
    case 2:
      return in.ConsumeIntegral<int64_t>();
    case 3: {
      static const double kSpecial[] = {0.0,    -0.0,    1e300, -1e300, 1e-300, 1e-45,
                                        3.4e38, -3.5e38, 1e-6,  0.5,    -1.0,   65504.0};
      return kSpecial[in.ConsumeIntegralInRange(0, 11)];
    }
    case 4:
      return in.ConsumeRandomLengthString(12);
    case 5:
      return Json::array(
          {in.ConsumeIntegralInRange<int64_t>(-2, 40), in.ConsumeIntegralInRange<int64_t>(-2, 40)});
    default:  // a valid-looking value of its kind
      if (arg.contains("choices") && arg["choices"].is_array() && !arg["choices"].empty()) {
        const Json& c = arg["choices"];
        return c[in.ConsumeIntegralInRange<size_t>(0, c.size() - 1)];
      }
      if (kind == "bool") return in.ConsumeBool();
      if (kind == "int") return in.ConsumeIntegralInRange<int64_t>(-3, 12);
      return in.ConsumeFloatingPointInRange<double>(-4.0, 4.0);
  }
}

float special_value(FuzzedDataProvider& in) {
  static const float kValues[] = {NAN,
                                  INFINITY,
                                  -INFINITY,
                                  std::numeric_limits<float>::max(),
                                  -std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min(),
                                  0.0f,
                                  -0.0f,
                                  1e20f};
  return kValues[in.ConsumeIntegralInRange<size_t>(0, 8)];
}

void one_input(FuzzedDataProvider& in) {
  const auto fams = families();
  const auto& fam = fams[in.ConsumeIntegralInRange<size_t>(0, fams.size() - 1)];
  std::vector<ArgSpec> specs;
  for (const ArgSpec& s : fam->arg_specs()) {
    if (s.has_tag("smoke")) specs.push_back(s);
  }
  if (specs.empty()) return;
  Json args = specs[in.ConsumeIntegralInRange<size_t>(0, specs.size() - 1)].arguments;
  const Json description = fam->description();
  bool reals_changed = false;  // a scale, soft cap or epsilon other than the spec's
  bool special = false;        // an input element or a static whose value is extreme
  for (const Json& a : description.at("arguments")) {
    const std::string name = a.at("name").get<std::string>(),
                      kind = a.at("kind").get<std::string>();
    if (!in.ConsumeBool()) continue;  // about half the arguments changed
    if (kind == "array" || kind == "optional_array") {
      if (args.contains(name) && args[name].is_string()) {
        args[name] = shape_of(in, args[name].get<std::string>());
      } else if (kind == "optional_array" && in.ConsumeIntegralInRange(0, 3) == 0) {
        args.erase(name);
      }
    } else if (kind != "custom") {
      const Json before = args.contains(name) ? args[name] : Json();
      args[name] = static_value(in, a);
      if (kind == "real" || kind == "optional_real") {
        reals_changed |= args[name] != before;
        // A real far past any model's (a scale of 3.6e18) overflows the f32 products it
        // multiplies: the NaN/Inf contract covers that, not a tolerance (contract_test.cc).
        special |= args[name].is_number() && std::fabs(args[name].get<double>()) > 64;
      }
    }
  }
  // Smoke sizes: the arrays together stay small enough to run every implementation quickly.
  const BoundArguments bound = fam->bind_json(args, "");
  int64_t elements = 0;
  for (const auto& [name, v] : bound.arguments().items()) {
    if (!v.is_string()) continue;
    try {
      elements += ShapeDtype::parse(v.get<std::string>()).size();
    } catch (const InvalidArgument&) {
    }
  }
  if (elements > (int64_t{1} << 16)) return;
  auto call = fam->make_call(bound, in.ConsumeIntegral<uint32_t>());
  const size_t inputs = call->owned.size() - call->outputs.size();
  for (int n = in.ConsumeIntegralInRange(0, 3); n > 0 && inputs > 0; --n) {
    Tensor& t = call->owned[in.ConsumeIntegralInRange<size_t>(0, inputs - 1)];
    if (!is_floating(t.dtype()) || t.size() == 0) continue;
    store_f32(t.view(), in.ConsumeIntegralInRange<int64_t>(0, t.size() - 1), special_value(in));
    special = true;
  }
  std::vector<std::vector<double>> refs;
  {
    const auto ref = fam->reference();
    ref->run(*call, ref->heuristics_config(*call), nullptr);
    for (const TensorView& v : call->outputs) refs.push_back(to_f64(v));
  }
  for (const auto& impl : fam->implementations()) {
    if (!impl->supported_on(device_info())) continue;
    try {
      impl->validate(*call);
    } catch (const Unsupported&) {
      continue;
    }
    const Config config = impl->heuristics_config(*call);
    const auto prepared = impl->prepare(*call, config);
    impl->run(*call, config, prepared.get());
    if (special) continue;
    // The family's elementwise bounds are calibrated on its spec's reals; another scale (say 22
    // times the usual one, with a backward's residuals drawn at random rather than made by the
    // forward) amplifies two correct roundings apart past them on a few elements. There the
    // outputs are held to the normwise bound (or the relative one where it has none): a wrong
    // result still fails it, a conditioning difference does not.
    const Tolerance tol = fam->tolerance(*call);
    if (reals_changed) {
      if (const auto what =
              normwise_failure(call->outputs, refs, tol.normwise > 0 ? tol.normwise : tol.rtol)) {
        std::fprintf(stderr, "fuzz_ops: %s %s: %s\n", impl->name().c_str(), bound.key().c_str(),
                     what->c_str());
        __builtin_trap();
      }
      continue;
    }
    if (const auto failure = check_outputs(call->outputs, refs, tol)) {
      // What the finding is, before the crash that reports it.
      std::fprintf(stderr, "fuzz_ops: %s %s: %s\n", impl->name().c_str(), bound.key().c_str(),
                   failure->message.c_str());
      __builtin_trap();
    }
  }
}

}  // namespace
}  // namespace tokamax::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  FuzzedDataProvider in(data, size);
  try {
    fuzz::one_input(in);
  } catch (const InvalidArgument&) {
  } catch (const Unsupported&) {
  }
  return 0;
}
