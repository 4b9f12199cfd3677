// The floating-point control state (x86 MXCSR: flush-to-zero, denormals-are-zero, rounding) of
// the library's threads. A pool job runs in its caller's mode (ThreadPool::run copies it to the
// workers), so which thread computes which tile never changes a result; a kernel that wants
// denormals flushed sets it on the calling thread for the call (ScopedFlushDenormals).
// Internal: not part of the public API.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace tokamax {

#if defined(__x86_64__) || defined(__i386__)
// MXCSR's control bits: rounding (13-14), flush-to-zero (15), denormals-are-zero (6). The
// exception masks and sticky flags are left alone.
inline constexpr uint32_t kFloatModeBits = 0x6000u | 0x8000u | 0x0040u;
inline constexpr uint32_t kFlushDenormalBits = 0x8000u | 0x0040u;
inline uint32_t float_mode() { return _mm_getcsr() & kFloatModeBits; }
inline void set_float_mode(uint32_t mode) {
  const uint32_t csr = _mm_getcsr();
  if ((csr & kFloatModeBits) != mode) _mm_setcsr((csr & ~kFloatModeBits) | mode);
}
#else
inline constexpr uint32_t kFlushDenormalBits = 0;
inline uint32_t float_mode() { return 0; }
inline void set_float_mode(uint32_t) {}
#endif

// Sets a mode on this thread for the scope, then restores the one before.
class ScopedFloatMode {
 public:
  explicit ScopedFloatMode(uint32_t mode) : saved_(float_mode()) { set_float_mode(mode); }
  ~ScopedFloatMode() { set_float_mode(saved_); }
  ScopedFloatMode(const ScopedFloatMode&) = delete;
  ScopedFloatMode& operator=(const ScopedFloatMode&) = delete;

 private:
  uint32_t saved_;
};

// Denormal results and operands read as zero for the scope, on this thread and on every pool
// thread working for it: what TensorFlow's and XLA's CPU runtimes run their kernels under. A
// denormal operand or result costs an FMA a microcode assist (about a hundred cycles); products
// of tiny probabilities fall there by the million in a softmax's backward.
class ScopedFlushDenormals : public ScopedFloatMode {
 public:
  ScopedFlushDenormals() : ScopedFloatMode(float_mode() | kFlushDenormalBits) {}
};

}  // namespace tokamax
