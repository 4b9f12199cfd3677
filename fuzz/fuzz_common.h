// Shared pieces of the libFuzzer targets (fuzz/README.md): quiet logging, and the one outcome a
// reader of outside data may have besides success, InvalidArgument. Any other exception (a JSON
// type error that escaped a reader, bad_alloc, out_of_range) is a finding: it is rethrown and
// libFuzzer reports it as a crash with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokamax/tokamax.h"

namespace tokamax::fuzz {

inline void quiet() {
  static const bool once = [] {
    set_log_settings(LogSettings::parse("error"));
    return true;
  }();
  (void)once;
}

inline std::string_view text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs fn; InvalidArgument is the expected answer to bad input.
template <class Fn>
void expect_ok_or_invalid(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument&) {
  }
}

}  // namespace tokamax::fuzz
