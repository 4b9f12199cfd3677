// The quantized streaming kernel (qstream.h) written once over GCC vector extensions of W
// floats; each ISA file defines TOKAMAX_QSTREAM_WIDTH (W) and includes this with its own
// compiler flags (as norm_impl.h). Include it only from those files.
//
// Registers: a panel row is V = 64 / W vectors; the group's partial sums are MR x V vectors
// (16 zmm at AVX-512 with MR 4), the decoded row V more. They are summed in f32 over the group
// and scaled once per group into c, which stays in L1.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/prefetch.h"
#include "kernels/qstream.h"

namespace tokamax::kernels {
namespace {

#ifndef TOKAMAX_QSTREAM_WIDTH
#error "define TOKAMAX_QSTREAM_WIDTH (floats per vector) before including qstream_impl.h"
#endif

struct QStream {
  static constexpr int W = TOKAMAX_QSTREAM_WIDTH;
  static constexpr int V = kQPanel / W;
  typedef float vf __attribute__((vector_size(TOKAMAX_QSTREAM_WIDTH * 4)));
  typedef int32_t vi __attribute__((vector_size(TOKAMAX_QSTREAM_WIDTH * 4)));

  static vf as_float(vi x) {
    vf f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }
  // Optional per ISA: TOKAMAX_QSTREAM_LOOKUP(table, idx), lane i = table[idx[i] mod W] (a
  // variable permute: vpermps), for the 4-bit formats' tables at widths 16 and 8. (A macro with
  // the ISA's intrinsic: GCC's __builtin_shuffle is not in clang, which builds the sanitizers.)
  // W bytes widened to W int32 lanes (zero- or sign-extended). GCC scalarizes a byte vector's
  // __builtin_convertvector (a cvtsi2ss per lane), so an ISA file gives its widening
  // instruction: TOKAMAX_QSTREAM_WIDEN_U8(p) and TOKAMAX_QSTREAM_WIDEN_I8(p), returning vi.
  static vi bytes_u(const uint8_t* p) {
#ifdef TOKAMAX_QSTREAM_WIDEN_U8
    return (vi)TOKAMAX_QSTREAM_WIDEN_U8(p);
#else
    vi x;
    for (int i = 0; i < W; ++i) x[i] = p[i];
    return x;
#endif
  }
  static vi bytes_s(const uint8_t* p) {
#ifdef TOKAMAX_QSTREAM_WIDEN_I8
    return (vi)TOKAMAX_QSTREAM_WIDEN_I8(p);
#else
    vi x;
    for (int i = 0; i < W; ++i) x[i] = static_cast<int8_t>(p[i]);
    return x;
#endif
  }

  // e4m3fn bytes to f32: the magnitude's bits moved into an f32's exponent and mantissa and
  // re-biased (normal), the subnormals as m * 2^-9, 0x7f as NaN, the sign bit put back.
  static vf fp8(vi x) {
    const vi mag = x & 0x7f;
    const vi normal = (mag << 20) + (120 << 23);
    const vf sub = __builtin_convertvector(mag, vf) * (1.0f / 512);
    vi bits = mag < 8 ? reinterpret(sub) : normal;
    bits = mag == 0x7f ? vi{} + 0x7fc00000 : bits;
    return as_float(bits | ((x & 0x80) << 24));
  }
#ifdef TOKAMAX_QSTREAM_F16_TO_F32
  // Where the ISA converts f16 (F16C, AVX-512): e4m3 bytes become f16 bits by moving the sign
  // to bit 15 and the magnitude to bits 7..13 (both formats' subnormals line up), worth the e4m3
  // value times 2^-8 (the caller's scale carries the 2^8), in 16-bit lanes; 0x7f is NaN.
  static constexpr float kFp8Scale = 256.0f;
  typedef uint16_t vh __attribute__((vector_size(TOKAMAX_QSTREAM_WIDTH * 2)));
  static vf fp8_row(const uint8_t* p) {
    const vh w = (vh)TOKAMAX_QSTREAM_WIDEN_U8_U16(p);
    const vh mag = w & 0x7f;
    vh h = ((w & 0x80) << 8) | (mag << 7);
    h = mag == 0x7f ? vh{} + 0x7e00 : h;
    return (vf)TOKAMAX_QSTREAM_F16_TO_F32(h);
  }
#else
  static constexpr float kFp8Scale = 1.0f;
  static vf fp8_row(const uint8_t* p) { return fp8(bytes_u(p)); }
#endif

  // e2m1 nibbles to f32: exponent e (bias 1) and mantissa m; e == 0 is m * 0.5.
  static vf e2m1(vi n) {
    // A table lookup where a vector holds it (vpermps: one instruction for 16 or 8 lanes).
#if defined(TOKAMAX_QSTREAM_LOOKUP) && TOKAMAX_QSTREAM_WIDTH == 16
    const vf table = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return (vf)TOKAMAX_QSTREAM_LOOKUP(table, n);
#elif defined(TOKAMAX_QSTREAM_LOOKUP) && TOKAMAX_QSTREAM_WIDTH == 8
    const vf table = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return as_float(reinterpret((vf)TOKAMAX_QSTREAM_LOOKUP(table, n & 7)) | ((n & 8) << 28));
#endif
    const vi mag = n & 7, e = mag >> 1, m = mag & 1;
    const vi normal = ((e + 126) << 23) | (m << 22);
    const vi half = m * 0x3f000000;  // 0.5f or +0
    return as_float((e == 0 ? half : normal) | ((n & 8) << 28));
  }
  static vi reinterpret(vf f) {
    vi x;
    std::memcpy(&x, &f, sizeof x);
    return x;
  }
  // e8m0 bytes (2^(e - 127); 255 is NaN) to f32.
  static vf e8m0(vi e) {
    vi bits = e == 0 ? vi{} + 0x00400000 : e << 23;
    bits = e == 255 ? vi{} + 0x7fc00000 : bits;
    return as_float(bits);
  }

  // Row k's V vectors of values (before scale).
  template <QFormat F>
  static void decode_row(const uint8_t* row, [[maybe_unused]] const vi* zero,
                         [[maybe_unused]] const vf* zerof, vf* w) {
    if constexpr (F == QFormat::kInt8) {
      for (int v = 0; v < V; ++v) w[v] = __builtin_convertvector(bytes_s(row + v * W), vf);
    } else if constexpr (F == QFormat::kFp8E4M3) {
      for (int v = 0; v < V; ++v) w[v] = fp8_row(row + v * W);
    } else {
      // Byte b holds column b (low nibble) and column b + 32 (high).
      for (int v = 0; v < V / 2; ++v) {
        const vi x = bytes_u(row + v * W);
        if constexpr (F == QFormat::kInt4) {
#if defined(TOKAMAX_QSTREAM_LOOKUP) && TOKAMAX_QSTREAM_WIDTH == 16
          // A nibble's float by table (vpermps reads the index's low 4 bits: no mask), then the
          // zero point off in f32 (exact: small integers).
          const vf table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
          w[v] = (vf)TOKAMAX_QSTREAM_LOOKUP(table, x) - zerof[v];
          w[v + V / 2] = (vf)TOKAMAX_QSTREAM_LOOKUP(table, x >> 4) - zerof[v + V / 2];
#else
          // The zero point taken off each value, in the integers (exact). Taking z * sum(a) off
          // once per group instead cancels: 1.3e-5 normwise error at K = 32 against 1e-5.
          w[v] = __builtin_convertvector((x & 15) - zero[v], vf);
          w[v + V / 2] = __builtin_convertvector((x >> 4) - zero[v + V / 2], vf);
#endif
        } else {
          w[v] = e2m1(x & 15);
          w[v + V / 2] = e2m1(x >> 4);
        }
      }
    }
  }

  template <int MR, QFormat F>
  static void run(int64_t K, int64_t gs, const float* a, int64_t lda, const uint8_t* values,
                  const void* scales, const uint8_t* zeros, float* c, int64_t ldc) {
    constexpr int64_t row_bytes = qrow_bytes(F);
    for (int i = 0; i < MR; ++i) std::memset(c + i * ldc, 0, kQPanel * sizeof(float));
    const int64_t ngroups = gs > 0 ? K / gs : 0;
    for (int64_t kg = 0; kg < ngroups; ++kg) {
      vi zero[V];
      vf zerof[V];
      if constexpr (F == QFormat::kInt4) {
        for (int v = 0; v < V; ++v) {
          zero[v] = zeros ? bytes_u(zeros + kg * kQPanel + v * W) : vi{} + 8;
          zerof[v] = __builtin_convertvector(zero[v], vf);
        }
      }
      vf acc[MR][V];
      for (int i = 0; i < MR; ++i)
        for (int v = 0; v < V; ++v) acc[i][v] = vf{};
      const uint8_t* row = values + kg * gs * row_bytes;
      for (int64_t k = kg * gs; k < (kg + 1) * gs; ++k, row += row_bytes) {
        vf w[V];
        decode_row<F>(row, zero, zerof, w);
        for (int i = 0; i < MR; ++i) {
          const float ai = a[i * lda + k];
          const vf x = vf{} + ai;
          for (int v = 0; v < V; ++v) acc[i][v] += x * w[v];
        }
      }
      vf s[V];
      for (int v = 0; v < V; ++v) {
        if constexpr (F == QFormat::kMxfp4) {
          s[v] = e8m0(bytes_u(static_cast<const uint8_t*>(scales) + kg * kQPanel + v * W));
        } else {
          std::memcpy(&s[v], static_cast<const float*>(scales) + kg * kQPanel + v * W, sizeof(vf));
          if constexpr (F == QFormat::kFp8E4M3) s[v] *= kFp8Scale;
        }
      }
      for (int i = 0; i < MR; ++i) {
        for (int v = 0; v < V; ++v) {
          vf cv;
          std::memcpy(&cv, c + i * ldc + v * W, sizeof cv);
          cv += acc[i][v] * s[v];
          std::memcpy(c + i * ldc + v * W, &cv, sizeof cv);
        }
      }
    }
  }

  template <QFormat F>
  static void run_rows(int mr, int64_t K, int64_t gs, const float* a, int64_t lda,
                       const uint8_t* values, const void* scales, const uint8_t* zeros, float* c,
                       int64_t ldc) {
    with_tile_rows<kQMaxMr>(
        mr, [&]<int MR>() { run<MR, F>(K, gs, a, lda, values, scales, zeros, c, ldc); });
  }

  static void kernel(QFormat f, int mr, int64_t K, int64_t gs, const float* a, int64_t lda,
                     const uint8_t* values, const void* scales, const uint8_t* zeros, float* c,
                     int64_t ldc) {
    if (mr <= 0) return;
    switch (f) {
      case QFormat::kInt8:
        return run_rows<QFormat::kInt8>(mr, K, gs, a, lda, values, scales, zeros, c, ldc);
      case QFormat::kInt4:
        return run_rows<QFormat::kInt4>(mr, K, gs, a, lda, values, scales, zeros, c, ldc);
      case QFormat::kFp8E4M3:
        return run_rows<QFormat::kFp8E4M3>(mr, K, gs, a, lda, values, scales, zeros, c, ldc);
      case QFormat::kMxfp4:
        return run_rows<QFormat::kMxfp4>(mr, K, gs, a, lda, values, scales, zeros, c, ldc);
    }
  }
};

}  // namespace
}  // namespace tokamax::kernels
