// BoundArguments: identity + canonical spec + key.
#include <limits>

#include "tokamax/op/op.h"

namespace tokamax {

BoundArguments::BoundArguments(std::string family, std::string implementation, Json arguments)
    : implementation_(std::move(implementation)) {
  if (!arguments.is_object()) {
    throw InvalidArgument("BoundArguments arguments for '" + family +
                          "' must be a JSON object, got " + std::string(arguments.type_name()));
  }
  auto r = std::make_shared<Rep>();
  r->family = std::move(family);
  r->arguments = std::move(arguments);
  r->key = canonical_dump(r->arguments);
  r->hash = hash64(r->key);
  rep_ = std::move(r);
}

std::vector<ShapeDtype> array_arguments(const Json& arguments) {
  std::vector<ShapeDtype> out;
  for (const auto& [name, v] : arguments.items()) {
    if (!v.is_string() || v.get<std::string>().find('[') == std::string::npos) continue;
    try {
      out.push_back(ShapeDtype::parse(v.get<std::string>()));
    } catch (const InvalidArgument&) {
      // A string that is not a shape (an option's value): not an array.
    }
  }
  return out;
}

int BoundArguments::num_threads() const {
  const auto it = rep_->arguments.find("num_threads");
  return it != rep_->arguments.end() && it->is_number_integer() ? it->get<int>() : 1;
}

BoundArguments BoundArguments::with_implementation(std::string implementation) const {
  BoundArguments b = *this;
  b.implementation_ = std::move(implementation);
  return b;
}

Json BoundArguments::to_json() const {
  return {{"op", {{"family", family()}, {"implementation", implementation()}}},
          {"arguments", arguments()}};
}

BoundArguments BoundArguments::from_json(const Json& j) {
  if (!j.is_object() || !j.contains("op") || !j.contains("arguments") || !j["op"].is_object() ||
      !j["op"].contains("family") || !j["op"]["family"].is_string()) {
    throw InvalidArgument(
        "bound arguments must look like {\"op\": {\"family\": ..., \"implementation\": ...}, "
        "\"arguments\": {...}}; got " +
        canonical_dump(j).substr(0, 200));
  }
  const std::string family = j["op"]["family"].get<std::string>();
  std::string impl;
  if (j["op"].contains("implementation")) {
    if (!j["op"]["implementation"].is_string())
      throw InvalidArgument("op.implementation must be a string");
    impl = j["op"]["implementation"].get<std::string>();
  }
  const OpFamily& f = find_family(family);
  if (!impl.empty()) f.implementation(impl);  // validates the name
  return f.bind_json(j["arguments"], impl);
}

std::string BoundArguments::dumps_list(const std::vector<BoundArguments>& list) {
  Json arr = Json::array();
  for (const auto& b : list) arr.push_back(b.to_json());
  return arr.dump(1);
}

std::vector<BoundArguments> BoundArguments::loads_list(std::string_view text,
                                                       std::string_view source,
                                                       std::vector<std::string>* skipped) {
  const Json j = parse_json(text, source);
  if (!j.is_array())
    throw InvalidArgument(std::string(source) + ": expected a JSON list of bound arguments");
  std::vector<BoundArguments> out;
  for (size_t i = 0; i < j.size(); ++i) {
    try {
      out.push_back(from_json(j[i]));
    } catch (const InvalidArgument& e) {
      if (!skipped) throw;
      skipped->push_back(std::string(source) + " entry #" + std::to_string(i) + ": " + e.what());
    }
  }
  return out;
}

Config Implementation::config_from_json(const Json& j) const {
  if (j.is_object() && j.empty()) return Config::null();
  throw InvalidArgument("implementation '" + name() + "' has no config fields; got config " +
                        canonical_dump(j));
}

double Implementation::estimate_ms(const CallBase&, const Config&) const {
  return std::numeric_limits<double>::quiet_NaN();
}

bool ArgSpec::has_tag(const std::string& t) const {
  for (const auto& x : tags) {
    if (x == t) return true;
  }
  return false;
}

}  // namespace tokamax
