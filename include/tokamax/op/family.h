// TypedFamily<CallT>: the op family base that families derive from. A family writes its call
// struct (a CallBase with typed inputs and statics), one description of its arguments
// (ArgFields: name, kind and JSON form of each), `bind` (validation and canonicalization, the only
// place shapes are checked), its output specs, tolerance, reference, implementations and arg
// specs. Everything every family would otherwise repeat is here, written once from that
// description: the JSON argument spec (bind_json) and its validation messages, calls with seeded
// random inputs (make_call), the key and its interning, num_threads, output allocation, the
// checked downcasts, the public call path (bind, allocate, dispatch), the op's description for
// the bindings (description: arguments with kinds, defaults, documentation, Python keywords;
// outputs with their shape rules) and the generic call path by argument name (run_named).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokamax/core/enum_names.h"
#include "tokamax/core/error.h"
#include "tokamax/core/export.h"
#include "tokamax/core/json.h"
#include "tokamax/core/limits.h"
#include "tokamax/core/strings.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/dispatch.h"
#include "tokamax/op/op.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// The call's signature as integers: every field appends what determines its key JSON, so equal
// signatures mean equal keys (and the key is built once per distinct signature).
using Signature = std::vector<int64_t>;

// One argument of a family's call. An input is an array: its key JSON is its ShapeDtype string,
// and make_call fills it with seeded values. A static is any other value in the key.
template <class CallT>
struct ArgField {
  std::string name;
  // Inputs only: the view an input lives in, or null when an optional input is absent (null
  // function for statics).
  std::function<TensorView*(CallT&)> input;
  // Inputs only: fills a made call's input (the call's other arguments are read from the spec,
  // so a fill can depend on them: sequence lengths within the sequence).
  std::function<void(const CallT&, const TensorView&, uint64_t seed)> fill;
  // Its key JSON, from a bound call.
  std::function<Json(const CallT&)> to_json;
  // Sets it on an unbound call from the spec's JSON (null when absent); InvalidArgument saying
  // what was expected (the caller adds the family and the argument's name).
  std::function<void(CallT&, const Json&)> from_json;
  // Appends what determines to_json (after bind) to the signature.
  std::function<void(const CallT&, Signature&)> sign;
  // A required input: absent from a spec is an error.
  bool required = false;
  // Inputs only: points the call at an array (the generic call path, run_named).
  std::function<void(CallT&, const TensorView&)> assign;

  // What users see of it: the op's description (OpFamily::description) drives the Python
  // functions and their signatures and docstrings, the stubs, the torch schemas and fake
  // implementations, and the backward family's fields; each default is the call struct's.
  ArgKind kind = ArgKind::kCustom;
  Json default_value;                // what an absent value means (null: none)
  std::vector<std::string> choices;  // an enumeration's names
  std::string doc;
  std::string py_name;        // the Python keyword where it differs from `name` (query for q)
  bool user = true;           // false: set by the library (packed flags, return_residuals)
  bool keyword_only = false;  // an array that Python takes by keyword only
  // A bool static that asks for the residual outputs (the backward's inputs): the same call
  // without it shares its tuned config (dispatch's config_fallback).
  bool selects_residuals = false;

  ArgField describe(std::string text) && {
    doc = std::move(text);
    return std::move(*this);
  }
  ArgField python(std::string keyword) && {
    py_name = std::move(keyword);
    return std::move(*this);
  }
  ArgField internal() && {
    user = false;
    return std::move(*this);
  }
  ArgField keyword() && {
    keyword_only = true;
    return std::move(*this);
  }
};

// Builders for the usual kinds of argument.
template <class CallT>
struct Args {
  using Field = ArgField<CallT>;

  using Fill = std::function<void(const CallT&, const TensorView&, uint64_t)>;
  // Standard normal values.
  static Fill randn() {
    return [](const CallT&, const TensorView& v, uint64_t seed) { fill_randn(v, seed); };
  }

  // A required array. The spec gives its ShapeDtype; a made call gets `fill`'s values.
  static Field input(std::string name, TensorView CallT::*member, Fill fill = randn()) {
    Field f = array(
        std::move(name), [member](CallT& c) { return &(c.*member); }, std::move(fill));
    f.required = true;
    f.kind = ArgKind::kArray;
    f.from_json = [member](CallT& c, const Json& j) { c.*member = view_of(j); };
    f.assign = [member](CallT& c, const TensorView& v) { c.*member = v; };
    return f;
  }

  // An optional array: absent (or null) in a spec, std::nullopt in the call, null in the key.
  static Field optional_input(std::string name, std::optional<TensorView> CallT::*member,
                              Fill fill = randn()) {
    Field f = array(
        std::move(name), [member](CallT& c) { return c.*member ? &*(c.*member) : nullptr; },
        std::move(fill));
    f.kind = ArgKind::kOptionalArray;
    f.from_json = [member](CallT& c, const Json& j) {
      if (j.is_null())
        c.*member = std::nullopt;
      else
        c.*member = view_of(j);
    };
    f.assign = [member](CallT& c, const TensorView& v) { c.*member = v; };
    return f;
  }

  // An optional real static (absent: std::nullopt, null in the key).
  static Field optional_real(std::string name, std::optional<double> CallT::*member) {
    Field f;
    f.name = std::move(name);
    f.kind = ArgKind::kOptionalReal;
    f.to_json = [member](const CallT& c) { return c.*member ? Json(*(c.*member)) : Json(); };
    f.from_json = [member](CallT& c, const Json& j) {
      if (j.is_null()) {
        c.*member = std::nullopt;
        return;
      }
      if (!j.is_number()) throw InvalidArgument("expected a number or null");
      c.*member = j.get<double>();
    };
    f.sign = [member](const CallT& c, Signature& sig) {
      sig.push_back(c.*member ? 1 : 0);
      double v = c.*member ? *(c.*member) : 0.0;
      int64_t bits;
      static_assert(sizeof(bits) == sizeof(v));
      std::memcpy(&bits, &v, sizeof(v));
      sig.push_back(bits);
    };
    return f;
  }

  // A real static; absent from a spec, the call struct's default.
  static Field real(std::string name, double CallT::*member) {
    const double fallback = CallT().*member;
    Field f;
    f.name = std::move(name);
    f.kind = ArgKind::kReal;
    f.default_value = fallback;
    f.to_json = [member](const CallT& c) { return Json(c.*member); };
    f.from_json = [member, fallback](CallT& c, const Json& j) {
      if (j.is_null()) {
        c.*member = fallback;
        return;
      }
      if (!j.is_number()) throw InvalidArgument("expected a number");
      c.*member = j.get<double>();
    };
    f.sign = [member](const CallT& c, Signature& sig) {
      int64_t bits;
      static_assert(sizeof(bits) == sizeof(double));
      std::memcpy(&bits, &(c.*member), sizeof(bits));
      sig.push_back(bits);
    };
    return f;
  }

  // An int or bool static; absent from a spec, the call struct's default.
  template <class T>
  static Field value(std::string name, T CallT::*member) {
    static_assert(std::is_integral_v<T>);
    const T fallback = CallT().*member;
    Field f;
    f.name = std::move(name);
    f.kind = std::is_same_v<T, bool> ? ArgKind::kBool : ArgKind::kInt;
    f.default_value = fallback;
    f.to_json = [member](const CallT& c) { return Json(c.*member); };
    f.from_json = [member, fallback](CallT& c, const Json& j) {
      if (j.is_null()) {
        c.*member = fallback;
      } else if constexpr (std::is_same_v<T, bool>) {
        if (!j.is_boolean()) throw InvalidArgument("expected true or false");
        c.*member = j.get<bool>();
      } else {
        if (!j.is_number_integer()) throw InvalidArgument("expected an integer");
        c.*member = j.get<T>();
      }
    };
    f.sign = [member](const CallT& c, Signature& sig) {
      sig.push_back(static_cast<int64_t>(c.*member));
    };
    return f;
  }

  // The bool static that asks for the residual outputs (internal: the public functions set it).
  static Field residuals_flag(bool CallT::*member) {
    Field f = value("return_residuals", member);
    f.selects_residuals = true;
    f.user = false;
    return f;
  }

  // An enum static named by its table; absent from a spec, the call struct's default.
  template <class E, size_t N>
  static Field enumeration(std::string name, E CallT::*member, const EnumNames<E, N>& names) {
    const E fallback = CallT().*member;
    Field f;
    f.name = std::move(name);
    f.kind = ArgKind::kEnum;
    f.default_value = std::string(names.name(fallback));
    for (const auto& entry : names.table) f.choices.emplace_back(entry.second);
    f.to_json = [member, &names](const CallT& c) { return Json(names.name(c.*member)); };
    f.from_json = [member, &names, fallback](CallT& c, const Json& j) {
      if (j.is_null()) {
        c.*member = fallback;
        return;
      }
      if (!j.is_string()) throw InvalidArgument("expected a name: " + names.expected());
      const std::string name = j.get<std::string>();
      for (const auto& [value, n] : names.table) {
        if (n == name) {
          c.*member = value;
          return;
        }
      }
      throw InvalidArgument("expected " + names.expected());
    };
    f.sign = [member](const CallT& c, Signature& sig) {
      sig.push_back(static_cast<int64_t>(c.*member));
    };
    return f;
  }

  // The parts every array shares.
  static Field array(std::string name, std::function<TensorView*(CallT&)> get, Fill fill) {
    Field f;
    f.name = std::move(name);
    f.input = get;
    f.fill = std::move(fill);
    f.to_json = [get](const CallT& c) {
      const TensorView* v = get(const_cast<CallT&>(c));
      return v ? Json(v->spec().str()) : Json();
    };
    f.sign = [get](const CallT& c, Signature& sig) {
      const TensorView* v = get(const_cast<CallT&>(c));
      if (!v) {
        sig.push_back(-1);
        return;
      }
      sig.push_back(static_cast<int64_t>(v->dtype()));
      sig.push_back(v->rank());
      sig.insert(sig.end(), v->shape().begin(), v->shape().end());
    };
    return f;
  }
  static TensorView view_of(const Json& j) {
    if (!j.is_string()) throw InvalidArgument("expected a ShapeDtype string like \"f32[8,128]\"");
    const ShapeDtype s = ShapeDtype::parse(j.get<std::string>());
    // A spec's arrays are allocated when it is benchmarked or tuned: bounded before that.
    if (s.shape.size() > static_cast<size_t>(kMaxSpecRank) || s.size() > kMaxSpecElements) {
      throw InvalidArgument(s.str() + " has " + std::to_string(s.shape.size()) +
                            " dimensions and " + std::to_string(s.size()) +
                            " elements; expected at most " + std::to_string(kMaxSpecRank) +
                            " and " + std::to_string(kMaxSpecElements));
    }
    return TensorView(nullptr, s.dtype, s.shape);
  }

  // Anything else: the three functions written out.
  static Field custom(std::string name, std::function<Json(const CallT&)> to_json,
                      std::function<void(CallT&, const Json&)> from_json,
                      std::function<void(const CallT&, Signature&)> sign) {
    Field f;
    f.name = std::move(name);
    f.to_json = std::move(to_json);
    f.from_json = std::move(from_json);
    f.sign = std::move(sign);
    return f;
  }
};

template <class CallT>
class TypedFamily : public OpFamily {
 public:
  using Call = CallT;

  TypedFamily(std::string name, std::vector<ArgField<CallT>> fields,
              std::shared_ptr<const Implementation> reference,
              std::vector<std::shared_ptr<const Implementation>> implementations)
      : name_(std::move(name)),
        fields_(std::move(fields)),
        reference_(std::move(reference)),
        impls_(std::move(implementations)) {}

  // --- What a family writes. ---

  // Validates the call's inputs and statics (input data may be null: specs bind too) and fills
  // what follows from them. Throws InvalidArgument naming the argument, its shape and what was
  // expected. The only place shapes are checked.
  virtual void bind(CallT& call) const = 0;
  // The outputs' shapes and dtypes of a bound call.
  virtual std::vector<ShapeDtype> output_specs(const CallT& call) const = 0;
  virtual Tolerance tolerance_of(const CallT& call) const = 0;
  virtual bool memory_bound_of(const CallT&) const { return false; }
  virtual CallCost cost_of(const CallT&) const { return {}; }
  virtual std::vector<std::string> bench_rows_of(const CallT& call) const {
    return OpFamily::bench_rows(call);
  }
  // Whether input `name` of a call may lack data because the call holds it in another form
  // (weights packed ahead: the view then only carries their logical shape).
  virtual bool data_held_elsewhere(const CallT&, const std::string& /*name*/) const {
    return false;
  }
  // A made call after its inputs are filled and it is bound (ragged_dot packs the weights of a
  // packed_rhs spec here, as a program does at load time).
  virtual void finish_made_call(CallT&) const {}

  // The description's parts beside the arguments (OpFamily::description): what the op
  // computes, its outputs, its backward family and the Python aliases that fix some arguments
  // (rms_norm: layer_norm with subtract_mean false and no offset).
  virtual std::string summary() const { return ""; }
  virtual std::vector<OutputDoc> output_docs() const { return {}; }
  virtual std::string vjp_name() const { return ""; }
  virtual Json aliases() const { return Json::array(); }

  // --- Written once here. ---

  std::string name() const final { return name_; }
  std::vector<std::shared_ptr<const Implementation>> implementations() const final {
    return impls_;
  }
  std::shared_ptr<const Implementation> reference() const final { return reference_; }
  const std::vector<ArgField<CallT>>& fields() const { return fields_; }

  // bind_and_key, then refuses inputs without data: bind accepts them (specs bind too), a call
  // needs them, and a null pointer from the caller is refused here rather than read by a kernel.
  void bind_and_checked(CallT& call) const {
    bind_and_key(call);
    for (const ArgField<CallT>& f : fields_) {
      const TensorView* v = f.input ? f.input(call) : nullptr;
      if (v && v->data() == nullptr && v->size() > 0 && !data_held_elsewhere(call, f.name)) {
        throw InvalidArgument(name_ + ": '" + f.name + "' " + v->spec().str() +
                              " has a null data pointer; expected the array's elements");
      }
    }
  }

  // Whether two views' byte ranges (first to last element) intersect.
  static bool overlaps(const TensorView& a, const TensorView& b) {
    if (a.size() == 0 || b.size() == 0 || !a.data() || !b.data()) return false;
    auto range = [](const TensorView& t) {
      int64_t last = 0;
      for (int64_t d = 0; d < t.rank(); ++d) last += (t.dim(d) - 1) * t.strides()[d];
      const auto* p = static_cast<const char*>(t.data());
      return std::pair{p, p + (last + 1) * static_cast<int64_t>(dtype_size(t.dtype()))};
    };
    const auto [a0, a1] = range(a);
    const auto [b0, b1] = range(b);
    return a0 < b1 && b0 < a1;
  }

  // Binds the call (num_threads 0 = the library's num_threads()) and gives it its key.
  void bind_and_key(CallT& call) const {
    if (call.num_threads <= 0) call.num_threads = tokamax::num_threads();
    bind(call);
    call.bound = key(call);
  }

  // The public call path: bind, allocate the outputs, dispatch; returns the outputs.
  std::vector<Tensor> run(CallT& call, const CallOptions& options) const {
    bind_and_checked(call);
    std::vector<Tensor> out;
    call.outputs.clear();
    for (const ShapeDtype& s : output_specs(call)) {
      out.emplace_back(s.shape, s.dtype);
      call.outputs.push_back(out.back().view());
    }
    dispatch(*this, call, options);
    return out;
  }

  // The same into the caller's buffers (the out-variants): each must have its output's exact
  // shape and dtype, be contiguous and overlap no input, else InvalidArgument naming it.
  void run_into(CallT& call, const CallOptions& options,
                const std::vector<std::pair<std::string, TensorView>>& outputs) const {
    bind_and_checked(call);
    const std::vector<ShapeDtype> specs = output_specs(call);
    if (outputs.size() != specs.size()) {
      throw InvalidArgument(name_ + ": " + std::to_string(outputs.size()) + " output buffers; " +
                            "expected " + std::to_string(specs.size()));
    }
    call.outputs.clear();
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& [out_name, v] = outputs[i];
      if (v.spec() != specs[i] || !v.is_contiguous() || (v.data() == nullptr && v.size() > 0)) {
        throw InvalidArgument(name_ + ": output '" + out_name + "' has spec " + v.spec().str() +
                              (v.is_contiguous() ? "" : " (not contiguous)") +
                              "; expected a contiguous " + specs[i].str() + " buffer");
      }
      for (const ArgField<CallT>& f : fields_) {
        const TensorView* in = f.input ? f.input(call) : nullptr;
        if (in && overlaps(*in, v)) {
          throw InvalidArgument(name_ + ": output '" + out_name + "' overlaps input '" + f.name +
                                "'; expected a buffer of its own");
        }
      }
      call.outputs.push_back(v);
    }
    dispatch(*this, call, options);
  }

  Json description() const final {
    Json args = Json::array(), flag;
    for (const ArgField<CallT>& f : fields_) {
      if (f.selects_residuals) flag = f.name;
      args.push_back({{"name", f.name},
                      {"py_name", f.py_name.empty() ? f.name : f.py_name},
                      {"kind", arg_kind_name(f.kind)},
                      {"default", f.default_value},
                      {"choices", f.choices},
                      {"doc", f.doc},
                      {"user", f.user && !f.selects_residuals},
                      {"keyword_only", f.keyword_only}});
    }
    Json outs = Json::array();
    for (const OutputDoc& o : output_docs()) {
      outs.push_back({{"name", o.name},
                      {"doc", o.doc},
                      {"shape", o.shape},
                      {"dtype", o.dtype},
                      {"present", o.present.empty() ? Json() : Json(o.present)},
                      {"residual", o.residual}});
    }
    const std::string vjp = vjp_name();
    return {{"op", name_},
            {"doc", summary()},
            {"arguments", args},
            {"outputs", outs},
            {"vjp", vjp.empty() ? Json() : Json(vjp)},
            {"aliases", aliases()},
            {"residuals_flag", flag}};
  }

  std::vector<Tensor> run_named(const std::vector<std::pair<std::string, TensorView>>& arrays,
                                const Json& statics, const CallOptions& options) const final {
    if (!statics.is_object() && !statics.is_null())
      throw InvalidArgument(name_ + ": the statics are " + canonical_dump(statics) +
                            "; expected a JSON object");
    CallT call;
    call.num_threads = 0;  // the library's num_threads()
    for (size_t i = 0; i < arrays.size(); ++i) {
      const std::string& k = arrays[i].first;
      const ArgField<CallT>* f = field(k);
      if (!f || !f->assign) {
        throw InvalidArgument(name_ + ": unknown array argument '" + k + "'; expected " +
                              join(array_names(), ", "));
      }
      for (size_t j = 0; j < i; ++j)
        if (arrays[j].first == k) throw InvalidArgument(name_ + ": array '" + k + "' given twice");
    }
    if (statics.is_object()) {
      for (const auto& [k, v] : statics.items()) {
        if (k == "num_threads") {
          call.num_threads = checked_num_threads(v);
          continue;
        }
        const ArgField<CallT>* f = field(k);
        if (!f)
          throw InvalidArgument(name_ + ": unknown argument '" + k + "'; expected " +
                                join(field_names(), ", "));
        if (f->assign)
          throw InvalidArgument(name_ + ": '" + k + "' is an array; pass it among the arrays");
        if (!f->user && !f->selects_residuals)
          throw InvalidArgument(name_ + ": '" + k + "' is set by the library, not by a caller");
      }
    }
    for (const ArgField<CallT>& f : fields_) {
      if (f.assign) {
        const auto it = std::find_if(arrays.begin(), arrays.end(),
                                     [&](const auto& a) { return a.first == f.name; });
        if (it != arrays.end()) {
          f.assign(call, it->second);
        } else if (f.required) {
          throw InvalidArgument(name_ + ": missing array argument '" + f.name + "'");
        }
        continue;
      }
      const Json* j = &null_json();
      if (statics.is_object()) {
        if (const auto it = statics.find(f.name); it != statics.end()) j = &*it;
      }
      try {
        f.from_json(call, *j);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(name_ + ": " + f.name + " = " + canonical_dump(*j) + "; " +
                              e.message());
      }
    }
    return run(call, options);
  }

  std::vector<ShapeDtype> output_specs_json(const Json& arguments) const final {
    CallT call = call_from_json(arguments);
    bind_and_key(call);
    return output_specs(call);
  }

  // The same call with every residuals flag and argument variant (packed weights: the same
  // products on the same config space) set back to its default, when any was set.
  std::optional<BoundArguments> config_fallback(const BoundArguments& bound) const final {
    Json plain = bound.arguments();
    bool changed = false;
    const auto reset = [&](const ArgField<CallT>& f, const Json& set_value) {
      const auto it = plain.find(f.name);
      if (it == plain.end() || *it != set_value) return;
      *it = f.default_value.is_null() ? Json(false) : f.default_value;
      changed = true;
    };
    const auto variants = this->argument_variants();
    for (const ArgField<CallT>& f : fields_) {
      if (f.selects_residuals) reset(f, Json(true));
      for (const auto& variant : variants) {
        if (const auto v = variant.second.find(f.name); v != variant.second.end()) reset(f, *v);
      }
    }
    if (!changed) return std::nullopt;
    return BoundArguments(bound.family(), bound.implementation(), std::move(plain));
  }

  BoundArguments bind_json(const Json& arguments, const std::string& implementation) const final {
    CallT call = call_from_json(arguments);
    bind_and_key(call);
    return call.bound.with_implementation(implementation);
  }

  std::unique_ptr<CallBase> make_call(const BoundArguments& bound, uint64_t seed) const final {
    // A made call's preparation (a backward's residuals come from running its forward) is not
    // the call being tuned or measured: it takes heuristics configs, with no lookup and no
    // cache-miss warning for keys nobody asked about.
    ConfigSourceScope heuristics_only(ConfigSource::kHeuristics);
    auto call = std::make_unique<CallT>(call_from_json(bound.arguments()));
    uint64_t input_seed = seed;
    for (const ArgField<CallT>& f : fields_) {
      if (!f.input) continue;
      const uint64_t field_seed = input_seed++;  // seeds by position, present or not
      TensorView* v = f.input(*call);
      if (!v) continue;
      call->owned.emplace_back(v->shape(), v->dtype());
      *v = call->owned.back().view();
      f.fill(*call, *v, field_seed);
    }
    bind_and_key(*call);
    finish_made_call(*call);
    call->bound = bound;
    for (const ShapeDtype& s : output_specs(*call)) {
      call->owned.emplace_back(s.shape, s.dtype);
      call->outputs.push_back(call->owned.back().view());
    }
    return call;
  }

  Tolerance tolerance(const CallBase& call) const final {
    return tolerance_of(call_as<CallT>(call));
  }
  bool memory_bound(const CallBase& call) const final {
    return memory_bound_of(call_as<CallT>(call));
  }
  CallCost cost(const CallBase& call) const final { return cost_of(call_as<CallT>(call)); }
  std::vector<std::string> bench_rows(const CallBase& call) const final {
    return bench_rows_of(call_as<CallT>(call));
  }

 private:
  // An unbound call from an argument spec: every field read (absent ones as null), unknown
  // names refused.
  CallT call_from_json(const Json& arguments) const {
    auto bad = [&](const std::string& what) {
      return InvalidArgument(name_ + " arguments: " + what);
    };
    if (!arguments.is_object())
      throw bad("expected a JSON object, got " + canonical_dump(arguments));
    CallT call;
    for (const ArgField<CallT>& f : fields_) {
      const auto it = arguments.find(f.name);
      const Json& j = it == arguments.end() ? null_json() : *it;
      if (f.required && j.is_null()) throw bad("missing '" + f.name + "'");
      try {
        f.from_json(call, j);
      } catch (const InvalidArgument& e) {
        throw bad("'" + f.name + "' = " + canonical_dump(j) + ": " + e.message());
      }
    }
    call.num_threads = 0;
    if (const auto it = arguments.find("num_threads"); it != arguments.end()) {
      try {
        call.num_threads = checked_num_threads(*it);
      } catch (const InvalidArgument& e) {
        throw bad(e.message());
      }
    }
    for (const auto& [k, v] : arguments.items()) {
      if (k == "num_threads") continue;
      bool known = false;
      for (const ArgField<CallT>& f : fields_) known = known || f.name == k;
      if (!known) throw bad("unknown argument '" + k + "'; expected " + join(field_names(), ", "));
    }
    return call;
  }

  static int checked_num_threads(const Json& j) {
    if (!j.is_number_integer() || j.template get<int64_t>() <= 0 ||
        j.template get<int64_t>() > kMaxThreads) {
      throw InvalidArgument("num_threads = " + canonical_dump(j) + "; expected an integer in [1, " +
                            std::to_string(kMaxThreads) + "]");
    }
    return j.template get<int>();
  }

  const ArgField<CallT>* field(const std::string& name) const {
    for (const ArgField<CallT>& f : fields_)
      if (f.name == name) return &f;
    return nullptr;
  }

  std::vector<std::string> array_names() const {
    std::vector<std::string> out;
    for (const ArgField<CallT>& f : fields_)
      if (f.assign) out.push_back(f.name);
    return out;
  }

  std::vector<std::string> field_names() const {
    std::vector<std::string> out;
    for (const ArgField<CallT>& f : fields_) out.push_back(f.name);
    out.push_back("num_threads");
    return out;
  }

  static const Json& null_json() {
    static const Json j;
    return j;
  }

  struct SignatureHash {
    size_t operator()(const Signature& s) const { return static_cast<size_t>(hash64(s)); }
  };

  // Building the canonical key JSON costs microseconds; calls repeat a few shapes, so keys are
  // interned by the call's signature.
  BoundArguments key(const CallT& call) const {
    thread_local Signature sig;
    sig.clear();
    for (const ArgField<CallT>& f : fields_) f.sign(call, sig);
    sig.push_back(call.num_threads);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = keys_.find(sig);
      if (it != keys_.end()) return it->second;
    }
    Json arguments = Json::object();
    for (const ArgField<CallT>& f : fields_) arguments[f.name] = f.to_json(call);
    arguments["num_threads"] = call.num_threads;
    BoundArguments b(name_, "", std::move(arguments));
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_.size() > 100000) keys_.clear();  // bounds memory for programs with endless shapes
    return keys_.emplace(sig, b).first->second;
  }

  std::string name_;
  std::vector<ArgField<CallT>> fields_;
  std::shared_ptr<const Implementation> reference_;
  std::vector<std::shared_ptr<const Implementation>> impls_;
  mutable std::mutex mu_;
  mutable std::unordered_map<Signature, BoundArguments, SignatureHash> keys_;
};

// A family's one instance for the process (the registry and the public functions share it).
template <class F>
const F& family_instance() {
  static const F f;
  return f;
}

}  // namespace tokamax
TOKAMAX_PUBLIC_END
