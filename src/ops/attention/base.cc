// dot_product_attention: arguments, bind (validation), the reference, tolerances and cost.
#include "ops/attention/base.h"

#include <fmt/format.h>

#include <algorithm>

#include "autotuning/bf16_dot.h"
#include "core/f32_range.h"
#include "core/thread_pool.h"
#include "kernels/grouped_gemm.h"
#include "kernels/microkernels.h"

namespace tokamax::attn {

namespace {

using A = Args<AttentionCall>;

InvalidArgument bad(const std::string& what) {
  return InvalidArgument("dot_product_attention: " + what);
}

// Element strides over (b, n, t, s) of a contiguous array broadcast (numpy rules, aligned
// right) to [B,N,T,S].
void broadcast_strides(const char* name, const TensorView& x, const Shape& target,
                       int64_t* strides) {
  const std::string want = shape_str(target);
  if (x.rank() > 4) {
    throw bad(fmt::format("{} has shape {}; expected rank <= 4, broadcastable to [B,N,T,S] = {}",
                          name, x.spec().str(), want));
  }
  if (!x.is_contiguous())
    throw bad(fmt::format("{} {} must be a contiguous row-major array", name, x.spec().str()));
  const Strides own = contiguous_strides(x.shape());
  for (int d = 0; d < 4; ++d) {
    const int64_t xd = d - (4 - x.rank());
    strides[d] = 0;
    if (xd < 0) continue;
    const int64_t size = x.dim(xd);
    if (size == target[d]) {
      strides[d] = target[d] == 1 ? 0 : own[xd];
    } else if (size != 1) {
      throw bad(fmt::format("{} has shape {}, not broadcastable to [B,N,T,S] = {}", name,
                            x.spec().str(), want));
    }
  }
}

// Made calls: lengths uniform in [0, size], masks mostly true.
auto lengths_within(bool queries) {
  return [queries](const AttentionCall& c, const TensorView& v, uint64_t seed) {
    const int64_t size = queries ? c.q.dim(1) : c.k.dim(1);
    Tensor u = Tensor::uniform(v.shape(), DType::kF64, seed);
    for (int64_t i = 0; i < v.size(); ++i) {
      v.data_as<int32_t>()[i] = static_cast<int32_t>(
          std::min<int64_t>(size, static_cast<int64_t>(u.data_as<double>()[i] * (size + 1))));
    }
  };
}
void mostly_true(const CallBase&, const TensorView& v, uint64_t seed) {
  Tensor u = Tensor::uniform(v.shape(), DType::kF64, seed);
  for (int64_t i = 0; i < v.size(); ++i) v.data_as<uint8_t>()[i] = u.data_as<double>()[i] < 0.8;
}

template <class CallT>
ArgField<CallT> window_field() {
  return Args<CallT>::custom(
      "local_window_size",
      [](const CallT& c) {
        if (c.window_left < 0 && c.window_right < 0) return Json();
        return Json::array({c.window_left, c.window_right});
      },
      [](CallT& c, const Json& j) {
        if (j.is_null()) return;
        if (!j.is_array() || j.size() != 2 || !j[0].is_number_integer() ||
            !j[1].is_number_integer())
          throw InvalidArgument("expected [left, right] or null");
        c.window_left = j[0].get<int64_t>();
        c.window_right = j[1].get<int64_t>();
        if (c.window_left < 0 || c.window_right < 0) throw InvalidArgument("expected both >= 0");
      },
      [](const CallT& c, Signature& sig) {
        sig.push_back(c.window_left);
        sig.push_back(c.window_right);
      });
}

}  // namespace

namespace {
std::vector<ArgField<AttentionCall>> forward_fields() {
  using C = AttentionCall;
  return {A::input("q", &C::q).python("query").describe("f32 or bf16 [B, T, N, H]"),
          A::input("k", &C::k).python("key").describe("[B, S, K, H], N a multiple of K (GQA)"),
          A::input("v", &C::v).python("value").describe("[B, S, K, Hv]"),
          A::optional_input("bias", &C::bias)
              .describe("added to the logits; broadcasts to [B, N, T, S]"),
          A::optional_input("mask", &C::mask, mostly_true)
              .describe("bool, broadcasts to [B, N, T, S]; false masks a logit out"),
          A::optional_input("q_seq_lengths", &C::q_seq_lengths, lengths_within(true))
              .python("query_seq_lengths")
              .keyword()
              .describe("int32 [B]: valid query rows per batch"),
          A::optional_input("kv_seq_lengths", &C::kv_seq_lengths, lengths_within(false))
              .python("key_value_seq_lengths")
              .keyword()
              .describe("int32 [B]: valid key rows per batch"),
          A::optional_real("scale", &C::scale).describe("the logits' scale; None: 1/sqrt(H)"),
          A::value("is_causal", &C::is_causal).describe("mask the logits above the diagonal"),
          window_field<AttentionCall>().describe(
              "(left, right): a query attends to keys within that many positions; None on a side "
              "is unbounded"),
          A::optional_real("logits_soft_cap", &C::logits_soft_cap)
              .describe("logits become cap * tanh(logits / cap)"),
          A::residuals_flag(&C::return_residuals)};
}
}  // namespace

std::string Family::summary() const {
  return "Scaled dot-product attention (tokamax's dot_product_attention): softmax(q k^T * scale "
         "+ bias, masked) v, in one pass over the keys.";
}

std::vector<OutputDoc> Family::output_docs() const {
  return {{"out", "[B, T, N, Hv], q's dtype", "q.shape[:3] + (v.shape[3],)", "q.dtype"},
          {"lse", "f32 [B, N, T]: each row's log-sum-exp", "(q.shape[0], q.shape[2], q.shape[1])",
           "float32", "", true}};
}

Family::Family()
    : TypedFamily(kFamily, forward_fields(), std::make_shared<Reference>(),
                  {make_native(), make_composed()}) {}

void set_options(AttentionCall& c, const AttentionOptions& o) {
  c.bias = o.bias;
  c.mask = o.mask;
  c.q_seq_lengths = o.q_seq_lengths;
  c.kv_seq_lengths = o.kv_seq_lengths;
  c.scale = o.scale;
  c.is_causal = o.is_causal;
  if (o.local_window_size) {
    c.window_left = o.local_window_size->first;
    c.window_right = o.local_window_size->second;
    if (c.window_left < 0 || c.window_right < 0) {
      throw bad(fmt::format("local_window_size ({}, {}); expected both >= 0", c.window_left,
                            c.window_right));
    }
  }
  c.logits_soft_cap = o.logits_soft_cap;
  c.num_threads = 0;
}

const Family& family() { return family_instance<Family>(); }

void Family::bind(AttentionCall& c) const { bind_forward(c); }

void bind_forward(AttentionCall& c) {
  for (const auto& [name, x] : {std::pair{"q", &c.q}, std::pair{"k", &c.k}, std::pair{"v", &c.v}}) {
    if (x->rank() != 4) {
      throw bad(fmt::format("{} has shape {}; expected rank 4 ({})", name, x->spec().str(),
                            *name == 'q'   ? "[B,T,N,H]"
                            : *name == 'k' ? "[B,S,Nk,H]"
                                           : "[B,S,Nk,Hv]"));
    }
    if (x->dtype() != c.q.dtype() || (x->dtype() != DType::kF32 && x->dtype() != DType::kBF16)) {
      throw bad(fmt::format("q {}, k {}, v {}: expected one dtype for all three, f32 or bf16",
                            c.q.spec().str(), c.k.spec().str(), c.v.spec().str()));
    }
    if (!x->is_contiguous())
      throw bad(fmt::format("{} {} must be a contiguous row-major array", name, x->spec().str()));
  }
  c.b = c.q.dim(0);
  c.t = c.q.dim(1);
  c.n = c.q.dim(2);
  c.h = c.q.dim(3);
  c.s = c.k.dim(1);
  c.nk = c.k.dim(2);
  c.hv = c.v.dim(3);
  if (c.k.dim(0) != c.b || c.v.dim(0) != c.b) {
    throw bad(fmt::format("batch sizes differ: q {}, k {}, v {}; expected equal B",
                          c.q.spec().str(), c.k.spec().str(), c.v.spec().str()));
  }
  if (c.k.dim(3) != c.h) {
    throw bad(fmt::format("head dims differ: q {} has H={}, k {} has {}; expected equal",
                          c.q.spec().str(), c.h, c.k.spec().str(), c.k.dim(3)));
  }
  if (c.v.dim(1) != c.s || c.v.dim(2) != c.nk) {
    throw bad(fmt::format("k {} and v {}: expected the same S and Nk", c.k.spec().str(),
                          c.v.spec().str()));
  }
  if (c.nk == 0 ? c.n != 0 : c.n % c.nk != 0) {
    throw bad(fmt::format("q has N={} heads, k has Nk={}; expected N a multiple of Nk", c.n, c.nk));
  }
  const Shape target = {c.b, c.n, c.t, c.s};
  if (c.bias) {
    if (c.bias->dtype() != DType::kF32 && c.bias->dtype() != DType::kBF16)
      throw bad("bias " + c.bias->spec().str() + ": expected f32 or bf16");
    broadcast_strides("bias", *c.bias, target, c.bias_strides);
  }
  if (c.mask) {
    if (c.mask->dtype() != DType::kBool)
      throw bad("mask " + c.mask->spec().str() + ": expected bool");
    broadcast_strides("mask", *c.mask, target, c.mask_strides);
  }
  for (const auto& [name, x, limit] : {std::tuple{"q_seq_lengths", &c.q_seq_lengths, c.t},
                                       std::tuple{"kv_seq_lengths", &c.kv_seq_lengths, c.s}}) {
    if (!*x) continue;
    const TensorView& l = **x;
    if (l.dtype() != DType::kI32 || l.rank() != 1 || l.dim(0) != c.b || !l.is_contiguous()) {
      throw bad(fmt::format("{} has spec {}; expected i32[{}] (one length per batch)", name,
                            l.spec().str(), c.b));
    }
    for (int64_t i = 0; l.data() && i < c.b; ++i) {
      const int32_t x_i = l.data_as<const int32_t>()[i];
      if (x_i < 0 || x_i > limit)
        throw bad(fmt::format("{}[{}] = {}; expected in [0, {}]", name, i, x_i, limit));
    }
  }
  if ((c.window_left < 0) != (c.window_right < 0) || c.window_left < -1 || c.window_right < -1) {
    throw bad(fmt::format("local_window_size ({}, {}); expected both >= 0", c.window_left,
                          c.window_right));
  }
  if (c.scale) check_in_f32_range(kFamily, "scale", *c.scale, /*allow_zero=*/true, false);
  if (c.logits_soft_cap) {
    check_in_f32_range(kFamily, "logits_soft_cap", *c.logits_soft_cap, /*allow_zero=*/false,
                       /*positive=*/true);
  }
  c.scale_value =
      static_cast<float>(c.scale ? *c.scale : 1.0 / std::sqrt(std::max<int64_t>(c.h, 1)));
}

std::vector<ShapeDtype> Family::output_specs(const AttentionCall& c) const {
  std::vector<ShapeDtype> out = {{{c.b, c.t, c.n, c.hv}, c.q.dtype()}};
  if (c.return_residuals) out.push_back({{c.b, c.n, c.t}, DType::kF32});
  return out;
}

Tolerance Family::tolerance_of(const AttentionCall& c) const {
  // tokamax's attention tolerances: f32 atol 1e-6 against a HIGHEST-precision reference; here
  // both sides sum in f32 in different orders over S, so the bound grows with sqrt(S).
  const double depth = std::sqrt(static_cast<double>(std::max<int64_t>(c.s, 1)));
  if (c.q.dtype() == DType::kBF16) return {1e-2, 1e-2, 0};
  return {2e-6 * depth, 1e-5, 1e-5};
}

double call_flops(const AttentionCall& c) {
  double pairs = static_cast<double>(c.t) * static_cast<double>(c.s);
  if (c.is_causal) pairs /= 2;
  return 2.0 * static_cast<double>(c.b * c.n) * pairs * static_cast<double>(c.h + c.hv);
}

double call_bytes(const AttentionCall& c) {
  const double es = dtype_size(c.q.dtype());
  return es * static_cast<double>(c.q.size() + c.k.size() + c.v.size() + c.b * c.t * c.n * c.hv);
}

bool Family::memory_bound_of(const AttentionCall& c) const {
  const double bytes = call_bytes(c);
  return bytes > 0 && call_flops(c) / bytes < 8.0;
}

bool native_uses_bf16_pairs(const AttentionCall& c) {
  return (kernels::best_kernels().amx || vector_bf16_dot_pays()) && c.q.dtype() == DType::kBF16 &&
         c.k.dtype() == DType::kBF16 && c.v.dtype() == DType::kBF16;
}

void kv_panels(const kernels::KernelSet& ks, const TensorView& x, int64_t b, int64_t kh,
               bool across_positions, int64_t p0, int64_t p1, float* dst) {
  const int64_t s = x.shape()[1], nk = x.shape()[2], d = x.shape()[3];
  const char* src =
      static_cast<const char*>(x.data()) + (b * s * nk + kh) * d * dtype_size(x.dtype());
  // Across positions: the slice's rows [S, D] are x^T's panels' columns (pack_panels' [N,K]).
  kernels::pack_panels(ks, false, src, x.dtype() == DType::kBF16, across_positions,
                       across_positions ? d : s, across_positions ? s : d, dst, p0, p1, nk * d);
}

CallCost Family::cost_of(const AttentionCall& c) const {
  return {call_flops(c), memory_bound_of(c) ? call_bytes(c) : 0.0, native_uses_bf16_pairs(c)};
}

// --- reference: each row's logits materialized, max-subtracted softmax in f32, then p.v ---

void Reference::run_call(AttentionCall& c, const Prepared*) const {
  const int64_t G = c.group();
  TensorView lse = c.lse() ? *c.lse() : TensorView();
  parallel_for(c.b * c.n * c.t, c.num_threads, [&](int64_t row, int) {
    const int64_t bb = row / (c.n * c.t), nn = row / c.t % c.n, tt = row % c.t;
    const int64_t kh = nn / G;
    int64_t s0, s1;
    c.s_range(bb, tt, &s0, &s1);
    std::vector<float> logits(static_cast<size_t>(c.s), -std::numeric_limits<float>::infinity());
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t ss = s0; ss < s1; ++ss) {
      if (!c.mask_allows(bb, nn, tt, ss)) continue;
      float dot = 0;
      for (int64_t d = 0; d < c.h; ++d) {
        dot += load_f32(c.q, ((bb * c.t + tt) * c.n + nn) * c.h + d) *
               load_f32(c.k, ((bb * c.s + ss) * c.nk + kh) * c.h + d);
      }
      logits[ss] = c.logit(dot, bb, nn, tt, ss);
      m = logits[ss] > m || std::isnan(logits[ss]) ? logits[ss] : m;  // NaN sticks
    }
    std::vector<float> acc(static_cast<size_t>(c.hv), 0.0f);
    float l = 0;
    if (m != -std::numeric_limits<float>::infinity()) {
      for (int64_t ss = s0; ss < s1; ++ss) {
        if (logits[ss] == -std::numeric_limits<float>::infinity()) continue;
        const float p = std::exp(logits[ss] - m);
        l += p;
        for (int64_t d = 0; d < c.hv; ++d)
          acc[d] += p * load_f32(c.v, ((bb * c.s + ss) * c.nk + kh) * c.hv + d);
      }
    }
    for (int64_t d = 0; d < c.hv; ++d)
      store_f32(c.out(), ((bb * c.t + tt) * c.n + nn) * c.hv + d, l == 0 ? 0.0f : acc[d] / l);
    if (c.lse()) {  // a NaN logit makes l, and so the output and the log-sum-exp, NaN
      lse.data_as<float>()[(bb * c.n + nn) * c.t + tt] =
          l == 0 ? -std::numeric_limits<float>::infinity() : m + std::log(l);
    }
  });
}

}  // namespace tokamax::attn
