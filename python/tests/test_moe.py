"""moe_experts from Python and torch: the function and operator made from the family's
description, and the packed-weights path, against numpy's double-precision loop over experts and
against Hugging Face transformers' own experts forward (eager, grouped_mm) on a Qwen3-MoE
experts module's weights."""

import threading

import ml_dtypes
import numpy as np
import pytest
import torch

import tokamax_cpp as tc
from tokamax_cpp import torch_ops  # noqa: F401  (registers the operators)


def _routing(rng, t, e, k, dtype=np.int64):
    idx = np.stack([rng.permutation(e)[:k] for _ in range(t)]).astype(dtype)
    w = rng.uniform(0.05, 1.0, (t, k)).astype(np.float32)
    return idx.reshape(t, k), w.reshape(t, k)


def _layer(x, idx, w, gu, dn, transposed):
    """The layer in double precision, token by token ([E, K, 2N] / [E, N, K] unless transposed)."""
    x, gu, dn = (a.astype(np.float64) for a in (x, gu, dn))
    if transposed:
        gu, dn = gu.transpose(0, 2, 1), dn.transpose(0, 2, 1)
    n = gu.shape[2] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            h = x[t] @ gu[idx[t, j]]
            a = h[:n] / (1 + np.exp(-h[:n])) * h[n:]
            out[t] += w[t, j] * (a @ dn[idx[t, j]])
    return out


def _weights(rng, e, k, n, transposed):
    gu = (rng.standard_normal((e, k, 2 * n)) / np.sqrt(k)).astype(np.float32)
    dn = (rng.standard_normal((e, n, k)) / np.sqrt(n)).astype(np.float32)
    if transposed:
        gu, dn = np.ascontiguousarray(gu.transpose(0, 2, 1)), np.ascontiguousarray(
            dn.transpose(0, 2, 1))
    return gu, dn


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_function_matches_numpy(transposed, index_dtype):
    rng = np.random.default_rng()
    t, k, e, n, top = 7, 40, 6, 19, 2
    x = rng.standard_normal((t, k)).astype(np.float32)
    idx, w = _routing(rng, t, e, top, index_dtype)
    gu, dn = _weights(rng, e, k, n, transposed)
    want = _layer(x, idx, w, gu, dn, transposed)
    got = tc.moe_experts(x, idx, w, gu, dn, transposed_weights=transposed)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    packed = tc.pack_moe_weights(gu, dn, transposed_weights=transposed)
    assert packed.experts == e and packed.transposed_weights == transposed
    np.testing.assert_allclose(tc.moe_experts_packed(x, idx, w, packed), want, rtol=1e-4,
                               atol=1e-4)


def test_bf16_weights_and_activations():
    rng = np.random.default_rng()
    t, k, e, n, top = 9, 64, 8, 24, 3
    x = rng.standard_normal((t, k)).astype(ml_dtypes.bfloat16)
    idx, w = _routing(rng, t, e, top)
    gu, dn = (a.astype(ml_dtypes.bfloat16) for a in _weights(rng, e, k, n, True))
    want = _layer(x.astype(np.float32), idx, w, gu.astype(np.float32), dn.astype(np.float32),
                  True)
    got = tc.moe_experts(x, idx, w, gu, dn, transposed_weights=True)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=3e-2, atol=3e-2)


def test_bad_routing_is_a_value_error_naming_it():
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 16)).astype(np.float32)
    gu, dn = _weights(rng, 4, 16, 8, False)
    idx, w = _routing(rng, 3, 4, 2)
    idx[1, 0] = 4
    with pytest.raises(ValueError, match=r"top_k_index\[1, 0\] = 4; expected an expert in"):
        tc.moe_experts(x, idx, w, gu, dn)
    idx[1, 0] = 0
    w[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"top_k_weights\[2, 1\] = nan"):
        tc.moe_experts(x, idx, w, gu, dn)
    with pytest.raises(ValueError, match="w_down has spec"):
        tc.moe_experts(x, idx, np.ones((3, 2), np.float32), gu, dn[:3].copy())


def _qwen3_experts(dtype, hidden=64, width=32, experts=8, top=2):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=width, num_experts=experts,
                         num_experts_per_tok=top, num_hidden_layers=1)
    module = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        module.gate_up_proj.normal_(std=hidden ** -0.5)
        module.down_proj.normal_(std=width ** -0.5)
    return cfg, module.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_operator_matches_transformers_experts(dtype):
    cfg, module = _qwen3_experts(dtype)
    t, top = 11, cfg.num_experts_per_tok
    x = torch.randn(t, cfg.hidden_size).to(dtype)
    logits = torch.randn(t, cfg.num_experts)
    w, idx = torch.topk(torch.softmax(logits, -1), top, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    ours = torch.ops.tokamax.moe_experts(x, idx, w, module.gate_up_proj.detach(),
                                         module.down_proj.detach(), transposed_weights=True)
    assert ours.dtype == dtype and ours.shape == x.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for impl in ("eager", "grouped_mm"):
        cfg._experts_implementation = impl
        with torch.no_grad():
            theirs = module(x, idx, w)
        # Each computes in its own order (bf16: transformers rounds the products' outputs to
        # bf16 too); normwise relative difference.
        diff = (ours.double() - theirs.double()).norm() / theirs.double().norm()
        assert diff < tol, (impl, float(diff))


def test_interleaved_with_torch_from_two_threads():
    """torch ops and ours, one after the other, on two Python threads at once: each thread's
    results equal the same calls made alone."""
    cfg, module = _qwen3_experts(torch.bfloat16)
    gu, dn = module.gate_up_proj.detach(), module.down_proj.detach()
    inputs = []
    for _ in range(2):
        x = torch.randn(5, cfg.hidden_size).to(torch.bfloat16)
        w, idx = torch.topk(torch.rand(5, cfg.num_experts), 2, dim=-1)
        inputs.append((x, idx, w))

    def step(x, idx, w):
        y = torch.nn.functional.silu(x.float() @ torch.ones(cfg.hidden_size, cfg.hidden_size))
        return torch.ops.tokamax.moe_experts(y.to(torch.bfloat16), idx, w, gu, dn,
                                             transposed_weights=True)

    alone = [step(*a) for a in inputs]
    results = [[], []]

    def work(i):
        for _ in range(20):
            results[i].append(step(*inputs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(2):
        for r in results[i]:
            assert torch.equal(r, alone[i])
