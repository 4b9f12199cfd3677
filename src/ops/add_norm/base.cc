// add_rms_norm: its description, bind (validation), the reference, tolerances and cost.
#include "ops/add_norm/base.h"

#include <fmt/format.h>

#include <cmath>

#include "core/f32_range.h"
#include "core/thread_pool.h"
#include "ops/elements.h"

namespace tokamax::add_norm {

namespace {

using A = Args<AddNormCall>;

InvalidArgument bad(const std::string& what) { return InvalidArgument("add_rms_norm: " + what); }

// Per row, the sum rounded to x's dtype, then its mean square in f64.
class Reference : public TypedImplementation<AddNormCall, void> {
 public:
  std::string name() const override { return "reference"; }
  void run_call(AddNormCall& call, const Prepared* prepared) const override;
};

std::vector<ArgField<AddNormCall>> argument_fields() {
  return {A::input("x", &AddNormCall::x).describe("f32 or bf16 [..., D], contiguous"),
          A::input("residual", &AddNormCall::residual)
              .describe("the residual stream: x's shape and dtype"),
          A::optional_input("scale", &AddNormCall::scale).describe("f32 or bf16 [D]"),
          A::real("epsilon", &AddNormCall::epsilon).describe("added to the mean square, >= 0")};
}

}  // namespace

Family::Family()
    : TypedFamily(kFamily, argument_fields(), std::make_shared<Reference>(),
                  {make_native(), make_composed()}) {}

const Family& family() { return family_instance<Family>(); }

std::string Family::summary() const {
  return "The residual add fused with the RMSNorm after it: residual_out = x + residual (in x's "
         "dtype), y = rms_norm(residual_out) * scale over the last axis.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"y", "the normalized sum, x's shape and dtype", "x.shape", "x.dtype"},
          {"residual_out", "x + residual, x's shape and dtype: the next block's residual",
           "x.shape", "x.dtype"}};
}

void Family::bind(AddNormCall& c) const {
  if (c.x.rank() < 1 || (c.x.dtype() != DType::kF32 && c.x.dtype() != DType::kBF16) ||
      !c.x.is_contiguous()) {
    throw bad(fmt::format("x has spec {}; expected a contiguous f32 or bf16 array of rank >= 1",
                          c.x.spec().str()));
  }
  if (c.residual.spec() != c.x.spec() || !c.residual.is_contiguous()) {
    throw bad(fmt::format("residual has spec {}; expected contiguous {} (x's)",
                          c.residual.spec().str(), c.x.spec().str()));
  }
  c.d = c.x.dim(c.x.rank() - 1);
  c.rows = c.d > 0 ? c.x.size() / c.d : 0;
  c.bf16 = c.x.dtype() == DType::kBF16;
  if (c.scale && (c.scale->rank() != 1 || c.scale->dim(0) != c.d || !c.scale->is_contiguous() ||
                  (c.scale->dtype() != DType::kF32 && c.scale->dtype() != DType::kBF16))) {
    throw bad(fmt::format("scale has spec {}; expected f32 or bf16 [{}] (x's last axis)",
                          c.scale->spec().str(), c.d));
  }
  check_in_f32_range("add_rms_norm", "epsilon", c.epsilon, /*allow_zero=*/true, /*positive=*/true);
}

Tolerance Family::tolerance_of(const AddNormCall& c) const {
  // The norms' (tokamax's {f32: 5e-7, bf16: 2e-3} * sqrt(D)); the sum is exact but for its
  // one rounding.
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>(c.d, 1)));
  if (c.bf16) return {2e-3 * depth, 8e-3, 0};
  return {5e-7 * depth, 2e-6, 0};
}

CallCost Family::cost_of(const AddNormCall& c) const {
  // x and residual read, y and residual_out written.
  const double n = static_cast<double>(c.x.size());
  return {5.0 * n, 4.0 * n * static_cast<double>(dtype_size(c.x.dtype())), false, true};
}

void Reference::run_call(AddNormCall& c, const Prepared*) const {
  parallel_for(c.rows, c.num_threads, [&](int64_t r, int) {
    const int64_t base = r * c.d;
    double ss = 0;
    for (int64_t j = 0; j < c.d; ++j) {
      store_f32(
          c.sum(), base + j,
          static_cast<float>(double{load_f32(c.x, base + j)} + load_f32(c.residual, base + j)));
      const double s = load_f32(c.sum(), base + j);
      ss += s * s;
    }
    const double rstd =
        1.0 / std::sqrt((c.d > 0 ? ss / static_cast<double>(c.d) : 0.0) + c.epsilon);
    for (int64_t j = 0; j < c.d; ++j) {
      double y = load_f32(c.sum(), base + j) * rstd;
      if (c.scale) y *= load_f32(*c.scale, j);
      store_f32(c.y(), base + j, static_cast<float>(y));
    }
  });
}

}  // namespace tokamax::add_norm
