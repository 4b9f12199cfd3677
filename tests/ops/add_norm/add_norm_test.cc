// add_rms_norm: the reference against an independent f64 computation, then every
// implementation against the reference (edge sizes, both dtypes, with and without a scale, every
// native config), bad input, and the description that the bindings are built from.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/add_norm/base.h"
#include "tests/expect_error.h"
#include "tests/ops/common.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

using op_test::expect_close;
using testing::expect_invalid_argument;

struct Inputs {
  Tensor x, residual;
  std::optional<Tensor> scale;
};

Inputs make_inputs(int64_t rows, int64_t d, DType dt, bool scale) {
  Inputs in;
  in.x = Tensor::randn({rows, d}, dt, fresh_seed());
  in.residual = Tensor::randn({rows, d}, dt, fresh_seed());
  if (scale) in.scale = Tensor::randn({d}, DType::kF32, fresh_seed());
  return in;
}

std::optional<TensorView> scale_of(const Inputs& in) {
  if (!in.scale) return std::nullopt;
  return in.scale->view();
}

// Each x + residual rounded to the dtype (through f32, as stored), then the RMSNorm in f64.
std::pair<std::vector<double>, std::vector<double>> want(const Inputs& in, double eps) {
  const int64_t d = in.x.dim(1), rows = in.x.dim(0);
  Tensor sum(in.x.shape(), in.x.dtype());
  for (int64_t i = 0; i < sum.size(); ++i)
    sum.view().set(i, static_cast<float>(in.x.get(i) + in.residual.get(i)));
  std::vector<double> y(static_cast<size_t>(sum.size())), s = op_test::values(sum);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += s[r * d + j] * s[r * d + j];
    const double rstd = 1 / std::sqrt(ss / static_cast<double>(d) + eps);
    for (int64_t j = 0; j < d; ++j)
      y[r * d + j] = s[r * d + j] * rstd * (in.scale ? in.scale->get(j) : 1.0);
  }
  return {y, s};
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},   {3, 7},    {5, 16},  {2, 33},
                                                          {4, 130}, {1, 4096}, {17, 513}};

TEST(AddRmsNorm, ReferenceMatchesDoubles) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const auto& [rows, d] : kShapes) {
      for (bool scale : {false, true}) {
        const Inputs in = make_inputs(rows, d, dt, scale);
        AddRmsNormOptions o;
        o.implementation = "reference";
        o.epsilon = 1e-5;
        const AddRmsNormResult r = add_rms_norm(in.x, in.residual, scale_of(in), o);
        const auto [y, s] = want(in, o.epsilon);
        const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                                 std::to_string(d) + (scale ? " scale" : "");
        const Tolerance tol =
            dt == DType::kBF16 ? Tolerance{1e-2, 8e-3, 0} : Tolerance{1e-6, 1e-6, 0};
        expect_close(r.y, y, tol, "y " + what);
        expect_close(r.residual_out, s, {0, 0, 0}, "residual_out " + what);
      }
    }
  }
}

TEST(AddRmsNorm, EveryImplementationAndConfigMatchesTheReference) {
  const OpFamily& family = find_family("add_rms_norm");
  for (const std::string impl : {"native", "composed"}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const auto& [rows, d] : kShapes) {
        const Inputs in = make_inputs(rows, d, dt, rows % 2 == 1);
        AddRmsNormOptions o;
        o.implementation = "reference";
        const AddRmsNormResult ref = add_rms_norm(in.x, in.residual, scale_of(in), o);
        std::vector<std::optional<Config>> configs = {std::nullopt};
        if (impl == "native") {
          for (int rpi : {1, 3, 64}) configs.push_back(Config::make(LayerNormNativeConfig{rpi}));
        }
        for (const auto& config : configs) {
          o.implementation = impl;
          o.config = config;
          const AddRmsNormResult got = add_rms_norm(in.x, in.residual, scale_of(in), o);
          const std::string what = impl + " " + std::string(dtype_name(dt)) + " " +
                                   std::to_string(rows) + "x" + std::to_string(d);
          const auto bound =
              family.bind_json({{"x", in.x.spec().str()}, {"residual", in.x.spec().str()}}, impl);
          const Tolerance tol = family.tolerance(*family.make_call(bound, 1));
          expect_close(got.y, op_test::values(ref.y), tol, "y " + what);
          expect_close(got.residual_out, op_test::values(ref.residual_out), {0, 0, 0},
                       "residual_out " + what);
        }
      }
    }
  }
}

// The streamed path (outputs over the last-level cache: a row of scratch a thread, non-temporal
// stores, a fence an item), reached on small arrays by lowering its threshold.
TEST(AddRmsNorm, StreamedOutputsMatchTheReference) {
  add_norm::set_stream_threshold_for_testing(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const auto& [rows, d] : kShapes) {
      const Inputs in = make_inputs(rows, d, dt, true);
      AddRmsNormOptions o;
      o.implementation = "reference";
      const AddRmsNormResult ref = add_rms_norm(in.x, in.residual, scale_of(in), o);
      for (int rpi : {1, 3}) {
        o.implementation = "native";
        o.config = Config::make(LayerNormNativeConfig{rpi});
        const AddRmsNormResult got = add_rms_norm(in.x, in.residual, scale_of(in), o);
        const std::string what = std::string(dtype_name(dt)) + " " + std::to_string(rows) + "x" +
                                 std::to_string(d) + " rows_per_item " + std::to_string(rpi);
        const double depth = std::sqrt(static_cast<double>(d));  // the family's tolerance
        const Tolerance tol = dt == DType::kBF16 ? Tolerance{2e-3 * depth, 8e-3, 0}
                                                 : Tolerance{5e-7 * depth, 2e-6, 0};
        expect_close(got.y, op_test::values(ref.y), tol, "y " + what);
        expect_close(got.residual_out, op_test::values(ref.residual_out), {0, 0, 0},
                     "residual_out " + what);
      }
    }
  }
  add_norm::set_stream_threshold_for_testing(0);
}

TEST(AddRmsNorm, EmptyAndThreeDimensional) {
  for (const Shape& shape : {Shape{0, 8}, Shape{4, 0}, Shape{2, 3, 40}}) {
    const Tensor x = Tensor::randn(shape, DType::kF32, fresh_seed());
    const Tensor r = Tensor::randn(shape, DType::kF32, fresh_seed());
    const AddRmsNormResult got = add_rms_norm(x, r);
    AddRmsNormOptions o;
    o.implementation = "reference";
    const AddRmsNormResult ref = add_rms_norm(x, r, std::nullopt, o);
    EXPECT_EQ(got.y.shape(), shape);
    expect_close(got.y, op_test::values(ref.y), {1e-5, 1e-5, 0}, shape_str(shape));
  }
}

TEST(AddRmsNorm, BadInput) {
  const Tensor x = Tensor::zeros({4, 6}, DType::kF32);
  expect_invalid_argument(
      [&] {
        add_rms_norm(x, Tensor::zeros({4, 5}, DType::kF32));
      },
      "residual has spec f32[4,5]; expected contiguous f32[4,6]");
  expect_invalid_argument(
      [&] {
        add_rms_norm(x, Tensor::zeros({4, 6}, DType::kBF16));
      },
      "residual has spec bf16[4,6]");
  expect_invalid_argument([&] { add_rms_norm(x, x, Tensor::zeros({5}, DType::kF32).view()); },
                          "scale has spec f32[5]; expected f32 or bf16 [6]");
  expect_invalid_argument([&] { add_rms_norm(Tensor::zeros({4}, DType::kI32), x); },
                          "x has spec i32[4]");
  AddRmsNormOptions o;
  o.epsilon = -1;
  expect_invalid_argument([&] { add_rms_norm(x, x, std::nullopt, o); }, "epsilon = -1");
  o.epsilon = NAN;
  expect_invalid_argument([&] { add_rms_norm(x, x, std::nullopt, o); }, "epsilon = nan");
}

// The description every binding is built from: arguments with their defaults (the call struct's,
// which are the public options'), outputs with the shape rules fake tensors use.
TEST(AddRmsNorm, DescriptionComesFromTheFields) {
  const Json d = find_family("add_rms_norm").description();
  EXPECT_EQ(d["op"], "add_rms_norm");
  std::vector<std::string> names;
  for (const Json& a : d["arguments"]) names.push_back(a["name"].get<std::string>());
  EXPECT_EQ(names, (std::vector<std::string>{"x", "residual", "scale", "epsilon"}));
  EXPECT_EQ(d["arguments"][3]["default"].get<double>(), AddRmsNormOptions().epsilon);
  EXPECT_EQ(d["arguments"][3]["kind"], "real");
  EXPECT_EQ(d["arguments"][2]["kind"], "optional_array");
  ASSERT_EQ(d["outputs"].size(), 2u);
  EXPECT_EQ(d["outputs"][1]["name"], "residual_out");
  EXPECT_EQ(d["outputs"][1]["shape"], "x.shape");
}

// The generic call path (run_named) gives what the typed function gives.
TEST(AddRmsNorm, RunNamedMatchesTheTypedCall) {
  const Inputs in = make_inputs(3, 40, DType::kF32, true);
  const OpFamily& family = find_family("add_rms_norm");
  const std::vector<Tensor> got = family.run_named(
      {{"x", in.x.view()}, {"residual", in.residual.view()}, {"scale", in.scale->view()}},
      Json{{"epsilon", 1e-3}}, {});
  AddRmsNormOptions o;
  o.epsilon = 1e-3;
  const AddRmsNormResult want = add_rms_norm(in.x, in.residual, scale_of(in), o);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(std::memcmp(got[0].data(), want.y.data(), want.y.nbytes()), 0);
  EXPECT_EQ(std::memcmp(got[1].data(), want.residual_out.data(), want.y.nbytes()), 0);
  expect_invalid_argument(
      [&] {
        family.run_named({{"y", in.x.view()}}, Json::object(), {});
      },
      "unknown array argument 'y'");
  expect_invalid_argument(
      [&] {
        family.run_named({{"x", in.x.view()}}, Json::object(), {});
      },
      "missing array argument 'residual'");
  expect_invalid_argument(
      [&] {
        family.run_named({{"x", in.x.view()}, {"residual", in.x.view()}}, Json{{"eps", 1}}, {});
      },
      "unknown argument 'eps'");
  expect_invalid_argument(
      [&] {
        family.run_named({{"x", in.x.view()}, {"residual", in.x.view()}}, Json{{"scale", 2.0}}, {});
      },
      "'scale' is an array; pass it among the arrays");
  expect_invalid_argument(
      [&] {
        family.run_named({{"x", in.x.view()}, {"x", in.x.view()}, {"residual", in.x.view()}},
                         Json::object(), {});
      },
      "array 'x' given twice");
  // A library-set flag (the GLU's packed weights) is not a caller's.
  expect_invalid_argument(
      [&] {
        find_family("gated_linear_unit")
            .run_named({{"x", in.x.view()}, {"w", in.x.view()}}, Json{{"packed_w", true}}, {});
      },
      "'packed_w' is set by the library");
  expect_invalid_argument(
      [&] {
        family.run_named({{"x", in.x.view()}, {"residual", in.x.view()}}, Json{{"epsilon", "big"}},
                         {});
      },
      "add_rms_norm: epsilon = \"big\"; expected a number");
}

}  // namespace
}  // namespace tokamax
