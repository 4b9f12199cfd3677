// The norm row kernels (norm.h) written once over GCC vector extensions of W floats; each ISA
// file defines TOKAMAX_NORM_WIDTH (W) and includes this with its own compiler flags, so one
// source serves every ISA. (A macro, not a template parameter: GCC 12 does not treat a
// vector_size that depends on a template parameter as a vector in __builtin_convertvector.)
// Include it only from those files (the functions live in an unnamed namespace).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/norm.h"
#include "kernels/prefetch.h"

namespace tokamax::kernels {
namespace {

#ifndef TOKAMAX_NORM_WIDTH
#error "define TOKAMAX_NORM_WIDTH (floats per vector) before including norm_impl.h"
#endif
// Optional, per ISA (both or neither, with <immintrin.h>): TOKAMAX_NORM_STREAM_F32(float* p,
// vf v) and TOKAMAX_NORM_STREAM_BF16(uint16_t* p, vh h), non-temporal stores of one vector to an
// address aligned to its size. Without them `stream` rows are written with ordinary stores.
#if defined(TOKAMAX_NORM_STREAM_F32) != defined(TOKAMAX_NORM_STREAM_BF16)
#error "define both TOKAMAX_NORM_STREAM_F32 and TOKAMAX_NORM_STREAM_BF16, or neither"
#endif

struct NormRows {
  static constexpr int W = TOKAMAX_NORM_WIDTH;
  typedef float vf __attribute__((vector_size(TOKAMAX_NORM_WIDTH * 4)));
  typedef double vd __attribute__((vector_size(TOKAMAX_NORM_WIDTH * 8)));
  typedef uint32_t vu __attribute__((vector_size(TOKAMAX_NORM_WIDTH * 4)));
  typedef uint16_t vh __attribute__((vector_size(TOKAMAX_NORM_WIDTH * 2)));

  static float lane_f32(const void* x, bool bf16, int64_t i) {
    if (!bf16) return static_cast<const float*>(x)[i];
    const uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static void put_f32(void* y, bool bf16, int64_t i, float v) {
    if (!bf16) {
      static_cast<float*>(y)[i] = v;
      return;
    }
    uint32_t u;
    std::memcpy(&u, &v, 4);
    uint16_t h = (u & 0x7fffffffu) > 0x7f800000u
                     ? static_cast<uint16_t>((u >> 16) | 0x40)
                     : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    static_cast<uint16_t*>(y)[i] = h;
  }
  static vf load(const void* x, bool bf16, int64_t i) {
    vf v;
    if (!bf16) {
      std::memcpy(&v, static_cast<const float*>(x) + i, sizeof v);
      return v;
    }
    vh h;
    std::memcpy(&h, static_cast<const uint16_t*>(x) + i, sizeof h);
    const vu u = __builtin_convertvector(h, vu) << 16;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  static vf load_f32(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store_f32(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
  // Rounded to nearest even, as f32_to_bf16 (NaN stays a quiet NaN).
  static vh to_bf16(vf v) {
    vu u;
    std::memcpy(&u, &v, sizeof u);
    const vu rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const vu r = (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded;
    return __builtin_convertvector(r, vh);
  }
  static void store(void* y, bool bf16, int64_t i, vf v) {
    if (!bf16) {
      std::memcpy(static_cast<float*>(y) + i, &v, sizeof v);
      return;
    }
    const vh h = to_bf16(v);
    std::memcpy(static_cast<uint16_t*>(y) + i, &h, sizeof h);
  }
  // Non-temporal stores where the ISA file defines them: the line goes to memory without
  // being read first (an ordinary store reads it for ownership: a third of a copy's traffic).
#ifdef TOKAMAX_NORM_STREAM_F32
  static bool can_stream(const void* y, bool bf16) {
    return reinterpret_cast<uintptr_t>(y) % (bf16 ? sizeof(vh) : sizeof(vf)) == 0;
  }
  static void store_nt(void* y, bool bf16, int64_t i, vf v) {
    if (bf16)
      TOKAMAX_NORM_STREAM_BF16(static_cast<uint16_t*>(y) + i, to_bf16(v));
    else
      TOKAMAX_NORM_STREAM_F32(static_cast<float*>(y) + i, v);
  }
  static void fence() { _mm_sfence(); }
#else
  static bool can_stream(const void*, bool) { return false; }
  static void store_nt(void* y, bool bf16, int64_t i, vf v) { store(y, bf16, i, v); }
  static void fence() {}
#endif
  // Writes the vectors of a row, non-temporally when `stream` (and y allows it).
  template <class F>
  static int64_t write_row(void* y, bool bf16, int64_t n, bool stream, F&& value_at) {
    int64_t i = 0;
    if (stream && can_stream(y, bf16)) {
      for (; i + W <= n; i += W) store_nt(y, bf16, i, value_at(i));
    } else {
      for (; i + W <= n; i += W) store(y, bf16, i, value_at(i));
    }
    return i;
  }
  template <class T>
  static double hsum(const T& v) {
    double s = 0;
    for (int l = 0; l < W; ++l) s += v[l];
    return s;
  }

  static void stats(const void* x, bool bf16, int64_t n, bool subtract_mean, float eps, float* mean,
                    float* rstd) {
    const double k = subtract_mean && n > 0 ? lane_f32(x, bf16, 0) : 0.0;
    // Blocks of up to 64 vectors summed in f32 lanes (32 shifted values per lane: no
    // cancellation, about 2e-6 relative rounding), each block's sums added into f64 lanes.
    vd s1 = {}, s2 = {};
    int64_t i = 0;
    const float kf = static_cast<float>(k);
    for (; i + 4 * W <= n;) {
      vf a1 = {}, a2 = {}, b1 = {}, b2 = {};
      const int64_t end = std::min<int64_t>(n - 4 * W + 1, i + 64 * W);
      for (; i < end; i += 4 * W) {
        const vf a = load(x, bf16, i) - kf, b = load(x, bf16, i + W);
        const vf cc = load(x, bf16, i + 2 * W) - kf, dd = load(x, bf16, i + 3 * W) - kf;
        const vf bb = b - kf;
        a1 += a + cc;
        a2 += a * a + cc * cc;
        b1 += bb + dd;
        b2 += bb * bb + dd * dd;
      }
      s1 += __builtin_convertvector(a1 + b1, vd);
      s2 += __builtin_convertvector(a2 + b2, vd);
    }
    for (; i + W <= n; i += W) {
      const vf a = load(x, bf16, i) - kf;
      s1 += __builtin_convertvector(a, vd);
      s2 += __builtin_convertvector(a * a, vd);
    }
    double t1 = hsum(s1), t2 = hsum(s2);
    for (; i < n; ++i) {
      const double d = lane_f32(x, bf16, i) - k;
      t1 += d;
      t2 += d * d;
    }
    double var = 0, m = 0;
    if (n > 0) {
      m = t1 / static_cast<double>(n);
      var = t2 / static_cast<double>(n) - (subtract_mean ? m * m : 0.0);
    }
    var = var < 0 ? 0 : var;  // rounding below 0 clamped; NaN kept (a NaN in the row)
    *mean = subtract_mean ? static_cast<float>(k + m) : 0.0f;
    *rstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  }

  static void apply(const void* x, bool bf16, int64_t n, float mean, float rstd, const float* scale,
                    const float* offset, void* y, bool stream) {
    int64_t i = write_row(y, bf16, n, stream, [&](int64_t j) {
      vf v = (load(x, bf16, j) - mean) * rstd;
      if (scale) v *= load_f32(scale + j);
      if (offset) v += load_f32(offset + j);
      return v;
    });
    for (; i < n; ++i) {
      float v = (lane_f32(x, bf16, i) - mean) * rstd;
      if (scale) v *= scale[i];
      if (offset) v += offset[i];
      put_f32(y, bf16, i, v);
    }
  }

  static void backward(const void* x, const void* dy, bool bf16, int64_t n, float mean, float rstd,
                       const float* scale, bool subtract_mean, void* dx, float* dscale_acc,
                       float* doffset_acc, const void* x_next, const void* dy_next, bool stream) {
    vf sg = {}, sgx = {};
    int64_t i = 0;
    for (; i + W <= n; i += W) {
      const vf xh = (load(x, bf16, i) - mean) * rstd, d = load(dy, bf16, i);
      const vf g = scale ? d * load_f32(scale + i) : d;
      sg += g;
      sgx += g * xh;
      if (dscale_acc) store_f32(dscale_acc + i, load_f32(dscale_acc + i) + d * xh);
      if (doffset_acc) store_f32(doffset_acc + i, load_f32(doffset_acc + i) + d);
    }
    float tg = static_cast<float>(hsum(sg)), tgx = static_cast<float>(hsum(sgx));
    for (int64_t j = i; j < n; ++j) {
      const float xh = (lane_f32(x, bf16, j) - mean) * rstd, d = lane_f32(dy, bf16, j);
      const float g = scale ? d * scale[j] : d;
      tg += g;
      tgx += g * xh;
      if (dscale_acc) dscale_acc[j] += d * xh;
      if (doffset_acc) doffset_acc[j] += d;
    }
    const float inv_n = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    const float a = subtract_mean ? tg * inv_n : 0.0f, b = tgx * inv_n;
    const int64_t es = bf16 ? 2 : 4;
    i = write_row(dx, bf16, n, stream, [&](int64_t j) {
      if (x_next) {  // into L2
        prefetch_t1(static_cast<const char*>(x_next) + j * es);
        prefetch_t1(static_cast<const char*>(dy_next) + j * es);
      }
      const vf xh = (load(x, bf16, j) - mean) * rstd, d = load(dy, bf16, j);
      const vf g = scale ? d * load_f32(scale + j) : d;
      return (g - a - xh * b) * rstd;
    });
    for (; i < n; ++i) {
      const float xh = (lane_f32(x, bf16, i) - mean) * rstd, d = lane_f32(dy, bf16, i);
      const float g = scale ? d * scale[i] : d;
      put_f32(dx, bf16, i, (g - a - xh * b) * rstd);
    }
  }

  static void add(const void* a, const void* b, bool bf16, int64_t n, void* sum) {
    int64_t i = 0;
    for (; i + W <= n; i += W) store(sum, bf16, i, load(a, bf16, i) + load(b, bf16, i));
    for (; i < n; ++i) put_f32(sum, bf16, i, lane_f32(a, bf16, i) + lane_f32(b, bf16, i));
  }

  static NormKernels kernels() { return {stats, apply, backward, fence, add}; }
};

}  // namespace
}  // namespace tokamax::kernels
