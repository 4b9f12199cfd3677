// ShapeDtype parse/format round trips and malformed input.
#include "tokamax/core/shape_dtype.h"

#include <gtest/gtest.h>

#include "tokamax/core/error.h"

namespace tokamax {
namespace {

TEST(ShapeDtype, RoundTrip) {
  for (const char* s :
       {"bf16[8,128]", "f32[]", "i32[0]", "u8[1,2,3,4]", "bool[7]", "u8[9223372036854775807]"}) {
    EXPECT_EQ(ShapeDtype::parse(s).str(), s);
  }
  const ShapeDtype sd{{8, 128}, DType::kBF16};
  EXPECT_EQ(ShapeDtype::parse(sd.str()), sd);
  EXPECT_EQ(ShapeDtype::parse("f32[]").size(), 1);
}

TEST(ShapeDtype, MalformedNamesPosition) {
  struct Case {
    const char* text;
    const char* needle;
  };
  for (const Case& c :
       {Case{"f32[8,", "position 6"}, Case{"f32[8,x]", "position 6"}, Case{"f32", "position 3"},
        Case{"[8]", "position 0"}, Case{"f7[8]", "unknown dtype"}, Case{"f32[-1]", "negative"},
        Case{"f32[8]x", "trailing"}, Case{"f32[99999999999999999999]", "overflows"},
        Case{"f32[4294967296,4294967296]", "overflow"}, Case{"f32[08]", "leading zero"}}) {
    try {
      ShapeDtype::parse(c.text);
      ADD_FAILURE() << c.text << " parsed";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos)
          << c.text << ": " << e.what();
    }
  }
}

TEST(ShapeDtype, NegativeAndOverflowingShapes) {
  EXPECT_THROW(num_elements({2, -1}), InvalidArgument);
  EXPECT_THROW(num_elements({1LL << 40, 1LL << 40}), InvalidArgument);
  EXPECT_EQ(num_elements({0, 1LL << 62}), 0);
}

// An empty shape whose other dimensions multiply past int64 is refused: a family computing its
// rows (the product of the leading dimensions) would wrap, or loop for minutes over nothing.
TEST(ShapeDtype, EmptyShapeWithHugeOtherDimensionsIsRefused) {
  EXPECT_EQ(num_elements({int64_t{1} << 40, 0, 7}), 0);
  try {
    num_elements({int64_t{1} << 40, int64_t{1} << 40, 0});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("product of its nonzero dimensions"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tokamax
