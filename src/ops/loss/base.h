// The linear_softmax_cross_entropy_loss family: its call, bind (all validation, labels
// included), the reference, tolerances and cost; and the backward family
// linear_softmax_cross_entropy_loss_vjp.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "ops/elements.h"
#include "tokamax/core/enum_names.h"
#include "tokamax/op/backward_family.h"
#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/loss.h"

namespace tokamax::loss {

inline constexpr const char* kFamily = "linear_softmax_cross_entropy_loss";
inline constexpr const char* kVjpFamily = "linear_softmax_cross_entropy_loss_vjp";

const EnumNames<LossReduction, 3>& reduction_names();

struct LossCall : CallBase {
  TensorView x, labels, w;  // [B, H], i32 [B], [H, V]
  LossReduction reduction = LossOptions().reduction;
  bool return_residuals = false;

  // Filled by bind.
  int64_t b = 0, h = 0, v = 0;

  const TensorView& loss() const { return outputs.at(0); }
  const TensorView* lse() const { return return_residuals ? &outputs.at(1) : nullptr; }
  int32_t label(int64_t row) const { return labels.data_as<const int32_t>()[row]; }
  Shape loss_shape() const { return reduction == LossReduction::kNone ? Shape{b} : Shape{}; }
  // Writes the per-row losses reduced as asked.
  void write_loss(const std::vector<double>& per_row) const;
};

struct LossVjpCall : LossCall {
  TensorView lse_in, dloss;  // [B] f32, the loss's shape f32
  const TensorView& dx() const { return outputs.at(0); }
  const TensorView& dw() const { return outputs.at(1); }
  // d loss / d loss_b: dloss (per row, or the scalar, over B for the mean).
  float row_weight(int64_t row) const;
};

// A made call's labels: uniform in [0, V), V read from its w's shape (set before any fill).
inline void labels_within(const LossCall& c, const TensorView& v, uint64_t seed) {
  const int64_t vocab = c.w.rank() == 2 ? c.w.dim(1) : 0;
  Tensor u = Tensor::uniform(v.shape(), DType::kF64, seed);
  for (int64_t i = 0; i < v.size(); ++i) {
    v.data_as<int32_t>()[i] = static_cast<int32_t>(std::min<int64_t>(
        std::max<int64_t>(vocab - 1, 0), static_cast<int64_t>(u.data_as<double>()[i] * vocab)));
  }
}

class Reference : public TypedImplementation<LossCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(LossCall& call, const Prepared* prepared) const override;
};
class VjpReference : public TypedImplementation<LossVjpCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(LossVjpCall& call, const Prepared* prepared) const override;
};

std::shared_ptr<const Implementation> make_native();
std::shared_ptr<const Implementation> make_composed();
std::shared_ptr<const Implementation> make_vjp_native();
std::shared_ptr<const Implementation> make_vjp_composed();
std::vector<ArgSpec> arg_specs();

void bind_forward(LossCall& call);

class Family : public TypedFamily<LossCall> {
 public:
  Family();
  void bind(LossCall& call) const override { bind_forward(call); }
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::string vjp_name() const override { return kVjpFamily; }
  std::vector<ShapeDtype> output_specs(const LossCall& call) const override;
  Tolerance tolerance_of(const LossCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return loss::arg_specs(); }
  CallCost cost_of(const LossCall& call) const override;
};
const Family& family();

class VjpFamily : public BackwardFamily<LossVjpCall, LossCall> {
 public:
  VjpFamily();
  std::vector<ShapeDtype> output_specs(const LossVjpCall& call) const override;
  std::vector<OutputDoc> output_docs() const override;
  Tolerance tolerance_of(const LossVjpCall& call) const override;
  CallCost cost_of(const LossVjpCall& call) const override;
};
const VjpFamily& vjp_family();

double call_flops(const LossCall& c);  // 2 B H V: the product
// Whether native computes the logits x w on the bf16 dot as bf16 pairs: bf16 weights where the
// dot pays (AMX), x then rounded to bf16 as the gated linear unit and ragged_dot do (every
// product exact).
bool native_logits_on_bf16_dot(const LossCall& c);
// Whether x is rounded to bf16 (bf16_weights_round_x in ops/elements.h), forward and backward.
bool rounds_x(const LossCall& c);
// x[i] as f32, rounded to bf16 where rounds_x says.
float x_value(const LossCall& c, int64_t i);
// All of x as f32 (rounded where rounds_x says): x itself, or a copy made once per call.
const float* x_as_f32(const LossCall& c, Tensor* storage);

}  // namespace tokamax::loss
