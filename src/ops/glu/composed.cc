// The `composed` gated_linear_unit and backward: what a user writes without a fused kernel,
// and the baseline of `tokamax bench`. Forward: one OpenBLAS GEMM of x with the weights into
// h [M, 2N] (two GEMMs into its halves when the weights come separate), then an elementwise
// pass out = act(h_gate) * h_up. Backward: the elementwise pass giving dh [M, 2N], then
// dx = dh w^T and dw = x^T dh as two GEMMs. bf16 operands are widened to f32 first (Debian's
// OpenBLAS has no bf16 GEMM).
#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "core/float_mode.h"
#include "core/thread_pool.h"
#include "kernels/blas.h"
#include "kernels/grouped_gemm.h"
#include "ops/glu/base.h"

namespace tokamax::glu {
namespace {

const float* as_f32(const void* p, DType dt, int64_t count, int threads, Tensor* storage) {
  return kernels::a_as_f32(p, dt == DType::kBF16, false, count, threads, storage);
}

class Composed : public TypedImplementation<GluCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void check_call(const GluCall& c) const override {
    if (!c.w.data() && c.m > 0) throw Unsupported("composed needs the unpacked weights");
  }
  void run_call(GluCall& c, const Prepared*) const override {
    kernels::use_blas(c.num_threads);
    const int64_t M = c.m, K = c.k, N = c.n;
    if (M == 0 || N == 0) return;
    Tensor xs, ws, us;
    const float* X = kernels::a_as_f32(c.x.data(), c.x.dtype() == DType::kBF16, rounds_x(c),
                                       c.x.size(), c.num_threads, &xs);
    Tensor h({M, 2 * N}, DType::kF32);
    float* H = h.data_as<float>();
    if (K == 0) {
      std::fill(H, H + M * 2 * N, 0.0f);
    } else if (!c.w_up) {
      const float* W = as_f32(c.w.data(), c.w_dtype, c.w.size(), c.num_threads, &ws);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, 2 * N, K, 1.0f, X, K, W, 2 * N,
                  0.0f, H, 2 * N);
    } else {
      const float* G = as_f32(c.w.data(), c.w_dtype, c.w.size(), c.num_threads, &ws);
      const float* U = as_f32(c.w_up->data(), c.w_dtype, c.w_up->size(), c.num_threads, &us);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, X, K, G, N, 0.0f, H,
                  2 * N);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, X, K, U, N, 0.0f, H + N,
                  2 * N);
    }
    // The elementwise pass on the ISA's vector loop, as a framework's fused activation-multiply
    // would run it (a scalar libm loop here would slow the baseline, not the user's code).
    const kernels::Isa isa = kernels::best_kernels().isa;
    parallel_for(M, c.num_threads, [&](int64_t r, int) { activate_rows(c, H, r, 1, isa); });
  }
};

class VjpComposed : public TypedImplementation<GluVjpCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(GluVjpCall& c, const Prepared*) const override {
    // In native's floating-point mode (denormals flushed; OpenBLAS's threads take the caller's),
    // so that the ratio to native is the kernels', not the flush's: unflushed, dh's denormals
    // (randn x and w at K=2048) cost this M=4096, K=2048, N=5632 call 16.8 s against 2.0 s.
    const ScopedFlushDenormals flush;
    kernels::use_blas(c.num_threads);
    const int64_t M = c.m, K = c.k, N = c.n;
    Tensor dh({std::max<int64_t>(1, M * 2 * N)}, DType::kF32), xs, ws;
    float* DH = dh.data_as<float>();
    compute_dh(c, DH, kernels::best_kernels().isa);
    const float* X = as_f32(c.x.data(), c.x.dtype(), c.x.size(), c.num_threads, &xs);
    const float* W = as_f32(c.w.data(), c.w_dtype, c.w.size(), c.num_threads, &ws);
    Tensor dx32;
    float* DX = c.dx().dtype() == DType::kF32 ? c.dx().data_as<float>() : nullptr;
    if (!DX) {
      dx32 = Tensor({std::max<int64_t>(1, M * K)}, DType::kF32);
      DX = dx32.data_as<float>();
    }
    float* DW = c.dw().data_as<float>();
    if (N == 0) {
      std::fill(DX, DX + M * K, 0.0f);
      std::fill(DW, DW + K * 2 * N, 0.0f);
    } else {
      if (M > 0 && K > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, K, 2 * N, 1.0f, DH, 2 * N, W, 2 * N,
                    0.0f, DX, K);
      }
      if (K > 0) {
        if (M > 0) {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, 2 * N, M, 1.0f, X, K, DH, 2 * N,
                      0.0f, DW, 2 * N);
        } else {
          std::fill(DW, DW + K * 2 * N, 0.0f);
        }
      }
    }
    if (dx32.rank() > 0)
      for (int64_t i = 0; i < M * K; ++i) store_f32(c.dx(), i, DX[i]);
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }
std::shared_ptr<const Implementation> make_vjp_composed() {
  return std::make_shared<VjpComposed>();
}

}  // namespace tokamax::glu
