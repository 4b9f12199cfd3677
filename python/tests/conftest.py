"""Shared fixtures of the tokamax_cpp Python tests.

The autotuning disk cache is isolated before any test runs: the library reads each cache file
once per process, so TOKAMAX_CACHE_DIR must point at an empty directory before the first op call,
or a developer's own ~/.cache/tokamax would change which configs (and rungs) the tests see, and
tests that tune would write there. The cache-miss policy starts at its default (heuristics).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile

import numpy as np
import pytest

_CACHE_DIR = tempfile.mkdtemp(prefix="tokamax-cpp-test-cache-")
os.environ["TOKAMAX_CACHE_DIR"] = _CACHE_DIR
os.environ.pop("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", None)
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)


@pytest.fixture
def rng():
    """A fresh random generator per test case; its seed is printed (pytest shows it on failure).

    TOKAMAX_TEST_SEED=<seed> replays a failure.
    """
    env = os.environ.get("TOKAMAX_TEST_SEED")
    seed = int(env) if env else secrets.randbits(63)
    print(f"random seed {seed} (replay: TOKAMAX_TEST_SEED={seed})")
    return np.random.default_rng(seed)


@pytest.fixture
def cache_dir():
    """The whole pytest run's (empty, isolated) user autotuning cache directory."""
    return _CACHE_DIR
