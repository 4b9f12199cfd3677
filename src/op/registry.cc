// The registry of op families. Built-in families register on first use (src/ops/registry.cc
// lists them; no static initializers); tests and extensions add theirs with register_family.
#include <algorithm>
#include <mutex>

#include "op/builtins.h"
#include "tokamax/core/strings.h"
#include "tokamax/op/op.h"

namespace tokamax {

namespace {
std::mutex& mu() {
  static std::mutex m;
  return m;
}
std::vector<std::shared_ptr<const OpFamily>>& storage() {
  static std::vector<std::shared_ptr<const OpFamily>> v;
  return v;
}
}  // namespace

void ensure_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_builtin_families();
    start_env_trace();
  });
}

void register_family(std::shared_ptr<const OpFamily> family) {
  std::lock_guard<std::mutex> lock(mu());
  auto& v = storage();
  for (auto& f : v) {
    if (f->name() == family->name()) {
      f = std::move(family);
      return;
    }
  }
  v.push_back(std::move(family));
}

std::vector<std::shared_ptr<const OpFamily>> families() {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(mu());
  return storage();
}

const OpFamily& find_family(const std::string& name) {
  ensure_builtins();
  std::lock_guard<std::mutex> lock(mu());
  std::vector<std::string> known;
  for (const auto& f : storage()) {
    if (f->name() == name) return *f;
    known.push_back(f->name());
  }
  throw InvalidArgument("unknown op '" + name + "'; known ops: " + join(known, ", "));
}

std::shared_ptr<const Implementation> OpFamily::implementation(const std::string& impl) const {
  if (impl == "reference") return reference();
  for (const auto& i : implementations()) {
    if (i->name() == impl) return i;
  }
  throw InvalidArgument("unknown implementation '" + impl + "' of op '" + name() +
                        "'; known: " + join(implementation_names(), ", "));
}

std::string_view arg_kind_name(ArgKind kind) {
  switch (kind) {
    case ArgKind::kArray:
      return "array";
    case ArgKind::kOptionalArray:
      return "optional_array";
    case ArgKind::kInt:
      return "int";
    case ArgKind::kBool:
      return "bool";
    case ArgKind::kReal:
      return "real";
    case ArgKind::kOptionalReal:
      return "optional_real";
    case ArgKind::kEnum:
      return "enum";
    case ArgKind::kCustom:
      break;
  }
  return "custom";
}

Json OpFamily::description() const {
  return {{"op", name()},
          {"doc", ""},
          {"arguments", Json::array()},
          {"outputs", Json::array()},
          {"vjp", nullptr},
          {"aliases", Json::array()},
          {"residuals_flag", nullptr}};
}

std::vector<Tensor> OpFamily::run_named(const std::vector<std::pair<std::string, TensorView>>&,
                                        const Json&, const CallOptions&) const {
  throw Unsupported("op '" + name() + "' has no generic call path");
}

std::vector<ShapeDtype> OpFamily::output_specs_json(const Json&) const {
  throw Unsupported("op '" + name() + "' does not describe its outputs");
}

std::vector<std::string> OpFamily::implementation_names() const {
  std::vector<std::string> names;
  for (const auto& i : implementations()) names.push_back(i->name());
  names.push_back("reference");
  return names;
}

std::vector<std::string> OpFamily::bench_rows(const CallBase& call) const {
  std::vector<std::string> rows;
  for (const auto& i : implementations()) {
    rows.push_back(i->name());
    // The default implementation's argument variants right after it (ragged_dot's and the
    // GLU's pre-packed weights: "native:packed").
    if (rows.size() == 1)
      for (const auto& [variant, overlay] : argument_variants())
        rows.push_back(i->name() + ":" + variant);
  }
  if (memory_bound(call)) rows.push_back("reference");
  return rows;
}

std::vector<ArgSpec> find_arg_specs(const std::string& family, const std::string& name,
                                    const std::string& tag) {
  if (!family.empty()) find_family(family);  // an unknown op is named as such
  std::vector<ArgSpec> out;
  for (const auto& f : families()) {
    if (!family.empty() && f->name() != family) continue;
    for (auto& s : f->arg_specs()) {
      if (!name.empty() && s.name != name) continue;
      if (!tag.empty() && !s.has_tag(tag)) continue;
      out.push_back(std::move(s));
    }
  }
  if (!name.empty() && out.empty()) {
    std::vector<std::string> known;
    for (const auto& s : find_arg_specs(family)) known.push_back(s.name);
    throw InvalidArgument("unknown spec '" + name + "'" +
                          (family.empty() ? "" : " for op '" + family + "'") +
                          "; known: " + join(known, ", "));
  }
  return out;
}

}  // namespace tokamax
