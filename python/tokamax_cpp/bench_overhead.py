"""What a call from Python costs over the same call from C++.

    python -m tokamax_cpp.bench_overhead [--rounds 15]

On the smallest ragged_dot smoke spec (G=4, M=67, K=96, N=80, f32), with a tuned config in scope
(a cache hit), three ways of making the same call are timed side by side in interleaved rounds
(each round visits them in a fresh random order; a sample is enough back-to-back calls to last
about 20 ms):

  cpp      ragged_dot called from C++ in a loop (tokamax_cpp._core._time_cpp_ragged_dot)
  python   tokamax_cpp.ragged_dot on numpy arrays (result: a numpy array)
  torch    torch.ops.tokamax.ragged_dot on torch tensors (eager; result: a torch tensor)

The overhead of a way is its per-call time minus the C++ per-call time of the same round; the
table gives the median over rounds and its range. Targets (issue: Python package): python
adds at most 3 us, torch at most 15 us.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import numpy as np

import tokamax_cpp
from tokamax_cpp import _core


def _per_call(fn, min_s: float) -> float:
    """Seconds per call of fn(), over enough calls to last min_s."""
    iters = 1
    while True:
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / iters
        iters = max(iters * 2, int(iters * min_s / max(elapsed, 1e-9) * 1.2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-sample-ms", type=float, default=20.0)
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    lhs = rng.standard_normal((67, 96), dtype=np.float32)
    rhs = rng.standard_normal((4, 96, 80), dtype=np.float32)
    sizes = np.array([20, 0, 40, 7], dtype=np.int32)
    # A cache hit: tune this key into a result and apply it.
    result = tokamax_cpp.autotune(lambda: tokamax_cpp.ragged_dot(lhs, rhs, sizes),
                                  ignore_cache=True, max_candidates=3, measure_budget_s=1.0)
    min_s = args.min_sample_ms / 1000
    ways = {
        "cpp": lambda: _core._time_cpp_ragged_dot(lhs, rhs, sizes,
                                                  max(1, int(min_s / 5e-6))),
        "python": lambda: _per_call(lambda: tokamax_cpp.ragged_dot(lhs, rhs, sizes), min_s),
    }
    if not args.no_torch:
        import torch

        from tokamax_cpp import torch_ops  # noqa: F401  (registers torch.ops.tokamax)

        tl, tr, ts = (torch.from_numpy(a) for a in (lhs, rhs, sizes))
        op = torch.ops.tokamax.ragged_dot
        ways["torch"] = lambda: _per_call(lambda: op(tl, tr, ts), min_s)
    samples = {w: [] for w in ways}
    with result:
        rung = tokamax_cpp.query_configs(lambda: tokamax_cpp.ragged_dot(lhs, rhs, sizes))[0]
        assert rung["rung"] == "scope", rung
        for fn in ways.values():  # warm up
            fn()
        order = list(ways)
        for _ in range(args.rounds):
            random.shuffle(order)
            for w in order:
                samples[w].append(ways[w]())
    print(f"ragged_dot smoke_f32 (G=4, M=67, K=96, N=80, f32), {tokamax_cpp.num_threads()} "
          f"threads, {args.rounds} interleaved rounds, config from the scope (cache hit)\n")
    print("| way | per call (us, median) | overhead over C++ (us, median [min, max]) |")
    print("| --- | --- | --- |")
    for w in ways:
        per = statistics.median(samples[w]) * 1e6
        if w == "cpp":
            print(f"| {w} | {per:.2f} | - |")
            continue
        over = [(a - c) * 1e6 for a, c in zip(samples[w], samples["cpp"])]
        print(f"| {w} | {per:.2f} | {statistics.median(over):.2f} "
              f"[{min(over):.2f}, {max(over):.2f}] |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({w: s for w, s in samples.items()}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
