// Quantized weights: each format's codes decoded by this file's own reading of the formats
// (OCP e4m3fn and e2m1/e8m0, two's-complement int8, offset nibbles) in double precision; quantize
// against its documented rounding rules; the reference against that independent computation;
// the kernel of every ISA this CPU runs and the native implementation (every config) against
// the reference over edge sizes; bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/qstream.h"
#include "ops/quantized/base.h"
#include "tests/expect_error.h"
#include "tests/kernels/kernel_sets.h"
#include "tests/ops/common.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

std::optional<Tensor> clone_of(const std::optional<Tensor>& t) {
  if (!t) return std::nullopt;
  return t->clone();
}

using op_test::expect_close;
using testing::expect_invalid_argument;

// --- The formats as this test reads them (not the library's decoders). ---

double e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return s ? -mag : mag;
}

double e2m1(int nib) {
  const int s = nib >> 3, e = (nib >> 1) & 3, m = nib & 1;
  const double mag = e == 0 ? m * 0.5 : (1 + m / 2.0) * std::pow(2.0, e - 1);
  return s ? -mag : mag;
}

// Weight (g, k, j) of q, in double, from the layout's definition (quantized.h).
double weight(const QuantizedTensor& q, int64_t g, int64_t k, int64_t j) {
  const int64_t P = (q.n + 63) / 64, p = j / 64, col = j % 64;
  const auto* v = static_cast<const uint8_t*>(q.values.data());
  const int64_t srow = ((g * P + p) * (q.k / q.group_size) + k / q.group_size) * 64 + col;
  const int64_t row = (g * P + p) * q.k + k;
  double value;
  switch (q.format) {
    case QuantFormat::kInt8:
      value = static_cast<int8_t>(v[row * 64 + col]);
      break;
    case QuantFormat::kFp8E4M3:
      value = e4m3(v[row * 64 + col]);
      break;
    default: {
      const uint8_t b = v[row * 32 + col % 32];
      const int nib = col < 32 ? b & 15 : b >> 4;
      if (q.format == QuantFormat::kMxfp4) {
        value = e2m1(nib);
      } else {
        const int zero = q.zeros ? static_cast<const uint8_t*>(q.zeros->data())[srow] : 8;
        value = nib - zero;
      }
    }
  }
  const double scale =
      q.format == QuantFormat::kMxfp4
          ? std::pow(2.0,
                     static_cast<int>(static_cast<const uint8_t*>(q.scales.data())[srow]) - 127)
          : q.scales.data_as<float>()[srow];
  return scale * value;
}

struct Case {
  QuantFormat format;
  int64_t group_size;
  bool asymmetric;
};
const std::vector<Case> kCases = {
    {QuantFormat::kInt8, 0, false},  {QuantFormat::kInt8, 8, false},
    {QuantFormat::kInt4, 32, false}, {QuantFormat::kInt4, 32, true},
    {QuantFormat::kInt4, 64, true},  {QuantFormat::kFp8E4M3, 0, false},
    {QuantFormat::kMxfp4, 32, false}};

std::string name_of(const Case& c, int64_t k, int64_t n) {
  return std::string(quant_format_name(c.format)) + " g" + std::to_string(c.group_size) +
         (c.asymmetric ? " asym" : "") + " K=" + std::to_string(k) + " N=" + std::to_string(n);
}

// K sizes each case's group size allows, the edges included.
std::vector<int64_t> ks_for(const Case& c) {
  if (c.format == QuantFormat::kFp8E4M3 || (c.format == QuantFormat::kInt8 && c.group_size == 0))
    return {1, 7, 40};
  return {c.group_size, 2 * c.group_size};
}

// The double-precision product of lhs with the weights q stands for, rows past the groups zero.
std::vector<double> product(const Tensor& lhs, const QuantizedTensor& q,
                            const std::vector<int32_t>& sizes) {
  const int64_t M = lhs.dim(0), K = q.k, N = q.n;
  std::vector<double> out(static_cast<size_t>(M * N), 0.0);
  int64_t r = 0;
  for (int64_t g = 0; g < q.groups; ++g) {
    for (int64_t e = 0; e < sizes[g]; ++e, ++r) {
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += lhs.get(r * K + k) * weight(q, g, k, j);
        out[r * N + j] = s;
      }
    }
  }
  return out;
}

TEST(Quantize, EachFormatFollowsItsRoundingRule) {
  std::mt19937_64 rng(fresh_seed());
  for (const Case& c : kCases) {
    for (int64_t k : ks_for(c)) {
      for (int64_t n : {1, 63, 64, 130}) {
        const Tensor w = Tensor::randn({2, k, n}, DType::kF32, rng());
        const QuantizedTensor q = quantize(w, c.format, c.group_size, c.asymmetric);
        const std::string what = name_of(c, k, n);
        // Every weight is within half a step of its group's grid (the format's spacing at its
        // magnitude, times the scale), and dequantize gives the layout's values exactly.
        const Tensor d = dequantize(q);
        ASSERT_EQ(d.shape(), (Shape{2, k, n})) << what;
        for (int64_t g = 0; g < 2; ++g) {
          for (int64_t kk = 0; kk < k; ++kk) {
            for (int64_t j = 0; j < n; ++j) {
              const double want = weight(q, g, kk, j);
              ASSERT_EQ(d.get((g * k + kk) * n + j), static_cast<float>(want)) << what;
              const double x = w.get((g * k + kk) * n + j);
              const int64_t gs = q.group_size;
              double amax = 0;
              for (int64_t t = kk / gs * gs; t < (kk / gs + 1) * gs; ++t)
                amax = std::max(amax, std::fabs(w.get((g * k + t) * n + j)));
              // Largest error each rule allows, relative to the group's largest magnitude.
              double bound = 0;
              switch (c.format) {
                case QuantFormat::kInt8:
                  bound = amax / 127 / 2;
                  break;
                case QuantFormat::kInt4:
                  bound = (c.asymmetric ? 2 * amax / 15 : amax / 7) / 2;
                  break;
                case QuantFormat::kFp8E4M3:
                  bound = std::max(std::fabs(x) / 16, amax / 448 * std::pow(2.0, -9));
                  break;
                case QuantFormat::kMxfp4:
                  // Half of e2m1's step at |x| (0.5 below 2, 1 below 4, 2 above), times the
                  // scale, and the clip to 6: at most 2 scaled units.
                  bound = amax / 2;
                  break;
              }
              // f32's own roundings (the scale, w / s) add a few units in its last place.
              ASSERT_LE(std::fabs(want - x), bound * (1 + 1e-5) + amax * 1e-6 + 1e-30)
                  << what << " at " << g << "," << kk << "," << j << ": " << x << " -> " << want;
            }
          }
        }
      }
    }
  }
}

TEST(Quantize, ZeroGroupsExactValuesAndRoundTrips) {
  // All zeros: scale 1, every value zero (never a zero scale).
  const Tensor zeros = Tensor::zeros({1, 32, 5}, DType::kF32);
  for (const Case& c : kCases) {
    if (c.group_size > 32) continue;
    const QuantizedTensor q = quantize(zeros, c.format, c.group_size, c.asymmetric);
    const Tensor d = dequantize(q);
    for (int64_t i = 0; i < d.size(); ++i) ASSERT_EQ(d.get(i), 0.0) << name_of(c, 32, 5);
    QuantizedTensor again =
        QuantizedTensor::from_parts(q.format, q.groups, q.k, q.n, c.group_size, q.values.clone(),
                                    q.scales.clone(), clone_of(q.zeros));
    EXPECT_EQ(again.bytes(), q.bytes());
  }
  // Values on the grid come back exactly: int8 multiples of amax / 127, fp8's codes.
  Tensor w({1, 4, 2}, DType::kF32);
  const float vals[8] = {127, -127, 1, -3, 64, 0, 2, -100};
  for (int i = 0; i < 8; ++i) w.view().set(i, vals[i]);
  const Tensor d = dequantize(quantize(w, QuantFormat::kInt8));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(d.get(i), vals[i]);
  Tensor f({1, 3, 1}, DType::kF32);
  const float fv[3] = {448, -0.25f, 3.5f};
  for (int i = 0; i < 3; ++i) f.view().set(i, fv[i]);
  const Tensor fd = dequantize(quantize(f, QuantFormat::kFp8E4M3));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fd.get(i), fv[i]);
}

// The library's scalar decoders against this file's reading of every code.
TEST(Quantize, DecodersMatchTheFormats) {
  for (int b = 0; b < 256; ++b) {
    const double want = e4m3(static_cast<uint8_t>(b));
    const float got = kernels::decode_fp8_e4m3(static_cast<uint8_t>(b));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << b;
    else
      EXPECT_EQ(got, want) << b;
  }
  for (int n = 0; n < 16; ++n) EXPECT_EQ(kernels::decode_e2m1(static_cast<uint8_t>(n)), e2m1(n));
  EXPECT_EQ(kernels::decode_e8m0(127), 1.0f);
  EXPECT_EQ(kernels::decode_e8m0(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(kernels::decode_e8m0(255)));
}

TEST(QuantizedRaggedDot, ReferenceMatchesDoubles) {
  std::mt19937_64 rng(fresh_seed());
  for (const Case& c : kCases) {
    for (int64_t k : ks_for(c)) {
      for (int64_t n : {1, 65}) {
        const std::vector<int32_t> sizes = {2, 0, 3};
        const QuantizedTensor q = quantize(Tensor::randn({3, k, n}, DType::kF32, rng()), c.format,
                                           c.group_size, c.asymmetric);
        for (DType dt : {DType::kF32, DType::kBF16}) {
          const Tensor lhs = Tensor::randn({6, k}, dt, rng());
          QuantizedRaggedDotOptions o;
          o.implementation = "reference";
          const Tensor got = ragged_dot(lhs, q, sizes, o);
          EXPECT_EQ(got.dtype(), dt);
          const double depth = std::sqrt(static_cast<double>(k));
          expect_close(got, product(lhs, q, sizes),
                       dt == DType::kBF16 ? Tolerance{1e-2, 5e-3 + 1.0 / 128, 0}
                                          : Tolerance{1e-5 * depth, 1e-5, 1e-6},
                       "reference " + name_of(c, k, n));
        }
      }
    }
  }
}

// The kernel of every ISA this CPU runs, each tile height, against the reference's weights.
TEST(QuantizedRaggedDot, KernelOfEveryIsaMatchesTheReference) {
  std::mt19937_64 rng(fresh_seed());
  for (const kernels::KernelSet* set : testing::runnable_sets()) {
    const kernels::QStreamKernel kernel = kernels::qstream_kernel(set->isa);
    for (const Case& c : kCases) {
      for (int64_t k : ks_for(c)) {
        const QuantizedTensor q = quantize(Tensor::randn({1, k, 64}, DType::kF32, rng()), c.format,
                                           c.group_size, c.asymmetric);
        for (int mr = 1; mr <= kernels::kQMaxMr; ++mr) {
          const Tensor a = Tensor::randn({mr, k}, DType::kF32, rng());
          // Sentinels past the tile's 64 columns of each row catch a write outside it.
          std::vector<float> c_tile(static_cast<size_t>(mr * 80), -7.0f);
          kernel(quant::kernel_format(c.format), mr, k, q.group_size, a.data_as<float>(), k,
                 static_cast<const uint8_t*>(q.values.data()), q.scales.data(),
                 q.zeros ? static_cast<const uint8_t*>(q.zeros->data()) : nullptr, c_tile.data(),
                 80);
          const std::string what =
              std::string(set->name) + " mr=" + std::to_string(mr) + " " + name_of(c, k, 64);
          for (int i = 0; i < mr; ++i) {
            for (int j = 0; j < 64; ++j) {
              double want = 0;
              for (int64_t kk = 0; kk < k; ++kk) want += a.get(i * k + kk) * weight(q, 0, kk, j);
              ASSERT_NEAR(c_tile[i * 80 + j], want, 1e-5 * std::sqrt(k) * (1 + std::fabs(want)))
                  << what << " at " << i << "," << j;
            }
            for (int j = 64; j < 80; ++j) ASSERT_EQ(c_tile[i * 80 + j], -7.0f) << what;
          }
        }
      }
    }
  }
}

// Every code of every format through the kernel of every ISA (quantize never writes the NaN
// codes or every nibble): one row of values a call with a = 1 and scale 1, so the tile is the
// decoded values themselves; NaN codes must come out NaN.
TEST(QuantizedRaggedDot, KernelDecodesEveryCode) {
  for (const kernels::KernelSet* set : testing::runnable_sets()) {
    const kernels::QStreamKernel kernel = kernels::qstream_kernel(set->isa);
    for (const QuantFormat f :
         {QuantFormat::kInt8, QuantFormat::kFp8E4M3, QuantFormat::kInt4, QuantFormat::kMxfp4}) {
      const bool nibbles = f == QuantFormat::kInt4 || f == QuantFormat::kMxfp4;
      const int rb = nibbles ? 32 : 64, K = 4;
      std::vector<uint8_t> values(static_cast<size_t>(K * rb));
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 37 + 11);
      // Byte i * 37 + 11 over 256 bytes covers every byte value (37 is odd); the nibbles too.
      std::vector<float> scales(64, 1.0f);
      std::vector<uint8_t> e8m0(64, 127), zeros(64, 8);
      // One row of values a call (K = 1, a = 1): a NaN code times another row's 0 would be NaN.
      const float one = 1.0f;
      std::vector<float> c(static_cast<size_t>(K * 64));
      for (int k = 0; k < K; ++k) {
        kernel(quant::kernel_format(f), 1, 1, 1, &one, 1, values.data() + k * rb,
               f == QuantFormat::kMxfp4 ? static_cast<const void*>(e8m0.data()) : scales.data(),
               f == QuantFormat::kInt4 ? zeros.data() : nullptr, c.data() + k * 64, 64);
      }
      for (int k = 0; k < K; ++k) {
        for (int j = 0; j < 64; ++j) {
          const uint8_t b = values[static_cast<size_t>(k * rb + (nibbles ? j % 32 : j))];
          const int nib = j < 32 ? b & 15 : b >> 4;
          double want;
          switch (f) {
            case QuantFormat::kInt8:
              want = static_cast<int8_t>(b);
              break;
            case QuantFormat::kFp8E4M3:
              want = e4m3(b);
              break;
            case QuantFormat::kInt4:
              want = nib - 8;
              break;
            default:
              want = e2m1(nib);
          }
          const float got = c[static_cast<size_t>(k * 64 + j)];
          const std::string what = std::string(set->name) + " " +
                                   std::string(quant_format_name(f)) + " code " +
                                   std::to_string(nibbles ? nib : b);
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << what;
          } else {
            EXPECT_EQ(got, want) << what;
          }
        }
      }
    }
  }
}

TEST(QuantizedRaggedDot, NativeEveryConfigMatchesTheReference) {
  std::mt19937_64 rng(fresh_seed());
  const std::vector<std::vector<int32_t>> groupings = {{0, 0, 0}, {1, 0, 0}, {3, 0, 9}, {0, 5, 1}};
  for (const Case& c : kCases) {
    for (int64_t k : ks_for(c)) {
      for (int64_t n : {1, 64, 130}) {
        const QuantizedTensor q = quantize(Tensor::randn({3, k, n}, DType::kBF16, rng()), c.format,
                                           c.group_size, c.asymmetric);
        for (const auto& sizes : groupings) {
          for (DType dt : {DType::kF32, DType::kBF16}) {
            const int64_t rows = 12;  // past the groups' rows: zeros
            const Tensor lhs = Tensor::randn({rows, k}, dt, rng());
            QuantizedRaggedDotOptions o;
            o.activation = sizes[0] == 3 ? Activation::kSilu : Activation::kNone;
            o.implementation = "reference";
            const Tensor want = ragged_dot(lhs, q, sizes, o);
            o.implementation = "native";
            for (const auto& cfg :
                 {std::optional<Config>{},
                  std::optional<Config>{Config::make(QuantizedRaggedDotNativeConfig{1, 2})},
                  std::optional<Config>{Config::make(QuantizedRaggedDotNativeConfig{3, 1})}}) {
              o.config = cfg;
              const Tensor got = ragged_dot(lhs, q, sizes, o);
              const double depth = std::sqrt(static_cast<double>(k));
              expect_close(got, op_test::values(want),
                           dt == DType::kBF16 ? Tolerance{1e-2, 5e-3 + 1.0 / 128, 0}
                                              : Tolerance{1e-4 * depth, 1e-4, 1e-4},
                           "native " + name_of(c, k, n) + " " + std::string(dtype_name(dt)));
            }
          }
        }
      }
    }
  }
}

TEST(QuantizedRaggedDot, EmptyAndZeroSizes) {
  const QuantizedTensor q =
      quantize(Tensor::randn({2, 32, 40}, DType::kF32, fresh_seed()), QuantFormat::kInt8);
  const Tensor none =
      ragged_dot(Tensor::zeros({0, 32}, DType::kF32), q, std::vector<int32_t>{0, 0});
  EXPECT_EQ(none.shape(), (Shape{0, 40}));
  // K = 0: every output zero.
  const QuantizedTensor empty = quantize(Tensor::zeros({2, 0, 5}, DType::kF32), QuantFormat::kInt8);
  const Tensor z =
      ragged_dot(Tensor::zeros({3, 0}, DType::kF32), empty, std::vector<int32_t>{1, 2});
  for (int64_t i = 0; i < z.size(); ++i) EXPECT_EQ(z.get(i), 0.0);
  // N = 0.
  const QuantizedTensor thin =
      quantize(Tensor::zeros({1, 8, 0}, DType::kF32), QuantFormat::kInt4, 8);
  EXPECT_EQ(ragged_dot(Tensor::zeros({2, 8}, DType::kF32), thin, std::vector<int32_t>{2}).shape(),
            (Shape{2, 0}));
}

TEST(QuantizedRaggedDot, BadInput) {
  const Tensor w = Tensor::randn({2, 64, 10}, DType::kF32, fresh_seed());
  expect_invalid_argument([&] { quantize(w, QuantFormat::kInt4, 48); },
                          "group_size = 48 for int4 with K = 64; expected a positive divisor");
  expect_invalid_argument([&] { quantize(w, QuantFormat::kMxfp4, 64); }, "32 (mxfp4's block)");
  expect_invalid_argument([&] { quantize(w, QuantFormat::kFp8E4M3, 32); }, "scales per channel");
  expect_invalid_argument([&] { quantize(w, QuantFormat::kInt8, 0, true); },
                          "only int4 has zero points");
  expect_invalid_argument([&] { quantize(Tensor::zeros({64}, DType::kF32), QuantFormat::kInt8); },
                          "w has spec f32[64]");
  Tensor nan = Tensor::zeros({1, 4, 4}, DType::kF32);
  nan.view().set(5, NAN);
  expect_invalid_argument([&] { quantize(nan, QuantFormat::kInt8); }, "holds nan at flat index 5");
  const QuantizedTensor q = quantize(w, QuantFormat::kInt4, 32, true);
  // from_parts: shapes, dtypes, zero points, scales.
  expect_invalid_argument(
      [&] {
        QuantizedTensor::from_parts(QuantFormat::kInt4, 2, 64, 10, 32,
                                    Tensor::zeros({2, 1, 64, 31}, DType::kU8), q.scales.clone(),
                                    clone_of(q.zeros));
      },
      "values has spec u8[2,1,64,31]; expected u8[2,1,64,32]");
  expect_invalid_argument(
      [&] {
        QuantizedTensor::from_parts(QuantFormat::kInt4, 2, 64, 10, 32, q.values.clone(),
                                    Tensor::zeros({2, 1, 2, 64}, DType::kBF16), clone_of(q.zeros));
      },
      "scales has spec bf16[2,1,2,64]; expected f32[2,1,2,64]");
  Tensor bad_zeros = q.zeros->clone();
  static_cast<uint8_t*>(bad_zeros.data())[3] = 16;
  expect_invalid_argument(
      [&] {
        QuantizedTensor::from_parts(QuantFormat::kInt4, 2, 64, 10, 32, q.values.clone(),
                                    q.scales.clone(), bad_zeros.clone());
      },
      "zeros[3] = 16; expected a zero point in [0, 15]");
  for (float s : {0.0f, -1.0f, NAN, INFINITY}) {
    Tensor scales = q.scales.clone();
    scales.data_as<float>()[7] = s;
    expect_invalid_argument(
        [&] {
          QuantizedTensor::from_parts(QuantFormat::kInt4, 2, 64, 10, 32, q.values.clone(),
                                      scales.clone(), clone_of(q.zeros));
        },
        "scales[7] =");
  }
  expect_invalid_argument(
      [&] {
        QuantizedTensor::from_parts(QuantFormat::kInt8, 2, 64, INT64_MAX, 0, q.values.clone(),
                                    q.scales.clone());
      },
      "expected sizes in [0, 2^40]");
  // The op: lhs, group sizes, arrays through the generic path.
  expect_invalid_argument(
      [&] {
        ragged_dot(Tensor::zeros({3, 63}, DType::kF32), q, std::vector<int32_t>{1, 2});
      },
      "lhs f32[3,63] has K = 63");
  expect_invalid_argument(
      [&] {
        ragged_dot(Tensor::zeros({3, 64}, DType::kF32), q, std::vector<int32_t>{1, 5});
      },
      "sum(group_sizes) = 6 exceeds the 3 rows");
  expect_invalid_argument(
      [&] {
        ragged_dot(Tensor::zeros({3, 64}, DType::kF32), q, std::vector<int32_t>{1, -1});
      },
      "group_sizes[1] = -1");
  expect_invalid_argument(
      [&] {
        ragged_dot(Tensor::zeros({3, 64}, DType::kI32), q, std::vector<int32_t>{1, 1});
      },
      "lhs has spec i32[3,64]");
  const OpFamily& fam = find_family("quantized_ragged_dot");
  expect_invalid_argument(
      [&] {
        fam.bind_json({{"lhs", "f32[4,64]"},
                       {"values", "u8[2,1,64,32]"},
                       {"scales", "f32[2,1,1,64]"},
                       {"group_sizes", {2, 2}},
                       {"format", "int4"},
                       {"n", 10},
                       {"group_size", 32}},
                      "native");
      },
      "scales has spec f32[2,1,1,64]; expected contiguous f32[2,1,2,64]");
  expect_invalid_argument(
      [&] {
        fam.bind_json({{"lhs", "f32[4,64]"},
                       {"values", "i8[2,1,64,64]"},
                       {"scales", "f32[2,1,1,64]"},
                       {"zeros", "u8[2,1,1,64]"},
                       {"group_sizes", {2, 2}},
                       {"format", "int8"},
                       {"n", 10}},
                      "native");
      },
      "only asymmetric int4 has zero points");
  expect_invalid_argument(
      [&] {
        fam.bind_json({{"lhs", "f32[4,64]"},
                       {"values", "i8[2,1,64,64]"},
                       {"scales", "f32[2,1,1,64]"},
                       {"group_sizes", {2, 2}},
                       {"format", "int8"},
                       {"n", INT64_MAX}},
                      "native");
      },
      "expected sizes in [0, 2^40]");
}

// GGUF blocks made here by hand from the format (f16 scale, then 32 int8 or 16 bytes of
// nibbles): each weight is d * q (Q4_0: q = nibble - 8), as GGUF dequantizes. (The Python tests
// check against the gguf package's own quantizer.)
TEST(QuantizedRaggedDot, GgufBlocksDequantizeAsWritten) {
  std::mt19937_64 rng(fresh_seed());
  const int64_t G = 2, K = 64, N = 3;
  for (const bool q8 : {true, false}) {
    const int64_t bs = q8 ? 34 : 18, nk = K / 32;
    Tensor blocks({G, N, nk * bs}, DType::kU8);
    auto* b = static_cast<uint8_t*>(blocks.data());
    std::vector<float> want(static_cast<size_t>(G * K * N));
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t j = 0; j < N; ++j) {
        for (int64_t blk = 0; blk < nk; ++blk) {
          uint8_t* block = b + (g * N + j) * nk * bs + blk * bs;
          const float d = std::ldexp(static_cast<float>(static_cast<int>(rng() % 64) - 32), -9);
          const uint16_t d16 = f32_to_f16(d);
          std::memcpy(block, &d16, 2);
          for (int64_t e = 0; e < 32; ++e) {
            int q;
            if (q8) {
              block[2 + e] = static_cast<uint8_t>(rng());
              q = static_cast<int8_t>(block[2 + e]);
            } else {
              const int nib = static_cast<int>(rng() % 16);
              uint8_t& byte = block[2 + e % 16];
              byte = e < 16 ? static_cast<uint8_t>((byte & 0xf0) | nib)
                            : static_cast<uint8_t>((byte & 0x0f) | (nib << 4));
              q = nib - 8;
            }
            want[static_cast<size_t>((g * K + blk * 32 + e) * N + j)] = d * static_cast<float>(q);
          }
        }
      }
    }
    const QuantizedTensor q = from_gguf(blocks, q8 ? "Q8_0" : "Q4_0", G, K, N);
    const Tensor d = dequantize(q);
    for (int64_t i = 0; i < d.size(); ++i)
      ASSERT_EQ(d.get(i), want[i]) << (q8 ? "Q8_0 " : "Q4_0 ") << i;
  }
  const Tensor blocks = Tensor::zeros({2, 3, 68}, DType::kU8);
  expect_invalid_argument([&] { from_gguf(blocks, "Q4_K", 2, 64, 3); }, "expected Q8_0 or Q4_0");
  expect_invalid_argument([&] { from_gguf(blocks, "Q8_0", 2, 48, 3); }, "K a multiple of 32");
  expect_invalid_argument([&] { from_gguf(blocks, "Q4_0", 2, 64, 3); },
                          "expected contiguous u8[2,3,36]");
  Tensor bad = Tensor::zeros({2, 3, 68}, DType::kU8);
  const uint16_t inf16 = 0x7c00;
  std::memcpy(static_cast<uint8_t*>(bad.data()) + 34, &inf16, 2);
  expect_invalid_argument([&] { from_gguf(bad, "Q8_0", 2, 64, 3); },
                          "the scale of block 1 of row 0 of expert 0 is inf");
}

// The generic path (what Python and torch call) gives what the typed function gives.
TEST(QuantizedRaggedDot, RunNamedMatchesTheTypedCall) {
  const QuantizedTensor q =
      quantize(Tensor::randn({2, 64, 70}, DType::kF32, fresh_seed()), QuantFormat::kMxfp4);
  const Tensor lhs = Tensor::randn({5, 64}, DType::kF32, fresh_seed());
  const std::vector<int32_t> sizes = {2, 3};
  const std::vector<Tensor> got =
      find_family("quantized_ragged_dot")
          .run_named(
              {{"lhs", lhs.view()}, {"values", q.values.view()}, {"scales", q.scales.view()}},
              Json{{"group_sizes", sizes}, {"format", "mxfp4"}, {"n", 70}, {"group_size", 32}}, {});
  const Tensor want = ragged_dot(lhs, q, sizes);
  ASSERT_EQ(got.size(), 1u);
  expect_close(got[0], op_test::values(want), {0, 0, 0}, "run_named");
}

}  // namespace
}  // namespace tokamax
