// gated_linear_unit: arguments, bind (validation), the reference, tolerances and cost.
#include "ops/glu/base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autotuning/bf16_dot.h"
#include "core/thread_pool.h"
#include "kernels/microkernels.h"

namespace tokamax::glu {

namespace {

using A = Args<GluCall>;

InvalidArgument bad(const std::string& what) {
  return InvalidArgument("gated_linear_unit: " + what);
}

std::vector<ArgField<GluCall>> forward_fields() {
  return {A::input("x", &GluCall::x).describe("f32 or bf16 [..., M, K]"),
          A::input("w", &GluCall::w)
              .python("weights")
              .describe("f32 or bf16: [K, 2, N] (gate then up), a (w_gate, w_up) pair of [K, N], "
                        "or pack_glu_weights' result"),
          A::optional_input("w_up", &GluCall::w_up)
              .describe("[K, N] the up projection when w is the gate's alone")
              .internal(),
          A::enumeration("activation", &GluCall::activation, activation_names())
              .describe("applied to the gate: silu (SwiGLU), gelu (GEGLU), relu, ...; none: "
                        "the identity"),
          A::value("packed_w", &GluCall::packed_w).internal(),
          A::residuals_flag(&GluCall::return_residuals)};
}

bool f32_or_bf16(DType d) { return d == DType::kF32 || d == DType::kBF16; }

}  // namespace

std::string Family::summary() const {
  return "Gated linear unit: out = activation(x w_gate) * (x w_up), products accumulated in f32; "
         "out has x's dtype.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"out", "[..., M, N], x's dtype", "x.shape[:-1] + (w.shape[-1],)", "x.dtype"},
          {"h", "x w: [..., M, 2, N] f32, the gate and up products before the activation",
           "x.shape[:-1] + (2, w.shape[-1])", "float32", "", true}};
}

const void* GluCall::weights(int half, int64_t* ld) const {
  const size_t es = dtype_size(w_dtype);
  if (w_up) {
    *ld = n;
    return half == 0 ? w.data() : w_up->data();
  }
  *ld = 2 * n;
  return static_cast<const char*>(w.data()) + half * n * static_cast<int64_t>(es);
}

Shape GluCall::out_shape() const {
  Shape s = x.shape();
  s.back() = n;
  return s;
}

Shape GluCall::h_shape() const {
  Shape s = x.shape();
  s.back() = 2;
  s.push_back(n);
  return s;
}

Family::Family()
    : TypedFamily(kFamily, forward_fields(), std::make_shared<Reference>(),
                  {make_native(), make_composed()}) {}

const Family& family() { return family_instance<Family>(); }

void bind_forward(GluCall& c) {
  if (c.x.rank() < 2 || !f32_or_bf16(c.x.dtype()))
    throw bad(fmt::format("x has spec {}; expected [..., M, K], f32 or bf16", c.x.spec().str()));
  if (c.x.data() && !c.x.is_contiguous())
    throw bad(fmt::format("x {} must be a contiguous row-major array", c.x.spec().str()));
  c.k = c.x.shape().back();
  c.m = 1;
  for (int64_t i = 0; i + 1 < c.x.rank(); ++i) c.m *= c.x.dim(i);
  c.w_dtype = c.w.dtype();
  if (c.w_up) {
    if (c.w.rank() != 2 || c.w_up->spec() != c.w.spec() || c.w.dim(0) != c.k) {
      throw bad(fmt::format(
          "w_gate has spec {} and w_up {}; expected both [K, N] with K = {} (x {}), one dtype",
          c.w.spec().str(), c.w_up->spec().str(), c.k, c.x.spec().str()));
    }
    c.n = c.w.dim(1);
  } else {
    if (c.w.rank() != 3 || c.w.dim(0) != c.k || c.w.dim(1) != 2) {
      throw bad(fmt::format("w has shape {}; expected [K, 2, N] with K = {} (x {})",
                            c.w.spec().str(), c.k, c.x.spec().str()));
    }
    c.n = c.w.dim(2);
  }
  if (!f32_or_bf16(c.w_dtype))
    throw bad(fmt::format("w has spec {}; expected f32 or bf16", c.w.spec().str()));
  for (const TensorView* v : {&c.w, c.w_up ? &*c.w_up : nullptr}) {
    if (v && v->data() && !v->is_contiguous())
      throw bad(fmt::format("w {} must be a contiguous row-major array", v->spec().str()));
  }
  if (!c.packed.empty()) {
    if (c.packed.k() != c.k || c.packed.n() != c.n || c.packed.dtype() != c.w_dtype) {
      throw bad(fmt::format("packed weights are [K={}, N={}] {}; the call needs K={}, N={} {}",
                            c.packed.k(), c.packed.n(), dtype_name(c.packed.dtype()), c.k, c.n,
                            dtype_name(c.w_dtype)));
    }
  }
}

std::vector<ShapeDtype> Family::output_specs(const GluCall& c) const {
  std::vector<ShapeDtype> out = {{c.out_shape(), c.x.dtype()}};
  if (c.return_residuals) out.push_back({c.h_shape(), DType::kF32});
  return out;
}

Tolerance Family::tolerance_of(const GluCall& c) const {
  // Outputs are products of two K-long sums (each about sqrt(K) for unit inputs): their
  // rounding grows like K. bf16 (weights on the bf16 dot round x to bf16; a bf16 output):
  // tokamax's GLU tolerance is atol 0.1, rtol 0.02 at unit scale.
  const double k = static_cast<double>(std::max<int64_t>(c.k, 1));
  if (c.w_dtype == DType::kBF16 || c.x.dtype() == DType::kBF16) return {6e-3 * k, 2e-2, 0};
  return {1e-5 * k, 1e-5, 0};
}

double call_flops(const GluCall& c) {
  return 4.0 * static_cast<double>(c.m) * static_cast<double>(c.k) * static_cast<double>(c.n);
}

bool uses_bf16_dot(const GluCall& c) {
  if (c.w_dtype != DType::kBF16 || kernels::best_kernels().bf16 == nullptr) return false;
  return c.packed.empty() ? bf16_dot_pays() : packed_pairs(c.packed);
}

bool rounds_x(const GluCall& c) { return bf16_weights_round_x(c.x.dtype(), c.w_dtype); }

CallCost Family::cost_of(const GluCall& c) const { return {call_flops(c), 0.0, uses_bf16_dot(c)}; }

void Family::finish_made_call(GluCall& c) const {
  if (c.packed_w) c.packed = PackedGluWeights(pack(c, c.num_threads));
}

// --- reference: f64 sums per output element, the activation and product in f32 ---

void activate_rows(const GluCall& c, float* h, int64_t r0, int64_t rows, kernels::Isa isa) {
  const int64_t N = c.n;
  const auto act_mul = kernels::row_kernels(isa).act_mul;
  const bool f32 = c.out().dtype() == DType::kF32;
  for (int64_t r = r0; r < r0 + rows; ++r) {
    float* g = h + r * 2 * N;
    if (c.h()) std::memcpy(c.h()->data_as<float>() + r * 2 * N, g, 2 * N * sizeof(float));
    // A bf16 output goes through the gate half of the row (act_mul writes element i after
    // reading it), which the residual copy above has already taken.
    float* o = f32 ? c.out().data_as<float>() + r * N : g;
    act_mul(static_cast<int>(c.activation), g, g + N, o, N);
    if (!f32) {
      for (int64_t j = 0; j < N; ++j) c.out().data_as<uint16_t>()[r * N + j] = f32_to_bf16(o[j]);
    }
  }
}

void Reference::check_call(const GluCall& c) const {
  if (!c.w.data() && c.m > 0) throw Unsupported("the reference needs the unpacked weights");
}

void Reference::run_call(GluCall& c, const Prepared*) const {
  int64_t ld;
  const void* wg = c.weights(0, &ld);
  const void* wu = c.weights(1, &ld);
  const bool round = rounds_x(c);
  parallel_for(c.m, c.num_threads, [&](int64_t r, int) {
    std::vector<double> g(static_cast<size_t>(c.n), 0.0), u(static_cast<size_t>(c.n), 0.0);
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const float xf = load_f32(c.x.data(), c.x.dtype(), r * c.k + kk);
      const double xv = round ? round_to_bf16(xf) : xf;
      for (int64_t j = 0; j < c.n; ++j) {
        g[j] += xv * load_f32(wg, c.w_dtype, kk * ld + j);
        u[j] += xv * load_f32(wu, c.w_dtype, kk * ld + j);
      }
    }
    for (int64_t j = 0; j < c.n; ++j) {
      const float gf = static_cast<float>(g[j]), uf = static_cast<float>(u[j]);
      const float o = kernels::apply_activation(c.activation, gf) * uf;
      if (c.x.dtype() == DType::kF32)
        c.out().data_as<float>()[r * c.n + j] = o;
      else
        c.out().data_as<uint16_t>()[r * c.n + j] = f32_to_bf16(o);
      if (c.h()) {
        c.h()->data_as<float>()[(r * 2) * c.n + j] = gf;
        c.h()->data_as<float>()[(r * 2 + 1) * c.n + j] = uf;
      }
    }
  });
}

}  // namespace tokamax::glu
