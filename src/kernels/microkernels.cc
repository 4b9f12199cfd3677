// Portable microkernel, packing, and run-time ISA selection.
#include "kernels/microkernels.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/activation.h"
#include "kernels/exp_sum.h"
#include "kernels/prefetch.h"
#include "tokamax/core/device.h"
#include "tokamax/core/dtype.h"
#include "tokamax/core/error.h"

namespace tokamax::kernels {
namespace {

constexpr int kPortableNr = 16;

void portable_f32(int mr, int64_t kc, const float* a, int64_t rs, int64_t cs, const float* b,
                  float* c, int64_t ldc, bool acc, L2Ahead ahead) {
  prefetch_l2(ahead.p, 0, ahead.bytes);
  for (int i = 0; i < mr; ++i) {
    float row[kPortableNr] = {};
    for (int64_t k = 0; k < kc; ++k) {
      const float ai = a[i * rs + k * cs];
      for (int j = 0; j < kPortableNr; ++j) row[j] += ai * b[k * kPortableNr + j];
    }
    for (int j = 0; j < kPortableNr; ++j) c[i * ldc + j] = acc ? c[i * ldc + j] + row[j] : row[j];
  }
}

const KernelSet kPortable{Isa::kPortable, "portable", kPortableNr, 8, portable_f32, nullptr};

inline float src_at(const void* src, bool is_bf16, int64_t idx) {
  return is_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(src)[idx])
                 : static_cast<const float*>(src)[idx];
}

}  // namespace

const KernelSet& portable_kernels() { return kPortable; }

static_assert(kActNone == static_cast<int>(Activation::kNone) &&
              kActRelu == static_cast<int>(Activation::kRelu) &&
              kActSilu == static_cast<int>(Activation::kSilu) &&
              kActGelu == static_cast<int>(Activation::kGelu) &&
              kActGeluTanh == static_cast<int>(Activation::kGeluTanh) &&
              kActSigmoid == static_cast<int>(Activation::kSigmoid));

void act_mul_portable(int act, const float* g, const float* u, float* out, int64_t n) {
  const Activation a = static_cast<Activation>(act);
  for (int64_t i = 0; i < n; ++i) out[i] = apply_activation(a, g[i]) * u[i];
}

// The reference's arithmetic (libm, the derivative in double), element by element.
void act_grad_portable(int act, const float* g, const float* u, const float* dout, float* dg,
                       float* du, int64_t n) {
  const Activation a = static_cast<Activation>(act);
  for (int64_t i = 0; i < n; ++i) {
    const float x = g[i], go = dout[i];
    dg[i] = go * u[i] * static_cast<float>(activation_grad(a, x));
    du[i] = go * apply_activation(a, x);
  }
}

RowKernels row_kernels(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return {exp_shift_sum_avx512, scale_max_avx512, max_avx512, act_mul_avx512, act_grad_avx512};
    case Isa::kAvx2:
      return {exp_shift_sum_avx2, scale_max_avx2, max_avx2, act_mul_avx2, act_grad_avx2};
    case Isa::kPortable:
      break;
  }
  return {expf_poly::exp_shift_sum_portable, expf_poly::scale_max_portable, expf_poly::max_portable,
          act_mul_portable, act_grad_portable};
}

namespace {
// The best set of those up to `cap` (0 portable, 1 AVX2, 2 AVX-512, 3 AMX) this CPU runs.
const KernelSet* best_up_to(int cap) {
  const IsaFeatures& f = device_info().isa;
  if (cap >= 3 && f.has_avx512_bf16() && f.amx_bf16) {
    if (const KernelSet* amx = amx_kernels()) return amx;
  }
  if (cap >= 2 && f.has_avx512_bf16()) return avx512_kernels();
  if (cap >= 1 && f.has_avx2_fma()) return avx2_kernels();
  return &kPortable;
}
}  // namespace

const KernelSet& cpu_best_kernels() {
  static const KernelSet* best = best_up_to(3);
  return *best;
}

const KernelSet& best_kernels() {
  static const KernelSet* best = [] {
    int cap = 3;
    if (const char* env = std::getenv("TOKAMAX_ISA"); env && *env) {
      const std::string s = env;
      if (s == "portable")
        cap = 0;
      else if (s == "avx2")
        cap = 1;
      else if (s == "avx512")
        cap = 2;
      else if (s == "amx")
        cap = 3;
      else
        throw InvalidArgument("TOKAMAX_ISA='" + s + "': expected portable, avx2, avx512 or amx");
    }
    return best_up_to(cap);
  }();
  return *best;
}

void pack_panels_f32(const void* src, bool is_bf16, bool trans, int64_t K, int64_t N, int nr,
                     float* dst, int64_t p0, int64_t p1, int64_t ld) {
  if (ld == 0) ld = trans ? K : N;
  for (int64_t p = p0; p < p1; ++p) {
    float* d = dst + (p - p0) * K * nr;
    const int64_t j0 = p * nr;
    const int64_t w = std::min<int64_t>(nr, N - j0);
    if (trans) {
      // Column j of the panel is row j0 + j of the [N,K] source: read it along the row.
      for (int64_t j = 0; j < w; ++j) {
        const int64_t row = (j0 + j) * ld;
        for (int64_t k = 0; k < K; ++k) d[k * nr + j] = src_at(src, is_bf16, row + k);
      }
      for (int64_t k = 0; k < K; ++k) std::fill(d + k * nr + w, d + (k + 1) * nr, 0.0f);
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      float* dk = d + k * nr;
      if (!is_bf16) {
        std::memcpy(dk, static_cast<const float*>(src) + k * ld + j0, static_cast<size_t>(w) * 4);
      } else {
        const uint16_t* sk = static_cast<const uint16_t*>(src) + k * ld + j0;
        for (int64_t j = 0; j < w; ++j) dk[j] = bf16_to_f32(sk[j]);
      }
      for (int64_t j = w; j < nr; ++j) dk[j] = 0.0f;
    }
  }
}

void pack_panels_bf16(const void* src, bool is_bf16, bool trans, int64_t K, int64_t N, int nr,
                      uint32_t* dst, int64_t p0, int64_t p1, int64_t ld) {
  const int64_t KP = (K + 1) / 2;
  if (ld == 0) ld = trans ? K : N;
  auto bits = [&](int64_t k, int64_t j) -> uint32_t {
    if (k >= K) return 0;
    const int64_t idx = trans ? j * ld + k : k * ld + j;
    return is_bf16 ? static_cast<const uint16_t*>(src)[idx]
                   : f32_to_bf16(static_cast<const float*>(src)[idx]);
  };
  for (int64_t p = p0; p < p1; ++p) {
    uint32_t* d = dst + (p - p0) * KP * nr;
    const int64_t j0 = p * nr;
    const int64_t w = std::min<int64_t>(nr, N - j0);
    for (int64_t kp = 0; kp < KP; ++kp) {
      uint32_t* dk = d + kp * nr;
      for (int64_t j = 0; j < w; ++j)
        dk[j] = bits(2 * kp, j0 + j) | (bits(2 * kp + 1, j0 + j) << 16);
      for (int64_t j = w; j < nr; ++j) dk[j] = 0;
    }
  }
}

void pack_a_f32(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                float* dst) {
  const int64_t tiles = (rows + mr - 1) / mr;
  for (int64_t t = 0; t < tiles; ++t) {
    float* d = dst + t * mr * kc;
    for (int i = 0; i < mr; ++i) {
      const int64_t r = t * mr + i;
      if (r >= rows) {
        for (int64_t k = 0; k < kc; ++k) d[k * mr + i] = 0.0f;
        continue;
      }
      const float* src = a + r * lda + k0;
      for (int64_t k = 0; k < kc; ++k) d[k * mr + i] = src[k];
    }
  }
}

namespace {

// pack_a_f32_t reads a run of `rows` floats from each of kc source rows lda apart (the loss
// backward's x^T: 8 KiB apart), a stride the hardware prefetchers do not follow, so each run
// began with a miss: the source row kPackAhead rows on is prefetched as each row is copied,
// and a whole tile's run is a fixed-size copy (MR known to the compiler: a few vector moves, not
// a library call per run). The loss backward's dw = x^T d (M=2048, K=4096, N=1024) on 2 threads,
// Zen 4 (a one-off program, 5 runs each): 94.1-94.9 ms with neither, 91.6-92.6 with both (16
// rows ahead; 8: 91.5-92.3, 32: 88.1-91.6), 93.8-94.7 with the prefetch alone and the same as
// neither with the fixed-size copies alone; with x^T given row-major, 85-88 ms.
constexpr int64_t kPackAhead = 16;
// MR > 0: the tile height (mr is MR); 0: any mr, the copies' size known at run time only.
template <int MR>
void pack_a_t_tiles(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                    float* dst) {
  const int64_t m = MR > 0 ? MR : mr, full = rows / m, rest = rows - full * m;
  // k outer: each source row's run of `rows` floats is read once, in order.
  for (int64_t k = 0; k < kc; ++k) {
    const float* src = a + (k0 + k) * lda;
    if (k + kPackAhead < kc) {
      const char* ahead = reinterpret_cast<const char*>(src + kPackAhead * lda);
      for (int64_t off = 0; off < rows * 4; off += 64) prefetch_t0(ahead + off);
    }
    for (int64_t t = 0; t < full; ++t)
      std::memcpy(dst + t * m * kc + k * m, src + t * m, static_cast<size_t>(m) * sizeof(float));
    if (rest > 0) {
      float* d = dst + full * m * kc + k * m;
      std::memcpy(d, src + full * m, static_cast<size_t>(rest) * sizeof(float));
      std::fill(d + rest, d + m, 0.0f);
    }
  }
}

using PackATiles = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int, float*);
template <size_t... I>
constexpr std::array<PackATiles, sizeof...(I)> pack_a_t_table(std::index_sequence<I...>) {
  return {&pack_a_t_tiles<static_cast<int>(I) + 1>...};
}
constexpr int kPackATMaxMr = 16;  // every kernel set's max_mr (14 at most so far)
constexpr auto kPackAT = pack_a_t_table(std::make_index_sequence<kPackATMaxMr>());

}  // namespace

void pack_a_f32_t(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                  float* dst) {
  (mr >= 1 && mr <= kPackATMaxMr ? kPackAT[mr - 1] : &pack_a_t_tiles<0>)(a, lda, rows, k0, kc, mr,
                                                                         dst);
}

void pack_a_bf16(const void* a, bool is_bf16, int64_t lda, int64_t rows, int64_t k0, int64_t kc,
                 int64_t as, uint32_t* dst) {
  const int64_t KP = (kc + 1) / 2;
  for (int64_t i = 0; i < as; ++i) {
    if (i >= rows) {
      for (int64_t kp = 0; kp < KP; ++kp) dst[kp * as + i] = 0;
      continue;
    }
    if (is_bf16) {
      const uint16_t* r = static_cast<const uint16_t*>(a) + i * lda + k0;
      for (int64_t kp = 0; kp < KP; ++kp) {
        const uint32_t lo = r[2 * kp], hi = 2 * kp + 1 < kc ? r[2 * kp + 1] : 0;
        dst[kp * as + i] = lo | (hi << 16);
      }
    } else {
      const float* r = static_cast<const float*>(a) + i * lda + k0;
      for (int64_t kp = 0; kp < KP; ++kp) {
        const uint32_t lo = f32_to_bf16(r[2 * kp]),
                       hi = 2 * kp + 1 < kc ? f32_to_bf16(r[2 * kp + 1]) : 0;
        dst[kp * as + i] = lo | (hi << 16);
      }
    }
  }
}

}  // namespace tokamax::kernels

namespace tokamax {
std::string kernel_set() { return kernels::best_kernels().name; }
}  // namespace tokamax
