// linear_softmax_cross_entropy_loss (tokamax's): the loss of a classifier head without its
// logits. For x [B, H], labels i32 [B] in [0, V) and w [H, V]:
//   logits = x w,   loss_b = logsumexp(logits_b) - logits_b[labels_b]   (f32),
// reduced by sum, mean or none ([B]). The fused implementation never materializes [B, V]
// (4096 tokens of Qwen's 151,936-token vocabulary: 2.5 GB of f32 logits).
#pragma once

#include <optional>
#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class LossReduction { kSum, kMean, kNone };

struct LossOptions {
  // The sum by default, as tokamax's reduction="sum".
  LossReduction reduction = LossReduction::kSum;
  std::string implementation;  // "", "native", "composed", "reference"
  std::optional<Config> config;
};

// The loss: f32 [] for sum and mean, [B] for none.
Tensor linear_softmax_cross_entropy_loss(const TensorView& x, const TensorView& labels,
                                         const TensorView& w, const LossOptions& options = {});

struct LossResult {
  Tensor loss;
  Tensor lse;  // [B] f32: each row's log-sum-exp (the backward's residual)
};
LossResult linear_softmax_cross_entropy_loss_with_residuals(const TensorView& x,
                                                            const TensorView& labels,
                                                            const TensorView& w,
                                                            const LossOptions& options = {});

struct LossGrads {
  Tensor dx;  // x's shape and dtype
  Tensor dw;  // [H, V] f32
};
// Gradients for the cotangent dloss (f32, the loss's shape) from the forward's log-sum-exp.
// An op of its own ("linear_softmax_cross_entropy_loss_vjp").
LossGrads linear_softmax_cross_entropy_loss_vjp(const TensorView& x, const TensorView& labels,
                                                const TensorView& w, const TensorView& lse,
                                                const TensorView& dloss,
                                                const LossOptions& options = {});

// The native implementations' config: BLIS blocking of the x w product (nc: the vocabulary
// columns one work item reduces), and the vocabulary chunk the backward materializes.
struct LossNativeConfig {
  int mr = 8;
  int mc = 32;
  int kc = 512;
  int nc = 1024;
  int block_v = 4096;  // backward: [B, block_v] of logits at a time
  Json to_json() const;
  static LossNativeConfig from_json(const Json& j);
  friend bool operator==(const LossNativeConfig&, const LossNativeConfig&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
