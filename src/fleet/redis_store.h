// The Redis store (hiredis), behind open_store (tokamax/fleet/store.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tokamax/fleet/store.h"

namespace tokamax {

// Connects to u (SELECT u.db): StoreError naming the URL when it cannot within the timeout.
std::unique_ptr<Store> open_redis_store(const StoreUrl& u, const StoreOptions& options);

// The same store on a socket already connected to a server (taken over: closed with the store,
// or by this call when it fails), named `name` in messages: the handshake is made on it within
// options.connect_timeout_s, and a connection lost is not re-opened (every later command fails).
// For tests and the fuzzer (fuzz/fuzz_redis_reply.cc), which feed it replies through a
// socketpair.
std::unique_ptr<Store> open_redis_store_on_fd(int fd, const std::string& name,
                                              const StoreOptions& options);

// A host name's numeric address (the first IPv4 or IPv6 one `lookup` gives), resolved within
// `timeout_s`: getaddrinfo has no timeout of its own (a dead DNS server holds it for tens of
// seconds), so a name runs on a thread of its own and the caller waits only until its bound,
// then gets StoreError (the thread is left to finish and discard its answer). A numeric address
// is returned as given, without a thread. `lookup` is getaddrinfo's stand-in for tests: it
// returns the numeric address or throws StoreError.
using HostLookup = std::function<std::string(const std::string& host)>;
std::string resolve_host(const std::string& host, double timeout_s,
                         const HostLookup& lookup = nullptr);

}  // namespace tokamax
