// The layer_norm family (rms_norm is its subtract_mean = false): its call, bind (all
// validation), the reference, tolerances and cost; and the backward family layer_norm_vjp.
// x is seen as [outer, D, inner] around the normalized axis; a "row" is one (outer, inner)
// pair, its D elements inner apart.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ops/elements.h"
#include "tokamax/op/backward_family.h"
#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/norm.h"

namespace tokamax::norm {

inline constexpr const char* kFamily = "layer_norm";
inline constexpr const char* kVjpFamily = "layer_norm_vjp";

struct NormCall : CallBase {
  TensorView x;
  std::optional<TensorView> scale, offset;  // [D], f32 or bf16
  // The defaults are the public options' (the description reads them from here).
  int64_t axis = LayerNormOptions().axis;
  double epsilon = LayerNormOptions().epsilon;
  bool subtract_mean = LayerNormOptions().subtract_mean;
  bool return_residuals = false;

  // Filled by bind.
  int64_t outer = 0, d = 0, inner = 1;
  bool bf16 = false;

  int64_t rows() const { return outer * inner; }
  // Element j of row r (r = o * inner + i).
  int64_t index(int64_t r, int64_t j) const { return (r / inner * d + j) * inner + r % inner; }
  const TensorView& y() const { return outputs.at(0); }
  // [rows] f32 residuals (x's shape without the axis), or null without return_residuals.
  const TensorView* mean() const { return return_residuals ? &outputs.at(1) : nullptr; }
  const TensorView* rstd() const { return return_residuals ? &outputs.at(2) : nullptr; }
  // The residuals' shape: x's without the axis.
  Shape stats_shape() const;
};

// The backward: the forward's arguments, its residuals and the cotangent; outputs dx, then
// dscale with a scale and doffset with an offset.
struct NormVjpCall : NormCall {
  TensorView mean_in, rstd_in, dy;
  const TensorView& dx() const { return outputs.at(0); }
  const TensorView* dscale() const { return scale ? &outputs.at(1) : nullptr; }
  const TensorView* doffset() const { return offset ? &outputs.at(scale ? 2 : 1) : nullptr; }
};

// scale / offset as f32 (a view of their data, or a widened copy in *storage); null if absent.
const float* params_f32(const std::optional<TensorView>& p, Tensor* storage);

class Reference : public TypedImplementation<NormCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(NormCall& call, const Prepared* prepared) const override;
};
class VjpReference : public TypedImplementation<NormVjpCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(NormVjpCall& call, const Prepared* prepared) const override;
};

std::shared_ptr<const Implementation> make_native();
std::shared_ptr<const Implementation> make_composed();
std::shared_ptr<const Implementation> make_vjp_native();
std::shared_ptr<const Implementation> make_vjp_composed();
std::vector<ArgSpec> arg_specs();

// Validation of the forward's arguments (the backward's bind calls it first).
void bind_forward(NormCall& call);
// The public options onto a call.
void set_options(NormCall& call, const LayerNormOptions& options);

class Family : public TypedFamily<NormCall> {
 public:
  Family();
  void bind(NormCall& call) const override { bind_forward(call); }
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::string vjp_name() const override { return kVjpFamily; }
  Json aliases() const override;
  std::vector<ShapeDtype> output_specs(const NormCall& call) const override;
  Tolerance tolerance_of(const NormCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return norm::arg_specs(); }
  bool memory_bound_of(const NormCall&) const override { return true; }
  CallCost cost_of(const NormCall& call) const override;
};
const Family& family();

class VjpFamily : public BackwardFamily<NormVjpCall, NormCall> {
 public:
  VjpFamily();
  std::vector<ShapeDtype> output_specs(const NormVjpCall& call) const override;
  std::vector<OutputDoc> output_docs() const override;
  Tolerance tolerance_of(const NormVjpCall& call) const override;
  bool memory_bound_of(const NormVjpCall&) const override { return true; }
  CallCost cost_of(const NormVjpCall& call) const override;
};
const VjpFamily& vjp_family();

}  // namespace tokamax::norm
