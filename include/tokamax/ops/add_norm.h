// add_rms_norm: a transformer block's residual add fused with the RMSNorm that follows it (the
// fused_add_rms_norm of vLLM, sgl-kernel and Liger-Kernel):
//   residual_out = x + residual   (rounded to x's dtype: the residual stream as stored),
//   y = residual_out / sqrt(mean(residual_out^2) + epsilon) * scale,
// over the last axis. One read of x and residual, one write of each output, where the unfused
// pair reads the sum back.
#pragma once

#include <optional>
#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"
#include "tokamax/ops/norm.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct AddRmsNormOptions {
  double epsilon = LayerNormOptions().epsilon;  // the norms' default
  std::string implementation;                   // "", "native", "composed", "reference"
  std::optional<Config> config;                 // the native one's: LayerNormNativeConfig
};

struct AddRmsNormResult {
  Tensor y;             // x's shape and dtype
  Tensor residual_out;  // x + residual, x's shape and dtype
};

// x and residual: the same shape (rank >= 1) and dtype (f32 or bf16); scale f32 or bf16 [D].
AddRmsNormResult add_rms_norm(const TensorView& x, const TensorView& residual,
                              const std::optional<TensorView>& scale = std::nullopt,
                              const AddRmsNormOptions& options = {});

}  // namespace tokamax
TOKAMAX_PUBLIC_END
