// The `composed` loss and backward: what a user writes without a fused kernel, and the
// baseline of `tokamax bench`. Forward: one OpenBLAS GEMM into the [B, V] logits, a
// log-softmax pass per row, the label's entry gathered. Backward: the logits again (one
// GEMM), d = (softmax - onehot) * dloss_b in place, dx = d w^T and dw = x^T d (two GEMMs).
// bf16 operands are widened to f32 first.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/float_mode.h"
#include "core/thread_pool.h"
#include "kernels/blas.h"
#include "kernels/grouped_gemm.h"
#include "ops/loss/base.h"

namespace tokamax::loss {
namespace {

const float* as_f32(const TensorView& t, int threads, Tensor* storage) {
  return kernels::a_as_f32(t.data(), t.dtype() == DType::kBF16, false, t.size(), threads, storage);
}

// logits = x w, [B, V] f32.
Tensor logits_of(const LossCall& c, const float* X, const float* W) {
  Tensor l({std::max<int64_t>(1, c.b * c.v)}, DType::kF32);
  if (c.b > 0 && c.v > 0) {
    if (c.h > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c.b, c.v, c.h, 1.0f, X, c.h, W, c.v,
                  0.0f, l.data_as<float>(), c.v);
    } else {
      std::fill(l.data_as<float>(), l.data_as<float>() + c.b * c.v, 0.0f);
    }
  }
  return l;
}

// Each row's max-shifted log-sum-exp.
float row_lse(const float* row, int64_t v) {
  float m = -INFINITY;
  for (int64_t j = 0; j < v; ++j) m = std::max(m, row[j]);
  float s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] - m);
  return m + std::log(s);
}

class Composed : public TypedImplementation<LossCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(LossCall& c, const Prepared*) const override {
    kernels::use_blas(c.num_threads);
    Tensor xs, ws;
    const float* X = x_as_f32(c, &xs);
    const float* W = as_f32(c.w, c.num_threads, &ws);
    const Tensor logits = logits_of(c, X, W);
    std::vector<double> per_row(static_cast<size_t>(c.b));
    parallel_for(c.b, c.num_threads, [&](int64_t r, int) {
      const float* row = logits.data_as<const float>() + r * c.v;
      const float lse = row_lse(row, c.v);
      per_row[r] = lse - row[c.label(r)];
      if (c.lse()) c.lse()->data_as<float>()[r] = lse;
    });
    c.write_loss(per_row);
  }
};

class VjpComposed : public TypedImplementation<LossVjpCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(LossVjpCall& c, const Prepared*) const override {
    // In native's floating-point mode (denormals flushed; OpenBLAS's threads take the caller's),
    // so that the ratio to native is the kernels', not the flush's: unflushed, the tiny
    // probabilities' products make most of a 151,936-word backward's time microcode assists.
    const ScopedFlushDenormals flush;
    kernels::use_blas(c.num_threads);
    Tensor xs, ws;
    const float* X = x_as_f32(c, &xs);
    const float* W = as_f32(c.w, c.num_threads, &ws);
    Tensor logits = logits_of(c, X, W);
    float* D = logits.data_as<float>();
    const float* lse = c.lse_in.data_as<const float>();
    parallel_for(c.b, c.num_threads, [&](int64_t r, int) {
      float* row = D + r * c.v;
      const float wgt = c.row_weight(r);
      for (int64_t j = 0; j < c.v; ++j) row[j] = std::exp(row[j] - lse[r]) * wgt;
      row[c.label(r)] -= wgt;
    });
    Tensor dx32;
    float* DX = c.dx().dtype() == DType::kF32 ? c.dx().data_as<float>() : nullptr;
    if (!DX) {
      dx32 = Tensor({std::max<int64_t>(1, c.b * c.h)}, DType::kF32);
      DX = dx32.data_as<float>();
    }
    float* DW = c.dw().data_as<float>();
    if (c.v == 0 || c.b == 0) {
      std::fill(DX, DX + c.b * c.h, 0.0f);
      std::fill(DW, DW + c.h * c.v, 0.0f);
    } else if (c.h > 0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.b, c.h, c.v, 1.0f, D, c.v, W, c.v,
                  0.0f, DX, c.h);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c.h, c.v, c.b, 1.0f, X, c.h, D, c.v,
                  0.0f, DW, c.v);
    }
    if (dx32.rank() > 0) {
      for (int64_t i = 0; i < c.b * c.h; ++i) c.dx().data_as<uint16_t>()[i] = f32_to_bf16(DX[i]);
    }
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }
std::shared_ptr<const Implementation> make_vjp_composed() {
  return std::make_shared<VjpComposed>();
}

}  // namespace tokamax::loss
