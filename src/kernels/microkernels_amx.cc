// AMX-BF16 microkernels: the bf16 pair product on the tile matrix unit (TDPBF16PS), for CPUs
// that have it (Sapphire Rapids and later). Everything else of this kernel set is the AVX-512
// one's. Compiled with -mamx-tile -mamx-bf16 on top of the AVX-512 flags; called only when the
// CPU has AMX and the kernel granted its tile state (amx_kernels() asks once per process).
//
// Why: on these CPUs vdpbf16ps runs at half the f32 FMA's flops (`tokamax device --roofline`),
// so bf16 weights gained nothing from the vector dot; one TDPBF16PS multiplies a 16x32 by a
// 32x16 bf16 block (16K flops) every 16 cycles, about 15x the f32 FMA's rate.
//
// Layouts (the kernel takes a whole row block, not the blocking's mr-row tiles):
//  - A: row-major bf16 pairs, a[i * kp + p], rows zero-padded to a multiple of 16, so a 16-row
//    block of 16 pairs is one tile load with a stride of kp * 4 bytes;
//  - B: the shared pair panels (32 columns, b[p * 32 + j]), two 16-column tiles a step;
//  - C: up to 32 x 32 floats in four 16 x 16 accumulator tiles, loaded when accumulating.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "core/thread_pool.h"
#include "kernels/microkernels.h"
#include "tokamax/core/dtype.h"

namespace tokamax::kernels {
namespace {

constexpr int kNr = 32;
constexpr int kStepPairs = 16;  // pairs of K per tile step (64-byte tile rows)

// The palette-1 tile configuration (LDTILECFG's 64-byte operand).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

// Tiles: 0,1 = C rows [0,16) columns [0,16),[16,32); 2,3 = C rows [16,32); 4,5 = A row blocks;
// 6,7 = B column halves; all 16 rows (A is zero-padded to whole tiles, C has room for them).
// LDTILECFG zeroes the tiles and costs tens of cycles: once per thread, and again on the
// caller's thread after code outside the library ran there (thread_entry_epoch): that code may
// have released the tiles (torch's bf16 matmul does), and a tile instruction then faults.
void amx_configure_tiles() {
  thread_local uint64_t loaded_at = ~uint64_t{0};
  const uint64_t epoch = thread_entry_epoch();
  if (loaded_at == epoch) return;
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = kAmxRows;
    cfg.colsb[t] = 64;
  }
  asm volatile("" ::: "memory");  // LDTILECFG reads cfg (see memory_barrier below)
  _tile_loadconfig(&cfg);
  loaded_at = epoch;
}

void amx_release_tiles() { _tile_release(); }

namespace {

// GCC's tile intrinsics are asm statements without a memory clobber: the compiler does not know
// that a tile load reads memory or a tile store writes it, so stores into a buffer that only
// tiles read would be dropped as dead, and reads after a tile store could be moved before it.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

// One step of 16 pairs: a points at (row 0, pair p) with row stride sa bytes (the second row
// block a_block pairs further), b at the panel's row p with stride sb bytes.
template <bool kTwo>
inline void step(const uint32_t* a, int64_t sa, int64_t a_block, const uint32_t* b, int64_t sb) {
  _tile_loadd(4, a, sa);
  _tile_loadd(6, b, sb);
  _tile_loadd(7, b + 16, sb);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  if constexpr (kTwo) {
    _tile_loadd(5, a + a_block, sa);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// C rows [0, 16) (or [0, 32) with kTwo) x 32 columns (+)= A rows x the panel.
template <bool kTwo>
void amx_tile(int64_t kp, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc, bool acc) {
  const int64_t sc = ldc * 4;
  memory_barrier();
  if (acc) {
    _tile_loadd(0, c, sc);
    _tile_loadd(1, c + 16, sc);
    if constexpr (kTwo) {
      _tile_loadd(2, c + 16 * ldc, sc);
      _tile_loadd(3, c + 16 * ldc + 16, sc);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kTwo) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  const int64_t full = kp / kStepPairs * kStepPairs;
  for (int64_t p = 0; p < full; p += kStepPairs) {
    step<kTwo>(a + p, kp * 4, kAmxRows * kp, b + p * kNr, kNr * 4);
  }
  if (full < kp) {
    // The last partial step from zero-padded copies: a tile always reads 16 pairs (64 bytes) of
    // each A row and 16 rows of B, and past the data lie the next rows, or nothing.
    const int64_t tail = kp - full;
    constexpr int kRows = kTwo ? 2 * kAmxRows : kAmxRows;
    alignas(64) uint32_t at[kRows * kStepPairs] = {};
    alignas(64) uint32_t bt[kStepPairs * kNr] = {};
    for (int i = 0; i < kRows; ++i) std::memcpy(at + i * kStepPairs, a + i * kp + full, tail * 4);
    std::memcpy(bt, b + full * kNr, tail * kNr * 4);
    memory_barrier();
    step<kTwo>(at, kStepPairs * 4, kAmxRows * kStepPairs, bt, kNr * 4);
  }
  _tile_stored(0, c, sc);
  _tile_stored(1, c + 16, sc);
  if constexpr (kTwo) {
    _tile_stored(2, c + 16 * ldc, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
  }
  memory_barrier();
}

// The kernel set's bf16 entry: `rows` rows of A (packed by pack_a_amx, row stride kp) against
// one panel, 32 rows (four accumulator tiles) at a time. C rows up to rows rounded up to 16
// are written.
void amx_kernel(int rows, int64_t kp, const uint32_t* a, int64_t /*as*/, const uint32_t* b,
                float* c, int64_t ldc, bool acc) {
  amx_configure_tiles();
  int i = 0;
  for (; i + 2 * kAmxRows <= rows; i += 2 * kAmxRows)
    amx_tile<true>(kp, a + i * kp, b, c + i * ldc, ldc, acc);
  if (i < rows) {
    if (rows - i > kAmxRows)
      amx_tile<true>(kp, a + i * kp, b, c + i * ldc, ldc, acc);
    else
      amx_tile<false>(kp, a + i * kp, b, c + i * ldc, ldc, acc);
  }
}

// A into row-major pairs: rows [0, rows) of the lhs (row stride lda), k in [k0, k0+kc), rounded
// to bf16 when f32; rows up to `as` (the caller's rows rounded up to kAmxRows) and the odd tail
// are zero.
void pack_a_amx(const void* a, bool is_bf16, int64_t lda, int64_t rows, int64_t k0, int64_t kc,
                int64_t as, uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2;
  for (int64_t i = 0; i < as; ++i) {
    uint32_t* d = dst + i * kp;
    if (i >= rows) {
      std::memset(d, 0, kp * 4);
      continue;
    }
    if (is_bf16) {
      const uint16_t* r = static_cast<const uint16_t*>(a) + i * lda + k0;
      std::memcpy(d, r, (kc / 2) * 4);  // pairs are two consecutive bf16 (low half first)
      if (kc % 2) d[kp - 1] = r[kc - 1];
      continue;
    }
    const float* r = static_cast<const float*>(a) + i * lda + k0;
    int64_t k = 0;
    for (; k + 32 <= kc; k += 32) {
      const __m512 lo = _mm512_loadu_ps(r + k), hi = _mm512_loadu_ps(r + k + 16);
      _mm512_storeu_si512(d + k / 2, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    for (; k < kc; k += 2) {
      const uint32_t lo = f32_to_bf16(r[k]), hi = k + 1 < kc ? f32_to_bf16(r[k + 1]) : 0;
      d[k / 2] = lo | (hi << 16);
    }
  }
}

// Asks the kernel for the tile data state (Linux 5.16+); without it the first tile instruction
// faults.
bool request_tile_state() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const KernelSet* amx_kernels() {
  static const KernelSet* set = []() -> const KernelSet* {
    if (!request_tile_state()) return nullptr;
    static KernelSet s = *avx512_kernels();
    s.name = "avx512_amx";
    s.amx = true;
    s.bf16 = amx_kernel;
    s.pack_a_bf16 = pack_a_amx;
    // The multi-panel decode kernels read A in the vector kernels' layout: the tile kernel serves
    // few rows too (decode is bound by reading the weights either way).
    s.bf16_multi = nullptr;
    return &s;
  }();
  return set;
}

}  // namespace tokamax::kernels
