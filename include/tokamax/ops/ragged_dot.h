// ragged_dot: grouped matmul for mixture-of-experts. Rows [cum[g], cum[g+1]) of lhs (cum is
// the exclusive prefix sum of group_sizes) are multiplied with rhs[g]. Output rows past
// sum(group_sizes) are zero. Three dimension-number forms (as tokamax / jax.lax):
//   kForward           [M,K] x [G,K,N] -> [M,N]
//   kTransposedRhs     [M,K] x [G,N,K] -> [M,N]   (the lhs gradient)
//   kRaggedContracting [M,K] x [M,N]   -> [G,K,N] (the rhs gradient; empty groups give zeros)
// dtypes: f32 x f32 -> f32; bf16 x bf16 -> bf16 or f32; f32 x bf16 -> f32. Accumulation is f32.
// Precision kDefault lets an implementation round an f32 lhs to bf16 when rhs is bf16 (products
// of bf16 values are exact in f32; this is what the CPU's bf16 dot instruction computes);
// kHighest keeps the lhs in f32. Every implementation, the reference included, follows it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"
#include "tokamax/core/activation.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class RaggedDimNums { kForward, kTransposedRhs, kRaggedContracting };
enum class Precision { kDefault, kHighest };

std::string_view dim_nums_name(RaggedDimNums d);
RaggedDimNums parse_dim_nums(std::string_view s);

// Weights packed once into the native kernel's layout (as oneDNN and FBGEMM do). Immutable;
// share it between calls and threads.
class PackedRhs {
 public:
  struct Rep;
  PackedRhs() = default;
  explicit PackedRhs(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  bool empty() const { return !rep_; }
  // The logical rhs this was packed from ([G,K,N] for kForward, [G,N,K] for kTransposedRhs).
  ShapeDtype logical() const;
  RaggedDimNums dim_nums() const;
  // Whether the weights were packed as bf16 pairs for the CPU's bf16 dot (else as f32 panels).
  bool bf16_dot() const;
  const Rep* rep() const { return rep_.get(); }

 private:
  std::shared_ptr<const Rep> rep_;
};

// Packs rhs for the native implementation on this CPU. precision as in RaggedDotOptions: with
// kHighest, bf16 weights are widened to f32 panels.
PackedRhs pack_rhs(const TensorView& rhs, RaggedDimNums dim_nums = RaggedDimNums::kForward,
                   Precision precision = Precision::kDefault);

struct RaggedDotOptions {
  std::optional<DType> preferred_element_type;
  Activation activation = Activation::kNone;  // applied to the f32 accumulator
  Precision precision = Precision::kDefault;
  std::string implementation;    // "", "native", "blas", "reference"
  std::optional<Config> config;  // needs `implementation`
  // The group-size distribution tuning keys on. Default: {num_groups, total_size = rows of lhs}
  // (the actual sizes change every step in MoE inference); set it to key on explicit sizes.
  std::optional<std::vector<int32_t>> representative_group_sizes;
};

Tensor ragged_dot(const TensorView& lhs, const TensorView& rhs,
                  std::span<const int32_t> group_sizes, const RaggedDotOptions& options = {});
Tensor ragged_dot(const TensorView& lhs, const PackedRhs& rhs, std::span<const int32_t> group_sizes,
                  const RaggedDotOptions& options = {});
// The out-variants: write into `out` (contiguous, exactly the output's shape and dtype, no
// overlap with an input; else InvalidArgument) instead of allocating, so that a serving loop
// reuses one buffer per step (the analogue of buffer donation). Every element is written.
void ragged_dot_into(const TensorView& lhs, const TensorView& rhs,
                     std::span<const int32_t> group_sizes, const TensorView& out,
                     const RaggedDotOptions& options = {});
void ragged_dot_into(const TensorView& lhs, const PackedRhs& rhs,
                     std::span<const int32_t> group_sizes, const TensorView& out,
                     const RaggedDotOptions& options = {});
// group_sizes as an i32 tensor of shape [G].
Tensor ragged_dot(const TensorView& lhs, const TensorView& rhs, const TensorView& group_sizes,
                  const RaggedDotOptions& options = {});
Tensor ragged_dot_general(const TensorView& lhs, const TensorView& rhs,
                          std::span<const int32_t> group_sizes, RaggedDimNums dim_nums,
                          const RaggedDotOptions& options = {});

struct RaggedDotGrads {
  Tensor dlhs;  // [M,K], lhs dtype
  Tensor drhs;  // [G,K,N], rhs dtype; exactly zero for empty groups
};
// Gradients of ragged_dot(lhs, rhs, group_sizes, options) (forward form) for cotangent dout [M,N].
RaggedDotGrads ragged_dot_vjp(const TensorView& lhs, const TensorView& rhs,
                              std::span<const int32_t> group_sizes, const TensorView& dout,
                              const RaggedDotOptions& options = {});

// The native implementation's config: blocking sizes, microkernel rows and work split.
struct RaggedDotNativeConfig {
  int mr = 8;    // rows per microkernel tile
  int mc = 64;   // rows per work item (multiple of mr)
  int kc = 256;  // K block
  int nc = 256;  // columns per work item (multiple of the panel width)
  Json to_json() const;
  static RaggedDotNativeConfig from_json(const Json& j);
  friend bool operator==(const RaggedDotNativeConfig&, const RaggedDotNativeConfig&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
