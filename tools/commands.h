// Shared pieces of the `tokamax` command's subcommands.
#pragma once

#include <string>
#include <vector>

#include "tokamax/tokamax.h"

namespace tokamax::cli {

// The exit status of every command (README, "Exit status"): 0 success; 1 the work failed
// (nothing, or not everything, was produced: a key none of whose configs ran, a bench row that
// errored, a file that failed verification, a write that failed); 2 bad usage or bad input (an
// unknown option, op or implementation, a malformed or unusable file, an unwritable output).
inline constexpr int kExitSuccess = 0, kExitWorkFailed = 1, kExitBadInput = 2;
// The status for an exception that ended a command: InvalidArgument (and a JSON value of the
// wrong type that escaped a reader) is bad input, anything else work that failed.
int exit_status_of(const std::exception& e);
// After tuning: names the keys none of whose configs succeeded on stderr; kExitWorkFailed if
// there are any.
int report_failed_keys(const AutotuningResult& r);

// Bound arguments for --spec NAME / --tag T / --bound-args FILE (exactly one) of op `op` (empty:
// every op), each bound to `impls` (empty: the family's implementations supported here).
std::vector<BoundArguments> select_bound_args(const std::string& op, const std::string& spec,
                                              const std::string& tag,
                                              const std::string& bound_args_file,
                                              const std::vector<std::string>& impls);

// InvalidArgument unless exactly one of --spec, --tag, --bound-args was given.
// The op a command works on when --op is not given: the family that has the spec named by
// --spec, else the only family; InvalidArgument naming the families when that is ambiguous.
std::string default_op(const std::string& spec);
void check_one_source(const std::string& spec, const std::string& tag,
                      const std::string& bound_args_file);
// The distinct keys of op `op` (empty: every op) in a bound-args file as specs to benchmark
// (other ops and entries this library cannot use are skipped with a warning).
std::vector<ArgSpec> bound_args_specs(const std::string& op, const std::string& bound_args_file);

// What produced a file: this process's command line (shell-quoted, the program as "tokamax")
// and the current time (UTC, ISO 8601), recorded in the files the commands write so that a
// report can say where its inputs came from.
void set_command_line(int argc, char** argv);
std::string command_line();

struct BenchRow {
  std::string spec, implementation, config, rung;
  int samples = 0;  // timed samples behind median_ms, over every round
  double median_ms = 0, iqr_ms = 0, gflops = 0, gbps = 0, pct_of_peak = 0, speedup_vs_baseline = 0;
  // The spec's useful arithmetic and the bytes it must move: their ratio places the row on a
  // roofline chart. bytes_source "cost": the family's count (CallCost); "tensors": it counts
  // none, and these are the call's tensors, each read or written once.
  double flops = 0, bytes = 0;
  std::string bytes_source;
  // The ceiling pct_of_peak is against: GFLOP/s for compute-bound rows (the process's roofline),
  // GB/s for memory-bound ones (a streaming read timed in the same rounds as the row).
  double peak_value = 0;
  std::string peak_kind, baseline;
  // Bytes the call allocated beyond its inputs and outputs (tensor_allocations() around its
  // first run here: its per-call buffers, and per-thread scratch it had to grow).
  int64_t allocated_bytes = 0;
  // "cold": every call after the caches were flushed (a memory-bound call whose data a model
  // would stream from memory); "warm": back to back, as a model calls a small op whose inputs
  // the previous op just wrote.
  std::string cache_state;
};
// How long and how often `tokamax bench` measures each row. The defaults give every row at
// least 5 rounds of 3 samples after 2 warm-up calls; a shape whose call takes seconds (the loss
// at B=4096, V=151,936: 10 s forward, 30 s backward) needs fewer to finish in minutes.
struct BenchOptions {
  double min_time_s = 0.3;  // seconds of measurement per row, over all its rounds
  int rounds = 5;           // interleaved rounds (every row once per round)
  int samples = 3;          // at least this many samples per row and round
  int warmup = 2;           // untimed calls before a row's first round (1 before later rounds)
  // "auto": memory-bound calls that move at least one core's L2 measured cold, the rest warm;
  // "cold" or "warm": every row so.
  std::string cache_state = "auto";
};
std::vector<BenchRow> run_bench(const std::string& op, const std::vector<ArgSpec>& specs,
                                const std::vector<std::string>& impls, const BenchOptions& opts);
// `tokamax bench --json`'s document: the rows, with what a reader needs to judge them alone
// (library version, device, the roofline the rows' percentages are against, command, time).
Json bench_document(const std::vector<BenchRow>& rows);
// What the rows' percentages rest on, for a reader: the ceilings (one line) and every sign
// that the machine was busy or its ceilings differ from the known ones (shipped, last quiet).
std::string ceilings_line(const Roofline& r);
std::vector<std::string> bench_warnings(const Roofline& r);
// After benchmarking: kExitWorkFailed (the failures are named in the rows) if a row errored.
int report_failed_rows(const std::vector<BenchRow>& rows);

// `tokamax autotune-check`: re-tunes each spec `reruns` times (with `noise`, a busy process on
// one core in random on/off phases during the tuning runs), runs an oracle (every candidate,
// `oracle_rounds` interleaved rounds) and reports each run's regret against the oracle's best,
// whether reruns agree, tuning times and the cost model's rank of the oracle's best.
struct CheckOptions {
  std::string op, spec, tag, out_path;
  std::vector<std::string> impls;
  int reruns = 3;
  bool noise = false, json = false;
  int oracle_rounds = 15;
  // The oracle's second stage: the candidates within 4% of its first stage's best, and every
  // run's winner, measured again for this many rounds (0: no second stage).
  int oracle_refine_rounds = 40;
  double oracle_budget_s = 180;
};
int autotune_check(const CheckOptions& options);

// Progress of a long run: a live line on a terminal; otherwise (a log file, CI) the first line,
// then one every `every_s` seconds, and the last one.
class ProgressPrinter {
 public:
  ProgressPrinter(bool live, double every_s);
  void line(const std::string& text, bool final);

 private:
  bool live_;
  double every_s_, last_s_ = -1e300;
};

// `tokamax autotune --store URL --run-id ID`: sharded tuning (tokamax/fleet/sharded.h).
struct FleetArgs {
  std::string store, run_id;
  int rank = -1, world_size = -1;  // -1: from the launcher's variables, else 0 of 1
  double lease_s = 30, deadline_s = 24 * 3600, poll_s = 1;
  double command_timeout_s = 2;  // connecting and each command
  std::string host_lock;         // empty: $TMPDIR/tokamax-measure.lock
};
AutotuningResult autotune_sharded(const std::vector<BoundArguments>& list,
                                  const AutotuneOptions& tune_options, const FleetArgs& args);
// `tokamax cache show|merge|verify --store URL`: the remote cache's entries for this device kind.
int cache_show_store(const std::string& url, const std::string& op, bool json);
int cache_merge_into_store(const std::vector<std::string>& files, const std::string& url);
int cache_verify_store(const std::string& url);

// `tokamax trace extract`: exit status 0 when something was extracted, 1 when nothing could be.
int trace_extract(const std::vector<std::string>& trace_files, const std::string& out_path,
                  const std::string& op, bool json);
// `tokamax trace summary`: op calls grouped by (op, implementation, key, config, rung).
int trace_summary(const std::string& trace_file, bool json);

}  // namespace tokamax::cli
