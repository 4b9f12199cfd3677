// The trace recorder: every op call becomes a Chrome Trace Event Format "complete" event
// ("ph": "X"; name "family/implementation"; ts/dur in microseconds; pid; tid) whose args hold
// the call's payload, "tokamax:{bound arguments + chosen config + ladder rung}" (see
// call_payload in tokamax/op/dispatch.h). Perfetto UI and chrome://tracing load the file; a
// profile of a real run is thus the input of offline tuning (`tokamax trace extract`).
//
// Recording is on while a TraceSession lives, or for the whole process when TOKAMAX_TRACE=path
// is set at start-up ("%p" in the path becomes the process id). Events from every thread go to
// every live session. A session streams into a temporary file next to its path and renames it
// into place, complete, when it ends (the environment's session: at finish_env_trace or normal
// exit, and only if an op was called; a failure at exit is said on stderr), so a reader never
// sees a half-written trace under the final name. A process
// that dies instead leaves "<path>.tmp.<pid>.<n>", flushed at least every 100 ms: `tokamax trace
// extract` reads it (the complete events are kept).
// After fork(), the child records nothing into its parent's sessions (nor writes their files);
// with TOKAMAX_TRACE it starts its own trace (use %p for a file per process).
// With recording off, an op call pays one relaxed atomic load (bench/trace_bench.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

class TraceSession {
 public:
  // InvalidArgument when the temporary file next to `path` cannot be created.
  explicit TraceSession(std::string path);
  ~TraceSession();  // close(); an I/O error is logged
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // Stops recording and writes the complete file. Idempotent. Error on an I/O failure.
  void close();
  const std::string& path() const { return path_; }
  int64_t num_events() const;  // op events recorded so far

 private:
  std::string path_;
  std::shared_ptr<class TraceWriter> writer_;
};

// Completes the TOKAMAX_TRACE file now, as is otherwise done at exit, and stops recording into
// it (later calls are not traced). A program calls this after its work to learn whether its
// trace was written: at exit the library can only say so on stderr, not change the exit status.
// Error naming the path and why when the trace could not be written, or its file could not be
// created at the first op call (not said again at exit then). Does nothing when TOKAMAX_TRACE is
// not set or no op was called; a second call says what the first did.
void finish_env_trace();

// Whether any session (or TOKAMAX_TRACE) is recording.
bool tracing_enabled();
// The path TOKAMAX_TRACE named at start-up, with %p substituted ("" when unset).
std::string env_trace_path();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
