// moe_experts: its description, bind (shapes, dtypes and the routing's checks), the reference,
// tolerances and cost.
#include "ops/moe/base.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/microkernels.h"
#include "ops/elements.h"

namespace tokamax::moe {

namespace {

using A = Args<MoeCall>;

InvalidArgument bad(const std::string& what) {
  return InvalidArgument(std::string(kFamily) + ": " + what);
}

bool float_dtype(DType d) { return d == DType::kF32 || d == DType::kBF16; }

// Weight (e, row, col) of the logical [E, R, C] matrix, whichever layout holds it.
float weight(const TensorView& w, bool transposed, int64_t e, int64_t row, int64_t col) {
  const int64_t r = transposed ? w.dim(2) : w.dim(1), c = transposed ? w.dim(1) : w.dim(2);
  return transposed ? load_f32(w, (e * c + col) * r + row) : load_f32(w, (e * r + row) * c + col);
}

float round_as(DType d, float v) { return d == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

// The reference: each token's experts in turn, the products as ragged_dot's reference computes
// them (f32 accumulation in contraction order, the operands rounded as kDefault rounds them),
// the combine in j order.
class Reference : public TypedImplementation<MoeCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(MoeCall& c, const Prepared*) const override {
    const bool tr = c.transposed_weights;
    const DType x_as =
        bf16_weights_round_x(c.hidden.dtype(), c.w_gate_up.dtype()) ? DType::kBF16 : DType::kF32;
    const DType a_as = c.act_dtype();
    parallel_for(c.t, c.num_threads, [&](int64_t t, int) {
      std::vector<float> x(static_cast<size_t>(c.k)), h(static_cast<size_t>(2 * c.n)),
          a(static_cast<size_t>(c.n)), y(static_cast<size_t>(c.k)),
          out(static_cast<size_t>(c.k), 0.0f);
      for (int64_t kk = 0; kk < c.k; ++kk) x[kk] = round_as(x_as, load_f32(c.hidden, t * c.k + kk));
      for (int64_t j = 0; j < c.top_k; ++j) {
        const auto e = static_cast<int64_t>(c.top_k_index.get(t * c.top_k + j));
        std::fill(h.begin(), h.end(), 0.0f);
        for (int64_t kk = 0; kk < c.k; ++kk)
          for (int64_t col = 0; col < 2 * c.n; ++col)
            h[col] += x[kk] * weight(c.w_gate_up, tr, e, kk, col);
        for (int64_t i = 0; i < c.n; ++i)
          a[i] = round_as(a_as, kernels::apply_activation(c.activation, h[i]) * h[c.n + i]);
        std::fill(y.begin(), y.end(), 0.0f);
        for (int64_t i = 0; i < c.n; ++i)
          for (int64_t kk = 0; kk < c.k; ++kk) y[kk] += a[i] * weight(c.w_down, tr, e, i, kk);
        const float w = load_f32(c.top_k_weights, t * c.top_k + j);
        for (int64_t kk = 0; kk < c.k; ++kk) out[kk] += w * y[kk];
      }
      for (int64_t kk = 0; kk < c.k; ++kk) store_f32(c.out(), t * c.k + kk, out[kk]);
    });
  }
};

// A made call's routing: each token's top k of E random router logits (distinct experts, in
// descending order, as a router's top-k gives them), and their softmax-normalized weights.
A::Fill index_fill() {
  return [](const MoeCall& c, const TensorView& v, uint64_t seed) {
    const int64_t e = c.w_gate_up.rank() == 3 ? c.w_gate_up.dim(0) : 0;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> logit;
    std::vector<float> logits(static_cast<size_t>(e));
    std::vector<int64_t> order(static_cast<size_t>(e));
    const int64_t rows = v.rank() == 2 ? v.dim(0) : 0, k = v.rank() == 2 ? v.dim(1) : 0;
    for (int64_t t = 0; t < rows; ++t) {
      for (float& l : logits) l = logit(rng);
      std::iota(order.begin(), order.end(), 0);
      const int64_t top = std::min(k, e);
      std::partial_sort(order.begin(), order.begin() + top, order.end(),
                        [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
      for (int64_t j = 0; j < k; ++j) {
        const double idx = j < top ? static_cast<double>(order[j]) : 0.0;
        if (v.dtype() == DType::kI64)
          static_cast<int64_t*>(v.data())[t * k + j] = static_cast<int64_t>(idx);
        else if (v.dtype() == DType::kI32)
          static_cast<int32_t*>(v.data())[t * k + j] = static_cast<int32_t>(idx);
      }
    }
  };
}
A::Fill weights_fill() {
  return [](const MoeCall&, const TensorView& v, uint64_t seed) {
    fill_uniform(v, seed, 0.05, 1.0);
    if (v.rank() != 2 || !float_dtype(v.dtype())) return;
    for (int64_t t = 0; t < v.dim(0); ++t) {
      double sum = 0;
      for (int64_t j = 0; j < v.dim(1); ++j) sum += load_f32(v, t * v.dim(1) + j);
      for (int64_t j = 0; j < v.dim(1); ++j)
        store_f32(v, t * v.dim(1) + j, static_cast<float>(load_f32(v, t * v.dim(1) + j) / sum));
    }
  };
}
// Expert weights at a trained model's scale (about 1 / sqrt(fan-in)), so that the products of
// unit-normal hidden states stay near unit size through both products.
A::Fill expert_fill() {
  return [](const MoeCall& c, const TensorView& v, uint64_t seed) {
    fill_randn(v, seed);
    if (v.rank() != 3 || !float_dtype(v.dtype())) return;
    // [E, fan-in, out] (both products), [E, out, fan-in] transposed.
    const int64_t fan_in = c.transposed_weights ? v.dim(2) : v.dim(1);
    const float s = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(fan_in, 1)));
    for (int64_t i = 0; i < v.size(); ++i) store_f32(v, i, load_f32(v, i) * s);
  };
}

std::vector<ArgField<MoeCall>> argument_fields() {
  return {
      A::input("hidden", &MoeCall::hidden)
          .describe("f32 or bf16 [T, K]: the tokens' hidden states"),
      A::input("top_k_index", &MoeCall::top_k_index, index_fill())
          .describe("int32 or int64 [T, k]: each token's experts, in [0, E)"),
      A::input("top_k_weights", &MoeCall::top_k_weights, weights_fill())
          .describe("f32 or bf16 [T, k]: each routed expert's weight in the token's sum"),
      A::input("w_gate_up", &MoeCall::w_gate_up, expert_fill())
          .describe("f32 or bf16 [E, K, 2N], the gate's N columns then the up projection's "
                    "([E, 2N, K] with transposed_weights)"),
      A::input("w_down", &MoeCall::w_down, expert_fill())
          .describe("f32 or bf16 [E, N, K] ([E, K, N] with transposed_weights)"),
      A::enumeration("activation", &MoeCall::activation, activation_names())
          .describe("applied to the gate before it multiplies the up projection (silu: SwiGLU)"),
      A::value("transposed_weights", &MoeCall::transposed_weights)
          .describe("the weights in transformers' layout, out features first"),
      A::value("packed_weights", &MoeCall::packed_weights).internal(),
  };
}

}  // namespace

DType MoeCall::act_dtype() const {
  return w_down.dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

Family::Family()
    : TypedFamily(kFamily, argument_fields(), std::make_shared<Reference>(), {make_native()}) {}

const Family& family() { return family_instance<Family>(); }

std::string Family::summary() const {
  return "A mixture-of-experts layer's experts in one call: each token's hidden state through "
         "its top-k experts' gated linear units (activation(x W_gate) * (x W_up)) W_down, "
         "summed with the router's weights. The sort by expert, both grouped products, the "
         "activation and the combine run on the library's pool.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"out", "the experts' weighted sum per token, hidden's dtype", "hidden.shape",
           "hidden.dtype"}};
}

void Family::bind(MoeCall& c) const {
  const auto spec_error = [](const char* name, const TensorView& v, const std::string& want) {
    return bad(fmt::format("{} has spec {}{}; expected {}", name, v.spec().str(),
                           v.is_contiguous() ? "" : " (not contiguous)", want));
  };
  if (c.hidden.rank() != 2 || !float_dtype(c.hidden.dtype()) || !c.hidden.is_contiguous())
    throw spec_error("hidden", c.hidden, "a contiguous f32 or bf16 [T, K]");
  c.t = c.hidden.dim(0);
  c.k = c.hidden.dim(1);
  const TensorView& idx = c.top_k_index;
  if (idx.rank() != 2 || idx.dim(0) != c.t ||
      (idx.dtype() != DType::kI32 && idx.dtype() != DType::kI64) || !idx.is_contiguous()) {
    throw spec_error("top_k_index", idx, fmt::format("a contiguous int32 or int64 [{}, k]", c.t));
  }
  c.top_k = idx.dim(1);
  const TensorView& tw = c.top_k_weights;
  if (tw.spec().shape != idx.spec().shape || !float_dtype(tw.dtype()) || !tw.is_contiguous()) {
    throw spec_error(
        "top_k_weights", tw,
        fmt::format("a contiguous f32 or bf16 [{}, {}] (top_k_index's shape)", c.t, c.top_k));
  }
  const TensorView &wg = c.w_gate_up, &wd = c.w_down;
  const bool tr = c.transposed_weights;
  const std::string gu_form = tr ? "[E, 2N, K]" : "[E, K, 2N]";
  if (wg.rank() != 3 || !float_dtype(wg.dtype()) || !wg.is_contiguous() ||
      (tr ? wg.dim(2) : wg.dim(1)) != c.k || (tr ? wg.dim(1) : wg.dim(2)) % 2 != 0) {
    throw spec_error("w_gate_up", wg,
                     fmt::format("a contiguous f32 or bf16 {} with K = {} (hidden's) and an even "
                                 "2N",
                                 gu_form, c.k));
  }
  c.e = wg.dim(0);
  c.n = (tr ? wg.dim(1) : wg.dim(2)) / 2;
  const std::vector<int64_t> down =
      tr ? std::vector<int64_t>{c.e, c.k, c.n} : std::vector<int64_t>{c.e, c.n, c.k};
  if (wd.spec().shape != down || !float_dtype(wd.dtype()) || !wd.is_contiguous()) {
    throw spec_error("w_down", wd,
                     fmt::format("a contiguous f32 or bf16 {} (E = {} and N = {} from w_gate_up)",
                                 ShapeDtype{down, wd.dtype()}.str(), c.e, c.n));
  }
  if (c.top_k > 0 && c.e == 0 && c.t > 0)
    throw bad(fmt::format("w_gate_up {} has no experts; top_k_index routes each token to {}",
                          wg.spec().str(), c.top_k));
  // The routing, when there is data to read (a spec binds without).
  c.counts.assign(static_cast<size_t>(c.e), 0);
  c.sorted_row.clear();
  const int64_t slots = c.t * c.top_k;
  if (slots == 0 || idx.data() == nullptr) return;
  std::vector<int32_t> expert(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = idx.dtype() == DType::kI32 ? static_cast<const int32_t*>(idx.data())[s]
                                                 : static_cast<const int64_t*>(idx.data())[s];
    if (e < 0 || e >= c.e) {
      throw bad(fmt::format("top_k_index[{}, {}] = {}; expected an expert in [0, {})", s / c.top_k,
                            s % c.top_k, e, c.e));
    }
    expert[s] = static_cast<int32_t>(e);
    ++c.counts[e];
  }
  if (tw.data() != nullptr) {
    for (int64_t s = 0; s < slots; ++s) {
      if (!std::isfinite(load_f32(tw, s))) {
        throw bad(fmt::format("top_k_weights[{}, {}] = {}; expected a finite weight", s / c.top_k,
                              s % c.top_k, load_f32(tw, s)));
      }
    }
  }
  std::vector<int64_t> next(static_cast<size_t>(c.e));
  for (int64_t e = 0, at = 0; e < c.e; ++e) {
    next[e] = at;
    at += c.counts[e];
  }
  c.sorted_row.resize(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) c.sorted_row[s] = next[expert[s]]++;
}

void Family::finish_made_call(MoeCall& c) const {
  if (c.packed_weights) c.packed = pack_moe_weights(c.w_gate_up, c.w_down, c.transposed_weights);
}

Tolerance Family::tolerance_of(const MoeCall& c) const {
  // Two chained products (K-long, then N-long sums) of unit-scale operands, then at most k
  // weighted terms: ragged_dot's bounds over the longer sum. bf16 weights round the
  // activations between the products: an f32 sum either side of a rounding midpoint moves one
  // of them by a bf16 ulp, so the bound is ragged_dot's bf16 one.
  const bool bf16 = c.hidden.dtype() == DType::kBF16 || c.w_gate_up.dtype() == DType::kBF16 ||
                    c.w_down.dtype() == DType::kBF16;
  if (bf16) return {2e-2, 1e-2 + 1.0 / 128, 0};
  const double scale = std::sqrt(static_cast<double>(std::max<int64_t>({c.k, c.n, 1})));
  return {1e-4 * scale, 1e-4, 1e-5};
}

double weight_bytes(const MoeCall& c) {
  int64_t hit = 0;
  if (c.counts.empty() || c.sorted_row.empty()) {
    hit = std::min(c.e, c.t * c.top_k);  // no data: every slot a different expert
  } else {
    for (int32_t n : c.counts) hit += n > 0;
  }
  const double per_expert =
      static_cast<double>(c.k) * static_cast<double>(c.n) *
      static_cast<double>(2 * dtype_size(c.w_gate_up.dtype()) + dtype_size(c.w_down.dtype()));
  return static_cast<double>(hit) * per_expert;
}

bool Family::memory_bound_of(const MoeCall& c) const { return bandwidth_bound(cost_of(c)); }

CallCost Family::cost_of(const MoeCall& c) const {
  const double flops = 6.0 * static_cast<double>(c.t * c.top_k) * static_cast<double>(c.k) *
                       static_cast<double>(c.n);
  const bool bf16_dot =
      c.w_gate_up.dtype() == DType::kBF16 && kernels::best_kernels().bf16 != nullptr;
  return {flops, weight_bytes(c), bf16_dot};
}

}  // namespace tokamax::moe
