// layer_norm: arguments, bind (validation), the reference, tolerances and cost.
#include "ops/norm/base.h"

#include <fmt/format.h>

#include <cmath>

#include "core/f32_range.h"
#include "core/thread_pool.h"

namespace tokamax::norm {

namespace {

using A = Args<NormCall>;

InvalidArgument bad(const std::string& what) { return InvalidArgument("layer_norm: " + what); }

std::vector<ArgField<NormCall>> forward_fields() {
  return {A::input("x", &NormCall::x).describe("f32 or bf16, any rank >= 1, contiguous"),
          A::optional_input("scale", &NormCall::scale)
              .describe("f32 or bf16 [D], D = x.shape[axis]; multiplies the normalized x"),
          A::optional_input("offset", &NormCall::offset)
              .describe("f32 or bf16 [D]; added after the scale"),
          A::value("axis", &NormCall::axis)
              .describe("the normalized axis; negative counts from the end"),
          A::real("epsilon", &NormCall::epsilon).describe("added to the variance, >= 0"),
          A::value("subtract_mean", &NormCall::subtract_mean)
              .describe("false: rms_norm (the mean taken as 0)"),
          A::residuals_flag(&NormCall::return_residuals)};
}

}  // namespace

Family::Family()
    : TypedFamily(kFamily, forward_fields(), std::make_shared<Reference>(),
                  {make_native(), make_composed()}) {}

const Family& family() { return family_instance<Family>(); }

std::string Family::summary() const {
  return "Layer normalization over one axis: y = (x - mean) / sqrt(var + epsilon) * scale + "
         "offset, the statistics in f64 from f32 values; y has x's dtype. subtract_mean=False "
         "is RMSNorm.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"y", "the normalized x, x's shape and dtype", "x.shape", "x.dtype"},
          {"mean", "per row, x's shape without the axis (zeros for rms_norm)",
           "drop(x.shape, axis)", "float32", "", true},
          {"rstd", "1 / sqrt(var + epsilon) per row", "drop(x.shape, axis)", "float32", "", true}};
}

Json Family::aliases() const {
  return Json::array({{{"name", "rms_norm"},
                       {"doc", "RMSNorm: layer_norm with subtract_mean=False and no offset."},
                       {"fixed", {{"subtract_mean", false}, {"offset", nullptr}}}}});
}

void set_options(NormCall& c, const LayerNormOptions& o) {
  c.axis = o.axis;
  c.epsilon = o.epsilon;
  c.subtract_mean = o.subtract_mean;
  c.num_threads = 0;
}

void bind_forward(NormCall& c) {
  if (c.x.rank() < 1 || (c.x.dtype() != DType::kF32 && c.x.dtype() != DType::kBF16))
    throw bad(fmt::format("x has spec {}; expected rank >= 1, f32 or bf16", c.x.spec().str()));
  if (!c.x.is_contiguous())
    throw bad(fmt::format("x {} must be a contiguous row-major array", c.x.spec().str()));
  const int64_t rank = c.x.rank();
  if (c.axis < -rank || c.axis >= rank) {
    throw bad(fmt::format("axis = {} for x of shape {}; expected in [{}, {})", c.axis,
                          shape_str(c.x.shape()), -rank, rank));
  }
  const int64_t ax = c.axis < 0 ? c.axis + rank : c.axis;
  c.outer = 1;
  c.inner = 1;
  for (int64_t i = 0; i < ax; ++i) c.outer *= c.x.dim(i);
  for (int64_t i = ax + 1; i < rank; ++i) c.inner *= c.x.dim(i);
  c.d = c.x.dim(ax);
  c.bf16 = c.x.dtype() == DType::kBF16;
  for (const auto& [name, p] : {std::pair{"scale", &c.scale}, std::pair{"offset", &c.offset}}) {
    if (!*p) continue;
    const TensorView& v = **p;
    if (v.rank() != 1 || v.dim(0) != c.d || !v.is_contiguous() ||
        (v.dtype() != DType::kF32 && v.dtype() != DType::kBF16)) {
      throw bad(fmt::format("{} has spec {}; expected f32 or bf16 [{}] (x {} along axis {})", name,
                            v.spec().str(), c.d, shape_str(c.x.shape()), c.axis));
    }
  }
  check_in_f32_range("layer_norm", "epsilon", c.epsilon, /*allow_zero=*/true, /*positive=*/true);
}

Shape NormCall::stats_shape() const {
  Shape s;
  const int64_t rank = x.rank(), ax = axis < 0 ? axis + rank : axis;
  for (int64_t i = 0; i < rank; ++i)
    if (i != ax) s.push_back(x.dim(i));
  return s;
}

std::vector<ShapeDtype> Family::output_specs(const NormCall& c) const {
  std::vector<ShapeDtype> out = {c.x.spec()};
  if (c.return_residuals) {
    out.push_back({c.stats_shape(), DType::kF32});
    out.push_back({c.stats_shape(), DType::kF32});
  }
  return out;
}

Tolerance Family::tolerance_of(const NormCall& c) const {
  // tokamax's normalization tolerance: {f32: 5e-7, bf16: 2e-3} * sqrt(D).
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>(c.d, 1)));
  if (c.bf16) return {2e-3 * depth, 8e-3, 0};
  return {5e-7 * depth, 2e-6, 0};
}

CallCost Family::cost_of(const NormCall& c) const {
  // x read once and y written once (the statistics and parameters are small).
  const double bytes = 2.0 * static_cast<double>(c.x.size() * dtype_size(c.x.dtype()));
  return {6.0 * static_cast<double>(c.x.size()), bytes, false, true};
}

const float* params_f32(const std::optional<TensorView>& p, Tensor* storage) {
  if (!p) return nullptr;
  if (p->dtype() == DType::kF32) return p->data_as<const float>();
  *storage = Tensor(p->shape(), DType::kF32);
  for (int64_t i = 0; i < p->size(); ++i) storage->data_as<float>()[i] = load_f32(*p, i);
  return storage->data_as<const float>();
}

// --- reference: per row, the mean then the variance around it in f64, then y ---

void Reference::run_call(NormCall& c, const Prepared*) const {
  parallel_for(c.rows(), c.num_threads, [&](int64_t r, int) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < c.d; ++j) mean += load_f32(c.x, c.index(r, j));
    mean = c.subtract_mean && c.d > 0 ? mean / static_cast<double>(c.d) : 0.0;
    for (int64_t j = 0; j < c.d; ++j) {
      const double e = load_f32(c.x, c.index(r, j)) - mean;
      var += e * e;
    }
    var = c.d > 0 ? var / static_cast<double>(c.d) : 0.0;
    const double rstd = 1.0 / std::sqrt(var + c.epsilon);
    for (int64_t j = 0; j < c.d; ++j) {
      double y = (load_f32(c.x, c.index(r, j)) - mean) * rstd;
      if (c.scale) y *= load_f32(*c.scale, j);
      if (c.offset) y += load_f32(*c.offset, j);
      store_f32(c.y(), c.index(r, j), static_cast<float>(y));
    }
    if (c.mean()) {
      c.mean()->data_as<float>()[r] = static_cast<float>(mean);
      c.rstd()->data_as<float>()[r] = static_cast<float>(rstd);
    }
  });
}

}  // namespace tokamax::norm
