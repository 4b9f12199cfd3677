// A gzip trace file (.json.gz) as read_trace_file reads it from disk: decompression (truncated
// and corrupt streams, sizes bounded by kMaxInputFileBytes), then extraction; and as the
// streaming readers (extract_bound_args_file, summarize_trace_file) read it.
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  // The gzip magic first, so every input takes the decompressing path.
  static const int fd = memfd_create("fuzz_trace_gzip", 0);
  if (fd < 0) __builtin_trap();
  const uint8_t magic[2] = {0x1f, 0x8b};
  if (ftruncate(fd, 0) != 0 || pwrite(fd, magic, 2, 0) != 2 ||
      pwrite(fd, data, size, 2) != static_cast<ssize_t>(size))
    __builtin_trap();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  fuzz::expect_ok_or_invalid([&] {
    std::vector<std::string> warnings;
    const std::string t = read_trace_file(path, &warnings);
    (void)extract_bound_args(t, path);
  });
  // The same file read as a stream (gunzipped chunk by chunk) by extraction and the summary.
  fuzz::expect_ok_or_invalid([&] { (void)extract_bound_args_file(path); });
  fuzz::expect_ok_or_invalid([&] {
    std::vector<std::string> warnings;
    (void)summarize_trace_file(path, &warnings);
  });
  return 0;
}
