// The add_rms_norm family: its call, its description, bind and the reference (base.cc), the
// native and composed implementations and the arg specs. Rows are x's last axis (D).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "tokamax/op/family.h"
#include "tokamax/op/typed.h"
#include "tokamax/ops/add_norm.h"

namespace tokamax::add_norm {

inline constexpr const char* kFamily = "add_rms_norm";

struct AddNormCall : CallBase {
  TensorView x, residual;
  std::optional<TensorView> scale;
  double epsilon = AddRmsNormOptions().epsilon;

  int64_t rows = 0, d = 0;  // filled by bind
  bool bf16 = false;

  const TensorView& y() const { return outputs.at(0); }
  const TensorView& sum() const { return outputs.at(1); }
};

std::shared_ptr<const Implementation> make_native();
// The outputs' size from which native writes them non-temporally: the last-level cache's (0: a
// test's override off), so that tests reach the streamed path on small arrays.
int64_t stream_threshold_bytes();
void set_stream_threshold_for_testing(int64_t bytes);
std::shared_ptr<const Implementation> make_composed();
std::vector<ArgSpec> arg_specs();

class Family : public TypedFamily<AddNormCall> {
 public:
  Family();
  void bind(AddNormCall& call) const override;
  std::string summary() const override;
  std::vector<OutputDoc> output_docs() const override;
  std::vector<ShapeDtype> output_specs(const AddNormCall& c) const override {
    return {c.x.spec(), c.x.spec()};
  }
  Tolerance tolerance_of(const AddNormCall& call) const override;
  std::vector<ArgSpec> arg_specs() const override { return add_norm::arg_specs(); }
  bool memory_bound_of(const AddNormCall&) const override { return true; }
  CallCost cost_of(const AddNormCall& call) const override;
};
const Family& family();

}  // namespace tokamax::add_norm
