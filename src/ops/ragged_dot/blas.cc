// The `blas` ragged_dot: one OpenBLAS GEMM per non-empty group, the baseline users would write
// otherwise. Debian's OpenBLAS 0.3.21 is built without BUILD_BFLOAT16 (no cblas_sbgemm is
// exported), so bf16 operands are widened to f32 per call and multiplied with cblas_sgemm: what a
// user of this BLAS must do. Under Precision::kDefault an f32 lhs with bf16 weights is rounded to
// bf16 first, so that it computes what the other implementations compute.
#include "kernels/blas.h"

#include <cblas.h>

#include <cstring>

#include "ops/ragged_dot/base.h"

namespace tokamax::rdot {
namespace {

class Blas : public TypedImplementation<RaggedDotCall, void> {
 public:
  std::string name() const override { return "blas"; }
  void check_call(const RaggedDotCall& c) const override {
    if (!c.packed.empty()) throw Unsupported("blas cannot use native pre-packed weights");
    if (!c.lhs.is_contiguous() || (c.rhs.data() && !c.rhs.is_contiguous())) {
      throw Unsupported("blas needs contiguous operands");
    }
  }
  void run_call(RaggedDotCall& c, const Prepared*) const override {
    kernels::use_blas(c.num_threads);
    const int64_t K = c.k, N = c.n, M = c.m;
    const bool contracting = c.dims == RaggedDimNums::kRaggedContracting;
    const int64_t out_elems = contracting ? c.g * K * N : M * N;
    // f32 accumulation target; converted/activated into the output at the end.
    Tensor acc32;
    float* C;
    if (c.out_dtype == DType::kF32) {
      C = c.out().data_as<float>();
    } else {
      acc32 = Tensor({out_elems}, DType::kF32);
      C = acc32.data_as<float>();
    }
    std::memset(C, 0, static_cast<size_t>(out_elems) * 4);
    Tensor a32, b32;
    const float* A = c.lhs_f32(&a32);
    for (int64_t g = 0; g < c.g; ++g) {
      const int64_t r0 = c.offsets[g], mg = c.offsets[g + 1] - r0;
      if (mg == 0) continue;
      if (contracting) {
        float* Cg = C + g * K * N;
        const float* Bg = widen(c.rhs, r0 * N, mg * N, &b32);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, mg, 1.0f, A + r0 * K, K, Bg, N,
                    0.0f, Cg, N);
        continue;
      }
      const bool trans = c.dims == RaggedDimNums::kTransposedRhs;
      const CBLAS_TRANSPOSE tb = trans ? CblasTrans : CblasNoTrans;
      const int64_t ldb = trans ? K : N;
      const float* Bg = widen(c.rhs, g * K * N, K * N, &b32);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, mg, N, K, 1.0f, A + r0 * K, K, Bg, ldb, 0.0f,
                  C + r0 * N, N);
    }
    const int64_t active = contracting ? out_elems : c.offsets.back() * N;
    if (c.out_dtype == DType::kF32) {
      if (c.activation != Activation::kNone) {
        for (int64_t i = 0; i < active; ++i) C[i] = apply_activation(c.activation, C[i]);
      }
    } else {
      uint16_t* o = c.out().data_as<uint16_t>();
      for (int64_t i = 0; i < out_elems; ++i)
        o[i] = f32_to_bf16(i < active ? apply_activation(c.activation, C[i]) : 0.0f);
    }
  }

 private:
  // A view of `count` rhs elements from `offset` as f32 (converting bf16 into `tmp`).
  static const float* widen(const TensorView& rhs, int64_t offset, int64_t count, Tensor* tmp) {
    if (rhs.dtype() == DType::kF32) return rhs.data_as<float>() + offset;
    if (tmp->size() < count) *tmp = Tensor({count}, DType::kF32);
    const uint16_t* s = rhs.data_as<uint16_t>() + offset;
    float* d = tmp->data_as<float>();
    for (int64_t i = 0; i < count; ++i) d[i] = bf16_to_f32(s[i]);
    return d;
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_blas() { return std::make_shared<Blas>(); }

}  // namespace tokamax::rdot
