// The activations: their names and derivatives (src/kernels/activation.h has their arithmetic).
#include "kernels/activation.h"

#include <cmath>

namespace tokamax {

namespace kernels {

const EnumNames<Activation, 6>& activation_names() {
  static constexpr EnumNames<Activation, 6> kNames{"activation",
                                                   {{{Activation::kNone, "none"},
                                                     {Activation::kRelu, "relu"},
                                                     {Activation::kSilu, "silu"},
                                                     {Activation::kGelu, "gelu"},
                                                     {Activation::kGeluTanh, "gelu_tanh"},
                                                     {Activation::kSigmoid, "sigmoid"}}}};
  return kNames;
}

double activation_grad(Activation a, double x) {
  switch (a) {
    case Activation::kNone:
      return 1;
    case Activation::kRelu:
      return x > 0 ? 1 : 0;
    case Activation::kSilu: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 + x * (1 - s));
    }
    case Activation::kGelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Activation::kSigmoid: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 - s);
    }
    case Activation::kGeluTanh: {
      const double c = 0.7978845608028654, u = c * (x + 0.044715 * x * x * x);
      const double t = std::tanh(u);
      return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x);
    }
  }
  return 1;
}

}  // namespace kernels

std::string_view activation_name(Activation a) { return kernels::activation_names().name(a); }
Activation parse_activation(std::string_view s) { return kernels::activation_names().parse(s); }

}  // namespace tokamax
