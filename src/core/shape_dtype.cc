// Parsing and formatting of ShapeDtype strings such as "bf16[8,128]".
#include "tokamax/core/shape_dtype.h"

#include <algorithm>
#include <limits>

#include "tokamax/core/error.h"

namespace tokamax {

// The product of the nonzero dimensions must fit int64 too, not only the count: a family
// multiplies some of the dimensions of an empty tensor (its rows: [2^40, 2^40, 0] has 2^80 rows
// of none) and would wrap, or loop over them.
int64_t num_elements(const Shape& shape) {
  int64_t nonzero = 1;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t d = shape[i];
    if (d < 0) {
      throw InvalidArgument("shape " + shape_str(shape) + ": dimension " + std::to_string(i) +
                            " is negative; expected >= 0");
    }
    if (d == 0) {
      empty = true;
      continue;
    }
    if (nonzero > std::numeric_limits<int64_t>::max() / d) {
      throw InvalidArgument("shape " + shape_str(shape) + ": " +
                            (std::find(shape.begin(), shape.end(), 0) != shape.end()
                                 ? "the product of its nonzero dimensions"
                                 : "element count") +
                            " overflows int64");
    }
    nonzero *= d;
  }
  return empty ? 0 : nonzero;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t ShapeDtype::bytes() const {
  const int64_t n = size();
  const int64_t item = static_cast<int64_t>(dtype_size(dtype));
  if (n > std::numeric_limits<int64_t>::max() / item) {
    throw InvalidArgument(str() + ": byte size overflows int64");
  }
  return n * item;
}

std::string ShapeDtype::str() const { return std::string(dtype_name(dtype)) + shape_str(shape); }

ShapeDtype ShapeDtype::parse(std::string_view text) {
  auto fail = [&](size_t pos, const std::string& why) -> InvalidArgument {
    return InvalidArgument("malformed ShapeDtype '" + std::string(text) + "' at position " +
                           std::to_string(pos) + ": " + why +
                           " (expected the form dtype[d0,d1,...], e.g. bf16[8,128])");
  };
  const size_t open = text.find('[');
  if (open == std::string_view::npos) throw fail(text.size(), "missing '['");
  if (open == 0) throw fail(0, "missing dtype name");
  ShapeDtype out;
  try {
    out.dtype = parse_dtype(text.substr(0, open));
  } catch (const InvalidArgument&) {
    throw fail(0, "unknown dtype '" + std::string(text.substr(0, open)) + "'");
  }
  size_t pos = open + 1;
  if (pos < text.size() && text[pos] == ']') {
    ++pos;
  } else {
    while (true) {
      if (pos >= text.size()) throw fail(pos, "unexpected end, expected a dimension");
      if (text[pos] == '-') throw fail(pos, "negative dimension");
      if (text[pos] < '0' || text[pos] > '9') throw fail(pos, "expected a digit");
      int64_t value = 0;
      const size_t start = pos;
      while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
        const int digit = text[pos] - '0';
        if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) {
          throw fail(start, "dimension overflows int64");
        }
        value = value * 10 + digit;
        ++pos;
      }
      if (pos - start > 1 && text[start] == '0') throw fail(start, "leading zero in dimension");
      out.shape.push_back(value);
      if (pos >= text.size()) throw fail(pos, "unexpected end, expected ',' or ']'");
      if (text[pos] == ']') {
        ++pos;
        break;
      }
      if (text[pos] != ',') throw fail(pos, "expected ',' or ']'");
      ++pos;
    }
  }
  if (pos != text.size()) throw fail(pos, "trailing characters");
  try {
    out.bytes();  // rejects element counts that overflow
  } catch (const InvalidArgument& e) {
    throw fail(open, e.what());
  }
  return out;
}

}  // namespace tokamax
