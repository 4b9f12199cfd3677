"""The package's op functions, built from each op family's description in the library.

An op's arguments (names, kinds, defaults, documentation), its outputs (names, the shape rules
that fake tensors use) and its backward are written once, in the C++ family
(``_core.describe(op)``). This module makes from that description the Python function (its
signature, defaults and docstring), and ``torch_ops`` makes the torch operators from the same
data, so that no argument or default is written again here.

Conventions the functions follow (Google tokamax's):
* arrays are positional (optional ones default to None), every other argument keyword-only;
* ``implementation`` and ``config`` choose an implementation and its config; ``heuristics_only``
  skips the autotuning cache (what the torch operators use);
* a family with residual outputs takes ``return_residuals``: then ``(out, residual)`` with one
  residual, ``(out, (residuals...))`` with several;
* an op with several outputs returns them as a tuple, None where an output follows an optional
  input that was not given (the norm's dscale without a scale).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Optional

from . import _core

_UNBOUNDED = 1 << 40  # a local-window side with no bound

# Enumeration values accepted under another name.
_ENUM_ALIASES = {"swish": "silu"}


def _name_of(value: Any) -> Any:
    """An enumeration value's name: a string, or an object's ``name`` / ``__name__`` (numpy
    dtypes, jax.lax.Precision, jax.nn.silu), lower-cased."""
    if value is None or isinstance(value, str):
        name = value
    elif isinstance(getattr(value, "name", None), str):
        name = value.name
    elif hasattr(value, "__name__"):
        name = value.__name__
    else:
        name = str(value)
    if name is None:
        return None
    name = name.lower()
    return _ENUM_ALIASES.get(name, name)


def _window(value: Any) -> Any:
    """local_window_size: (left, right), None on a side meaning unbounded (jax's convention)."""
    if value is None:
        return None
    try:
        left, right = value
    except (TypeError, ValueError):
        raise ValueError(f"local_window_size is {value!r}; expected (left, right), None on a "
                         "side for no bound") from None
    return [_UNBOUNDED if left is None else left, _UNBOUNDED if right is None else right]


def _group_sizes(value: Any) -> Any:
    """group_sizes of a grouped matmul family: a sequence or an int array, as a list of ints."""
    if value is None or isinstance(value, dict):
        return value
    try:
        return [int(x) for x in value]
    except (TypeError, ValueError):
        raise TypeError(f"group_sizes is {value!r}; expected a sequence of ints") from None


# How a custom argument's Python value becomes its JSON, by name.
_CUSTOM = {"local_window_size": _window, "group_sizes": _group_sizes}


class _Arg:
    """One argument of a description, as the Python function takes it."""

    def __init__(self, d: dict):
        self.name: str = d["name"]
        self.py_name: str = d["py_name"]
        self.kind: str = d["kind"]
        self.default = d["default"]
        self.choices: list[str] = d["choices"]
        self.doc: str = d["doc"]
        self.user: bool = d["user"]
        self.keyword_only: bool = d["keyword_only"]

    @property
    def is_array(self) -> bool:
        return self.kind in ("array", "optional_array")

    def convert(self, value: Any) -> Any:
        if self.kind == "enum":
            return self.default if value is None else _name_of(value)
        if self.kind == "custom" and self.name in _CUSTOM:
            return _CUSTOM[self.name](value)
        return value

    def annotation(self) -> str:
        return {"array": "Array", "optional_array": "Optional[Array]", "int": "int",
                "bool": "bool", "real": "float", "optional_real": "Optional[float]",
                "enum": "Optional[str]"}.get(self.kind, "Any")

    def py_default(self) -> Any:
        return inspect.Parameter.empty if self.kind == "array" else self.default

    def describe(self) -> str:
        text = self.doc or ""
        if self.kind == "enum" and self.choices:
            text += f" (one of {', '.join(self.choices)})"
        if self.kind not in ("array",) and self.default is not None:
            text += f"; default {self.default!r}"
        return text


class Description:
    """An op's description (``_core.describe``) with the lookups the bindings need."""

    def __init__(self, op: str):
        d = _core.describe(op)
        self.op: str = d["op"]
        self.doc: str = d["doc"]
        self.args = [_Arg(a) for a in d["arguments"]]
        self.outputs: list[dict] = d["outputs"]
        self.vjp: Optional[str] = d["vjp"]
        self.aliases: list[dict] = d["aliases"]
        self.residuals_flag: Optional[str] = d["residuals_flag"]
        self._present = any(o["present"] for o in self.outputs)
        self._ordered: Optional[list] = None
        self._main = sum(not o["residual"] for o in self.outputs)
        self.has_residuals = self.residuals_flag is not None

    def user_args(self, fixed: dict | None = None) -> list[_Arg]:
        return [a for a in self.args if a.user and a.py_name not in (fixed or {})
                and a.name not in (fixed or {})]

    def primary_outputs(self) -> list[dict]:
        return [o for o in self.outputs if not o["residual"]]

    def residual_outputs(self) -> list[dict]:
        return [o for o in self.outputs if o["residual"]]

    def split(self, values: dict) -> tuple[list, dict, set]:
        """From Python keyword values: the arrays as (name, keyword, value) triples, the
        statics by the description's names, and the names of the arrays given."""
        arrays, statics, given = [], {}, set()
        for a in self.args:
            if a.py_name not in values:
                continue
            v = a.convert(values[a.py_name])
            if a.is_array:
                if v is None and a.kind == "optional_array":
                    continue
                arrays.append((a.name, a.py_name, v))
                given.add(a.name)
            elif v is not None or a.kind in ("optional_real", "custom"):
                statics[a.name] = v
        return arrays, statics, given

    def assemble(self, outs: tuple, given: set, residuals: bool) -> Any:
        """The function's return value from the outputs the library produced, in order."""
        if not self._present:  # the usual case, without a lookup per output
            main = outs[0] if self._main == 1 else tuple(outs[:self._main])
            if not residuals:
                return main
            rest = outs[self._main:]
            return (main, rest[0] if len(rest) == 1 else tuple(rest))
        it = iter(outs)
        named = []
        for o in self.outputs:
            if o["residual"] and not residuals:
                continue
            present = o["present"]
            named.append((o, None if present and present not in given else next(it)))
        main = [v for o, v in named if not o["residual"]]
        rest = [v for o, v in named if o["residual"]]
        first = main[0] if len(main) == 1 else tuple(main)
        if not residuals:
            return first
        return (first, rest[0] if len(rest) == 1 else tuple(rest))

    def docstring(self, fixed: dict | None = None, summary: str | None = None) -> str:
        lines = [summary or self.doc, "", "Args:"]
        for a in self.user_args(fixed):
            lines.append(f"  {a.py_name}: {a.describe()}")
        lines += ["  implementation: None (the best available), or one of "
                  + ", ".join(_core.implementation_names(self.op)),
                  "  config: the implementation's config (a dict or JSON); needs implementation",
                  "  heuristics_only: skip the autotuning cache (the implementation's heuristics)"]
        if self.has_residuals:
            lines.append("  return_residuals: also return the residuals the backward takes")
        lines += ["", "Returns:"]
        for o in self.primary_outputs():
            lines.append(f"  {o['name']}: {o['doc']}" + (
                f" (None without {o['present']})" if o["present"] else ""))
        for o in self.residual_outputs():
            lines.append(f"  {o['name']} (with return_residuals): {o['doc']}")
        if self.vjp:
            lines += ["", f"Backward: {self.vjp} (and torch autograd through torch_ops)."]
        return "\n".join(lines)

    def ordered_args(self, fixed: dict | None = None) -> list[tuple[_Arg, bool]]:
        """The user arguments in the order the Python function and the torch operator take
        them, each with whether it is keyword-only: required arrays in the description's
        order (a backward's: the forward's, its residuals, its cotangent), then optional
        arrays, then the rest."""
        if not fixed and self._ordered is not None:
            return self._ordered
        args = self.user_args(fixed)
        ordered = ([(a, False) for a in args if a.kind == "array" and not a.keyword_only]
                   + [(a, False) for a in args
                      if a.kind == "optional_array" and not a.keyword_only]
                   + [(a, True) for a in args if a.keyword_only or not a.is_array])
        if not fixed:
            self._ordered = ordered  # asked on every torch-operator call (torch_ops._runner)
        return ordered

    def signature(self, fixed: dict | None = None) -> inspect.Signature:
        P = inspect.Parameter
        params = [P(a.py_name, P.KEYWORD_ONLY if kw else P.POSITIONAL_OR_KEYWORD,
                    default=P.empty if a.kind == "array" else
                    None if a.is_array else a.py_default(), annotation=a.annotation())
                  for a, kw in self.ordered_args(fixed)]
        params += [P("implementation", P.KEYWORD_ONLY, default=None, annotation="Optional[str]"),
                   P("config", P.KEYWORD_ONLY, default=None, annotation="Any")]
        if self.has_residuals:
            params.append(P("return_residuals", P.KEYWORD_ONLY, default=False,
                            annotation="bool"))
        params.append(P("heuristics_only", P.KEYWORD_ONLY, default=False, annotation="bool"))
        return inspect.Signature(params)


_DESCRIPTIONS: dict[str, Description] = {}


def description(op: str) -> Description:
    if op not in _DESCRIPTIONS:
        _DESCRIPTIONS[op] = Description(op)
    return _DESCRIPTIONS[op]


def call_library(op: str, arrays: list, statics: dict, implementation: Any, config: Any,
                 heuristics_only: bool) -> tuple:
    """Runs op through the library's generic call path (what the package's functions do)."""
    return _core.call(op, arrays, statics, implementation, config, heuristics_only)


def make_function(op: str, name: Optional[str] = None, fixed: dict | None = None,
                  summary: Optional[str] = None,
                  run: Callable[..., tuple] = call_library,
                  module: str = "tokamax_cpp") -> Callable[..., Any]:
    """The Python function of op (or of an alias that fixes some of its arguments). `run`
    (op, arrays, statics, implementation, config, heuristics_only) -> outputs runs it: the
    library's call path, or a torch operator (torch_ops).

    The function is compiled from source made from the description (as dataclasses makes its
    methods): a real signature binds arguments at the interpreter's speed, where
    inspect.Signature.bind cost about 18 us a call."""
    d = description(op)
    by_keyword = {a.py_name: a.name for a in d.args}
    fixed = {by_keyword.get(k, k): v for k, v in (fixed or {}).items()}
    sig = d.signature(fixed)
    fn_name = name or op
    env: dict[str, Any] = {"_run": run, "_op": op, "_assemble": d.assemble}
    params, body = [], ["    _arrays = []", "    _given = set()", "    _statics = {}"]
    star = False
    for p in sig.parameters.values():
        if p.kind == inspect.Parameter.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        if p.default is inspect.Parameter.empty:
            params.append(p.name)
        else:
            env["_default_" + p.name] = p.default
            params.append(f"{p.name}=_default_{p.name}")
    for a in d.args:
        if a.name in fixed:
            env["_fixed_" + a.name] = a.convert(fixed[a.name])
            value = "_fixed_" + a.name
        elif a.user:
            value = a.py_name
        else:
            continue
        if a.kind in ("enum", "custom"):
            env["_convert_" + a.name] = a.convert
            if a.name not in fixed:
                value = f"_convert_{a.name}({value})"
        if a.is_array:
            indent = "    "
            if a.kind == "optional_array":
                body.append(f"    if {value} is not None:")
                indent = "        "
            body.append(f"{indent}_arrays.append(({a.name!r}, {a.py_name!r}, {value}))")
            body.append(f"{indent}_given.add({a.name!r})")
        elif a.kind in ("optional_real", "custom"):
            body.append(f"    _statics[{a.name!r}] = {value}")
        else:
            body.append(f"    if {value} is not None:")
            body.append(f"        _statics[{a.name!r}] = {value}")
    residuals = "return_residuals" if d.has_residuals else "False"
    if d.has_residuals:
        body.append(f"    _statics[{d.residuals_flag!r}] = bool(return_residuals)")
    body.append("    _outs = _run(_op, _arrays, _statics, implementation, config, "
                "heuristics_only)")
    body.append(f"    return _assemble(_outs, _given, bool({residuals}))")
    source = f"def {fn_name}({', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<tokamax_cpp {fn_name}>", "exec"), env)  # noqa: S102 (our source)
    fn = env[fn_name]
    fn.__qualname__ = fn_name
    fn.__doc__ = d.docstring(fixed, summary)
    fn.__module__ = module
    fn.__signature__ = sig  # the annotations for help() and the stubs
    return fn


def functions(ops: Optional[list[str]] = None, run: Callable[..., tuple] = call_library,
              module: str = "tokamax_cpp") -> dict[str, Callable[..., Any]]:
    """Every family's function (or those of `ops`) and its aliases' (rms_norm), by name."""
    out = {}
    for op in ops if ops is not None else _core.op_names():
        d = description(op)
        if not d.args:
            continue
        out[op] = make_function(op, run=run, module=module)
        for alias in d.aliases:
            out[alias["name"]] = make_function(op, alias["name"], alias["fixed"], alias["doc"],
                                               run=run, module=module)
    return out


def function_names(ops: list[str]) -> list[str]:
    """The names functions() gives ops' functions: each op's and its aliases'."""
    return sorted(n for op in ops for n in [op] + [a["name"] for a in description(op).aliases])


def forward_ops() -> list[str]:
    """Every forward family (a backward is its forward's `vjp`)."""
    backward = {description(op).vjp for op in _core.op_names()} - {None}
    return [op for op in _core.op_names() if op not in backward and description(op).args]


def described_ops() -> list[str]:
    """The forward families whose package functions come from their descriptions alone (the
    module's own functions serve the others: ragged_dot's group sizes as a list and packed
    weights, the GLU's (w_gate, w_up) pair and packed weights)."""
    return [op for op in forward_ops() if not hasattr(_core, op)]


# Custom arguments whose Python value the bindings know how to pass.
KNOWN_CUSTOM = set(_CUSTOM)


def tensor_ops() -> list[str]:
    """The forward families whose arguments are all arrays and plain values (or a known custom
    one): the ones torch_ops makes operators for from the description alone."""
    return [op for op in forward_ops()
            if all(a.kind != "custom" or a.name in KNOWN_CUSTOM
                   for a in description(op).args if a.user)]


# --- output shapes for abstract values (torch's fake tensors, jax's ShapeDtypeStruct) --------

def _drop(shape, axis):
    shape = tuple(shape)
    axis = axis % len(shape)
    return shape[:axis] + shape[axis + 1:]


_SHAPE_HELPERS = {"drop": _drop, "math": math}


def output_shapes(op: str, values: dict, residuals: bool) -> list[tuple[tuple, str]]:
    """(shape, dtype rule) of each output op produces for these Python values (arrays need only
    .shape and .dtype: a fake tensor's symbolic sizes stay symbolic). A dtype rule is an input's
    name ('x.dtype' gives 'x') or a dtype name ('float32')."""
    d = description(op)
    env = dict(_SHAPE_HELPERS)
    for a in d.args:
        if a.py_name in values:
            env[a.name] = values[a.py_name] if a.is_array else a.convert(values[a.py_name])
        elif a.name in values:
            env[a.name] = values[a.name] if a.is_array else a.convert(values[a.name])
        else:
            env[a.name] = None if a.is_array else a.default
    out = []
    for o in d.outputs:
        if o["residual"] and not residuals:
            continue
        if o["present"] and env.get(o["present"]) is None:
            continue
        shape = eval(o["shape"], {"__builtins__": {}}, env)  # noqa: S307 (the library's own rules)
        dtype = o["dtype"]
        out.append((tuple(shape), dtype[:-len(".dtype")] if dtype.endswith(".dtype") else dtype))
    return out
