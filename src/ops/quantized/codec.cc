// quantize, dequantize and QuantizedTensor::from_parts: the formats' rounding rules and the
// panel layout's checks (tokamax/ops/quantized.h; docs/quantized.md).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "ops/elements.h"
#include "ops/quantized/base.h"
#include "tokamax/core/device.h"

namespace tokamax {

namespace {

using quant::kFamily;

// The non-negative values of a float format, by code (ascending), and the nearest code to |x|
// (ties to the even code), saturating at the largest.
template <size_t N>
uint8_t nearest_code(const std::array<float, N>& values, float a) {
  if (!(a < values[N - 1])) return static_cast<uint8_t>(N - 1);
  const auto hi = std::upper_bound(values.begin(), values.end(), a);
  const size_t up = static_cast<size_t>(hi - values.begin()), down = up - 1;
  const float dl = a - values[down], du = values[up] - a;
  if (dl < du) return static_cast<uint8_t>(down);
  if (du < dl) return static_cast<uint8_t>(up);
  return static_cast<uint8_t>(down % 2 == 0 ? down : up);
}

// The non-negative values of codes 0..N-1 of a float format, as its decoder reads them.
template <size_t N, float (*Decode)(uint8_t)>
const std::array<float, N>& code_values() {
  static const std::array<float, N> v = [] {
    std::array<float, N> t{};
    for (size_t c = 0; c < N; ++c) t[c] = Decode(static_cast<uint8_t>(c));
    return t;
  }();
  return v;
}

uint8_t encode_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  return static_cast<uint8_t>(
      nearest_code(code_values<127, kernels::decode_fp8_e4m3>(), std::fabs(x)) |
      (x < 0 ? 0x80 : 0));
}
uint8_t encode_e2m1(float x) {
  return static_cast<uint8_t>(nearest_code(code_values<8, kernels::decode_e2m1>(), std::fabs(x)) |
                              (x < 0 ? 8 : 0));
}

// Stores one value's code at (row byte offset, panel column) of a panel row.
void put(QuantFormat f, uint8_t* row, int64_t col, uint8_t code) {
  if (f == QuantFormat::kInt8 || f == QuantFormat::kFp8E4M3) {
    row[col] = code;
    return;
  }
  uint8_t& b = row[col % 32];
  b = col < 32 ? static_cast<uint8_t>((b & 0xf0) | code)
               : static_cast<uint8_t>((b & 0x0f) | (code << 4));
}

// A QuantizedTensor's description, without its arrays.
QuantizedTensor header(QuantFormat f, int64_t g, int64_t k, int64_t n, int64_t group_size,
                       bool asymmetric) {
  QuantizedTensor q;
  q.format = f;
  q.groups = g;
  q.k = k;
  q.n = n;
  q.group_size = quant::effective_group_size(f, k, group_size);
  q.asymmetric = asymmetric;
  return q;
}

}  // namespace

int64_t QuantizedTensor::bytes() const {
  return values.size() * static_cast<int64_t>(dtype_size(values.dtype())) +
         scales.size() * static_cast<int64_t>(dtype_size(scales.dtype())) +
         (zeros ? zeros->size() : 0);
}

QuantizedTensor quantize(const TensorView& w, QuantFormat f, int64_t group_size, bool asymmetric) {
  const char* op = "quantize";
  if ((w.rank() != 2 && w.rank() != 3) || (w.dtype() != DType::kF32 && w.dtype() != DType::kBF16) ||
      !w.is_contiguous()) {
    throw InvalidArgument(fmt::format(
        "quantize: w has spec {}; expected a contiguous f32 or bf16 [G, K, N] or [K, N]",
        w.spec().str()));
  }
  if (asymmetric && f != QuantFormat::kInt4) {
    throw InvalidArgument(fmt::format(
        "quantize: asymmetric = true for {}; only int4 has zero points", quant_format_name(f)));
  }
  const int64_t G = w.rank() == 3 ? w.dim(0) : 1, K = w.dim(w.rank() - 2), N = w.dim(w.rank() - 1);
  quant::check_group_size(f, K, group_size, op);
  for (int64_t i = 0; i < w.size(); ++i) {
    const float v = load_f32(w, i);
    if (!std::isfinite(v)) {
      throw InvalidArgument(
          fmt::format("quantize: w {} holds {} at flat index {}; expected "
                      "finite weights",
                      w.spec().str(), v, i));
    }
  }
  QuantizedTensor q = header(f, G, K, N, group_size, asymmetric);
  const ShapeDtype vs = quant::values_spec(f, G, K, N),
                   ss = quant::scales_spec(f, G, K, N, group_size);
  q.values = Tensor(vs.shape, vs.dtype);
  q.scales = Tensor(ss.shape, ss.dtype);
  std::fill_n(static_cast<uint8_t*>(q.values.data()), q.values.size(), 0);
  if (asymmetric) {
    q.zeros = Tensor(ss.shape, DType::kU8);
    std::fill_n(static_cast<uint8_t*>(q.zeros->data()), q.zeros->size(), 0);
  }
  const int64_t P = vs.shape[1], rb = vs.shape[3], gs = q.group_size;
  const int64_t ngroups = gs > 0 ? K / gs : 0;
  // One (group, panel, k-group) per task: its 64 columns' scales, then their codes.
  parallel_for(G * P * ngroups, num_threads(), [&](int64_t task, int) {
    const int64_t kg = task % ngroups, gp = task / ngroups, g = gp / P, p = gp % P;
    const int64_t srow = gp * ngroups + kg;
    for (int64_t col = 0; col < kQuantPanel; ++col) {
      const int64_t j = p * kQuantPanel + col;
      const int64_t s_at = srow * kQuantPanel + col;
      auto wv = [&](int64_t kk) { return j < N ? load_f32(w, (g * K + kk) * N + j) : 0.0f; };
      float lo = 0, hi = 0, amax = 0;
      for (int64_t kk = kg * gs; kk < (kg + 1) * gs; ++kk) {
        const float v = wv(kk);
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        amax = std::max(amax, std::fabs(v));
      }
      float scale = 1, zero = 0;
      int e8m0 = 127;
      switch (f) {
        case QuantFormat::kInt8:
          scale = amax / 127;
          break;
        case QuantFormat::kInt4:
          scale = asymmetric ? (hi - lo) / 15 : amax / 7;
          break;
        case QuantFormat::kFp8E4M3:
          scale = amax / 448;
          break;
        case QuantFormat::kMxfp4:
          // OCP MX: the shared exponent is floor(log2(amax)) - 2 (e2m1's largest exponent), so
          // the largest magnitude lands in [4, 8) and saturates at 6 above it.
          if (amax > 0)
            e8m0 = std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
          scale = std::ldexp(1.0f, e8m0 - 127);
          break;
      }
      if (!(scale > 0) || !std::isfinite(scale)) scale = 1;  // an all-zero (or tiny) group
      if (f == QuantFormat::kMxfp4) {
        static_cast<uint8_t*>(q.scales.data())[s_at] = static_cast<uint8_t>(e8m0);
      } else {
        static_cast<float*>(q.scales.data())[s_at] = scale;
      }
      if (asymmetric) {
        zero = std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f);
        static_cast<uint8_t*>(q.zeros->data())[s_at] = static_cast<uint8_t>(zero);
      }
      for (int64_t kk = kg * gs; kk < (kg + 1) * gs; ++kk) {
        uint8_t* row = static_cast<uint8_t*>(q.values.data()) + (gp * K + kk) * rb;
        const float x = wv(kk) / scale;
        uint8_t code = 0;
        switch (f) {
          case QuantFormat::kInt8:
            code = static_cast<uint8_t>(
                static_cast<int8_t>(std::clamp(std::nearbyint(x), -127.0f, 127.0f)));
            break;
          case QuantFormat::kInt4:
            code =
                static_cast<uint8_t>(asymmetric ? std::clamp(std::nearbyint(x) + zero, 0.0f, 15.0f)
                                                : std::clamp(std::nearbyint(x), -8.0f, 7.0f) + 8);
            break;
          case QuantFormat::kFp8E4M3:
            code = encode_e4m3(x);
            break;
          case QuantFormat::kMxfp4:
            code = encode_e2m1(x);
            break;
        }
        put(f, row, col, code);
      }
    }
  });
  return q;
}

Tensor dequantize(const QuantizedTensor& q) {
  Tensor out({q.groups, q.k, q.n}, DType::kF32);
  const int64_t P = (q.n + kQuantPanel - 1) / kQuantPanel;
  const uint8_t* zeros = q.zeros ? static_cast<const uint8_t*>(q.zeros->data()) : nullptr;
  parallel_for(q.groups * q.k, num_threads(), [&](int64_t gk, int) {
    const int64_t g = gk / q.k, kk = gk % q.k;
    for (int64_t j = 0; j < q.n; ++j) {
      out.data_as<float>()[gk * q.n + j] = quant::weight_at(
          q.format, q.values.data(), q.scales.data(), zeros, P, q.k, q.group_size, g, kk, j);
    }
  });
  return out;
}

QuantizedTensor QuantizedTensor::from_parts(QuantFormat f, int64_t groups, int64_t k, int64_t n,
                                            int64_t group_size, Tensor values, Tensor scales,
                                            std::optional<Tensor> zeros) {
  const char* op = "QuantizedTensor::from_parts";
  quant::check_sizes(groups, k, n, op);
  quant::check_group_size(f, k, group_size, op);
  auto check = [&](const Tensor& t, const char* name, const ShapeDtype& want) {
    if (t.spec() != want) {
      throw InvalidArgument(fmt::format(
          "{}: {} has spec {}; expected {} ({} [{}, {}, {}], {} "
          "columns per panel)",
          op, name, t.spec().str(), want.str(), quant_format_name(f), groups, k, n, kQuantPanel));
    }
  };
  check(values, "values", quant::values_spec(f, groups, k, n));
  const ShapeDtype ss = quant::scales_spec(f, groups, k, n, group_size);
  check(scales, "scales", ss);
  if (zeros) {
    if (f != QuantFormat::kInt4)
      throw InvalidArgument(fmt::format("{}: zeros given for {}; only int4 has zero points", op,
                                        quant_format_name(f)));
    check(*zeros, "zeros", {ss.shape, DType::kU8});
    const auto* z = static_cast<const uint8_t*>(zeros->data());
    for (int64_t i = 0; i < zeros->size(); ++i) {
      if (z[i] > 15)
        throw InvalidArgument(
            fmt::format("{}: zeros[{}] = {}; expected a zero point in [0, 15]", op, i, z[i]));
    }
  }
  for (int64_t i = 0; i < scales.size(); ++i) {
    if (f == QuantFormat::kMxfp4) {
      if (static_cast<const uint8_t*>(scales.data())[i] == 255)
        throw InvalidArgument(
            fmt::format("{}: scales[{}] is e8m0 255 (NaN); expected 0..254", op, i));
      continue;
    }
    const float s = scales.data_as<float>()[i];
    if (!(s > 0) || !std::isfinite(s)) {
      throw InvalidArgument(
          fmt::format("{}: scales[{}] = {}; expected a positive finite scale", op, i, s));
    }
  }
  QuantizedTensor q = header(f, groups, k, n, group_size, zeros.has_value());
  q.values = std::move(values);
  q.scales = std::move(scales);
  q.zeros = std::move(zeros);
  return q;
}

QuantizedTensor from_gguf(const TensorView& blocks, std::string_view type, int64_t groups,
                          int64_t k, int64_t n) {
  const char* op = "from_gguf";
  const bool q8 = type == "Q8_0";
  if (!q8 && type != "Q4_0") {
    throw InvalidArgument(fmt::format("{}: type '{}'; expected Q8_0 or Q4_0", op, type));
  }
  quant::check_sizes(groups, k, n, op);
  if (k % 32 != 0) {
    throw InvalidArgument(fmt::format(
        "{}: [G, K, N] = [{}, {}, {}]; expected sizes >= 0 and K a multiple of 32 (the block)", op,
        groups, k, n));
  }
  const int64_t block_bytes = q8 ? 34 : 18, row_bytes = k / 32 * block_bytes;
  const ShapeDtype want = blocks.rank() == 2 && groups == 1
                              ? ShapeDtype{{n, row_bytes}, DType::kU8}
                              : ShapeDtype{{groups, n, row_bytes}, DType::kU8};
  if (blocks.spec() != want || !blocks.is_contiguous()) {
    throw InvalidArgument(
        fmt::format("{}: blocks {} for {} [G, K, N] = [{}, {}, {}]; expected "
                    "contiguous {} ({} blocks of {} bytes per row of K)",
                    op, blocks.spec().str(), type, groups, k, n, want.str(), k / 32, block_bytes));
  }
  const QuantFormat f = q8 ? QuantFormat::kInt8 : QuantFormat::kInt4;
  QuantizedTensor q = header(f, groups, k, n, 32, false);
  const ShapeDtype vs = quant::values_spec(f, groups, k, n),
                   ss = quant::scales_spec(f, groups, k, n, 32);
  q.values = Tensor(vs.shape, vs.dtype);
  q.scales = Tensor(ss.shape, ss.dtype);
  auto* values = static_cast<uint8_t*>(q.values.data());
  auto* scales = q.scales.data_as<float>();
  std::fill_n(values, q.values.size(), q8 ? 0 : 0x88);  // padding columns: value 0
  std::fill_n(scales, q.scales.size(), 1.0f);
  const auto* in = static_cast<const uint8_t*>(blocks.data());
  const int64_t P = vs.shape[1], rb = vs.shape[3], nk = k / 32;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = j / kQuantPanel, col = j % kQuantPanel, gp = g * P + p;
      for (int64_t b = 0; b < nk; ++b) {
        const uint8_t* block = in + (g * n + j) * row_bytes + b * block_bytes;
        uint16_t d16;
        std::memcpy(&d16, block, 2);
        const float d = f16_to_f32(d16);
        if (!std::isfinite(d)) {
          throw InvalidArgument(
              fmt::format("{}: the scale of block {} of row {} of expert {} is {}; "
                          "expected a finite f16",
                          op, b, j, g, d));
        }
        scales[(gp * nk + b) * kQuantPanel + col] = d;
        for (int64_t e = 0; e < 32; ++e) {
          uint8_t code;
          if (q8) {
            code = block[2 + e];
          } else {  // element e < 16: low nibble of byte e; e >= 16: high nibble of byte e - 16
            code = e < 16 ? block[2 + e] & 15 : block[2 + e - 16] >> 4;
          }
          put(f, values + (gp * k + b * 32 + e) * rb, col, code);
        }
      }
    }
  }
  return q;
}

Tensor ragged_dot(const TensorView& lhs, const QuantizedTensor& rhs,
                  std::span<const int32_t> group_sizes, const QuantizedRaggedDotOptions& o) {
  quant::QCall c;
  c.lhs = lhs;
  c.values = rhs.values.view();
  c.scales = rhs.scales.view();
  if (rhs.zeros) c.zeros = rhs.zeros->view();
  c.group_sizes.assign(group_sizes.begin(), group_sizes.end());
  c.format = rhs.format;
  c.n = rhs.n;
  c.group_size = rhs.group_size;
  c.activation = o.activation;
  c.num_threads = 0;
  if (lhs.rank() == 2 && lhs.dim(1) != rhs.k) {
    throw InvalidArgument(fmt::format("{}: lhs {} has K = {} but the weights are [{}, {}, {}]",
                                      kFamily, lhs.spec().str(), lhs.dim(1), rhs.groups, rhs.k,
                                      rhs.n));
  }
  if (static_cast<int64_t>(group_sizes.size()) != rhs.groups) {
    throw InvalidArgument(fmt::format("{}: group_sizes has length {} but the weights have G = {}",
                                      kFamily, group_sizes.size(), rhs.groups));
  }
  return std::move(quant::family().run(c, CallOptions{o.implementation, o.config}).at(0));
}

}  // namespace tokamax
