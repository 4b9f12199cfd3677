// The out-features-first decode kernel (dotrows.h) written once over GCC vector extensions of
// W floats; each ISA file defines TOKAMAX_DOTROWS_WIDTH (W), TOKAMAX_DOTROWS_UNROLL (partial
// sums a row: kDotMaxRows x unroll accumulators must fit the register file)
// and optionally TOKAMAX_DOTROWS_BF16(p) (W bf16 values zero-extended to int32 lanes by the
// ISA's instruction), then includes this with its own compiler flags. Include it only from
// those files.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/dotrows.h"

namespace tokamax::kernels {
namespace {

#if !defined(TOKAMAX_DOTROWS_WIDTH) || !defined(TOKAMAX_DOTROWS_UNROLL)
#error "define TOKAMAX_DOTROWS_WIDTH and TOKAMAX_DOTROWS_UNROLL before including dotrows_impl.h"
#endif

struct DotRows {
  static constexpr int W = TOKAMAX_DOTROWS_WIDTH;
  static constexpr int U = TOKAMAX_DOTROWS_UNROLL;
  typedef float vf __attribute__((vector_size(TOKAMAX_DOTROWS_WIDTH * 4)));
  typedef int32_t vi __attribute__((vector_size(TOKAMAX_DOTROWS_WIDTH * 4)));

  static vf load(const float* p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  // W weights from k on, as f32.
  static vf weights(const void* w, bool bf16, int64_t at) {
    if (!bf16) return load(static_cast<const float*>(w) + at);
    const uint16_t* p = static_cast<const uint16_t*>(w) + at;
#ifdef TOKAMAX_DOTROWS_BF16
    vi x = (vi)TOKAMAX_DOTROWS_BF16(p);
#else
    vi x;
    for (int i = 0; i < W; ++i) x[i] = p[i];
#endif
    x <<= 16;
    vf f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }
  static float weight(const void* w, bool bf16, int64_t at) {
    if (!bf16) return static_cast<const float*>(w)[at];
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(w)[at]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }

  // Weight row c for R rows of a: U independent partial sums a row (the FMA's latency), the
  // row read front to back. Rows c, c + 1, ... follow each other in memory, so a call's weights
  // are one sequential stream, which the hardware prefetchers follow across pages (reading
  // several rows side by side instead made each 4 KiB row a short stream of its own that
  // started cold: 0.55x the packed weights' rate on Zen 4).
  template <int R>
  static void row(int64_t c, int64_t k, const float* a, int64_t lda, const void* w, bool bf16,
                  int64_t ldw, float* out, int64_t ldo) {
    vf acc[R][U] = {};
    const int64_t ku = k - k % (U * W), kv = k - k % W;
    const int64_t at = c * ldw;
    int64_t kk = 0;
    for (; kk < ku; kk += U * W) {
      for (int u = 0; u < U; ++u) {
        const vf wv = weights(w, bf16, at + kk + u * W);
        for (int r = 0; r < R; ++r) acc[r][u] += load(a + r * lda + kk + u * W) * wv;
      }
    }
    for (; kk < kv; kk += W) {
      const vf wv = weights(w, bf16, at + kk);
      for (int r = 0; r < R; ++r) acc[r][0] += load(a + r * lda + kk) * wv;
    }
    for (int r = 0; r < R; ++r) {
      vf sum = acc[r][0];
      for (int u = 1; u < U; ++u) sum += acc[r][u];
      float s = 0;
      for (int i = 0; i < W; ++i) s += sum[i];
      for (int64_t j = kv; j < k; ++j) s += a[r * lda + j] * weight(w, bf16, at + j);
      out[r * ldo + c] = s;
    }
  }

  static void kernel(int rows, int64_t cols, int64_t k, const float* a, int64_t lda, const void* w,
                     bool w_bf16, int64_t ldw, float* out, int64_t ldo) {
    for (int64_t c = 0; c < cols; ++c) {
      // Every row of a against weight row c, which stays in L1 after the first pass.
      for (int r0 = 0; r0 < rows; r0 += kDotMaxRows) {
        const float* ar = a + r0 * lda;
        float* o = out + r0 * ldo;
        switch (rows - r0 < kDotMaxRows ? rows - r0 : kDotMaxRows) {
          case 1:
            row<1>(c, k, ar, lda, w, w_bf16, ldw, o, ldo);
            break;
          case 2:
            row<2>(c, k, ar, lda, w, w_bf16, ldw, o, ldo);
            break;
          case 3:
            row<3>(c, k, ar, lda, w, w_bf16, ldw, o, ldo);
            break;
          default:
            row<4>(c, k, ar, lda, w, w_bf16, ldw, o, ldo);
        }
      }
    }
  }
};

}  // namespace
}  // namespace tokamax::kernels
