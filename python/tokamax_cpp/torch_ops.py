"""PyTorch custom operators: ``torch.ops.tokamax.<op>`` for every op family and its VJP.

Importing this module registers, through ``torch.library.custom_op``:

* per family, two operators with the same signature, as Google's tokamax PyTorch bridge has:
  ``tokamax::<op>`` (the fast path: the library's dispatch, native first) and
  ``tokamax::<op>_reference`` (the reference implementation, the ground truth);
* their VJP operators ``tokamax::<op>_vjp`` / ``tokamax::<op>_reference_vjp``, wired in with
  ``register_autograd``: the forward's residuals (attention's log-sum-exp, the norms' mean and
  rstd, the GLU's pre-activation product, the loss's log-sum-exp) are saved in
  ``setup_context`` and handed to the VJP operator in ``backward``;
* fake (meta) implementations (``register_fake``) whose shapes follow the inputs' symbolic
  sizes, so ``torch.compile(fullgraph=True)`` traces them without a graph break, including a
  token count that changes from step to step;
* ``tokamax::ragged_dot_out``, the out-variant writing into a caller's buffer
  (``mutates_args=("out",)``), the analogue of buffer donation.

Config choice follows the original's PyTorch bridge: a call with no config uses the
implementation's heuristics (no cache lookup, so a compiled graph does not depend on which
tuning files a machine has). ``get_configs(op, *args, from_autotuning_cache=...)`` returns the
forward and backward configs, from the heuristics or from the autotuning cache (falling back to
the heuristics); pass one back as ``config=`` with its ``implementation=``.

Operators that return residuals internally return a tuple; the Python functions below
(``ragged_dot``, ``dot_product_attention``, ...) return what Google's tokamax returns.
Tensors must be contiguous CPU tensors (``.contiguous()`` otherwise); gradients arriving
strided (an expanded ``sum().backward()``) are made contiguous before the VJP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from . import _core, _ops

__all__ = [  # and every described family's function, added below
    "Configs",
    "get_configs",
    "ragged_dot",
    "ragged_dot_out",
    "reference",
]


def _config_text(config: Any) -> Optional[str]:
    if config is None or isinstance(config, str):
        return config
    return json.dumps(config)


def _impl(fixed: Optional[str], implementation: Optional[str]) -> Optional[str]:
    return fixed if fixed is not None else implementation


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _ragged_out_dtype(lhs: Tensor, rhs: Tensor, preferred: Optional[torch.dtype]) -> torch.dtype:
    if preferred is not None:
        return preferred
    return torch.float32 if torch.float32 in (lhs.dtype, rhs.dtype) else lhs.dtype


def _register(suffix: str, fixed_impl: Optional[str]) -> dict[str, Callable[..., Any]]:
    """Registers every family's forward and VJP operators under tokamax::<op><suffix>."""
    ns = "tokamax::"
    ops: dict[str, Callable[..., Any]] = {}

    # --- ragged_dot ---
    @torch.library.custom_op(ns + "ragged_dot" + suffix, mutates_args=())
    def ragged_dot_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor,
                      preferred_element_type: Optional[torch.dtype] = None,
                      activation: Optional[str] = None, precision: Optional[str] = None,
                      implementation: Optional[str] = None,
                      config: Optional[str] = None) -> Tensor:
        return _core.ragged_dot(lhs, rhs, group_sizes,
                                preferred_element_type=preferred_element_type,
                                activation=activation, precision=precision,
                                implementation=_impl(fixed_impl, implementation), config=config,
                                heuristics_only=True)

    @ragged_dot_op.register_fake
    def _(lhs, rhs, group_sizes, preferred_element_type=None, activation=None, precision=None,
          implementation=None, config=None):
        return lhs.new_empty((lhs.shape[0], rhs.shape[2]),
                             dtype=_ragged_out_dtype(lhs, rhs, preferred_element_type))

    @torch.library.custom_op(ns + "ragged_dot" + suffix + "_vjp", mutates_args=())
    def ragged_dot_vjp_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor, dout: Tensor,
                          preferred_element_type: Optional[torch.dtype] = None,
                          activation: Optional[str] = None, precision: Optional[str] = None,
                          implementation: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.ragged_dot_vjp(lhs, rhs, group_sizes, dout,
                                    preferred_element_type=preferred_element_type,
                                    activation=activation, precision=precision,
                                    implementation=_impl(fixed_impl, implementation),
                                    heuristics_only=True)

    @ragged_dot_vjp_op.register_fake
    def _(lhs, rhs, group_sizes, dout, preferred_element_type=None, activation=None,
          precision=None, implementation=None):
        return torch.empty_like(lhs), torch.empty_like(rhs)

    def ragged_dot_setup(ctx, inputs, output):
        lhs, rhs, group_sizes, preferred, activation, precision, implementation, _ = inputs
        ctx.save_for_backward(lhs, rhs, group_sizes)
        ctx.statics = (preferred, activation, precision, implementation)

    def ragged_dot_backward(ctx, dout):
        lhs, rhs, group_sizes = ctx.saved_tensors
        preferred, activation, precision, implementation = ctx.statics
        dlhs, drhs = ragged_dot_vjp_op(lhs, rhs, group_sizes, dout.contiguous(), preferred,
                                       activation, precision, implementation)
        return dlhs, drhs, None, None, None, None, None, None

    ragged_dot_op.register_autograd(ragged_dot_backward, setup_context=ragged_dot_setup)
    ops["ragged_dot"], ops["ragged_dot_vjp"] = ragged_dot_op, ragged_dot_vjp_op

    return ops


# --- the operators of the described families (every family but ragged_dot and the GLU) -------
# Built in a loop from each family's description (_ops): the schema from its arguments, the
# fake implementation from its outputs' shape rules, the autograd wiring from its backward's
# description (the backward takes the forward's arguments, the residuals named as the forward's
# outputs and the cotangent of its first output; it returns "d" + the name of each input).

# Schema types by argument kind; a custom argument's by name.
_SCHEMA_TYPES = {"array": "Tensor", "optional_array": "Tensor?", "int": "int", "bool": "bool",
                 "real": "float", "optional_real": "float?", "enum": "str?"}
_CUSTOM_SCHEMA_TYPES = {"local_window_size": "int[]?", "group_sizes": "int[]?"}


def _schema_default(a: _ops._Arg) -> str:
    if a.kind == "array":
        return ""
    v = a.default
    if v is None:
        return "=None"
    if isinstance(v, bool):
        return f"={v}"
    if isinstance(v, str):
        return f'="{v}"'
    return f"={v!r}"


def _schema(d: _ops.Description) -> str:
    """The operator's schema: the Python function's arguments in its order (keywords by
    position), with their defaults; every output (residuals included)."""
    args = [f"{_SCHEMA_TYPES.get(a.kind) or _CUSTOM_SCHEMA_TYPES[a.name]} {a.py_name}"
            f"{_schema_default(a)}" for a, _ in d.ordered_args()]
    args += ["str? implementation=None", "str? config=None"]
    outs = ", ".join(["Tensor"] * len(d.outputs))
    return f"({', '.join(args)}) -> ({outs})" if len(d.outputs) > 1 else \
        f"({', '.join(args)}) -> Tensor"


def _dtype(rule: str, values: dict) -> torch.dtype:
    return values[rule].dtype if rule in values else getattr(torch, rule)


def _register_described(op: str, suffix: str, fixed_impl: Optional[str]) -> Callable[..., Any]:
    """Registers op's operator from its description: tokamax::<op><suffix>, a backward's
    tokamax::<forward><suffix>_vjp; returns it."""
    d = _ops.description(op)
    order = [a for a, _ in d.ordered_args()]
    names = [a.name for a in order]
    arrays = {a.name: a for a in order if a.is_array}

    defaults = {a.name: None if a.is_array else a.default for a in order}
    defaults.update(implementation=None, config=None)
    by_keyword = {a.py_name: a.name for a in order}

    def values_of(args, kwargs) -> dict:
        """The operator's arguments by the description's names (torch passes the ones a caller
        left out neither by position nor by keyword)."""
        values = dict(defaults)
        values.update(zip(names + ["implementation", "config"], args))
        values.update({by_keyword.get(k, k): v for k, v in kwargs.items()})
        return values

    def run(*args, **kwargs):
        values = values_of(args, kwargs)
        given = [(n, arrays[n].py_name, values[n]) for n in arrays if values[n] is not None]
        statics = {n: values[n] for n in names if n not in arrays}
        if d.residuals_flag:
            statics[d.residuals_flag] = True
        outs = iter(_core.call(op, given, statics, _impl(fixed_impl, values["implementation"]),
                               values["config"], heuristics_only=True))
        first = next(iter(values[n] for n in arrays if values[n] is not None))
        result = tuple(_empty(first) if o["present"] and values[o["present"]] is None
                       else next(outs) for o in d.outputs)
        return result if len(result) > 1 else result[0]

    def fake(*args, **kwargs):
        values = values_of(args, kwargs)
        first = next(iter(values[n] for n in arrays if values[n] is not None))
        shapes = iter(_ops.output_shapes(op, values, residuals=True))
        result = []
        for o in d.outputs:
            if o["present"] and values[o["present"]] is None:
                result.append(first.new_empty((0,)))
                continue
            shape, dtype = next(shapes)
            result.append(first.new_empty(shape, dtype=_dtype(dtype, values)))
        return tuple(result) if len(result) > 1 else result[0]

    name = op[:-4] + suffix + "_vjp" if op.endswith("_vjp") else op + suffix
    operator = torch.library.custom_op("tokamax::" + name, run, mutates_args=(),
                                       schema=_schema(d))
    operator.register_fake(fake)
    return operator


def _wire_autograd(op: str, forward: Any, backward: Any) -> None:
    """forward's autograd: its inputs and outputs saved, backward's operator run on them."""
    d, v = _ops.description(op), _ops.description(_ops.description(op).vjp)
    names = [a.name for a, _ in d.ordered_args()] + ["implementation", "config"]
    out_names = [o["name"] for o in d.outputs]
    vjp_names = [a.name for a, _ in v.ordered_args()]
    grads_of = [o["name"][1:] for o in v.outputs]  # "dx" -> "x"

    def setup(ctx, inputs, output):
        output = output if isinstance(output, tuple) else (output,)
        ctx.tensor_index = [i for i, t in enumerate(inputs) if isinstance(t, Tensor)]
        ctx.save_for_backward(*[inputs[i] for i in ctx.tensor_index], *output)
        ctx.statics = [None if isinstance(t, Tensor) else t for t in inputs]

    def grad(ctx, *cotangents):
        saved = ctx.saved_tensors
        inputs = list(ctx.statics)
        for j, i in enumerate(ctx.tensor_index):
            inputs[i] = saved[j]
        values = dict(zip(names, inputs))
        outs = dict(zip(out_names, saved[len(ctx.tensor_index):]))
        cotangent = cotangents[0].to(outs[out_names[0]].dtype).contiguous()
        args = []
        for n in vjp_names:
            if n in values:
                args.append(values[n])
            elif n in outs:
                args.append(outs[n])
            else:  # the cotangent
                args.append(cotangent)
        got = backward(*args, values["implementation"], None)
        got = dict(zip(grads_of, got if isinstance(got, tuple) else (got,)))
        result = []
        for n in names:
            g, x = got.get(n), values[n]
            result.append(g.to(x.dtype) if g is not None and isinstance(x, Tensor) else None)
        return tuple(result)

    forward.register_autograd(grad, setup_context=setup)


def _register_all_described(suffix: str, fixed_impl: Optional[str]) -> dict[str, Any]:
    ops = {}
    for op in _ops.tensor_ops():
        ops[op] = _register_described(op, suffix, fixed_impl)
        vjp = _ops.description(op).vjp
        if vjp:
            ops[vjp] = _register_described(vjp, suffix, fixed_impl)
            _wire_autograd(op, ops[op], ops[vjp])
    return ops


def _runner(ops: dict[str, Any]) -> Callable[..., tuple]:
    """Runs a described op through its torch operator, returning what the library's call path
    returns (_ops.make_function's `run`): the operator computes every output, residuals
    included, with empty tensors for absent ones."""
    def run(op, arrays, statics, implementation, config, heuristics_only):
        d = _ops.description(op)
        values = {name: value for name, _, value in arrays}
        given = set(values)
        values.update(statics)
        args = [values.get(a.name, None if a.is_array else a.default)
                for a, _ in d.ordered_args()]
        outs = ops[op](*args, implementation, _config_text(config))
        outs = outs if isinstance(outs, tuple) else (outs,)
        residuals = bool(statics.get(d.residuals_flag)) if d.residuals_flag else False
        return tuple(t for o, t in zip(d.outputs, outs)
                     if (residuals or not o["residual"])
                     and not (o["present"] and o["present"] not in given))
    return run


_FAST = _register("", None)
_FAST.update(_register_all_described("", None))
_REFERENCE = _register("_reference", "reference")
_REFERENCE.update(_register_all_described("_reference", "reference"))


@torch.library.custom_op("tokamax::ragged_dot_out", mutates_args=("out",))
def _ragged_dot_out_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor, out: Tensor,
                       activation: Optional[str] = None, precision: Optional[str] = None,
                       implementation: Optional[str] = None,
                       config: Optional[str] = None) -> None:
    _core.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out.dtype,
                     activation=activation, precision=precision, implementation=implementation,
                     config=config, out=out, heuristics_only=True)


@_ragged_dot_out_op.register_fake
def _(lhs, rhs, group_sizes, out, activation=None, precision=None, implementation=None,
      config=None):
    return None


class _Family:
    """The Python face of one family's operators (fast or reference): tokamax's signatures."""

    def __init__(self, ops: dict[str, Callable[..., Any]]):
        self._ops = ops
        # The described families' functions, with the package's signatures and docstrings.
        for name, fn in _ops.functions(_ops.tensor_ops(), run=_runner(ops),
                                       module=__name__).items():
            setattr(self, name, fn)

    def ragged_dot(self, lhs, rhs, group_sizes, *, preferred_element_type=None, activation=None,
                   precision=None, implementation=None, config=None):
        return self._ops["ragged_dot"](lhs, rhs, group_sizes, preferred_element_type,
                                       activation, precision, implementation,
                                       _config_text(config))


_fast = _Family(_FAST)
reference = _Family(_REFERENCE)
"""The reference implementations with the same signatures (ground truth)."""

ragged_dot = _fast.ragged_dot
# The described families' functions (and aliases such as rms_norm), by name, from one loop.
_DESCRIBED_FUNCTIONS = _ops.function_names(_ops.tensor_ops())
globals().update({name: getattr(_fast, name) for name in _DESCRIBED_FUNCTIONS})
__all__ += _DESCRIBED_FUNCTIONS


def ragged_dot_out(lhs, rhs, group_sizes, out, *, activation=None, precision=None,
                   implementation=None, config=None):
    """ragged_dot into ``out`` (its dtype is the result's); returns ``out``."""
    _ragged_dot_out_op(lhs, rhs, group_sizes, out, activation, precision, implementation,
                       _config_text(config))
    return out


@dataclass(frozen=True)
class Configs:
    """The configs a call would use: one entry per library op call the forward (or the VJP)
    makes, each {"op", "implementation", "config", "source"}."""

    forward: list[dict]
    backward: list[dict]


# op name -> (run the forward with residuals, run the VJP from them) on the _core functions.
def _ragged_dot_pair(kw):
    def fwd(lhs, rhs, group_sizes):
        return _core.ragged_dot(lhs, rhs, group_sizes, **kw)

    def bwd(res, lhs, rhs, group_sizes):
        kw2 = {k: v for k, v in kw.items() if k not in ("config", "representative_group_sizes")}
        return _core.ragged_dot_vjp(lhs, rhs, group_sizes, res, **kw2)

    return fwd, bwd


def _described_pair(op):
    """A described family's pair: the forward through the library's call path with its
    residuals, the backward from its description (the forward's arrays and statics, the
    residuals by the forward's output names, the first output as the cotangent)."""
    d = _ops.description(op)

    def pair(kw):
        sig = d.signature()
        kw = {k: v for k, v in kw.items() if k not in ("return_residuals", "heuristics_only")}
        state = {}

        def fwd(*args):
            values = dict(sig.bind(*args, **kw).arguments)
            arrays, statics, given = d.split(values)
            state.update(arrays=arrays, statics=statics, given=given)
            flag = {d.residuals_flag: True} if d.residuals_flag else {}
            return _core.call(op, arrays, {**statics, **flag}, kw.get("implementation"),
                              kw.get("config"))

        def bwd(res, *args):
            if not d.vjp:
                return None
            names = [o["name"] for o in d.outputs
                     if not (o["present"] and o["present"] not in state["given"])]
            outs = dict(zip(names, res))
            forward_args = {a.name for a in d.args}
            # The residuals by their output names; the cotangent: the first output.
            extra = [(a.name, a.name, outs.get(a.name, res[0]))
                     for a in _ops.description(d.vjp).args
                     if a.is_array and a.name not in forward_args]
            return _core.call(d.vjp, state["arrays"] + extra, state["statics"],
                              kw.get("implementation"), None)

        return fwd, bwd

    return pair


_PAIRS = {
    "ragged_dot": _ragged_dot_pair,
    **{op: _described_pair(op) for op in _ops.tensor_ops()},
}


def get_configs(op, *args, from_autotuning_cache: bool = False, **kwargs) -> Configs:
    """The forward and backward configs of ``op(*args, **kwargs)``, nothing run.

    ``op``: a family name ("ragged_dot", ...) or one of this module's functions. With
    ``from_autotuning_cache=False`` (the default, what the operators use) the heuristics; with
    True the autotuning ladder (active ``with result:`` scopes, the disk cache) falling back to
    the heuristics. ``kwargs`` are the op's keyword arguments (activation, is_causal, ...).
    """
    name = op if isinstance(op, str) else getattr(op, "__name__", "")
    for family in _ops.tensor_ops():  # an alias (rms_norm): its family, its fixed values
        for alias in _ops.description(family).aliases:
            if alias["name"] == name:
                name, kwargs = family, {**kwargs, **alias["fixed"]}
    if name not in _PAIRS:
        raise ValueError(f"get_configs: unknown op {op!r}; expected one of {sorted(_PAIRS)}")
    fwd, bwd = _PAIRS[name](kwargs)
    residuals = {}

    def forward():
        residuals["r"] = fwd(*args)

    def pick(entries):
        key = "config" if from_autotuning_cache else "heuristics"
        return [{"op": e["op"], "implementation": e["implementation"], "config": e[key],
                 "source": e["rung"] if from_autotuning_cache else "heuristics"}
                for e in entries]

    forward_entries = _core.query_configs(forward)
    backward_entries = _core.query_configs(lambda: bwd(residuals["r"], *args))
    return Configs(pick(forward_entries), pick(backward_entries))
