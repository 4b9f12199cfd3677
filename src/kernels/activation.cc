// The activations' derivatives (src/kernels/activation.h has their arithmetic; their names are
// core's, tokamax/core/activation.h).
#include "kernels/activation.h"

#include <cmath>

namespace tokamax::kernels {

// 1 - sigmoid(x) is taken as sigmoid(-x) throughout: the subtraction cancels in the tails
// (gelu_tanh's 0.5 (1 + tanh(z)) reads 0 at x = -9 where the derivative is -1e-34).
double activation_grad(Activation a, double x) {
  auto sigmoid = [](double v) { return 1 / (1 + std::exp(-v)); };
  switch (a) {
    case Activation::kNone:
      return 1;
    case Activation::kRelu:
      return x > 0 ? 1 : 0;
    case Activation::kSilu:
      return sigmoid(x) * (1 + x * sigmoid(-x));
    case Activation::kGelu:
      return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
             x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    case Activation::kSigmoid:
      return sigmoid(x) * sigmoid(-x);
    case Activation::kGeluTanh: {
      // 0.5 (1 + tanh(z)) = sigmoid(2z) = S, 1 - tanh(z)^2 = 4 S (1 - S).
      const double c = 0.7978845608028654, z2 = 2 * c * (x + 0.044715 * x * x * x);
      const double S = sigmoid(z2);
      const double d = S + 2 * x * S * sigmoid(-z2) * c * (1 + 3 * 0.044715 * x * x);
      return std::isnan(d) && !std::isnan(x) ? S : d;  // x^3 overflowing: saturated, S alone
    }
  }
  return 1;
}

}  // namespace tokamax::kernels
