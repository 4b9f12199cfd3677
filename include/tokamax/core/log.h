// Logging with levels and categories, configured by TOKAMAX_LOG, e.g.
//   TOKAMAX_LOG=dispatch,autotune:debug   (dispatch at info, autotune at debug)
//   TOKAMAX_LOG=debug                     (every category at debug)
// Quiet by default except warnings and errors. Messages go to stderr.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

struct LogSettings {
  LogLevel default_level = LogLevel::kWarning;
  std::vector<std::pair<std::string, LogLevel>> categories;
  // Throws InvalidArgument naming the bad item.
  static LogSettings parse(std::string_view spec);
  LogLevel level_for(std::string_view category) const;
};

bool log_enabled(std::string_view category, LogLevel level);
void log_message(std::string_view category, LogLevel level, const std::string& message);
// log_message, the first time this exact message is logged in the process only (a cache miss
// or a stale file is worth one line, not one per call).
void log_once(std::string_view category, LogLevel level, const std::string& message);
// Replaces the settings (tests; tools). Otherwise TOKAMAX_LOG is read on first use.
void set_log_settings(LogSettings settings);

}  // namespace tokamax
TOKAMAX_PUBLIC_END

#define TOKAMAX_LOG(category, level, message_expr)                                  \
  do {                                                                              \
    if (::tokamax::log_enabled(category, ::tokamax::LogLevel::level)) {             \
      ::tokamax::log_message(category, ::tokamax::LogLevel::level, (message_expr)); \
    }                                                                               \
  } while (0)
