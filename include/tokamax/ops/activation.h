// The activations' public names, kept here for the programs that include this header: the type
// is core vocabulary now (tokamax/core/activation.h).
#pragma once

#include "tokamax/core/activation.h"
