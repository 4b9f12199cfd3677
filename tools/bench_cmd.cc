// `tokamax bench`: measures implementations side by side on named specs, with the ratio to the
// fastest other implementation measured in the same rounds and the percentage of the ceilings.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <new>
#include <set>

#include "tools/commands.h"

namespace tokamax::cli {

namespace {

// A bound-args file (`tokamax trace extract`'s output). Entries this library cannot use (an op
// of a newer version, say) are skipped with a warning, not fatal.
std::vector<BoundArguments> load_bound_args_file(const std::string& file) {
  std::vector<std::string> skipped;
  std::vector<BoundArguments> list =
      BoundArguments::loads_list(read_file(file), "'" + file + "'", &skipped);
  for (const auto& why : skipped) fmt::print(stderr, "warning: skipped {}\n", why);
  if (list.empty()) throw InvalidArgument("'" + file + "': no usable bound arguments");
  return list;
}

// The bytes a spec's call allocates: its tensor arguments and its outputs (the inputs alone
// when the outputs' specs cannot be worked out).
int64_t spec_bytes(const OpFamily& fam, const Json& arguments) {
  int64_t bytes = 0;
  for (const ShapeDtype& a : array_arguments(arguments)) bytes += a.bytes();
  try {
    for (const ShapeDtype& o : fam.output_specs_json(arguments)) bytes += o.bytes();
  } catch (const std::exception&) {
  }
  return bytes;
}

// A spec whose tensors this machine cannot allocate. Specs from a file are bounded per tensor
// (kMaxSpecElements), but one made on a bigger machine can still be too large for this one;
// its rows say so with the bytes it needs, not as a bare std::bad_alloc ending the run.
class SpecAllocationError : public Error {
 public:
  SpecAllocationError(const std::string& spec, int64_t bytes)
      : Error(fmt::format(
            "cannot allocate the tensors of spec '{}': they need {} bytes ({:.1f} GiB, inputs "
            "and outputs), this machine has {:.1f} GiB of memory",
            spec, bytes, static_cast<double>(bytes) / (1 << 30), memory_gib())) {}

 private:
  static double memory_gib() {
    return static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
           static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30);
  }
};

// The call of spec `spec` with `arguments`: its inputs allocated and filled, its outputs
// allocated. SpecAllocationError when they do not fit in memory.
std::unique_ptr<CallBase> make_spec_call(const OpFamily& fam, const std::string& spec,
                                         const Json& arguments) {
  try {
    return fam.make_call(fam.bind_json(arguments, ""), 0);
  } catch (const std::bad_alloc&) {
    throw SpecAllocationError(spec, spec_bytes(fam, arguments));
  }
}

}  // namespace

std::string default_op(const std::string& spec) {
  std::vector<std::string> names, with_spec;
  for (const auto& f : families()) {
    names.push_back(f->name());
    for (const ArgSpec& s : f->arg_specs()) {
      if (s.name == spec) with_spec.push_back(f->name());
    }
  }
  if (with_spec.size() == 1) return with_spec[0];
  if (!spec.empty() && with_spec.empty()) find_arg_specs("", spec);  // unknown spec: names all
  if (names.size() == 1) return names[0];
  throw InvalidArgument("give --op: one of " + join(names, ", "));
}

void check_one_source(const std::string& spec, const std::string& tag, const std::string& file) {
  if (!spec.empty() + !tag.empty() + !file.empty() != 1)
    throw InvalidArgument("give exactly one of --spec, --tag, --bound-args");
}

std::vector<ArgSpec> bound_args_specs(const std::string& op, const std::string& file) {
  if (!op.empty()) find_family(op);  // an unknown --op is named as such
  std::vector<ArgSpec> out;
  std::set<std::string> keys;
  for (const BoundArguments& b : load_bound_args_file(file)) {
    if (!op.empty() && b.family() != op) {
      fmt::print(stderr, "warning: skipped an entry of op '{}' (benchmarking '{}')\n", b.family(),
                 op);
      continue;
    }
    // One set of rows per key, whichever implementation the trace named.
    if (!keys.insert(b.key()).second) continue;
    // Named by position and the tensor arguments ("#2 f32[64,2880] x f32[32,2880,2880]").
    std::string name = fmt::format("#{}", out.size());
    const char* sep = " ";
    for (const ShapeDtype& a : array_arguments(b.arguments())) {
      name += sep + a.str();
      sep = " x ";
    }
    out.push_back(ArgSpec{b.family(), name, b.arguments(), {}});
  }
  if (out.empty()) {
    throw InvalidArgument("'" + file + "': no bound arguments" +
                          (op.empty() ? std::string() : " of op '" + op + "'"));
  }
  return out;
}

std::vector<BoundArguments> select_bound_args(const std::string& op, const std::string& spec,
                                              const std::string& tag, const std::string& file,
                                              const std::vector<std::string>& impls) {
  check_one_source(spec, tag, file);
  std::vector<BoundArguments> base;
  if (!file.empty()) {
    base = load_bound_args_file(file);
  } else {
    for (const ArgSpec& s : find_arg_specs(op, spec, tag))
      base.push_back(find_family(s.family).bind_json(s.arguments, ""));
    if (base.empty()) {
      throw InvalidArgument("no spec" + (op.empty() ? std::string() : " of op '" + op + "'") +
                            " has tag '" + tag + "'");
    }
  }
  std::vector<BoundArguments> out;
  for (const BoundArguments& b : base) {
    const OpFamily& f = find_family(b.family());
    if (!impls.empty()) {
      for (const auto& i : impls) {
        f.implementation(i);
        out.push_back(b.with_implementation(i));
      }
    } else if (!b.implementation().empty()) {
      out.push_back(b);
    } else {
      for (const auto& i : f.implementations()) {
        if (i->supported_on(device_info())) out.push_back(b.with_implementation(i->name()));
      }
    }
  }
  return out;
}

namespace {

// A bench row name: IMPL[:VARIANT][:heuristics]. A variant is one of the family's argument
// variants (ragged_dot's ":packed" measures the call with weights packed ahead: pack_rhs, its
// own key); ":heuristics" pins the implementation's heuristics config.
struct RowVariant {
  std::string implementation;
  std::string variant;  // "" = the spec as given
  Json overlay;         // the variant's arguments
  bool heuristics = false;
  static RowVariant parse(const OpFamily& fam, const std::string& name) {
    const auto variants = fam.argument_variants();
    RowVariant v;
    size_t pos = name.find(':');
    v.implementation = name.substr(0, pos);
    while (pos != std::string::npos) {
      const size_t next = name.find(':', pos + 1);
      const std::string tok =
          name.substr(pos + 1, next == std::string::npos ? next : next - pos - 1);
      bool known = tok == "heuristics";
      v.heuristics = v.heuristics || known;
      for (const auto& [vname, args] : variants) {
        if (tok == vname && v.variant.empty()) {
          v.variant = vname;
          v.overlay = args;
          known = true;
        }
      }
      if (!known) {
        std::string forms = "IMPL, IMPL:heuristics";
        for (const auto& [vname, args] : variants)
          forms += ", IMPL:" + vname + ", IMPL:" + vname + ":heuristics";
        throw InvalidArgument("bench --impl " + name + ": expected " + forms);
      }
      pos = next;
    }
    return v;
  }
};

// Bounded so that a typo cannot run for days: 1000 of each, an hour of measuring a row.
void check_bench_options(const BenchOptions& opts) {
  if (opts.cache_state != "auto" && opts.cache_state != "cold" && opts.cache_state != "warm")
    throw InvalidArgument("bench: --cache-state '" + opts.cache_state +
                          "'; expected auto, cold or warm");
  constexpr int kMaxCount = 1000;
  constexpr double kMaxSeconds = 3600;
  if (opts.rounds < 1 || opts.rounds > kMaxCount || opts.samples < 1 || opts.samples > kMaxCount ||
      opts.warmup < 0 || opts.warmup > kMaxCount ||
      !(opts.min_time_s >= 0 && opts.min_time_s <= kMaxSeconds))
    throw InvalidArgument(fmt::format(
        "bench: --rounds {} and --samples {} must be in [1, {}], --warmup {} in [0, {}] and "
        "--min-time {} in [0, {}] seconds",
        opts.rounds, opts.samples, kMaxCount, opts.warmup, kMaxCount, opts.min_time_s,
        kMaxSeconds));
}

// Unknown op and implementation names are bad usage, said before any measuring (they were
// error rows of a run that exited 0).
void check_row_names(const std::string& op, const std::vector<ArgSpec>& specs,
                     const std::vector<std::string>& impls) {
  if (!op.empty()) find_family(op);
  for (const ArgSpec& s : specs) {
    const OpFamily& fam = find_family(s.family);
    for (const std::string& name : impls)
      fam.implementation(RowVariant::parse(fam, name).implementation);
  }
}

TimingOptions round_timing(const BenchOptions& opts, int round) {
  TimingOptions t;
  t.warmup = round == 0 ? opts.warmup : std::min(opts.warmup, 1);
  t.min_time_s = opts.min_time_s / opts.rounds;
  t.min_samples = opts.samples;
  t.max_time_s = std::max(2.0, opts.min_time_s);
  return t;
}

// One row's implementation, prepared before any measuring (nullptr impl: the row errored).
struct Runner {
  std::shared_ptr<const Implementation> impl;
  CallBase* call = nullptr;
  Config config;
  bool bf16_dot = false;  // its ceiling is the bf16 dot's (else the f32 FMA's)
  std::shared_ptr<const Prepared> prepared;
  std::vector<double> samples;
};

// Each row against the fastest row of another implementation in the same rounds (for native
// rows: the better of blas and the reference loops), named in the row.
void set_baselines(std::vector<BenchRow>& rows) {
  for (auto& r : rows) {
    const std::string impl = r.implementation.substr(0, r.implementation.find(':'));
    const BenchRow* base = nullptr;
    for (const auto& o : rows) {
      if (o.median_ms <= 0 || o.implementation.substr(0, o.implementation.find(':')) == impl)
        continue;
      if (!base || o.median_ms < base->median_ms) base = &o;
    }
    r.baseline = base ? base->implementation : "";
    r.speedup_vs_baseline = base && r.median_ms > 0 ? base->median_ms / r.median_ms : 0;
  }
}

// The rows of one spec. Every implementation is prepared first, then measured interleaved in
// rounds, so that drift in the machine's state (a noisy VM) hits all of them alike.
class SpecBench {
 public:
  SpecBench(const ArgSpec& s, const Roofline& roof)
      : spec_(s),
        fam_(find_family(s.family)),
        call_(make_spec_call(fam_, s.name, s.arguments)),
        cost_(fam_.cost(*call_)),
        mem_(fam_.memory_bound(*call_)),
        roof_(roof) {}

  std::vector<BenchRow> run(const std::vector<std::string>& impls_in, const BenchOptions& opts,
                            ReadProbe& probe);

 private:
  // Resolves and prepares row `name`; a row that cannot run keeps its error as its rung.
  void prepare(const std::string& name);

  // The same call as an argument variant (same seed: same values), made once, on demand.
  CallBase* variant_call(const RowVariant& v);

  // Row i errored: it says why and is not run again.
  void fail(size_t i, const std::exception& e);

  // One untimed run each, counting what it allocates (the outputs already exist).
  void run_untimed();

  // The interleaved rounds; returns the memory ceiling in GB/s, the probe's when it ran in them.
  double measure(const BenchOptions& opts, ReadProbe& probe);

  // Each measured row's figures, its percentage against `read_gbps` for memory-bound specs.
  void set_stats(double read_gbps);

  const ArgSpec& spec_;
  const OpFamily& fam_;
  std::unique_ptr<CallBase> call_;
  std::map<std::string, std::unique_ptr<CallBase>> variant_calls_;  // by variant name
  const CallCost cost_;
  const bool mem_;
  bool cold_ = false;  // measured after a cache flush (BenchOptions::cache_state)
  const Roofline& roof_;
  std::vector<BenchRow> rows_;
  std::vector<Runner> runners_;  // one per row, in the same order
};

std::vector<BenchRow> SpecBench::run(const std::vector<std::string>& impls_in,
                                     const BenchOptions& opts, ReadProbe& probe) {
  const std::vector<std::string> impls = impls_in.empty() ? fam_.bench_rows(*call_) : impls_in;
  // A small op's inputs were just written by the op before it: a model calls it warm, and a
  // flush before every call once timed a 33 x 77 layer_norm at 0.5 ms (the workers' wake-up
  // and DRAM latency, not the kernel). What moves at least one core's L2 streams from memory.
  cold_ = opts.cache_state == "cold" || (opts.cache_state == "auto" && measured_cold(fam_, *call_));
  for (const std::string& name : impls) prepare(name);
  run_untimed();
  const double read_gbps = measure(opts, probe);
  set_stats(read_gbps);
  set_baselines(rows_);
  return rows_;
}

void SpecBench::prepare(const std::string& name) {
  BenchRow r;
  r.spec = spec_.name;
  r.implementation = name;
  Runner run;
  try {
    const RowVariant v = RowVariant::parse(fam_, name);
    run.impl = fam_.implementation(v.implementation);
    run.call = v.variant.empty() ? call_.get() : variant_call(v);
    run.bf16_dot = fam_.cost(*run.call).bf16_dot && roof_.bf16_gflops_all > 0;
    run.impl->validate(*run.call);
    const Resolution res = v.heuristics ? Resolution{run.impl->heuristics_config(*run.call),
                                                     Rung::kHeuristics, "pinned"}
                                        : resolve_config(fam_, *run.impl, *run.call, std::nullopt);
    run.config = res.config;
    r.config = res.config.str();
    r.rung = std::string(rung_name(res.rung));
    // Preparation is what a program does once; an unpacked call packs inside its own time.
    run.prepared = run.impl->prepare(*run.call, res.config);
  } catch (const std::exception& e) {
    r.rung = std::string("error: ") + e.what();
    run.impl = nullptr;
  }
  rows_.push_back(r);
  runners_.push_back(std::move(run));
}

CallBase* SpecBench::variant_call(const RowVariant& v) {
  auto& vc = variant_calls_[v.variant];
  if (!vc) {
    Json args = spec_.arguments;
    args.update(v.overlay);
    vc = make_spec_call(fam_, spec_.name + " (" + v.variant + ")", args);
  }
  return vc.get();
}

void SpecBench::fail(size_t i, const std::exception& e) {
  rows_[i].rung = std::string("error: ") + e.what();
  runners_[i].impl = nullptr;
}

void SpecBench::run_untimed() {
  for (size_t i = 0; i < runners_.size(); ++i) {
    Runner& run = runners_[i];
    if (!run.impl) continue;
    try {
      const TensorAllocations before = tensor_allocations();
      run.impl->run(*run.call, run.config, run.prepared.get());
      rows_[i].allocated_bytes = tensor_allocations().bytes - before.bytes;
    } catch (const std::exception& e) {
      fail(i, e);
    }
  }
}

double SpecBench::measure(const BenchOptions& opts, ReadProbe& probe) {
  const bool probing = cold_ && probe.available();
  std::vector<double> probe_samples;
  for (int round = 0; round < opts.rounds; ++round) {
    if (probing) {
      TimingOptions t = round_timing(opts, round);
      t.warmup = round == 0 ? 1 : 0;  // its buffer defeats the caches on its own
      const SampleStats st =
          time_callable([&] { cost_.read_write ? probe.run_copy_pass() : probe.run_pass(); }, t);
      probe_samples.insert(probe_samples.end(), st.samples_ms.begin(), st.samples_ms.end());
    }
    for (size_t i = 0; i < runners_.size(); ++i) {
      Runner& run = runners_[i];
      if (!run.impl) continue;
      TimingOptions t = round_timing(opts, round);
      t.cold_cache = cold_;
      try {
        const SampleStats st =
            time_callable([&] { run.impl->run(*run.call, run.config, run.prepared.get()); }, t);
        run.samples.insert(run.samples.end(), st.samples_ms.begin(), st.samples_ms.end());
      } catch (const std::exception& e) {
        fail(i, e);
      }
    }
  }
  if (!probing) return cost_.read_write ? roof_.copy_gbps_all : roof_.read_gbps_all;
  // A copy pass moves its buffer's bytes twice (read and written).
  const double probe_bytes = probe.bytes_per_pass() * (cost_.read_write ? 2 : 1);
  return probe_bytes / (SampleStats::of(probe_samples).median_ms * 1e-3) / 1e9;
}

void SpecBench::set_stats(double read_gbps) {
  for (size_t i = 0; i < runners_.size(); ++i) {
    if (!runners_[i].impl) continue;
    BenchRow& r = rows_[i];
    const SampleStats st = SampleStats::of(runners_[i].samples);
    r.median_ms = st.median_ms;
    r.iqr_ms = st.iqr_ms();
    r.samples = static_cast<int>(runners_[i].samples.size());
    r.flops = cost_.flops;
    r.bytes = cost_.bytes > 0 ? cost_.bytes : call_tensor_bytes(*runners_[i].call);
    r.bytes_source = cost_.bytes > 0 ? "cost" : "tensors";
    r.gflops = cost_.flops / (st.median_ms * 1e-3) / 1e9;
    r.gbps = cost_.bytes / (st.median_ms * 1e-3) / 1e9;
    r.cache_state = cold_ ? "cold" : "warm";
    if (mem_ && !cold_) {
      // Its bytes come from the caches: no memory ceiling applies.
      r.peak_kind = "";
      r.peak_value = 0;
    } else if (mem_) {
      r.peak_kind = cost_.read_write ? "mem_copy" : "mem_read";
      r.peak_value = read_gbps;
    } else {
      const bool bf16_dot = runners_[i].bf16_dot;
      r.peak_kind = !bf16_dot ? "f32_fma" : roof_.bf16_dot_unit == "amx" ? "bf16_amx" : "bf16_dot";
      r.peak_value = bf16_dot ? roof_.bf16_gflops_all : roof_.f32_gflops_all;
    }
    const double achieved = mem_ ? r.gbps : r.gflops;
    r.pct_of_peak = r.peak_value > 0 ? 100 * achieved / r.peak_value : 0;
  }
}

}  // namespace

std::vector<BenchRow> run_bench(const std::string& op, const std::vector<ArgSpec>& specs,
                                const std::vector<std::string>& impls, const BenchOptions& opts) {
  check_bench_options(opts);
  check_row_names(op, specs, impls);
  // Each row's config source is in its row ("(heuristics)" for a miss), and a composed row's
  // inner op calls are its implementation's business: no miss warnings on top.
  QuietMissesScope quiet;
  // The read ceiling for memory-bound specs is timed in the same rounds as their rows (below);
  // the process-wide roofline figure can be minutes old, and this machine's bandwidth is not
  // steady over minutes. The probe exists before the roofline is measured, which then streams
  // the same buffers: first touching them took most of a run's time (a smoke spec: 79 s, 69 of
  // them in the kernel zeroing pages, on a VM reporting a 480 MiB L3).
  const auto probe = std::make_unique<ReadProbe>(num_threads());  // clamped to the pool
  const Roofline& roof = cached_roofline();
  std::vector<BenchRow> rows;
  for (const ArgSpec& s : specs) {
    std::vector<BenchRow> these;
    try {
      these = SpecBench(s, roof).run(impls, opts, *probe);
    } catch (const SpecAllocationError& e) {
      // As a row that cannot run: an error row (per implementation asked for; the default
      // rows cannot be named without the call), and on to the next spec.
      for (const std::string& impl : impls.empty() ? std::vector<std::string>{"-"} : impls) {
        BenchRow r;
        r.spec = s.name;
        r.implementation = impl;
        r.rung = std::string("error: ") + e.what();
        these.push_back(r);
      }
    }
    rows.insert(rows.end(), these.begin(), these.end());
  }
  return rows;
}

std::string ceilings_line(const Roofline& r) {
  std::string s =
      fmt::format("ceilings ({} threads): f32 FMA {:.1f} GFLOP/s", r.threads, r.f32_gflops_all);
  if (r.bf16_gflops_all > 0)
    s += fmt::format(", bf16 dot {:.1f} GFLOP/s ({})", r.bf16_gflops_all, r.bf16_dot_unit);
  s += fmt::format(
      "; cold memory-bound rows: read or copy timed in their rounds (now {:.0f} / {:.0f} GB/s)",
      r.read_gbps_all, r.copy_gbps_all);
  return s;
}

std::vector<std::string> bench_warnings(const Roofline& r) {
  std::vector<std::string> w = r.warnings;
  for (std::string& x : compare_with_known_ceilings(r)) w.push_back(std::move(x));
  return w;
}

Json bench_document(const std::vector<BenchRow>& rows) {
  Json arr = Json::array();
  for (const auto& r : rows) {
    arr.push_back({{"spec", r.spec},
                   {"implementation", r.implementation},
                   {"config", r.config},
                   {"config_source", r.rung},
                   {"median_ms", r.median_ms},
                   {"iqr_ms", r.iqr_ms},
                   {"samples", r.samples},
                   {"flops", r.flops},
                   {"bytes", r.bytes},
                   {"bytes_source", r.bytes_source},
                   {"arithmetic_intensity", r.bytes > 0 ? r.flops / r.bytes : 0.0},
                   {"gflops", r.gflops},
                   {"gbps", r.gbps},
                   {"pct_of_peak", r.pct_of_peak},
                   {"peak", r.peak_kind},
                   {"peak_value", r.peak_value},
                   {"baseline", r.baseline},
                   {"speedup_vs_baseline", r.speedup_vs_baseline},
                   {"allocated_bytes", r.allocated_bytes},
                   {"cache_state", r.cache_state}});
  }
  return {{"tokamax_version", library_version()},
          {"device_kind", device_kind()},
          {"device", device_info().to_json()},
          {"blas", blas_info().to_json()},
          {"roofline", cached_roofline().to_json()},
          {"warnings", bench_warnings(cached_roofline())},
          {"command", command_line()},
          {"created", utc_now()},
          {"rows", arr}};
}

}  // namespace tokamax::cli
