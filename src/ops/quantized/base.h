// The quantized_ragged_dot family (tokamax/ops/quantized.h): its call and description, bind
// (every check of the quantized layout), the reference, the native implementation's entry, the
// codecs quantize and dequantize use, and the arg specs.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "kernels/qstream.h"
#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/quantized.h"

namespace tokamax::quant {

inline constexpr const char* kFamily = "quantized_ragged_dot";

struct QCall : CallBase {
  TensorView lhs;                   // f32 or bf16 [M, K]
  TensorView values;                // [G, P, K, row bytes]: i8 (int8), u8 (the others)
  TensorView scales;                // [G, P, K / group_size, 64]: f32, u8 (mxfp4)
  std::optional<TensorView> zeros;  // u8 as scales: asymmetric int4
  std::vector<int32_t> group_sizes;
  QuantFormat format = QuantFormat::kInt8;
  int64_t n = 0;           // the logical N (the panels pad it to a multiple of 64)
  int64_t group_size = 0;  // along K; 0: K
  Activation activation = Activation::kNone;
  // As ragged_dot's (ops/ragged_dot/groups.h).
  std::optional<std::vector<int32_t>> representative_group_sizes;
  int64_t key_total_rows = -1;
  int64_t pending_groups = -1;

  // Filled by bind.
  std::vector<int64_t> offsets;
  DType out_dtype = DType::kF32;
  int64_t m = 0, k = 0, g = 0, panels = 0, gs = 0;  // gs: the group size in effect

  const TensorView& out() const { return outputs.at(0); }
};

kernels::QFormat kernel_format(QuantFormat f);
// The expected arrays' specs of a format and logical size (the layout's one definition).
ShapeDtype values_spec(QuantFormat f, int64_t g, int64_t k, int64_t n);
ShapeDtype scales_spec(QuantFormat f, int64_t g, int64_t k, int64_t n, int64_t group_size);
// The group size in effect: `group_size`, or its default for the format (K; 32 for mxfp4).
int64_t effective_group_size(QuantFormat f, int64_t k, int64_t group_size);
// Throws InvalidArgument unless 0 <= G, K, N <= 2^40 (so that the layout's sizes cannot
// overflow).
void check_sizes(int64_t g, int64_t k, int64_t n, const char* op);
// Throws InvalidArgument unless group_size suits the format and K.
void check_group_size(QuantFormat f, int64_t k, int64_t group_size, const char* op);

// Weight (g, k, j) of a quantized layout, in f32 (s * value, one rounding).
float weight_at(QuantFormat f, const void* values, const void* scales, const uint8_t* zeros,
                int64_t panels, int64_t k, int64_t gs, int64_t g, int64_t kk, int64_t j);

std::shared_ptr<const Implementation> make_native();
std::vector<ArgSpec> arg_specs();

class Family : public TypedFamily<QCall> {
 public:
  Family();
  void bind(QCall& call) const override;
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::vector<ShapeDtype> output_specs(const QCall& c) const override {
    return {{{c.m, c.n}, c.out_dtype}};
  }
  Tolerance tolerance_of(const QCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return quant::arg_specs(); }
  bool memory_bound_of(const QCall& call) const override;
  CallCost cost_of(const QCall& call) const override;
  void finish_made_call(QCall& call) const override;
};
const Family& family();

double weight_bytes(const QCall& c);

}  // namespace tokamax::quant
