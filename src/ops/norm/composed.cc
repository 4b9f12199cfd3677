// The `composed` layer_norm and backward: what a user writes without a fused kernel, and the
// baseline of `tokamax bench`. Whole-tensor passes, each a parallel loop over rows: the mean of
// every row, then the variance around it (the two-pass formula), then y; x (widened to f32 when
// it is bf16, as x.astype(f32) would) is read from memory once per pass. The backward: the row
// sums of g and g xhat, then dx, then dscale and doffset as column sums, each pass reading x
// and dy again. The reductions keep 16 partial sums, so that they vectorize like the rest, in
// f64 as the other implementations: an f32 sum of a row with a mean large against its spread
// loses the digits the variance then needs, and an f32 variance over 10^6 columns was off by
// 2.3e-5 relative (bf16 input; 3.5e-6 f32) against 4e-8 for the native and the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "ops/norm/base.h"

namespace tokamax::norm {
namespace {

// An f32 copy of x when it is bf16 (the kernels' parallel widening), else x's own data.
const float* as_f32(const TensorView& x, int threads, Tensor* storage) {
  return kernels::a_as_f32(x.data(), x.dtype() == DType::kBF16, false, x.size(), threads, storage);
}

// sum over j < d of f(p[j * stride]) with 16 partial sums of type T.
template <class T, class F>
T row_sum(const float* p, int64_t d, int64_t stride, F f) {
  T acc[16] = {};
  int64_t j = 0;
  if (stride == 1)
    for (; j + 16 <= d; j += 16)
      for (int l = 0; l < 16; ++l) acc[l] += f(p[j + l]);
  T s = 0;
  for (int l = 0; l < 16; ++l) s += acc[l];
  for (; j < d; ++j) s += f(p[j * stride]);
  return s;
}

// Row r's first element.
int64_t row_base(const NormCall& c, int64_t r) { return c.index(r, 0); }

class Composed : public TypedImplementation<NormCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(NormCall& c, const Prepared*) const override {
    Tensor xs, sc, of;
    const float* x = as_f32(c.x, c.num_threads, &xs);
    const float* scale = params_f32(c.scale, &sc);
    const float* offset = params_f32(c.offset, &of);
    const int64_t rows = c.rows(), st = c.inner;
    const double inv_d = c.d > 0 ? 1.0 / static_cast<double>(c.d) : 0.0;
    std::vector<double> mean64(static_cast<size_t>(rows));
    Tensor mean_t({std::max<int64_t>(rows, 1)}, DType::kF32),
        rstd_t({std::max<int64_t>(rows, 1)}, DType::kF32);
    float* mean = mean_t.data_as<float>();
    float* rstd = rstd_t.data_as<float>();
    parallel_for(rows, c.num_threads, [&](int64_t r, int) {
      mean64[r] = c.subtract_mean ? row_sum<double>(x + row_base(c, r), c.d, st,
                                                    [](float v) { return double{v}; }) *
                                        inv_d
                                  : 0.0;
      mean[r] = static_cast<float>(mean64[r]);
    });
    parallel_for(rows, c.num_threads, [&](int64_t r, int) {
      const double m = mean64[r];
      const double var =
          row_sum<double>(x + row_base(c, r), c.d, st, [m](float v) { return (v - m) * (v - m); }) *
          inv_d;
      rstd[r] = static_cast<float>(1.0 / std::sqrt(var + c.epsilon));
    });
    parallel_for(rows, c.num_threads, [&](int64_t r, int) {
      const float* p = x + row_base(c, r);
      const float m = mean[r], s = rstd[r];
      if (!c.bf16 && st == 1) {
        float* y = c.y().data_as<float>() + row_base(c, r);
        for (int64_t j = 0; j < c.d; ++j)
          y[j] = (p[j] - m) * s * (scale ? scale[j] : 1.0f) + (offset ? offset[j] : 0.0f);
        return;
      }
      for (int64_t j = 0; j < c.d; ++j) {
        store_f32(c.y(), row_base(c, r) + j * st,
                  (p[j * st] - m) * s * (scale ? scale[j] : 1.0f) + (offset ? offset[j] : 0.0f));
      }
    });
    if (c.mean()) {
      std::copy(mean, mean + rows, c.mean()->data_as<float>());
      std::copy(rstd, rstd + rows, c.rstd()->data_as<float>());
    }
  }
};

class VjpComposed : public TypedImplementation<NormVjpCall, void> {
 public:
  std::string name() const override { return "composed"; }
  void run_call(NormVjpCall& c, const Prepared*) const override {
    Tensor xs, dys, sc;
    const float* x = as_f32(c.x, c.num_threads, &xs);
    const float* dy = as_f32(c.dy, c.num_threads, &dys);
    const float* scale = params_f32(c.scale, &sc);
    const int64_t rows = c.rows(), st = c.inner;
    const float* mean = c.mean_in.data_as<const float>();
    const float* rstd = c.rstd_in.data_as<const float>();
    const double inv_d = c.d > 0 ? 1.0 / static_cast<double>(c.d) : 0.0;
    Tensor a_t({std::max<int64_t>(rows, 1)}, DType::kF32),
        b_t({std::max<int64_t>(rows, 1)}, DType::kF32);
    float* a = a_t.data_as<float>();
    float* b = b_t.data_as<float>();
    // The row sums of g and of g xhat (in f64, as the forward's).
    parallel_for(rows, c.num_threads, [&](int64_t r, int) {
      const int64_t base = row_base(c, r);
      double sg = 0, sgx = 0;
      for (int64_t j = 0; j < c.d; ++j) {
        const float g = dy[base + j * st] * (scale ? scale[j] : 1.0f);
        sg += g;
        sgx += double{g} * ((x[base + j * st] - mean[r]) * rstd[r]);
      }
      a[r] = c.subtract_mean ? static_cast<float>(sg * inv_d) : 0.0f;
      b[r] = static_cast<float>(sgx * inv_d);
    });
    parallel_for(rows, c.num_threads, [&](int64_t r, int) {
      const int64_t base = row_base(c, r);
      for (int64_t j = 0; j < c.d; ++j) {
        const float xh = (x[base + j * st] - mean[r]) * rstd[r];
        const float g = dy[base + j * st] * (scale ? scale[j] : 1.0f);
        store_f32(c.dx(), base + j * st, rstd[r] * (g - a[r] - xh * b[r]));
      }
    });
    // Column sums over the rows (in f64: hundreds of thousands of rows), columns in blocks of
    // 64 across threads.
    if (!c.dscale() && !c.doffset()) return;
    parallel_for((c.d + 63) / 64, c.num_threads, [&](int64_t blk, int) {
      const int64_t j0 = blk * 64, j1 = std::min(c.d, j0 + 64);
      double ds[64] = {}, dof[64] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = row_base(c, r);
        for (int64_t j = j0; j < j1; ++j) {
          const float g = dy[base + j * st];
          ds[j - j0] += g * (x[base + j * st] - mean[r]) * rstd[r];
          dof[j - j0] += g;
        }
      }
      for (int64_t j = j0; j < j1; ++j) {
        if (c.dscale()) c.dscale()->data_as<float>()[j] = static_cast<float>(ds[j - j0]);
        if (c.doffset()) c.doffset()->data_as<float>()[j] = static_cast<float>(dof[j - j0]);
      }
    });
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_composed() { return std::make_shared<Composed>(); }
std::shared_ptr<const Implementation> make_vjp_composed() {
  return std::make_shared<VjpComposed>();
}

}  // namespace tokamax::norm
