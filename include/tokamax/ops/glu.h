// gated_linear_unit (tokamax's): out = activation(x w_gate) * (x w_up), x [..., M, K] (the
// leading dims are rows too), the weights either stacked w [K, 2, N] (w[:, 0] the gate, w[:, 1]
// the up projection) or separate w_gate, w_up [K, N] each. Products accumulate in f32; out has
// x's dtype. f32 or bf16 weights (x f32 or bf16): bf16 weights run on the CPU's bf16 dot where
// it outruns the f32 FMA (x then rounded to bf16, every product exact), else widened to f32.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tokamax/core/export.h"
#include "tokamax/core/shape_dtype.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"
#include "tokamax/core/activation.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

struct GluOptions {
  // The identity by default (a plain bilinear GLU), as tokamax's activation=None; kSilu is
  // SwiGLU, kGelu GEGLU.
  Activation activation = Activation::kNone;
  std::string implementation;  // "", "native", "composed", "reference"
  std::optional<Config> config;
};

// The weights packed once into the native kernel's panels (gate and up panels of the same
// output columns side by side), as a server does at load time: pass these instead of w.
class PackedGluWeights {
 public:
  struct Rep;
  PackedGluWeights() = default;
  explicit PackedGluWeights(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  bool empty() const { return rep_ == nullptr; }
  int64_t k() const;
  int64_t n() const;
  DType dtype() const;
  const Rep* rep() const { return rep_.get(); }

 private:
  std::shared_ptr<const Rep> rep_;
};
PackedGluWeights pack_glu_weights(const TensorView& w);  // [K, 2, N]
PackedGluWeights pack_glu_weights(const TensorView& w_gate, const TensorView& w_up);

Tensor gated_linear_unit(const TensorView& x, const TensorView& w, const GluOptions& options = {});
Tensor gated_linear_unit(const TensorView& x, const TensorView& w_gate, const TensorView& w_up,
                         const GluOptions& options = {});
// Pre-packed weights: the native implementation only.
Tensor gated_linear_unit(const TensorView& x, const PackedGluWeights& w,
                         const GluOptions& options = {});

struct GluResult {
  Tensor out;
  Tensor h;  // x w: [..., M, 2, N] f32 (gate and up before the activation): the backward's input
};
GluResult gated_linear_unit_with_residuals(const TensorView& x, const TensorView& w,
                                           const GluOptions& options = {});

struct GluGrads {
  Tensor dx;  // x's shape and dtype
  Tensor dw;  // [K, 2, N] f32
};
// Gradients of gated_linear_unit(x, w) for the cotangent dout [..., M, N] from the residual h.
// An op of its own ("gated_linear_unit_vjp"): its own implementations, configs and cache.
GluGrads gated_linear_unit_vjp(const TensorView& x, const TensorView& w, const TensorView& h,
                               const TensorView& dout, const GluOptions& options = {});

// The native implementations' config (BLIS blocking, as ragged_dot's native).
struct GluNativeConfig {
  int mr = 8;    // rows per microkernel tile
  int mc = 32;   // rows per work item (a multiple of mr)
  int kc = 512;  // K block (even)
  int nc = 512;  // gate + up columns per work item (a multiple of twice the panel width)
  Json to_json() const;
  static GluNativeConfig from_json(const Json& j);
  friend bool operator==(const GluNativeConfig&, const GluNativeConfig&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
