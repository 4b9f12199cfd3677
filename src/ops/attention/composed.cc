// The `composed` attention: what a user would write without a fused kernel, and the baseline
// of `tokamax bench`. Per (batch, head): an OpenBLAS GEMM for the [T,S] logits q k^T, a pass
// that scales, biases, soft-caps, masks and takes the softmax of each row, and a GEMM of the
// probabilities with v. The logits are materialized: T*S floats per head at a time. bf16
// inputs are widened to f32 first (Debian's OpenBLAS has no bf16 GEMM).
#include <cblas.h>

#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "kernels/blas.h"
#include "kernels/grouped_gemm.h"
#include "ops/attention/base.h"

namespace tokamax::attn {
namespace {

// An f32 view of x: x itself, or a widened copy in *storage (the kernels' parallel widening, so
// that the baseline is not slowed by a scalar loop of its own).
const float* as_f32(const TensorView& x, int threads, Tensor* storage) {
  return kernels::a_as_f32(x.data(), x.dtype() == DType::kBF16, false, x.size(), threads, storage);
}

class Composed : public TypedImplementation<AttentionCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(AttentionCall& c, const Prepared*) const override {
    kernels::use_blas(c.num_threads);
    Tensor qs, ks, vs;
    const float* Q = as_f32(c.q, c.num_threads, &qs);
    const float* K = as_f32(c.k, c.num_threads, &ks);
    const float* V = as_f32(c.v, c.num_threads, &vs);
    const int64_t G = c.group();
    const float kNegInf = -std::numeric_limits<float>::infinity();
    Tensor logits({std::max<int64_t>(1, c.t * c.s)}, DType::kF32);
    Tensor o32({std::max<int64_t>(1, c.t * c.hv)}, DType::kF32);
    float* L = logits.data_as<float>();
    float* O = o32.data_as<float>();
    for (int64_t bb = 0; bb < c.b; ++bb) {
      for (int64_t nn = 0; nn < c.n; ++nn) {
        const int64_t kh = nn / G;
        const float* q = Q + (bb * c.t * c.n + nn) * c.h;
        const float* k = K + (bb * c.s * c.nk + kh) * c.h;
        const float* v = V + (bb * c.s * c.nk + kh) * c.hv;
        if (c.t > 0 && c.s > 0) {
          if (c.h > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.t, c.s, c.h, 1.0f, q, c.n * c.h,
                        k, c.nk * c.h, 0.0f, L, c.s);
          } else {
            std::fill(L, L + c.t * c.s, 0.0f);
          }
        }
        // Softmax rows in place; the row's log-sum-exp; a fully masked row is all zero.
        parallel_for(c.t, c.num_threads, [&](int64_t tt, int) {
          float* row = L + tt * c.s;
          int64_t s0, s1;
          c.s_range(bb, tt, &s0, &s1);
          float m = kNegInf;
          for (int64_t ss = 0; ss < c.s; ++ss) {
            const bool on = ss >= s0 && ss < s1 && c.mask_allows(bb, nn, tt, ss);
            row[ss] = on ? c.logit(row[ss], bb, nn, tt, ss) : kNegInf;
            m = row[ss] > m || std::isnan(row[ss]) ? row[ss] : m;  // NaN sticks
          }
          float l = 0;
          for (int64_t ss = 0; ss < c.s; ++ss) {
            row[ss] = m == kNegInf ? 0.0f : std::exp(row[ss] - m);
            l += row[ss];
          }
          const float inv = l == 0 ? 0.0f : 1.0f / l;  // NaN with a NaN logit
          for (int64_t ss = 0; ss < c.s; ++ss) row[ss] *= inv;
          if (c.lse()) {
            c.lse()->data_as<float>()[(bb * c.n + nn) * c.t + tt] =
                l == 0 ? kNegInf : m + std::log(l);
          }
        });
        if (c.t > 0 && c.hv > 0) {
          if (c.s > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c.t, c.hv, c.s, 1.0f, L, c.s, v,
                        c.nk * c.hv, 0.0f, O, c.hv);
          } else {
            std::fill(O, O + c.t * c.hv, 0.0f);
          }
        }
        for (int64_t tt = 0; tt < c.t; ++tt) {
          for (int64_t d = 0; d < c.hv; ++d)
            store_f32(c.out(), ((bb * c.t + tt) * c.n + nn) * c.hv + d, O[tt * c.hv + d]);
        }
      }
    }
  }
};

// The backward the same way: per (batch, head) the [T,S] probabilities recomputed with a GEMM
// and the log-sum-exp, dP = do v^T by GEMM, dS = P (dP - D) in a pass, then three GEMMs for dq,
// dk and dv (dk, dv accumulated over the heads of a group).
class ComposedVjp : public TypedImplementation<AttentionVjpCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(AttentionVjpCall& c, const Prepared*) const override {
    kernels::use_blas(c.num_threads);
    Tensor qs, ks, vs, os, ds;
    const float* Q = as_f32(c.q, c.num_threads, &qs);
    const float* K = as_f32(c.k, c.num_threads, &ks);
    const float* V = as_f32(c.v, c.num_threads, &vs);
    const float* O = as_f32(c.o, c.num_threads, &os);
    const float* dO = as_f32(c.dout, c.num_threads, &ds);
    const int64_t G = c.group(), T = c.t, S = c.s, H = c.h, Hv = c.hv;
    const float kNegInf = -std::numeric_limits<float>::infinity();
    Tensor p_t({std::max<int64_t>(1, T * S)}, DType::kF32),
        dp_t({std::max<int64_t>(1, T * S)}, DType::kF32);
    Tensor dq_t({std::max<int64_t>(1, T * H)}, DType::kF32);
    Tensor dk_t({std::max<int64_t>(1, c.b * S * c.nk * H)}, DType::kF32),
        dv_t({std::max<int64_t>(1, c.b * S * c.nk * Hv)}, DType::kF32);
    float *P = p_t.data_as<float>(), *dP = dp_t.data_as<float>(), *dQ = dq_t.data_as<float>();
    float *dK = dk_t.data_as<float>(), *dV = dv_t.data_as<float>();
    std::fill(dK, dK + dk_t.size(), 0.0f);
    std::fill(dV, dV + dv_t.size(), 0.0f);
    if (c.dbias()) fill_value(*c.dbias(), 0.0);
    // No kv positions: every dq row is 0 (the loop below skips those heads; outputs come
    // uninitialized).
    if (S == 0) fill_value(c.dq(), 0.0);
    for (int64_t bb = 0; bb < c.b; ++bb) {
      for (int64_t nn = 0; nn < c.n; ++nn) {
        const int64_t kh = nn / G;
        const float* q = Q + (bb * T * c.n + nn) * H;
        const float* k = K + (bb * S * c.nk + kh) * H;
        const float* v = V + (bb * S * c.nk + kh) * Hv;
        const float* g = dO + (bb * T * c.n + nn) * Hv;
        float* dk = dK + (bb * S * c.nk + kh) * H;
        float* dv = dV + (bb * S * c.nk + kh) * Hv;
        if (T == 0 || S == 0) continue;
        gemm(false, true, T, S, H, q, c.n * H, k, c.nk * H, P, S, 0.0f);
        gemm(false, true, T, S, Hv, g, c.n * Hv, v, c.nk * Hv, dP, S, 0.0f);
        parallel_for(T, c.num_threads, [&](int64_t tt, int) {
          int64_t s0, s1;
          c.s_range(bb, tt, &s0, &s1);
          const float lse = c.lse_at(bb, nn, tt);
          const int64_t row = (bb * T + tt) * c.n + nn;
          float D = 0;
          for (int64_t d = 0; d < Hv; ++d) D += dO[row * Hv + d] * O[row * Hv + d];
          for (int64_t ss = 0; ss < S; ++ss) {
            float p = 0, dz = 0;
            if (lse != kNegInf && ss >= s0 && ss < s1 && c.mask_allows(bb, nn, tt, ss)) {
              const float x = c.logit(P[tt * S + ss], bb, nn, tt, ss);
              p = std::exp(x - lse);
              dz = p * (dP[tt * S + ss] - D) * c.cap_grad(x);
            }
            P[tt * S + ss] = p;
            dP[tt * S + ss] = dz;
          }
        });
        if (c.dbias()) {  // one head at a time: broadcast dbias elements are summed in order
          for (int64_t tt = 0; tt < T; ++tt) {
            for (int64_t ss = 0; ss < S; ++ss)
              c.dbias()->data_as<float>()[c.bias_index(bb, nn, tt, ss)] += dP[tt * S + ss];
          }
        }
        gemm(false, false, T, H, S, dP, S, k, c.nk * H, dQ, H, 0.0f);
        for (int64_t tt = 0; tt < T; ++tt) {
          for (int64_t d = 0; d < H; ++d)
            store_f32(c.dq(), ((bb * T + tt) * c.n + nn) * H + d, dQ[tt * H + d] * c.scale_value);
        }
        gemm(true, false, S, H, T, dP, S, q, c.n * H, dk, c.nk * H, 1.0f);
        gemm(true, false, S, Hv, T, P, S, g, c.n * Hv, dv, c.nk * Hv, 1.0f);
      }
    }
    for (int64_t i = 0; i < dk_t.size() && i < c.dk().size(); ++i)
      store_f32(c.dk(), i, dK[i] * c.scale_value);
    for (int64_t i = 0; i < dv_t.size() && i < c.dv().size(); ++i) store_f32(c.dv(), i, dV[i]);
  }

 private:
  static void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float* out, int64_t ldc, float beta) {
    if (m == 0 || n == 0) return;
    if (kk == 0) {
      if (beta == 0.0f) {
        for (int64_t i = 0; i < m; ++i) std::fill(out + i * ldc, out + i * ldc + n, 0.0f);
      }
      return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                kk, 1.0f, a, lda, b, ldb, beta, out, ldc);
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }
std::shared_ptr<const Implementation> make_vjp_composed() {
  return std::make_shared<ComposedVjp>();
}

}  // namespace tokamax::attn
