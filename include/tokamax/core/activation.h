// Elementwise activations that ops apply to their f32 results (ragged_dot's epilogue; the gated
// linear unit's gate), with their names as specs and the CLI spell them. Core vocabulary, as
// DType is: the kernels apply them (src/kernels/activation.h) and the ops name them.
#pragma once

#include <string_view>

#include "tokamax/core/enum_names.h"
#include "tokamax/core/export.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

enum class Activation { kNone, kRelu, kSilu, kGelu, kGeluTanh, kSigmoid };

std::string_view activation_name(Activation a);
// InvalidArgument listing the names.
Activation parse_activation(std::string_view s);
// The names' table (specs, keys, the CLI, the ops' descriptions).
const EnumNames<Activation, 6>& activation_names();

}  // namespace tokamax
TOKAMAX_PUBLIC_END
