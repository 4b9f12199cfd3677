"""The installed package: its import name beside Google's tokamax, and the tuning data shipped
in the wheel, found and used by the library's disk-cache rung."""

import json
import os
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

import tokamax_cpp


def test_import_name_does_not_shadow_googles_tokamax():
    google = pytest.importorskip("tokamax")
    assert pathlib.Path(google.__file__).parent != pathlib.Path(tokamax_cpp.__file__).parent
    assert hasattr(google, "ragged_dot") and hasattr(tokamax_cpp, "ragged_dot")


def test_shipped_data_comes_from_the_installed_package():
    package = pathlib.Path(tokamax_cpp.__file__).resolve().parent
    data = pathlib.Path(os.environ["TOKAMAX_DATA_DIR"]).resolve()
    assert data == package / "data" / "autotuning"
    assert any(data.glob("*/*.json")), "the wheel ships no tuning data"
    path = data / tokamax_cpp.device_kind() / "layer_norm_native.json"
    if not path.exists():
        pytest.skip(f"no shipped layer_norm data for {tokamax_cpp.device_kind()}")
    keys = [json.loads(k) for k in json.loads(path.read_text())["entries"]]
    keys = [k for k in keys if k["num_threads"] == tokamax_cpp.num_threads()
            and not k["return_residuals"] and k["x"].startswith(("f32[", "bf16["))]
    if not keys:
        pytest.skip("no shipped key for this thread count")

    def array(spec):
        dtype, dims = re.fullmatch(r"(\w+)\[([\d,]*)\]", spec).groups()
        shape = tuple(int(d) for d in dims.split(",") if d)
        return np.zeros(shape, {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[dtype])

    key = min(keys, key=lambda k: np.prod([int(d) for d in re.findall(r"\d+", k["x"])]))
    x = array(key["x"])
    scale = array(key["scale"]) if key["scale"] else None
    offset = array(key["offset"]) if key["offset"] else None
    calls = tokamax_cpp.query_configs(lambda: tokamax_cpp.layer_norm(
        x, scale, offset, axis=key["axis"], epsilon=key["epsilon"],
        subtract_mean=key["subtract_mean"], implementation="native"))
    assert calls[0]["rung"] == "disk_cache", calls
    assert str(path) in calls[0]["detail"]
