// The activations' arithmetic, shared by every implementation and the kernels' epilogues (one
// definition, so that every implementation rounds alike).
#pragma once

#include <cmath>

#include "tokamax/core/activation.h"

namespace tokamax::kernels {

inline float apply_activation(Activation a, float x) {
  switch (a) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0.0f;
    case Activation::kSilu:
      return x / (1.0f + std::exp(-x));
    case Activation::kGelu:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::kSigmoid:
      return 1.0f / (1.0f + std::exp(-x));
    case Activation::kGeluTanh:
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

// d activation / dx at x, in double (gradients and their tests).
double activation_grad(Activation a, double x);

}  // namespace tokamax::kernels
