"""Peer comparison: tokamax_cpp against what a user of each ecosystem would call on this CPU.

    python -m tokamax_cpp.bench_peers --op ragged_dot --tag primary
    python -m tokamax_cpp.bench_peers --op dot_product_attention --tag primary --rounds 7
    python -m tokamax_cpp.bench_peers --op ragged_dot --spec memory_bound --json out.json
    python -m tokamax_cpp.bench_peers --op quantized_ragged_dot --tag quantized
    python -m tokamax_cpp.bench_peers --op moe_experts --tag moe

Workloads are the library's own named argument specs (``tokamax specs --op OP --json``; see
``load_specs`` for where they are looked up). Inputs are generated once per spec with numpy
(standard normal values, seeded) and handed to every peer, converted to its array type outside
the timed region.

Peers, ragged_dot: a loop of per-group ``torch.mm`` on slices writing into one output (what a
PyTorch user writes; on f32 x bf16 specs twice: weights upcast per group, and lhs cast to bf16
for a bf16 matmul), ``torch._grouped_mm`` (where it runs on this CPU), ``jax.lax.ragged_dot``
under ``jax.jit`` on XLA:CPU, Google's ``tokamax.ragged_dot`` under ``jax.jit`` (its default
implementation on a CPU), and ours: ``tokamax_cpp.ragged_dot`` (default dispatch) and the same
with weights packed once by ``tokamax_cpp.pack_rhs``.
Peers, dot_product_attention: ``torch.nn.functional.scaled_dot_product_attention`` (inputs
transposed to [B,N,T,H] outside the timed region; GQA through enable_gqa; bias and mask, which
SDPA takes as one attn_mask, combined inside the timed region), ``jax.nn.dot_product_attention``
and Google's ``tokamax.dot_product_attention`` under ``jax.jit``, and ``tokamax_cpp``'s.
Peers, quantized_ragged_dot (the specs tagged ``quantized``): ours on the quantized weights and
on the same weights dequantized to bf16, and torch's weight-only CPU kernels, one call per
non-empty expert with bf16 activations: ``_weight_int8pack_mm`` (int8 per channel) and
``_weight_int4pack_mm_for_cpu`` (int4 per group).
Peers, moe_experts (the specs tagged ``moe``: real models' expert blocks in transformers'
layout, bf16, routed by top-k over random router logits): ours from torch
(``torch.ops.tokamax.moe_experts`` on the module's own weights) and with the weights packed once
(``tokamax_cpp.moe_experts_packed``), the same layer written in Python around two
``torch.ops.tokamax.ragged_dot`` calls (weights transposed once to [E, K, 2N] and [E, N, K];
sort, gather, activation and combine as torch ops: what a user wires by hand), and Hugging Face
transformers' experts backends (``eager``, ``grouped_mm``, ``batched_mm``) on a Qwen3-MoE
experts module holding the same weights.

Threads: one count n for everyone (default os.cpu_count()): torch.set_num_threads(n),
tokamax_cpp.set_num_threads(n), and XLA_FLAGS="--xla_cpu_multi_thread_eigen=true
intra_op_parallelism_threads=n" set before jax is imported. XLA's flag parser ignores the
second word (it is not an XLA flag; only words starting with "--" are parsed): XLA:CPU sizes
its thread pool from the CPUs the process may run on, so when n is below that count the process
is also pinned to n CPUs (sched_setaffinity, before any library starts its threads; every peer
then runs on the same n CPUs). ``--no-pin`` turns the pinning off.

Measurement: each peer is warmed up (the first call compiles the jax ones) and its output
checked against ours (``check_close``: |peer - ours| <= tol * (|ours| + rms(ours)) everywhere,
tol 1e-3 for f32 and 5e-2 where bf16 is involved); a peer that fails the check is reported as a mismatch and
not timed. Then interleaved rounds: each round times every peer once, in a fresh random order;
a sample is the mean of enough back-to-back calls to last --min-sample-ms (calls block on
their result), after --gap-ms (default 100) of idling: torch's OpenMP workers, XLA's and ours
spin-wait for a while after a call, and a sample that starts while another library's workers
still spin runs on part of the cores (on 2 cores, ours on compute_bound_bf16_weights: 10.8 ms
timed alone, 12.7 ms after the torch and jax samples without a gap). Per peer: the median
sample, and the per-round ratio peer / ours (ours = the default-dispatch row), summarised
as the median of the ratios and their min-max range (above 1: ours is faster). Per spec: the
fastest torch/XLA peer (Google tokamax counts as XLA) and our speedup over it, against the
project's targets: >= 1.5x on decode specs (tag "decode"), >= 1.0x on the others (prefill).

Our calls run on one dedicated Python thread (whole samples at a time; see OwnThread: a
workaround for a tile-state bug of our AMX kernels that kills the process with SIGILL once
torch's bf16 kernels ran on the same thread; --same-thread turns it off).

Inputs: ragged_dot group sizes given as {"num_groups", "total_size"} are the library's own
(generate_group_sizes, a transcription of the C++ generator, bit-identical), so that a spec
here is the workload `tokamax bench` and the autotuner measure. Attention masks keep key 0 and
key lengths stay in [3/4 S, S], so that no query row is fully masked (there the libraries
differ by convention: tokamax_cpp writes zeros, jax the mean of v).

Output: markdown tables on stdout (progress on stderr); --json PATH writes every sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import pathlib
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

DECODE_TARGET = 1.5
PREFILL_TARGET = 1.0
# Quantized weights against torch's weight-only kernels (docs/quantized.md).
QUANTIZED_DECODE_TARGET = 2.0
QUANTIZED_PREFILL_TARGET = 1.2
# The fused experts op against transformers' fastest experts backend, by tokens per call.
MOE_TARGETS = {1: 2.0, 8: 1.0, 64: 1.0, 512: 1.2}
TOL_F32 = 1e-3
TOL_BF16 = 5e-2


# --------------------------------------------------------------------------------------------
# Threads


def configure_threads(n: int, pin: bool = True) -> dict:
    """Sets XLA_FLAGS for n threads and (pin, n below the usable CPUs) pins the process to n
    CPUs. Call before torch, jax or tokamax_cpp start threads. Returns what was done."""
    info: dict[str, Any] = {"threads": n}
    flags = os.environ.get("XLA_FLAGS", "").strip()
    add = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={n}"
    if not flags:
        os.environ["XLA_FLAGS"] = add
    elif flags.startswith("--") and add not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {add}"
    # else: XLA_FLAGS names a flags file; left as it is.
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    info["jax_imported_before"] = "jax" in sys.modules
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if pin and n < len(cpus):
            os.sched_setaffinity(0, cpus[:n])
            cpus = cpus[:n]
            info["pinned"] = True
        info["cpus"] = cpus
    return info


# --------------------------------------------------------------------------------------------
# Specs


def find_cli(explicit: str | None = None) -> str | None:
    """The `tokamax` command-line tool: --cli, $TOKAMAX_CLI, `tokamax` on PATH, else
    build/release/tokamax (or release/tokamax) in the working directory, this file's directory
    or one of their parents (the source tree's build, the installed copy's venv under build/)."""
    for c in (explicit, os.environ.get("TOKAMAX_CLI")):
        if c:
            return c
    which = shutil.which("tokamax")
    if which:
        return which
    for start in (pathlib.Path.cwd(), pathlib.Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            for rel in ("build/release/tokamax", "release/tokamax"):
                p = d / rel
                if p.is_file() and os.access(p, os.X_OK):
                    return str(p)
    return None


def load_specs(op: str, tag: str | None = None, name: str | None = None, *,
               cli: str | None = None, specs_json: str | None = None) -> tuple[list[dict], str]:
    """The named specs of an op family, as `tokamax specs --json` lists them: dicts with name,
    op, tags and arguments. From, in order: a --specs-json file (that list), a binding
    tokamax_cpp.arg_specs(op, tag) if the package has one, the `tokamax` CLI (find_cli).
    With `name`, that spec only (tag ignored). Returns (specs, where they came from)."""
    if specs_json:
        specs = json.loads(pathlib.Path(specs_json).read_text())
        source = f"file {specs_json}"
    else:
        import tokamax_cpp

        binding = getattr(tokamax_cpp, "arg_specs", None) or getattr(tokamax_cpp._core,
                                                                      "arg_specs", None)
        if binding is not None:
            specs = binding(op, None)
            if isinstance(specs, str):
                specs = json.loads(specs)
            source = "tokamax_cpp.arg_specs"
        else:
            exe = find_cli(cli)
            if exe is None:
                raise SystemExit(
                    "bench_peers: no spec source: tokamax_cpp has no arg_specs binding and the "
                    "`tokamax` CLI was not found; pass --cli PATH (e.g. "
                    "build/release/tokamax), set TOKAMAX_CLI, or pass --specs-json FILE")
            cmd = [exe, "specs", "--op", op, "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise SystemExit(f"bench_peers: {' '.join(cmd)} failed: {r.stderr.strip()}")
            specs = json.loads(r.stdout)
            source = " ".join(cmd)
    specs = [s for s in specs if s.get("op", op) == op]
    if name is not None:
        found = [s for s in specs if s["name"] == name]
        if not found:
            raise SystemExit(f"bench_peers: no {op} spec named {name!r}; have: "
                             + ", ".join(s["name"] for s in specs))
        return found, source
    if tag is not None:
        specs = [s for s in specs if tag in s.get("tags", [])]
    if not specs:
        raise SystemExit(f"bench_peers: no {op} specs with tag {tag!r}")
    return specs, source


_SD = re.compile(r"\s*([a-z]+\d*)\[([0-9,\s]*)\]\s*")


def dtype_of(name: str):
    import ml_dtypes

    table = {"f32": np.float32, "f64": np.float64, "f16": np.float16,
             "bf16": ml_dtypes.bfloat16, "bool": np.bool_, "pred": np.bool_, "i32": np.int32,
             "s32": np.int32, "i64": np.int64, "s64": np.int64, "i8": np.int8, "u8": np.uint8}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}")
    return np.dtype(table[name])


def parse_shape_dtype(text: str) -> tuple[str, tuple[int, ...]]:
    """'f32[2048,1024]' -> ('f32', (2048, 1024))."""
    m = _SD.fullmatch(text)
    if not m:
        raise ValueError(f"not a shape-dtype: {text!r}")
    dims = tuple(int(d) for d in m.group(2).split(",") if d.strip())
    return m.group(1), dims


_M64 = (1 << 64) - 1


def generate_group_sizes(total: int, groups: int, seed: int = 0) -> np.ndarray:
    """The group sizes the library gives a spec's {"num_groups": G, "total_size": T}: each of
    the T rows goes to group floor(u * G), u the counter-based uniform of the library's
    Tensor::uniform (seed ^ 0x5eed, index = row). A transcription of
    tokamax::rdot::generate_group_sizes (src/ops/ragged_dot/base.cc, seed 0 there), so that
    these are the sizes `tokamax bench` and the autotuner run on the same spec."""
    if groups <= 0:
        return np.zeros(0, np.int32)
    s = (seed ^ 0x5EED) & _M64
    base = (s * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _M64
    z = np.arange(total, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03) + np.uint64(base)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)
    g = np.minimum(groups - 1, (u * groups).astype(np.int64))
    return np.bincount(g, minlength=groups).astype(np.int32)


def spec_group_sizes(gs: Any) -> np.ndarray:
    if isinstance(gs, dict):
        return generate_group_sizes(int(gs["total_size"]), int(gs["num_groups"]))
    return np.asarray(gs, np.int32)


def _randn(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)


def make_inputs(op: str, args: dict, seed: int = 0) -> dict:
    """numpy inputs for a spec's arguments (float: standard normal; bool masks: ~90% true,
    key 0 always true; sequence lengths: see below)."""
    rng = np.random.default_rng(seed)
    if op == "ragged_dot":
        known = {"lhs", "rhs", "group_sizes", "preferred_element_type", "dimension_numbers",
                 "activation", "precision", "packed_rhs"}
        extra = sorted(set(args) - known)
        if extra:
            raise NotImplementedError(f"spec arguments {extra} not supported here")
        if args.get("dimension_numbers", "forward") != "forward":
            raise NotImplementedError("only forward dimension numbers")
        if args.get("activation", "none") != "none":
            raise NotImplementedError("only activation none")
        ldt, lsh = parse_shape_dtype(args["lhs"])
        rdt, rsh = parse_shape_dtype(args["rhs"])
        gs = spec_group_sizes(args["group_sizes"])
        if len(gs) != rsh[0] or gs.sum() > lsh[0]:
            raise ValueError(f"group sizes {gs.tolist()} do not fit lhs {lsh} / rhs {rsh}")
        # A spec that lists its group sizes keys on them (representative_group_sizes), as
        # `tokamax bench` and the shipped tuning data do; one that gives only their count and
        # total keys on those, as a plain call does.
        rep = gs if not isinstance(args["group_sizes"], dict) else None
        return {"lhs": _randn(rng, lsh, dtype_of(ldt)), "rhs": _randn(rng, rsh, dtype_of(rdt)),
                "group_sizes": gs, "dtypes": (ldt, rdt), "representative": rep}
    if op == "dot_product_attention":
        known = {"q", "k", "v", "is_causal", "bias", "mask", "scale", "kv_seq_lengths",
                 "q_seq_lengths", "local_window_size", "logits_soft_cap"}
        extra = sorted(set(args) - known)
        if extra:
            raise NotImplementedError(f"spec arguments {extra} not supported here")
        out: dict[str, Any] = {}
        for k in ("q", "k", "v", "bias"):
            if k in args:
                dt, sh = parse_shape_dtype(args[k])
                out[k] = _randn(rng, sh, dtype_of(dt))
        if "mask" in args:
            _, sh = parse_shape_dtype(args["mask"])
            m = rng.random(sh) < 0.9
            m[..., 0] = True
            out["mask"] = m
        # No fully masked query row: there the libraries disagree by convention (tokamax_cpp
        # writes zeros, jax.nn and Google's tokamax the mean of v), which is not what this
        # compares. Key lengths stay in [3/4 S, S]; query lengths are the full T.
        s = out["k"].shape[-3]
        t = out["q"].shape[-3]
        if "kv_seq_lengths" in args:
            _, sh = parse_shape_dtype(args["kv_seq_lengths"])
            out["kv_seq_lengths"] = rng.integers(max(1, s - s // 4), s + 1, size=sh,
                                                 dtype=np.int32)
        if "q_seq_lengths" in args:
            _, sh = parse_shape_dtype(args["q_seq_lengths"])
            out["q_seq_lengths"] = np.full(sh, t, np.int32)
        out["is_causal"] = bool(args.get("is_causal", False))
        out["scale"] = args.get("scale")
        out["local_window_size"] = args.get("local_window_size")
        out["logits_soft_cap"] = args.get("logits_soft_cap")
        out["dtypes"] = (parse_shape_dtype(args["q"])[0],)
        return out
    if op == "quantized_ragged_dot":
        return _quantized_inputs(args, rng)
    if op == "moe_experts":
        return _moe_inputs(args, rng)
    raise NotImplementedError(f"op {op!r}")


def _moe_inputs(args: dict, rng: np.random.Generator) -> dict:
    """An experts spec's inputs: hidden states, the top-k of softmaxed random router logits
    (weights renormalized over the k, as Qwen3-MoE and Mixtral do), and weights at a trained
    model's scale (1 / sqrt(fan-in)) in transformers' layout."""
    import ml_dtypes

    known = {"hidden", "top_k_index", "top_k_weights", "w_gate_up", "w_down", "activation",
             "transposed_weights"}
    extra = sorted(set(args) - known)
    if extra:
        raise NotImplementedError(f"spec arguments {extra} not supported here")
    if not args.get("transposed_weights", False) or args.get("activation", "silu") != "silu":
        raise NotImplementedError("only transformers' layout and silu")
    xdt, (t, k) = parse_shape_dtype(args["hidden"])
    _, (_, top) = parse_shape_dtype(args["top_k_index"])
    wdt, (e, two_n, _) = parse_shape_dtype(args["w_gate_up"])
    logits = rng.standard_normal((t, e))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :top].astype(np.int64)
    w = np.take_along_axis(probs, idx, -1)
    w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
    gu = (rng.standard_normal((e, two_n, k), dtype=np.float32) * k ** -0.5).astype(dtype_of(wdt))
    dn = (rng.standard_normal((e, k, two_n // 2), dtype=np.float32)
          * (two_n // 2) ** -0.5).astype(dtype_of(wdt))
    return {"hidden": _randn(rng, (t, k), dtype_of(xdt)), "top_k_index": idx,
            "top_k_weights": w, "w_gate_up": gu, "w_down": dn, "dtypes": (xdt, wdt),
            "bf16": ml_dtypes.bfloat16}


def _quantized_inputs(args: dict, rng: np.random.Generator) -> dict:
    """A quantized spec's inputs: weights drawn in f32 (scaled as trained weights are) and
    quantized by the library in the spec's format, the same weights dequantized to bf16 for the
    bf16 call, and the int values and scales torch's weight-only kernels take."""
    import tokamax_cpp as tc

    known = {"lhs", "values", "scales", "zeros", "group_sizes", "format", "n", "group_size",
             "activation"}
    extra = sorted(set(args) - known)
    if extra:
        raise NotImplementedError(f"spec arguments {extra} not supported here")
    if args.get("activation", "none") != "none":
        raise NotImplementedError("only activation none")
    ldt, lsh = parse_shape_dtype(args["lhs"])
    _, vsh = parse_shape_dtype(args["values"])
    g, k, n = vsh[0], vsh[2], int(args["n"])
    fmt, group_size = args["format"], int(args.get("group_size", 0))
    gs = spec_group_sizes(args["group_sizes"])
    if len(gs) != g or gs.sum() > lsh[0]:
        raise ValueError(f"group sizes {gs.tolist()} do not fit lhs {lsh} / {g} experts")
    w = (rng.standard_normal((g, k, n), dtype=np.float32) * 0.02).astype(np.float32)
    q = tc.quantize(w, fmt, group_size=group_size, asymmetric="zeros" in args)
    del w
    deq = tc.dequantize(q)
    import ml_dtypes

    return {"lhs": _randn(rng, lsh, dtype_of(ldt)), "q": q,
            "rhs_bf16": deq.astype(ml_dtypes.bfloat16), "deq": deq, "group_sizes": gs,
            "format": fmt, "group_size": q.group_size, "dtypes": (ldt, "bf16")}


# --------------------------------------------------------------------------------------------
# Correctness


def to_f32(x: Any) -> np.ndarray:
    """Any peer's result as a float32 numpy array (torch tensors, jax arrays, numpy)."""
    if type(x).__module__.startswith("torch"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x).astype(np.float32)


def tolerance(dtypes: Sequence[str]) -> float:
    return TOL_BF16 if any(d in ("bf16", "f16") for d in dtypes) else TOL_F32


def check_close(ref: Any, got: Any, tol: float) -> tuple[bool, float, str]:
    """Is `got` ours (`ref`) up to `tol`? Elementwise |got - ref| <= tol * (|ref| + rms(ref)):
    allclose with rtol = tol and atol = tol * rms(ref), so one tolerance serves outputs of any
    magnitude, and large entries (a causal attention's first rows, a few keys' average) are
    held to their own rounding, not to the typical entry's. The error reported is the largest
    |got - ref| / (|ref| + rms(ref)). Non-finite values must sit where ref has them. Returns
    (ok, error, why not)."""
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    if ref.shape != got.shape:
        return False, math.inf, f"shape {got.shape}, expected {ref.shape}"
    fin = np.isfinite(ref)
    if not np.array_equal(fin, np.isfinite(got)):
        n = int(np.count_nonzero(fin != np.isfinite(got)))
        return False, math.inf, f"{n} non-finite values where ours has none (or vice versa)"
    if ref.size == 0 or not fin.any():
        return True, 0.0, ""
    r, g = ref[fin], got[fin]
    rms = float(np.sqrt(np.mean(np.square(r))))
    err = float(np.max(np.abs(g - r) / (np.abs(r) + (rms if rms > 0 else 1.0))))
    if err <= tol:
        return True, err, ""
    return False, err, f"max|peer-ours|/(|ours|+rms) = {err:.3g} > {tol:g}"


# --------------------------------------------------------------------------------------------
# Peers


@dataclasses.dataclass
class Peer:
    name: str
    kind: str  # "ours", "torch" or "xla"
    fn: Callable[[], Any] | None = None  # one call, returns once the result is ready
    note: str = ""
    skip: str | None = None  # why it does not run
    compare: Callable[[Any], np.ndarray] = to_f32  # its result, as ours is laid out, in f32
    own_thread: bool = False  # called on a dedicated Python thread (see OwnThread)


class OwnThread:
    """One dedicated Python thread that runs our calls (whole samples, so the hand-over costs
    one round trip per >= min-sample-ms sample, not one per call).

    Why: tokamax_cpp's AMX kernels (bf16 weights on CPUs with AMX) load the tile configuration
    once per thread (amx_configure_tiles, a thread_local flag in src/kernels/microkernels_amx.cc)
    and trust it from then on; oneDNN (torch's bf16 matmul and SDPA) releases the tiles
    (TILERELEASE) after its own AMX kernels, so our next AMX call on that thread dies with
    SIGILL (ours bf16, torch bf16 mm, ours bf16 on one thread: reproducible). Our pool threads
    never run torch, and torch's never run ours: only the calling thread is shared, and this
    class makes it a different one. --same-thread turns it off (to check a fix)."""

    def __init__(self):
        import concurrent.futures

        self._ex = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ours")

    def run(self, f: Callable[..., Any], *args) -> Any:
        return self._ex.submit(f, *args).result()

    def close(self):
        self._ex.shutdown()


class Libs:
    """The peer libraries, imported once (after configure_threads)."""

    def __init__(self, threads: int):
        import tokamax_cpp

        self.tokamax_cpp = tokamax_cpp
        tokamax_cpp.set_num_threads(threads)
        self.errors: dict[str, str] = {}
        try:
            import torch

            torch.set_num_threads(threads)
            self.torch = torch
        except Exception as e:  # noqa: BLE001
            self.torch = None
            self.errors["torch"] = f"{type(e).__name__}: {e}"
        try:
            import jax
            import jax.numpy as jnp

            self.jax, self.jnp = jax, jnp
        except Exception as e:  # noqa: BLE001
            self.jax = self.jnp = None
            self.errors["jax"] = f"{type(e).__name__}: {e}"
        self.gtokamax = None
        if self.jax is not None:
            try:
                import tokamax as gtokamax

                self.gtokamax = gtokamax
            except Exception as e:  # noqa: BLE001
                self.errors["tokamax"] = f"{type(e).__name__}: {e}"

    def versions(self) -> dict:
        import importlib.metadata as md

        v = {"python": platform.python_version(), "numpy": np.__version__,
             "tokamax_cpp": self.tokamax_cpp.__version__}
        for mod, dist in (("torch", "torch"), ("jax", "jax"), ("gtokamax", "tokamax")):
            if getattr(self, mod) is not None:
                try:
                    v[dist] = md.version(dist)
                except md.PackageNotFoundError:
                    v[dist] = getattr(getattr(self, mod), "__version__", "?")
        try:
            import jaxlib  # noqa: F401

            v["jaxlib"] = md.version("jaxlib")
        except Exception:  # noqa: BLE001
            pass
        return v


def _torch_of(torch, a: np.ndarray):
    """A torch tensor sharing a numpy array's memory (ml_dtypes bfloat16 through int16)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _jax_fn(jax, f, args):
    def call():
        return f(*args).block_until_ready()

    return call


def _lowering_note(jax, f, args) -> str:
    try:
        text = jax.jit(f).lower(*args).as_text()
    except Exception:  # noqa: BLE001
        return ""
    calls = sorted(set(re.findall(r'custom_call\s*@(\w+)|call_target_name\s*=\s*"([^"]+)"',
                                  text)) - {("", "")})
    names = sorted({a or b for a, b in calls})
    return "lowers to XLA ops" if not names else "custom calls: " + ", ".join(names)


def _make(name: str, kind: str, build: Callable[[], tuple[Callable[[], Any], str]],
          compare: Callable[[Any], np.ndarray] = to_f32) -> Peer:
    try:
        fn, note = build()
        return Peer(name, kind, fn, note, compare=compare)
    except Exception as e:  # noqa: BLE001
        return Peer(name, kind, None, skip=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")


def _ours_config_note(tc, call) -> str:
    try:
        q = tc.query_configs(call)
        if q:
            return f"{q[0]['implementation']}, config: {q[0]['rung']}"
    except Exception:  # noqa: BLE001
        pass
    return ""


def ragged_dot_peers(inp: dict, libs: Libs) -> list[Peer]:
    lhs, rhs, gs = inp["lhs"], inp["rhs"], inp["group_sizes"]
    ldt, rdt = inp["dtypes"]
    mixed = ldt != rdt
    tc = libs.tokamax_cpp
    peers: list[Peer] = []

    rep = inp.get("representative")

    def ours():
        call = lambda: tc.ragged_dot(lhs, rhs, gs, representative_group_sizes=rep)  # noqa: E731
        return call, _ours_config_note(tc, call)

    peers.append(_make("tokamax_cpp.ragged_dot", "ours", ours))

    def ours_packed():
        packed = tc.pack_rhs(rhs)
        call = lambda: tc.ragged_dot(lhs, packed, gs, representative_group_sizes=rep)  # noqa: E731
        return call, "weights packed once, outside timing; " + _ours_config_note(tc, call)

    peers.append(_make("tokamax_cpp.ragged_dot (pack_rhs)", "ours", ours_packed))

    total = int(gs.sum())
    bounds = []
    start = 0
    for g, s in enumerate(gs.tolist()):
        if s:
            bounds.append((g, start, start + s))
        start += s

    torch = libs.torch
    if torch is None:
        peers.append(Peer("torch", "torch", skip=libs.errors.get("torch", "no torch")))
    else:
        x, w = _torch_of(torch, lhs), _torch_of(torch, rhs)
        n = w.shape[2]
        out_dtype = x.dtype

        def loop_upcast():
            def call():
                out = torch.empty(total, n, dtype=out_dtype)
                for g, s, e in bounds:
                    torch.mm(x[s:e], w[g].to(out_dtype), out=out[s:e])
                return out

            note = "mm per non-empty group into one output"
            return call, note + ("; weights upcast to f32 per group" if mixed else "")

        peers.append(_make("torch loop of mm" + (" (w.float())" if mixed else ""), "torch",
                           loop_upcast))
        if mixed:
            def loop_bf16():
                def call():
                    xb = x.to(w.dtype)
                    out = torch.empty(total, n, dtype=out_dtype)
                    for g, s, e in bounds:
                        out[s:e] = torch.mm(xb[s:e], w[g])
                    return out

                return call, "lhs cast to bf16 per call, bf16 mm per group, result to f32"

            peers.append(_make("torch loop of mm (bf16)", "torch", loop_bf16))

        def grouped():
            offs = torch.from_numpy(np.cumsum(gs).astype(np.int32))
            if not hasattr(torch, "_grouped_mm"):
                raise NotImplementedError(f"torch {torch.__version__} has no _grouped_mm")
            if mixed:
                call = lambda: torch._grouped_mm(x, w, offs=offs)  # noqa: E731
                try:
                    call()
                    return call, "mixed dtypes accepted"
                except RuntimeError:
                    pass  # mixed dtypes refused (torch 2.15): lhs cast to bf16 instead
                call = lambda: torch._grouped_mm(x.to(w.dtype), w, offs=offs)  # noqa: E731
                call()
                return call, "f32 x bf16 refused; lhs cast to bf16 per call, bf16 out"
            call = lambda: torch._grouped_mm(x, w, offs=offs)  # noqa: E731
            call()  # raises here where this CPU/dtype is unsupported
            return call, ""

        peers.append(_make("torch._grouped_mm" + (" (x.bfloat16())" if mixed else ""), "torch",
                           grouped))

    jax = libs.jax
    if jax is None:
        peers.append(Peer("jax", "xla", skip=libs.errors.get("jax", "no jax")))
    else:
        jl, jr, jg = (jax.device_put(a) for a in (lhs, rhs, gs))

        def lax_rd():
            f = jax.jit(jax.lax.ragged_dot)
            return _jax_fn(jax, f, (jl, jr, jg)), ""

        peers.append(_make("jax.lax.ragged_dot (jit)", "xla", lax_rd))
        gt = libs.gtokamax
        if gt is None:
            peers.append(Peer("tokamax.ragged_dot (Google)", "xla",
                              skip=libs.errors.get("tokamax", "no tokamax")))
        else:
            def google():
                g = lambda a, b, c: gt.ragged_dot(a, b, c)  # noqa: E731
                f = jax.jit(g)
                return _jax_fn(jax, f, (jl, jr, jg)), "default implementation; " + \
                    _lowering_note(jax, g, (jl, jr, jg))

            peers.append(_make("tokamax.ragged_dot (Google, jit)", "xla", google))

    return peers


def _group_bounds(gs: np.ndarray) -> list[tuple[int, int, int]]:
    """(group, first row, end row) of each non-empty group."""
    bounds, start = [], 0
    for g, s in enumerate(gs.tolist()):
        if s:
            bounds.append((g, start, start + s))
        start += s
    return bounds


def quantized_peers(inp: dict, libs: Libs) -> list[Peer]:
    """Ours on the quantized weights, ours on the same weights in bf16, and torch's fastest CPU
    weight-only kernels a torch user has (int8 per channel: _weight_int8pack_mm; int4 per group:
    _weight_int4pack_mm_for_cpu), one call per non-empty expert."""
    lhs, q, gs, deq = inp["lhs"], inp["q"], inp["group_sizes"], inp["deq"]
    tc = libs.tokamax_cpp
    peers = [_make("tokamax_cpp.ragged_dot (" + q.format + ")", "ours",
                   lambda: ((lambda: tc.ragged_dot(lhs, q, gs)), "weights widened in-kernel")),
             _make("tokamax_cpp.ragged_dot (bf16 weights)", "ours",
                   lambda: ((lambda: tc.ragged_dot(lhs, inp["rhs_bf16"], gs)),
                            "the same weights dequantized to bf16"))]
    torch = libs.torch
    if torch is None:
        peers.append(Peer("torch", "torch", skip=libs.errors.get("torch", "no torch")))
        return peers
    bounds = _group_bounds(gs)
    total = int(gs.sum())
    n = deq.shape[2]
    x = torch.from_numpy(lhs).to(torch.bfloat16)

    def int8_pack():
        if q.format != "int8" or q.group_size != deq.shape[1]:
            raise NotImplementedError("int8 per channel only")
        scale = np.abs(deq).max(axis=1)  # [G, N]: the per-channel scale * 127
        scale[scale == 0] = 1
        ws = [torch.from_numpy(np.ascontiguousarray(
            np.rint(deq[g] / scale[g] * 127).T.astype(np.int8))) for g in range(deq.shape[0])]
        ss = [torch.from_numpy((scale[g] / 127).astype(np.float32)).to(torch.bfloat16)
              for g in range(deq.shape[0])]

        def call():
            out = torch.empty(total, n, dtype=torch.bfloat16)
            for g, s, e in bounds:
                out[s:e] = torch.ops.aten._weight_int8pack_mm(x[s:e], ws[g], ss[g])
            return out

        call()
        return call, "bf16 activations, int8 [N, K] and bf16 scales per expert"

    def int4_pack():
        if q.format != "int4":
            raise NotImplementedError("int4 only")
        gsz = q.group_size
        g_count, k = deq.shape[0], deq.shape[1]
        scales = q.scales  # [G, P, K / gsz, 64] f32 (ours)
        zeros = q.zeros
        packs, szs = [], []
        for g in range(g_count):
            s = scales[g].transpose(1, 0, 2).reshape(k // gsz, -1)[:, :n]  # [K/gsz, N]
            z = (zeros[g].transpose(1, 0, 2).reshape(k // gsz, -1)[:, :n].astype(np.float32)
                 if zeros is not None else np.full_like(s, 8))
            codes = np.rint(deq[g] / np.repeat(s, gsz, axis=0) + np.repeat(z, gsz, axis=0))
            w_int = torch.from_numpy(np.ascontiguousarray(codes.T.astype(np.int32)))
            packs.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(w_int, 1))
            sz = np.stack([s, (8 - z) * s], axis=-1)  # torch: (q - 8) * s + zero
            szs.append(torch.from_numpy(sz.astype(np.float32)).to(torch.bfloat16))

        def call():
            out = torch.empty(total, n, dtype=torch.bfloat16)
            for g, s, e in bounds:
                out[s:e] = torch.ops.aten._weight_int4pack_mm_for_cpu(x[s:e], packs[g], gsz,
                                                                       szs[g])
            return out

        call()
        return call, "bf16 activations, int4 packed per expert, bf16 scales and zeros"

    peers.append(_make("torch _weight_int8pack_mm loop", "torch", int8_pack))
    peers.append(_make("torch _weight_int4pack_mm_for_cpu loop", "torch", int4_pack))
    return peers


def attention_peers(inp: dict, libs: Libs) -> list[Peer]:
    q, k, v = inp["q"], inp["k"], inp["v"]
    bias, mask = inp.get("bias"), inp.get("mask")
    causal, scale = inp["is_causal"], inp["scale"]
    kvl, ql = inp.get("kv_seq_lengths"), inp.get("q_seq_lengths")
    window, cap = inp["local_window_size"], inp["logits_soft_cap"]
    tc = libs.tokamax_cpp
    peers: list[Peer] = []
    kw: dict[str, Any] = {"is_causal": causal}
    if scale is not None:
        kw["scale"] = scale

    def extra_kw(for_jax_nn: bool = False) -> dict:
        e: dict[str, Any] = {}
        if kvl is not None:
            e["key_value_seq_lengths"] = kvl
        if ql is not None:
            e["query_seq_lengths"] = ql
        if window is not None:
            e["local_window_size"] = tuple(window) if isinstance(window, list) else window
        if cap is not None:
            if for_jax_nn:
                raise NotImplementedError("jax.nn.dot_product_attention has no logits_soft_cap")
            e["logits_soft_cap"] = cap
        return e

    def ours():
        e = extra_kw()
        call = lambda: tc.dot_product_attention(q, k, v, bias, mask, **kw, **e)  # noqa: E731
        return call, _ours_config_note(tc, call)

    peers.append(_make("tokamax_cpp.dot_product_attention", "ours", ours))

    torch = libs.torch
    if torch is None:
        peers.append(Peer("torch SDPA", "torch", skip=libs.errors.get("torch", "no torch")))
    else:
        def sdpa():
            if kvl is not None or ql is not None or window is not None or cap is not None:
                raise NotImplementedError("SDPA takes no sequence lengths, window or soft cap")
            F = torch.nn.functional
            tq, tk, tv = (_torch_of(torch, a).transpose(1, 2).contiguous() for a in (q, k, v))
            gqa = tq.shape[1] != tk.shape[1]
            skw: dict[str, Any] = {"enable_gqa": gqa} if gqa else {}
            if scale is not None:
                skw["scale"] = scale
            notes = ["inputs [B,N,T,H], transposed outside timing"]
            if gqa:
                notes.append("enable_gqa")
            if bias is None and mask is None:
                call = lambda: F.scaled_dot_product_attention(  # noqa: E731
                    tq, tk, tv, is_causal=causal, **skw)
            else:
                if causal:
                    raise NotImplementedError("SDPA takes is_causal or attn_mask, not both")
                tb = _torch_of(torch, bias) if bias is not None else None
                tm = torch.from_numpy(mask) if mask is not None else None
                neg = torch.tensor(float("-inf"), dtype=tq.dtype)

                def call():
                    if tb is None:
                        am = tm
                    elif tm is None:
                        am = tb
                    else:
                        am = torch.where(tm, tb.to(tq.dtype), neg)
                    return F.scaled_dot_product_attention(tq, tk, tv, attn_mask=am, **skw)

                if tb is not None and tm is not None:
                    notes.append("attn_mask = where(mask, bias, -inf) built per call")
            return call, "; ".join(notes)

        peers.append(_make("torch SDPA", "torch", sdpa,
                           compare=lambda r: to_f32(r.transpose(1, 2))))

    jax = libs.jax
    if jax is None:
        peers.append(Peer("jax", "xla", skip=libs.errors.get("jax", "no jax")))
    else:
        jq, jk, jv = (jax.device_put(a) for a in (q, k, v))
        jb = jax.device_put(bias) if bias is not None else None
        jm = jax.device_put(mask) if mask is not None else None

        def jnn():
            e = {key: (jax.device_put(val) if isinstance(val, np.ndarray) else val)
                 for key, val in extra_kw(for_jax_nn=True).items()}
            g = lambda a, b, c, d, m: jax.nn.dot_product_attention(  # noqa: E731
                a, b, c, bias=d, mask=m, **kw, **e)
            f = jax.jit(g)
            return _jax_fn(jax, f, (jq, jk, jv, jb, jm)), ""

        peers.append(_make("jax.nn.dot_product_attention (jit)", "xla", jnn))
        gt = libs.gtokamax
        if gt is None:
            peers.append(Peer("tokamax.dot_product_attention (Google)", "xla",
                              skip=libs.errors.get("tokamax", "no tokamax")))
        else:
            def google():
                e = {key: (jax.device_put(val) if isinstance(val, np.ndarray) else val)
                     for key, val in extra_kw().items()}
                g = lambda a, b, c, d, m: gt.dot_product_attention(  # noqa: E731
                    a, b, c, bias=d, mask=m, **kw, **e)
                f = jax.jit(g)
                args = (jq, jk, jv, jb, jm)
                return _jax_fn(jax, f, args), "default implementation; " + \
                    _lowering_note(jax, g, args)

            peers.append(_make("tokamax.dot_product_attention (Google, jit)", "xla", google))
    return peers


def moe_peers(inp: dict, libs: Libs) -> list[Peer]:
    """Ours (the torch operator and the packed weights), the Python-glue layer around two
    ragged_dot operators, and transformers' experts backends on one Qwen3-MoE experts module
    holding the same weights."""
    tc, torch = libs.tokamax_cpp, libs.torch
    if torch is None:
        raise NotImplementedError("moe_experts peers need torch")
    from tokamax_cpp import torch_ops  # noqa: F401  (registers the operators)

    x = _torch_of(torch, inp["hidden"])
    idx = torch.from_numpy(inp["top_k_index"])
    w = torch.from_numpy(inp["top_k_weights"])
    gu, dn = _torch_of(torch, inp["w_gate_up"]), _torch_of(torch, inp["w_down"])
    e, k, n = gu.shape[0], gu.shape[2], gu.shape[1] // 2
    peers = [_make("tokamax_cpp moe_experts (torch op)", "ours", lambda: (
        (lambda: torch.ops.tokamax.moe_experts(x, idx, w, gu, dn, transposed_weights=True)),
        "one call: sort, gate-up, silu, down, combine"))]

    def packed():
        weights = tc.pack_moe_weights(gu, dn, transposed_weights=True)
        return (lambda: tc.moe_experts_packed(x, idx, w, weights)), "weights packed once"

    peers.append(_make("tokamax_cpp moe_experts_packed", "ours", packed))

    def glue():
        gu_kn = gu.transpose(1, 2).contiguous()  # [E, K, 2N], once
        dn_nk = dn.transpose(1, 2).contiguous()  # [E, N, K]

        def call():
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)
            sizes = torch.bincount(flat, minlength=e).to(torch.int32)
            xs = x[order // idx.shape[1]]
            h = torch.ops.tokamax.ragged_dot(xs, gu_kn, sizes)
            a = (torch.nn.functional.silu(h[:, :n]) * h[:, n:]).to(x.dtype)
            y = torch.ops.tokamax.ragged_dot(a, dn_nk, sizes)
            y = y * w.reshape(-1)[order, None].to(y.dtype)
            out = torch.zeros(x.shape, dtype=torch.float32)
            out.index_add_(0, order // idx.shape[1], y.float())
            return out.to(x.dtype)

        return call, "two torch.ops.tokamax.ragged_dot, sort/gather/silu/combine in torch"

    peers.append(_make("python glue around tokamax ragged_dot", "ours", glue))

    def hf(impl: str):
        def build():
            from transformers import Qwen3MoeConfig
            from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

            cfg = Qwen3MoeConfig(hidden_size=k, moe_intermediate_size=n, num_experts=e,
                                 num_experts_per_tok=idx.shape[1], num_hidden_layers=1)
            with torch.device("meta"):
                module = Qwen3MoeExperts(cfg)
            module.gate_up_proj = torch.nn.Parameter(gu, requires_grad=False)
            module.down_proj = torch.nn.Parameter(dn, requires_grad=False)
            cfg._experts_implementation = impl

            def call():
                with torch.no_grad():
                    return module(x, idx, w.to(x.dtype))

            import transformers

            return call, f"transformers {transformers.__version__}, experts_implementation={impl}"
        return build

    for impl in ("eager", "grouped_mm", "batched_mm"):
        peers.append(_make(f"transformers experts ({impl})", "torch", hf(impl)))
    return peers


PEER_BUILDERS = {"ragged_dot": ragged_dot_peers, "dot_product_attention": attention_peers,
                 "quantized_ragged_dot": quantized_peers, "moe_experts": moe_peers}


# --------------------------------------------------------------------------------------------
# Measurement


def _sample(fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call, the mean over `reps` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _fmt_err(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160] if lines else ''}"


def bench_spec(spec: dict, peers: list[Peer], *, tol: float, rounds: int, min_sample_ms: float,
               max_seconds: float | None = None, seed: int = 0, gap_ms: float = 0.0,
               log: Callable[[str], None] = lambda s: None,
               own_thread: OwnThread | None = None,
               view: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
    """Checks and times one spec's peers (the first "ours" peer is the reference) in
    interleaved rounds, then checks every timed peer's output once more (a kernel whose state
    another library disturbed shows here). Returns the spec's result: per peer its status,
    check error, calls per sample, samples (ms), per-round ratios to ours and their summary.
    Peers with own_thread run on `own_thread` (a fresh one if None). `view` picks the part of
    a result that is compared (ragged_dot: the rows the groups cover). Each timed sample comes
    after `gap_ms` of idling (see --gap-ms)."""
    own = own_thread or (OwnThread() if any(p.own_thread for p in peers) else None)

    def on(p: Peer, f: Callable[..., Any], *args) -> Any:
        return own.run(f, *args) if p.own_thread else f(*args)

    rows: list[dict] = []
    for p in peers:
        rows.append({"peer": p.name, "kind": p.kind, "note": p.note, "status": "ok",
                     "check_error": None, "calls_per_sample": 0, "samples_ms": [],
                     "ratios": [], "median_ms": None, "ratio_median": None,
                     "ratio_min": None, "ratio_max": None})
        if p.skip:
            rows[-1]["status"] = "skipped"
            rows[-1]["note"] = p.skip
    ref_i = next((i for i, p in enumerate(peers) if p.kind == "ours" and not p.skip), None)
    if ref_i is None:
        raise RuntimeError(f"{spec['name']}: our implementation cannot run: "
                           + "; ".join(str(p.skip) for p in peers if p.kind == "ours"))
    # Reference first, then everyone's first call (compiles jax) and check.
    order = [ref_i] + [i for i in range(len(peers)) if i != ref_i]
    ref = None
    for i in order:
        p, row = peers[i], rows[i]
        if p.skip:
            continue
        try:
            out = on(p, p.fn)
            got = p.compare(out)
            if view is not None:
                got = view(got)
            del out
        except Exception as e:  # noqa: BLE001
            if i == ref_i:
                raise
            row["status"] = "error"
            row["note"] = _fmt_err(e)
            log(f"  {p.name}: error: {row['note']}")
            continue
        if i == ref_i:
            ref = got
            row["check_error"] = 0.0
            continue
        ok, err, why = check_close(ref, got, tol)
        row["check_error"] = err if math.isfinite(err) else None
        if not ok:
            row["status"] = "mismatch"
            row["note"] = why + ("; " + row["note"] if row["note"] else "")
            log(f"  {p.name}: MISMATCH: {why}")
    timed = [i for i in range(len(peers)) if rows[i]["status"] == "ok"]
    # Warm-up and calls per sample: >= 2 calls and ~min_sample_ms of calls, then enough calls
    # for a sample to last min_sample_ms at the best per-call time seen.
    min_s = min_sample_ms / 1e3
    for i in timed:
        fn = peers[i].fn
        best, spent, calls = math.inf, 0.0, 0
        while calls < 2 or (spent < min_s and calls < 1000):
            t = on(peers[i], _sample, fn, 1)
            best, spent, calls = min(best, t), spent + t, calls + 1
        rows[i]["calls_per_sample"] = max(1, min(100000, math.ceil(min_s / max(best, 1e-9))))
    rng = random.Random(seed)
    t_start = time.perf_counter()
    done = 0
    for r in range(rounds):
        order = list(timed)
        rng.shuffle(order)
        sample = {}
        for i in order:
            if gap_ms > 0:
                time.sleep(gap_ms / 1e3)
            sample[i] = on(peers[i], _sample, peers[i].fn, rows[i]["calls_per_sample"]) * 1e3
        for i in timed:
            rows[i]["samples_ms"].append(sample[i])
            rows[i]["ratios"].append(sample[i] / sample[ref_i])
        done += 1
        if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
            break
    for i in timed:
        p, row = peers[i], rows[i]
        try:
            got = p.compare(on(p, p.fn))
            ok, err, why = check_close(ref, view(got) if view is not None else got, tol)
        except Exception as e:  # noqa: BLE001
            ok, err, why = False, math.inf, _fmt_err(e)
        row["post_check_error"] = err if math.isfinite(err) else None
        if not ok:
            row["status"] = "mismatch after timing"
            row["note"] = why + ("; " + row["note"] if row["note"] else "")
            log(f"  {p.name}: MISMATCH after timing: {why}")
    del ref
    if own is not None and own_thread is None:
        own.close()
    for i in timed:
        row = rows[i]
        if not row["samples_ms"]:
            continue
        row["median_ms"] = statistics.median(row["samples_ms"])
        row["ratio_median"] = statistics.median(row["ratios"])
        row["ratio_min"], row["ratio_max"] = min(row["ratios"]), max(row["ratios"])
    tags = spec.get("tags", [])
    if "quantized" in tags:
        target = QUANTIZED_DECODE_TARGET if "decode" in tags else QUANTIZED_PREFILL_TARGET
    elif spec.get("op") == "moe_experts":
        tokens = int(parse_shape_dtype(spec["arguments"]["hidden"])[1][0])
        target = MOE_TARGETS.get(tokens, PREFILL_TARGET)
    else:
        target = DECODE_TARGET if "decode" in tags else PREFILL_TARGET
    others = [rows[i] for i in timed if peers[i].kind != "ours" and rows[i]["status"] == "ok"]
    fastest = min(others, key=lambda row: row["median_ms"]) if others else None
    return {"name": spec["name"], "op": spec.get("op"), "tags": tags,
            "arguments": spec.get("arguments"), "rounds": done, "tolerance": tol,
            "reference": peers[ref_i].name, "peers": rows,
            "fastest_peer": fastest["peer"] if fastest else None,
            "speedup_vs_fastest": fastest["ratio_median"] if fastest else None,
            "speedup_range": [fastest["ratio_min"], fastest["ratio_max"]] if fastest else None,
            "target": target,
            "meets_target": (fastest["ratio_median"] >= target) if fastest else None}


# --------------------------------------------------------------------------------------------
# Output


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _ratio(row: dict) -> str:
    if row["ratio_median"] is None:
        return "-"
    return f"{row['ratio_median']:.2f} [{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]"


def format_tables(results: list[dict]) -> str:
    lines = ["| spec | dtype | peer | median ms | ratio vs ours [range] | note |",
             "|---|---|---|---:|---|---|"]
    for res in results:
        for row in res["peers"]:
            if row["status"] == "ok":
                ratio = "1 (ours)" if row["peer"] == res["reference"] else _ratio(row)
                note = row["note"]
            else:
                ratio = row["status"].upper()
                note = row["note"]
            lines.append(f"| {res['name']} | {res['dtype']} | {row['peer']} | "
                         f"{_ms(row['median_ms'])} | {ratio} | {note.replace('|', '/')} |")
    lines += ["", "Ours vs the fastest torch/XLA peer (speedup = median of per-round ratios "
              "peer / ours; target >= 1.5x on decode specs, >= 1.0x on prefill; quantized: "
              ">= 2x and >= 1.2x):", "",
              "| spec | fastest peer | peer ms | ours ms | speedup [range] | target | met |",
              "|---|---|---:|---:|---|---:|---|"]
    for res in results:
        ours = next(r for r in res["peers"] if r["peer"] == res["reference"])
        if res["fastest_peer"] is None:
            lines.append(f"| {res['name']} | (none ran) | - | {_ms(ours['median_ms'])} | - | "
                         f"{res['target']:g}x | - |")
            continue
        f = next(r for r in res["peers"] if r["peer"] == res["fastest_peer"])
        met = "yes" if res["meets_target"] else "NO"
        if ours["status"] != "ok":
            met = f"? (ours: {ours['status']})"
        lines.append(f"| {res['name']} | {f['peer']} | {_ms(f['median_ms'])} | "
                     f"{_ms(ours['median_ms'])} | {_ratio(f)} | {res['target']:g}x | {met} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tokamax_cpp.bench_peers",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", required=True, choices=sorted(PEER_BUILDERS))
    ap.add_argument("--tag", default="primary", help="specs with this tag (default primary)")
    ap.add_argument("--spec", help="one spec by name (the tag is then ignored)")
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for every library (default os.cpu_count())")
    ap.add_argument("--min-sample-ms", type=float, default=20.0,
                    help="a sample's minimum duration (default 20)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="per spec: no new round once the rounds took this long (>= 1 round)")
    ap.add_argument("--peers", help="comma-separated substrings: only peers whose name has one "
                    "(ours always runs)")
    ap.add_argument("--gap-ms", type=float, default=100.0,
                    help="idle time before each timed sample, so that no library's worker "
                    "threads still spin from the sample before (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="inputs and round order (default 0)")
    ap.add_argument("--json", dest="json_path", help="write every sample here")
    ap.add_argument("--cli", help="the tokamax CLI for the specs (default: found, see load_specs)")
    ap.add_argument("--specs-json", help="read the specs from this file (a `tokamax specs "
                    "--json` list) instead")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the process to --threads CPUs")
    ap.add_argument("--same-thread", action="store_true",
                    help="call ours on the main thread like every peer (see OwnThread: crashes "
                    "with SIGILL on bf16 AMX specs until the tile-config bug is fixed)")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.threads < 1 or a.min_sample_ms <= 0 or not 0 <= a.gap_ms <= 60000:
        ap.error("--rounds and --threads must be >= 1, --min-sample-ms > 0, --gap-ms in "
                 "[0, 60000]")
    return a


def result_view(op: str, inp: dict) -> Callable[[np.ndarray], np.ndarray] | None:
    """ragged_dot: the rows the groups cover (rows past their total are no part of the result;
    the torch loop's output holds only the total)."""
    if op in ("ragged_dot", "quantized_ragged_dot"):
        total = int(inp["group_sizes"].sum())
        return lambda a: a[:total]
    return None


def spec_dtype(inp: dict) -> str:
    d = inp["dtypes"]
    return d[0] if len(set(d)) == 1 else " x ".join(d)


def main(argv: Sequence[str] | None = None, *,
         extra_peers: Callable[[dict, dict, Libs], list[Peer]] | None = None) -> int:
    """The command line. `extra_peers(spec, inputs, libs)` adds peers (tests)."""
    a = parse_args(argv)
    thread_info = configure_threads(a.threads, pin=not a.no_pin)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    specs, source = load_specs(a.op, a.tag, a.spec, cli=a.cli, specs_json=a.specs_json)
    libs = Libs(a.threads)
    wanted = [w.strip() for w in a.peers.split(",")] if a.peers else None
    meta = {"op": a.op, "tag": None if a.spec else a.tag, "spec": a.spec, "rounds": a.rounds,
            "min_sample_ms": a.min_sample_ms, "max_seconds": a.max_seconds, "seed": a.seed,
            "gap_ms": a.gap_ms, "spec_source": source,
            "device_kind": libs.tokamax_cpp.device_kind(),
            "cpu_count": os.cpu_count(), "tokamax_cpp_threads": libs.tokamax_cpp.num_threads(),
            "torch_threads": libs.torch.get_num_threads() if libs.torch else None,
            "versions": libs.versions(), "import_errors": libs.errors, **thread_info,
            "tolerances": {"f32": TOL_F32, "bf16": TOL_BF16},
            "ours_on_own_thread": not a.same_thread,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    log(f"bench_peers: {len(specs)} {a.op} spec(s) from {source}; {a.threads} thread(s); "
        f"{a.rounds} round(s), samples >= {a.min_sample_ms:g} ms")
    results = []
    own = None if a.same_thread else OwnThread()
    for spec in specs:
        t0 = time.perf_counter()
        log(f"{spec['name']} {json.dumps(spec['arguments'])}")
        try:
            inp = make_inputs(a.op, spec["arguments"], a.seed)
        except (NotImplementedError, ValueError) as e:
            log(f"  skipped: {e}")
            continue
        peers = PEER_BUILDERS[a.op](inp, libs)
        if extra_peers is not None:
            peers += extra_peers(spec, inp, libs)
        if wanted:
            peers = [p for p in peers if p.kind == "ours" or any(w in p.name for w in wanted)]
        for p in peers:
            p.own_thread = p.own_thread or (p.kind == "ours" and not a.same_thread)
        res = bench_spec(spec, peers, tol=tolerance(inp["dtypes"]), rounds=a.rounds,
                         min_sample_ms=a.min_sample_ms, max_seconds=a.max_seconds, seed=a.seed,
                         gap_ms=a.gap_ms, log=log, own_thread=own, view=result_view(a.op, inp))
        res["dtype"] = spec_dtype(inp)
        if "group_sizes" in inp:
            res["group_sizes"] = inp["group_sizes"].tolist()
        res["seconds"] = time.perf_counter() - t0
        results.append(res)
        summary = ", ".join(f"{r['peer']} {_ms(r['median_ms'])}" if r["status"] == "ok"
                            else f"{r['peer']} {r['status']}" for r in res["peers"])
        log(f"  {res['rounds']} round(s) in {res['seconds']:.1f} s: {summary}")
        del peers, inp
        gc.collect()
    if own is not None:
        own.close()
    print(format_tables(results))
    if a.json_path:
        pathlib.Path(a.json_path).write_text(json.dumps({"meta": meta, "specs": results},
                                                        indent=1))
        log(f"wrote {a.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
