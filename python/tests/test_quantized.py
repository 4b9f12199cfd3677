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
