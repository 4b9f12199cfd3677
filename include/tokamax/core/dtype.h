// Element types tokamax understands, their sizes and short names ("f32", "bf16", ...), and
// exact conversions between f32 and the 16-bit float formats (round to nearest even, NaN and
// Inf preserved).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

// kI8 last: a dtype's number is part of tuning keys, so new ones are appended.
enum class DType : uint8_t { kF32, kBF16, kF16, kF64, kI32, kI64, kU8, kBool, kI8 };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                                       DType::kF64, DType::kI32,  DType::kI64,
                                       DType::kU8,  DType::kBool, DType::kI8};

size_t dtype_size(DType dtype);
// The short name tokamax writes: f32, bf16, f16, f64, i32, i64, u8, bool, i8.
std::string_view dtype_name(DType dtype);
// Parses a short name (also accepts numpy's long names such as "float32", "bfloat16").
// Throws InvalidArgument for anything else.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// Bit-level float conversions.
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow correctly becomes Inf
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
// f rounded to the nearest bf16 (ties to even), as f32.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Storage types that make intent visible in kernels' signatures.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
