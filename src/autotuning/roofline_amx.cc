// The AMX-BF16 peak loop of the roofline (compiled with -mamx-tile -mamx-bf16; called only when
// the AMX kernel set was granted its tile state: kernels::amx_kernels()).
#include <immintrin.h>

#include "autotuning/roofline_kernels.h"
#include "kernels/microkernels.h"

namespace tokamax::roofline {

float dot_bf16_amx(int64_t iters) {
  // The kernels' configuration (kernels::amx_configure_tiles): four independent accumulators
  // (tiles 0-3) from two A (4, 5) and two B (6, 7) tiles, as the 32 x 32 kernel uses them.
  kernels::amx_configure_tiles();
  alignas(64) uint16_t ones[16 * 32];
  for (uint16_t& v : ones) v = 0x3380;  // ~6e-8: the sums stay finite
  asm volatile("" ::: "memory");        // the tile loads read `ones` (no clobber in GCC's macros)
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  asm volatile("" ::: "memory");
  return out[0];
}

}  // namespace tokamax::roofline
