// The native moe_experts: the routing sorted by expert (bind's counting sort), the tokens'
// rows gathered in that order, the gate-up product as one ragged_dot over the experts, the
// gated activation on the vector row kernel, the down product as a second ragged_dot, and the
// weighted combine per token. The products are ragged_dot's native calls (its kernels, its
// tuned configs and its decode streaming), on the caller's threads of the library's pool.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/dotrows.h"
#include "kernels/microkernels.h"
#include "ops/elements.h"
#include "ops/moe/base.h"
#include "ops/ragged_dot/base.h"

namespace tokamax {

PackedMoeWeights pack_moe_weights(const TensorView& w_gate_up, const TensorView& w_down,
                                  bool transposed_weights) {
  const RaggedDimNums dims =
      transposed_weights ? RaggedDimNums::kTransposedRhs : RaggedDimNums::kForward;
  if (w_gate_up.rank() != 3 || w_down.rank() != 3) {
    throw InvalidArgument("pack_moe_weights: w_gate_up " + w_gate_up.spec().str() + " and w_down " +
                          w_down.spec().str() + "; expected rank-3 expert weights");
  }
  return {pack_rhs(w_gate_up, dims), pack_rhs(w_down, dims)};
}

namespace moe {
namespace {

// One product of the experts: out [S, cols] f32 = lhs [S, depth] x (rhs or packed) per expert.
void experts_product(const MoeCall& c, const TensorView& lhs, const TensorView& rhs,
                     const PackedRhs& packed, const TensorView& out) {
  rdot::RaggedDotCall r;
  r.lhs = lhs;
  r.group_sizes = c.counts;
  r.dims = c.transposed_weights ? RaggedDimNums::kTransposedRhs : RaggedDimNums::kForward;
  r.preferred_element_type = DType::kF32;
  r.num_threads = c.num_threads;
  if (!packed.empty()) {
    const ShapeDtype logical = packed.logical();
    r.rhs = TensorView(nullptr, logical.dtype, logical.shape);
    r.dims = packed.dim_nums();
    r.packed = packed;
    r.packed_rhs = true;
  } else {
    r.rhs = rhs;
  }
  rdot::family().run_into(r, CallOptions{"native", std::nullopt}, {{"out", out}});
}

// Decode with weights out-features first and unpacked (transformers' layout, as a model holds
// them): each expert's few rows against its weight rows on the dotrows kernel, which streams
// every weight row once, in place (ragged_dot's transposed form would pack or stride). Up to
// one pass of the kernel's rows an expert: past that its f32 FMAs, not memory, bound it (Qwen3-
// 30B-A3B at 64 tokens, 4 rows an expert on average and up to about 10: 91 ms on this kernel,
// 74 ms on the grouped path, 30-39 ms with the weights packed once; Zen 4, 2 threads).
constexpr int64_t kDecodeRows = kernels::kDotMaxRows;
// Output columns per work item: enough items to balance the threads over the experts hit.
constexpr int64_t kDecodeCols = 64;

// out [S, cols] f32 = a [S, depth] (f32) x W[e]^T per expert, W [E, cols, depth] (ldw depth).
void decode_product(const MoeCall& c, const std::vector<int64_t>& offsets, const float* a,
                    int64_t depth, const TensorView& w, int64_t cols, float* out) {
  static const kernels::DotRowsKernel kernel = kernels::dotrows_kernel(kernels::best_kernels().isa);
  struct Item {
    int64_t e, c0;
  };
  std::vector<Item> items;
  for (int64_t e = 0; e < c.e; ++e)
    if (c.counts[e] > 0)
      for (int64_t c0 = 0; c0 < cols; c0 += kDecodeCols) items.push_back({e, c0});
  const bool bf16 = w.dtype() == DType::kBF16;
  const int64_t es = static_cast<int64_t>(dtype_size(w.dtype()));
  parallel_for(static_cast<int64_t>(items.size()), c.num_threads, [&](int64_t i, int) {
    const Item& it = items[static_cast<size_t>(i)];
    const int64_t r0 = offsets[it.e];
    kernel(c.counts[it.e], std::min(kDecodeCols, cols - it.c0), depth, a + r0 * depth, depth,
           static_cast<const char*>(w.data()) + (it.e * cols + it.c0) * depth * es, bf16, depth,
           out + r0 * cols + it.c0, cols);
  });
}

class Native : public TypedImplementation<MoeCall, void> {
 public:
  std::string name() const override { return "native"; }
  void run_call(MoeCall& c, const Prepared*) const override {
    const TensorView& out = c.out();
    const int64_t slots = c.t * c.top_k, K = c.k, N = c.n;
    const int64_t out_es = static_cast<int64_t>(dtype_size(out.dtype()));
    if (slots == 0 || N == 0 || K == 0) {
      std::memset(out.data(), 0, static_cast<size_t>(c.t * K * out_es));
      return;
    }
    const int threads = c.num_threads;
    // The tokens' rows in expert order.
    std::vector<int64_t> slot_of(static_cast<size_t>(slots));
    for (int64_t s = 0; s < slots; ++s) slot_of[c.sorted_row[s]] = s;
    Tensor y({slots, K}, DType::kF32);
    const int32_t most = *std::max_element(c.counts.begin(), c.counts.end());
    if (c.transposed_weights && c.packed.empty() && most <= kDecodeRows) {
      decode(c, slot_of, y.data_as<float>());
    } else {
      grouped(c, slot_of, y.view());
    }
    // Each token's k results, weighted, summed in j order.
    parallel_for(c.t, threads, [&](int64_t t, int) {
      std::vector<float> acc(static_cast<size_t>(K), 0.0f);
      for (int64_t j = 0; j < c.top_k; ++j) {
        const float w = load_f32(c.top_k_weights, t * c.top_k + j);
        const float* row = y.data_as<float>() + c.sorted_row[t * c.top_k + j] * K;
        for (int64_t i = 0; i < K; ++i) acc[i] += w * row[i];
      }
      if (out.dtype() == DType::kF32) {
        std::memcpy(out.data_as<float>() + t * K, acc.data(), static_cast<size_t>(K) * 4);
      } else {
        for (int64_t i = 0; i < K; ++i) store_f32(out, t * K + i, acc[i]);
      }
    });
  }

 private:
  // The decode path (decode_product): rows gathered in f32, rounded as the products multiply
  // them (bf16 against bf16 weights: ragged_dot's kDefault), both products on dotrows.
  static void decode(const MoeCall& c, const std::vector<int64_t>& slot_of, float* y) {
    const int64_t slots = c.t * c.top_k, K = c.k, N = c.n;
    std::vector<int64_t> offsets(static_cast<size_t>(c.e) + 1, 0);
    for (int64_t e = 0; e < c.e; ++e) offsets[e + 1] = offsets[e] + c.counts[e];
    const bool round_x = c.w_gate_up.dtype() == DType::kBF16;
    std::vector<float> xs(static_cast<size_t>(slots * K));
    parallel_for(slots, c.num_threads, [&](int64_t row, int) {
      const int64_t src = (slot_of[row] / c.top_k) * K;
      for (int64_t i = 0; i < K; ++i) {
        const float v = load_f32(c.hidden, src + i);
        xs[row * K + i] = round_x ? bf16_to_f32(f32_to_bf16(v)) : v;
      }
    });
    std::vector<float> gu(static_cast<size_t>(slots * 2 * N));
    decode_product(c, offsets, xs.data(), K, c.w_gate_up, 2 * N, gu.data());
    std::vector<float> act(static_cast<size_t>(slots * N));
    gated(c, gu.data(), act.data(), c.act_dtype() == DType::kBF16);
    decode_product(c, offsets, act.data(), N, c.w_down, K, y);
  }

  // The grouped path: rows gathered in the dtype ragged_dot multiplies, both products as its
  // native calls.
  static void grouped(const MoeCall& c, const std::vector<int64_t>& slot_of, const TensorView& y) {
    const int64_t slots = c.t * c.top_k, K = c.k, N = c.n;
    // bf16 hidden states against f32 weights are widened (exactly): ragged_dot multiplies
    // f32 x f32, bf16 x bf16 and f32 x bf16.
    const DType x_dt = c.w_gate_up.dtype() == DType::kF32 ? DType::kF32 : c.hidden.dtype();
    const bool widen = x_dt != c.hidden.dtype();
    const int64_t x_es = static_cast<int64_t>(dtype_size(x_dt));
    Tensor xs({slots, K}, x_dt);
    parallel_for(slots, c.num_threads, [&](int64_t row, int) {
      const int64_t src = (slot_of[row] / c.top_k) * K;
      if (widen) {
        for (int64_t i = 0; i < K; ++i)
          xs.data_as<float>()[row * K + i] = load_f32(c.hidden, src + i);
      } else {
        std::memcpy(static_cast<char*>(xs.data()) + row * K * x_es,
                    static_cast<const char*>(c.hidden.data()) + src * x_es,
                    static_cast<size_t>(K * x_es));
      }
    });
    Tensor gu({slots, 2 * N}, DType::kF32);
    experts_product(c, xs.view(), c.w_gate_up, c.packed.gate_up, gu.view());
    Tensor act({slots, N}, c.act_dtype());
    if (act.dtype() == DType::kF32) {
      gated(c, gu.data_as<float>(), act.data_as<float>(), false);
    } else {
      std::vector<float> tmp(static_cast<size_t>(slots * N));
      gated(c, gu.data_as<float>(), tmp.data(), false);
      for (int64_t i = 0; i < slots * N; ++i) act.data_as<uint16_t>()[i] = f32_to_bf16(tmp[i]);
    }
    experts_product(c, act.view(), c.w_down, c.packed.down, y);
  }

  // act [S, N] = activation(gate) * up from gu [S, 2N] on the vector row kernel; round: to the
  // nearest bf16 (kept in f32).
  static void gated(const MoeCall& c, const float* gu, float* act, bool round) {
    const auto act_mul = kernels::row_kernels(kernels::best_kernels().isa).act_mul;
    const int code = static_cast<int>(c.activation);
    const int64_t N = c.n;
    parallel_for(c.t * c.top_k, c.num_threads, [&](int64_t row, int) {
      const float* g = gu + row * 2 * N;
      float* o = act + row * N;
      act_mul(code, g, g + N, o, N);
      if (round)
        for (int64_t i = 0; i < N; ++i) o[i] = bf16_to_f32(f32_to_bf16(o[i]));
    });
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace moe
}  // namespace tokamax
