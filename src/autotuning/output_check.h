// How the autotuner checks a candidate's outputs (XLA's discipline): outputs written into
// buffers with guard zones on both sides and a poisoned interior, then compared with the
// reference implementation's within the family's tolerance. Unwritten elements (still poison),
// writes outside the output (a damaged guard) and wrong values are distinct failures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "tokamax/autotuning/autotuning.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/op.h"

namespace tokamax {

inline constexpr size_t kGuardBytes = 4096;
inline constexpr uint8_t kGuardByte = 0xA5;

// Output buffers with guard zones on both sides; the interior is poisoned before each checked run.
struct GuardedOutputs {
  std::vector<Tensor> storage;
  std::vector<TensorView> views;
  std::vector<size_t> sizes;

  explicit GuardedOutputs(const std::vector<TensorView>& like) {
    for (const TensorView& v : like) {
      const size_t bytes = static_cast<size_t>(v.spec().bytes());
      Tensor t({static_cast<int64_t>(bytes + 2 * kGuardBytes)}, DType::kU8);
      std::memset(t.data(), kGuardByte, t.nbytes());
      views.emplace_back(static_cast<uint8_t*>(t.data()) + kGuardBytes, v.dtype(), v.shape());
      sizes.push_back(bytes);
      storage.push_back(std::move(t));
    }
  }
  void poison() {
    for (const TensorView& v : views) {
      if (is_floating(v.dtype()))
        fill_value(v, std::nan(""));
      else
        std::memset(v.data(), 0xFF, static_cast<size_t>(v.spec().bytes()));
    }
  }
  // Index of the first output whose guard zone was written, or -1.
  int damaged_guard() const {
    for (size_t i = 0; i < storage.size(); ++i) {
      const uint8_t* p = static_cast<const uint8_t*>(storage[i].data());
      for (size_t b = 0; b < kGuardBytes; ++b) {
        if (p[b] != kGuardByte || p[kGuardBytes + sizes[i] + b] != kGuardByte)
          return static_cast<int>(i);
      }
    }
    return -1;
  }
};

// An output's elements as doubles (any dtype, any strides).
std::vector<double> to_f64(const TensorView& v);

// The first output that is unwritten or outside the tolerance of `refs`, as a Failure.
std::optional<Failure> check_outputs(const std::vector<TensorView>& outs,
                                     const std::vector<std::vector<double>>& refs,
                                     const Tolerance& tol);

}  // namespace tokamax
