// gated_linear_unit_vjp: the backward as an op of its own: its arguments (x, the stacked
// w [K, 2, N], the residual h = x w [..., M, 2, N] f32, the cotangent dout [..., M, N]), bind,
// the reference, the native backward and the public function. With g, u the gate's and up's
// halves of h:
//   dh_gate = dout * u * act'(g),   dh_up = dout * act(g),
//   dx = dh w^T ([M, 2N] x [2N, K]),   dw = x^T dh ([K, M] x [M, 2N]).
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/float_mode.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/scratch.h"
#include "ops/glu/base.h"

namespace tokamax {
namespace glu {

// dh (f32 [M, 2N], rows of gate then up) from h and dout, a row at a time on the ISA's loop.
void compute_dh(const GluVjpCall& c, float* dh, kernels::Isa isa) {
  const int64_t N = c.n;
  const float* H = c.h_in.data_as<const float>();
  const auto act_grad = kernels::row_kernels(isa).act_grad;
  const bool f32 = c.dout.dtype() == DType::kF32;
  parallel_for(c.m, c.num_threads, [&](int64_t r, int) {
    const float* g = H + r * 2 * N;
    float* d = dh + r * 2 * N;
    const float* go = f32 ? c.dout.data_as<const float>() + r * N : d + N;
    if (!f32) {  // bf16 dout widened into the up half, which act_grad writes after reading
      for (int64_t j = 0; j < N; ++j) d[N + j] = load_f32(c.dout.data(), c.dout.dtype(), r * N + j);
    }
    act_grad(static_cast<int>(c.activation), g, g + N, go, d, d + N, N);
  });
}

VjpFamily::VjpFamily()
    : BackwardFamily(kVjpFamily, family(),
                     {{"h", &GluVjpCall::h_in, "the forward's residual x w, [..., M, 2, N] f32"}},
                     {"dout", &GluVjpCall::dout, "the cotangent of out"},
                     std::make_shared<VjpReference>(), {make_vjp_native(), make_vjp_composed()},
                     {"w_up"}) {}

const VjpFamily& vjp_family() { return family_instance<VjpFamily>(); }

std::vector<ShapeDtype> VjpFamily::output_specs(const GluVjpCall& c) const {
  return {c.x.spec(), {c.w.shape(), DType::kF32}};
}

std::vector<OutputDoc> VjpFamily::output_docs() const {
  return {{"dx", "x's shape and dtype", "x.shape", "x.dtype"},
          {"dw", "w's shape, f32", "w.shape", "float32"}};
}

Tolerance VjpFamily::tolerance_of(const GluVjpCall& c) const {
  // dx sums 2N products, dw sums M, each of terms about K (h's size squared for unit inputs).
  const double depth = static_cast<double>(std::max<int64_t>({c.m, 2 * c.n, 1}));
  const double k = static_cast<double>(std::max<int64_t>(c.k, 1));
  if (c.w_dtype == DType::kBF16 || c.x.dtype() == DType::kBF16)
    return {1e-2 * std::sqrt(depth) * k, 2e-2, 0};
  return {2e-5 * std::sqrt(depth) * k, 1e-4, 0};
}

CallCost VjpFamily::cost_of(const GluVjpCall& c) const { return {2 * call_flops(c), 0.0, false}; }

// --- reference: f64 sums ---

void VjpReference::run_call(GluVjpCall& c, const Prepared*) const {
  const int64_t M = c.m, K = c.k, N2 = 2 * c.n;
  std::vector<float> dh(static_cast<size_t>(std::max<int64_t>(1, M * N2)));
  compute_dh(c, dh.data(), kernels::Isa::kPortable);
  parallel_for(M, c.num_threads, [&](int64_t r, int) {
    for (int64_t kk = 0; kk < K; ++kk) {
      double s = 0;
      for (int64_t j = 0; j < N2; ++j)
        s += double{dh[r * N2 + j]} * load_f32(c.w.data(), c.w_dtype, kk * N2 + j);
      store_f32(c.dx(), r * K + kk, static_cast<float>(s));
    }
  });
  parallel_for(K, c.num_threads, [&](int64_t kk, int) {
    std::vector<double> s(static_cast<size_t>(N2), 0.0);
    for (int64_t r = 0; r < M; ++r) {
      const double xv = load_f32(c.x.data(), c.x.dtype(), r * K + kk);
      for (int64_t j = 0; j < N2; ++j) s[j] += xv * dh[r * N2 + j];
    }
    for (int64_t j = 0; j < N2; ++j)
      c.dw().data_as<float>()[kk * N2 + j] = static_cast<float>(s[j]);
  });
}

// --- native: the two products on the grouped GEMM ---

namespace {

class VjpNative : public TypedImplementation<GluVjpCall, GluNativeConfig> {
 public:
  std::string name() const override { return "native"; }
  std::vector<std::string> config_fields() const override { return {"mr", "mc", "kc", "nc"}; }
  void check_config(const GluNativeConfig& c) const override {
    family().implementation("native")->config_from_json(c.to_json());
  }
  GluNativeConfig heuristics(const GluVjpCall& c) const override {
    GluNativeConfig cfg =
        family().implementation("native")->heuristics_config(c).get<GluNativeConfig>();
    if (c.m <= kernels::kStreamMaxMr) {
      // Decode: the forward narrows its items until the 2N weight columns split evenly over
      // the threads (11 of 1024 -> 22 of 512 at N=5632); the backward's weight-streaming
      // product is dx, whose columns are w's K rows: split those instead (K=2048 on 2 threads:
      // 2 items of 1024, which the Emerald Rapids tuner found 0.879x [0.855, 0.889] the time
      // of 512 over 48 rounds; dw's K rows of tiles need no narrowing).
      const auto& ks = kernels::best_kernels();
      const int t = std::max(1, c.num_threads);
      const int64_t nc = kernels::item_columns(
          1, kernels::round_up(std::max<int64_t>(c.k, 1), ks.nr), t, t, 1024, 2 * ks.nr);
      cfg.nc = static_cast<int>(kernels::round_up(nc, 2 * ks.nr));
    }
    return cfg;
  }
  std::vector<GluNativeConfig> search_space(const GluVjpCall& c) const override {
    std::vector<GluNativeConfig> out;
    for (const Config& cfg : family().implementation("native")->autotuning_configs(c))
      out.push_back(cfg.get<GluNativeConfig>());
    return out;
  }
  void run_call(GluVjpCall& c, const GluNativeConfig& cfg, const Prepared*) const override {
    // A gate far below zero (|x w| in the tens: randn x and w at K=2048) makes act(g) and
    // act'(g) tiny, and dh's values below f32's smallest normal take a microcode assist in
    // every FMA of both products that reads them: flushed, as XLA's CPU runtime runs its
    // kernels (M=4096, K=2048, N=5632, tokamax bench: 13.6 s a call unflushed).
    const ScopedFlushDenormals flush;
    const auto& ks = kernels::best_kernels();
    const int64_t M = c.m, K = c.k, N2 = 2 * c.n;
    const kernels::Blocking blk{cfg.mr, cfg.mc, cfg.kc, cfg.nc};
    Tensor dh({std::max<int64_t>(1, M * N2)}, DType::kF32);
    compute_dh(c, dh.data_as<float>(), ks.isa);
    const int64_t offsets[2] = {0, M};
    // dx [M, K] = dh [M, 2N] w^T: w [K, 2N] is the [n, k] form of the product's rhs.
    kernels::GroupedGemm dx;
    dx.groups = 1;
    dx.offsets = offsets;
    dx.k = N2;
    dx.n = K;
    dx.a = dh.data();
    dx.b = c.w.data();
    dx.b_bf16 = c.w_dtype == DType::kBF16;
    dx.b_trans = true;
    dx.threads = c.num_threads;
    dx.store = [&c](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                    int64_t cols) {
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
          store_f32(c.dx(), (r0 + i) * c.k + n0 + j, C[i * ldc + j]);
    };
    if (M > 0 && K > 0) {
      if (N2 > 0) {
        kernels::grouped_gemm(dx, blk, ks);
      } else {
        fill_value(c.dx(), 0.0);
      }
    }
    // dw [K, 2N] = x^T dh: the ragged contraction over one group of M rows.
    kernels::GroupedGemmTn dw;
    dw.groups = 1;
    dw.offsets = offsets;
    dw.k = K;
    dw.n = N2;
    dw.a = c.x.data();
    dw.a_bf16 = c.x.dtype() == DType::kBF16;
    dw.b = dh.data();
    dw.threads = c.num_threads;
    float* DW = c.dw().data_as<float>();
    dw.store = [DW, N2](const float* C, int64_t ldc, int64_t r0, int64_t rows, int64_t n0,
                        int64_t cols) {
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(DW + (r0 + i) * N2 + n0, C + i * ldc, static_cast<size_t>(cols) * 4);
    };
    if (K > 0 && N2 > 0) kernels::grouped_gemm_tn(dw, blk, ks);
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_vjp_native() { return std::make_shared<VjpNative>(); }

}  // namespace glu

GluGrads gated_linear_unit_vjp(const TensorView& x, const TensorView& w, const TensorView& h,
                               const TensorView& dout, const GluOptions& o) {
  glu::GluVjpCall c;
  c.x = x;
  c.w = w;
  c.h_in = h;
  c.dout = dout;
  c.activation = o.activation;
  c.num_threads = 0;
  std::vector<Tensor> g = glu::vjp_family().run(c, CallOptions{o.implementation, o.config});
  return {std::move(g.at(0)), std::move(g.at(1))};
}

}  // namespace tokamax
