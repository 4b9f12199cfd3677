// Bad-input tests: fn must throw InvalidArgument whose message contains `needle`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "tokamax/core/error.h"

namespace tokamax::testing {

template <class Fn>
void expect_invalid_argument(Fn fn, const char* needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace tokamax::testing
