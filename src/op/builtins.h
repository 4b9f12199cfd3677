// The library's built-in parts that register with the framework: its op families
// (src/ops/registry.cc) and the ladder's rungs from the autotuning layer (scope, disk cache,
// autotune on miss). They are wired by explicit calls on first use of the registry or of
// dispatch, not by static initializers: a static link drops an object file that nothing
// references, and its initializers with it.
#pragma once

namespace tokamax {

class TuningBackend;

// Registers every built-in family and installs the autotuning backend, once per process;
// cheap after the first call (std::call_once's fast path).
void ensure_builtins();

// The list itself (src/ops/registry.cc), called once by ensure_builtins.
void register_builtin_families();

// src/autotuning/autotuner.cc: installs the autotuning layer's backend through
// set_builtin_tuning_backend (src/op/dispatch.cc), which, unlike the public
// set_tuning_backend, does not itself wait for ensure_builtins.
void install_autotuning_backend();
// src/fleet/remote_cache.cc: installs the fleet's remote cache as the ladder's remote rung
// (autotuning/remote_rung.h), keeping the autotuning layer free of includes from the fleet's.
void install_remote_rung();
// src/trace/trace.cc: starts recording into TOKAMAX_TRACE's file (when it is set) before the
// first op call. That file's static initializer does so where the library is loaded whole (the
// shared library); a static link drops the file and its initializers when nothing references it
// (the Python module's), so ensure_builtins calls this as well.
void start_env_trace();
void set_builtin_tuning_backend(const TuningBackend* backend);

}  // namespace tokamax
