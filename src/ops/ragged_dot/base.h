// The ragged_dot family: typed call, bind (all shape validation lives here), the reference
// implementation, tolerances and shared helpers (activations, dtype access).
#pragma once

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/activation.h"
#include "ops/elements.h"
#include "ops/ragged_dot/groups.h"
#include "tokamax/op/family.h"
#include "tokamax/op/op.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/ragged_dot.h"

namespace tokamax::rdot {

inline constexpr const char* kFamily = "ragged_dot";

struct RaggedDotCall : CallBase {
  // Inputs and statics (the arguments; see Family's fields).
  TensorView lhs;    // [M,K]
  TensorView rhs;    // [G,K,N] / [G,N,K] / [M,N]; no data when the weights come packed
  PackedRhs packed;  // native's pre-packed weights (forward / transposed forms)
  std::vector<int32_t> group_sizes;
  RaggedDimNums dims = RaggedDimNums::kForward;
  std::optional<DType> preferred_element_type;
  Activation activation = Activation::kNone;
  Precision precision = Precision::kDefault;
  // The weights arrive pre-packed (pack_rhs). Part of the key: the two forms are different
  // calls (an unpacked call packs, or streams, inside its own time) and tune apart.
  bool packed_rhs = false;
  // What the key says of the group sizes: the representative sizes when given, else
  // {num_groups, total_size = key_total_rows} (the rows of lhs unless a spec says otherwise).
  std::optional<std::vector<int32_t>> representative_group_sizes;
  int64_t key_total_rows = -1;
  // A {num_groups, total_size} spec's group count, until bind spreads key_total_rows over that
  // many groups (after checking them against lhs: the spread takes time in proportion to the
  // rows); -1 otherwise.
  int64_t pending_groups = -1;

  // Filled by bind.
  std::vector<int64_t> offsets;  // G+1 exclusive prefix sums
  DType out_dtype = DType::kF32;
  int64_t m = 0, k = 0, n = 0, g = 0;  // logical sizes: out [M,N] (or [G,K,N]), contraction K

  const TensorView& out() const { return outputs.at(0); }
  // Whether the lhs is rounded to bf16 (kDefault with bf16 rhs).
  bool lhs_as_bf16() const;
  // Element i of the lhs as every implementation multiplies it: f32, rounded to bf16 when
  // lhs_as_bf16().
  float lhs_value(int64_t i) const;
  // The whole lhs that way: its own data when it already is, else a converted copy in *storage.
  const float* lhs_f32(Tensor* storage) const;
};

ShapeDtype output_spec(const RaggedDotCall& call);

using kernels::activation_grad;
using kernels::apply_activation;

class Reference : public TypedImplementation<RaggedDotCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(RaggedDotCall& call, const Prepared* prepared) const override;
};

std::shared_ptr<const Implementation> make_native();
// Whether native runs the call on the bf16 dot (bf16 pair panels) rather than the f32 FMA: the
// one decision its kernels and the benchmarks' ceilings both follow.
bool native_uses_bf16_dot(const RaggedDotCall& call);
std::shared_ptr<const Implementation> make_blas();
std::vector<ArgSpec> arg_specs();

// One unit in the last place of a bf16 value, relative to it (at most).
inline constexpr double kBf16OutputUlp = 1.0 / 128;

class Family : public TypedFamily<RaggedDotCall> {
 public:
  Family();
  void bind(RaggedDotCall& call) const override;
  std::vector<ShapeDtype> output_specs(const RaggedDotCall& call) const override {
    return {output_spec(call)};
  }
  Tolerance tolerance_of(const RaggedDotCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return rdot::arg_specs(); }
  bool memory_bound_of(const RaggedDotCall& call) const override;
  CallCost cost_of(const RaggedDotCall& call) const override;
  std::vector<std::pair<std::string, Json>> argument_variants() const override {
    return {{"packed", Json{{"packed_rhs", true}}}};
  }
  void finish_made_call(RaggedDotCall& call) const override;
  bool data_held_elsewhere(const RaggedDotCall& call, const std::string& name) const override {
    return name == "rhs" && !call.packed.empty();
  }
};

const Family& family();

// Flops and bytes a call moves, for benchmarks.
double call_flops(const RaggedDotCall& c);
double weight_bytes(const RaggedDotCall& c);
// Few rows per group: the call's time is the time to read the weights once.
bool weight_streaming(const RaggedDotCall& c);

}  // namespace tokamax::rdot
