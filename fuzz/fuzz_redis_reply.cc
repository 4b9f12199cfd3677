// The Redis store's reply path, fed by a fake store that sends the input as its replies: the
// bytes go into one end of a socketpair, and the store (src/fleet/redis_store.cc) reads them from
// the other as from a server, through its own code path: the wait, the scanner of length headers,
// hiredis's reader, then each operation's reading of the reply. The handshake (INFO) comes
// first, then a fixed series of operations, each reading the next reply from the stream; the
// stream's end fails the rest at once (a store on a given socket does not re-open it), so no
// input waits on a timeout.
//
// The outcomes a reply may have besides success are StoreError (a reply that is not RESP, or of
// another type than the command's: an outage) and InvalidArgument (StoreKeyError: a key's value
// refused). The limits are small (values of 4 KiB, replies of 16 KiB) so that inputs reach them;
// a value read past them is a finding.
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz/fuzz_common.h"
#include "src/fleet/redis_store.h"

namespace {

constexpr int64_t kMaxValue = 4096;

template <class Fn>
void one(Fn fn) {
  try {
    fn();
  } catch (const tokamax::StoreError&) {
  } catch (const tokamax::InvalidArgument&) {
  }
}

void check_value(const std::optional<std::string>& v) {
  if (v && static_cast<int64_t>(v->size()) > kMaxValue) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  int sv[2];
  // Failing here would be running out of descriptors: the store leaking its socket, a finding.
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) __builtin_trap();
  // Room for the whole input (libFuzzer's -max_len is 64 KiB here) and the commands sent back.
  const int room = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = send(sv[1], data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;  // what fits is the input
    sent += static_cast<size_t>(n);
  }
  shutdown(sv[1], SHUT_WR);
  StoreOptions o;
  o.connect_timeout_s = 10;  // never reached: every byte is there, then the end of the stream
  o.command_timeout_s = 10;
  o.max_value_bytes = kMaxValue;
  o.max_reply_bytes = 4 * kMaxValue;
  std::unique_ptr<Store> s;  // sv[0] is the store's from here on, closed by it even on failure
  one([&] { s = open_redis_store_on_fd(sv[0], "fuzz", o); });
  if (s) {
    one([&] { check_value(s->get("k")); });
    one([&] { check_value(s->hash_get("h", "f")); });
    one([&] {
      for (const auto& [f, v] : s->hash_get_all("h").values) {
        if (static_cast<int64_t>(f.size() + v.size()) > 2 * kMaxValue) __builtin_trap();
      }
    });
    one([&] { s->keys("tokamax:*"); });
    one([&] { s->increment("n"); });
    one([&] { s->claim("lease", "token", 1000, "list", "0"); });
    one([&] { s->hash_random_fields("h", 4); });
    one([&] { s->set_if_absent("k", "v", 1000); });
    one([&] { s->renew_if_equal("lease", "token", 1000); });
    one([&] { s->hash_fields("h"); });
    one([&] { s->hash_len("h"); });
    one([&] { s->exists("k"); });
    one([&] { s->hash_set("h", "f", "v"); });
  }
  close(sv[1]);
  return 0;
}
