// Reading one field of a JSON object from outside (cache files, result files) as a C++ value,
// with a clear error instead of nlohmann's exceptions or its unchecked conversions. Internal.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tokamax/core/error.h"
#include "tokamax/core/json.h"

namespace tokamax {

// j[name] as T. InvalidArgument prefixed with `what` when j is not an object, lacks the field,
// or holds another type. An integral T takes only JSON integers in its range: nlohmann converts
// a float to an integer with a plain cast, undefined past the type's range (1e42, found by
// fuzz_result_file; 1.33e51 as a cache file's version, by fuzz_cache_file).
template <class T>
struct IsIntegerVector : std::false_type {};
template <class E>
struct IsIntegerVector<std::vector<E>>
    : std::bool_constant<std::is_integral_v<E> && !std::is_same_v<E, bool>> {};

// The same for a list of integers (2e124 in a cache file's sample_rounds, by fuzz_cache_file):
// every element a JSON integer in the element type's range.
template <class E>
void check_integer_list(const Json& v, const char* name, const std::string& what) {
  if (!v.is_array()) return;  // the type error below names it
  constexpr int64_t kLo = std::numeric_limits<E>::min();
  constexpr int64_t kHi = std::numeric_limits<E>::max();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!json_integer_in(v[i], kLo, kHi)) {
      throw InvalidArgument(what + ": field '" + name + "' element " + std::to_string(i) + " is " +
                            canonical_dump(v[i]).substr(0, 40) + ", expected an integer in [" +
                            std::to_string(kLo) + ", " + std::to_string(kHi) + "]");
    }
  }
}

template <class T>
T json_field(const Json& j, const char* name, const std::string& what) {
  if (!j.is_object() || !j.contains(name)) {
    throw InvalidArgument(what + ": missing field '" + name + "' in " +
                          canonical_dump(j).substr(0, 200));
  }
  const Json& v = j.at(name);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    constexpr int64_t kLo = std::numeric_limits<T>::min();
    constexpr int64_t kHi = std::numeric_limits<T>::max();
    if (!json_integer_in(v, kLo, kHi)) {
      throw InvalidArgument(what + ": field '" + name + "' is " + canonical_dump(v).substr(0, 40) +
                            ", expected an integer in [" + std::to_string(kLo) + ", " +
                            std::to_string(kHi) + "]");
    }
  }
  if constexpr (IsIntegerVector<T>::value) {
    check_integer_list<typename T::value_type>(v, name, what);
  }
  try {
    return v.get<T>();
  } catch (const Json::exception& e) {
    throw InvalidArgument(what + ": field '" + name + "' has the wrong type: " + e.what());
  }
}

}  // namespace tokamax
