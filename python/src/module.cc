// tokamax_cpp._core: the nanobind module behind the Python package (python/tokamax_cpp): the
// options' conversions and the bindings (arrays cross the boundary as arrays.h says). Most
// ops are bound once, generically, from their descriptions (bind_described_ops); ragged_dot
// and the GLU keep functions of their own for their packed weights and argument forms. Kernels
// run with the GIL released. C++ errors become ValueError (InvalidArgument),
// NotImplementedError (Unsupported) and CacheMissError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "arrays.h"
#include "tokamax/tokamax.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tokamax {
namespace {

using namespace py;  // NOLINT: the array conversions (arrays.h) are this module's own

PyObject* g_cache_miss_error = nullptr;

// --- options -------------------------------------------------------------------------------

std::optional<std::string> name_of(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  if (nb::isinstance<nb::str>(h)) return nb::cast<std::string>(h);
  if (nb::hasattr(h, "name") && nb::isinstance<nb::str>(h.attr("name")))
    return nb::cast<std::string>(h.attr("name"));  // numpy dtypes, jax.lax.Precision
  if (nb::hasattr(h, "__name__")) return nb::cast<std::string>(h.attr("__name__"));  // jnp types
  return py_str(h);                                                                  // torch
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<DType> dtype_arg(nb::handle h, const char* what) {
  std::optional<std::string> n = name_of(h);
  if (!n) return std::nullopt;
  std::string s = lower(*n);
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float32" || s == "f32") return DType::kF32;
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  throw InvalidArgument(std::string(what) + " is '" + *n + "'; expected float32 or bfloat16");
}

Precision precision_arg(nb::handle h) {
  std::optional<std::string> n = name_of(h);
  if (!n) return Precision::kDefault;
  const std::string s = lower(*n);
  if (s == "default") return Precision::kDefault;
  if (s == "highest" || s == "float32") return Precision::kHighest;
  throw InvalidArgument("precision is '" + *n + "'; expected None, 'default' or 'highest'");
}

Activation activation_arg(nb::handle h, Activation none) {
  std::optional<std::string> n = name_of(h);
  if (!n) return none;
  std::string s = lower(*n);
  if (s == "swish") s = "silu";
  return parse_activation(s);
}

// implementation and config, as the C++ options take them. A config (a dict or its JSON text)
// needs its implementation, which decodes and validates it.
struct Choice {
  std::string implementation;
  std::optional<Config> config;
};

Choice choice(const char* family, nb::handle implementation, nb::handle config) {
  Choice c;
  if (!implementation.is_none()) {
    if (!nb::isinstance<nb::str>(implementation)) {
      std::string names;
      for (const std::string& n : find_family(family).implementation_names())
        names += (names.empty() ? "" : ", ") + ("'" + n + "'");
      throw nb::type_error((std::string(family) + ": implementation is " + py_str(implementation) +
                            " (" + py_type_name(implementation) + "); expected None or one of " +
                            names)
                               .c_str());
    }
    c.implementation = nb::cast<std::string>(implementation);
  }
  if (config.is_none()) return c;
  if (c.implementation.empty()) {
    throw InvalidArgument(std::string(family) + ": a config needs the implementation it is for");
  }
  const std::string text =
      nb::isinstance<nb::str>(config)
          ? nb::cast<std::string>(config)
          : nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(config));
  c.config = find_family(family)
                 .implementation(c.implementation)
                 ->config_from_json(parse_json(text, "config"));
  return c;
}

// A (w_gate, w_up) pair given as a tuple or list; anything but two items is a ValueError.
std::pair<nb::object, nb::object> weight_pair(const char* op, nb::handle weights) {
  if (nb::len(weights) != 2) {
    throw InvalidArgument(std::string(op) + ": weights is a sequence of " +
                          std::to_string(nb::len(weights)) +
                          " items; expected fused [K,2,N] weights or a (w_gate, w_up) pair");
  }
  return {nb::borrow(weights[0]), nb::borrow(weights[1])};
}

// Sets an op's options' implementation and config (every family's options have both).
template <class Options>
void set_choice(Options& o, const char* family, nb::handle implementation, nb::handle config) {
  Choice c = choice(family, implementation, config);
  o.implementation = std::move(c.implementation);
  o.config = std::move(c.config);
}

nb::object json_to_py(const Json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump());
}

Json py_to_json(nb::handle h) {
  // parse_json: bounded nesting, errors naming the source and the byte position.
  if (nb::isinstance<nb::str>(h)) return parse_json(nb::cast<std::string>(h), "bound arguments");
  return parse_json(nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(h)),
                    "bound arguments");
}

// Runs `fn` with the GIL released and, when asked, with heuristics as the only config source.
template <class Fn>
auto run(bool heuristics_only, Fn&& fn) {
  nb::gil_scoped_release unlocked;
  ConfigSourceScope source(heuristics_only ? ConfigSource::kHeuristics : config_source());
  return fn();
}

// --- autotuning ----------------------------------------------------------------------------

// AutotuningResult plus the scopes `with result:` entered on it (a stack: the same result may be
// entered again inside itself, or on several threads). A scope applies to the thread that
// entered it; `__exit__` closes the innermost one that thread entered, or, where it entered none
// (a generator resumed on another thread), the innermost of all.
struct PyResult {
  AutotuningResult result;
  std::vector<std::pair<std::thread::id, std::unique_ptr<AutotuningScope>>> scopes;
  PyResult() = default;
  explicit PyResult(AutotuningResult r) : result(std::move(r)) {}
  PyResult(const PyResult& other) : result(other.result) {}  // a copy enters no scope
  PyResult(PyResult&&) = default;
};

AutotuneOptions autotune_options(bool ignore_cache, bool all_implementations,
                                 std::optional<double> budget_s,
                                 std::optional<double> measure_budget_s,
                                 std::optional<int> max_candidates, uint64_t seed) {
  AutotuneOptions o;
  o.ignore_cache = ignore_cache;
  o.all_implementations = all_implementations;
  if (budget_s) o.budget_s = *budget_s;
  if (measure_budget_s) o.fix_measure_budget(*measure_budget_s);
  if (max_candidates) o.max_candidates = *max_candidates;
  o.seed = seed;
  o.validate();
  return o;
}

nb::list bound_list(const std::vector<BoundArguments>& v) {
  nb::list l;
  for (const auto& b : v) l.append(nb::cast(b));
  return l;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.message().c_str());
  } catch (const Unsupported& e) {
    PyErr_SetString(PyExc_NotImplementedError, e.message().c_str());
  } catch (const CacheMiss& e) {
    PyErr_SetString(g_cache_miss_error, e.message().c_str());
  } catch (const StoreError& e) {
    PyErr_SetString(PyExc_ConnectionError, e.message().c_str());
  } catch (const Json::exception& e) {
    PyErr_SetString(PyExc_ValueError, (std::string("malformed JSON: ") + e.what()).c_str());
  } catch (const std::bad_cast&) {
    // nanobind's cast_error: every argument is checked where it is converted, with its name;
    // should one still slip through, a TypeError rather than "RuntimeError: std::bad_cast".
    PyErr_SetString(PyExc_TypeError,
                    "tokamax_cpp: an argument has a type the call cannot convert (see the "
                    "function's signature for the accepted types)");
  }
}

// --- the generic call path: any family, by its description ---------------------------------

// A static argument's JSON from its Python value: None, bool, int, float, str and sequences of
// them (local_window_size), converted directly (json.dumps costs microseconds a call).
Json static_json(nb::handle h, const std::string& op, const std::string& name, int depth = 0) {
  if (h.is_none()) return Json();
  if (PyBool_Check(h.ptr())) return Json(h.ptr() == Py_True);
  if (PyLong_Check(h.ptr())) {
    const long long v = PyLong_AsLongLong(h.ptr());
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      throw InvalidArgument(op + ": " + name + " = " + py_str(h) + " does not fit in 64 bits");
    }
    return Json(static_cast<int64_t>(v));
  }
  if (PyFloat_Check(h.ptr())) return Json(PyFloat_AsDouble(h.ptr()));
  if (nb::isinstance<nb::str>(h)) return Json(nb::cast<std::string>(h));
  if (depth == 0 && (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h))) {
    Json a = Json::array();
    for (nb::handle v : h) a.push_back(static_json(v, op, name, depth + 1));
    return a;
  }
  // numpy scalars (np.float32, np.int64, np.bool_): 0-dimensional, by their dtype's kind.
  if (nb::hasattr(h, "dtype") && nb::hasattr(h.attr("dtype"), "kind") && nb::hasattr(h, "ndim") &&
      nb::hasattr(h, "item") && nb::isinstance<nb::int_>(h.attr("ndim")) &&
      nb::cast<int64_t>(h.attr("ndim")) == 0) {
    const std::string kind = py_str(h.attr("dtype").attr("kind"));
    if (kind == "b" || kind == "i" || kind == "u" || kind == "f")
      return static_json(h.attr("item")(), op, name, depth);
  }
  if (PyIndex_Check(h.ptr())) {  // other integer types (__index__)
    nb::object i = nb::steal(PyNumber_Index(h.ptr()));
    if (!i.is_valid()) {
      PyErr_Clear();
      throw InvalidArgument(op + ": " + name + " = " + py_str(h) + " is not an integer");
    }
    return static_json(i, op, name, depth);
  }
  throw InvalidArgument(op + ": " + name + " is a " + py_type_name(h) +
                        "; expected None, a bool, a number or a string");
}

void bind_described_ops(nb::module_& m) {
  m.def(
      "op_names",
      [] {
        std::vector<std::string> out;
        for (const auto& f : families()) out.push_back(f->name());
        return out;
      },
      "The names of every op family, backward families included.");
  m.def(
      "describe", [](const std::string& op) { return json_to_py(find_family(op).description()); },
      "op"_a, "An op's description: its arguments, outputs, backward and aliases (a dict).");
  m.def(
      "output_specs",
      [](const std::string& op, nb::handle arguments) {
        nb::list out;
        for (const ShapeDtype& s : find_family(op).output_specs_json(py_to_json(arguments))) {
          nb::list shape;
          for (int64_t d : s.shape) shape.append(d);
          out.append(nb::make_tuple(nb::tuple(shape), dtype_name(s.dtype)));
        }
        return out;
      },
      "op"_a, "arguments"_a,
      "The outputs' (shape, dtype) of an argument spec (as `tokamax specs` prints them).");
  m.def(
      "call",
      [](const std::string& op, nb::list arrays, nb::dict statics, nb::handle implementation,
         nb::handle config, bool heuristics_only) {
        const OpFamily& family = find_family(op);
        ArrayArgs args(op.c_str());
        std::vector<std::pair<std::string, TensorView>> views;
        for (nb::handle item : arrays) {
          // (name, the Python keyword that messages use, the array)
          const auto [name, label, value] =
              nb::cast<std::tuple<std::string, std::string, nb::object>>(item);
          views.emplace_back(name, args.add(value, label.c_str()));
        }
        Json st = Json::object();
        for (const auto& [k, v] : statics) {
          const std::string name = nb::cast<std::string>(k);
          st[name] = static_json(v, op, name);
        }
        Choice c = choice(op.c_str(), implementation, config);
        std::vector<Tensor> outs = run(heuristics_only, [&] {
          return family.run_named(views, st, CallOptions{c.implementation, c.config});
        });
        nb::list out;
        for (Tensor& t : outs) out.append(wrap(std::move(t), args.torch()));
        return nb::tuple(out);
      },
      "op"_a, "arrays"_a, "statics"_a, "implementation"_a.none() = nb::none(),
      "config"_a.none() = nb::none(), "heuristics_only"_a = false,
      "Runs op on arrays ((name, keyword, array) triples) and statics (a dict) named as in its "
      "description; returns every output. The package's typed functions are built on this.");
  m.def(
      "arg_specs",
      [](std::optional<std::string> op, std::optional<std::string> tag) {
        nb::list out;
        for (const ArgSpec& s : find_arg_specs(op.value_or(""), "", tag.value_or(""))) {
          nb::dict d;
          d["op"] = s.family;
          d["name"] = s.name;
          d["arguments"] = json_to_py(s.arguments);
          d["tags"] = s.tags;
          out.append(d);
        }
        return out;
      },
      "op"_a.none() = nb::none(), "tag"_a.none() = nb::none(),
      "The named workloads (tokamax specs) of op (None: every op's) with tag (None: any).");
  m.def(
      "implementation_names",
      [](const std::string& op) { return find_family(op).implementation_names(); }, "op"_a,
      "An op's implementations in their default order, then the reference.");
}

// ragged_dot's options from the Python keywords.
RaggedDotOptions ragged_options(nb::handle preferred, nb::handle activation, nb::handle precision,
                                nb::handle implementation, nb::handle config,
                                nb::handle representative) {
  RaggedDotOptions o;
  o.preferred_element_type = dtype_arg(preferred, "preferred_element_type");
  o.activation = activation_arg(activation, RaggedDotOptions().activation);
  o.precision = precision_arg(precision);
  set_choice(o, "ragged_dot", implementation, config);
  if (!representative.is_none()) {
    ArrayArgs a("ragged_dot");
    o.representative_group_sizes = group_sizes_of(a, representative);
  }
  return o;
}

// The gated linear unit's options from the Python keywords.
GluOptions glu_options(nb::handle activation, nb::handle implementation, nb::handle config) {
  GluOptions o;
  o.activation = activation_arg(activation, GluOptions().activation);
  set_choice(o, "gated_linear_unit", implementation, config);
  return o;
}

// PackedRhs and pack_rhs.
void bind_packed_rhs(nb::module_& m) {
  // --- ragged_dot ---
  nb::class_<PackedRhs>(m, "PackedRhs",
                        "Weights packed once for the native kernel (pack_rhs); immutable.")
      .def_prop_ro("shape",
                   [](const PackedRhs& p) {
                     nb::list l;
                     for (int64_t d : p.logical().shape) l.append(d);
                     return nb::tuple(l);
                   })
      .def_prop_ro("dtype", [](const PackedRhs& p) { return dtype_name(p.logical().dtype); })
      .def_prop_ro("dim_nums", [](const PackedRhs& p) { return dim_nums_name(p.dim_nums()); })
      .def_prop_ro("bf16_dot", &PackedRhs::bf16_dot)
      .def("__repr__", [](const PackedRhs& p) {
        return "PackedRhs(" + p.logical().str() + ", " + std::string(dim_nums_name(p.dim_nums())) +
               ")";
      });

  m.def(
      "pack_rhs",
      [](nb::handle rhs, std::string dim_nums, nb::handle precision) {
        ArrayArgs args("pack_rhs");
        const TensorView r = args.add(rhs, "rhs");
        const RaggedDimNums d = parse_dim_nums(dim_nums);
        const Precision p = precision_arg(precision);
        return run(false, [&] { return pack_rhs(r, d, p); });
      },
      "rhs"_a.none(), "dim_nums"_a = "forward", "precision"_a.none() = nb::none());
}

// PackedMoeWeights, pack_moe_weights and moe_experts_packed: the experts' weights packed once
// (a model's load time), then every call reads the packed panels.
void bind_moe_weights(nb::module_& m) {
  nb::class_<PackedMoeWeights>(
      m, "PackedMoeWeights",
      "An MoE layer's expert weights (gate-up and down) packed once for the native kernels "
      "(pack_moe_weights); immutable, shared between calls and threads.")
      .def_prop_ro("experts",
                   [](const PackedMoeWeights& w) { return w.gate_up.logical().shape[0]; })
      .def_prop_ro("dtype",
                   [](const PackedMoeWeights& w) { return dtype_name(w.gate_up.logical().dtype); })
      .def_prop_ro("transposed_weights",
                   [](const PackedMoeWeights& w) {
                     return w.gate_up.dim_nums() == RaggedDimNums::kTransposedRhs;
                   })
      .def("__repr__", [](const PackedMoeWeights& w) {
        return "PackedMoeWeights(gate_up " + w.gate_up.logical().str() + ", down " +
               w.down.logical().str() + ", " + std::string(dim_nums_name(w.gate_up.dim_nums())) +
               ")";
      });
  m.def(
      "pack_moe_weights",
      [](nb::handle w_gate_up, nb::handle w_down, bool transposed_weights) {
        ArrayArgs args("pack_moe_weights");
        const TensorView gu = args.add(w_gate_up, "w_gate_up");
        const TensorView dn = args.add(w_down, "w_down");
        return run(false, [&] { return pack_moe_weights(gu, dn, transposed_weights); });
      },
      "w_gate_up"_a.none(), "w_down"_a.none(), "transposed_weights"_a = false,
      "Packs an MoE layer's expert weights once for moe_experts_packed: w_gate_up [E, K, 2N] "
      "and w_down [E, N, K] (with transposed_weights, transformers' [E, 2N, K] and [E, K, N]).");
  m.def(
      "moe_experts_packed",
      [](nb::handle hidden, nb::handle top_k_index, nb::handle top_k_weights,
         const PackedMoeWeights& weights, nb::handle activation, nb::handle implementation,
         nb::handle config, bool heuristics_only) -> nb::object {
        ArrayArgs args("moe_experts");
        const TensorView h = args.add(hidden, "hidden");
        const TensorView idx = args.add(top_k_index, "top_k_index");
        const TensorView w = args.add(top_k_weights, "top_k_weights");
        MoeExpertsOptions o;
        o.activation = activation_arg(activation, o.activation);
        set_choice(o, "moe_experts", implementation, config);
        Tensor t = run(heuristics_only, [&] { return moe_experts(h, idx, w, weights, o); });
        return wrap(std::move(t), args.torch());
      },
      "hidden"_a.none(), "top_k_index"_a.none(), "top_k_weights"_a.none(), "weights"_a,
      nb::kw_only(), "activation"_a.none() = nb::none(), "implementation"_a.none() = nb::none(),
      "config"_a.none() = nb::none(), "heuristics_only"_a = false,
      "moe_experts with the weights packed by pack_moe_weights (the native implementation): "
      "hidden [T, K], top_k_index [T, k], top_k_weights [T, k] -> [T, K] in hidden's dtype.");
}

// QuantizedTensor (Python: QuantizedWeights), quantize, dequantize.
nb::object copy_out(const Tensor& t) { return wrap(t.clone(), false); }

// A contiguous array's copy (the weights keep theirs: the caller's buffer may change).
Tensor copy_of(const TensorView& v) {
  Tensor t(v.shape(), v.dtype());
  if (v.size() > 0)
    std::memcpy(t.data(), v.data(), static_cast<size_t>(v.size()) * dtype_size(v.dtype()));
  return t;
}

void bind_quantized(nb::module_& m) {
  nb::class_<QuantizedTensor>(
      m, "QuantizedWeights",
      "Expert weights [G, K, N] quantized along K in the kernels' panel layout "
      "(docs/quantized.md); made by quantize() or QuantizedWeights.from_parts(); immutable. "
      "ragged_dot(lhs, q, group_sizes) reads them.")
      .def_prop_ro("shape",
                   [](const QuantizedTensor& q) { return nb::make_tuple(q.groups, q.k, q.n); })
      .def_prop_ro(
          "format",
          [](const QuantizedTensor& q) { return std::string(quant_format_name(q.format)); })
      .def_prop_ro("group_size", [](const QuantizedTensor& q) { return q.group_size; })
      .def_prop_ro("asymmetric", [](const QuantizedTensor& q) { return q.asymmetric; })
      .def_prop_ro("nbytes", &QuantizedTensor::bytes)
      .def_prop_ro(
          "values", [](const QuantizedTensor& q) { return copy_out(q.values); },
          "a copy of the packed values (numpy)")
      .def_prop_ro(
          "scales", [](const QuantizedTensor& q) { return copy_out(q.scales); },
          "a copy of the scales (numpy)")
      .def_prop_ro("zeros",
                   [](const QuantizedTensor& q) -> nb::object {
                     return q.zeros ? copy_out(*q.zeros) : nb::none();
                   })
      .def_static(
          "from_parts",
          [](const std::string& format, std::tuple<int64_t, int64_t, int64_t> shape,
             int64_t group_size, nb::handle values, nb::handle scales, nb::handle zeros) {
            ArrayArgs args("QuantizedWeights.from_parts");
            const TensorView v = args.add(values, "values");
            const TensorView s = args.add(scales, "scales");
            std::optional<Tensor> z;
            if (!zeros.is_none()) z = copy_of(args.add(zeros, "zeros"));
            const auto [g, k, n] = shape;
            return QuantizedTensor::from_parts(parse_quant_format(format), g, k, n, group_size,
                                               copy_of(v), copy_of(s), std::move(z));
          },
          "format"_a, "shape"_a, "group_size"_a, "values"_a, "scales"_a,
          "zeros"_a.none() = nb::none(),
          "Checks arrays in the panel layout (a copy is kept): ValueError naming what is wrong.")
      .def_static(
          "from_gguf",
          [](nb::handle blocks, const std::string& type,
             std::tuple<int64_t, int64_t, int64_t> shape) {
            ArrayArgs args("QuantizedWeights.from_gguf");
            const TensorView b = args.add(blocks, "blocks");
            const auto [g, k, n] = shape;
            return from_gguf(b, type, g, k, n);
          },
          "blocks"_a, "type"_a, "shape"_a,
          "GGUF Q8_0 or Q4_0 blocks (u8 [G, N, K / 32 * block bytes], GGUF's expert tensor) of "
          "weights of shape (G, K, N): int8 or int4 with group size 32, dequantizing to GGUF's "
          "values bit for bit.")
      .def("__repr__", [](const QuantizedTensor& q) {
        return "QuantizedWeights(" + std::string(quant_format_name(q.format)) + ", [" +
               std::to_string(q.groups) + ", " + std::to_string(q.k) + ", " + std::to_string(q.n) +
               "], group_size=" + std::to_string(q.group_size) +
               (q.asymmetric ? ", asymmetric)" : ")");
      });
  m.def(
      "quantize",
      [](nb::handle w, const std::string& format, int64_t group_size, bool asymmetric) {
        ArrayArgs args("quantize");
        const TensorView v = args.add(w, "w");
        const QuantFormat f = parse_quant_format(format);
        return run(false, [&] { return quantize(v, f, group_size, asymmetric); });
      },
      "w"_a, "format"_a, "group_size"_a = 0, "asymmetric"_a = false,
      "Quantizes f32/bf16 weights [G, K, N] (or [K, N]) along K: format int8, int4, fp8_e4m3 or "
      "mxfp4; group_size 0 is K (mxfp4: 32); asymmetric: int4 with zero points.");
  m.def(
      "dequantize",
      [](const QuantizedTensor& q) {
        return wrap(run(false, [&] { return dequantize(q); }), false);
      },
      "q"_a, "The f32 weights [G, K, N] q stands for.");
}

// ragged_dot (and the C++ loop the binding-overhead benchmark times against).
void bind_ragged_dot(nb::module_& m) {
  m.def(
      "ragged_dot",
      [](nb::handle lhs, nb::handle rhs, nb::handle group_sizes, nb::handle preferred_element_type,
         nb::handle activation, nb::handle precision, nb::handle implementation, nb::handle config,
         nb::handle representative_group_sizes, nb::handle out,
         bool heuristics_only) -> nb::object {
        ArrayArgs args("ragged_dot");
        const TensorView l = args.add(lhs, "lhs");
        if (nb::inst_check(rhs) && nb::isinstance<QuantizedTensor>(rhs)) {
          const QuantizedTensor& q = *nb::inst_ptr<QuantizedTensor>(rhs);
          const std::vector<int32_t> g = group_sizes_of(args, group_sizes);
          if (!preferred_element_type.is_none() || !precision.is_none() || !out.is_none() ||
              !representative_group_sizes.is_none()) {
            throw InvalidArgument(
                "ragged_dot with QuantizedWeights: preferred_element_type, precision, "
                "representative_group_sizes and out are not taken (the output has lhs's dtype)");
          }
          QuantizedRaggedDotOptions qo;
          qo.activation = activation_arg(activation, qo.activation);
          set_choice(qo, "quantized_ragged_dot", implementation, config);
          Tensor t = run(heuristics_only, [&] { return ragged_dot(l, q, g, qo); });
          return wrap(std::move(t), args.torch());
        }
        const PackedRhs* packed = nb::inst_check(rhs) && nb::isinstance<PackedRhs>(rhs)
                                      ? nb::inst_ptr<PackedRhs>(rhs)
                                      : nullptr;
        const TensorView r = packed ? TensorView() : args.add(rhs, "rhs");
        const std::vector<int32_t> g = group_sizes_of(args, group_sizes);
        const RaggedDotOptions o =
            ragged_options(preferred_element_type, activation, precision, implementation, config,
                           representative_group_sizes);
        if (!out.is_none()) {
          if (nb::hasattr(out, "flags") && !nb::cast<bool>(out.attr("flags").attr("writeable"))) {
            throw InvalidArgument("ragged_dot: out is read-only; expected a writable array");
          }
          const TensorView ov = args.add_writable(out, "out");
          run(heuristics_only, [&] {
            if (packed) {
              ragged_dot_into(l, *packed, g, ov, o);
            } else {
              ragged_dot_into(l, r, g, ov, o);
            }
            return 0;
          });
          return nb::borrow(out);
        }
        Tensor t = run(heuristics_only, [&] {
          return packed ? ragged_dot(l, *packed, g, o) : ragged_dot(l, r, g, o);
        });
        return wrap(std::move(t), args.torch());
      },
      "lhs"_a.none(), "rhs"_a.none(), "group_sizes"_a.none(), nb::kw_only(),
      "preferred_element_type"_a.none() = nb::none(), "activation"_a.none() = nb::none(),
      "precision"_a.none() = nb::none(), "implementation"_a.none() = nb::none(),
      "config"_a.none() = nb::none(), "representative_group_sizes"_a.none() = nb::none(),
      "out"_a.none() = nb::none(), "heuristics_only"_a = false);

  // The same ragged_dot call made from C++ `iters` times back to back (GIL released): the
  // baseline of the binding-overhead benchmark (python -m tokamax_cpp.bench_overhead).
  m.def(
      "_time_cpp_ragged_dot",
      [](nb::handle lhs, nb::handle rhs, nb::handle group_sizes, int iters) {
        ArrayArgs args("ragged_dot");
        const TensorView l = args.add(lhs, "lhs");
        const TensorView r = args.add(rhs, "rhs");
        const std::vector<int32_t> g = group_sizes_of(args, group_sizes);
        nb::gil_scoped_release unlocked;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          Tensor t = ragged_dot(l, r, g);
          (void)t;
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
               iters;
      },
      "lhs"_a, "rhs"_a, "group_sizes"_a, "iters"_a);
}

// ragged_dot_general and ragged_dot_vjp.
void bind_ragged_dot_general(nb::module_& m) {
  m.def(
      "ragged_dot_general",
      [](nb::handle lhs, nb::handle rhs, nb::handle group_sizes, std::string dim_nums,
         nb::handle preferred_element_type, nb::handle activation, nb::handle precision,
         nb::handle implementation, nb::handle config, bool heuristics_only) {
        ArrayArgs args("ragged_dot_general");
        const TensorView l = args.add(lhs, "lhs");
        const TensorView r = args.add(rhs, "rhs");
        const std::vector<int32_t> g = group_sizes_of(args, group_sizes);
        const RaggedDimNums d = parse_dim_nums(dim_nums);
        const RaggedDotOptions o = ragged_options(preferred_element_type, activation, precision,
                                                  implementation, config, nb::none());
        Tensor t = run(heuristics_only, [&] { return ragged_dot_general(l, r, g, d, o); });
        return wrap(std::move(t), args.torch());
      },
      "lhs"_a.none(), "rhs"_a.none(), "group_sizes"_a.none(), "dim_nums"_a, nb::kw_only(),
      "preferred_element_type"_a.none() = nb::none(), "activation"_a.none() = nb::none(),
      "precision"_a.none() = nb::none(), "implementation"_a.none() = nb::none(),
      "config"_a.none() = nb::none(), "heuristics_only"_a = false);

  m.def(
      "ragged_dot_vjp",
      [](nb::handle lhs, nb::handle rhs, nb::handle group_sizes, nb::handle dout,
         nb::handle preferred_element_type, nb::handle activation, nb::handle precision,
         nb::handle implementation, bool heuristics_only) {
        ArrayArgs args("ragged_dot_vjp");
        const TensorView l = args.add(lhs, "lhs");
        const TensorView r = args.add(rhs, "rhs");
        const std::vector<int32_t> g = group_sizes_of(args, group_sizes);
        const TensorView d = args.add(dout, "dout");
        const RaggedDotOptions o = ragged_options(preferred_element_type, activation, precision,
                                                  implementation, nb::none(), nb::none());
        RaggedDotGrads grads = run(heuristics_only, [&] { return ragged_dot_vjp(l, r, g, d, o); });
        return nb::make_tuple(wrap(std::move(grads.dlhs), args.torch()),
                              wrap(std::move(grads.drhs), args.torch()));
      },
      "lhs"_a.none(), "rhs"_a.none(), "group_sizes"_a.none(), "dout"_a.none(), nb::kw_only(),
      "preferred_element_type"_a.none() = nb::none(), "activation"_a.none() = nb::none(),
      "precision"_a.none() = nb::none(), "implementation"_a.none() = nb::none(),
      "heuristics_only"_a = false);
}

// PackedGluWeights and pack_glu_weights.
void bind_glu_weights(nb::module_& m) {
  // --- gated_linear_unit ---
  nb::class_<PackedGluWeights>(m, "PackedGluWeights",
                               "GLU weights packed once for the native kernel; immutable.")
      .def_prop_ro("k", &PackedGluWeights::k)
      .def_prop_ro("n", &PackedGluWeights::n)
      .def_prop_ro("dtype", [](const PackedGluWeights& p) { return dtype_name(p.dtype()); });
  m.def(
      "pack_glu_weights",
      [](nb::handle weights) {
        ArrayArgs args("pack_glu_weights");
        if (nb::isinstance<nb::tuple>(weights) || nb::isinstance<nb::list>(weights)) {
          auto pair = weight_pair("pack_glu_weights", weights);
          const TensorView g = args.add(pair.first, "w_gate");
          const TensorView u = args.add(pair.second, "w_up");
          return run(false, [&] { return pack_glu_weights(g, u); });
        }
        const TensorView w = args.add(weights, "weights");
        return run(false, [&] { return pack_glu_weights(w); });
      },
      "weights"_a.none());
}

// gated_linear_unit and its VJP (fused, pair or packed weights).
void bind_glu(nb::module_& m) {
  m.def(
      "gated_linear_unit",
      [](nb::handle x, nb::handle weights, nb::handle activation, nb::handle implementation,
         nb::handle config, bool return_residuals, bool heuristics_only) -> nb::object {
        ArrayArgs args("gated_linear_unit");
        const TensorView xv = args.add(x, "x");
        const GluOptions o = glu_options(activation, implementation, config);
        if (nb::inst_check(weights) && nb::isinstance<PackedGluWeights>(weights)) {
          if (return_residuals)
            throw InvalidArgument(
                "gated_linear_unit: return_residuals needs fused [K,2,N] weights, not packed ones");
          const PackedGluWeights* p = nb::inst_ptr<PackedGluWeights>(weights);
          Tensor t = run(heuristics_only, [&] { return gated_linear_unit(xv, *p, o); });
          return wrap(std::move(t), args.torch());
        }
        if (nb::isinstance<nb::tuple>(weights) || nb::isinstance<nb::list>(weights)) {
          if (return_residuals)
            throw InvalidArgument(
                "gated_linear_unit: return_residuals needs fused [K,2,N] weights, not a "
                "(w_gate, w_up) pair");
          auto pair = weight_pair("gated_linear_unit", weights);
          const TensorView g = args.add(pair.first, "w_gate");
          const TensorView u = args.add(pair.second, "w_up");
          Tensor t = run(heuristics_only, [&] { return gated_linear_unit(xv, g, u, o); });
          return wrap(std::move(t), args.torch());
        }
        const TensorView w = args.add(weights, "weights");
        if (!return_residuals) {
          Tensor t = run(heuristics_only, [&] { return gated_linear_unit(xv, w, o); });
          return wrap(std::move(t), args.torch());
        }
        GluResult r =
            run(heuristics_only, [&] { return gated_linear_unit_with_residuals(xv, w, o); });
        return nb::make_tuple(wrap(std::move(r.out), args.torch()),
                              wrap(std::move(r.h), args.torch()));
      },
      "x"_a.none(), "weights"_a.none(), nb::kw_only(), "activation"_a.none() = nb::none(),
      "implementation"_a.none() = nb::none(), "config"_a.none() = nb::none(),
      "return_residuals"_a = false, "heuristics_only"_a = false);
  m.def(
      "gated_linear_unit_vjp",
      [](nb::handle x, nb::handle weights, nb::handle h, nb::handle dout, nb::handle activation,
         nb::handle implementation, nb::handle config, bool heuristics_only) {
        ArrayArgs args("gated_linear_unit_vjp");
        const TensorView xv = args.add(x, "x");
        const TensorView w = args.add(weights, "weights");
        const TensorView hv = args.add(h, "h");
        const TensorView d = args.add(dout, "dout");
        const GluOptions o = glu_options(activation, implementation, config);
        GluGrads g = run(heuristics_only, [&] { return gated_linear_unit_vjp(xv, w, hv, d, o); });
        return nb::make_tuple(wrap(std::move(g.dx), args.torch()),
                              wrap(std::move(g.dw), args.torch()));
      },
      "x"_a.none(), "weights"_a.none(), "h"_a.none(), "dout"_a.none(), nb::kw_only(),
      "activation"_a.none() = nb::none(), "implementation"_a.none() = nb::none(),
      "config"_a.none() = nb::none(), "heuristics_only"_a = false);
}

// query_configs, BoundArguments and the bound-args files.
void bind_bound_args(nb::module_& m) {
  // --- configs: what a call would use, nothing run ---
  m.def(
      "query_configs",
      [](nb::callable fn) {
        ConfigQuery q;
        fn();
        nb::list out;
        for (const ConfigQuery::Entry& e : q.calls()) {
          nb::dict d;
          d["op"] = e.family;
          d["implementation"] = e.implementation;
          d["heuristics"] = e.heuristics.is_null() ? nb::none() : json_to_py(e.heuristics.json());
          d["config"] = e.ladder.config.is_null() ? nb::none() : json_to_py(e.ladder.config.json());
          d["rung"] = std::string(rung_name(e.ladder.rung));
          d["detail"] = e.ladder.detail;
          out.append(d);
        }
        return out;
      },
      "fn"_a,
      "Runs fn() with every op call on this thread resolved but not run (outputs unwritten); "
      "returns, per call, its op, implementation, heuristics config and the config the ladder "
      "(scopes, disk cache, heuristics) would choose.");

  // --- autotuning ---
  nb::class_<BoundArguments>(m, "BoundArguments",
                             "An op call's identity: family, implementation, canonical argument "
                             "spec (shapes, dtypes, statics; never array values).")
      .def_prop_ro("op", &BoundArguments::family)
      .def_prop_ro("implementation", &BoundArguments::implementation)
      .def_prop_ro("key", &BoundArguments::key)
      .def_prop_ro("arguments", [](const BoundArguments& b) { return json_to_py(b.arguments()); })
      .def("to_json", [](const BoundArguments& b) { return b.to_json().dump(); })
      .def_static(
          "from_json", [](nb::handle j) { return BoundArguments::from_json(py_to_json(j)); },
          "json"_a)
      .def("__eq__",
           [](const BoundArguments& a, const BoundArguments& b) {
             return a.family() == b.family() && a.implementation() == b.implementation() &&
                    a.key() == b.key();
           })
      .def("__hash__",
           [](const BoundArguments& b) {
             return nb::hash(nb::make_tuple(b.family(), b.implementation(), b.key()));
           })
      .def("__repr__", [](const BoundArguments& b) {
        return "BoundArguments(" + b.family() + "/" +
               (b.implementation().empty() ? "*" : b.implementation()) + ", " + b.key() + ")";
      });
  m.def("dump_bound_args",
        [](const std::vector<BoundArguments>& l) { return BoundArguments::dumps_list(l); });
  m.def(
      "load_bound_args_file",
      [](const std::string& path) {
        // read_file: refuses a directory or a file over kMaxInputFileBytes, naming the path.
        return bound_list(BoundArguments::loads_list(read_file(path), "'" + path + "'"));
      },
      "path"_a);
  m.def(
      "load_bound_args",
      [](const std::string& text) { return bound_list(BoundArguments::loads_list(text)); },
      "text"_a);
  m.def(
      "get_bound_args",
      [](nb::callable fn, nb::args args) {
        CallRecorder rec;
        fn(*args);
        return bound_list(rec.calls());
      },
      "fn"_a, "args"_a, "The bound arguments of every op call fn(*args) makes on this thread.");
}

// AutotuningResult and its `with result:` scopes.
void bind_autotuning_result(nb::module_& m) {
  nb::class_<PyResult>(m, "AutotuningResult",
                       "Tuned configs per key. `with result:` applies them to the op calls made "
                       "on the entering thread (a C++ thread-local scope: other threads, such as "
                       "a thread pool's, do not see it); scopes nest, innermost first.")
      .def(nb::init<>())
      .def_prop_ro("device_kind", [](const PyResult& r) { return r.result.device_kind(); })
      .def_prop_ro("tokamax_version", [](const PyResult& r) { return r.result.tokamax_version(); })
      .def_prop_ro("data",
                   [](const PyResult& r) {
                     nb::list l;
                     for (const auto& [b, d] : r.result.data())
                       l.append(nb::make_tuple(nb::cast(b), json_to_py(d.to_json())));
                     return l;
                   })
      .def("__len__", [](const PyResult& r) { return r.result.data().size(); })
      .def("dumps", [](const PyResult& r) { return r.result.dumps(); })
      .def_static(
          "loads", [](const std::string& text) { return PyResult(AutotuningResult::loads(text)); },
          "text"_a)
      .def(
          "dump", [](const PyResult& r, const std::string& path) { r.result.dump(path); }, "path"_a)
      .def_static(
          "load", [](const std::string& path) { return PyResult(AutotuningResult::load(path)); },
          "path"_a)
      .def(
          "dump_cache", [](const PyResult& r, const std::string& dir) { r.result.dump_cache(dir); },
          "dir"_a = "")
      .def("__or__",
           [](const PyResult& a, const PyResult& b) { return PyResult(a.result | b.result); })
      .def("__enter__",
           [](nb::handle self) {
             PyResult& r = nb::cast<PyResult&>(self);
             r.scopes.emplace_back(std::this_thread::get_id(),
                                   std::make_unique<AutotuningScope>(r.result));
             return nb::borrow(self);
           })
      .def(
          "__exit__",
          [](PyResult& r, nb::handle, nb::handle, nb::handle) {
            if (r.scopes.empty()) return false;
            auto it = std::find_if(r.scopes.rbegin(), r.scopes.rend(), [](const auto& s) {
              return s.first == std::this_thread::get_id();
            });
            r.scopes.erase(it == r.scopes.rend() ? std::prev(r.scopes.end())
                                                 : std::next(it).base());
            return false;
          },
          // A normal exit passes (None, None, None): nanobind refuses None unless allowed.
          nb::arg("exc_type").none(), nb::arg("exc_value").none(), nb::arg("traceback").none())
      .def("__repr__", [](const PyResult& r) {
        return "AutotuningResult(device_kind=" + r.result.device_kind() + ", " +
               std::to_string(r.result.data().size()) + " keys)";
      });
}

// autotune: of a callable, of bound arguments, sharded over a store.
void bind_autotune(nb::module_& m) {
  m.def(
      "autotune_fn",
      [](nb::callable fn, nb::tuple args, bool ignore_cache, bool all_implementations,
         std::optional<double> budget_s, std::optional<double> measure_budget_s,
         std::optional<int> max_candidates, uint64_t seed) {
        AutotuneOptions o = autotune_options(ignore_cache, all_implementations, budget_s,
                                             measure_budget_s, max_candidates, seed);
        std::function<void()> body = [&] {
          nb::gil_scoped_acquire locked;
          fn(*args);
        };
        nb::gil_scoped_release unlocked;
        return PyResult(autotune(body, o));
      },
      "fn"_a, "args"_a, "ignore_cache"_a = false, "all_implementations"_a = false,
      "budget_s"_a = nb::none(), "measure_budget_s"_a = nb::none(), "max_candidates"_a = nb::none(),
      "seed"_a = 0);
  m.def(
      "autotune_bound_args",
      [](const std::vector<BoundArguments>& list, bool ignore_cache, bool all_implementations,
         std::optional<double> budget_s, std::optional<double> measure_budget_s,
         std::optional<int> max_candidates, uint64_t seed) {
        AutotuneOptions o = autotune_options(ignore_cache, all_implementations, budget_s,
                                             measure_budget_s, max_candidates, seed);
        nb::gil_scoped_release unlocked;
        return PyResult(Autotuner(o).tune_all(list));
      },
      "bound_args"_a, "ignore_cache"_a = false, "all_implementations"_a = false,
      "budget_s"_a = nb::none(), "measure_budget_s"_a = nb::none(), "max_candidates"_a = nb::none(),
      "seed"_a = 0);
  // Sharded tuning with the run's other processes through a store (docs/tuning.md, "Fleet tuning
  // over Redis").
  m.def(
      "autotune_sharded",
      [](const std::vector<BoundArguments>& list, const std::string& store,
         const std::string& run_id, std::optional<int> rank, std::optional<int> world_size,
         double lease_s, double deadline_s, bool all_implementations,
         std::optional<double> budget_s, std::optional<double> measure_budget_s,
         std::optional<int> max_candidates, uint64_t seed) {
        AutotuneOptions o = autotune_options(false, all_implementations, budget_s, measure_budget_s,
                                             max_candidates, seed);
        FleetOptions f;
        f.run_id = run_id;
        f.lease_s = lease_s;
        f.deadline_s = deadline_s;
        if (rank.has_value() != world_size.has_value())
          throw InvalidArgument("autotune: rank and world_size go together");
        if (rank) {
          f.rank = *rank;
          f.world_size = *world_size;
        } else if (const auto l = launcher_rank()) {
          f.rank = l->rank;
          f.world_size = l->world_size;
        }
        if (run_id.empty()) throw InvalidArgument("autotune: a store needs a run_id");
        nb::gil_scoped_release unlocked;
        const auto s = open_store(store);
        return PyResult(tune_sharded(list, *s, o, f));
      },
      "bound_args"_a, "store"_a, "run_id"_a, "rank"_a = nb::none(), "world_size"_a = nb::none(),
      "lease_s"_a = 30.0, "deadline_s"_a = 86400.0, "all_implementations"_a = false,
      "budget_s"_a = nb::none(), "measure_budget_s"_a = nb::none(), "max_candidates"_a = nb::none(),
      "seed"_a = 0);
}

}  // namespace
}  // namespace tokamax

NB_MODULE(_core, m) {
  using namespace tokamax;
  m.doc() = "tokamax C++ kernels (see the tokamax_cpp package)";
  g_cache_miss_error =
      PyErr_NewExceptionWithDoc("tokamax_cpp.CacheMissError",
                                "No tuned config for a call and the cache-miss policy is 'error'.",
                                PyExc_LookupError, nullptr);
  m.attr("CacheMissError") = nb::handle(g_cache_miss_error);
  nb::register_exception_translator(translate);

  m.def("version", &library_version);
  m.def("device_kind", &device_kind);
  m.def("num_threads", &num_threads);
  m.def("set_num_threads", &set_num_threads, "n"_a);
  m.def(
      "missed_keys",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const MissedKey& k : missed_keys())
          out.emplace_back(k.family, k.implementation, k.key);
        return out;
      },
      "The calls of this process that missed the tuning data and ran with the heuristics "
      "config: (op, implementation, key JSON) once per key, in the order of their first miss. "
      "A process warns once for all of them; TOKAMAX_LOG=autotune:debug logs each.");
  bind_described_ops(m);
  bind_packed_rhs(m);
  bind_quantized(m);
  bind_moe_weights(m);
  bind_ragged_dot(m);
  bind_ragged_dot_general(m);
  bind_glu_weights(m);
  bind_glu(m);
  bind_bound_args(m);
  bind_autotuning_result(m);
  bind_autotune(m);
}
