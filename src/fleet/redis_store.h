// The Redis store (hiredis), behind open_store (tokamax/fleet/store.h).
#pragma once

#include <memory>

#include "tokamax/fleet/store.h"

namespace tokamax {

// Connects to u (SELECT u.db): StoreError naming the URL when it cannot within the timeout.
std::unique_ptr<Store> open_redis_store(const StoreUrl& u, const StoreOptions& options);

}  // namespace tokamax
