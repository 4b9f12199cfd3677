// layer_norm and rms_norm over one axis of x (tokamax's layer_norm):
//   y = (x - mean) / sqrt(var + epsilon) * scale + offset,
// mean and var over `axis`; rms_norm is subtract_mean = false (mean taken as 0, var the mean of
// x^2). Statistics are computed in f64 from f32 values (bf16 x is widened exactly); y has x's
// dtype. scale and offset are optional, each of x's size along the axis, f32 or bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct LayerNormOptions {
  int64_t axis = -1;  // negative counts from the end
  double epsilon = 1e-6;
  bool subtract_mean = true;   // false: rms_norm
  std::string implementation;  // "", "native", "composed", "reference"
  std::optional<Config> config;
};

Tensor layer_norm(const TensorView& x, const std::optional<TensorView>& scale = std::nullopt,
                  const std::optional<TensorView>& offset = std::nullopt,
                  const LayerNormOptions& options = {});
// layer_norm with subtract_mean = false (the options' subtract_mean is ignored).
Tensor rms_norm(const TensorView& x, const std::optional<TensorView>& scale = std::nullopt,
                LayerNormOptions options = {});

struct LayerNormResult {
  Tensor y;
  Tensor mean;  // x's shape without the axis, f32 (zeros for rms_norm)
  Tensor rstd;  // 1 / sqrt(var + epsilon), same shape
};
LayerNormResult layer_norm_with_residuals(const TensorView& x,
                                          const std::optional<TensorView>& scale = std::nullopt,
                                          const std::optional<TensorView>& offset = std::nullopt,
                                          const LayerNormOptions& options = {});

struct LayerNormGrads {
  Tensor dx;       // x's shape and dtype
  Tensor dscale;   // [D] f32; empty without a scale
  Tensor doffset;  // [D] f32; empty without an offset
};
// Gradients of layer_norm for the cotangent dy (x's shape and dtype) from the forward's
// residuals. An op of its own ("layer_norm_vjp"): its own implementations, configs and cache.
LayerNormGrads layer_norm_vjp(const TensorView& x, const std::optional<TensorView>& scale,
                              const std::optional<TensorView>& offset, const TensorView& mean,
                              const TensorView& rstd, const TensorView& dy,
                              const LayerNormOptions& options = {});

// The native implementations' config (forward and backward).
struct LayerNormNativeConfig {
  int rows_per_item = 16;  // rows one work item normalizes
  Json to_json() const;
  static LayerNormNativeConfig from_json(const Json& j);
  friend bool operator==(const LayerNormNativeConfig&, const LayerNormNativeConfig&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
