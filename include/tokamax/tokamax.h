// tokamax: fast CPU ML kernels with an autotuner. Include this one header.
#pragma once

#include "tokamax/autotuning/autotuner.h"
#include "tokamax/autotuning/autotuning.h"
#include "tokamax/autotuning/cache.h"
#include "tokamax/autotuning/measurement.h"
#include "tokamax/autotuning/roofline.h"
#include "tokamax/core/device.h"
#include "tokamax/core/dtype.h"
#include "tokamax/core/error.h"
#include "tokamax/core/json.h"
#include "tokamax/core/log.h"
#include "tokamax/core/shape_dtype.h"
#include "tokamax/core/tensor.h"
#include "tokamax/op/config.h"
#include "tokamax/op/dispatch.h"
#include "tokamax/op/op.h"
#include "tokamax/ops/ragged_dot.h"
