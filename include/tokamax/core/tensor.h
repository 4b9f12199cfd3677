// Tensor (owning, 64-byte aligned, move-only) and TensorView (non-owning, strided), plus
// seeded factories whose values are the same on every run and every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tokamax/core/dtype.h"
#include "tokamax/core/export.h"
#include "tokamax/core/shape_dtype.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

using Strides = std::vector<int64_t>;  // in elements

// Row-major strides for a shape.
Strides contiguous_strides(const Shape& shape);

class TensorView {
 public:
  TensorView() = default;
  TensorView(void* data, DType dtype, Shape shape);  // contiguous
  TensorView(void* data, DType dtype, Shape shape, Strides strides);

  void* data() const { return data_; }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t size() const { return num_elements(shape_); }
  ShapeDtype spec() const { return {shape_, dtype_}; }
  bool is_contiguous() const;

  // Element access as double, for tests and reference checks (any dtype, any strides).
  double get(int64_t flat_index) const;
  void set(int64_t flat_index, double value) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Strides strides_;
};

class Tensor {
 public:
  static constexpr size_t kAlignment = 64;

  Tensor() = default;
  Tensor(Shape shape, DType dtype);  // uninitialized (zero-size shapes are fine)
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  static Tensor zeros(Shape shape, DType dtype);
  static Tensor full(Shape shape, DType dtype, double value);
  // Standard normal values, generated in f64 and rounded to dtype.
  static Tensor randn(Shape shape, DType dtype, uint64_t seed);
  // Uniform in [low, high).
  static Tensor uniform(Shape shape, DType dtype, uint64_t seed, double low = 0.0,
                        double high = 1.0);
  // A copy with the same shape and dtype.
  Tensor clone() const;
  // Fill with NaN (floats) or 0xFF bytes (others): marks "not yet written".
  void poison();

  void* data() const { return data_.get(); }
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_.at(static_cast<size_t>(i)); }
  int64_t size() const { return num_elements(shape_); }
  size_t nbytes() const { return nbytes_; }
  ShapeDtype spec() const { return {shape_, dtype_}; }
  TensorView view() const { return TensorView(data(), dtype_, shape_); }
  operator TensorView() const { return view(); }  // NOLINT: a Tensor is usable where a view is
  double get(int64_t i) const { return view().get(i); }

 private:
  struct Free {
    size_t bytes;  // what was allocated (the buffer cache reuses it by this size)
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  size_t nbytes_ = 0;
};

// Tensor storage allocated so far by this process, every thread together (the library's own
// buffers included: outputs, packed weights, per-thread scratch). Monotonic; take the
// difference around a call to see what it allocated.
struct TensorAllocations {
  int64_t count = 0;
  int64_t bytes = 0;  // as requested (nbytes), before alignment padding
};
TensorAllocations tensor_allocations();

// Fills `view` (contiguous) with the seeded values the factories use.
void fill_randn(const TensorView& view, uint64_t seed);
void fill_uniform(const TensorView& view, uint64_t seed, double low, double high);
void fill_value(const TensorView& view, double value);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
