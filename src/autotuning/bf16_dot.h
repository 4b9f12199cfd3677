// Whether the bf16 dot outruns widening bf16 to f32 FMAs on this CPU: known per
// microarchitecture, else measured once per process with the roofline's peak loops. Here, in
// the layer that owns timing, rather than beside the kernels (which take the answer as an
// argument or a kernel choice and time nothing).
#pragma once

namespace tokamax {

// Whether bf16 weights should go through the bf16 dot (pairs) rather than be widened to f32 for
// the f32 FMA: only where the dot does more flops per cycle. TOKAMAX_BF16_DOT=0|1 overrides.
bool bf16_dot_pays();
// Whether the vector bf16 dot (vdpbf16ps, the dot_stream kernels) outruns widening bf16 to f32
// FMAs: bf16_dot_pays() without AMX tiles (where it is the tiles that pay, while the vector dot
// issues at half the FMA's flops, as on every Intel core measured).
bool vector_bf16_dot_pays();

}  // namespace tokamax
