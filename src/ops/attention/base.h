// The dot_product_attention family: its call, bind (all validation), the masks and logit
// transform every implementation shares, the reference implementation and tolerances.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/microkernels.h"
#include "ops/elements.h"
#include "tokamax/op/backward_family.h"
#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/attention.h"

namespace tokamax::attn {

inline constexpr const char* kFamily = "dot_product_attention";
inline constexpr const char* kVjpFamily = "dot_product_attention_vjp";

struct AttentionCall : CallBase {
  // Inputs and statics (see Family's fields).
  TensorView q, k, v;  // [B,T,N,H], [B,S,Nk,H], [B,S,Nk,Hv]
  std::optional<TensorView> bias, mask, q_seq_lengths, kv_seq_lengths;
  std::optional<double> scale;
  bool is_causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded on that side
  std::optional<double> logits_soft_cap;
  bool return_residuals = false;

  // Filled by bind.
  int64_t b = 0, t = 0, s = 0, n = 0, nk = 0, h = 0, hv = 0;
  float scale_value = 1;
  // Element strides of bias / mask over (b, n, t, s); 0 where broadcast.
  int64_t bias_strides[4] = {}, mask_strides[4] = {};

  const TensorView& out() const { return outputs.at(0); }
  // [B,N,T] f32 log-sum-exp, or null without return_residuals.
  const TensorView* lse() const { return return_residuals ? &outputs.at(1) : nullptr; }
  // Query heads per kv head (1 without heads: no call divides by zero).
  int64_t group() const { return nk > 0 ? n / nk : 1; }
  // Whether a logit needs more than the scale (a bias, a mask or a soft cap): logits_row.
  bool elementwise_logits() const { return bias || mask || logits_soft_cap; }
  // Whether the native softmax keeps the raw logits and its exp applies the scale as it reads
  // them (exp_shift_sum), rather than the logits being made first (element by element, or by
  // scale_max for a scale <= 0, which inside the exp would turn a masked -inf into +inf). One
  // rule for the forward and the backward's recompute of P, which must get the same values.
  bool scale_in_exp() const { return !elementwise_logits() && scale_value > 0; }
  // The scale exp_shift_sum applies: the call's with scale_in_exp, else 1 (logits made first).
  float exp_scale() const { return scale_in_exp() ? scale_value : 1.0f; }
  // The i-th of the B * Nk * tb work items (batch, kv head, block of query positions) in run
  // order, as (batch * Nk + kv head) * tb + block: head by head, so the threads share one
  // head's K and V in the caches; causal: a head's later blocks (more kv positions) first, so a
  // call ends on its smallest items (dynamic scheduling balances the tail). Every head's last
  // block first had cycled all heads' K and V (32 MiB at T = S = 2048, 16 heads) through the L3
  // item by item.
  int64_t item_at(int64_t i, int64_t tb) const {
    const int64_t qb = i % tb;
    return i - qb + (is_causal ? tb - 1 - qb : qb);
  }

  // The s range [*s0, *s1) that causality, the window and the lengths leave for row (bb, tt);
  // empty when the row is padding.
  void s_range(int64_t bb, int64_t tt, int64_t* s0, int64_t* s1) const {
    int64_t lo = 0, hi = s;
    if (kv_seq_lengths) hi = std::min<int64_t>(hi, kv_seq_lengths->data_as<const int32_t>()[bb]);
    if (is_causal) hi = std::min<int64_t>(hi, tt + 1);
    if (window_left >= 0) lo = std::max<int64_t>(lo, tt - window_left);
    // A right window of S or more bounds nothing (tested first: tt + window_right + 1 would
    // overflow for a window near 2^63).
    if (window_right >= 0 && window_right < s) hi = std::min<int64_t>(hi, tt + window_right + 1);
    if (q_seq_lengths && tt >= q_seq_lengths->data_as<const int32_t>()[bb]) hi = lo;
    *s0 = lo;
    *s1 = std::max(lo, hi);
  }
  bool mask_allows(int64_t bb, int64_t nn, int64_t tt, int64_t ss) const {
    if (!mask) return true;
    const int64_t i =
        bb * mask_strides[0] + nn * mask_strides[1] + tt * mask_strides[2] + ss * mask_strides[3];
    return mask->data_as<const uint8_t>()[i] != 0;
  }
  // The logits of row (bb, nn, tt) for positions [s0, s0 + count) from their raw dot products,
  // in place: scaled, biased, soft-capped, and -inf where the mask says no; returns their max.
  // The row's bias and mask are walked with their own strides (no per-element index or dtype
  // work), so a broadcast or contiguous row is a plain loop.
  float logits_row(float* x, int64_t bb, int64_t nn, int64_t tt, int64_t s0, int64_t count) const {
    const float sc = scale_value;
    if (bias) {
      const int64_t base =
          bb * bias_strides[0] + nn * bias_strides[1] + tt * bias_strides[2] + s0 * bias_strides[3];
      const int64_t st = bias_strides[3];
      if (bias->dtype() == DType::kF32) {
        const float* bp = bias->data_as<const float>() + base;
        for (int64_t j = 0; j < count; ++j) x[j] = x[j] * sc + bp[j * st];
      } else {
        const uint16_t* bp = bias->data_as<const uint16_t>() + base;
        for (int64_t j = 0; j < count; ++j) x[j] = x[j] * sc + bf16_to_f32(bp[j * st]);
      }
    } else {
      for (int64_t j = 0; j < count; ++j) x[j] *= sc;
    }
    if (logits_soft_cap) {
      const float cap = static_cast<float>(*logits_soft_cap), inv = 1.0f / cap;
      for (int64_t j = 0; j < count; ++j) x[j] = cap * std::tanh(x[j] * inv);
    }
    if (mask) {
      const uint8_t* mp = mask->data_as<const uint8_t>() + bb * mask_strides[0] +
                          nn * mask_strides[1] + tt * mask_strides[2] + s0 * mask_strides[3];
      const int64_t st = mask_strides[3];
      for (int64_t j = 0; j < count; ++j) x[j] = mp[j * st] ? x[j] : -INFINITY;
    }
    float mx = -INFINITY;
    for (int64_t j = 0; j < count; ++j)
      mx = x[j] > mx || std::isnan(x[j]) ? x[j] : mx;  // NaN sticks
    return mx;
  }

  // The logit from the raw dot product q.k: scaled, biased, soft-capped.
  float logit(float dot, int64_t bb, int64_t nn, int64_t tt, int64_t ss) const {
    float x = dot * scale_value;
    if (bias) {
      const int64_t i =
          bb * bias_strides[0] + nn * bias_strides[1] + tt * bias_strides[2] + ss * bias_strides[3];
      x += bias->dtype() == DType::kF32 ? bias->data_as<const float>()[i]
                                        : bf16_to_f32(bias->data_as<const uint16_t>()[i]);
    }
    if (logits_soft_cap) {
      const float cap = static_cast<float>(*logits_soft_cap);
      x = cap * std::tanh(x / cap);
    }
    return x;
  }
};

class Reference : public TypedImplementation<AttentionCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(AttentionCall& call, const Prepared* prepared) const override;
};

// The backward: the forward's arguments and options plus its output, log-sum-exp and the
// cotangent; outputs dq, dk, dv (and dbias with a bias).
struct AttentionVjpCall : AttentionCall {
  TensorView o, lse_in, dout;  // [B,T,N,Hv], [B,N,T] f32, [B,T,N,Hv]
  const TensorView& dq() const { return outputs.at(0); }
  const TensorView& dk() const { return outputs.at(1); }
  const TensorView& dv() const { return outputs.at(2); }
  const TensorView* dbias() const { return bias ? &outputs.at(3) : nullptr; }
  // Row (b, n, t)'s probabilities' log normalizer.
  float lse_at(int64_t bb, int64_t nn, int64_t tt) const {
    return lse_in.data_as<const float>()[(bb * n + nn) * t + tt];
  }
  // dx -> dz through the soft cap (x = cap tanh(z / cap)): 1 - (x / cap)^2; 1 without a cap.
  float cap_grad(float x) const {
    if (!logits_soft_cap) return 1.0f;
    const float u = x / static_cast<float>(*logits_soft_cap);
    return 1.0f - u * u;
  }
  // Where dbias element (b, n, t, s) accumulates (its broadcast index).
  int64_t bias_index(int64_t bb, int64_t nn, int64_t tt, int64_t ss) const {
    return bb * bias_strides[0] + nn * bias_strides[1] + tt * bias_strides[2] +
           ss * bias_strides[3];
  }
};

class VjpReference : public TypedImplementation<AttentionVjpCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(AttentionVjpCall& call, const Prepared* prepared) const override;
};

std::shared_ptr<const Implementation> make_native();
std::shared_ptr<const Implementation> make_vjp_native();
std::shared_ptr<const Implementation> make_vjp_composed();
std::shared_ptr<const Implementation> make_composed();
std::vector<ArgSpec> arg_specs();

class Family : public TypedFamily<AttentionCall> {
 public:
  Family();
  void bind(AttentionCall& call) const override;
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::string vjp_name() const override { return kVjpFamily; }
  std::vector<ShapeDtype> output_specs(const AttentionCall& call) const override;
  Tolerance tolerance_of(const AttentionCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return attn::arg_specs(); }
  bool memory_bound_of(const AttentionCall& call) const override;
  CallCost cost_of(const AttentionCall& call) const override;
};

const Family& family();

// The public options onto a call (forward or backward); InvalidArgument for a negative window.
void set_options(AttentionCall& call, const AttentionOptions& options);
// Validation of the forward's arguments (the backward's bind calls it first).
void bind_forward(AttentionCall& call);

class VjpFamily : public BackwardFamily<AttentionVjpCall, AttentionCall> {
 public:
  VjpFamily();
  std::vector<ShapeDtype> output_specs(const AttentionVjpCall& call) const override;
  std::vector<OutputDoc> output_docs() const override;
  Tolerance tolerance_of(const AttentionVjpCall& call) const override;
  bool has_backward_spec(const ArgSpec& s) const override;
  CallCost cost_of(const AttentionVjpCall& call) const override;
};
const VjpFamily& vjp_family();

// Useful flops: 4 * B * N * H-ish per allowed logit (q.k and p.v), counting only logits that
// causality and the window leave (halved for causal, as the figure).
double call_flops(const AttentionCall& c);
// The bytes a call must read at least: q, k, v and the output.
double call_bytes(const AttentionCall& c);
// Whether the native q k^T and P v run on a bf16 kernel as bf16 pairs: bf16 q, k and v where
// the CPU's kernel set has the AMX tiles, or a vector bf16 dot that outruns the widened f32
// FMAs (vector_bf16_dot_pays: Zen 4).
bool native_uses_bf16_pairs(const AttentionCall& c);

// f32 panels of ks.nr columns (kernels::pack_panels) from one (batch b, kv head) slice of x
// [B,S,Nk,D] (k or v), widened from bf16 where x is bf16; the native forward and backward pack
// K and V with it once per call.
//  - across_positions: panels [p0, p1) of x^T, dst[p - p0][D][nr]: column j of panel p is
//    position p * nr + j (zero past S);
//  - else panels [p0, p1) of x, dst[p - p0][S][nr]: column j of panel p is feature p * nr + j
//    (zero past D).
void kv_panels(const kernels::KernelSet& ks, const TensorView& x, int64_t b, int64_t kh,
               bool across_positions, int64_t p0, int64_t p1, float* dst);

}  // namespace tokamax::attn
