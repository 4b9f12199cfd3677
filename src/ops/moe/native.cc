// The native moe_experts: the routing sorted by expert (bind's counting sort), the tokens'
// rows gathered in that order, the gate-up product as one ragged_dot over the experts, the
// gated activation on the vector row kernel, the down product as a second ragged_dot, and the
// weighted combine per token. The products are ragged_dot's native calls (its kernels, its
// tuned configs and its decode streaming), on the caller's threads of the library's pool.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
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
    products(c, slot_of, y.view());
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
  // Rows gathered in the dtype ragged_dot multiplies, both products as its native calls (with
  // transformers' layout unpacked and a few rows an expert, its dotrows stream: the experts hit
  // are read in place, once).
  static void products(const MoeCall& c, const std::vector<int64_t>& slot_of, const TensorView& y) {
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
    gated(c, gu.data_as<float>(), act);
    experts_product(c, act.view(), c.w_down, c.packed.down, y);
  }

  // act [S, N] = activation(gate) * up from gu [S, 2N] on the vector row kernel, in act's
  // dtype (f32, or rounded to bf16).
  static void gated(const MoeCall& c, const float* gu, const Tensor& act) {
    const auto act_mul = kernels::row_kernels(kernels::best_kernels().isa).act_mul;
    const int code = static_cast<int>(c.activation);
    const int64_t N = c.n;
    const bool f32 = act.dtype() == DType::kF32;
    parallel_for(c.t * c.top_k, c.num_threads, [&](int64_t row, int) {
      const float* g = gu + row * 2 * N;
      if (f32) {
        act_mul(code, g, g + N, act.data_as<float>() + row * N, N);
        return;
      }
      std::vector<float> tmp(static_cast<size_t>(N));
      act_mul(code, g, g + N, tmp.data(), N);
      uint16_t* dst = act.data_as<uint16_t>() + row * N;
      for (int64_t i = 0; i < N; ++i) dst[i] = f32_to_bf16(tmp[i]);
    });
  }
};

}  // namespace

std::shared_ptr<const Implementation> make_native() { return std::make_shared<Native>(); }

}  // namespace moe
}  // namespace tokamax
