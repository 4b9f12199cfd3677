"""TOKAMAX_TRACE in a Python process.

The module links the library's static archive, where the linker drops an object file nothing
references, and its static initializers with it: the trace recorder's file started recording
from such an initializer, so a Python process wrote no trace at all. Each case runs a child
interpreter: TOKAMAX_TRACE is read when the library starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tokamax_cpp as tc
    lhs = np.ones((4, 8), np.float32)
    rhs = np.ones((2, 8, 8), np.float32)
    tc.ragged_dot(lhs, rhs, [1, 3])
    print("ok")
""")


def run_traced(trace: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TOKAMAX_TRACE=trace)
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, timeout=120)


def test_trace_is_written_at_exit(tmp_path):
    trace = tmp_path / "trace.json"
    r = run_traced(str(trace))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    assert trace.exists(), f"no trace written; stderr: {r.stderr[-2000:]}"
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert [e["name"] for e in events] == ["ragged_dot/native"]
    assert events[0]["args"]["payload"].startswith("tokamax:{")


def test_trace_that_cannot_be_written_is_said_at_exit(tmp_path):
    r = run_traced("/proc/tokamax/trace.json")
    assert "ok" in r.stdout, r.stderr[-2000:]
    assert "tokamax: TOKAMAX_TRACE: no trace written: trace path '/proc/tokamax/trace.json'" in (
        r.stderr), r.stderr[-2000:]
