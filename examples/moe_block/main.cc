// A small mixture-of-experts transformer block on tokamax, written the way a model would be:
//   h = rms_norm(x); router logits = h W_r; top-k experts per token with softmax weights;
//   tokens sorted by expert; per expert: silu(h W_gate) * (h W_up), then W_down;
//   out = x + sum over the token's experts of weight * expert output.
// The router and the three expert matmuls are ragged_dot calls (the router as one group), so
// with TOKAMAX_TRACE=trace.json every one of them lands in the trace with its bound arguments,
// its config and the ladder rung that chose it. rms_norm and the softmax are plain loops here
// (tokamax has no family for them yet). README.md ("Offline tuning from a trace") walks
// through: run traced, `tokamax trace extract`, `tokamax autotune --bound-args`, then run again
// with --tuned to apply the result in an AutotuningScope.
#include <tokamax/tokamax.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <vector>

namespace {

using namespace tokamax;

struct Dims {
  int tokens = 64, d_model = 256, d_ff = 512, experts = 8, top_k = 2;
};

// Weights are packed once into the native kernel's layout, as an inference server would at load
// time (an unpacked rhs is packed on every call). The reference check uses the plain tensors.
struct Weights {
  Tensor router, gate, up, down;  // [1,D,E], [E,D,F], [E,D,F], [E,F,D]
  PackedRhs router_p, gate_p, up_p, down_p;
  Weights(const Dims& d, DType dtype)
      : router(Tensor::randn({1, d.d_model, d.experts}, DType::kF32, 10)),
        gate(Tensor::randn({d.experts, d.d_model, d.d_ff}, dtype, 11)),
        up(Tensor::randn({d.experts, d.d_model, d.d_ff}, dtype, 12)),
        down(Tensor::randn({d.experts, d.d_ff, d.d_model}, dtype, 13)),
        router_p(pack_rhs(router)),
        gate_p(pack_rhs(gate)),
        up_p(pack_rhs(up)),
        down_p(pack_rhs(down)) {}
};

// The packed weights for tokamax's choice of implementation, the plain ones when one is pinned
// (only native reads the packed layout).
Tensor matmul(const Tensor& x, const Tensor& w, const PackedRhs& p,
              const std::vector<int32_t>& sizes, const RaggedDotOptions& o) {
  return o.implementation.empty() ? ragged_dot(x, p, sizes, o) : ragged_dot(x, w, sizes, o);
}

Tensor rms_norm(const Tensor& x) {
  const int64_t rows = x.shape()[0], cols = x.shape()[1];
  Tensor y({rows, cols}, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x.data_as<float>() + r * cols;
    float* out = y.data_as<float>() + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += double(in[c]) * in[c];
    const float scale = 1.0f / std::sqrt(float(ss / std::max<int64_t>(cols, 1)) + 1e-6f);
    for (int64_t c = 0; c < cols; ++c) out[c] = in[c] * scale;
  }
  return y;
}

// One forward pass. `impl` pins an implementation ("" = tokamax's choice).
Tensor moe_block(const Tensor& x, const Weights& w, const Dims& d, const std::string& impl) {
  const int T = d.tokens, D = d.d_model, E = d.experts, K = d.top_k;
  const Tensor h = rms_norm(x);
  RaggedDotOptions o;
  o.implementation = impl;
  const std::vector<int32_t> all_rows = {T};
  const Tensor logits = matmul(h, w.router, w.router_p, all_rows, o);  // [T,E]

  // Top-k experts per token, softmax over the chosen logits.
  std::vector<int> expert(T * K);
  std::vector<float> weight(T * K);
  for (int t = 0; t < T; ++t) {
    const float* l = logits.data_as<float>() + int64_t(t) * E;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return l[a] > l[b]; });
    float sum = 0;
    for (int k = 0; k < K; ++k) sum += std::exp(l[order[k]] - l[order[0]]);
    for (int k = 0; k < K; ++k) {
      expert[t * K + k] = order[k];
      weight[t * K + k] = std::exp(l[order[k]] - l[order[0]]) / sum;
    }
  }
  // Sort the (token, slot) pairs by expert: each expert's rows become one contiguous group.
  std::vector<int> slot(T * K);
  std::iota(slot.begin(), slot.end(), 0);
  std::stable_sort(slot.begin(), slot.end(), [&](int a, int b) { return expert[a] < expert[b]; });
  std::vector<int32_t> group_sizes(E, 0);
  Tensor xs({int64_t(T) * K, D}, DType::kF32);
  for (int i = 0; i < T * K; ++i) {
    ++group_sizes[expert[slot[i]]];
    std::copy_n(h.data_as<float>() + int64_t(slot[i] / K) * D, D,
                xs.data_as<float>() + int64_t(i) * D);
  }

  RaggedDotOptions silu = o;
  silu.activation = Activation::kSilu;
  Tensor gate = matmul(xs, w.gate, w.gate_p, group_sizes, silu);  // [T*K, F]
  const Tensor up = matmul(xs, w.up, w.up_p, group_sizes, o);
  for (int64_t i = 0; i < gate.size(); ++i) gate.data_as<float>()[i] *= up.data_as<float>()[i];
  const Tensor y = matmul(gate, w.down, w.down_p, group_sizes, o);  // [T*K, D]

  Tensor out({T, D}, DType::kF32);
  std::copy_n(x.data_as<float>(), x.size(), out.data_as<float>());
  for (int i = 0; i < T * K; ++i) {
    float* dst = out.data_as<float>() + int64_t(slot[i] / K) * D;
    const float* src = y.data_as<float>() + int64_t(i) * D;
    for (int c = 0; c < D; ++c) dst[c] += weight[slot[i]] * src[c];
  }
  return out;
}

}  // namespace

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
    std::optional<AutotuningResult> result;
    std::optional<AutotuningScope> scope;
    if (!tuned.empty()) {
      result = AutotuningResult::load(tuned);
      scope.emplace(*result);
      std::printf("applying %zu tuned keys from %s (device kind %s)\n", result->data().size(),
                  tuned.c_str(), result->device_kind().c_str());
    }
    if (!env_trace_path().empty()) std::printf("tracing to %s\n", env_trace_path().c_str());
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      const Tensor x = Tensor::randn({d.tokens, d.d_model}, DType::kF32, 100 + s);
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor out = moe_block(x, w, d, "");
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %d: %.3f ms\n", s, ms);
      if (check) {
        const Tensor ref = moe_block(x, w, d, "reference");
        double num = 0, den = 0;
        for (int64_t i = 0; i < out.size(); ++i) {
          num += std::pow(out.get(i) - ref.get(i), 2);
          den += std::pow(ref.get(i), 2);
        }
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
      }
    }
    if (check) {
      const double tol = bf16 ? 1e-2 : 1e-4;
      std::printf("normwise relative error vs reference: %.3g (tolerance %.0e)\n", worst, tol);
      if (!(worst <= tol)) return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
