// Elementwise activations that ops apply to their f32 results (ragged_dot's epilogue; the gated
// linear unit's gate), with their names as specs and the CLI spell them.
#pragma once

#include <string_view>

#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class Activation { kNone, kRelu, kSilu, kGelu, kGeluTanh, kSigmoid };

std::string_view activation_name(Activation a);
// InvalidArgument listing the names.
Activation parse_activation(std::string_view s);

}  // namespace tokamax
TOKAMAX_PUBLIC_END
