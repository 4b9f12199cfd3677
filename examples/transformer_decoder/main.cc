// A small transformer decoder layer on tokamax, run as a server runs it: a prefill of the
// prompt, then decode steps of one token each against a KV cache.
//   h = rms_norm(x) * norm_scale;  q, k, v = h W_q, h W_k, h W_v (ragged_dot, one group);
//   k, v appended to the cache [1, S_max, Nk, H];
//   o = dot_product_attention(q, k_cache, v_cache) with GQA (N query heads over Nk kv heads),
//       kv_seq_lengths = the positions filled so far, causal over the prompt in the prefill;
//   x1 = x + o W_o;  out = the mixture-of-experts block of examples/moe_block on x1 (its
//   shared expert a gated_linear_unit);
// and after the prefill, the language-model loss of the prompt's next tokens:
//   linear_softmax_cross_entropy_loss(rms_norm(out), next tokens, W_lm [D, V]).
// Every op (rms_norm, ragged_dot, dot_product_attention, gated_linear_unit, the loss) lands in
// a trace under TOKAMAX_TRACE=path, so the README's trace -> extract -> tune -> apply round trip
// covers every family the layer calls (tests/trace/transformer_round_trip.sh). Positions are
// not rotated (no RoPE) and the tokens are random: the layer shows the ops, not a model.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "../moe_block/moe.h"

namespace {

using namespace tokamax;

struct Dims {
  int heads = 8, kv_heads = 2, head_dim = 32, prompt = 32, steps = 4, vocab = 1000;
  moe::Dims ffn{.tokens = 0, .d_model = 256, .d_ff = 512, .experts = 8, .top_k = 2};
  int d_model() const { return ffn.d_model; }
  int max_seq() const { return prompt + steps; }
};

struct Projection {
  Tensor w;  // [1, in, out]
  PackedRhs p;
  Projection(int64_t in, int64_t out, uint64_t seed)
      : w(Tensor::randn({1, in, out}, DType::kF32, seed)), p(pack_rhs(w)) {
    // 1/sqrt(in) keeps activations near unit scale through the layer.
    const float s = 1.0f / std::sqrt(static_cast<float>(in));
    for (int64_t i = 0; i < w.size(); ++i) w.data_as<float>()[i] *= s;
    p = pack_rhs(w);
  }
  Tensor operator()(const TensorView& x, const std::string& impl) const {
    RaggedDotOptions o;
    o.implementation = impl;
    const std::vector<int32_t> rows = {static_cast<int32_t>(x.shape()[0])};
    return moe::matmul(x, w, p, rows, o);
  }
};

struct Layer {
  Tensor norm_scale, final_norm, lm_head;  // [D], [D], [D, V]
  Projection wq, wk, wv, wo;
  moe::Weights ffn;
  explicit Layer(const Dims& d)
      : norm_scale(Tensor::uniform({d.d_model()}, DType::kF32, 20)),
        final_norm(Tensor::uniform({d.d_model()}, DType::kF32, 25)),
        lm_head(Tensor::randn({d.d_model(), d.vocab}, DType::kF32, 26)),
        wq(d.d_model(), d.heads * d.head_dim, 21),
        wk(d.d_model(), d.kv_heads * d.head_dim, 22),
        wv(d.d_model(), d.kv_heads * d.head_dim, 23),
        wo(d.heads * d.head_dim, d.d_model(), 24),
        ffn(d.ffn, DType::kF32, 30) {
    const float s = 1.0f / std::sqrt(static_cast<float>(d.d_model()));
    for (int64_t i = 0; i < lm_head.size(); ++i) lm_head.data_as<float>()[i] *= s;
  }
};

struct KvCache {
  Tensor k, v;  // [1, S_max, Nk, H]
  int filled = 0;
  explicit KvCache(const Dims& d)
      : k(Tensor::zeros({1, d.max_seq(), d.kv_heads, d.head_dim}, DType::kF32)),
        v(Tensor::zeros({1, d.max_seq(), d.kv_heads, d.head_dim}, DType::kF32)) {}
};

// The layer on x [T, D] at positions [cache.filled, cache.filled + T); appends to the cache.
Tensor layer_step(const Tensor& x, const Layer& l, KvCache& cache, const Dims& d,
                  const std::string& impl) {
  const int64_t T = x.shape()[0], N = d.heads, Nk = d.kv_heads, H = d.head_dim;
  LayerNormOptions norm;
  norm.implementation = impl;
  const Tensor h = rms_norm(x, l.norm_scale.view(), norm);
  const Tensor q = l.wq(h, impl), k = l.wk(h, impl), v = l.wv(h, impl);
  const int64_t row = Nk * H;
  std::memcpy(cache.k.data_as<float>() + cache.filled * row, k.data(), k.nbytes());
  std::memcpy(cache.v.data_as<float>() + cache.filled * row, v.data(), v.nbytes());
  const int first = cache.filled;
  cache.filled += static_cast<int>(T);

  Tensor lengths({1}, DType::kI32);
  lengths.data_as<int32_t>()[0] = cache.filled;
  AttentionOptions a;
  a.implementation = impl;
  a.kv_seq_lengths = lengths.view();
  // The prefill starts at position 0, so causality is jax's top-left aligned mask; a decode
  // step's one query sees every filled position.
  if (first != 0 && T != 1) throw InvalidArgument("chunked prefill is not shown here");
  a.is_causal = first == 0 && T > 1;
  const Tensor o =
      dot_product_attention(TensorView(q.data(), DType::kF32, {1, T, N, H}), cache.k, cache.v, a);
  Tensor x1 = l.wo(TensorView(o.data(), DType::kF32, {T, N * H}), impl);
  for (int64_t i = 0; i < x1.size(); ++i) x1.data_as<float>()[i] += x.data_as<float>()[i];
  return moe::moe_block(x1, l.ffn, d.ffn, impl);
}

// The mean next-token loss of the prefill's outputs [T, D] against `next` (i32 [T]).
Tensor lm_loss(const Tensor& out, const Tensor& next, const Layer& l, const std::string& impl) {
  LayerNormOptions norm;
  norm.implementation = impl;
  const Tensor h = rms_norm(out, l.final_norm.view(), norm);
  LossOptions o;
  o.reduction = LossReduction::kMean;
  o.implementation = impl;
  return linear_softmax_cross_entropy_loss(h, next, l.lm_head, o);
}

}  // namespace

int main(int argc, char** argv) {
  Dims d;
  bool check = false;
  std::string tuned;
  CLI::App app{"a transformer decoder layer on tokamax: prefill, then decode steps"};
  app.add_option("--prompt", d.prompt, "prompt tokens (the prefill)")->check(CLI::PositiveNumber);
  app.add_option("--steps", d.steps, "decode steps")->check(CLI::NonNegativeNumber);
  app.add_option("--heads", d.heads, "query heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", d.kv_heads, "kv heads (divides --heads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", d.head_dim, "head dim")->check(CLI::PositiveNumber);
  app.add_option("--d-model", d.ffn.d_model, "model width")->check(CLI::PositiveNumber);
  app.add_option("--vocab", d.vocab, "vocabulary of the loss")->check(CLI::PositiveNumber);
  app.add_option("--tuned", tuned, "an AutotuningResult file to apply (AutotuningScope)");
  app.add_flag("--check", check, "compare every step with the reference implementations");
  CLI11_PARSE(app, argc, argv);
  if (d.heads % d.kv_heads != 0) {
    std::fprintf(stderr, "--heads (%d) must be a multiple of --kv-heads (%d)\n", d.heads,
                 d.kv_heads);
    return 2;
  }
  try {
    const Layer layer(d);
    KvCache cache(d), ref_cache(d);
    const moe::TunedScope tuned_scope(tuned);
    double worst = 0;
    Tensor x = Tensor::randn({d.prompt, d.d_model()}, DType::kF32, 100);
    for (int s = 0; s <= d.steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor out = layer_step(x, layer, cache, d, "");
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s %d: %.3f ms (%d positions cached)\n", s == 0 ? "prefill" : "decode", s, ms,
                  cache.filled);
      if (check) {
        const Tensor ref = layer_step(x, layer, ref_cache, d, "reference");
        worst = std::max(worst, moe::normwise_error(out, ref));
      }
      if (s == 0) {
        Tensor next({d.prompt}, DType::kI32);
        for (int t = 0; t < d.prompt; ++t) next.data_as<int32_t>()[t] = (t * 7919 + 13) % d.vocab;
        const Tensor loss = lm_loss(out, next, layer, "");
        std::printf("prefill loss: %.4f (log V = %.4f)\n", loss.get(0), std::log(double(d.vocab)));
        if (check)
          worst =
              std::max(worst, moe::normwise_error(loss, lm_loss(out, next, layer, "reference")));
      }
      // The next token's input: the last position's output (a stand-in for sampling and
      // embedding it).
      Tensor next({1, d.d_model()}, DType::kF32);
      std::memcpy(next.data(), out.data_as<float>() + (out.shape()[0] - 1) * d.d_model(),
                  next.nbytes());
      x = std::move(next);
    }
    if (check) {
      const double tol = 1e-4;
      std::printf("normwise relative error vs reference: %.3g (tolerance %.0e)\n", worst, tol);
      if (!(worst <= tol)) return 1;
    }
    // The trace (TOKAMAX_TRACE) completed now, so that a trace that cannot be written fails the
    // run (below) rather than only being said at exit.
    finish_env_trace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transformer_decoder: %s\n", e.what());
    return 1;
  }
  return 0;
}
