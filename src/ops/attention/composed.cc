// The `composed` attention: what a user would write without a fused kernel, and the baseline
// of `tokamax bench`. Per (batch, head): an OpenBLAS GEMM for the [T,S] logits q k^T, a pass
// that scales, biases, soft-caps, masks and takes the softmax of each row, and a GEMM of the
// probabilities with v. The logits are materialized: T*S floats per head at a time. bf16
// inputs are widened to f32 first (Debian's OpenBLAS has no bf16 GEMM).
#include <cblas.h>

#include <cmath>
#include <limits>

#include "core/thread_pool.h"
#include "ops/attention/base.h"

namespace tokamax::attn {
namespace {

// An f32 view of x: x itself, or a widened copy in *storage.
const float* as_f32(const TensorView& x, Tensor* storage) {
  if (x.dtype() == DType::kF32) return x.data_as<const float>();
  *storage = Tensor(x.shape(), DType::kF32);
  for (int64_t i = 0; i < x.size(); ++i)
    storage->data_as<float>()[i] = bf16_to_f32(x.data_as<const uint16_t>()[i]);
  return storage->data_as<float>();
}

class Composed : public TypedImplementation<AttentionCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(AttentionCall& c, const Prepared*) const override {
    openblas_set_num_threads(std::max(1, c.num_threads));
    Tensor qs, ks, vs;
    const float* Q = as_f32(c.q, &qs);
    const float* K = as_f32(c.k, &ks);
    const float* V = as_f32(c.v, &vs);
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
            m = std::max(m, row[ss]);
          }
          float l = 0;
          for (int64_t ss = 0; ss < c.s; ++ss) {
            row[ss] = m == kNegInf ? 0.0f : std::exp(row[ss] - m);
            l += row[ss];
          }
          const float inv = l > 0 ? 1.0f / l : 0.0f;
          for (int64_t ss = 0; ss < c.s; ++ss) row[ss] *= inv;
          if (c.lse()) {
            c.lse()->data_as<float>()[(bb * c.n + nn) * c.t + tt] =
                l > 0 ? m + std::log(l) : kNegInf;
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
            store(c.out(), ((bb * c.t + tt) * c.n + nn) * c.hv + d, O[tt * c.hv + d]);
        }
      }
    }
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }

}  // namespace tokamax::attn
