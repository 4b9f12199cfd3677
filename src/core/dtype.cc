// DType names and the f16 conversions (bf16 is inline in the header: it is on hot paths).
#include "tokamax/core/dtype.h"

#include "tokamax/core/error.h"

namespace tokamax {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kI8:
      return 1;
    case DType::kBool:
      return 1;
  }
  throw InvalidArgument("dtype_size: unknown dtype value");
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kBool:
      return "bool";
    case DType::kI8:
      return "i8";
  }
  throw InvalidArgument("dtype_name: unknown dtype value");
}

DType parse_dtype(std::string_view name) {
  for (DType d : kAllDTypes) {
    if (dtype_name(d) == name) return d;
  }
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {{"float32", DType::kF32}, {"bfloat16", DType::kBF16},
                                       {"float16", DType::kF16}, {"float64", DType::kF64},
                                       {"int32", DType::kI32},   {"int64", DType::kI64},
                                       {"uint8", DType::kU8},    {"bool_", DType::kBool},
                                       {"int8", DType::kI8}};
  for (const Alias& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  throw InvalidArgument("unknown dtype name '" + std::string(name) +
                        "'; expected one of f32, bf16, f16, f64, i32, i64, u8, bool, i8");
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 ||
         dtype == DType::kF64;
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to Inf (also Inf itself)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below the smallest normal f16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // to a multiple of 2^-24
    uint32_t r = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return f32_from_bits(sign | static_cast<uint32_t>(127 - 15 - e) << 23 |
                         ((mant & 0x3ffu) << 13));
  }
  return f32_from_bits(sign | (exp + 112) << 23 | (mant << 13));
}

}  // namespace tokamax
