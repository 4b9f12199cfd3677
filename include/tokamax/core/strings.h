// Small string helpers shared by error messages and the command line.
#pragma once

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

}  // namespace tokamax
TOKAMAX_PUBLIC_END
