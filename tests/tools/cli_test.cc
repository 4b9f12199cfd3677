// The `tokamax` command end to end: every subcommand on the smoke specs, and bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/microkernels.h"
#include "tests/sanitizers.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

struct Result {
  int code;
  std::string out;  // stdout
  std::string err;  // stderr (warnings, errors)
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tokamax_cli_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  Result run(const std::string& args) { return run_with_env("", args); }
  Result run_with_env(const std::string& env, const std::string& args) {
    const std::string err_path = (dir_ / "stderr.txt").string();
    const std::string cmd = env + "TOKAMAX_CACHE_DIR=" + dir_.string() + "/cache " + TOKAMAX_CLI +
                            " " + args + " 2>" + err_path;
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = pclose(p);
    std::ifstream ef(err_path);
    const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, err};
  }
  // run() with the native kernels capped (TOKAMAX_ISA) for the command ("": not capped).
  Result run_capped(const std::string& isa, const std::string& args) {
    return run_with_env("TOKAMAX_ISA=" + isa + " ", args);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(Cli, OpsSpecsExplain) {
  Result r = run("ops --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Json ops = Json::parse(r.out);
  ASSERT_EQ(ops[0]["op"], "ragged_dot");
  EXPECT_EQ(ops[0]["implementations"][0]["name"], "native");
  EXPECT_EQ(ops[0]["implementations"][0]["config_fields"].size(), 4u);
  ASSERT_EQ(ops.size(), 12u);
  EXPECT_EQ(ops[1]["op"], "dot_product_attention");
  EXPECT_EQ(ops[2]["op"], "dot_product_attention_vjp");
  EXPECT_EQ(ops[3]["op"], "layer_norm");
  EXPECT_EQ(ops[4]["op"], "layer_norm_vjp");
  EXPECT_EQ(ops[5]["op"], "gated_linear_unit");
  EXPECT_EQ(ops[6]["op"], "gated_linear_unit_vjp");
  EXPECT_EQ(ops[7]["op"], "linear_softmax_cross_entropy_loss");
  EXPECT_EQ(ops[8]["op"], "linear_softmax_cross_entropy_loss_vjp");
  EXPECT_EQ(ops[9]["op"], "add_rms_norm");
  EXPECT_EQ(ops[10]["op"], "quantized_ragged_dot");
  EXPECT_EQ(ops[11]["op"], "moe_experts");
  // Each op's description: the layer norm's epsilon default is the public options'.
  EXPECT_EQ(ops[3]["description"]["arguments"][4]["name"], "epsilon");
  EXPECT_EQ(ops[3]["description"]["arguments"][4]["default"].get<double>(),
            LayerNormOptions().epsilon);
  r = run("ops --op add_rms_norm");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("epsilon  real = 1e-06"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("residual_out"), std::string::npos) << r.out;
  r = run("specs --op ragged_dot --tag smoke --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(Json::parse(r.out).size(), 3u);
  r = run("specs --tag smoke --json");  // every family's
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // ragged_dot 3, attention 3, its backward 2, layer_norm 2, its backward 2, GLU 3, its
  // backward 2 (the stacked-weight specs), the loss 2, its backward 2, add_rms_norm 2,
  // quantized_ragged_dot 6 (a format each, two for int8 and int4), moe_experts 3
  EXPECT_EQ(Json::parse(r.out).size(), 32u);
  r = run("explain --spec smoke_masked --json");  // the family is the spec's
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(Json::parse(r.out)["op"], "dot_product_attention");
  r = run("explain --spec smoke_f32 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Json e = Json::parse(r.out);
  EXPECT_EQ(e["implementation"], "native");
  EXPECT_FALSE(e["rung"].get<std::string>().empty());
  EXPECT_EQ(run("explain --spec smoke_f32 --impl blas --json").code, 0);
  r = run("explain --spec nope");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown spec 'nope'"), std::string::npos) << r.err;
  EXPECT_EQ(run("specs --op nope").code, 2);
}

// Tuning data made on this CPU's own kernels is good data under a TOKAMAX_ISA cap too: `cache
// verify` counts the entries whose configs only the wider kernels take apart and succeeds (it
// called them BAD, and this suite's AutotuneCacheAndBench failed, under TOKAMAX_ISA=avx2 on
// Sapphire Rapids); a config no kernel set takes stays BAD.
TEST_F(Cli, CacheVerifyUnderAnIsaCap) {
  if (kernels::cpu_best_kernels().max_mr < 14) GTEST_SKIP() << "no AVX-512 kernels here";
  const std::string shipped = std::string(TOKAMAX_SOURCE_DIR) +
                              "/data/autotuning/intel_xeon_sapphirerapids/ragged_dot_native.json";
  // (Uncapped even where the suite itself runs under a cap: an empty TOKAMAX_ISA is no cap.)
  Result r = run_capped("", "cache verify " + shipped);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("caps it to"), std::string::npos) << r.out;
  r = run_capped("avx2", "cache verify " + shipped);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("of them for this CPU's own kernels"), std::string::npos) << r.out;
  // The same file with one config no kernel set takes (mr = 0).
  std::string text = read_file(shipped);
  const size_t at = text.find("\\\"mr\\\":14");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "\\\"mr\\\":0");
  write_file_atomic(path("bad.json"), text);
  r = run_capped("avx2", "cache verify " + path("bad.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("BAD"), std::string::npos) << r.out;
}

TEST_F(Cli, AutotuneCacheAndBench) {
  Result r =
      run("autotune --spec smoke_decode --impl native -o " + path("r.json") + " --into-cache");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // One line for the one key: what was stored, against the heuristics config, in how long.
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("ragged_dot/native f32[8,256] f32[8,256,256]: {", 0), 0u) << r.out;
  EXPECT_NE(r.out.find(" configs, "), std::string::npos) << r.out;
  EXPECT_LT(r.out.size(), 300u) << r.out;
  // Progress by key, with no warning among it (no cache-miss line from inside the tuner).
  EXPECT_NE(r.err.find("keys ["), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  // -v: every candidate and the rounds' evidence; the control is named, not given a ratio.
  r = run("autotune --spec smoke_decode --impl native -v --max-candidates 2 --measure-budget-s 1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok, finalist"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", the control ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  stored {"), std::string::npos) << r.out;
  // A composed candidate's inner op calls (add_rms_norm's layer_norm) miss the cache on the
  // tuner's own thread: no warning for them either.
  r = run("autotune --op add_rms_norm --tag smoke --measure-budget-s 0.5");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_EQ(run("cache verify " + path("r.json")).code, 0);
  // The file says what made it and when, for `tokamax report`.
  const Json result = read_json_file(path("r.json"));
  EXPECT_EQ(result["command"], "tokamax autotune --spec smoke_decode --impl native -o " +
                                   path("r.json") + " --into-cache");
  EXPECT_EQ(result["created"].get<std::string>().size(), 20u) << result["created"];
  r = run("cache verify");  // the cache just written
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ragged_dot_native.json"), std::string::npos) << r.out;
  r = run("cache show");
  EXPECT_NE(r.out.find("ms  finalist"), std::string::npos) << r.out;
  // The stored winner's evidence line (chosen, with its ratio to the heuristics config).
  EXPECT_NE(r.out.find("chosen"), std::string::npos) << r.out;
  EXPECT_TRUE(r.out.find("x the heuristics config [") != std::string::npos ||
              r.out.find("the heuristics config was the fastest finalist") !=
                  std::string::npos)
      << r.out;
  r = run("cache show --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_GE(Json::parse(r.out).size(), 1u);
  r = run("explain --spec smoke_decode --json");
  EXPECT_NE(r.out.find("disk_cache"), std::string::npos) << r.out;
  EXPECT_EQ(
      run("cache merge " + path("r.json") + " " + path("r.json") + " -o " + path("m.json")).code,
      0);
  r = run("bench --spec smoke_f32 --min-time 0.01 --json -o " + path("b.json"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // One document: the rows and what a reader needs to judge them alone; -o writes the same.
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(read_json_file(path("b.json")), doc);
  EXPECT_EQ(doc["tokamax_version"], library_version());
  EXPECT_FALSE(doc["device_kind"].get<std::string>().empty());
  EXPECT_EQ(doc["device"]["device_kind"], doc["device_kind"]);
  EXPECT_GT(doc["roofline"]["f32_fma_gflops_all"].get<double>(), 0);
  EXPECT_EQ(doc["command"],
            "tokamax bench --spec smoke_f32 --min-time 0.01 --json -o " + path("b.json"));
  const Json rows = doc["rows"];
  // The call as users make it, the pre-packed call, blas.
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0]["implementation"], "native");
  EXPECT_EQ(rows[1]["implementation"], "native:packed");
  EXPECT_NE(rows[1]["config"], "") << rows[1].dump();
  EXPECT_EQ(rows[0]["baseline"], "blas");  // native:packed is the same implementation
  EXPECT_EQ(rows[2]["implementation"], "blas");
  for (const char* key : {"spec", "implementation", "median_ms", "gflops", "gbps", "pct_of_peak",
                          "baseline", "speedup_vs_baseline"}) {
    EXPECT_TRUE(rows[0].contains(key)) << key;
  }
  EXPECT_GT(rows[0]["median_ms"].get<double>(), 0);
  EXPECT_EQ(rows[0]["peak"], "f32_fma");
  // After autotune --into-cache of smoke_decode, its packed row finds the plain call's entry.
  // What the percentages rest on: the busy signs and disagreements with the known ceilings
  // (a list, empty on a quiet machine), and how each row was measured.
  EXPECT_TRUE(doc["warnings"].is_array());
  EXPECT_TRUE(doc["roofline"]["busy"].is_boolean());
  EXPECT_EQ(rows[0]["cache_state"], "warm");  // not memory-bound
  r = run("bench --spec smoke_decode --min-time 0.01");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.rfind("ceilings (", 0), 0u) << r.out;
  EXPECT_EQ(r.err.find("not in the tuning data"), std::string::npos) << r.err;
  Result tiny = run("bench --spec layer_norm_smoke --min-time 0.01");
  ASSERT_EQ(tiny.code, 0) << tiny.out << tiny.err;
  bool packed_from_cache = false, tiny_warm = false;
  std::istringstream lines(r.out + tiny.out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string spec, impl;
    fields >> spec >> impl;
    if (spec == "smoke_decode" && impl == "native:packed")
      packed_from_cache = line.find("(disk_cache)") != std::string::npos &&
                          line.find(" cold ") != std::string::npos;
    // A 77-element layer_norm is measured as a model calls it: warm, with no memory ceiling.
    if (spec == "layer_norm_smoke" && impl == "native")
      tiny_warm = line.find(" warm ") != std::string::npos;
  }
  EXPECT_TRUE(packed_from_cache) << r.out;
  EXPECT_TRUE(tiny_warm) << r.out;
  // The counts behind the rates: a row's place on a roofline chart.
  const double flops = rows[0]["flops"].get<double>(), bytes = rows[0]["bytes"].get<double>();
  ASSERT_GT(flops, 0);
  ASSERT_GT(bytes, 0);
  EXPECT_DOUBLE_EQ(rows[0]["arithmetic_intensity"].get<double>(), flops / bytes);
  EXPECT_NEAR(rows[0]["gflops"].get<double>(),
              flops / (rows[0]["median_ms"].get<double>() * 1e-3) / 1e9,
              1e-9 * rows[0]["gflops"].get<double>());
  EXPECT_EQ(rows[0]["peak_value"], doc["roofline"]["f32_fma_gflops_all"]);
  EXPECT_EQ(rows[0]["bytes_source"], "cost");    // ragged_dot counts the weights it reads
  EXPECT_GE(rows[0]["samples"].get<int>(), 15);  // 5 rounds of at least 3 by default
  // Fewer rounds and samples, for shapes whose call takes seconds: exactly what was asked.
  r =
      run("bench --spec smoke_f32 --impl native --rounds 2 --samples 1 --warmup 0 --min-time 0 "
          "--json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(Json::parse(r.out)["rows"][0]["samples"], 2) << r.out;
  r = run("bench --spec smoke_f32 --impl native --rounds 0");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--rounds 0"), std::string::npos) << r.err;
  for (const char* bad : {"--samples 1001", "--warmup -1", "--min-time inf", "--min-time nan"}) {
    r = run(std::string("bench --spec smoke_f32 --impl native ") + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out << r.err;
  }
  // A family that counts no traffic for a compute-bound call: its tensors' bytes, each once.
  r = run("bench --op dot_product_attention --spec smoke --impl native --min-time 0.01 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Json att = Json::parse(r.out)["rows"][0];
  EXPECT_EQ(att["bytes_source"], "tensors") << att.dump();
  EXPECT_EQ(att["gbps"], 0.0) << att.dump();  // the rate is still of what the family counts
  double tensors = 0;  // q, k, v and the output (q's shape: the values' head size is q's)
  // Named: a range-for over a member of a temporary's element reads freed memory (ASan).
  const std::vector<ArgSpec> smoke = find_arg_specs("dot_product_attention", "smoke");
  for (const auto& [name, spec] : smoke[0].arguments.items()) {
    if (spec.is_string() && spec.get<std::string>().find('[') != std::string::npos)
      tensors += static_cast<double>(ShapeDtype::parse(spec.get<std::string>()).bytes());
  }
  EXPECT_GT(att["bytes"].get<double>(), tensors);  // the inputs, and the output besides
  EXPECT_DOUBLE_EQ(att["arithmetic_intensity"].get<double>(),
                   att["flops"].get<double>() / att["bytes"].get<double>());
  // A memory-bound spec: the percentage is against a read ceiling timed in the same rounds,
  // and each row carries that ceiling.
  r = run("bench --spec smoke_decode --min-time 0.01 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // Memory-bound: the reference loops join the default rows, and native's ratio is against the
  // faster of the two other implementations, named.
  const Json mem_rows = Json::parse(r.out)["rows"];
  ASSERT_EQ(mem_rows.size(), 4u) << r.out;
  EXPECT_EQ(mem_rows[3]["implementation"], "reference");
  const double fastest_other =
      std::min(mem_rows[2]["median_ms"].get<double>(), mem_rows[3]["median_ms"].get<double>());
  EXPECT_EQ(mem_rows[0]["baseline"],
            mem_rows[2]["median_ms"].get<double>() == fastest_other ? "blas" : "reference");
  EXPECT_NEAR(mem_rows[0]["speedup_vs_baseline"].get<double>(),
              fastest_other / mem_rows[0]["median_ms"].get<double>(), 1e-9);
  for (const Json& row : mem_rows) {
    EXPECT_EQ(row["peak"], "mem_read") << row.dump();
    const double ceiling = row["peak_value"].get<double>();
    ASSERT_GT(ceiling, 0) << row.dump();
    EXPECT_NEAR(row["pct_of_peak"].get<double>(), 100 * row["gbps"].get<double>() / ceiling,
                1e-6 * row["pct_of_peak"].get<double>())
        << row.dump();
  }

  // A report of the files above and one that does not exist: written from what is valid, the
  // missing one named in a warning and on the page.
  r = run("report " + path("r.json") + " " + path("gone.json") + " --bench " + path("b.json") +
          " -o " + path("report.html"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("warning: skipped '" + path("gone.json") + "': no such file"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("report: " + path("report.html") + " (2 inputs used, 1 skipped)"),
            std::string::npos)
      << r.out;
  const std::string html = read_file(path("report.html"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("Skipped inputs"), std::string::npos);
  EXPECT_NE(html.find(path("gone.json")), std::string::npos);
  EXPECT_NE(html.find("Roofline of " + path("b.json")), std::string::npos);
  EXPECT_NE(html.find("smoke_f32"), std::string::npos);
  EXPECT_NE(html.find("Candidates of ragged_dot/native"), std::string::npos);
  EXPECT_NE(html.find("tokamax autotune --spec smoke_decode"), std::string::npos);
}

// The tuning-quality check on a smoke spec: its JSON has one entry per spec with every rerun's
// winner and regret against the oracle, and the summary's counts agree with the entries.
TEST_F(Cli, AutotuneCheckScoresRerunsAgainstTheOracle) {
  const Result r =
      run("autotune-check --spec smoke_f32 --impl native --reruns 2 --oracle-rounds 3 "
          "--oracle-refine-rounds 4 --json -o " +
          path("check.json"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const Json doc = Json::parse(r.out);
  EXPECT_EQ(read_json_file(path("check.json")), doc);
  ASSERT_EQ(doc["specs"].size(), 1u);
  const Json& s = doc["specs"][0];
  EXPECT_EQ(s["spec"], "smoke_f32");
  ASSERT_EQ(s["runs"].size(), 2u);
  int within = 0;
  for (const Json& run : s["runs"]) {
    // A regret is the winner's oracle score over the oracle's best, minus 1: never negative.
    EXPECT_GE(run["regret"].get<double>(), 0) << run.dump();
    within += run["regret"].get<double>() <= 0.03;
    EXPECT_FALSE(run["winner"].get<std::string>().empty());
  }
  EXPECT_EQ(doc["summary"]["runs"], 2);
  EXPECT_EQ(doc["summary"]["runs_within_3pct"], within);
  EXPECT_GE(s["oracle"]["candidates"].get<int>(), 2);
  // The second stage (the contenders again, every run's winner among them) decides the best
  // when it ran: more than the heuristics config was within 4% or won a run.
  const int refined = s["oracle"]["refined_candidates"].get<int>();
  EXPECT_LE(refined, s["oracle"]["candidates"].get<int>());
  EXPECT_EQ(s["oracle"]["rounds"], refined > 0 ? 4 : 3);
  // ragged_dot native has a cost model: the oracle's best has a rank in it.
  EXPECT_GE(s["model_rank"].get<int>(), 1);
  EXPECT_LE(s["model_rank"].get<int>(), s["oracle"]["candidates"].get<int>());
  EXPECT_NE(run("autotune-check --spec smoke_f32 --reruns 0").code, 0);
  EXPECT_NE(run("autotune-check --spec smoke_f32 --oracle-refine-rounds 2").code, 0);
}

TEST_F(Cli, ReportWithoutUsableInputIsBadUsage) {
  Result r = run("report -o " + path("x.html"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("report: no input"), std::string::npos) << r.err;
  std::ofstream(path("bad.json")) << "{\"rows\": [{\"spec\": 1}]}";
  r = run("report " + path("gone.json") + " --bench " + path("bad.json") + " -o " + path("x.html"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("none of the inputs can be used"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'" + path("gone.json") + "': no such file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'" + path("bad.json") + "': row 0 has no string 'spec'"), std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(path("x.html")));
  r = run("report " + path("bad.json"));  // inputs, but nowhere to write
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("give -o FILE.html"), std::string::npos) << r.err;
}

TEST_F(Cli, BenchesEveryDistinctKeyOfABoundArgsFile) {
  // Two entries of one key (the trace named two implementations), one other key, an op this
  // library does not know.
  const std::string decode =
      R"("arguments": {"lhs": "f32[8,64]", "rhs": "f32[8,64,64]", "group_sizes": [1,1,1,1,1,1,1,1]})";
  std::ofstream(path("ba.json"))
      << "[{\"op\": {\"family\": \"ragged_dot\", \"implementation\": \"native\"}, " << decode
      << "}, {\"op\": {\"family\": \"ragged_dot\", \"implementation\": \"blas\"}, " << decode
      << "}, "
      << R"({"op": {"family": "ragged_dot"}, "arguments": {"lhs": "f32[30,24]",)"
      << R"( "rhs": "bf16[3,24,40]", "group_sizes": [10, 0, 20]}}, )"
      << R"({"op": {"family": "flash_mla"}, "arguments": {}}])";
  Result r = run("bench --bound-args " + path("ba.json") + " --min-time 0.01 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("unknown op 'flash_mla'"), std::string::npos) << r.err;
  const Json rows = Json::parse(r.out)["rows"];
  // The memory-bound key: native, native:packed, blas, reference; the other: the first three.
  ASSERT_EQ(rows.size(), 7u) << r.out;
  EXPECT_EQ(rows[0]["spec"], "#0 f32[8,64] x f32[8,64,64]");
  EXPECT_EQ(rows[4]["spec"], "#1 f32[30,24] x bf16[3,24,40]");
  for (const Json& row : rows) EXPECT_GT(row["median_ms"].get<double>(), 0) << row.dump();
  r = run("bench --bound-args " + path("ba.json") + " --spec smoke_f32");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exactly one of --spec, --tag, --bound-args"), std::string::npos) << r.err;
}

// A key inside the size limits whose tensors do not fit in this machine's memory (1 x 2^18 x 2^18
// f32: 256 GiB) ended the whole bench with a bare "std::bad_alloc". It is a failed row that
// names its spec and the bytes it needs, as any row that cannot run is, and the other keys are
// still measured.
TEST_F(Cli, BenchKeyTooLargeForMemoryIsAFailedRow) {
  // AddressSanitizer's allocator aborts on a request this size rather than returning null.
  if (testing::kUnderSanitizer) GTEST_SKIP() << "the allocation aborts under ASan";
  const double needed = 4.0 * (int64_t{1} << 36);
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  overcommit >> mode;
  double memory = 0;  // RAM and swap, bytes
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:" || key == "SwapTotal:") memory += kib * 1024;
    meminfo.ignore(64, '\n');
  }
  // Where the allocation could succeed, it would be filled: not a test to run there.
  if (mode == 1 || memory >= needed) GTEST_SKIP() << "256 GiB might be allocated here";
  std::ofstream(path("huge.json"))
      << R"([{"op": {"family": "ragged_dot"}, "arguments": {"lhs": "f32[1,262144]", )"
      << R"("rhs": "f32[1,262144,262144]", "group_sizes": [1]}}, )"
      << R"({"op": {"family": "ragged_dot"}, "arguments": {"lhs": "f32[8,64]", )"
      << R"("rhs": "f32[8,64,64]", "group_sizes": [1,1,1,1,1,1,1,1]}}])";
  const Result r =
      run("bench --bound-args " + path("huge.json") + " --impl native --min-time 0.01 --json");
  EXPECT_EQ(r.code, 1) << r.err;  // the work failed, in part
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 of 2 bench rows failed"), std::string::npos) << r.err;
  const Json rows = Json::parse(r.out)["rows"];
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_EQ(rows[0]["spec"], "#0 f32[1,262144] x f32[1,262144,262144]");
  EXPECT_EQ(rows[0]["implementation"], "native");
  // lhs 1 MiB, rhs 256 GiB, the output 1 MiB.
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.1f",
                static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                    static_cast<double>(sysconf(_SC_PAGESIZE)) / (1 << 30));
  EXPECT_EQ(rows[0]["config_source"],
            "error: cannot allocate the tensors of spec '#0 f32[1,262144] x f32[1,262144,262144]': "
            "they need 274880004096 bytes (256.0 GiB, inputs and outputs), this machine has " +
                std::string(gib) + " GiB of memory")
      << rows[0];
  EXPECT_EQ(rows[1]["spec"], "#1 f32[8,64] x f32[8,64,64]");
  EXPECT_GT(rows[1]["median_ms"].get<double>(), 0) << rows[1];
}

// The command `TOKAMAX_CLI args...` run directly (stdout and stderr to files in `dir`): its exit
// status and its peak resident set size in bytes (its own, from wait4).
std::pair<int, double> run_measured(const std::filesystem::path& dir,
                                    const std::vector<std::string>& args) {
  std::vector<char*> argv{const_cast<char*>(TOKAMAX_CLI)};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string out = (dir / "measured.out").string(), err = (dir / "measured.err").string();
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
    execv(TOKAMAX_CLI, argv.data());
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  if (pid < 0 || wait4(pid, &status, 0, &ru) != pid) return {-1, 0};
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, static_cast<double>(ru.ru_maxrss) * 1024};
}

// A trace was parsed into one document: its peak memory was several times the file's size
// (4.5x for the recorder's events, 8.6x with a profiler's small events; a 1 GiB trace needed
// gigabytes more than a machine may have). Read as a stream, the commands hold one event at a
// time and what they keep: a 100 MB trace, plain or gzip-compressed, is read in a fraction of
// its size.
TEST_F(Cli, TraceIsReadInMemoryOfItsEventsNotOfItsSize) {
  if (testing::kUnderSanitizer) GTEST_SKIP() << "a sanitizer's own memory would be measured";
  const std::string trace = path("big.json"), gz = path("big.json.gz");
  constexpr double kSize = 100e6;
  {
    std::ofstream f(trace);
    f << "{\"traceEvents\":[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
         "\"args\":{\"name\":\"tokamax (test_kind)\"}}";
    for (int64_t n = 0; f.tellp() < kSize; ++n) {
      const int m = 8 + static_cast<int>(n / 10 % 50);
      // Nine profiler events (many small fields) to one tokamax event, as a real profile has.
      if (n % 10) {
        f << ",\n{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"aten::mm\",\"pid\":1,\"tid\":3,\"ts\":"
          << n << ",\"dur\":3.25,\"args\":{\"External id\":" << n << ",\"Ev Idx\":" << n % 97
          << ",\"Input Dims\":[[64,64],[64,64]]}}";
        continue;
      }
      f << ",\n{\"args\":{\"payload\":\"tokamax:{\\\"arguments\\\":{\\\"group_sizes\\\":[" << m / 2
        << "," << m - m / 2 << "],\\\"lhs\\\":\\\"f32[" << m
        << ",2048]\\\",\\\"num_threads\\\":2,\\\"rhs\\\":\\\"f32[2,2048,5632]\\\"},\\\"format\\\":"
           "1,"
           "\\\"op\\\":{\\\"config\\\":{\\\"kc\\\":256},\\\"family\\\":\\\"ragged_dot\\\","
           "\\\"implementation\\\":\\\"native\\\",\\\"rung\\\":\\\"heuristics\\\"}}\"},"
           "\"cat\":\"tokamax\",\"dur\":2.5,\"name\":\"ragged_dot/native\",\"ph\":\"X\",\"pid\":1,"
           "\"tid\":2,\"ts\":"
        << n << "}";
    }
    f << "\n]}\n";
  }
  {
    const std::string text = read_file(trace);
    gzFile g = gzopen(gz.c_str(), "wb1");
    ASSERT_NE(g, nullptr);
    ASSERT_EQ(gzwrite(g, text.data(), static_cast<unsigned>(text.size())),
              static_cast<int>(text.size()));
    gzclose(g);
  }
  const std::vector<std::vector<std::string>> commands = {
      {"trace", "summary", trace, "--json"},
      {"trace", "summary", gz, "--json"},
      {"trace", "extract", trace, "-o", path("ba.json")},
      {"trace", "extract", gz, "-o", path("ba_gz.json")},
      {"report", "--trace", trace, "-o", path("report.html")}};
  for (const auto& args : commands) {
    const auto [code, peak] = run_measured(dir_, args);
    EXPECT_EQ(code, 0) << args[1] << " " << args[2] << ": " << read_file(path("measured.err"));
    EXPECT_LT(peak, kSize / 4) << args[1] << " " << args[2];
    if (args[1] == "summary") {
      const Json rows = read_json_file(path("measured.out"));
      ASSERT_EQ(rows.size(), 50u) << args[2];  // the 50 distinct keys
      int64_t calls = 0;
      for (const Json& r : rows) calls += r["calls"].get<int64_t>();
      EXPECT_GT(calls, 10000) << args[2];
    }
  }
  EXPECT_EQ(read_file(path("ba.json")), read_file(path("ba_gz.json")));
  EXPECT_EQ(BoundArguments::loads_list(read_file(path("ba.json"))).size(), 50u);
}

TEST_F(Cli, ThreadsOptionSetsTheThreadCountOfTheKey) {
  for (int t : {1, 2}) {
    const Result r = run("explain --spec smoke_decode --json --threads " + std::to_string(t));
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string key = Json::parse(r.out)["key"].get<std::string>();
    EXPECT_NE(key.find("\"num_threads\":" + std::to_string(t)), std::string::npos) << key;
  }
  for (const char* bad : {"0", "-3"}) {
    const Result r = run(std::string("bench --spec smoke_f32 --threads ") + bad);
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--threads " + std::string(bad) + ": expected a positive integer"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(Cli, BadInput) {
  Result r = run("autotune --spec smoke_decode --budget-s 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("budget"), std::string::npos) << r.err;
  std::ofstream(path("bad.json")) << "[{\"op\": {\"family\": \"ragged_dot\"}, \"argum";
  r = run("autotune --bound-args " + path("bad.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("malformed JSON"), std::string::npos) << r.err;
  // A bound-args file with an op this library does not know: that entry is skipped with a
  // warning, the rest is tuned; with nothing usable left, the command fails.
  const std::string good =
      R"({"op": {"family": "ragged_dot", "implementation": "blas"}, "arguments": {"lhs": "f32[3,8]",)"
      R"( "rhs": "f32[2,8,8]", "group_sizes": [1, 2]}})";
  const std::string unknown = R"({"op": {"family": "flash_mla"}, "arguments": {}})";
  std::ofstream(path("mixed.json")) << "[" << unknown << ", " << good << "]";
  r = run("autotune --bound-args " + path("mixed.json") + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("entry #0: InvalidArgument: unknown op 'flash_mla'"), std::string::npos)
      << r.err;
  EXPECT_EQ(Json::parse(r.out)["data"].size(), 1u) << r.out;
  std::ofstream(path("unknown.json")) << "[" << unknown << "]";
  r = run("autotune --bound-args " + path("unknown.json"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no usable bound arguments"), std::string::npos) << r.err;
  std::ofstream(path("bad_cache.json")) << "{\"schema_version\": 1}";
  EXPECT_EQ(run("cache verify " + path("bad_cache.json")).code, 1);
  EXPECT_EQ(run("autotune --spec smoke_decode --impl nope").code, 2);
  EXPECT_EQ(run("autotune --spec smoke_decode --tag smoke").code, 2);
  EXPECT_NE(run("bogus").code, 0);
  const char* old_log = std::getenv("TOKAMAX_LOG");
  setenv("TOKAMAX_LOG", "autotune:loud", 1);
  r = run("ops");
  if (old_log)
    setenv("TOKAMAX_LOG", old_log, 1);
  else
    unsetenv("TOKAMAX_LOG");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown level 'loud'"), std::string::npos) << r.err;
}

// One exit-status rule for every command (README, "Exit status"): 0 success, 1 the work failed,
// 2 bad usage or bad input; never CLI11's own codes.
TEST_F(Cli, ExitStatusRule) {
  EXPECT_EQ(run("--help").code, 0);
  EXPECT_EQ(run("autotune --nope").code, 2);  // was 109
  EXPECT_EQ(run("cache").code, 2);            // a subcommand is required: was 106
  EXPECT_EQ(run("bench --min-time fast").code, 2);
  // An unknown implementation was an error row of a run that exited 0.
  Result r = run("bench --spec smoke_decode --impl bogus --min-time 0.01");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown implementation 'bogus'"), std::string::npos) << r.err;
  // Every key failed (here: a budget too small to measure anything): the output has no data.
  std::ofstream(path("one.json"))
      << R"([{"op": {"family": "ragged_dot", "implementation": "native"}, "arguments": )"
      << R"({"lhs": "f32[8,64]", "rhs": "f32[2,64,64]", "group_sizes": [1, 3]}}])";
  r = run("autotune --bound-args " + path("one.json") + " --budget-s 0.000001 -o " +
          path("out.json"));
  EXPECT_EQ(r.code, 1);
  // The budget ran out while the key was tuned, or (in a slow build: sanitizers) before it
  // started: either way nothing was produced.
  EXPECT_TRUE(r.err.find("1 of 1 keys have no result") != std::string::npos ||
              r.err.find("nothing was tuned") != std::string::npos)
      << r.err;
  // Threads: bounded as TOKAMAX_NUM_THREADS is.
  r = run("explain --spec smoke_decode --threads 5000");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--threads 5000: expected a positive integer (at most 4096)"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, OutputPathsAreCheckedBeforeTheWork) {
  std::filesystem::create_directories(path("adir"));
  for (const std::string& out : {path("adir"), std::string("/proc/no/such/dir/out.json")}) {
    const Result r = run("autotune --spec smoke_decode -o " + out);
    EXPECT_EQ(r.code, 2) << out;
    EXPECT_NE(r.err.find(out), std::string::npos) << r.err;
    // Refused before tuning: nothing measured, nothing printed.
    EXPECT_EQ(r.out, "") << r.out;
  }
  // A directory where a file is expected was "malformed JSON".
  const Result r = run("cache verify " + path("adir"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'" + path("adir") + "' is a directory; expected a file"), std::string::npos)
      << r.out;
}

TEST_F(Cli, IntoCacheKeepsACorruptCacheFile) {
  const Result dev = run("device --json");
  const std::string kind = Json::parse(dev.out)["device_kind"].get<std::string>();
  const std::filesystem::path file = dir_ / "cache" / kind / "ragged_dot_blas.json";
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << "{\"schema_version\": 1, \"entr";
  const Result r = run("autotune --spec smoke_decode --impl blas --into-cache");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("moved it aside to " + file.string() + ".corrupt-"), std::string::npos)
      << r.err;
  int aside = 0;
  for (const auto& e : std::filesystem::directory_iterator(file.parent_path()))
    aside += e.path().filename().string().rfind("ragged_dot_blas.json.corrupt-", 0) == 0;
  EXPECT_EQ(aside, 1);
  EXPECT_EQ(run("cache verify " + file.string()).code, 0);
}

// --into-cache into a directory that cannot take files is bad input, found before any tuning
// (it was found after the run: a raw std::filesystem error, exit 1, the run's time lost).
TEST_F(Cli, IntoCacheDirectoryIsCheckedBeforeTuning) {
  const std::string kind = Json::parse(run("device --json").out)["device_kind"].get<std::string>();
  // Cannot be created (root cannot either), and a file where the directory should be.
  std::ofstream(path("a_file")) << "x";
  for (const std::string& dir : {std::string("/proc/tokamax/no/such"), path("a_file")}) {
    const Result r =
        run("autotune --spec smoke_decode --impl native --budget-s 5 --into-cache "
            "--cache-dir " +
            dir);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("--into-cache: cannot write into the cache directory '" + dir + "/" +
                         kind + "': "),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("ETA"), std::string::npos) << r.err;  // no tuning progress
    EXPECT_EQ(r.out, "");
  }
}

// The same for a directory whose permissions refuse new files: empty, or holding the device
// kind's directory already. Only where permissions bind this user (not root).
TEST_F(Cli, IntoCacheReadOnlyDirectoryIsCheckedBeforeTuning) {
  const std::string kind = Json::parse(run("device --json").out)["device_kind"].get<std::string>();
  const std::filesystem::path empty = dir_ / "ro_empty", full = dir_ / "ro_full";
  std::filesystem::create_directories(empty);
  std::filesystem::create_directories(full / kind);
  const auto read_only = std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec |
                         std::filesystem::perms::group_read | std::filesystem::perms::group_exec |
                         std::filesystem::perms::others_read | std::filesystem::perms::others_exec;
  std::filesystem::permissions(empty, read_only);
  std::filesystem::permissions(full / kind, read_only);
  struct Restore {  // so that TearDown can remove them
    std::filesystem::path a, b;
    ~Restore() {
      std::filesystem::permissions(a, std::filesystem::perms::owner_all);
      std::filesystem::permissions(b, std::filesystem::perms::owner_all);
    }
  } restore{empty, full / kind};
  // Root (CAP_DAC_OVERRIDE) writes through 0555: nothing here could fail for it.
  if (std::ofstream((empty / "probe").string()).good()) {
    std::filesystem::remove(empty / "probe");
    GTEST_SKIP() << "this user writes into 0555 directories (root?): read-only not testable";
  }
  for (const std::filesystem::path& dir : {empty, full}) {
    const Result r =
        run("autotune --spec smoke_decode --impl native --budget-s 5 --into-cache "
            "--cache-dir " +
            dir.string());
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find("cannot write into the cache directory '" + (dir / kind).string() +
                         "': Permission denied"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("ETA"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(Cli, MistypedFieldsAreSkippedOrNamed) {
  const Result dev = run("device --json");
  const std::string kind = Json::parse(dev.out)["device_kind"].get<std::string>();
  const std::filesystem::path file = dir_ / "cache" / kind / "ragged_dot_native.json";
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << R"({"schema_version": 1, "family": "ragged_dot", "implementation": )"
                      << R"("native", "implementation_version": 2, "device_kind": "x", )"
                      << R"("entries": {"k": {"{\"kc\":64,\"mc\":8,\"mr\":4,\"nc\":32}": )"
                      << R"({"median_ms": "fast"}}}})";
  Result r = run("cache show --op ragged_dot");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("unusable: median_ms = \"fast\""), std::string::npos) << r.out;
  // A bound-args entry with a mistyped field is skipped with a warning naming it.
  std::ofstream(path("prec.json"))
      << R"([{"op": {"family": "ragged_dot"}, "arguments": {"lhs": "f32[8,64]", )"
      << R"("rhs": "f32[2,64,64]", "group_sizes": [1, 3], "precision": 5}}, )"
      << R"({"op": {"family": "ragged_dot"}, "arguments": {"lhs": "f32[8,64]", )"
      << R"("rhs": "f32[2,64,64]", "group_sizes": [1, 3]}}])";
  r = run("autotune --bound-args " + path("prec.json") + " --impl blas");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("entry #0: InvalidArgument: ragged_dot arguments: 'precision' = 5"),
            std::string::npos)
      << r.err;
  std::ofstream(path("trace.json"))
      << R"({"traceEvents": [{"name": 5, "ph": "X", "dur": "long", "args": {"payload": )"
      << R"("tokamax:{\"arguments\":{},\"format\":1,\"op\":{\"config\":5,\"rung\":7}}"}}]})";
  r = run("trace summary " + path("trace.json") + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  // The event is left out and said to be, not shown as an op without a name and no time.
  EXPECT_EQ(Json::parse(r.out), Json::array()) << r.out;
  EXPECT_NE(r.err.find("warning: " + path("trace.json") +
                       ": skipped 1 tokamax event: 'name' is missing or not a string"),
            std::string::npos)
      << r.err;
  // Deeply nested JSON in an input file is refused, not a crash.
  std::ofstream(path("deep.json")) << std::string(100000, '[') << std::string(100000, ']');
  for (const std::string& cmd :
       {"cache verify " + path("deep.json"), "trace extract " + path("deep.json"),
        "autotune --bound-args " + path("deep.json"), "bench --bound-args " + path("deep.json"),
        "trace summary " + path("deep.json")}) {
    r = run(cmd);
    EXPECT_TRUE(r.code == 1 || r.code == 2) << cmd << ": " << r.code << r.err;
  }
}

}  // namespace
}  // namespace tokamax
