// Named linear_softmax_cross_entropy_loss workloads with tags: `smoke` (tiny, CI), `primary`
// (benchmarks, shipped tuning data: 512 tokens of width 2048 over Llama-2's 32,000-token
// vocabulary), `large` (4096 tokens over 32,000; 512 and 4096 over Qwen's 151,936, the latter
// also `target`: the performance target's shape, 2.5 TFLOP a call, too slow to tune here).
#include "ops/loss/base.h"

namespace tokamax::loss {
namespace {

ArgSpec spec(std::string name, int64_t b, int64_t h, int64_t v, const char* reduction,
             std::vector<std::string> tags, DType dt = DType::kF32) {
  Json args = {{"x", ShapeDtype{{b, h}, dt}.str()},
               {"labels", ShapeDtype{{b}, DType::kI32}.str()},
               {"w", ShapeDtype{{h, v}, dt}.str()},
               {"reduction", reduction}};
  return ArgSpec{kFamily, std::move(name), std::move(args), std::move(tags)};
}

}  // namespace

std::vector<ArgSpec> arg_specs() {
  return {spec("loss_smoke", 37, 45, 333, "mean", {"smoke"}),
          spec("loss_smoke_none_bf16", 9, 64, 130, "none", {"smoke"}, DType::kBF16),
          spec("loss_512x2048x32000", 512, 2048, 32000, "mean", {"primary"}),
          spec("loss_4096x2048x151936", 4096, 2048, 151936, "mean", {"large", "target"}),
          spec("loss_512x2048x32000_bf16", 512, 2048, 32000, "mean", {"primary"}, DType::kBF16),
          spec("loss_4096x2048x32000", 4096, 2048, 32000, "sum", {"large"}),
          spec("loss_512x2048x151936", 512, 2048, 151936, "mean", {"large"})};
}

}  // namespace tokamax::loss
