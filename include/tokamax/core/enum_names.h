// An enum's names from one table: the name of a value (JSON keys, messages, the CLI) and the
// value of a name, with an InvalidArgument that names the argument and lists every name. Each
// enum states its table once; name() and parse() cannot disagree.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "tokamax/core/error.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

template <class E, size_t N>
struct EnumNames {
  std::string_view what;  // the argument in messages: "activation"
  std::array<std::pair<E, std::string_view>, N> table;

  constexpr std::string_view name(E value) const {
    for (const auto& [v, n] : table) {
      if (v == value) return n;
    }
    return "?";
  }

  // "a, b or c": the names, for messages.
  std::string expected() const {
    std::string out;
    for (size_t i = 0; i < N; ++i) {
      out += i == 0 ? "" : i + 1 == N ? " or " : ", ";
      out += table[i].second;
    }
    return out;
  }

  E parse(std::string_view s) const {
    for (const auto& [v, n] : table) {
      if (n == s) return v;
    }
    throw InvalidArgument(std::string(what) + " '" + std::string(s) + "': expected " + expected());
  }
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
