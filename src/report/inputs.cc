// Reading the report's inputs: autotuning results, bench documents (and the bare row lists of
// older versions) and traces. Optional fields read as "not said" rather than failing the file,
// because files written by older versions lack them and the page must still show the rest.
#include "report/inputs.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <system_error>

#include "report/html.h"
#include "tokamax/core/limits.h"

namespace tokamax::report::internal {
namespace {

// InvalidArgument when there is no file at `path` to read, saying why (without repeating the
// path: the caller names it).
void check_input(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InvalidArgument("no such file");
  if (std::filesystem::is_directory(path, ec)) throw InvalidArgument("a directory, not a file");
}

// The file's text, or InvalidArgument saying why not.
std::string read_input(const std::string& path) {
  check_input(path);
  return read_file(path);
}

std::string opt_string(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

double opt_number(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// A count: 0 (not said) unless the field is a number in [0, max]; converting a larger one (a
// file may say 1e300) would be undefined.
int64_t opt_count(const Json& j, const char* name, int64_t max) {
  const double v = opt_number(j, name);
  return v >= 0 && v <= static_cast<double>(max) ? static_cast<int64_t>(v) : 0;
}

ResultInput load_result(const std::string& path) {
  const std::string text = read_input(path);
  ResultInput r{path, AutotuningResult::loads(text, "the file"), "", ""};
  const Json j = parse_json(text, "the file");
  r.command = opt_string(j, "command");
  r.created = opt_string(j, "created");
  return r;
}

// Fields added to bench documents after the first version: absent reads as "not said", but a
// field of the wrong type or value makes the file one the page cannot trust (as a required
// field does).
std::string opt_cache_state(const Json& row, size_t i) {
  const auto it = row.find("cache_state");
  if (it == row.end()) return "";
  if (!it->is_string())
    throw InvalidArgument(fmt::format("row {}: 'cache_state' is not a string", i));
  // "" is not said (a row that failed before it was measured).
  const std::string s = it->get<std::string>();
  if (!s.empty() && s != "warm" && s != "cold") {
    throw InvalidArgument(fmt::format(
        "row {}: 'cache_state' is \"{}\", expected \"warm\" or \"cold\"", i, clip(s, 24)));
  }
  return s;
}

std::vector<std::string> opt_warnings(const Json& doc) {
  const auto it = doc.find("warnings");
  if (it == doc.end()) return {};
  if (!it->is_array()) throw InvalidArgument("'warnings' is not a list of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < it->size(); ++i) {
    if (!(*it)[i].is_string())
      throw InvalidArgument(fmt::format("'warnings' item {} is not a string", i));
    out.push_back((*it)[i].get<std::string>());
  }
  return out;
}

bool opt_busy(const Json& roofline) {
  const auto it = roofline.find("busy");
  if (it == roofline.end()) return false;
  if (!it->is_boolean()) throw InvalidArgument("'roofline.busy' is not true or false");
  return it->get<bool>();
}

BenchRowIn parse_bench_row(const Json& row, size_t i) {
  if (!row.is_object()) throw InvalidArgument(fmt::format("row {} is not an object", i));
  for (const char* required : {"spec", "implementation"}) {
    if (!row.contains(required) || !row[required].is_string())
      throw InvalidArgument(fmt::format("row {} has no string '{}'", i, required));
  }
  if (!row.contains("median_ms") || !row["median_ms"].is_number())
    throw InvalidArgument(fmt::format("row {} has no number 'median_ms'", i));
  BenchRowIn r;
  r.spec = row["spec"].get<std::string>();
  r.implementation = row["implementation"].get<std::string>();
  r.config = opt_string(row, "config");
  r.source = opt_string(row, "config_source");
  r.peak = opt_string(row, "peak");
  r.baseline = opt_string(row, "baseline");
  r.median_ms = row["median_ms"].get<double>();
  r.iqr_ms = opt_number(row, "iqr_ms");
  r.flops = opt_number(row, "flops");
  r.bytes = opt_number(row, "bytes");
  r.bytes_source = opt_string(row, "bytes_source");
  r.gflops = opt_number(row, "gflops");
  r.gbps = opt_number(row, "gbps");
  r.pct = opt_number(row, "pct_of_peak");
  r.peak_value = opt_number(row, "peak_value");
  r.speedup = opt_number(row, "speedup_vs_baseline");
  r.allocated = opt_count(row, "allocated_bytes", int64_t{1} << 62);
  r.cache_state = opt_cache_state(row, i);
  // Rows of bench files written before the FLOP and byte counts were: both follow from the
  // rates, which share one median.
  if (r.flops == 0 && r.gflops > 0 && r.measured()) r.flops = r.gflops * 1e9 * r.median_ms * 1e-3;
  if (r.bytes == 0 && r.gbps > 0 && r.measured()) {
    r.bytes = r.gbps * 1e9 * r.median_ms * 1e-3;
    r.bytes_source = "cost";
  }
  return r;
}

BenchInput load_bench(const std::string& path) {
  const Json doc = parse_json(read_input(path), "the file");
  BenchInput b;
  b.path = path;
  const Json* rows = nullptr;
  if (doc.is_array()) {
    rows = &doc;  // `tokamax bench --json` of versions before the document form
  } else if (doc.is_object() && doc.contains("rows") && doc["rows"].is_array()) {
    rows = &doc["rows"];
    b.command = opt_string(doc, "command");
    b.created = opt_string(doc, "created");
    b.version = opt_string(doc, "tokamax_version");
    b.device_kind = opt_string(doc, "device_kind");
    if (doc.contains("device") && doc["device"].is_object())
      b.model = opt_string(doc["device"], "model_name");
    if (doc.contains("roofline") && doc["roofline"].is_object()) {
      const Json& r = doc["roofline"];
      b.ceilings.f32 = opt_number(r, "f32_fma_gflops_all");
      b.ceilings.bf16 = opt_number(r, "bf16_dot_gflops_all");
      b.ceilings.read = opt_number(r, "mem_read_gbps_all");
      b.ceilings.copy = opt_number(r, "mem_copy_gbps_all");
      b.ceilings.bf16_unit = opt_string(r, "bf16_dot_unit");
      b.ceilings.threads = static_cast<int>(opt_count(r, "threads", kMaxThreads));
      b.busy = opt_busy(r);
    }
    b.warnings = opt_warnings(doc);
  } else {
    throw InvalidArgument(
        "not a tokamax bench document (expected {\"rows\": [...]} or a list of rows)");
  }
  if (rows->empty()) throw InvalidArgument("no benchmark rows");
  for (size_t i = 0; i < rows->size(); ++i) b.rows.push_back(parse_bench_row((*rows)[i], i));
  if (b.ceilings.f32 == 0 && b.ceilings.read == 0) {
    b.ceilings.from_rows = true;
    for (const BenchRowIn& r : b.rows) {
      const bool bf16 = r.peak == "bf16_dot" || r.peak == "bf16_amx";
      double& c = r.peak == "f32_fma"    ? b.ceilings.f32
                  : bf16                 ? b.ceilings.bf16
                  : r.peak == "mem_read" ? b.ceilings.read
                                         : b.ceilings.copy;
      if (!r.peak.empty()) c = std::max(c, r.peak_value);
      if (r.peak == "bf16_amx") b.ceilings.bf16_unit = "amx";
    }
  }
  return b;
}

TraceInput load_trace(const std::string& path) {
  check_input(path);  // says "no such file" plainly
  // Read as a stream (a trace may be gigabytes), gunzipped when compressed. A gzip stream cut
  // short is the reason given, also when the text it ends with then does not parse.
  std::vector<std::string> warnings;
  TraceSummary summary;
  try {
    summary = summarize_trace_file(path, &warnings, "the file");
  } catch (const InvalidArgument&) {
    if (!warnings.empty()) throw InvalidArgument(join(warnings, "; "));
    throw;
  }
  if (!warnings.empty()) throw InvalidArgument(join(warnings, "; "));
  if (summary.groups.empty()) {
    throw InvalidArgument(summary.warnings.empty() ? std::string("no tokamax op events")
                                                   : "no tokamax op events that could be read: " +
                                                         join(summary.warnings, "; "));
  }
  return {path, std::move(summary.device_kind), std::move(summary.groups),
          std::move(summary.warnings)};
}

}  // namespace

Loaded load_all(const Inputs& in) {
  Loaded l;
  auto attempt = [&](const std::string& path, auto load, auto& into) {
    try {
      into.push_back(load(path));
    } catch (const Error& e) {
      l.skipped.emplace_back(path, e.message());
    } catch (const std::exception& e) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
      // Under the fuzzer (fuzz/README.md) an exception that is not tokamax's own is a reader's
      // bug (a JSON type error, an out_of_range): its message names no field.
      throw;
#endif
      l.skipped.emplace_back(path, e.what());
    }
  };
  for (const auto& p : in.results) attempt(p, load_result, l.results);
  for (const auto& p : in.benches) attempt(p, load_bench, l.benches);
  for (const auto& p : in.traces) attempt(p, load_trace, l.traces);
  return l;
}

}  // namespace tokamax::report::internal
