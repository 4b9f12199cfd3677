// The gated_linear_unit family: its call, bind (all validation), the reference, tolerances and
// cost; and the backward family gated_linear_unit_vjp. Rows are x's leading dims flattened
// (M); the gate's and the up projection's weights are each a [K, N] matrix with row stride
// `ld` (2N inside a stacked [K, 2, N] w, N when they come separate).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "kernels/activation.h"
#include "kernels/microkernels.h"
#include "ops/elements.h"
#include "tokamax/op/backward_family.h"
#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/glu.h"

namespace tokamax::glu {

inline constexpr const char* kFamily = "gated_linear_unit";
inline constexpr const char* kVjpFamily = "gated_linear_unit_vjp";

struct GluCall : CallBase {
  TensorView x;                    // [..., M, K]
  TensorView w;                    // [K, 2, N], or the gate's [K, N] with w_up
  std::optional<TensorView> w_up;  // [K, N]
  PackedGluWeights packed;         // native's pre-packed weights (w then has no data)
  bool packed_w = false;           // part of the key: a pre-packed call tunes apart
  Activation activation = GluOptions().activation;
  bool return_residuals = false;

  // Filled by bind.
  int64_t m = 0, k = 0, n = 0;
  DType w_dtype = DType::kF32;

  const TensorView& out() const { return outputs.at(0); }
  const TensorView* h() const { return return_residuals ? &outputs.at(1) : nullptr; }
  // The gate's (half 0) or the up projection's (half 1) [K, N] weights and their row stride.
  const void* weights(int half, int64_t* ld) const;
  Shape out_shape() const;
  Shape h_shape() const;
};

// The backward: x, the stacked w, the residual h and the cotangent; outputs dx and dw.
struct GluVjpCall : GluCall {
  TensorView h_in, dout;
  const TensorView& dx() const { return outputs.at(0); }
  const TensorView& dw() const { return outputs.at(1); }
};

class Reference : public TypedImplementation<GluCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void check_call(const GluCall& c) const override;
  void run_call(GluCall& call, const Prepared* prepared) const override;
};
// The forward's elementwise part for rows [r0, r0 + rows) of h ([M, 2N] f32, each row gate then
// up): the residual copied out when asked for, then out = activation(gate) * up on the ISA's
// vector loop. h's gate half is overwritten on the way to a bf16 output.
void activate_rows(const GluCall& c, float* h, int64_t r0, int64_t rows, kernels::Isa isa);
// The backward's elementwise part, dh (f32 [M, 2N], each row gate then up) from h and dout:
// dh_gate = dout * up * act'(gate), dh_up = dout * act(gate). Every backward shares it: the
// reference on the portable loop (libm, the derivative in double), the others on the ISA's.
void compute_dh(const GluVjpCall& c, float* dh, kernels::Isa isa);

class VjpReference : public TypedImplementation<GluVjpCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(GluVjpCall& call, const Prepared* prepared) const override;
};

std::shared_ptr<const Implementation> make_native();
std::shared_ptr<const Implementation> make_composed();
std::shared_ptr<const Implementation> make_vjp_native();
std::shared_ptr<const Implementation> make_vjp_composed();
std::vector<ArgSpec> arg_specs();
// Packs the call's weights (native.cc); whether packed weights hold bf16 pairs.
std::shared_ptr<const PackedGluWeights::Rep> pack(const GluCall& c, int threads);
bool packed_pairs(const PackedGluWeights& p);

void bind_forward(GluCall& call);

class Family : public TypedFamily<GluCall> {
 public:
  Family();
  void bind(GluCall& call) const override { bind_forward(call); }
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::string vjp_name() const override { return kVjpFamily; }
  std::vector<ShapeDtype> output_specs(const GluCall& call) const override;
  Tolerance tolerance_of(const GluCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return glu::arg_specs(); }
  CallCost cost_of(const GluCall& call) const override;
  void finish_made_call(GluCall& call) const override;
  std::vector<std::pair<std::string, Json>> argument_variants() const override {
    return {{"packed", Json{{"packed_w", true}}}};
  }
  bool data_held_elsewhere(const GluCall& call, const std::string& name) const override {
    return name == "w" && !call.packed.empty();
  }
};
const Family& family();

class VjpFamily : public BackwardFamily<GluVjpCall, GluCall> {
 public:
  VjpFamily();
  std::vector<ShapeDtype> output_specs(const GluVjpCall& call) const override;
  std::vector<OutputDoc> output_docs() const override;
  Tolerance tolerance_of(const GluVjpCall& call) const override;
  CallCost cost_of(const GluVjpCall& call) const override;
};
const VjpFamily& vjp_family();

// 2 M K 2N: both projections.
double call_flops(const GluCall& c);
// Whether bf16 weights run on the bf16 dot (pairs) for this call.
bool uses_bf16_dot(const GluCall& c);
// Whether x is rounded to bf16 (bf16_weights_round_x in ops/elements.h).
bool rounds_x(const GluCall& c);

}  // namespace tokamax::glu
