"""quantized_ragged_dot from Python and torch: the function and the operator made from the
family's description, against numpy's product with the weights the layout stands for."""

import numpy as np
import pytest

import tokamax_cpp as tc


def _int8_layout(w: np.ndarray):
    """int8 per-channel values and scales of w [G, K, N] in the panel layout (docs/quantized.md)."""
    g, k, n = w.shape
    p = (n + 63) // 64
    padded = np.zeros((g, k, p * 64), np.float32)
    padded[:, :, :n] = w
    scale = np.abs(padded).max(axis=1, keepdims=True) / 127
    scale[scale == 0] = 1
    q = np.clip(np.rint(padded / scale), -127, 127).astype(np.int8)
    values = q.reshape(g, k, p, 64).transpose(0, 2, 1, 3).copy()
    scales = scale.reshape(g, 1, p, 64).transpose(0, 2, 1, 3).astype(np.float32).copy()
    deq = (q.astype(np.float64) * scale)[:, :, :n]
    return values, scales, deq


def test_function_and_operator_match_numpy():
    rng = np.random.default_rng()
    g, k, n = 3, 40, 70
    values, scales, deq = _int8_layout(rng.standard_normal((g, k, n)).astype(np.float32))
    sizes = [2, 0, 3]
    lhs = rng.standard_normal((6, k)).astype(np.float32)
    want = np.zeros((6, n))
    r = 0
    for e, s in enumerate(sizes):
        want[r:r + s] = lhs[r:r + s].astype(np.float64) @ deq[e]
        r += s
    got = tc.quantized_ragged_dot(lhs, values, scales, group_sizes=np.array(sizes, np.int32),
                                  format="int8", n=n)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="scales has spec"):
        tc.quantized_ragged_dot(lhs, values, np.ascontiguousarray(scales[:, :1]),
                                group_sizes=sizes, format="int8", n=n)
    with pytest.raises(TypeError, match="group_sizes"):
        tc.quantized_ragged_dot(lhs, values, scales, group_sizes=["a"], format="int8", n=n)
    torch = pytest.importorskip("torch")
    from tokamax_cpp import torch_ops  # noqa: F401  (registers the operators)

    out = torch.ops.tokamax.quantized_ragged_dot(
        torch.from_numpy(lhs), torch.from_numpy(values), torch.from_numpy(scales),
        group_sizes=sizes, format="int8", n=n)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt,group_size,asymmetric", [
    ("int8", 0, False), ("int8", 16, False), ("int4", 32, False), ("int4", 32, True),
    ("fp8_e4m3", 0, False), ("mxfp4", 32, False)])
def test_quantize_dequantize_and_ragged_dot(fmt, group_size, asymmetric):
    rng = np.random.default_rng()
    w = rng.standard_normal((2, 64, 70)).astype(np.float32)
    q = tc.quantize(w, fmt, group_size=group_size, asymmetric=asymmetric)
    assert q.shape == (2, 64, 70) and q.format == fmt and q.asymmetric == asymmetric
    d = tc.dequantize(q)
    assert d.shape == w.shape and d.dtype == np.float32
    # Within the format's step of the weights (int4's 1/7 of the group's largest magnitude is
    # the coarsest).
    assert np.abs(d - w).max() <= np.abs(w).max() / 2
    x = rng.standard_normal((6, 64)).astype(np.float32)
    got = tc.ragged_dot(x, q, [2, 3])
    want = np.concatenate([x[:2] @ d[0].astype(np.float64), x[2:5] @ d[1], np.zeros((1, 70))])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # The same arrays through from_parts make the same weights.
    again = tc.QuantizedWeights.from_parts(fmt, q.shape, q.group_size, q.values, q.scales,
                                           q.zeros)
    np.testing.assert_array_equal(tc.dequantize(again), d)


def test_bad_quantized_input():
    w = np.zeros((2, 64, 8), np.float32)
    with pytest.raises(ValueError, match="expected int8, int4, fp8_e4m3 or mxfp4"):
        tc.quantize(w, "int3")
    with pytest.raises(ValueError, match="group_size = 48"):
        tc.quantize(w, "int4", group_size=48)
    q = tc.quantize(w, "int8")
    scales = q.scales
    scales[0, 0, 0, 3] = 0
    with pytest.raises(ValueError, match=r"scales\[3\] = 0"):
        tc.QuantizedWeights.from_parts("int8", (2, 64, 8), 0, q.values, scales)
    with pytest.raises(ValueError, match="not taken"):
        tc.ragged_dot(np.zeros((2, 64), np.float32), q, [1, 1], precision="highest")


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0"])
def test_gguf_blocks_dequantize_as_gguf_does(type_name):
    """GGUF's own quantizer writes the blocks; our dequantized weights equal its dequantize bit
    for bit (zero and negative block scales included, as Q4_0 writes them)."""
    gguf = pytest.importorskip("gguf")
    from gguf import quants

    rng = np.random.default_rng()
    g, k, n = 3, 96, 70
    kind = getattr(gguf.GGMLQuantizationType, type_name)
    rows = rng.standard_normal((g * n, k)).astype(np.float32)  # GGUF's rows: [G*N, K]
    rows[5] = 0  # an all-zero row: scale 0
    blocks = quants.quantize(rows, kind)
    want = quants.dequantize(blocks, kind).reshape(g, n, k).transpose(0, 2, 1)
    q = tc.QuantizedWeights.from_gguf(blocks.reshape(g, n, -1), type_name, (g, k, n))
    assert q.format == ("int8" if type_name == "Q8_0" else "int4") and q.group_size == 32
    np.testing.assert_array_equal(tc.dequantize(q), want)
    x = rng.standard_normal((4, k)).astype(np.float32)
    got = tc.ragged_dot(x, q, [1, 0, 3])
    ref = np.concatenate([x[:1] @ want[0].astype(np.float64), x[1:] @ want[2]])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="expected contiguous u8"):
        tc.QuantizedWeights.from_gguf(blocks.reshape(g, n, -1)[:, :, 1:].copy(), type_name,
                                      (g, k, n))
    with pytest.raises(ValueError, match="expected Q8_0 or Q4_0"):
        tc.QuantizedWeights.from_gguf(blocks, "Q4_K", (g, k, n))
