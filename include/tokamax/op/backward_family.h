// BackwardFamily<VjpCallT, CallT>: the backward template. A backward family's call type derives
// from its forward's, and everything that follows from the forward is derived here rather than
// written again in each family: its fields (the forward's user arguments, then the residuals,
// then the cotangent), the residuals' values in a made call (the forward run on the made
// inputs: random residuals would not be the inputs' statistics), the bind prologue (the
// forward's checks, then each residual's and the cotangent's spec against the forward's
// outputs), its `_backward` arg specs and tags, and its description. A family writes what is
// its own: the gradients' specs and documentation, tolerances, cost, the reference and the
// implementations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tokamax/core/export.h"
#include "tokamax/op/family.h"

TOKAMAX_PUBLIC_BEGIN
namespace tokamax {

template <class VjpCallT, class CallT>
class BackwardFamily : public TypedFamily<VjpCallT> {
  static_assert(std::is_base_of_v<CallT, VjpCallT>, "a backward call derives from its forward's");

 public:
  // An input of the backward that the forward does not take: a residual (named as the
  // forward's output it is) or the cotangent (named as the forward's first output's gradient).
  struct Extra {
    std::string name;
    TensorView VjpCallT::*member;
    std::string doc;
  };

  // `leave_out`: forward arguments the backward does not take (the GLU's separate w_up); an arg
  // spec that sets one has no backward spec.
  BackwardFamily(std::string name, const TypedFamily<CallT>& forward, std::vector<Extra> residuals,
                 Extra cotangent, std::shared_ptr<const Implementation> reference,
                 std::vector<std::shared_ptr<const Implementation>> implementations,
                 std::vector<std::string> leave_out = {})
      : TypedFamily<VjpCallT>(std::move(name),
                              derive_fields(forward, residuals, cotangent, leave_out),
                              std::move(reference), std::move(implementations)),
        forward_(forward),
        residuals_(std::move(residuals)),
        cotangent_(std::move(cotangent)),
        leave_out_(std::move(leave_out)),
        primary_output_(forward.output_docs().at(0).name) {
    for (const Extra& r : residuals_) residual_index_.push_back(output_index(forward, r.name));
  }

  const TypedFamily<CallT>& forward() const { return forward_; }

  // The prologue; a family that checks more overrides this and calls bind_prologue first.
  void bind(VjpCallT& call) const override { bind_prologue(call); }

  void bind_prologue(VjpCallT& c) const {
    forward_.bind(c);
    const std::vector<ShapeDtype> outs = forward_outputs(c);
    auto check = [&](const Extra& e, size_t index, const char* what, const std::string& output) {
      const TensorView& v = c.*(e.member);
      if (v.spec() != outs.at(index) || !v.is_contiguous()) {
        throw InvalidArgument(this->name() + ": " + e.name + " has spec " + v.spec().str() +
                              "; expected contiguous " + outs[index].str() + " (" + what + " '" +
                              output + "')");
      }
    };
    for (size_t i = 0; i < residuals_.size(); ++i)
      check(residuals_[i], residual_index_[i], "the forward's output", residuals_[i].name);
    check(cotangent_, 0, "the cotangent of the forward's output", primary_output_);
  }

  // The forward's arg specs, each with its residuals' and cotangent's specs, tagged "backward".
  std::vector<ArgSpec> arg_specs() const override {
    std::vector<ArgSpec> out;
    for (const ArgSpec& s : forward_.arg_specs()) {
      if (!has_backward_spec(s)) continue;
      Json a = s.arguments;
      for (const auto& f : forward_.fields())
        if (f.selects_residuals) a[f.name] = true;
      const std::vector<ShapeDtype> outs = forward_.output_specs_json(a);
      for (const auto& f : forward_.fields())
        if (f.selects_residuals || !f.user) a.erase(f.name);
      for (size_t i = 0; i < residuals_.size(); ++i)
        a[residuals_[i].name] = outs.at(residual_index_[i]).str();
      a[cotangent_.name] = outs.at(0).str();
      std::vector<std::string> tags = s.tags;
      tags.push_back("backward");
      out.push_back(ArgSpec{this->name(), s.name + "_backward", std::move(a), std::move(tags)});
    }
    return out;
  }

  // Which of the forward's specs have a backward one (default: those that set no left-out
  // argument).
  virtual bool has_backward_spec(const ArgSpec& s) const {
    return std::none_of(leave_out_.begin(), leave_out_.end(),
                        [&](const std::string& n) { return s.arguments.contains(n); });
  }

  std::string summary() const override {
    return "The backward of " + forward_.name() + ": the gradients of its inputs from its " +
           "arguments, its residuals and the cotangent '" + cotangent_.name + "'.";
  }

 private:
  // The forward's outputs with residuals, for the forward's arguments in `c`.
  std::vector<ShapeDtype> forward_outputs(VjpCallT& c) const {
    for (const auto& f : forward_.fields())
      if (f.selects_residuals) f.from_json(c, Json(true));
    std::vector<ShapeDtype> outs = forward_.output_specs(c);
    for (const auto& f : forward_.fields())
      if (f.selects_residuals) f.from_json(c, Json(false));
    return outs;
  }

  static size_t output_index(const TypedFamily<CallT>& forward, const std::string& name) {
    const std::vector<OutputDoc> docs = forward.output_docs();
    for (size_t i = 0; i < docs.size(); ++i)
      if (docs[i].name == name) return i;
    throw Error(forward.name() + "'s backward: the forward has no output '" + name + "'");
  }

  static std::vector<ArgField<VjpCallT>> derive_fields(const TypedFamily<CallT>& forward,
                                                       const std::vector<Extra>& residuals,
                                                       const Extra& cotangent,
                                                       const std::vector<std::string>& leave_out) {
    using V = Args<VjpCallT>;
    std::vector<ArgField<VjpCallT>> out;
    for (const ArgField<CallT>& f : forward.fields()) {
      if (!f.user || f.selects_residuals ||
          std::find(leave_out.begin(), leave_out.end(), f.name) != leave_out.end())
        continue;
      out.push_back(lift(f));
    }
    // After the forward's arguments: a residual's fill runs the forward with them set.
    for (const Extra& r : residuals) {
      out.push_back(V::input(r.name, r.member, residual_fill(forward, r.name)).describe(r.doc));
    }
    out.push_back(V::input(cotangent.name, cotangent.member).describe(cotangent.doc));
    return out;
  }

  // A forward field as the backward's (the backward's call is a forward call).
  static ArgField<VjpCallT> lift(const ArgField<CallT>& f) {
    ArgField<VjpCallT> g;
    g.name = f.name;
    if (f.input) g.input = [in = f.input](VjpCallT& c) { return in(c); };
    if (f.fill) {
      g.fill = [fill = f.fill](const VjpCallT& c, const TensorView& v, uint64_t s) {
        fill(c, v, s);
      };
    }
    g.to_json = [to = f.to_json](const VjpCallT& c) { return to(c); };
    g.from_json = [from = f.from_json](VjpCallT& c, const Json& j) { from(c, j); };
    g.sign = [sign = f.sign](const VjpCallT& c, Signature& s) { sign(c, s); };
    if (f.assign) g.assign = [a = f.assign](VjpCallT& c, const TensorView& v) { a(c, v); };
    g.required = f.required;
    g.kind = f.kind;
    g.default_value = f.default_value;
    g.choices = f.choices;
    g.doc = f.doc;
    g.py_name = f.py_name;
    g.user = f.user;
    g.keyword_only = f.keyword_only;
    return g;
  }

  // Fills a made call's residual `name` with the forward's (native) output of that name.
  static typename Args<VjpCallT>::Fill residual_fill(const TypedFamily<CallT>& forward,
                                                     std::string name) {
    const TypedFamily<CallT>* fwd = &forward;
    return [fwd, name](const VjpCallT& c, const TensorView& dst, uint64_t) {
      CallT call;
      call.num_threads = c.num_threads;
      for (const ArgField<CallT>& f : fwd->fields()) {
        if (f.assign) {
          if (const TensorView* v = f.input(const_cast<VjpCallT&>(c))) f.assign(call, *v);
        } else {
          f.from_json(call, f.selects_residuals ? Json(true) : f.to_json(c));
        }
      }
      const std::vector<Tensor> outs = fwd->run(call, CallOptions{"native", std::nullopt});
      const size_t i = output_index(*fwd, name);
      if (i >= outs.size() || outs[i].spec() != dst.spec()) {
        throw Error(fwd->name() + "'s backward: the forward's '" + name + "' is not " +
                    dst.spec().str());
      }
      std::memcpy(dst.data(), outs[i].data(), outs[i].nbytes());
    };
  }

  const TypedFamily<CallT>& forward_;
  std::vector<Extra> residuals_;
  Extra cotangent_;
  std::vector<std::string> leave_out_;
  std::string primary_output_;          // the forward's first output (the cotangent's)
  std::vector<size_t> residual_index_;  // each residual's index among the forward's outputs
};

}  // namespace tokamax
TOKAMAX_PUBLIC_END
