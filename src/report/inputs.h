// The report's inputs as the page reads them (internal to src/report): each file given to
// `tokamax report` loaded into the figures the page shows, leniently, so that a file that cannot
// be used is skipped and named and the rest still renders.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "report/report.h"
#include "tokamax/tokamax.h"

namespace tokamax::report::internal {

struct ResultInput {
  std::string path;
  AutotuningResult result;
  std::string command, created;  // empty when the file does not say (library-written files)
};

struct BenchRowIn {
  std::string spec, implementation, config, source, peak, baseline, bytes_source;
  std::string cache_state;  // "warm", "cold", or "" (not said: files before the field)
  double median_ms = 0, iqr_ms = 0, flops = 0, bytes = 0, gflops = 0, gbps = 0, pct = 0;
  double peak_value = 0, speedup = 0;
  int64_t allocated = 0;
  bool measured() const { return median_ms > 0; }
  // Where the row goes on the roofline chart; 0 when it cannot be placed (no FLOP count).
  double intensity() const { return bytes > 0 && flops > 0 ? flops / bytes : 0; }
  bool plotted() const { return measured() && intensity() > 0 && gflops > 0; }
};

struct Ceilings {
  double f32 = 0, bf16 = 0, read = 0, copy = 0;  // GFLOP/s, GFLOP/s, GB/s, GB/s (all threads)
  std::string bf16_unit;  // "amx" (tiles), "avx512_bf16" (vdpbf16ps) or "" (not said)
  int threads = 0;
  bool from_rows = false;  // an older bench file: the ceilings its rows were compared against
};

struct BenchInput {
  std::string path, command, created, version, device_kind, model;
  Ceilings ceilings;
  // The machine's state while it ran, as the bench command judged it: "warnings" (a busy
  // machine, ceilings that disagree with the shipped or last measured ones) and the roofline's
  // "busy". Files before these fields say neither.
  std::vector<std::string> warnings;
  bool busy = false;
  std::vector<BenchRowIn> rows;
};

struct TraceInput {
  std::string path, device_kind;
  std::vector<TraceCallGroup> groups;
  std::vector<std::string> warnings;  // events left out (TraceSummary::warnings)
};

struct Loaded {
  std::vector<ResultInput> results;
  std::vector<BenchInput> benches;
  std::vector<TraceInput> traces;
  std::vector<std::pair<std::string, std::string>> skipped;  // path, why
};

// Every input that can be used; the others in `skipped`, with why.
Loaded load_all(const Inputs& in);

}  // namespace tokamax::report::internal
