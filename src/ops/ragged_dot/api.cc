// Public ragged_dot functions: bind, allocate the output, dispatch.
#include "core/thread_pool.h"
#include "ops/elements.h"
#include "ops/ragged_dot/base.h"
#include "tokamax/op/dispatch.h"

namespace tokamax {

namespace {

using rdot::RaggedDotCall;

// An f32 tensor as `to` (f32: itself; bf16: rounded to nearest even).
Tensor to_dtype(Tensor t, DType to) {
  if (to == DType::kF32) return t;
  Tensor out(t.shape(), to);
  for (int64_t i = 0; i < t.size(); ++i)
    out.data_as<uint16_t>()[i] = f32_to_bf16(t.data_as<float>()[i]);
  return out;
}

// A call with the options' statics and the given inputs.
RaggedDotCall make(const TensorView& lhs, std::span<const int32_t> group_sizes, RaggedDimNums dims,
                   const RaggedDotOptions& o) {
  RaggedDotCall c;
  c.lhs = lhs;
  c.group_sizes.assign(group_sizes.begin(), group_sizes.end());
  c.dims = dims;
  c.preferred_element_type = o.preferred_element_type;
  c.activation = o.activation;
  c.precision = o.precision;
  c.representative_group_sizes = o.representative_group_sizes;
  c.num_threads = 0;
  return c;
}

// A call reading pre-packed weights (the logical rhs has no data of its own).
RaggedDotCall make_packed(const TensorView& lhs, const PackedRhs& rhs,
                          std::span<const int32_t> group_sizes, const RaggedDotOptions& o) {
  if (rhs.empty()) throw InvalidArgument("ragged_dot: rhs is an empty PackedRhs");
  RaggedDotCall c = make(lhs, group_sizes, rhs.dim_nums(), o);
  const ShapeDtype logical = rhs.logical();
  c.rhs = TensorView(nullptr, logical.dtype, logical.shape);
  c.packed = rhs;
  c.packed_rhs = true;
  return c;
}

Tensor run_call(RaggedDotCall& c, const RaggedDotOptions& o) {
  return std::move(rdot::family().run(c, CallOptions{o.implementation, o.config}).at(0));
}

}  // namespace

Tensor ragged_dot_general(const TensorView& lhs, const TensorView& rhs,
                          std::span<const int32_t> group_sizes, RaggedDimNums dims,
                          const RaggedDotOptions& o) {
  RaggedDotCall c = make(lhs, group_sizes, dims, o);
  c.rhs = rhs;
  return run_call(c, o);
}

Tensor ragged_dot(const TensorView& lhs, const TensorView& rhs,
                  std::span<const int32_t> group_sizes, const RaggedDotOptions& o) {
  return ragged_dot_general(lhs, rhs, group_sizes, RaggedDimNums::kForward, o);
}

Tensor ragged_dot(const TensorView& lhs, const PackedRhs& rhs, std::span<const int32_t> group_sizes,
                  const RaggedDotOptions& o) {
  RaggedDotCall c = make_packed(lhs, rhs, group_sizes, o);
  return run_call(c, o);
}

void ragged_dot_into(const TensorView& lhs, const TensorView& rhs,
                     std::span<const int32_t> group_sizes, const TensorView& out,
                     const RaggedDotOptions& o) {
  RaggedDotCall c = make(lhs, group_sizes, RaggedDimNums::kForward, o);
  c.rhs = rhs;
  rdot::family().run_into(c, CallOptions{o.implementation, o.config}, {{"out", out}});
}

void ragged_dot_into(const TensorView& lhs, const PackedRhs& rhs,
                     std::span<const int32_t> group_sizes, const TensorView& out,
                     const RaggedDotOptions& o) {
  RaggedDotCall c = make_packed(lhs, rhs, group_sizes, o);
  rdot::family().run_into(c, CallOptions{o.implementation, o.config}, {{"out", out}});
}

Tensor ragged_dot(const TensorView& lhs, const TensorView& rhs, const TensorView& group_sizes,
                  const RaggedDotOptions& o) {
  if (group_sizes.dtype() != DType::kI32 || group_sizes.rank() != 1 ||
      !group_sizes.is_contiguous()) {
    throw InvalidArgument("ragged_dot: group_sizes has spec " + group_sizes.spec().str() +
                          "; expected a contiguous i32[G] tensor");
  }
  if (group_sizes.data() == nullptr && group_sizes.size() > 0) {
    throw InvalidArgument("ragged_dot: group_sizes " + group_sizes.spec().str() +
                          " has a null data pointer; expected its G sizes");
  }
  return ragged_dot(
      lhs, rhs, std::span<const int32_t>(group_sizes.data_as<const int32_t>(), group_sizes.dim(0)),
      o);
}

RaggedDotGrads ragged_dot_vjp(const TensorView& lhs, const TensorView& rhs,
                              std::span<const int32_t> group_sizes, const TensorView& dout,
                              const RaggedDotOptions& o) {
  RaggedDotCall c = make(lhs, group_sizes, RaggedDimNums::kForward, o);
  c.rhs = rhs;
  rdot::family().bind_and_checked(c);  // the forward's checks, null data pointers included
  if (dout.rank() != 2 || dout.dim(0) != c.m || dout.dim(1) != c.n || !dout.is_contiguous()) {
    throw InvalidArgument("ragged_dot_vjp: dout has spec " + dout.spec().str() +
                          "; expected contiguous [" + std::to_string(c.m) + "," +
                          std::to_string(c.n) + "]");
  }
  if (dout.data() == nullptr && dout.size() > 0) {
    throw InvalidArgument("ragged_dot_vjp: dout " + dout.spec().str() +
                          " has a null data pointer; expected the array's elements");
  }
  // Cotangent of the pre-activation output, in f32, a row at a time on the call's threads.
  Tensor dpre({c.m, c.n}, DType::kF32);
  float* dp = dpre.data_as<float>();
  Tensor pre;
  if (o.activation != Activation::kNone) {
    RaggedDotOptions fo = o;
    fo.activation = Activation::kNone;
    fo.preferred_element_type = DType::kF32;
    fo.config.reset();
    pre = ragged_dot(lhs, rhs, group_sizes, fo);
  }
  // dout in any dtype the library reads (numpy's default float64 too), as f32.
  const bool f32_or_bf16 = dout.dtype() == DType::kF32 || dout.dtype() == DType::kBF16;
  parallel_for(c.m, c.num_threads, [&](int64_t r, int) {
    for (int64_t i = r * c.n; i < (r + 1) * c.n; ++i) {
      const float d = f32_or_bf16 ? load_f32(dout, i) : static_cast<float>(dout.get(i));
      dp[i] =
          o.activation != Activation::kNone
              ? static_cast<float>(d * rdot::activation_grad(o.activation, pre.data_as<float>()[i]))
              : d;
    }
  });
  // dpre in the dtype the primal used for its operands, so the same kernels serve.
  dpre = to_dtype(std::move(dpre), lhs.dtype());
  RaggedDotOptions go;
  go.implementation = o.implementation;
  go.precision = o.precision;
  go.preferred_element_type = DType::kF32;
  RaggedDotGrads grads;
  // dlhs[M,K] = dpre[M,N] x rhs[g]^T: the transposed-rhs form with rhs [G,K,N] read as [G,N',K'].
  Tensor dl = ragged_dot_general(dpre, rhs, group_sizes, RaggedDimNums::kTransposedRhs, go);
  // drhs[g] = lhs[rows_g]^T x dpre[rows_g]: the ragged-contracting form.
  Tensor dr = ragged_dot_general(lhs, dpre, group_sizes, RaggedDimNums::kRaggedContracting, go);
  grads.dlhs = to_dtype(std::move(dl), lhs.dtype());
  grads.drhs = to_dtype(std::move(dr), rhs.dtype());
  return grads;
}

}  // namespace tokamax
