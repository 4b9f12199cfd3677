// ShapeDtype: the abstract description of an array (shape + dtype) and its string form
// "bf16[8,128]" (a scalar is "f32[]"), used in argument specs, cache keys and the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokamax/core/dtype.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

using Shape = std::vector<int64_t>;

// Number of elements; throws InvalidArgument on negative dimensions or int64 overflow.
int64_t num_elements(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[8,128]"

struct ShapeDtype {
  Shape shape;
  DType dtype = DType::kF32;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t size() const { return num_elements(shape); }
  int64_t bytes() const;
  std::string str() const;
  // Exact inverse of str(). Errors name the position of the first bad character.
  static ShapeDtype parse(std::string_view text);

  friend bool operator==(const ShapeDtype&, const ShapeDtype&) = default;
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
