// Microkernels of the native ragged_dot, as plain functions named by ISA (XNNPACK style), and
// the packing routines. No framework types here.
//
// A microkernel computes one tile C[mr x nr] (+)= A[mr x kc] * B[kc x nr], where B is one
// packed panel (nr columns, zero-padded; 64-byte aligned: the kernels use aligned loads) and C
// is an f32 scratch tile with row stride ldc.
//  - f32:  A is f32 addressed as a[i*rs_a + k*cs_a] (row-major lhs, or a transposed block).
//  - bf16: A and B hold bf16 pairs (k even in the low half): a[kp*a_stride + i], b[kp*nr + j];
//          each step is one vdpbf16ps (two products per lane).
#pragma once

#include <cstdint>

namespace tokamax::kernels {

enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The per-ISA choice of a kernel written once over vector types and compiled per ISA (the
// norm rows, the quantized and dotrows streams): each ISA's getter, called only for its ISA.
template <class K>
K for_isa(Isa isa, K (*portable)(), K (*avx2)(), K (*avx512)()) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512();
    case Isa::kAvx2:
      return avx2();
    case Isa::kPortable:
      break;
  }
  return portable();
}

// Bytes an f32 tile prefetches into L2 while it computes (the grouped GEMM's next weight panel,
// a slice per tile); none when bytes is 0. p should be 64-byte aligned and bytes whole lines
// (each 64 bytes from p is one prefetch). The AVX-512 tile with a fixed row stride spreads them
// over its k steps (a line every other step, the rest after its loop; see there why); with a
// run-time stride it, and the AVX2 and portable tiles, prefetch them all at their start.
struct L2Ahead {
  const char* p = nullptr;
  int64_t bytes = 0;
};
using F32Kernel = void (*)(int mr, int64_t kc, const float* a, int64_t rs_a, int64_t cs_a,
                           const float* b, float* c, int64_t ldc, bool accumulate, L2Ahead ahead);
using Bf16Kernel = void (*)(int mr, int64_t kp, const uint32_t* a, int64_t a_stride,
                            const uint32_t* b, float* c, int64_t ldc, bool accumulate);

// Weight-streaming variants for tiles of at most kMultiMaxMr rows (decode): they compute
// multi_np[mr] adjacent panels at once (b + p * panel_stride, C at c + p * nr), so each thread
// keeps several streams from memory in flight instead of one.
inline constexpr int kMultiMaxMr = 4;

// Runs body.template operator()<MR>() with MR = mr clamped to [1, Max]: the tile height chosen
// at run time picks one of the kernel variants compiled for each height. (Each ISA file calls
// it with its own lambdas, so the instantiations stay local to that file and its -m flags.)
template <int Max, class Body>
inline void with_tile_rows(int mr, Body&& body) {
  if constexpr (Max > 1) {
    if (mr < Max) {
      with_tile_rows<Max - 1>(mr, body);
      return;
    }
  }
  body.template operator()<Max>();
}
using F32MultiKernel = void (*)(int mr, int64_t kc, const float* a, int64_t rs_a, int64_t cs_a,
                                const float* b, int64_t panel_stride, float* c, int64_t ldc,
                                bool accumulate);
using Bf16MultiKernel = void (*)(int mr, int64_t kp, const uint32_t* a, int64_t a_stride,
                                 const uint32_t* b, int64_t panel_stride, float* c, int64_t ldc,
                                 bool accumulate);

// Weight streaming from the caller's own layout, nothing packed: for i < mr (<= kStreamMaxMr),
// j < cols, c[i*ldc + j] = sum_{k<K} a[i*lda + k] * B(k, j), where B(k, j) = b[k*ldb + j]
// (forward: b is the group's [K,N] row-major weights) or b[j*ldb + k] (transposed: [N,K]).
// b holds f32 or bf16 (b_bf16; widened exactly, multiplied with f32 FMAs: an lhs rounded to
// bf16 by the caller makes every product exact, as the bf16 dot's are). The forward kernel reads
// the rows of b in order, a few at a time, so the weights are one forward stream that the
// hardware prefetchers follow; c is overwritten.
inline constexpr int kStreamMaxMr = 8;
using StreamKernel = void (*)(int mr, int64_t K, const float* a, int64_t lda, const void* b,
                              bool b_bf16, int64_t ldb, int64_t cols, float* c, int64_t ldc);
// Attention decode's P v: c[i*ldc + j] += sum_{k<K} a[i*lda + k] * b[k*ldb + j] (b f32 or bf16 as
// above), c's blocks in registers across K. As it reads rows 0.. of b it prefetches rows K,
// K + 1, .. K + prefetch_rows - 1 (prefetch_rows <= K; columns [0, cols)) into L2, one for each
// row read: the caller's next block, so the memory stream goes on while it computes
// (kernels/stream_prefetch.h). With l1_ahead != 0 it also prefetches into L1, as it reads a row's
// columns [0, cols), the bytes l1_ahead further on (decode on Intel: the next kv head's columns,
// with prefetch_rows 0; elsewhere decode passes prefetch_rows and no l1_ahead).
using StreamAccKernel = void (*)(int mr, int64_t K, const float* a, int64_t lda, const void* b,
                                 bool b_bf16, int64_t ldb, int64_t cols, float* c, int64_t ldc,
                                 int64_t prefetch_rows, int64_t l1_ahead);
// The streaming kernels' dispatch: body.template operator()<MR, BF16>() for the tile height (up to
// kStreamMaxMr) and weight dtype of a call; nothing for mr <= 0 (no rows of c to write). As
// with_tile_rows, each ISA file instantiates it with its own lambdas.
template <class Body>
inline void with_rows_and_dtype(int mr, bool b_bf16, Body&& body) {
  if (mr <= 0) return;
  with_tile_rows<kStreamMaxMr>(mr, [&]<int MR>() {
    if (b_bf16)
      body.template operator()<MR, true>();
    else
      body.template operator()<MR, false>();
  });
}
// Packs B panels [panel_begin, panel_end) of a [K,N] bf16 matrix into bf16 pair panels (as
// pack_panels_bf16 with is_bf16 and not transposed); ISAs with a bf16 dot have a vector one.
// ld: src's row stride in elements (>= N; a column block of a wider matrix).
using PackBBf16 = void (*)(const uint16_t* src, int64_t K, int64_t N, int64_t ld, int nr,
                           uint32_t* dst, int64_t panel_begin, int64_t panel_end);

using PackAF32 = void (*)(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                          float* dst);
// Packs A into bf16 pairs (see pack_a_bf16 below); ISAs with a bf16 dot have a vector one.
using PackABf16 = void (*)(const void* a, bool is_bf16, int64_t lda, int64_t rows, int64_t k0,
                           int64_t kc, int64_t a_stride, uint32_t* dst);

// Attention decode with bf16 K and V on the bf16 dot (vdpbf16ps: pairs of adjacent k per lane,
// sums in f32). a is f32, rounded to bf16 inside (to nearest even: exact for a q that was bf16;
// P's probabilities keep 8 bits). For i < mr (<= kStreamMaxMr), j < cols:
//   dot_stream_t:   c[i*ldc + j] = sum_{k<K} a[i*lda + k] * b[j*ldb + k] (q k^T; c overwritten);
//   dot_stream_acc: c[i*ldc + j] += sum_{k<K} a[i*lda + k] * b[k*ldb + j] (P v; c accumulated).
// lda and ldb in elements; any K and cols (tails masked).
using DotStreamKernel = void (*)(int mr, int64_t K, const float* a, int64_t lda, const uint16_t* b,
                                 int64_t ldb, int64_t cols, float* c, int64_t ldc);
// dot_stream_acc, with StreamAccKernel's prefetches (of the next block's rows, and l1_ahead).
using DotStreamAccKernel = void (*)(int mr, int64_t K, const float* a, int64_t lda,
                                    const uint16_t* b, int64_t ldb, int64_t cols, float* c,
                                    int64_t ldc, int64_t prefetch_rows, int64_t l1_ahead);

// Decode's q k^T for `heads` kv heads at once, in memory order (position by position, every
// head of a position before the next: a KV cache sub-block [cols][heads][K] read as one forward
// stream, which on Zen 4 the hardware prefetchers follow at the sequential rate, against about
// half of it head by head). For h < heads, i < mr, j < cols:
//   c[(h*mr + i)*ldc + j] = sum_{k<K} a[(h*mr + i)*K + k] * b[j*ldb + h*K + k].
// stream_heads_t: b f32 or bf16 (b_bf16, widened exactly), f32 FMAs. dot_heads_t: b bf16, a
// rounded to bf16 inside, the bf16 dot; requires heads * mr * round_up(K, 32) <=
// kDotHeadsMaxValues (the rounded rows live on the stack). When `prefetch` is not null they
// prefetch the prefetch_bytes bytes at prefetch + j * prefetch_ld as position j is read, head by
// head (decode: the first sub-block's V rows, before P v reads them, then the next sub-block's K
// rows; kernels/stream_prefetch.h). With l1_ahead != 0 they also prefetch into L1 the bytes
// l1_ahead past each (position, head) row they read (decode on Intel: its own stream 16 KiB
// ahead, with no `prefetch`; elsewhere 0): the
// AVX-512 FMA kernel a line per line it reads, the others the row at once before reading it.
inline constexpr int64_t kDotHeadsMaxValues = 8192;
using StreamHeadsKernel = void (*)(int mr, int heads, int64_t K, const float* a, const void* b,
                                   bool b_bf16, int64_t ldb, int64_t cols, float* c, int64_t ldc,
                                   const void* prefetch, int64_t prefetch_ld,
                                   int64_t prefetch_bytes, int64_t l1_ahead);

struct KernelSet {
  Isa isa;
  const char* name;
  int nr;      // panel width in columns
  int max_mr;  // largest tile height (accumulators must fit in registers)
  F32Kernel f32;
  Bf16Kernel bf16;  // nullptr when the ISA has no bf16 dot
  F32MultiKernel f32_multi = nullptr;
  Bf16MultiKernel bf16_multi = nullptr;
  PackABf16 pack_a_bf16 = nullptr;     // set whenever bf16 is
  int multi_np[kMultiMaxMr + 1] = {};  // panels per multi call, by tile rows
  StreamKernel stream = nullptr;       // forward [K,N] weights, unpacked
  StreamKernel stream_t = nullptr;     // transposed [N,K] weights, unpacked
  PackBBf16 pack_b_bf16 = nullptr;     // vector pair packing of bf16 [K,N] weights
  // The bf16 kernel runs on AMX tiles (microkernels_amx.cc): it takes a whole row block at
  // once (any number of rows: the blocking's mr is the f32 kernel's), A packed row-major by
  // pack_a_bf16 with its rows padded to kAmxRows (zero), and C rows written up to that padding.
  bool amx = false;
  PackAF32 pack_a_f32 = nullptr;  // a vector pack_a_f32 (same layout), where the ISA has one
  // Attention decode's P v (see StreamAccKernel). Set whenever stream is.
  StreamAccKernel stream_acc = nullptr;
  DotStreamKernel dot_stream_t = nullptr;  // set where the bf16 dot is (see DotStreamKernel)
  DotStreamAccKernel dot_stream_acc = nullptr;
  StreamHeadsKernel dot_heads_t = nullptr;     // set where the bf16 dot is
  StreamHeadsKernel stream_heads_t = nullptr;  // set where stream_t is
  // [N,K] rows (f32 or bf16) into pair panels, nr rows a panel: pack_a_bf16's vector layout
  // (dst[kp * nr + j]), which the AMX set's own pack_a_bf16 does not keep (f32 rounded as
  // pack_a_bf16_avx512 rounds, denormals flushed). pack_panels' transposed pairs: attention's
  // K^T panels on the bf16 dot and transposed bf16 weights; the scalar loop took 3% of prefill
  // bf16 on Zen 4.
  PackABf16 pack_rows_bf16 = nullptr;
};
inline constexpr int kAmxRows = 16;

// The softmax's row loops (kernels/exp_sum.h) at an ISA's width:
//   exp_shift_sum: x[i] = exp(x[i] * scale - shift) for i < n, the product rounded before the
//                  difference (scale_max's value less the shift, bit for bit), returning the
//                  sum; 0 at and below -87, e^88 from 88 on;
//   scale_max:     x[i] *= scale for i < n, returning the max (-inf when n = 0);
//   max:           the max of x[0..n) (-inf when n = 0), x untouched. For scale > 0, scale times
//                  it is the max of the x[i] * scale as scale_max rounds them (rounding is
//                  monotone), so the softmax scales inside the exp with no pass of its own.
//   act_mul:       out[i] = activation(g[i]) * u[i] for i < n (the gated linear unit's
//                  epilogue); the AVX-512 and AVX2 loops take sigmoid, silu, gelu_tanh, relu and
//                  none on the polynomial exp (under 1 ulp from a double exp, exp_sum.h), gelu
//                  (erf) element by element.
//   act_grad:      dg[i] = dout[i] * u[i] * activation'(g[i]), du[i] = dout[i] * activation(g[i])
//                  (the gated linear unit's backward, dh from h and dout); the same activations
//                  on the AVX-512 and AVX2 loops, gelu element by element.
struct RowKernels {
  float (*exp_shift_sum)(float* x, int64_t n, float scale, float shift);
  float (*scale_max)(float* x, int64_t n, float scale);
  float (*max)(const float* x, int64_t n);
  void (*act_mul)(int act, const float* g, const float* u, float* out, int64_t n);
  void (*act_grad)(int act, const float* g, const float* u, const float* dout, float* dg, float* du,
                   int64_t n);
};
RowKernels row_kernels(Isa isa);
// act is an Activation's value (tokamax/core/activation.h; the ISA files see these codes only, no
// library headers: microkernels.cc checks that they agree). The portable loop is also the
// vector loops' fallback (gelu).
enum ActCode : int { kActNone, kActRelu, kActSilu, kActGelu, kActGeluTanh, kActSigmoid };
void act_mul_portable(int act, const float* g, const float* u, float* out, int64_t n);
void act_mul_avx512(int act, const float* g, const float* u, float* out, int64_t n);
void act_grad_portable(int act, const float* g, const float* u, const float* dout, float* dg,
                       float* du, int64_t n);
void act_grad_avx512(int act, const float* g, const float* u, const float* dout, float* dg,
                     float* du, int64_t n);
float exp_shift_sum_avx2(float* x, int64_t n, float scale,
                         float shift);  // microkernels_avx2.cc
float scale_max_avx2(float* x, int64_t n, float scale);
float max_avx2(const float* x, int64_t n);
void act_mul_avx2(int act, const float* g, const float* u, float* out, int64_t n);
void act_grad_avx2(int act, const float* g, const float* u, const float* dout, float* dg, float* du,
                   int64_t n);
float exp_shift_sum_avx512(float* x, int64_t n, float scale,
                           float shift);  // microkernels_avx512.cc
float scale_max_avx512(float* x, int64_t n, float scale);
float max_avx512(const float* x, int64_t n);

const KernelSet& portable_kernels();
const KernelSet* avx2_kernels();    // defined in microkernels_avx2.cc
const KernelSet* avx512_kernels();  // defined in microkernels_avx512.cc
// The AVX-512 set with the AMX-BF16 tile kernel for bf16 pairs (microkernels_amx.cc); nullptr
// when the kernel refuses the tile state. Call only on a CPU with AMX-BF16.
const KernelSet* amx_kernels();
// Loads the tile configuration the AMX kernels use (eight 16 x 64-byte tiles) on this thread,
// when not loaded since the thread last entered the library (thread_entry_epoch): the kernels
// and the roofline's AMX loop share it, so neither undoes the other's.
void amx_configure_tiles();
// TILERELEASE, as code outside the library does after its own tile kernels (tests).
void amx_release_tiles();
// The best set this CPU runs; TOKAMAX_ISA=portable|avx2|avx512|amx caps it (tests, comparisons).
const KernelSet& best_kernels();
// The best set this CPU runs, whatever TOKAMAX_ISA says: what tuning data for this device kind
// was made on (check_isa_config).
const KernelSet& cpu_best_kernels();
// (Whether the bf16 dot pays on this CPU is measured above the kernels:
// autotuning/bf16_dot.h.)

// Packs rows [0,K) x columns [0,N) of one group's weights into panels of nr columns; panels
// [panel_begin, panel_end) go to dst one after the other (dst holds panel_begin's).
// src_trans: src is [N,K] (transposed rhs) instead of [K,N]. src is f32 or bf16 (is_bf16).
// f32 panels: dst[p][k][nr] floats, k < K.
// ld: src's row stride in elements (0: N, or K when src_trans).
void pack_panels_f32(const void* src, bool is_bf16, bool src_trans, int64_t K, int64_t N, int nr,
                     float* dst, int64_t panel_begin, int64_t panel_end, int64_t ld = 0);
// bf16 pair panels: dst[p][kp][nr] pairs, kp < ceil(K/2); odd K is padded with zero.
// f32 sources are rounded to bf16.
void pack_panels_bf16(const void* src, bool is_bf16, bool src_trans, int64_t K, int64_t N, int nr,
                      uint32_t* dst, int64_t panel_begin, int64_t panel_end, int64_t ld = 0);
// Packs A rows [0,rows) x k in [k0, k0+kc) of a row-major f32 matrix (row stride lda) into
// tiles of mr rows, dst[t][k][mr] (rows past `rows` are zero). The micro-panel of one tile is then
// one contiguous stream: rows of a row-major lhs are K*4 bytes apart, and for K a multiple of
// 1024 a dozen of them fall into one L1 set (4 KiB aliasing) if read in place.
void pack_a_f32(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                float* dst);
// The set's vector pack_a_f32 where it has one, else the scalar one (same layout).
inline PackAF32 f32_lhs_packer(const KernelSet& ks) {
  return ks.pack_a_f32 ? ks.pack_a_f32 : pack_a_f32;
}
// pack_a_f32's tiles from A stored transposed (element (r, k) at a[k * lda + r]): each tile's
// row k is a copy of min(mr, rows left) contiguous floats.
void pack_a_f32_t(const float* a, int64_t lda, int64_t rows, int64_t k0, int64_t kc, int mr,
                  float* dst);
// Packs A rows [0,rows) x k in [k0, k0+kc) of a row-major matrix (row stride lda) into bf16 pairs
// dst[kp*a_stride + i]; rows >= `rows` up to a_stride and the odd tail are zero.
void pack_a_bf16(const void* a, bool is_bf16, int64_t lda, int64_t rows, int64_t k0, int64_t kc,
                 int64_t a_stride, uint32_t* dst);

}  // namespace tokamax::kernels
