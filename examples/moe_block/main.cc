// A small mixture-of-experts transformer block on tokamax (moe.h): rms_norm, then the router
// and the experts' matmuls as ragged_dot calls. With TOKAMAX_TRACE=trace.json every op call
// lands in the trace with its bound arguments, its config and the ladder rung that chose it.
// README.md ("Offline tuning from a trace") walks
// through: run traced, `tokamax trace extract`, `tokamax autotune --bound-args`, then run again
// with --tuned to apply the result in an AutotuningScope.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>

#include "moe.h"

using namespace tokamax;
using moe::Dims;
using moe::Weights;

int main(int argc, char** argv) {
  Dims d;
  int steps = 3;
  bool bf16 = false, check = false;
  std::string tuned;
  CLI::App app{"a mixture-of-experts block on tokamax (trace it with TOKAMAX_TRACE=path)"};
  app.add_option("--tokens", d.tokens, "tokens per step")->check(CLI::PositiveNumber);
  app.add_option("--d-model", d.d_model, "model width")->check(CLI::PositiveNumber);
  app.add_option("--d-ff", d.d_ff, "expert hidden width")->check(CLI::PositiveNumber);
  app.add_option("--experts", d.experts, "number of experts")->check(CLI::PositiveNumber);
  app.add_option("--top-k", d.top_k, "experts per token")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "forward passes")->check(CLI::PositiveNumber);
  app.add_flag("--bf16-weights", bf16, "bf16 expert weights (f32 activations)");
  app.add_option("--tuned", tuned, "an AutotuningResult file to apply (AutotuningScope)");
  app.add_flag("--check", check, "compare each step with the reference implementation");
  CLI11_PARSE(app, argc, argv);
  if (d.top_k > d.experts) {
    std::fprintf(stderr, "--top-k (%d) must be at most --experts (%d)\n", d.top_k, d.experts);
    return 2;
  }
  try {
    const Weights w(d, bf16 ? DType::kBF16 : DType::kF32);
    const moe::TunedScope tuned_scope(tuned);
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const Tensor x = Tensor::randn({d.tokens, d.d_model}, DType::kF32, 100 + s);
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor out = moe::moe_block(x, w, d, "");
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %d: %.3f ms\n", s, ms);
      if (check) {
        const Tensor ref = moe::moe_block(x, w, d, "reference");
        worst = std::max(worst, moe::normwise_error(out, ref));
      }
    }
    if (check) {
      const double tol = bf16 ? 1e-2 : 1e-4;
      std::printf("normwise relative error vs reference: %.3g (tolerance %.0e)\n", worst, tol);
      if (!(worst <= tol)) return 1;
    }
    // The trace (TOKAMAX_TRACE) completed now, so that a trace that cannot be written fails the
    // run (below) rather than only being said at exit.
    finish_env_trace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
