// The activations' names (tokamax/core/activation.h).
#include "tokamax/core/activation.h"

namespace tokamax {

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

std::string_view activation_name(Activation a) { return activation_names().name(a); }
Activation parse_activation(std::string_view s) { return activation_names().parse(s); }

}  // namespace tokamax
