// linear_softmax_cross_entropy_loss: arguments, bind (validation), the reference, tolerances
// and cost.
#include "ops/loss/base.h"

#include <fmt/format.h>

#include <cmath>

#include "autotuning/bf16_dot.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"

namespace tokamax::loss {

namespace {

using A = Args<LossCall>;

InvalidArgument bad(const std::string& what) {
  return InvalidArgument("linear_softmax_cross_entropy_loss: " + what);
}

}  // namespace

const EnumNames<LossReduction, 3>& reduction_names() {
  static constexpr EnumNames<LossReduction, 3> kNames{"reduction",
                                                      {{{LossReduction::kSum, "sum"},
                                                        {LossReduction::kMean, "mean"},
                                                        {LossReduction::kNone, "none"}}}};
  return kNames;
}

namespace {
std::vector<ArgField<LossCall>> forward_fields() {
  return {
      A::input("x", &LossCall::x).describe("f32 or bf16 [B, H]"),
      A::input("labels", &LossCall::labels, labels_within).describe("int32 [B], each in [0, V)"),
      A::input("w", &LossCall::w).python("weights").describe("f32 or bf16 [H, V]"),
      A::enumeration("reduction", &LossCall::reduction, reduction_names())
          .describe("sum, mean or none (the per-row losses)"),
      A::residuals_flag(&LossCall::return_residuals)};
}
}  // namespace

std::string Family::summary() const {
  return "The cross-entropy loss of a linear classifier head without its logits: loss_b = "
         "logsumexp(x_b w) - (x_b w)[labels_b] in f32, reduced; [B, V] is never materialized.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"loss", "f32: [] for sum and mean, [B] for none",
           "(x.shape[0],) if reduction == 'none' else ()", "float32"},
          {"lse", "f32 [B]: each row's log-sum-exp", "(x.shape[0],)", "float32", "", true}};
}

Family::Family()
    : TypedFamily(kFamily, forward_fields(), std::make_shared<Reference>(),
                  {make_native(), make_composed()}) {}

const Family& family() { return family_instance<Family>(); }

void bind_forward(LossCall& c) {
  auto f32_or_bf16 = [](DType d) { return d == DType::kF32 || d == DType::kBF16; };
  if (c.x.rank() != 2 || !f32_or_bf16(c.x.dtype()))
    throw bad(fmt::format("x has spec {}; expected [B, H], f32 or bf16", c.x.spec().str()));
  c.b = c.x.dim(0);
  c.h = c.x.dim(1);
  if (c.w.rank() != 2 || c.w.dim(0) != c.h || !f32_or_bf16(c.w.dtype())) {
    throw bad(fmt::format("w has spec {}; expected [H, V] with H = {} (x {}), f32 or bf16",
                          c.w.spec().str(), c.h, c.x.spec().str()));
  }
  c.v = c.w.dim(1);
  if (c.labels.dtype() != DType::kI32 || c.labels.rank() != 1 || c.labels.dim(0) != c.b) {
    throw bad(fmt::format("labels has spec {}; expected i32[{}] (one per row of x {})",
                          c.labels.spec().str(), c.b, c.x.spec().str()));
  }
  for (const auto& [name, t] :
       {std::pair{"x", &c.x}, std::pair{"w", &c.w}, std::pair{"labels", &c.labels}}) {
    if (t->data() && !t->is_contiguous())
      throw bad(fmt::format("{} {} must be a contiguous row-major array", name, t->spec().str()));
  }
  for (int64_t i = 0; c.labels.data() && i < c.b; ++i) {
    const int32_t l = c.label(i);
    if (l < 0 || l >= c.v) {
      throw bad(fmt::format("labels[{}] = {}; expected in [0, {}) (the vocabulary of w {})", i, l,
                            c.v, c.w.spec().str()));
    }
  }
}

void LossCall::write_loss(const std::vector<double>& per_row) const {
  float* out = loss().data_as<float>();
  if (reduction == LossReduction::kNone) {
    for (int64_t i = 0; i < b; ++i) out[i] = static_cast<float>(per_row[i]);
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < b; ++i) s += per_row[i];
  // The mean over no rows is 0, not NaN: an empty batch contributes nothing.
  if (reduction == LossReduction::kMean) s = b > 0 ? s / static_cast<double>(b) : 0.0;
  out[0] = static_cast<float>(s);
}

float LossVjpCall::row_weight(int64_t row) const {
  const float* d = dloss.data_as<const float>();
  if (reduction == LossReduction::kNone) return d[row];
  return reduction == LossReduction::kMean ? d[0] / static_cast<float>(std::max<int64_t>(b, 1))
                                           : d[0];
}

std::vector<ShapeDtype> Family::output_specs(const LossCall& c) const {
  std::vector<ShapeDtype> out = {{c.loss_shape(), DType::kF32}};
  if (c.return_residuals) out.push_back({{c.b}, DType::kF32});
  return out;
}

Tolerance Family::tolerance_of(const LossCall& c) const {
  // A logit sums H products in f32 (error about sqrt(H) ulps of its terms); the sum reduction
  // adds B rows' errors.
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>(c.h, 1)));
  const double rows = c.reduction == LossReduction::kSum ? static_cast<double>(c.b) : 1.0;
  if (c.x.dtype() == DType::kBF16 || c.w.dtype() == DType::kBF16)
    return {1e-2 * depth * std::max(rows, 1.0), 1e-2, 0};
  return {2e-6 * depth * std::max(rows, 1.0), 1e-5, 0};
}

double call_flops(const LossCall& c) {
  return 2.0 * static_cast<double>(c.b) * static_cast<double>(c.h) * static_cast<double>(c.v);
}

bool rounds_x(const LossCall& c) { return bf16_weights_round_x(c.x.dtype(), c.w.dtype()); }

float x_value(const LossCall& c, int64_t i) {
  const float v = load_f32(c.x, i);
  return rounds_x(c) ? round_to_bf16(v) : v;
}

const float* x_as_f32(const LossCall& c, Tensor* storage) {
  return kernels::a_as_f32(c.x.data(), c.x.dtype() == DType::kBF16, rounds_x(c), c.x.size(),
                           c.num_threads, storage);
}

bool native_logits_on_bf16_dot(const LossCall& c) {
  return c.w.dtype() == DType::kBF16 && bf16_dot_pays();
}

CallCost Family::cost_of(const LossCall& c) const {
  return {call_flops(c), 0.0, native_logits_on_bf16_dot(c)};
}

// --- reference: each row's logits in f64, then its log-sum-exp ---

void Reference::run_call(LossCall& c, const Prepared*) const {
  std::vector<double> per_row(static_cast<size_t>(c.b));
  parallel_for(c.b, c.num_threads, [&](int64_t r, int) {
    std::vector<double> logits(static_cast<size_t>(c.v), 0.0);
    for (int64_t k = 0; k < c.h; ++k) {
      const double xv = x_value(c, r * c.h + k);
      for (int64_t j = 0; j < c.v; ++j) logits[j] += xv * load_f32(c.w, k * c.v + j);
    }
    double m = -INFINITY;
    for (double l : logits) m = std::max(m, l);
    double s = 0;
    for (double l : logits) s += std::exp(l - m);
    const double lse = m + std::log(s);
    per_row[r] = lse - logits[c.label(r)];
    if (c.lse()) c.lse()->data_as<float>()[r] = static_cast<float>(lse);
  });
  c.write_loss(per_row);
}

}  // namespace tokamax::loss
