// Config: an implementation's tuning parameters, type-erased so the framework (ladder, cache,
// autotuner) can store, compare, hash and serialize configs of every implementation alike.
// An implementation defines a plain struct with
//   Json to_json() const;  static T from_json(const Json&);  bool operator==(const T&) const;
// and wraps it with Config::make(value). The null config (nothing to tune) serializes as {}.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "tokamax/core/error.h"
#include "tokamax/core/export.h"
#include "tokamax/core/json.h"
#include "tokamax/core/strings.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

class Config {
 public:
  Config();  // the null config
  static Config null() { return Config(); }

  template <class T>
  static Config make(T value) {
    auto typed = std::make_shared<const T>(std::move(value));
    return Config(typed->to_json(), typed, &typeid(T));
  }

  bool is_null() const { return rep_->type == nullptr; }
  const Json& json() const { return rep_->json; }
  const std::string& str() const { return rep_->str; }  // canonical JSON
  uint64_t hash() const { return rep_->hash; }

  template <class T>
  const T& get() const {
    if (rep_->type == nullptr || *rep_->type != typeid(T)) {
      throw Error("Config " + str() + " is not a " + typeid(T).name());
    }
    return *static_cast<const T*>(rep_->typed.get());
  }

  friend bool operator==(const Config& a, const Config& b) { return a.str() == b.str(); }
  friend bool operator<(const Config& a, const Config& b) { return a.str() < b.str(); }

 private:
  struct Rep {
    Json json;
    std::string str;
    uint64_t hash = 0;
    std::shared_ptr<const void> typed;
    const std::type_info* type = nullptr;
  };
  Config(Json json, std::shared_ptr<const void> typed, const std::type_info* type);
  std::shared_ptr<const Rep> rep_;
};

// One description of a config struct's integer fields, from which its JSON encoding, its
// decoding (every field required, an integer; InvalidArgument naming them otherwise) and its
// field list (`tokamax ops`) all come:
//   constexpr ConfigFields<MyConfig, 2> kFields{"my_op native config",
//                                               {{{"tile", &MyConfig::tile}, {"k",
//                                               &MyConfig::k}}}};
//
// Fields are sizes (a block, a tile, rows per item): decoding refuses values outside [min, max]
// (default [1, kMaxConfigFieldValue]) before anything is allocated on their strength (a cached
// {"kc": 2000000000} failed the call with bad_alloc), so a bad cached config is skipped with a
// warning and the ladder falls through to its next rung. Implementations check the relations
// between fields in check_config.
inline constexpr int kMaxConfigFieldValue = 1 << 16;
template <class T>
struct IntField {
  std::string_view name;
  int T::*member;
  int min = 1;
  int max = kMaxConfigFieldValue;
};

template <class T, size_t N>
struct ConfigFields {
  std::string_view what;
  std::array<IntField<T>, N> fields;

  Json to_json(const T& value) const {
    Json j = Json::object();
    for (const auto& f : fields) j[std::string(f.name)] = value.*f.member;
    return j;
  }
  T from_json(const Json& j) const {
    T value{};
    // A misspelled field would otherwise be ignored and its default used without a word.
    if (j.is_object()) {
      for (const auto& [key, unused] : j.items()) {
        bool known = false;
        for (const auto& f : fields) known = known || key == f.name;
        if (!known) {
          throw InvalidArgument(std::string(what) + " " + canonical_dump(j) + ": unknown field '" +
                                key + "'; expected integer fields " + join(names(), ", "));
        }
      }
    }
    for (const auto& f : fields) {
      const auto it = j.is_object() ? j.find(std::string(f.name)) : j.end();
      if (it == j.end() || !it->is_number_integer()) {
        throw InvalidArgument(std::string(what) + " " + canonical_dump(j) +
                              ": expected integer fields " + join(names(), ", "));
      }
      // Compared as 64-bit values (get<int> would wrap 2^32 + 8 to 8); parsed non-negative
      // integers are unsigned.
      const bool in_range =
          it->is_number_unsigned()
              ? it->template get<uint64_t>() <= static_cast<uint64_t>(f.max) &&
                    (f.min <= 0 || it->template get<uint64_t>() >= static_cast<uint64_t>(f.min))
              : it->template get<int64_t>() >= f.min && it->template get<int64_t>() <= f.max;
      if (!in_range) {
        throw InvalidArgument(std::string(what) + " " + canonical_dump(j) + ": field '" +
                              std::string(f.name) + "' = " + it->dump() +
                              "; expected an integer in [" + std::to_string(f.min) + ", " +
                              std::to_string(f.max) + "]");
      }
      value.*f.member = it->template get<int>();
    }
    return value;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& f : fields) out.emplace_back(f.name);
    return out;
  }
};

struct ConfigHash {
  size_t operator()(const Config& c) const { return static_cast<size_t>(c.hash()); }
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
