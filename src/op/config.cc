// Config representation.
#include "tokamax/op/config.h"

namespace tokamax {

namespace {
std::shared_ptr<const void> null_rep() { return nullptr; }
}  // namespace

Config::Config() {
  static const std::shared_ptr<const Rep> kNull = [] {
    auto r = std::make_shared<Rep>();
    r->json = Json::object();
    r->str = "{}";
    r->hash = hash64(r->str);
    r->typed = null_rep();
    return r;
  }();
  rep_ = kNull;
}

Config::Config(Json json, std::shared_ptr<const void> typed, const std::type_info* type) {
  auto r = std::make_shared<Rep>();
  r->json = std::move(json);
  r->str = canonical_dump(r->json);
  r->hash = hash64(r->str);
  r->typed = std::move(typed);
  r->type = type;
  rep_ = std::move(r);
}

}  // namespace tokamax
