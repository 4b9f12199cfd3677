"""tokamax_cpp.bench_peers: the correctness check, the spec helpers (group sizes against the C++
generator's values), and main end to end on tiny specs with 2 rounds (tables, JSON, a
deliberately wrong peer reported as a mismatch and not timed)."""

import json

import ml_dtypes
import numpy as np
import pytest

from tokamax_cpp import bench_peers as bp


def test_check_close_flags_wrong_results():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((33, 17)).astype(np.float32)
    assert bp.check_close(ref, ref.copy(), bp.TOL_F32)[0]
    ok, err, why = bp.check_close(ref, ref * 1.1, bp.TOL_F32)
    assert not ok and err > 0.05 and "rms" in why
    # Large entries are held to their own size: 1% off on the one large entry is caught at the
    # f32 tolerance, bf16 rounding of it is not a bf16 mismatch.
    big = ref.copy()
    big[0, 0] = 100.0
    off = big.copy()
    off[0, 0] = 101.0
    assert not bp.check_close(big, off, bp.TOL_F32)[0]
    off[0, 0] = float(np.float32(ml_dtypes.bfloat16(100.3)))
    assert bp.check_close(big, off, bp.TOL_BF16)[0]
    assert not bp.check_close(ref, ref * 1.1, bp.TOL_BF16)[0]  # 10% off fails bf16 too
    assert not bp.check_close(ref, ref[:32], bp.TOL_BF16)[0]  # shape
    nan = ref.copy()
    nan[3, 4] = np.nan
    assert not bp.check_close(ref, nan, bp.TOL_BF16)[0]
    # bf16 rounding passes the bf16 tolerance and fails the f32 one.
    rounded = ref.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert bp.check_close(ref, rounded, bp.TOL_BF16)[0]
    assert not bp.check_close(ref, rounded, bp.TOL_F32)[0]
    assert bp.tolerance(("f32", "bf16")) == bp.TOL_BF16 and bp.tolerance(("f32",)) == bp.TOL_F32


def test_group_sizes_match_the_library():
    # Values of tokamax::rdot::generate_group_sizes(total, groups, 0), from the C++ library.
    assert bp.generate_group_sizes(67, 4).tolist() == [20, 17, 17, 13]
    assert bp.generate_group_sizes(64, 32).tolist() == [
        2, 2, 2, 1, 3, 3, 4, 3, 1, 1, 5, 1, 1, 3, 3, 2, 2, 2, 2, 2, 2, 3, 3, 0, 3, 1, 2, 2, 0, 2,
        0, 1]
    g = bp.generate_group_sizes(96, 64)
    assert g.dtype == np.int32 and g.shape == (64,) and g.sum() == 96
    assert bp.spec_group_sizes([3, 0, 2]).tolist() == [3, 0, 2]
    assert bp.parse_shape_dtype("bf16[8, 1024,16]") == ("bf16", (8, 1024, 16))
    with pytest.raises(ValueError):
        bp.parse_shape_dtype("f32(3)")


TINY = [
    {"name": "tiny", "op": "ragged_dot", "tags": ["smoke"],
     "arguments": {"lhs": "f32[20,32]", "rhs": "f32[3,32,16]", "group_sizes": [5, 0, 12]}},
    {"name": "tiny_decode_bf16_weights", "op": "ragged_dot", "tags": ["smoke", "decode"],
     "arguments": {"lhs": "f32[8,64]", "rhs": "bf16[4,64,32]",
                   "group_sizes": {"num_groups": 4, "total_size": 8}}},
    {"name": "tiny_int8", "op": "quantized_ragged_dot", "tags": ["smoke", "quantized", "decode"],
     "arguments": {"lhs": "f32[6,64]", "values": "i8[3,1,64,64]", "scales": "f32[3,1,1,64]",
                   "group_sizes": [2, 0, 3], "format": "int8", "n": 40, "group_size": 0}},
    {"name": "tiny_int4_asym", "op": "quantized_ragged_dot", "tags": ["smoke", "quantized"],
     # N a multiple of 16: torch's int4 packing requires it.
     "arguments": {"lhs": "f32[6,64]", "values": "u8[2,1,64,32]", "scales": "f32[2,1,2,64]",
                   "zeros": "u8[2,1,2,64]", "group_sizes": [4, 2], "format": "int4", "n": 48,
                   "group_size": 32}},
    {"name": "tiny_moe", "op": "moe_experts", "tags": ["smoke", "moe"],
     # Rows of 16-byte multiples: torch._grouped_mm (transformers' grouped_mm) requires them.
     "arguments": {"hidden": "bf16[8,32]", "top_k_index": "i64[8,2]",
                   "top_k_weights": "f32[8,2]", "w_gate_up": "bf16[4,32,32]",
                   "w_down": "bf16[4,32,16]", "transposed_weights": True}},
    {"name": "tiny_gqa", "op": "dot_product_attention", "tags": ["smoke"],
     "arguments": {"q": "f32[1,9,4,16]", "k": "f32[1,12,2,16]", "v": "f32[1,12,2,16]",
                   "is_causal": False}},
]


def wrong_ragged_peer(spec, inp, libs):
    """Ours with the group sizes rotated: rows multiplied by another group's weights."""
    tc = libs.tokamax_cpp
    lhs, rhs, gs = inp["lhs"], inp["rhs"], np.roll(inp["group_sizes"], 1)
    return [bp.Peer("wrong (rotated groups)", "torch", lambda: tc.ragged_dot(lhs, rhs, gs),
                    own_thread=True)]  # ours' calls off the thread torch uses (bp.OwnThread)


def run_main(tmp_path, capsys, op, extra_peers=None):
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(TINY))
    out = tmp_path / f"{op}.json"
    rc = bp.main(["--op", op, "--tag", "smoke", "--specs-json", str(specs), "--rounds", "2",
                  "--min-sample-ms", "2", "--gap-ms", "1", "--no-pin", "--json", str(out)],
                 extra_peers=extra_peers)
    assert rc == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_main_ragged_dot(tmp_path, capsys):
    table, doc = run_main(tmp_path, capsys, "ragged_dot", extra_peers=wrong_ragged_peer)
    lines = table.splitlines()
    assert lines[0] == "| spec | dtype | peer | median ms | ratio vs ours [range] | note |"
    assert "| tiny | f32 | tokamax_cpp.ragged_dot |" in table
    assert "| tiny_decode_bf16_weights | f32 x bf16 | jax.lax.ragged_dot (jit) |" in table
    wrong = [ln for ln in lines if "wrong (rotated groups)" in ln]
    assert len(wrong) == 2 and all("| MISMATCH |" in ln for ln in wrong)
    assert "| spec | fastest peer | peer ms | ours ms | speedup [range] | target | met |" in table

    meta = doc["meta"]
    assert meta["op"] == "ragged_dot" and meta["threads"] >= 1 and meta["rounds"] == 2
    assert meta["gap_ms"] == 1
    assert "xla_cpu_multi_thread_eigen=true" in meta["xla_flags"]
    assert [s["name"] for s in doc["specs"]] == ["tiny", "tiny_decode_bf16_weights"]
    tiny, dec = doc["specs"]
    assert tiny["group_sizes"] == [5, 0, 12] and tiny["target"] == bp.PREFILL_TARGET
    assert dec["group_sizes"] == bp.generate_group_sizes(8, 4).tolist()
    assert dec["target"] == bp.DECODE_TARGET and dec["tolerance"] == bp.TOL_BF16
    for res in doc["specs"]:
        rows = {r["peer"]: r for r in res["peers"]}
        ours = rows["tokamax_cpp.ragged_dot"]
        assert ours["status"] == "ok" and len(ours["samples_ms"]) == res["rounds"] == 2
        assert all(x == 1.0 for x in ours["ratios"])
        bad = rows["wrong (rotated groups)"]
        assert bad["status"] == "mismatch" and bad["samples_ms"] == []
        assert bad["median_ms"] is None and bad["check_error"] > res["tolerance"]
        for name, r in rows.items():
            if r["status"] == "ok":
                assert len(r["samples_ms"]) == len(r["ratios"]) == 2, name
                assert r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"], name
                assert r["calls_per_sample"] >= 1 and r["check_error"] <= res["tolerance"], name
            else:
                assert r["status"] in ("skipped", "error", "mismatch"), name
        assert rows["jax.lax.ragged_dot (jit)"]["status"] == "ok"
        assert rows["torch loop of mm" + (" (w.float())" if res is dec else "")]["status"] == "ok"
        assert res["fastest_peer"] in rows and rows[res["fastest_peer"]]["kind"] != "ours"
        assert res["fastest_peer"] != "wrong (rotated groups)"
        assert res["speedup_vs_fastest"] == rows[res["fastest_peer"]]["ratio_median"]
        assert isinstance(res["meets_target"], bool)


def test_main_quantized(tmp_path, capsys):
    """Ours on quantized weights against ours on the same weights in bf16 and torch's
    weight-only kernels (each checked against ours first), with the quantized targets."""
    table, doc = run_main(tmp_path, capsys, "quantized_ragged_dot")
    int8, int4 = doc["specs"]
    assert int8["target"] == bp.QUANTIZED_DECODE_TARGET
    assert int4["target"] == bp.QUANTIZED_PREFILL_TARGET
    for res, torch_peer in ((int8, "torch _weight_int8pack_mm loop"),
                            (int4, "torch _weight_int4pack_mm_for_cpu loop")):
        rows = {r["peer"]: r for r in res["peers"]}
        for name in (res["reference"], "tokamax_cpp.ragged_dot (bf16 weights)", torch_peer):
            assert rows[name]["status"] == "ok" and len(rows[name]["samples_ms"]) == 2, name
            assert rows[name]["check_error"] <= res["tolerance"], name
    assert "| tiny_int4_asym | f32 x bf16 | tokamax_cpp.ragged_dot (int4) |" in table


def test_main_moe(tmp_path, capsys):
    """The fused experts op against transformers' experts backends on the same module weights
    and routing, and the Python-glue layer; each checked against ours before it is timed."""
    table, doc = run_main(tmp_path, capsys, "moe_experts")
    (res,) = doc["specs"]
    assert res["target"] == bp.MOE_TARGETS[8]
    rows = {r["peer"]: r for r in res["peers"]}
    for name in (res["reference"], "tokamax_cpp moe_experts_packed",
                 "python glue around tokamax ragged_dot", "transformers experts (eager)",
                 "transformers experts (grouped_mm)"):
        assert rows[name]["status"] == "ok" and len(rows[name]["samples_ms"]) == 2, name
        assert rows[name]["check_error"] <= res["tolerance"], name
    assert res["fastest_peer"].startswith("transformers experts")
    assert "| tiny_moe | bf16 | transformers experts (eager) |" in table


def test_bad_options_are_usage_errors():
    for bad in (["--rounds", "0"], ["--gap-ms", "-1"], ["--gap-ms", "inf"], ["--gap-ms", "nan"],
                ["--min-sample-ms", "0"]):
        with pytest.raises(SystemExit) as e:
            bp.parse_args(["--op", "ragged_dot", *bad])
        assert e.value.code == 2, bad


def test_main_attention(tmp_path, capsys):
    table, doc = run_main(tmp_path, capsys, "dot_product_attention")
    (res,) = doc["specs"]
    rows = {r["peer"]: r for r in res["peers"]}
    for name in ("tokamax_cpp.dot_product_attention", "torch SDPA",
                 "jax.nn.dot_product_attention (jit)"):
        assert rows[name]["status"] == "ok" and len(rows[name]["samples_ms"]) == 2, name
    assert "enable_gqa" in rows["torch SDPA"]["note"]
    assert "| tiny_gqa | f32 | torch SDPA |" in table


def test_specs_from_the_cli():
    if bp.find_cli() is None:
        pytest.skip("no tokamax CLI (build/release/tokamax) to read the specs from")
    specs, source = bp.load_specs("ragged_dot", "primary")
    names = [s["name"] for s in specs]
    assert "qwen3_30b_a3b_decode" in names and "tokamax" in source
    for s in specs:
        assert s["op"] == "ragged_dot" and "primary" in s["tags"]
        assert {"lhs", "rhs", "group_sizes"} <= set(s["arguments"])
    (one,), _ = bp.load_specs("dot_product_attention", None, "decode")
    assert one["name"] == "decode" and "decode" in one["tags"]
