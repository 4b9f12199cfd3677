"""tokamax_cpp: tokamax's fast CPU kernels and autotuner, from Python.

The API mirrors Google's tokamax (``ragged_dot``, ``dot_product_attention``, ``layer_norm``,
``gated_linear_unit``, ``linear_softmax_cross_entropy_loss``, their ``*_vjp``, ``autotune``,
``AutotuningResult``, ``BoundArguments``); the import name differs so that both packages can be
installed side by side.

Arrays: numpy arrays (bfloat16 through ``ml_dtypes.bfloat16``) and any DLPack producer (torch
tensors, jax arrays) are read in place, without a copy, when they are contiguous and on the CPU;
a strided array is refused with a ValueError saying how to copy it (a silent copy would hide a
slow path). Results are numpy arrays, or torch tensors when the first array argument was one,
handed over without a copy. Kernels run with the GIL released.

Errors: bad input raises ValueError (the library's InvalidArgument message), an implementation
that cannot serve a call raises NotImplementedError, a cache miss under the ``error`` policy
(``TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK=error``) raises ``CacheMissError``.

PyTorch custom ops (``torch.ops.tokamax.*``): ``import tokamax_cpp.torch_ops``.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Sequence

# The tuning data shipped in the wheel: the library's disk-cache rung reads it (a
# TOKAMAX_DATA_DIR the user set wins).
_DATA = pathlib.Path(__file__).resolve().parent / "data" / "autotuning"
if _DATA.is_dir():
    os.environ.setdefault("TOKAMAX_DATA_DIR", str(_DATA))

from ._core import (  # noqa: E402  (the data directory must be known first)
    AutotuningResult,
    BoundArguments,
    CacheMissError,
    PackedGluWeights,
    PackedMoeWeights,
    PackedRhs,
    QuantizedWeights,
    dequantize,
    device_kind,
    gated_linear_unit,
    gated_linear_unit_vjp,
    get_bound_args,
    missed_keys,
    moe_experts_packed,
    num_threads,
    pack_glu_weights,
    pack_moe_weights,
    pack_rhs,
    query_configs,
    quantize,
    ragged_dot,
    ragged_dot_general,
    ragged_dot_vjp,
    set_num_threads,
    version,
)
from . import _core, _ops  # noqa: E402

__version__ = version()

# Every op family's function, made from its description in the library (its signature,
# defaults and docstring: help(tokamax_cpp.layer_norm)). ragged_dot and gated_linear_unit keep
# the module's own functions for what a description does not carry: pre-packed weights, the
# (w_gate, w_up) pair, group sizes as a list, out= buffers.
_GENERATED = {name: fn for name, fn in _ops.functions().items() if not hasattr(_core, name)}
globals().update(_GENERATED)

__all__ = [
    *sorted(_GENERATED),
    "AutotuningResult",
    "BoundArguments",
    "CacheMissError",
    "PackedGluWeights",
    "PackedMoeWeights",
    "PackedRhs",
    "QuantizedWeights",
    "autotune",
    "bound_args_from_json",
    "bound_args_to_json",
    "dequantize",
    "device_kind",
    "gated_linear_unit",
    "gated_linear_unit_vjp",
    "get_bound_args",
    "missed_keys",
    "moe_experts_packed",
    "num_threads",
    "pack_glu_weights",
    "pack_moe_weights",
    "pack_rhs",
    "query_configs",
    "quantize",
    "ragged_dot",
    "ragged_dot_general",
    "ragged_dot_vjp",
    "set_num_threads",
]


def bound_args_to_json(bound_args: Sequence[BoundArguments]) -> str:
    """A bound-args file's text: the JSON list `tokamax autotune --bound-args` reads."""
    return _core.dump_bound_args(list(bound_args))


def bound_args_from_json(text: str) -> list[BoundArguments]:
    return _core.load_bound_args(text)


def autotune(
    f: Callable[..., Any] | Sequence[BoundArguments] | str | os.PathLike,
    *args: Any,
    ignore_cache: bool = False,
    all_implementations: bool = False,
    budget_s: float | None = None,
    measure_budget_s: float | None = None,
    max_candidates: int | None = None,
    seed: int = 0,
    store: str | None = None,
    run_id: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    lease_s: float = 30.0,
    deadline_s: float = 86400.0,
) -> AutotuningResult:
    """Tunes the op calls of ``f(*args)``, a list of BoundArguments, or a bound-args file.

    With ``store="redis://host:port/db"`` and a ``run_id``, a list or file is tuned together
    with every other process of the run that gives the same inputs (docs/tuning.md "Fleet tuning over
    Redis"); each returns the complete merged result. ``rank``/``world_size`` default to the
    launcher's variables (OpenMPI, Slurm, torchrun). A store that cannot be reached raises
    ConnectionError.

    A callable runs once on this thread while its op calls are recorded; keys that an active
    ``with result:`` scope or the disk cache already answers are skipped unless
    ``ignore_cache``. Measurement is the library's (interleaved rounds against the heuristics
    config; docs/tuning.md "How the autotuner measures"). The GIL is released while it measures.
    """
    opts = dict(ignore_cache=ignore_cache, all_implementations=all_implementations,
                budget_s=budget_s, measure_budget_s=measure_budget_s,
                max_candidates=max_candidates, seed=seed)
    if callable(f):
        if store is not None:
            raise ValueError("autotune: a store run tunes a list or file of BoundArguments; "
                             "record them first (get_bound_args or a trace)")
        return _core.autotune_fn(f, tuple(args), **opts)
    if args:
        raise ValueError("autotune: positional arguments are for a callable only")
    if isinstance(f, (str, os.PathLike)):
        f = _core.load_bound_args_file(os.fspath(f))  # size-bounded, errors name the path
    bound = list(f)
    for i, b in enumerate(bound):
        if not isinstance(b, BoundArguments):
            raise ValueError(f"autotune: bound_args[{i}] is a {type(b).__name__}; expected "
                             "BoundArguments")
    if store is not None:
        if ignore_cache:
            raise ValueError("autotune: ignore_cache applies to a callable, not to a store run")
        del opts["ignore_cache"]
        return _core.autotune_sharded(bound, store, run_id or "", rank=rank,
                                      world_size=world_size, lease_s=lease_s,
                                      deadline_s=deadline_s, **opts)
    if run_id is not None:
        raise ValueError("autotune: run_id needs a store")
    return _core.autotune_bound_args(bound, **opts)
