// The library's version string (CMake's PROJECT_VERSION), recorded in results, cache files and
// trace payloads. Informational: compatibility is decided by explicit format/schema numbers.
#pragma once

#include <string>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

std::string library_version();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
