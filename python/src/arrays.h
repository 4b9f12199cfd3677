// Arrays across the Python boundary for tokamax_cpp._core (module.cc): in through DLPack (numpy,
// ml_dtypes bfloat16, torch, jax: anything with __dlpack__ or the buffer protocol) or a torch
// tensor's attributes, zero-copy, CPU only, contiguous only (a strided array is refused with a
// message saying how to copy it: a silent copy would hide a slow path); out as the library's
// own Tensors handed over without a copy: numpy arrays, or torch tensors when the first array
// argument was one.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tokamax/tokamax.h"

namespace tokamax::py {

namespace nb = nanobind;

// --- arrays in -----------------------------------------------------------------------------

inline nb::object torch_tensor_type() {
  // Looked up once torch is imported (never imports it: numpy users need not have torch).
  static nb::object type;
  if (!type.is_valid()) {
    nb::dict modules = nb::borrow<nb::dict>(PySys_GetObject("modules"));
    if (modules.contains("torch")) type = modules["torch"].attr("Tensor");
  }
  return type;
}

// torch's dtype and layout objects (singletons), looked up with its Tensor type.
struct TorchTypes {
  std::vector<std::pair<nb::object, DType>> dtypes;
  nb::object strided;
  nb::object from_numpy;  // torch.from_numpy: outputs (see wrap)
};

inline const TorchTypes& torch_types() {
  static TorchTypes t;
  if (!t.strided.is_valid()) {
    nb::module_ torch = nb::module_::import_("torch");
    for (const auto& [name, d] : {std::pair{"float32", DType::kF32},
                                  {"bfloat16", DType::kBF16},
                                  {"float16", DType::kF16},
                                  {"float64", DType::kF64},
                                  {"int32", DType::kI32},
                                  {"int64", DType::kI64},
                                  {"uint8", DType::kU8},
                                  {"bool", DType::kBool},
                                  {"int8", DType::kI8}}) {
      t.dtypes.emplace_back(torch.attr(name), d);
    }
    t.strided = torch.attr("strided");
    t.from_numpy = torch.attr("from_numpy");
  }
  return t;
}

inline bool is_torch(nb::handle h) {
  nb::object t = torch_tensor_type();
  return t.is_valid() && PyObject_IsInstance(h.ptr(), t.ptr()) == 1;
}

// The element types tokamax reads, as DLPack describes them (one table both ways).
struct DlpackType {
  DType dtype;
  nb::dlpack::dtype_code code;
  uint8_t bits;
};
inline constexpr DlpackType kDlpackTypes[] = {{DType::kF32, nb::dlpack::dtype_code::Float, 32},
                                              {DType::kBF16, nb::dlpack::dtype_code::Bfloat, 16},
                                              {DType::kF16, nb::dlpack::dtype_code::Float, 16},
                                              {DType::kF64, nb::dlpack::dtype_code::Float, 64},
                                              {DType::kI32, nb::dlpack::dtype_code::Int, 32},
                                              {DType::kI64, nb::dlpack::dtype_code::Int, 64},
                                              {DType::kU8, nb::dlpack::dtype_code::UInt, 8},
                                              {DType::kBool, nb::dlpack::dtype_code::Bool, 8},
                                              {DType::kI8, nb::dlpack::dtype_code::Int, 8}};

inline std::optional<DType> from_dlpack(nb::dlpack::dtype d) {
  if (d.lanes != 1) return std::nullopt;
  for (const DlpackType& t : kDlpackTypes) {
    if (d.code == static_cast<uint8_t>(t.code) && d.bits == t.bits) return t.dtype;
  }
  return std::nullopt;
}

inline nb::dlpack::dtype to_dlpack(DType dtype) {
  for (const DlpackType& t : kDlpackTypes) {
    if (t.dtype == dtype) return nb::dlpack::dtype{static_cast<uint8_t>(t.code), t.bits, 1};
  }
  throw Error("no DLPack type for " + std::string(dtype_name(dtype)));
}

// str(h), as Python computes it.
inline std::string py_str(nb::handle h) {
  nb::object s = nb::steal(PyObject_Str(h.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return nb::cast<std::string>(s);
}

inline std::string py_type_name(nb::handle h) { return nb::type_name(h.type()).c_str(); }

// The arrays of one call: their views, kept alive until the call returns.
class ArrayArgs {
 public:
  explicit ArrayArgs(const char* op) : op_(op) {}

  // Inputs are read only: requested as read-only so that producers which flag their DLPack
  // export read-only (jax arrays, numpy arrays with writeable=False) are accepted.
  TensorView add(nb::handle h, const char* name) {
    if (is_torch(h)) return add_torch(h, name);
    return add_as<nb::ndarray<nb::ro>>(h, name);
  }
  // An output buffer the op writes into.
  TensorView add_writable(nb::handle h, const char* name) {
    if (is_torch(h)) return add_torch(h, name);
    nb::ndarray<> w;
    if (!h.is_none() && nb::try_cast(h, w, /*convert=*/false)) return accept(w, name);
    PyErr_Clear();
    nb::ndarray<nb::ro> ro;
    if (!h.is_none() && nb::try_cast(h, ro, /*convert=*/false)) {
      throw InvalidArgument(std::string(op_) + ": " + name +
                            " is read-only; expected a writable array");
    }
    PyErr_Clear();
    return add_as<nb::ndarray<>>(h, name);  // the message for what is no array at all
  }

  template <class Array>
  TensorView add_as(nb::handle h, const char* name) {
    Array a;
    if (h.is_none() || !nb::try_cast(h, a, /*convert=*/false)) {
      PyErr_Clear();  // a failed __dlpack__ export may leave its error set
      // A numpy bfloat16 (ml_dtypes) array, which numpy before 2.5 does not export through
      // DLPack: read as its uint16 view (the same memory, no copy).
      if (!h.is_none() && nb::hasattr(h, "dtype") && nb::hasattr(h, "view") &&
          py_str(h.attr("dtype")) == "bfloat16") {
        nb::object bits = h.attr("view")(nb::module_::import_("numpy").attr("uint16"));
        if (nb::try_cast(bits, a, /*convert=*/false)) {
          keep_objects_.push_back(bits);
          first_ = false;
          return view(a, name, DType::kBF16);
        }
        PyErr_Clear();
      }
      // A tensor DLPack cannot export here, such as one on torch's meta device.
      if (!h.is_none() && nb::hasattr(h, "device")) {
        const std::string device = py_str(h.attr("device"));
        if (device.rfind("cpu", 0) != 0 && device.find("Cpu") == std::string::npos) {
          throw InvalidArgument(std::string(op_) + ": " + name + " is on device " + device +
                                "; this build of tokamax serves CPU arrays only");
        }
      }
      // A numpy array DLPack cannot export: its dtype says why (object, big-endian, strings).
      if (!h.is_none() && nb::hasattr(h, "dtype") && nb::hasattr(h.attr("dtype"), "byteorder") &&
          nb::hasattr(h.attr("dtype"), "kind")) {
        const nb::object dt = h.attr("dtype");
        const std::string kind = py_str(dt.attr("kind")), order = py_str(dt.attr("byteorder"));
        const std::string why = kind == "O"    ? "an object array (Python objects, no numbers)"
                                : order == ">" ? "a big-endian array"
                                               : "an array of dtype " + py_str(dt);
        throw InvalidArgument(std::string(op_) + ": " + name + " is " + why + " (dtype " +
                              py_str(dt) +
                              "); expected a native-endian array of a numeric dtype: convert it "
                              "first, e.g. with numpy.ascontiguousarray(x, dtype=numpy.float32)");
      }
      throw InvalidArgument(std::string(op_) + ": " + name + " is a " + py_type_name(h) +
                            "; expected an array (numpy, or a DLPack producer such as a torch "
                            "tensor or a jax array)");
    }
    return accept(a, name);
  }

  std::optional<TensorView> add_optional(nb::handle h, const char* name) {
    if (h.is_none()) return std::nullopt;
    return add(h, name);
  }

  TensorView add_torch(nb::handle h, const char* name) {
    if (first_) torch_ = true;
    first_ = false;
    return torch_view(h, name);
  }

  // A torch tensor never gets here (add and add_writable send it to add_torch first).
  template <class Array>
  TensorView accept(const Array& a, const char* name) {
    first_ = false;
    return view(a, name);
  }

  // Whether outputs are torch tensors (the first array was one).
  bool torch() const { return torch_; }
  const char* op() const { return op_; }

 private:
  // `as`: the element type when the array's own is a stand-in (bf16 bits viewed as uint16).
  template <class Array>
  TensorView view(const Array& a, const char* name, std::optional<DType> as = std::nullopt) {
    Shape shape(a.ndim());
    std::vector<int64_t> strides(a.ndim());
    for (size_t i = 0; i < a.ndim(); ++i) {
      shape[i] = static_cast<int64_t>(a.shape(i));
      strides[i] = a.stride(i);
    }
    if (a.device_type() != nb::device::cpu::value) {
      throw InvalidArgument(std::string(op_) + ": " + name + " " + tuple_str(shape) +
                            " is on DLPack device " + std::to_string(a.device_type()) +
                            "; this build of tokamax serves CPU arrays only (move it with "
                            ".cpu() or jax.device_get)");
    }
    const std::optional<DType> dt = as ? as : from_dlpack(a.dtype());
    if (!dt) {
      throw InvalidArgument(std::string(op_) + ": " + name + " " + tuple_str(shape) +
                            " has a dtype tokamax does not read (DLPack code " +
                            std::to_string(a.dtype().code) + ", " + std::to_string(a.dtype().bits) +
                            " bits); expected float32, bfloat16, int32, int64 or bool");
    }
    if constexpr (std::is_same_v<Array, nb::ndarray<>>) {
      keep_.push_back(a);
    } else {
      keep_ro_.push_back(a);
    }
    return contiguous_view(name, const_cast<void*>(static_cast<const void*>(a.data())), *dt,
                           std::move(shape), strides);
  }

  // A torch tensor read through its attributes: DLPack's export costs torch a few microseconds
  // a tensor (Tensor.__dlpack__ is Python), these reads a fraction of one. The caller holds the
  // tensor for the call's duration.
  TensorView torch_view(nb::handle h, const char* name) {
    const TorchTypes& t = torch_types();
    if (h.attr("layout").ptr() != t.strided.ptr()) {
      throw InvalidArgument(std::string(op_) + ": " + name + " has layout " +
                            py_str(h.attr("layout")) + "; expected a dense (strided) tensor");
    }
    if (!nb::cast<bool>(h.attr("is_cpu"))) {
      throw InvalidArgument(std::string(op_) + ": " + name + " is on device " +
                            py_str(h.attr("device")) +
                            "; this build of tokamax serves CPU arrays only (move it with .cpu())");
    }
    const nb::object dtype = h.attr("dtype");
    std::optional<DType> dt;
    for (const auto& [obj, d] : t.dtypes) {
      if (dtype.ptr() == obj.ptr()) dt = d;
    }
    const nb::tuple sizes = nb::borrow<nb::tuple>(h.attr("shape"));
    const nb::tuple steps = nb::borrow<nb::tuple>(h.attr("stride")());
    Shape shape(sizes.size());
    std::vector<int64_t> strides(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      shape[i] = nb::cast<int64_t>(sizes[i]);
      strides[i] = nb::cast<int64_t>(steps[i]);
    }
    if (!dt) {
      throw InvalidArgument(std::string(op_) + ": " + name + " " + tuple_str(shape) +
                            " has dtype " + py_str(dtype) +
                            "; expected float32, bfloat16, int32, int64 or bool");
    }
    void* data = reinterpret_cast<void*>(nb::cast<uintptr_t>(h.attr("data_ptr")()));
    return contiguous_view(name, data, *dt, std::move(shape), strides);
  }

  // The view, after refusing a strided layout (a silent copy would hide a slow path).
  TensorView contiguous_view(const char* name, void* data, DType dt, Shape shape,
                             const std::vector<int64_t>& strides) {
    int64_t expect = 1;
    bool contiguous = true;
    for (size_t i = shape.size(); i-- > 0;) {
      if (shape[i] != 1 && strides[i] != expect) contiguous = false;
      expect *= shape[i];
    }
    if (!contiguous && expect > 0) {
      throw InvalidArgument(std::string(op_) + ": " + name + " " + tuple_str(shape) +
                            " has element strides " + tuple_str(strides) +
                            "; tokamax reads contiguous row-major arrays and does not copy "
                            "silently: pass np.ascontiguousarray(x) or x.contiguous()");
    }
    return TensorView(data, dt, std::move(shape));
  }

  static std::string tuple_str(const std::vector<int64_t>& v) {
    std::string s = "(";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + (v.size() == 1 ? ",)" : ")");
  }

  const char* op_;
  bool first_ = true, torch_ = false;
  std::vector<nb::ndarray<>> keep_;
  std::vector<nb::ndarray<nb::ro>> keep_ro_;
  std::vector<nb::object> keep_objects_;
};

// group_sizes: an i32 or i64 array of rank 1, or a sequence of Python ints (converted to i32,
// range-checked: jax and torch users hold them as i64 too).
inline std::vector<int32_t> group_sizes_of(ArrayArgs& args, nb::handle h) {
  std::vector<int32_t> out;
  if (nb::isinstance<nb::list>(h) || nb::isinstance<nb::tuple>(h)) {
    size_t i = 0;
    for (nb::handle v : h) {
      // Python ints and integer scalars (numpy's: anything with __index__), not floats or bools.
      if (!PyIndex_Check(v.ptr()) || PyBool_Check(v.ptr())) {
        throw InvalidArgument(std::string(args.op()) + ": group_sizes[" + std::to_string(i) +
                              "] is a " + py_type_name(v) + "; expected integers");
      }
      nb::object as_int = nb::steal(PyNumber_Index(v.ptr()));
      if (!as_int.is_valid()) throw nb::python_error();
      const long long x = PyLong_AsLongLong(as_int.ptr());
      if (x < 0 || x > INT32_MAX || PyErr_Occurred()) {
        PyErr_Clear();
        throw InvalidArgument(std::string(args.op()) + ": group_sizes[" + std::to_string(i) +
                              "] = " + py_str(v) + "; expected a size in [0, 2^31)");
      }
      out.push_back(static_cast<int32_t>(x));
      ++i;
    }
    return out;
  }
  const TensorView g = args.add(h, "group_sizes");
  if (g.rank() != 1 || (g.dtype() != DType::kI32 && g.dtype() != DType::kI64)) {
    throw InvalidArgument(std::string(args.op()) + ": group_sizes has spec " + g.spec().str() +
                          "; expected an integer array of shape [G] (int32 or int64)");
  }
  out.resize(static_cast<size_t>(g.dim(0)));
  for (int64_t i = 0; i < g.dim(0); ++i) {
    const int64_t x =
        g.dtype() == DType::kI32 ? g.data_as<const int32_t>()[i] : g.data_as<const int64_t>()[i];
    if (x < INT32_MIN || x > INT32_MAX) {
      throw InvalidArgument(std::string(args.op()) + ": group_sizes[" + std::to_string(i) +
                            "] = " + std::to_string(x) + " does not fit in int32");
    }
    out[static_cast<size_t>(i)] = static_cast<int32_t>(x);
  }
  return out;
}

// --- arrays out ----------------------------------------------------------------------------

inline nb::object bf16_numpy_dtype() {
  static nb::object dtype;
  if (!dtype.is_valid()) {
    try {
      dtype = nb::module_::import_("ml_dtypes").attr("bfloat16");
    } catch (const nb::python_error&) {
      throw InvalidArgument(
          "a bfloat16 result as a numpy array needs the ml_dtypes package (pip install "
          "ml_dtypes), or pass torch tensors");
    }
  }
  return dtype;
}

// Hands `t` to Python without a copy: the capsule owns it.
inline nb::object wrap(Tensor t, bool torch) {
  if (!t.data() && t.size() == 0) t = Tensor(t.shape(), t.dtype());
  auto* held = new Tensor(std::move(t));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(held->shape().begin(), held->shape().end());
  const bool bf16_numpy = !torch && held->dtype() == DType::kBF16;
  const nb::dlpack::dtype dt = bf16_numpy ? nb::dtype<uint16_t>() : to_dlpack(held->dtype());
  if (torch && held->dtype() == DType::kBF16) {  // numpy has no bf16 for torch to take
    return nb::cast(
        nb::ndarray<nb::pytorch>(held->data(), shape.size(), shape.data(), owner, nullptr, dt));
  }
  nb::object arr = nb::cast(
      nb::ndarray<nb::numpy>(held->data(), shape.size(), shape.data(), owner, nullptr, dt));
  // torch.from_numpy on the (writable, owning) numpy array shares its memory: 0.7 us where
  // nanobind's DLPack hand-over to torch takes about 1.5.
  if (torch) return torch_types().from_numpy(arr);
  if (bf16_numpy) return arr.attr("view")(bf16_numpy_dtype());
  return arr;
}

}  // namespace tokamax::py
