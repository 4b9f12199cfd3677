// dot_product_attention_vjp: the backward as an op of its own (tokamax's ...Vjp ops): its
// arguments (the forward's, its output and log-sum-exp, the cotangent), bind, the reference
// and the public function. With P = exp(x - lse) recomputed from the saved log-sum-exp:
//   dv_s = sum_t P_ts do_t,   dP_ts = do_t . v_s,   D_t = do_t . o_t,
//   dx_ts = P_ts (dP_ts - D_t),   dz = dx (1 - (x / cap)^2) under a soft cap,
//   dq_t = scale sum_s dz_ts k_s,   dk_s = scale sum_t dz_ts q_t,   dbias = dz (summed where
//   the bias broadcasts); dk and dv sum over the query heads that share a kv head.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/thread_pool.h"
#include "ops/attention/base.h"

namespace tokamax {
namespace attn {

VjpFamily::VjpFamily()
    : BackwardFamily(kVjpFamily, family(),
                     {{"out", &AttentionVjpCall::o, "the forward's output"},
                      {"lse", &AttentionVjpCall::lse_in, "the forward's residual, f32 [B, N, T]"}},
                     {"dout", &AttentionVjpCall::dout, "the cotangent of out"},
                     std::make_shared<VjpReference>(), {make_vjp_native(), make_vjp_composed()}) {}

const VjpFamily& vjp_family() { return family_instance<VjpFamily>(); }

std::vector<ShapeDtype> VjpFamily::output_specs(const AttentionVjpCall& c) const {
  std::vector<ShapeDtype> out = {c.q.spec(), c.k.spec(), c.v.spec()};
  if (c.bias) out.push_back({c.bias->shape(), DType::kF32});
  return out;
}

std::vector<OutputDoc> VjpFamily::output_docs() const {
  return {{"dq", "q's shape and dtype", "q.shape", "q.dtype"},
          {"dk", "k's shape and dtype", "k.shape", "k.dtype"},
          {"dv", "v's shape and dtype", "v.shape", "v.dtype"},
          {"dbias", "f32, bias's shape, with a bias", "bias.shape", "float32", "bias"}};
}

Tolerance VjpFamily::tolerance_of(const AttentionVjpCall& c) const {
  // Gradients sum over T or S in different orders (tokamax: atol_grads = 2 * atol).
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>(std::max(c.s, c.t), 1)));
  if (c.q.dtype() == DType::kBF16) return {2e-2, 2e-2, 0};
  // A bias broadcast over more than a row's length sums that many logit gradients into each
  // dbias element, and they cancel: a normwise bound relative to the sum means nothing there (a
  // fuzzed f32[] bias over 2,244 logits summed to near zero, two correct orders 1.5e-3 apart
  // relative to it, 0 elements outside the bounds below). Such calls keep the elementwise
  // bounds only.
  double normwise = 1e-5;
  if (c.bias && c.bias->size() > 0 &&
      c.b * c.n * c.t * c.s > c.bias->size() * std::max<int64_t>(std::max(c.s, c.t), 1))
    normwise = 0;
  return {2e-5 * depth, 1e-4, normwise};
}

CallCost VjpFamily::cost_of(const AttentionVjpCall& c) const {
  return {2.5 * call_flops(c), 0.0, false};  // the usual count: 2.5x the forward's
}

bool VjpFamily::has_backward_spec(const ArgSpec& s) const {
  return s.name == "smoke" || s.name == "smoke_masked" || s.name == "prefill" ||
         s.name == "prefill_causal";
}

// --- reference: per (batch, kv head), every row of its group recomputed in full ---

void VjpReference::run_call(AttentionVjpCall& c, const Prepared*) const {
  const int64_t G = c.group();
  for (const TensorView* g : {&c.dq(), &c.dk(), &c.dv()}) fill_value(*g, 0.0);
  if (c.dbias()) fill_value(*c.dbias(), 0.0);
  // A task owns dk, dv of its kv head and dq of its rows; dbias may broadcast across tasks, so
  // with a bias the tasks run one at a time.
  const int threads = c.bias ? 1 : c.num_threads;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  parallel_for(c.b * c.nk, threads, [&](int64_t bh, int) {
    const int64_t bb = bh / c.nk, kh = bh % c.nk;
    std::vector<float> dk(static_cast<size_t>(c.s * c.h), 0.0f),
        dv(static_cast<size_t>(c.s * c.hv), 0.0f), x(static_cast<size_t>(c.s));
    for (int64_t nn = kh * G; nn < (kh + 1) * G; ++nn) {
      for (int64_t tt = 0; tt < c.t; ++tt) {
        int64_t s0, s1;
        c.s_range(bb, tt, &s0, &s1);
        const int64_t qrow = ((bb * c.t + tt) * c.n + nn);
        const float lse = c.lse_at(bb, nn, tt);
        if (lse == kNegInf) continue;  // a fully masked row: no gradient
        float D = 0;
        for (int64_t d = 0; d < c.hv; ++d)
          D += load_f32(c.dout, qrow * c.hv + d) * load_f32(c.o, qrow * c.hv + d);
        std::vector<float> dq(static_cast<size_t>(c.h), 0.0f);
        for (int64_t ss = s0; ss < s1; ++ss) {
          if (!c.mask_allows(bb, nn, tt, ss)) continue;
          const int64_t krow = (bb * c.s + ss) * c.nk + kh;
          float dot = 0;
          for (int64_t d = 0; d < c.h; ++d)
            dot += load_f32(c.q, qrow * c.h + d) * load_f32(c.k, krow * c.h + d);
          const float xl = c.logit(dot, bb, nn, tt, ss);
          const float p = std::exp(xl - lse);
          float dp = 0;
          for (int64_t d = 0; d < c.hv; ++d) {
            const float g = load_f32(c.dout, qrow * c.hv + d);
            dp += g * load_f32(c.v, krow * c.hv + d);
            dv[ss * c.hv + d] += p * g;
          }
          const float dz = p * (dp - D) * c.cap_grad(xl);
          if (c.dbias()) c.dbias()->data_as<float>()[c.bias_index(bb, nn, tt, ss)] += dz;
          for (int64_t d = 0; d < c.h; ++d) {
            dq[d] += dz * load_f32(c.k, krow * c.h + d);
            dk[ss * c.h + d] += dz * load_f32(c.q, qrow * c.h + d);
          }
        }
        for (int64_t d = 0; d < c.h; ++d) store_f32(c.dq(), qrow * c.h + d, dq[d] * c.scale_value);
      }
    }
    for (int64_t ss = 0; ss < c.s; ++ss) {
      const int64_t krow = (bb * c.s + ss) * c.nk + kh;
      for (int64_t d = 0; d < c.h; ++d)
        store_f32(c.dk(), krow * c.h + d, dk[ss * c.h + d] * c.scale_value);
      for (int64_t d = 0; d < c.hv; ++d) store_f32(c.dv(), krow * c.hv + d, dv[ss * c.hv + d]);
    }
  });
}

}  // namespace attn

AttentionGrads dot_product_attention_vjp(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out,
                                         const TensorView& lse, const TensorView& dout,
                                         const AttentionOptions& o) {
  attn::AttentionVjpCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.o = out;
  c.lse_in = lse;
  c.dout = dout;
  attn::set_options(c, o);
  std::vector<Tensor> g = attn::vjp_family().run(c, CallOptions{o.implementation, o.config});
  AttentionGrads grads{std::move(g.at(0)), std::move(g.at(1)), std::move(g.at(2)), Tensor()};
  if (g.size() > 3) grads.dbias = std::move(g[3]);
  return grads;
}

}  // namespace tokamax
