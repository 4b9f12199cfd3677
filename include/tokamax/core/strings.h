// Small string helpers shared by error messages, files' "created" fields and the command line.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.append(sep);
    out.append(parts[i]);
  }
  return out;
}

// The current UTC time as "2026-12-07T21:40:00Z" (the "created" and "measured" of files).
inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace tokamax
TOKAMAX_PUBLIC_END
