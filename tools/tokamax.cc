// The `tokamax` command: device, ops, specs, autotune, explain, cache, bench, trace, report.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>

#include "report/report.h"
#include "tools/commands.h"

namespace tokamax::cli {
namespace {
std::string g_command_line = "tokamax";
}  // namespace

void set_command_line(int argc, char** argv) {
  g_command_line = "tokamax";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    // Quoted for a POSIX shell when it holds anything but plain word characters.
    const bool plain = !arg.empty() && arg.find_first_not_of(
                                           "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                           "0123456789-_=./,:@%+") == std::string::npos;
    if (plain) {
      g_command_line += " " + arg;
      continue;
    }
    std::string q = "'";
    for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    g_command_line += " " + q + "'";
  }
}

std::string command_line() { return g_command_line; }

}  // namespace tokamax::cli

namespace tk = tokamax;
using tk::Json;

namespace {

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size() && !s.empty()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// (implementation, path) of the cache files that exist for this device kind, shipped before
// user, for op `op` (empty: every op).
std::vector<std::pair<std::string, std::string>> existing_cache_files(const std::string& op) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : tk::families()) {
    if (!op.empty() && f->name() != op) continue;
    for (const auto& name : f->implementation_names()) {
      for (const std::string& dir : {tk::shipped_cache_dir(), tk::user_cache_dir()}) {
        const std::string path = tk::cache_file_path(dir, tk::device_kind(), f->name(), name);
        if (std::filesystem::exists(path)) out.emplace_back(name, path);
      }
    }
  }
  return out;
}

void print_device(bool json, bool roofline) {
  const tk::DeviceInfo& d = tk::device_info();
  Json j = d.to_json();
  const tk::BlasInfo blas = tk::blas_info();
  j["blas"] = blas.to_json();
  j["kernels"] = tk::kernel_set();
  std::vector<std::string> warnings;
  if (roofline) {
    // Two measurements (the larger of each ceiling), checked for the signs of a busy machine
    // and against the known ceilings, then remembered when quiet.
    const tk::Roofline& r = tk::cached_roofline();
    j["roofline"] = r.to_json();
    warnings = tk::cli::bench_warnings(r);
    j["warnings"] = warnings;
    tk::remember_ceilings(r);
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return;
  }
  fmt::print("device kind:   {}\n", tk::device_kind());
  fmt::print("model:         {} ({}, family {:#x} model {:#x})\n", d.model_name, d.vendor, d.family,
             d.model);
  fmt::print("microarch:     {}\n", d.microarch);
  std::string isa;
  for (const auto& [k, v] : j["isa"].items()) {
    if (v.get<bool>()) isa += k + " ";
  }
  fmt::print("isa:           {}\n", isa);
  fmt::print("caches:        L1d {} KiB, L2 {} KiB, L3 {} MiB\n", d.l1d_bytes >> 10,
             d.l2_bytes >> 10, d.l3_bytes >> 20);
  fmt::print("cores:         {} physical, {} threads available, tokamax uses {}\n",
             d.physical_cores, d.threads_available, tk::num_threads());
  fmt::print("kernels:       {}{}\n", tk::kernel_set(),
             std::getenv("TOKAMAX_ISA") ? " (capped by TOKAMAX_ISA)" : "");
  fmt::print("baselines:     {}\n", blas.str());
  if (roofline) {
    const Json& r = j["roofline"];
    fmt::print("roofline ({} threads = all):\n", r["threads"].get<int>());
    fmt::print("  f32 FMA:     {:8.1f} GFLOP/s 1 core, {:8.1f} all\n",
               r["f32_fma_gflops_1core"].get<double>(), r["f32_fma_gflops_all"].get<double>());
    fmt::print("  bf16 dot:    {:8.1f} GFLOP/s 1 core, {:8.1f} all ({})\n",
               r["bf16_dot_gflops_1core"].get<double>(), r["bf16_dot_gflops_all"].get<double>(),
               r.value("bf16_dot_unit", std::string("none")));
    fmt::print("  mem read:    {:8.1f} GB/s 1 core, {:8.1f} all\n",
               r["mem_read_gbps_1core"].get<double>(), r["mem_read_gbps_all"].get<double>());
    fmt::print("  mem copy:    {:8.1f} GB/s all\n", r["mem_copy_gbps_all"].get<double>());
    if (const double ns = r.value("core_to_core_ns", 0.0); ns > 0)
      fmt::print("  core to core: {:7.0f} ns one way (pool threads 0 and 1)\n", ns);
    for (const std::string& w : warnings) fmt::print("warning: {}\n", w);
  }
}

// One op's description as text: what it computes, its arguments and its outputs.
void print_description(const Json& d) {
  fmt::print("{}\n  {}\n", d["op"].get<std::string>(), d["doc"].get<std::string>());
  for (const Json& a : d["arguments"]) {
    if (!a["user"].get<bool>()) continue;
    const std::string dflt = a["default"].is_null() ? "" : " = " + a["default"].dump();
    fmt::print("  {}  {}{}  {}\n", a["py_name"].get<std::string>(), a["kind"].get<std::string>(),
               dflt, a["doc"].get<std::string>());
  }
  for (const Json& o : d["outputs"]) {
    fmt::print("  -> {}{}  {}\n", o["name"].get<std::string>(),
               o["residual"].get<bool>() ? " (residual)" : "", o["doc"].get<std::string>());
  }
}

void print_ops(const std::string& op, bool json) {
  Json arr = Json::array();
  for (const auto& f : tk::families()) {
    if (!op.empty() && f->name() != op) continue;
    Json impls = Json::array();
    for (const auto& n : f->implementation_names()) {
      const auto impl = f->implementation(n);
      impls.push_back({{"name", n},
                       {"version", impl->version()},
                       {"supported_here", impl->supported_on(tk::device_info())},
                       {"config_fields", impl->config_fields()}});
    }
    arr.push_back(
        {{"op", f->name()}, {"implementations", impls}, {"description", f->description()}});
  }
  if (json) {
    std::cout << arr.dump(2) << "\n";
    return;
  }
  if (!op.empty()) print_description(arr.at(0)["description"]);
  for (const auto& f : arr) {
    fmt::print("{}\n", f["op"].get<std::string>());
    for (const auto& i : f["implementations"]) {
      const std::string fields = tk::join(i["config_fields"].get<std::vector<std::string>>(), ", ");
      fmt::print("  {:<10} v{}  {}  config: {}\n", i["name"].get<std::string>(),
                 i["version"].get<int>(),
                 i["supported_here"].get<bool>() ? "supported" : "unsupported",
                 fields.empty() ? "(none)" : fields);
    }
  }
}

void print_specs(const std::string& op, const std::string& tag, bool json) {
  Json arr = Json::array();
  for (const auto& s : tk::find_arg_specs(op, "", tag)) {
    arr.push_back(
        {{"op", s.family}, {"name", s.name}, {"tags", s.tags}, {"arguments", s.arguments}});
  }
  if (json) {
    std::cout << arr.dump(2) << "\n";
    return;
  }
  for (const auto& s : arr) {
    const std::string tags = tk::join(s["tags"].get<std::vector<std::string>>(), ",");
    fmt::print("{:<12} {:<36} [{}] {}\n", s["op"].get<std::string>(), s["name"].get<std::string>(),
               tags, tk::canonical_dump(s["arguments"]));
  }
}

// A key's arrays ("f32[67,96] f32[4,96,80]"): enough to tell the keys of a run apart on one line.
std::string short_key(const tk::BoundArguments& b) {
  std::vector<std::string> arrays;
  for (const tk::ShapeDtype& a : tk::array_arguments(b.arguments())) arrays.push_back(a.str());
  std::string s = tk::join(arrays, " ");
  return s.size() > 56 ? s.substr(0, 53) + "..." : s;
}

// One line per tuned key: what was stored and its time, its ratio to the heuristics config with
// the interval (or why the heuristics config was kept), how many configs, how long. Keys with a
// single config (nothing to tune) are counted, not listed.
void print_key_line(const tk::BoundArguments& b, const tk::AutotuningData& d) {
  const std::string what = fmt::format("{}/{} {}", b.family(), b.implementation(), short_key(b));
  int failed = 0, ok = 0;
  for (const auto& [k, e] : d.entries()) (e.benchmark ? ok : failed) += 1;
  const std::string fails = failed ? fmt::format(", {} failed their check", failed) : "";
  if (!d.has_success()) {
    fmt::print("{}: no config succeeded ({} failed)\n", what, failed);
    return;
  }
  const auto& best = d.fastest();
  const tk::BenchmarkData& bd = *best.benchmark;
  std::string verdict = "chosen by the raw medians (no rounds against a control)";
  double spent_s = 0;
  if (bd.evidence) {
    const tk::TuningEvidence& ev = *bd.evidence;
    spent_s = ev.details.value("tuning_s", 0.0);
    const bool kept = d.heuristics() && best.config.str() == d.heuristics()->str();
    if (!kept || ev.details.contains("kept_because")) {
      verdict = ev.summary();
    } else if (ev.best == best.config.str()) {
      verdict =
          fmt::format("the heuristics config kept, the fastest finalist ({} rounds)", ev.rounds);
    } else {
      verdict = fmt::format(
          "the heuristics config kept; best other {:.3f}x [{:.3f}, {:.3f}] ({} rounds), {}",
          ev.ratio, ev.lo, ev.hi, ev.rounds,
          ev.hi < 1 - ev.tie ? "too few rounds to be confident"
                             : "within the " + ev.tie_window_text() + " tie window");
    }
  }
  fmt::print("{}: {} {:.4g} ms; {}; {} configs{}{}\n", what, best.config.str(), bd.median_ms,
             verdict, ok + failed, fails,
             spent_s > 0 ? fmt::format(", {:.1f} s", spent_s) : std::string());
}

// -v: every candidate of every key, with the rounds' evidence.
void print_key_table(const tk::BoundArguments& b, const tk::AutotuningData& d) {
  fmt::print("\n{} / {}  key {}\n", b.family(), b.implementation(), b.key());
  fmt::print("  {:<48} {:>11} {:>10}  {}\n", "config", "median ms", "IQR ms", "status");
  const std::string control = [&] {
    for (const auto& [k, e] : d.entries()) {
      if (e.benchmark && e.benchmark->evidence)
        return e.benchmark->evidence->details.value("control", std::string());
    }
    return std::string();
  }();
  for (const auto& [k, e] : d.entries()) {
    if (e.benchmark) {
      // "finalist": measured to the last stage of the rounds; the winner is one. Round-
      // measured medians are at the quiet machine's speed (ratio to the control times its
      // quiet level).
      const auto& bd = *e.benchmark;
      std::string note = bd.finalist ? ", finalist" : "";
      if (bd.rounds > 0 && k == control)
        note += fmt::format(", the control ({} rounds)", bd.rounds);
      else if (bd.rounds > 0)
        note += fmt::format(", {:.3f}x the control over {} rounds", bd.ratio, bd.rounds);
      if (bd.chosen) note += ", chosen";
      fmt::print("  {:<48} {:>11.4f} {:>10.4f}  ok{}\n", k, bd.median_ms, bd.iqr_ms, note);
    } else {
      fmt::print("  {:<48} {:>11} {:>10}  {}: {}\n", k, "-", "-",
                 tk::failure_kind_name(e.failure->kind), e.failure->message.substr(0, 160));
    }
  }
  if (!d.has_success()) return;
  const auto& best = d.fastest();
  if (!best.benchmark->evidence) return;
  const tk::TuningEvidence& ev = *best.benchmark->evidence;
  fmt::print("  stored {}; best finalist {}: {}\n", best.config.str(), ev.best, ev.summary());
  const Json& disc = ev.details.value("discarded", Json::array());
  if (!disc.empty()) {
    fmt::print("  {} segment(s) discarded and measured again, first: round {}: {}\n", disc.size(),
               disc[0].value("round", 0), disc[0].value("reason", ""));
  }
}

void print_result(const tk::AutotuningResult& r, bool verbose) {
  std::map<std::string, int> single;  // implementation -> keys with one config
  for (const auto& [b, d] : r.data()) {
    if (!verbose && d.entries().size() == 1 && d.has_success()) {
      ++single[b.implementation()];
      continue;
    }
    (verbose ? print_key_table : print_key_line)(b, d);
  }
  if (single.empty()) return;
  std::vector<std::string> parts;
  int n = 0;
  for (const auto& [name, count] : single) {
    parts.push_back(fmt::format("{} {}", name, count));
    n += count;
  }
  fmt::print("{} keys have a single config (nothing to tune), by implementation: {}\n", n,
             tk::join(parts, ", "));
}

// autotune --into-cache: the directory the winners go to (DIR/<device kind>/, made if missing)
// must take new files, and this is found out before any tuning rather than after a run of
// minutes (README "Exit status"). A file is created there and removed, as the cache's own
// writes (a lock file, then a temporary file renamed into place) need; permission bits alone
// would not tell (root, ACLs, a read-only mount). InvalidArgument naming the directory.
void check_cache_dir_writable(const std::string& cache_dir) {
  const std::string root = cache_dir.empty() ? tk::user_cache_dir() : cache_dir;
  const std::string dir = root + "/" + tk::device_kind();
  auto bad = [&](const std::string& why) {
    return tk::InvalidArgument("--into-cache: cannot write into the cache directory '" + dir +
                               "': " + why + "; expected a writable directory (--cache-dir, " +
                               "else TOKAMAX_CACHE_DIR or the user cache directory)");
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw bad(ec.message());
  std::string probe = dir + "/.tokamax-write-check.XXXXXX";
  const int fd = ::mkstemp(probe.data());  // a fresh name, created exclusively
  if (fd < 0) throw bad(std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

// Every command-line value, bound by the add_*_command functions and read by the handlers.
struct Args {
  bool json = false, roofline = false, verbose = false;
  std::string op, tag, spec, bound_args, impl_csv, out_path, into_cache_dir;
  double budget_s = 1e30;
  bool into_cache = false, have_budget = false, all_impls = false;
  std::vector<std::string> files;
  tk::cli::BenchOptions bench;  // bench's --min-time, --rounds, --samples, --warmup
  std::string trace_file;
  std::vector<std::string> trace_files;
  std::vector<std::string> bench_files;  // report's --bench
  bool op_given = false;                 // trace extract's --op (absent: every op)
  tk::cli::FleetArgs fleet;              // autotune --store ...; cache ... --store
  double measure_budget_s = 0;           // autotune --measure-budget-s (0: the default)
  int max_candidates = 0;                // autotune --max-candidates (0: all)
};

int cmd_autotune(Args& a) {
  tk::AutotuneOptions o;
  if (a.have_budget) o.budget_s = a.budget_s;
  if (a.measure_budget_s > 0) o.fix_measure_budget(a.measure_budget_s);
  if (a.max_candidates > 0) o.max_candidates = a.max_candidates;
  o.all_implementations = a.all_impls;
  const bool sharded = !a.fleet.store.empty();
  if (!a.json) {
    auto printer = std::make_shared<tk::cli::ProgressPrinter>(isatty(STDERR_FILENO), 30);
    o.progress = [printer](const tk::AutotuneProgress& p) {
      const int width = 30, filled = p.total ? width * p.done / p.total : width;
      const std::string eta = p.eta_s < 0 ? "?" : fmt::format("{:.0f}s", p.eta_s);
      printer->line(
          fmt::format("keys [{}{}] {}/{} {:.0f}s, ETA {}  {:.40}", std::string(filled, '#'),
                      std::string(width - filled, '.'), p.done, p.total, p.elapsed_s, eta, p.key),
          p.done == p.total);
    };
  }
  tk::Autotuner tuner(o);
  const auto list =
      tk::cli::select_bound_args(a.op, a.spec, a.tag, a.bound_args, split_csv(a.impl_csv));
  if (!a.out_path.empty()) tk::check_writable(a.out_path);  // before the run, not after it
  if (a.into_cache) check_cache_dir_writable(a.into_cache_dir);
  const tk::AutotuningResult r =
      sharded ? tk::cli::autotune_sharded(list, o, a.fleet) : tuner.tune_all(list);
  if (!a.out_path.empty()) {
    // The result file as the library writes it, plus where it came from (readers of result
    // files ignore fields they do not know).
    Json j = tk::parse_json(r.dumps(), "result");
    j["command"] = tk::cli::command_line();
    j["created"] = tk::utc_now();
    tk::write_file_atomic(a.out_path, j.dump(1));
  }
  if (a.into_cache) {
    r.dump_cache(a.into_cache_dir);
    // The fleet's shared cache too, when one is configured (TOKAMAX_REMOTE_CACHE).
    if (tk::RemoteCache::global().enabled()) {
      const int n = tk::RemoteCache::global().publish(r);
      fmt::print(stderr, "published {} keys to the remote cache {}\n", n,
                 tk::RemoteCache::global().url());
    }
  }
  if (a.json)
    std::cout << r.dumps() << "\n";
  else
    print_result(r, a.verbose);
  return tk::cli::report_failed_keys(r);
}

int cmd_explain(Args& a) {
  if (a.op.empty()) a.op = tk::cli::default_op(a.spec);
  const tk::OpFamily& fam = tk::find_family(a.op);
  const auto specs_found = tk::find_arg_specs(a.op, a.spec);
  auto call = fam.make_call(fam.bind_json(specs_found.at(0).arguments, ""), 0);
  tk::CallOptions co;
  co.implementation = a.impl_csv;
  const tk::Explanation e = tk::explain(fam, *call, co);
  Json skipped = Json::array();
  for (const auto& [i, why] : e.skipped)
    skipped.push_back({{"implementation", i}, {"reason", why}});
  Json j = {{"op", a.op},
            {"spec", a.spec},
            {"key", call->bound.key()},
            {"device_kind", tk::device_kind()},
            {"implementation", e.implementation},
            {"config", e.resolution.config.json()},
            {"rung", tk::rung_name(e.resolution.rung)},
            {"detail", e.resolution.detail},
            {"policy", tk::cache_miss_policy_name(tk::cache_miss_policy())},
            {"skipped", skipped}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    fmt::print("op {} spec {} on {}\nkey {}\n", a.op, a.spec, tk::device_kind(), call->bound.key());
    for (const auto& s : skipped) {
      fmt::print("skipped {}: {}\n", s["implementation"].get<std::string>(),
                 s["reason"].get<std::string>());
    }
    fmt::print("implementation {}\nconfig {}\nchosen by {} ({})\n", e.implementation,
               e.resolution.config.str(), tk::rung_name(e.resolution.rung), e.resolution.detail);
  }
  return 0;
}

int cmd_cache_show(Args& a) {
  if (!a.fleet.store.empty()) return tk::cli::cache_show_store(a.fleet.store, a.op, a.json);
  if (!a.op.empty()) tk::find_family(a.op);  // no --op: every family's files
  Json out = Json::array();
  for (const auto& [name, path] : existing_cache_files(a.op)) {
    try {
      const tk::CacheFile f = tk::CacheFile::from_json(tk::read_json_file(path), path);
      for (const auto& [key, configs] : f.entries) {
        out.push_back(
            {{"file", path}, {"implementation", name}, {"key", key}, {"configs", configs}});
      }
    } catch (const std::exception& e) {
      out.push_back({{"file", path}, {"error", e.what()}});
    }
  }
  if (a.json) {
    std::cout << out.dump(2) << "\n";
  } else {
    for (const auto& e : out) {
      if (e.contains("error")) {
        fmt::print("{}: ERROR {}\n", e["file"].get<std::string>(), e["error"].get<std::string>());
        continue;
      }
      fmt::print("{} [{}]\n  key {}\n", e["file"].get<std::string>(),
                 e["implementation"].get<std::string>(), e["key"].get<std::string>());
      for (const auto& [cfg, bd] : e["configs"].items()) {
        // Shown as they are: a mistyped field is printed, not fatal (`cache verify` judges).
        const Json none;
        auto field = [&](const Json& j, const char* name) -> const Json& {
          return j.is_object() && j.contains(name) ? j[name] : none;
        };
        const Json& failure = field(bd, "failure");
        const Json& median = field(bd, "median_ms");
        if (!failure.is_null()) {
          const Json& kind = field(failure, "kind");
          fmt::print("    {} failed: {}\n", cfg, kind.is_string() ? kind.get<std::string>() : "?");
        } else if (median.is_number()) {
          fmt::print("    {} {:.4f} ms{}{}\n", cfg, median.get<double>(),
                     field(bd, "finalist") == true ? "  finalist" : "",
                     field(bd, "chosen") == true ? "  chosen" : "");
          if (!field(bd, "evidence").is_null()) {
            try {
              fmt::print("      {}\n", tk::TuningEvidence::from_json(bd["evidence"]).summary());
            } catch (const std::exception& ex) {
              fmt::print("      evidence unreadable: {}\n", ex.what());
            }
          }
        } else {
          fmt::print("    {} unusable: median_ms = {}\n", cfg, median.dump());
        }
      }
    }
    if (out.empty()) fmt::print("no cache entries for {} on {}\n", a.op, tk::device_kind());
  }
  return 0;
}

int cmd_cache_merge(Args& a) {
  if (!a.fleet.store.empty()) return tk::cli::cache_merge_into_store(a.files, a.fleet.store);
  if (a.out_path.empty()) throw tk::InvalidArgument("cache merge: give -o FILE or --store URL");
  tk::AutotuningResult r = tk::AutotuningResult::load(a.files.at(0));
  for (size_t i = 1; i < a.files.size(); ++i) r = r | tk::AutotuningResult::load(a.files[i]);
  r.dump(a.out_path);
  fmt::print("merged {} files into {} ({} keys)\n", a.files.size(), a.out_path, r.data().size());
  return 0;
}

int cmd_cache_verify(Args& a) {
  if (!a.fleet.store.empty()) return tk::cli::cache_verify_store(a.fleet.store);
  if (a.files.empty()) {
    for (const auto& f : existing_cache_files("")) a.files.push_back(f.second);
  }
  int bad = 0;
  for (const auto& path : a.files) {
    try {
      const Json j = tk::read_json_file(path);
      if (j.contains("entries")) {
        const tk::CacheFile f = tk::CacheFile::from_json(j, path);
        const auto impl = tk::find_family(f.family).implementation(f.implementation);
        f.check_versions(*impl);
        // Entries whose configs suit this CPU's own kernels, not the ones TOKAMAX_ISA caps it
        // to: counted apart (dispatch ignores them), not bad.
        size_t other_isa = 0;
        for (const auto& [key, configs] : f.entries) {
          tk::find_family(f.family).bind_json(tk::parse_json(key, "key"), f.implementation);
          try {
            tk::AutotuningData::from_json(configs, *impl);
          } catch (const tk::ConfigForOtherIsa&) {
            ++other_isa;
          }
        }
        if (other_isa == 0) {
          fmt::print("ok   {} ({} entries)\n", path, f.entries.size());
        } else {
          fmt::print(
              "ok   {} ({} entries, {} of them for this CPU's own kernels, not the ones "
              "TOKAMAX_ISA caps it to)\n",
              path, f.entries.size(), other_isa);
        }
      } else {
        const auto r = tk::AutotuningResult::load(path);
        fmt::print("ok   {} (result, {} keys)\n", path, r.data().size());
      }
    } catch (const std::exception& e) {
      ++bad;
      fmt::print("BAD  {}: {}\n", path, e.what());
    }
  }
  return bad ? 1 : 0;
}

int cmd_bench(Args& a) {
  tk::cli::check_one_source(a.spec, a.tag, a.bound_args);
  if (!a.out_path.empty()) tk::check_writable(a.out_path);
  const auto rows =
      tk::cli::run_bench(a.op,
                         a.bound_args.empty() ? tk::find_arg_specs(a.op, a.spec, a.tag)
                                              : tk::cli::bound_args_specs(a.op, a.bound_args),
                         split_csv(a.impl_csv), a.bench);
  const Json doc = (a.json || !a.out_path.empty()) ? tk::cli::bench_document(rows) : Json();
  if (!a.out_path.empty()) tk::write_file_atomic(a.out_path, doc.dump(2) + "\n");
  const tk::Roofline& roof = tk::cached_roofline();
  const std::vector<std::string> warnings = doc.is_object()
                                                ? doc["warnings"].get<std::vector<std::string>>()
                                                : tk::cli::bench_warnings(roof);
  for (const std::string& w : warnings) fmt::print(stderr, "warning: {}\n", w);
  tk::remember_ceilings(roof);
  const auto untuned = std::count_if(
      rows.begin(), rows.end(), [](const tk::cli::BenchRow& r) { return r.rung == "heuristics"; });
  if (untuned > 0) {
    fmt::print(stderr,
               "note: {} rows ran with heuristics configs (their keys are not in the tuning "
               "data); `tokamax autotune` with the same --op/--spec/--tag and --into-cache "
               "tunes them\n",
               untuned);
  }
  if (a.json) {
    std::cout << doc.dump(2) << "\n";
  } else {
    fmt::print("{}\n", tk::cli::ceilings_line(roof));
    // "peak" names the ceiling and its value: GFLOP/s, or for memory-bound specs the GB/s
    // of a streaming read timed in the same rounds as the row.
    // "vs other": the ratio to the fastest row of another implementation, which it names.
    // "alloc MB": what the call allocated beyond its inputs and outputs, measured.
    // "cache": warm (back to back) or cold (the caches flushed before each call).
    fmt::print("{:<37} {:<18} {:>10} {:>9} {:>8} {:>7} {:>14} {:>5} {:>19} {:>9}  {}\n", "spec",
               "impl", "median ms", "GFLOP/s", "GB/s", "%peak", "peak", "cache", "vs other",
               "alloc MB", "config (source)");
    for (const auto& r : rows) {
      const bool has_peak = r.peak_value > 0;
      fmt::print(
          "{:<37} {:<18} {:>10.4f} {:>9.1f} {:>8.1f} {:>7} {:>14} {:>5} {:>19} {:>9.1f}  {} "
          "({})\n",
          r.spec, r.implementation, r.median_ms, r.gflops, r.gbps,
          has_peak ? fmt::format("{:.1f}%", r.pct_of_peak) : std::string("-"),
          has_peak ? fmt::format("{} {:.1f}", r.peak_kind, r.peak_value) : std::string("-"),
          r.cache_state.empty() ? std::string("-") : r.cache_state,
          r.baseline.empty() ? std::string("-")
                             : fmt::format("{:.2f}x {}", r.speedup_vs_baseline, r.baseline),
          r.allocated_bytes / 1e6, r.config, r.rung);
    }
  }
  return tk::cli::report_failed_rows(rows);
}

int cmd_report(Args& a) {
  const tk::report::Inputs in{a.files, a.bench_files, a.trace_files};
  // With no input at all, build_report's error says so (it comes first: it is the bigger miss).
  const bool any_input = !in.results.empty() || !in.benches.empty() || !in.traces.empty();
  if (any_input && a.out_path.empty()) throw tk::InvalidArgument("report: give -o FILE.html");
  const tk::report::Report r =
      tk::report::build_report(in, {tk::cli::command_line(), tk::utc_now()});
  for (const std::string& why : r.skipped) fmt::print(stderr, "warning: skipped {}\n", why);
  tk::write_file_atomic(a.out_path, r.html);
  fmt::print("{}report: {} ({} inputs used, {} skipped)\n", r.summary, a.out_path, r.used,
             r.skipped.size());
  return 0;
}

// A leaf subcommand and its handler; main runs the one the command line chose.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
using Commands = std::vector<Command>;

// --threads on the commands that measure or key by the thread count (the cache key holds it):
// the library's set_num_threads, the same as TOKAMAX_NUM_THREADS.
struct ThreadsOption {
  int value = 0;
  std::vector<CLI::Option*> options;

  void add_to(CLI::App* sub) {
    options.push_back(
        sub->add_option("--threads", value,
                        "threads the kernels use (default: TOKAMAX_NUM_THREADS, else all cores)"));
  }
  // After parsing, before any command runs: its threads count in every measurement and key.
  void apply() const {
    if (std::none_of(options.begin(), options.end(),
                     [](const CLI::Option* o) { return o->count() > 0; }))
      return;
    if (value <= 0 || value > tk::kMaxThreads) {
      throw tk::InvalidArgument("--threads " + std::to_string(value) +
                                ": expected a positive integer (at most " +
                                std::to_string(tk::kMaxThreads) + ")");
    }
    tk::set_num_threads(value);
  }
};

void add_device_command(CLI::App& app, Args& a, ThreadsOption& threads, Commands& commands) {
  auto* device = app.add_subcommand(
      "device", "print this CPU, its device kind and (--roofline) its measured ceilings");
  device->add_flag("--json", a.json, "JSON output");
  device->add_flag("--roofline", a.roofline, "measure peak FLOP/s and memory bandwidth");
  threads.add_to(device);
  commands.push_back({device, [&a] {
                        print_device(a.json, a.roofline);
                        return 0;
                      }});
}

void add_ops_command(CLI::App& app, Args& a, Commands& commands) {
  auto* ops = app.add_subcommand("ops", "list op families, implementations and config fields");
  ops->add_flag("--json", a.json, "JSON output");
  ops->add_option("--op", a.op, "one op: also its arguments, defaults and outputs");
  commands.push_back({ops, [&a] {
                        if (!a.op.empty())
                          tk::find_family(a.op);  // an unknown op: an error listing the known
                        print_ops(a.op, a.json);
                        return 0;
                      }});
}

void add_specs_command(CLI::App& app, Args& a, Commands& commands) {
  auto* specs = app.add_subcommand("specs", "list named workloads");
  specs->add_option("--op", a.op, "op family");
  specs->add_option("--tag", a.tag, "only specs with this tag");
  specs->add_flag("--json", a.json, "JSON output");
  commands.push_back({specs, [&a] {
                        print_specs(a.op, a.tag, a.json);  // find_arg_specs names an unknown op
                        return 0;
                      }});
}

// autotune --store ...: the sharded run's options (fleet_cmd.cc).
void add_fleet_options(CLI::App* autotune, tk::cli::FleetArgs& fleet) {
  autotune->add_option("--store", fleet.store,
                       "sharded tuning through this store: redis://host:port/db[?prefix=ns]; "
                       "every process of the run gives the same --bound-args and --run-id");
  autotune->add_option("--run-id", fleet.run_id, "with --store: the run's name");
  autotune->add_option("--rank", fleet.rank,
                       "with --store: this process's rank (default: OMPI_COMM_WORLD_RANK, "
                       "SLURM_PROCID or RANK)");
  autotune->add_option("--world-size", fleet.world_size, "with --store: number of processes");
  autotune->add_option("--lease-s", fleet.lease_s,
                       "with --store: a claim's lease, renewed while tuning (default 30)");
  autotune->add_option("--deadline-s", fleet.deadline_s,
                       "with --store: the whole run's deadline (default 86400)");
  autotune->add_option("--poll-s", fleet.poll_s,
                       "with --store: wait between looks while others tune (default 1)");
  autotune->add_option("--host-lock", fleet.host_lock,
                       "with --store: the file locked while measuring, shared by the processes "
                       "of this machine (default $TMPDIR/tokamax-measure.lock)");
  autotune->add_option("--store-timeout-s", fleet.command_timeout_s,
                       "with --store: connect and command timeout (default 2)");
}

void add_autotune_command(CLI::App& app, Args& a, ThreadsOption& threads, Commands& commands) {
  auto* autotune = app.add_subcommand("autotune", "tune specs or a bound-args file");
  autotune->add_option("--op", a.op, "op family");
  autotune->add_option("--spec", a.spec, "a spec name");
  autotune->add_option("--tag", a.tag, "every spec with this tag");
  autotune->add_option("--bound-args", a.bound_args, "a bound-args JSON file");
  autotune->add_option("--impl", a.impl_csv,
                       "implementations, comma separated (default: all supported)");
  autotune->add_option("-o,--output", a.out_path, "write the AutotuningResult here");
  autotune->add_flag("--all-implementations", a.all_impls,
                     "tune every implementation supported here, not only the one each entry names");
  autotune->add_flag("--into-cache", a.into_cache, "merge the winners into the cache directory");
  autotune->add_option("--cache-dir", a.into_cache_dir,
                       "with --into-cache: this directory (default: user cache)");
  auto* budget_opt =
      autotune->add_option("--budget-s", a.budget_s, "whole-run time budget in seconds (> 0)");
  autotune->add_flag("--json", a.json, "print the result as JSON");
  autotune->add_flag("-v,--verbose", a.verbose,
                     "every candidate of every key with the rounds' evidence (default: one line "
                     "per key)");
  autotune->add_option("--measure-budget-s", a.measure_budget_s,
                       "seconds of interleaved measuring rounds per key (default: 20, or "
                       "for a slow key the time of 4 rounds of its candidates, at most 120)");
  autotune->add_option("--max-candidates", a.max_candidates,
                       "at most this many candidates per key (the heuristics config is kept)");
  add_fleet_options(autotune, a.fleet);
  threads.add_to(autotune);
  commands.push_back({autotune, [&a, budget_opt] {
                        a.have_budget = budget_opt->count() > 0;
                        return cmd_autotune(a);
                      }});
}

void add_autotune_check_command(CLI::App& app, ThreadsOption& threads, Commands& commands) {
  // Owned by the handler, which outlives parsing (the options write into it).
  auto co = std::make_shared<tk::cli::CheckOptions>();
  auto impls = std::make_shared<std::string>();
  auto* check = app.add_subcommand(
      "autotune-check",
      "re-tune specs several times and score the winners against an oracle (regret, agreement)");
  check->add_option("--op", co->op, "op family");
  check->add_option("--spec", co->spec, "a spec name");
  check->add_option("--tag", co->tag, "every spec with this tag");
  check->add_option("--impl", *impls, "implementations, comma separated (default: all tunable)");
  check->add_option("--reruns", co->reruns, "tuning runs per spec (default 3)");
  check->add_flag("--noise", co->noise,
                  "a busy process on one core in random on/off phases during the tuning runs");
  check->add_option("--oracle-rounds", co->oracle_rounds,
                    "interleaved rounds of every candidate in the oracle (default 15)");
  check->add_option("--oracle-refine-rounds", co->oracle_refine_rounds,
                    "rounds of the oracle's second stage: the candidates within 4% of its first "
                    "stage's best and every run's winner (default 40; 0: none)");
  check->add_option("--oracle-budget-s", co->oracle_budget_s,
                    "the oracle's measuring budget per spec in seconds (default 180)");
  check->add_option("-o,--output", co->out_path, "write the JSON report here");
  check->add_flag("--json", co->json, "JSON output");
  threads.add_to(check);
  commands.push_back({check, [co, impls] {
                        co->impls = split_csv(*impls);
                        return tk::cli::autotune_check(*co);
                      }});
}

void add_explain_command(CLI::App& app, Args& a, ThreadsOption& threads, Commands& commands) {
  auto* explain =
      app.add_subcommand("explain", "which implementation and config a call would use, and why");
  explain->add_option("--op", a.op, "op family");
  explain->add_option("--spec", a.spec, "a spec name")->required();
  explain->add_option("--impl", a.impl_csv, "pin an implementation");
  explain->add_flag("--json", a.json, "JSON output");
  threads.add_to(explain);
  commands.push_back({explain, [&a] { return cmd_explain(a); }});
}

void add_cache_command(CLI::App& app, Args& a, Commands& commands) {
  auto* cache = app.add_subcommand("cache", "inspect, merge and verify cache and result files");
  cache->require_subcommand(1);
  auto* show = cache->add_subcommand("show", "entries of the cache files for this device kind");
  show->add_option("--op", a.op, "op family");
  show->add_flag("--json", a.json, "JSON output");
  show->add_option("--store", a.fleet.store, "the remote cache's entries in this store");
  commands.push_back({show, [&a] { return cmd_cache_show(a); }});

  auto* merge =
      cache->add_subcommand("merge", "merge AutotuningResult files (right wins per config)");
  merge->add_option("files", a.files, "result files")->required()->expected(1, -1);
  merge->add_option("-o,--output", a.out_path, "output file");
  merge->add_option("--store", a.fleet.store,
                    "publish the merged winners to this store's remote cache instead");
  commands.push_back({merge, [&a] { return cmd_cache_merge(a); }});

  auto* verify =
      cache->add_subcommand("verify", "check cache or result files parse and match this library");
  verify->add_option("files", a.files, "files (default: every cache file for this device kind)");
  verify->add_option("--store", a.fleet.store, "verify this store's remote cache entries instead");
  commands.push_back({verify, [&a] { return cmd_cache_verify(a); }});
}

void add_trace_command(CLI::App& app, Args& a, Commands& commands) {
  auto* trace = app.add_subcommand("trace", "work with traces of op calls");
  trace->require_subcommand(1);
  auto* extract = trace->add_subcommand(
      "extract", "bound arguments of every tokamax op call in a trace (for offline tuning)");
  extract
      ->add_option("traces", a.trace_files,
                   "Chrome traces (TOKAMAX_TRACE, TraceSession); several are merged and deduped")
      ->required();
  extract->add_option("-o,--output", a.out_path, "bound-args file to write (default: stdout)");
  extract->add_option("--op", a.op, "keep only this op family (default: all)");
  extract->add_flag("--json", a.json, "print the counts and warnings as JSON on stderr");
  commands.push_back({extract, [&a, extract] {
                        a.op_given = extract->count("--op") > 0;
                        return tk::cli::trace_extract(a.trace_files, a.out_path,
                                                      a.op_given ? a.op : "", a.json);
                      }});

  auto* summary =
      trace->add_subcommand("summary", "op calls in a trace by op, key, config and rung");
  summary->add_option("trace", a.trace_file, "a Chrome trace")->required();
  summary->add_flag("--json", a.json, "JSON output");
  commands.push_back({summary, [&a] { return tk::cli::trace_summary(a.trace_file, a.json); }});
}

void add_bench_command(CLI::App& app, Args& a, ThreadsOption& threads, Commands& commands) {
  auto* bench = app.add_subcommand("bench", "benchmark implementations side by side");
  bench->add_option("--op", a.op, "op family");
  bench->add_option("--spec", a.spec, "a spec name");
  bench->add_option("--tag", a.tag, "every spec with this tag");
  bench->add_option("--bound-args", a.bound_args,
                    "every distinct key in a bound-args file (tokamax trace extract)");
  bench->add_option(
      "--impl", a.impl_csv,
      "rows (default native,native:packed,blas, and reference on memory-bound specs); "
      "IMPL:packed measures pre-packed weights, IMPL:heuristics pins the heuristics config");
  bench->add_option("--min-time", a.bench.min_time_s,
                    "seconds of measurement per row (default 0.3)");
  bench->add_option("--rounds", a.bench.rounds,
                    "interleaved rounds, every row once a round (default 5)");
  bench->add_option("--samples", a.bench.samples,
                    "at least this many samples per row and round (default 3)");
  bench->add_option("--cache-state", a.bench.cache_state,
                    "auto (default: memory-bound calls moving at least one core's L2 measured "
                    "after a cache flush, the rest back to back), cold or warm");
  bench->add_option("--warmup", a.bench.warmup,
                    "untimed calls before a row's first round, at most 1 before later rounds "
                    "(default 2; every row also runs once untimed, counting its allocations)");
  bench->add_flag("--json", a.json, "JSON output");
  bench->add_option("-o,--output", a.out_path,
                    "also write the JSON document here (for tokamax report)");
  threads.add_to(bench);
  commands.push_back({bench, [&a] { return cmd_bench(a); }});
}

void add_report_command(CLI::App& app, Args& a, Commands& commands) {
  auto* report = app.add_subcommand(
      "report", "one self-contained HTML page of results, benchmarks and a trace, with charts");
  report->add_option("results", a.files, "autotuning result files (tokamax autotune -o)");
  report->add_option("--bench", a.bench_files, "bench documents (tokamax bench --json or -o)");
  report->add_option("--trace", a.trace_files, "traces (TOKAMAX_TRACE)");
  report->add_option("-o,--output", a.out_path, "the HTML file to write");
  commands.push_back({report, [&a] { return cmd_report(a); }});
}

// The chosen command after the settings every command shares; with no subcommand, `device`.
int run_command(const CLI::App& app, const Commands& commands, const ThreadsOption& threads) {
  // The library only warns about a malformed TOKAMAX_LOG (a logging setting must not stop a
  // program); the command reports it as the error it is.
  if (const char* log = std::getenv("TOKAMAX_LOG"); log && *log) {
    tk::set_log_settings(tk::LogSettings::parse(log));
  }
  threads.apply();
  if (app.get_subcommands().empty()) return commands.front().run();
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return tk::cli::kExitSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: the baselines' OpenBLAS at its best kernels here (core/blas.h).
  tk::reexec_with_best_blas(argv);
  tk::cli::set_command_line(argc, argv);
  CLI::App app{"tokamax: fast CPU ML kernels and their autotuner"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "tokamax " + tk::library_version());
  Args a;
  ThreadsOption threads;
  Commands commands;
  // In this order in --help; device first, as it is also the command when none is given.
  add_device_command(app, a, threads, commands);
  add_ops_command(app, a, commands);
  add_specs_command(app, a, commands);
  add_autotune_command(app, a, threads, commands);
  add_autotune_check_command(app, threads, commands);
  add_explain_command(app, a, threads, commands);
  add_cache_command(app, a, commands);
  add_trace_command(app, a, commands);
  add_bench_command(app, a, threads, commands);
  add_report_command(app, a, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error 2, not CLI11's own codes (104-109).
    const int code = app.exit(e);
    return code == 0 ? 0 : tk::cli::kExitBadInput;
  }
  try {
    return run_command(app, commands, threads);
  } catch (const std::exception& e) {
    std::cerr << "tokamax: " << e.what() << "\n";
    return tk::cli::exit_status_of(e);
  }
}
