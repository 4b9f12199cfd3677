// TOKAMAX_LOG parsing and the stderr sink.
#include "tokamax/core/log.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <unordered_set>

#include "tokamax/core/error.h"

namespace tokamax {
namespace {

bool parse_level(std::string_view s, LogLevel* out) {
  if (s == "error")
    *out = LogLevel::kError;
  else if (s == "warning" || s == "warn")
    *out = LogLevel::kWarning;
  else if (s == "info")
    *out = LogLevel::kInfo;
  else if (s == "debug")
    *out = LogLevel::kDebug;
  else
    return false;
  return true;
}

bool valid_category(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '*'))
      return false;
  }
  return true;
}

std::mutex g_mu;  // serializes output lines and settings replacement
// Settings are read on every log statement, so they sit behind an atomic pointer. Replaced
// settings are intentionally leaked: replacement is rare (tests, tools) and a reader may still
// hold the old pointer.
std::atomic<const LogSettings*> g_settings{nullptr};

const LogSettings* settings() {
  const LogSettings* s = g_settings.load(std::memory_order_acquire);
  if (s) return s;
  std::lock_guard<std::mutex> lock(g_mu);
  if ((s = g_settings.load(std::memory_order_acquire))) return s;
  LogSettings parsed;
  if (const char* env = std::getenv("TOKAMAX_LOG"); env && *env) {
    try {
      parsed = LogSettings::parse(env);
    } catch (const InvalidArgument& e) {
      // A malformed TOKAMAX_LOG must not take the program down: warn, keep defaults.
      std::cerr << "[tokamax:warning:log] ignoring TOKAMAX_LOG: " << e.what() << "\n";
    }
  }
  s = new LogSettings(std::move(parsed));
  g_settings.store(s, std::memory_order_release);
  return s;
}

}  // namespace

LogSettings LogSettings::parse(std::string_view spec) {
  LogSettings s;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(start, end - start);
    auto bad = [&](const std::string& why) {
      return InvalidArgument(
          "TOKAMAX_LOG='" + std::string(spec) + "': item '" + std::string(item) + "' " + why +
          "; expected category[:level] or level, levels error|warning|info|debug");
    };
    if (item.empty()) throw bad("is empty");
    const size_t colon = item.find(':');
    LogLevel level;
    if (colon == std::string_view::npos) {
      if (parse_level(item, &level)) {
        s.default_level = level;
      } else if (valid_category(item)) {
        s.categories.emplace_back(std::string(item), LogLevel::kInfo);
      } else {
        throw bad("is not a category name");
      }
    } else {
      const std::string_view cat = item.substr(0, colon), lvl = item.substr(colon + 1);
      if (!valid_category(cat)) throw bad("has a bad category name");
      if (!parse_level(lvl, &level)) throw bad("has an unknown level '" + std::string(lvl) + "'");
      if (cat == "*" || cat == "all")
        s.default_level = level;
      else
        s.categories.emplace_back(std::string(cat), level);
    }
    start = end + 1;
  }
  return s;
}

LogLevel LogSettings::level_for(std::string_view category) const {
  for (const auto& [name, level] : categories) {
    if (name == category) return std::max(level, default_level);
  }
  return default_level;
}

bool log_enabled(std::string_view category, LogLevel level) {
  return level <= settings()->level_for(category);
}

void log_message(std::string_view category, LogLevel level, const std::string& message) {
  static const char* kNames[] = {"error", "warning", "info", "debug"};
  std::lock_guard<std::mutex> lock(g_mu);
  std::cerr << "[tokamax:" << kNames[static_cast<int>(level)] << ":" << category << "] " << message
            << "\n";
}

void log_once(std::string_view category, LogLevel level, const std::string& message) {
  if (!log_enabled(category, level)) return;
  static std::mutex mu;
  static std::unordered_set<std::string> seen;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert(std::string(category) + "\n" + message).second) return;
  }
  log_message(category, level, message);
}

void set_log_settings(LogSettings s) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_settings.store(new LogSettings(std::move(s)), std::memory_order_release);
}

}  // namespace tokamax
