// The moe_experts family (tokamax/ops/moe.h): its call and description, bind (every shape and
// routing check), the reference, the native implementation's entry and the arg specs.
#pragma once

#include <memory>
#include <vector>

#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/moe.h"

namespace tokamax::moe {

inline constexpr const char* kFamily = "moe_experts";

struct MoeCall : CallBase {
  TensorView hidden;         // [T, K] f32 / bf16
  TensorView top_k_index;    // [T, k] i32 / i64, each in [0, E)
  TensorView top_k_weights;  // [T, k] f32 / bf16
  TensorView w_gate_up;      // [E, K, 2N] ([E, 2N, K] transposed); no data when packed
  TensorView w_down;         // [E, N, K] ([E, K, N] transposed); no data when packed
  Activation activation = Activation::kSilu;
  bool transposed_weights = false;
  // The weights arrive packed (pack_moe_weights): part of the key, as ragged_dot's packed_rhs.
  bool packed_weights = false;
  PackedMoeWeights packed;

  // Filled by bind.
  int64_t t = 0, k = 0, top_k = 0, e = 0, n = 0;
  // The routing, when the indices have data: rows per expert and, for slot s = t * top_k + j,
  // its row in the expert-sorted order (stable: an expert's rows keep token order).
  std::vector<int32_t> counts;
  std::vector<int64_t> sorted_row;

  const TensorView& out() const { return outputs.at(0); }
  // The dtype the gated activations are multiplied in by the down product: bf16 when w_down is
  // (ragged_dot's kDefault rounds them so), else f32.
  DType act_dtype() const;
};

std::shared_ptr<const Implementation> make_native();
std::vector<ArgSpec> arg_specs();

class Family : public TypedFamily<MoeCall> {
 public:
  Family();
  void bind(MoeCall& call) const override;
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::vector<ShapeDtype> output_specs(const MoeCall& c) const override {
    return {{{c.t, c.k}, c.hidden.dtype()}};
  }
  Tolerance tolerance_of(const MoeCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return moe::arg_specs(); }
  bool memory_bound_of(const MoeCall& call) const override;
  CallCost cost_of(const MoeCall& call) const override;
  std::vector<std::pair<std::string, Json>> argument_variants() const override {
    return {{"packed", Json{{"packed_weights", true}}}};
  }
  void finish_made_call(MoeCall& call) const override;
  bool data_held_elsewhere(const MoeCall& call, const std::string& name) const override {
    return (name == "w_gate_up" || name == "w_down") && !call.packed.empty();
  }
};
const Family& family();

// Bytes of expert weights a call reads (the experts its tokens hit).
double weight_bytes(const MoeCall& c);

}  // namespace tokamax::moe
