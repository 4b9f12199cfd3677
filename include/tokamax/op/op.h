// The op framework: an op family (typed arguments, bind, reference implementation), its
// implementations (config, heuristics, search space, support, prepare, run), BoundArguments
// (op identity + canonical argument spec + key) and the registry of families.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include "tokamax/core/device.h"
#include "tokamax/core/error.h"
#include "tokamax/core/export.h"
#include "tokamax/core/json.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// Op identity + canonical argument spec. The spec maps argument names to ShapeDtype strings
// and static values (never array values); it includes "num_threads", because the thread count
// changes which config wins on a CPU. key() is the canonical (sorted, compact) JSON of the spec,
// hashed once. Cheap to copy.
// The arrays among a spec's or a key's arguments (a JSON object): every string value that reads
// as a ShapeDtype ("f32[64,128]"), in the arguments' order; other values (an option's name) and
// strings that do not parse are not arrays.
std::vector<ShapeDtype> array_arguments(const Json& arguments);

class BoundArguments {
 public:
  BoundArguments() = default;
  BoundArguments(std::string family, std::string implementation, Json arguments);

  const std::string& family() const { return rep_->family; }
  const std::string& implementation() const { return implementation_; }
  const Json& arguments() const { return rep_->arguments; }
  const std::string& key() const { return rep_->key; }
  uint64_t key_hash() const { return rep_->hash; }
  int num_threads() const;
  BoundArguments with_implementation(std::string implementation) const;

  // {"op": {"family": F, "implementation": I}, "arguments": {...}}.
  Json to_json() const;
  // Validates through the family's bind (unknown family -> InvalidArgument).
  static BoundArguments from_json(const Json& j);
  // A "bound-args file": a JSON list of the above. With `skipped`, an entry that does not
  // validate (an op this library does not know, bad arguments) is left out and described there
  // instead of failing the whole list.
  static std::string dumps_list(const std::vector<BoundArguments>& list);
  static std::vector<BoundArguments> loads_list(std::string_view text,
                                                std::string_view source = "bound-args",
                                                std::vector<std::string>* skipped = nullptr);

 private:
  struct Rep {
    std::string family;
    Json arguments;
    std::string key;
    uint64_t hash = 0;
  };
  std::shared_ptr<const Rep> rep_;
  std::string implementation_;
};

// One concrete invocation: bound arguments, input views, and output views that the
// implementation writes. Families derive from it and add typed fields.
class CallBase {
 public:
  CallBase() = default;
  CallBase(CallBase&&) = default;  // movable (families build calls by value), never copied
  CallBase& operator=(CallBase&&) = default;
  virtual ~CallBase() = default;
  BoundArguments bound;
  std::vector<TensorView> outputs;  // the autotuner re-points these at guarded buffers
  int num_threads = 1;
  // Storage of a call made from a spec (make_call: its inputs and outputs).
  std::vector<Tensor> owned;
};

// A family's own call type from a CallBase: a checked downcast, so that a call of another family
// is an Error naming both types rather than undefined behaviour.
template <class T>
const T& call_as(const CallBase& call) {
  if (const T* typed = dynamic_cast<const T*>(&call)) return *typed;
  throw Error(std::string("a call of type ") + typeid(call).name() + " where " + typeid(T).name() +
              " was expected");
}
template <class T>
T& call_as(CallBase& call) {
  return const_cast<T&>(call_as<T>(static_cast<const CallBase&>(call)));
}

// State an implementation builds before running (packed weights, scratch). Kept out of the
// measured call by the autotuner; reusable across calls with the same inputs.
class Prepared {
 public:
  virtual ~Prepared() = default;
};

class Implementation {
 public:
  virtual ~Implementation() = default;
  virtual std::string name() const = 0;
  // Bump when kernels or config meaning change: cached entries of another version are ignored.
  virtual int version() const { return 1; }
  virtual bool supported_on(const DeviceInfo&) const { return true; }
  // Per-shape validation; throws Unsupported.
  virtual void validate(const CallBase&) const {}
  // False when there is nothing to tune: the null config is used with no lookup at all.
  virtual bool has_config() const { return false; }
  // Cheap; never throws for supported input.
  virtual Config heuristics_config(const CallBase&) const { return Config::null(); }
  // The search space, pruned so that every listed config is valid for this call.
  virtual std::vector<Config> autotuning_configs(const CallBase&) const { return {}; }
  // Decodes (and validates) a config read from a file; InvalidArgument if malformed.
  virtual Config config_from_json(const Json& j) const;
  // Names of the config fields, for `tokamax ops`.
  virtual std::vector<std::string> config_fields() const { return {}; }
  virtual int64_t scratch_bytes(const CallBase&, const Config&) const { return 0; }
  // A cost model's estimate of one call's time in ms with this config (a roofline over the
  // arithmetic, the bytes each blocking level moves and the measured ceilings), or NaN where
  // the implementation has none. The autotuner ranks candidates by it.
  virtual double estimate_ms(const CallBase&, const Config&) const;
  virtual std::shared_ptr<const Prepared> prepare(const CallBase&, const Config&) const {
    return nullptr;
  }
  virtual void run(CallBase& call, const Config& config, const Prepared* prepared) const = 0;
};

// Output comparison tolerances: |out - ref| <= atol + rtol * |ref| elementwise, and the
// normwise relative error ||out - ref|| / ||ref|| <= normwise (0 = not checked).
struct Tolerance {
  double atol = 0, rtol = 0, normwise = 0;
};

// What a call must do at least, for benchmarks and roofline percentages.
struct CallCost {
  double flops = 0;       // useful arithmetic (a multiply-add is 2)
  double bytes = 0;       // the bytes it must move at least (ragged_dot: the weights it reads)
  bool bf16_dot = false;  // its arithmetic runs on the bf16 dot product (else the f32 FMA)
  // `bytes` counts bytes read plus bytes written: its ceiling is a streaming copy's (else a
  // streaming read's).
  bool read_write = false;
};

// Whether a call's time is the time to move its bytes: below about 8 flops a byte, these CPUs'
// arithmetic outruns their memory (the weight-streaming decode calls).
inline bool bandwidth_bound(const CallCost& c) { return c.bytes > 0 && c.flops / c.bytes < 8.0; }

struct ArgSpec {
  std::string family;
  std::string name;
  Json
      arguments;  // what BoundArguments::from_json expects under "arguments" (num_threads optional)
  std::vector<std::string> tags;
  bool has_tag(const std::string& t) const;
};

// Which implementation and config a call asks for.
struct CallOptions {
  std::string implementation;    // empty: the family's default order
  std::optional<Config> config;  // requires `implementation`
};

// The kinds of argument in an op's description.
enum class ArgKind { kArray, kOptionalArray, kInt, kBool, kReal, kOptionalReal, kEnum, kCustom };
std::string_view arg_kind_name(ArgKind kind);

// One output in an op's description. `shape` and `dtype` are expressions over the inputs (their
// .shape and .dtype) and statics by name, in the subset of Python that the bindings evaluate
// for shapes they cannot run (torch's fake tensors, jax's abstract values): `x.shape`,
// `x.shape[:-1] + (w.shape[-1],)`, `drop(x.shape, axis)`; a dtype is an input's (`x.dtype`) or a
// name (`float32`). `present`: the optional input whose presence the output follows (dscale
// and scale), else empty. `residual`: an output only return_residuals asks for.
struct OutputDoc {
  std::string name, doc, shape, dtype, present;
  bool residual = false;
};

class OpFamily {
 public:
  virtual ~OpFamily() = default;
  virtual std::string name() const = 0;
  // Default order (the first supported one serves). Does not include the reference.
  virtual std::vector<std::shared_ptr<const Implementation>> implementations() const = 0;
  virtual std::shared_ptr<const Implementation> reference() const = 0;
  // Validates and canonicalizes a JSON argument spec (fills num_threads if absent).
  virtual BoundArguments bind_json(const Json& arguments,
                                   const std::string& implementation) const = 0;
  // A call with seeded random inputs and freshly allocated outputs for `bound`.
  virtual std::unique_ptr<CallBase> make_call(const BoundArguments& bound, uint64_t seed) const = 0;
  virtual Tolerance tolerance(const CallBase& call) const = 0;
  virtual std::vector<ArgSpec> arg_specs() const { return {}; }
  // True when the call moves more bytes than it computes: the autotuner measures cold-cache.
  virtual bool memory_bound(const CallBase&) const { return false; }
  virtual CallCost cost(const CallBase&) const { return {}; }
  // Variants of a call that `tokamax bench` can measure as their own rows (IMPL:VARIANT): a
  // name and the arguments it sets over a spec's (ragged_dot: "packed", {"packed_rhs": true}).
  virtual std::vector<std::pair<std::string, Json>> argument_variants() const { return {}; }
  // The rows `tokamax bench` measures when none are named. Default: every implementation, the
  // default one's argument variants after it, and the reference on memory-bound calls (there
  // plain loops can rival a library).
  virtual std::vector<std::string> bench_rows(const CallBase& call) const;

  // What users see of the op, written once in the family: {"op", "doc", "arguments": [{"name",
  // "py_name", "kind", "default", "choices", "doc", "user", "keyword_only"}], "outputs":
  // [OutputDoc...], "vjp"
  // (the backward family's name, or null), "aliases": [{"name", "doc", "fixed": {...}}],
  // "residuals_flag" (the bool argument that asks for the residual outputs, or null)}.
  virtual Json description() const;
  // The generic call path (the Python module's): arrays by argument name (absent optional
  // ones left out), the other arguments as JSON by name (absent: their defaults); returns the
  // outputs in order. InvalidArgument for an unknown name or a missing array.
  virtual std::vector<Tensor> run_named(
      const std::vector<std::pair<std::string, TensorView>>& arrays, const Json& statics,
      const CallOptions& options) const;
  // The outputs' specs of an argument spec (as bind_json takes it).
  virtual std::vector<ShapeDtype> output_specs_json(const Json& arguments) const;
  // A key whose tuned config also serves `bound` where it has no entry of its own (a forward
  // asked for its residuals, or one on pre-packed weights, takes the plain call's), or nothing.
  virtual std::optional<BoundArguments> config_fallback(const BoundArguments&) const {
    return std::nullopt;
  }

  // Any implementation by name, including "reference". InvalidArgument listing the names.
  std::shared_ptr<const Implementation> implementation(const std::string& name) const;
  std::vector<std::string> implementation_names() const;  // default order, then "reference"
};

void register_family(std::shared_ptr<const OpFamily> family);
// InvalidArgument listing the known families.
const OpFamily& find_family(const std::string& name);
std::vector<std::shared_ptr<const OpFamily>> families();
std::vector<ArgSpec> find_arg_specs(const std::string& family, const std::string& name = "",
                                    const std::string& tag = "");

}  // namespace tokamax
TOKAMAX_PUBLIC_END
