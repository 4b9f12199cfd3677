// `tokamax report`'s inputs as the command reads them from disk: the input given at once as a
// bench document (`tokamax bench -o`, or the bare row list of older versions), as an autotuning
// result file and as a trace, and the page built from whichever of them could be used. Numbers
// from the files reach the charts' scales and labels; every string from them reaches the page,
// which must stay well-formed (no markup or entity from a file gets through unescaped).
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz/fuzz_common.h"
#include "report/report.h"
#include "tests/report/xml_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tokamax;
  fuzz::quiet();
  static const int fd = memfd_create("fuzz_report", 0);
  if (fd < 0) __builtin_trap();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    __builtin_trap();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  fuzz::expect_ok_or_invalid([&] {
    const report::Report r = report::build_report({{path}, {path}, {path}}, {"fuzz", "now"});
    if (!testing::xml_problem(r.html).empty()) __builtin_trap();
    // The console summary carries no control character from a file (an escape sequence).
    for (const char c : r.summary) {
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) __builtin_trap();
    }
  });
  return 0;
}
