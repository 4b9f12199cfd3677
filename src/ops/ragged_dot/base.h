// The ragged_dot family: typed call, bind (all shape validation lives here), the reference
// implementation, tolerances and shared helpers (activations, dtype access).
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "tokamax/op/op.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/ragged_dot.h"

namespace tokamax::rdot {

inline constexpr const char* kFamily = "ragged_dot";

struct RaggedDotCall : CallBase {
  TensorView lhs;    // [M,K]
  TensorView rhs;    // [G,K,N] / [G,N,K] / [M,N]; may be empty when packed is set
  PackedRhs packed;  // native's pre-packed weights (forward / transposed forms)
  std::vector<int32_t> group_sizes;
  std::vector<int64_t> offsets;  // G+1 exclusive prefix sums
  RaggedDimNums dims = RaggedDimNums::kForward;
  DType out_dtype = DType::kF32;
  Activation activation = Activation::kNone;
  Precision precision = Precision::kDefault;
  int64_t m = 0, k = 0, n = 0, g = 0;  // logical sizes: out [M,N] (or [G,K,N]), contraction K
  // Storage when the call was made from a spec (autotuner, bench).
  std::vector<Tensor> owned;

  const TensorView& out() const { return outputs.at(0); }
  // Whether the lhs is rounded to bf16 (kDefault with bf16 rhs).
  bool lhs_as_bf16() const;
  // Element i of the lhs as every implementation multiplies it: f32, rounded to bf16 when
  // lhs_as_bf16().
  float lhs_value(int64_t i) const;
  // The whole lhs that way: its own data when it already is, else a converted copy in *storage.
  const float* lhs_f32(Tensor* storage) const;
};

// Validates everything and fills the call (not outputs). rhs_spec is the logical rhs (from
// `rhs` or `packed`). Throws InvalidArgument naming the argument, its shape and what was expected.
// threads: the thread count the call runs with (0 = num_threads()); it is part of the key.
// packed_rhs: the weights arrive pre-packed (pack_rhs), also part of the key: the two forms
// are different calls (an unpacked call packs, or streams, inside its own time) and tune apart.
void bind_call(RaggedDotCall& call, const TensorView& lhs, const ShapeDtype& rhs_spec,
               std::span<const int32_t> group_sizes, RaggedDimNums dims,
               const RaggedDotOptions& options, int threads = 0, bool packed_rhs = false);

ShapeDtype output_spec(const RaggedDotCall& call);

inline float apply_activation(Activation a, float x) {
  switch (a) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0.0f;
    case Activation::kSilu:
      return x / (1.0f + std::exp(-x));
    case Activation::kGelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::kGeluTanh:
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}
// d activation / dx at x.
double activation_grad(Activation a, double x);

// Element i of a contiguous f32 or bf16 buffer as f32.
inline float load_f32(const void* p, DType dt, int64_t i) {
  return dt == DType::kF32 ? static_cast<const float*>(p)[i]
                           : bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
}
inline void store_out(void* p, DType dt, int64_t i, float v) {
  if (dt == DType::kF32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
}

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

class Family : public OpFamily {
 public:
  Family();
  std::string name() const override { return kFamily; }
  std::vector<std::shared_ptr<const Implementation>> implementations() const override {
    return impls_;
  }
  std::shared_ptr<const Implementation> reference() const override { return reference_; }
  BoundArguments bind_json(const Json& arguments, const std::string& implementation) const override;
  std::unique_ptr<CallBase> make_call(const BoundArguments& bound, uint64_t seed) const override;
  Tolerance tolerance(const CallBase& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return rdot::arg_specs(); }
  bool memory_bound(const CallBase& call) const override;
  CallCost cost(const CallBase& call) const override;
  std::vector<std::pair<std::string, Json>> argument_variants() const override {
    return {{"packed", Json{{"packed_rhs", true}}}};
  }
  std::vector<std::string> bench_rows(const CallBase& call) const override;

 private:
  std::vector<std::shared_ptr<const Implementation>> impls_;
  std::shared_ptr<const Implementation> reference_;
};

const Family& family();

// Flops and bytes a call moves, for benchmarks.
double call_flops(const RaggedDotCall& c);
double weight_bytes(const RaggedDotCall& c);
// Few rows per group: the call's time is the time to read the weights once.
bool weight_streaming(const RaggedDotCall& c);
// Total rows spread over `groups` uniformly at random with `seed` (tokamax's representative
// distribution).
std::vector<int32_t> generate_group_sizes(int64_t total, int64_t groups, uint64_t seed = 0);

}  // namespace tokamax::rdot
