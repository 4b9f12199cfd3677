"""torch.ops.tokamax: numerics against the reference ops and float64 torch, autograd against the
reference VJPs, opcheck on every registered operator, torch.compile(fullgraph=True) on a small
MoE block with changing token counts, get_configs, the out-variant, errors."""

import json
import os

import numpy as np
import pytest
import torch

import tokamax_cpp
import tokamax_cpp.torch_ops as T


@pytest.fixture
def gen():
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return torch.Generator().manual_seed(seed)


def randn(gen, *shape, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen).to(dtype)
    return t.requires_grad_(requires_grad)


def random_sizes(gen, m, g):
    """g group sizes summing to at most m, with empty groups."""
    cuts = torch.sort(torch.randint(0, m + 1, (g - 1,), generator=gen)).values
    sizes = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([m])]))
    sizes[0] = 0  # an empty group
    return sizes.to(torch.int32)


def ragged_dot_f64(lhs, rhs, sizes):
    out = torch.zeros(lhs.shape[0], rhs.shape[2], dtype=torch.float64)
    start = 0
    for g, s in enumerate(sizes.tolist()):
        out[start:start + s] = lhs[start:start + s].double() @ rhs[g].double()
        start += s
    return out


def leaves(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


# --- numerics -------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k,n,g", [(0, 8, 5, 2), (1, 3, 1, 1), (37, 19, 23, 4), (64, 128, 48, 8)])
def test_ragged_dot_matches_float64_and_reference(gen, m, k, n, g):
    lhs, rhs = randn(gen, m, k), randn(gen, g, k, n)
    sizes = random_sizes(gen, m, g)
    want = ragged_dot_f64(lhs, rhs, sizes)
    for fn in (T.ragged_dot, T.reference.ragged_dot):
        got = fn(lhs, rhs, sizes)
        assert got.dtype == torch.float32 and got.shape == (m, n)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_ragged_dot_bf16_and_int64_group_sizes(gen):
    lhs, rhs = randn(gen, 33, 40, dtype=torch.bfloat16), randn(gen, 3, 40, 17, dtype=torch.bfloat16)
    sizes = random_sizes(gen, 33, 3).to(torch.int64)
    want = ragged_dot_f64(lhs, rhs, sizes)
    got = T.ragged_dot(lhs, rhs, sizes)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    got32 = T.ragged_dot(lhs, rhs, sizes, preferred_element_type=torch.float32)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=1e-4, atol=1e-4)


def test_ragged_dot_autograd_matches_reference_and_float64(gen):
    lhs, rhs = randn(gen, 29, 24), randn(gen, 3, 24, 11)
    sizes = random_sizes(gen, 29, 3)
    dout = randn(gen, 29, 11)
    grads = {}
    for name, fn in (("fast", T.ragged_dot), ("reference", T.reference.ragged_dot)):
        a, b = leaves(lhs, rhs)
        (fn(a, b, sizes, activation="silu") * dout).sum().backward()
        grads[name] = (a.grad, b.grad)
    a, b = (t.double().requires_grad_(True) for t in (lhs, rhs))
    pre = torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(
        [0] + torch.cumsum(sizes, 0).tolist()[:-1], torch.cumsum(sizes, 0).tolist()))]
        + [a.new_zeros(29 - int(sizes.sum()), 11)])
    (torch.nn.functional.silu(pre) * dout.double()).sum().backward()
    for name in grads:
        torch.testing.assert_close(grads[name][0].double(), a.grad, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(grads[name][1].double(), b.grad, rtol=1e-3, atol=1e-3)
    assert torch.all(grads["fast"][1][0] == 0)  # the empty group's gradient is exactly zero


def test_attention_gqa_causal_autograd(gen):
    q, k, v = randn(gen, 2, 9, 4, 16), randn(gen, 2, 11, 2, 16), randn(gen, 2, 11, 2, 8)
    bias = randn(gen, 1, 4, 9, 11)
    dout = randn(gen, 2, 9, 4, 8)
    results = {}
    for name, fam in (("fast", T), ("reference", T.reference)):
        qq, kk, vv, bb = leaves(q, k, v, bias)
        out = fam.dot_product_attention(qq, kk, vv, bb, is_causal=True, logits_soft_cap=30.0)
        (out * dout).sum().backward()
        results[name] = (out.detach(), qq.grad, kk.grad, vv.grad, bb.grad)
    # float64 torch: GQA by repeating kv heads, causal by masking, the soft cap (tanh) applied
    # to the scaled and biased logits (tokamax's order).
    qq, kk, vv, bb = (t.double().requires_grad_(True) for t in (q, k, v, bias))
    kr = kk.repeat_interleave(2, dim=2)
    vr = vv.repeat_interleave(2, dim=2)
    logits = torch.einsum("btnh,bsnh->bnts", qq, kr) / 4.0 + bb
    logits = 30.0 * torch.tanh(logits / 30.0)
    causal = torch.ones(9, 11, dtype=torch.bool).tril()
    logits = logits.masked_fill(~causal, float("-inf"))
    out = torch.einsum("bnts,bsnh->btnh", torch.softmax(logits, -1), vr)
    (out * dout.double()).sum().backward()
    for name, (o, dq, dk, dv, db) in results.items():
        torch.testing.assert_close(o.double(), out.detach(), rtol=1e-4, atol=1e-4)
        for got, want in ((dq, qq.grad), (dk, kk.grad), (dv, vv.grad), (db, bb.grad)):
            torch.testing.assert_close(got.double(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("subtract_mean", [True, False])
def test_layer_norm_autograd(gen, subtract_mean):
    x, s, b = randn(gen, 5, 3, 33), randn(gen, 33), randn(gen, 33)
    dy = randn(gen, 5, 3, 33)
    xx, ss, bb = leaves(x, s, b)
    y = T.layer_norm(xx, ss, bb, subtract_mean=subtract_mean)
    (y * dy).sum().backward()
    x64, s64, b64 = (t.double().requires_grad_(True) for t in (x, s, b))
    mean = x64.mean(-1, keepdim=True) if subtract_mean else 0.0
    var = ((x64 - mean) ** 2).mean(-1, keepdim=True)
    y64 = (x64 - mean) / torch.sqrt(var + 1e-6) * s64 + b64
    (y64 * dy.double()).sum().backward()
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-4, atol=1e-4)
    for got, want in ((xx.grad, x64.grad), (ss.grad, s64.grad), (bb.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3)


def test_glu_and_loss_autograd_match_reference_ops(gen):
    x, w = randn(gen, 2, 7, 24), randn(gen, 24, 2, 9)
    labels = torch.randint(0, 13, (6,), generator=gen, dtype=torch.int32)
    xl, wl = randn(gen, 6, 24), randn(gen, 24, 13)
    got = {}
    for name, fam in (("fast", T), ("reference", T.reference)):
        a, b = leaves(x, w)
        fam.gated_linear_unit(a, b, activation="silu").square().sum().backward()
        c, d = leaves(xl, wl)
        loss = fam.linear_softmax_cross_entropy_loss(c, labels, d, reduction="mean")
        loss.backward()
        got[name] = (a.grad, b.grad, c.grad, d.grad, loss.detach())
    # float64 torch for the loss
    c, d = (t.double().requires_grad_(True) for t in (xl, wl))
    want = torch.nn.functional.cross_entropy(c @ d, labels.long(), reduction="mean")
    want.backward()
    torch.testing.assert_close(got["fast"][4].double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["fast"][2].double(), c.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["fast"][3].double(), d.grad, rtol=1e-4, atol=1e-5)
    for f, r in zip(got["fast"][:4], got["reference"][:4]):
        torch.testing.assert_close(f, r, rtol=1e-3, atol=1e-3)


# --- registration -------------------------------------------------------------------------

def _opcheck_cases(gen):
    sizes = torch.tensor([2, 0, 3], dtype=torch.int32)
    lhs, rhs = randn(gen, 6, 8, requires_grad=True), randn(gen, 3, 8, 5, requires_grad=True)
    q, k, v = (randn(gen, 1, 4, 2, 8, requires_grad=True) for _ in range(3))
    x, s = randn(gen, 3, 16, requires_grad=True), randn(gen, 16, requires_grad=True)
    w = randn(gen, 16, 2, 4, requires_grad=True)
    labels = torch.tensor([1, 0, 3], dtype=torch.int32)
    wl = randn(gen, 16, 5, requires_grad=True)
    cases = []
    for suffix in ("", "_reference"):
        ns = torch.ops.tokamax
        cases += [
            (getattr(ns, "ragged_dot" + suffix), (lhs, rhs, sizes)),
            (getattr(ns, "dot_product_attention" + suffix), (q, k, v)),
            (getattr(ns, "layer_norm" + suffix), (x, s, None)),
            (getattr(ns, "gated_linear_unit" + suffix), (x, w, "silu")),
            (getattr(ns, "linear_softmax_cross_entropy_loss" + suffix), (x, labels, wl, "mean")),
        ]
        d = lambda t: t.detach()  # noqa: E731
        out, lse = getattr(ns, "dot_product_attention" + suffix)(d(q), d(k), d(v))
        y, mean, rstd = getattr(ns, "layer_norm" + suffix)(d(x), d(s), None)
        o, h = getattr(ns, "gated_linear_unit" + suffix)(d(x), d(w), "silu")
        loss, llse = getattr(ns, "linear_softmax_cross_entropy_loss" + suffix)(
            d(x), labels, d(wl), "mean")
        cases += [
            (getattr(ns, "ragged_dot" + suffix + "_vjp"),
             (d(lhs), d(rhs), sizes, randn(gen, 6, 5))),
            (getattr(ns, "dot_product_attention" + suffix + "_vjp"),
             (d(q), d(k), d(v), out, lse, randn(gen, 1, 4, 2, 8))),
            (getattr(ns, "layer_norm" + suffix + "_vjp"),
             (d(x), mean, rstd, randn(gen, 3, 16), d(s), None)),
            (getattr(ns, "gated_linear_unit" + suffix + "_vjp"),
             (d(x), d(w), h, randn(gen, 3, 4), "silu")),
            (getattr(ns, "linear_softmax_cross_entropy_loss" + suffix + "_vjp"),
             (d(x), labels, d(wl), llse, torch.tensor(1.0), "mean")),
        ]
    cases.append((torch.ops.tokamax.ragged_dot_out,
                  (lhs.detach(), rhs.detach(), sizes, torch.empty(6, 5))))
    return cases


def test_opcheck_every_operator(gen):
    cases = _opcheck_cases(gen)
    assert len(cases) == 21
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_compile_moe_block_fullgraph_dynamic_tokens(gen):
    """A small MoE block (router, top-1 routing, ragged_dot experts with a fused activation,
    rms_norm) compiled with fullgraph=True; several token counts; forward and backward match
    eager."""
    experts, d_model, d_ff = 4, 32, 24

    class Moe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = torch.nn.Parameter(torch.randn(d_model, experts, generator=gen))
            self.w_in = torch.nn.Parameter(torch.randn(experts, d_model, d_ff, generator=gen) / 6)
            self.w_out = torch.nn.Parameter(torch.randn(experts, d_ff, d_model, generator=gen) / 5)
            self.scale = torch.nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            expert = torch.argmax(x @ self.router, dim=-1)
            order = torch.argsort(expert)
            sizes = torch.bincount(expert, minlength=experts).to(torch.int32)
            xs = x[order].contiguous()
            h = T.ragged_dot(xs, self.w_in, sizes, activation="gelu")
            y = T.ragged_dot(h, self.w_out, sizes)
            out = torch.empty_like(y).index_copy(0, order, y)
            return T.rms_norm(out + x, self.scale)

    model = Moe()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for tokens in (7, 16, 33):
        x = torch.randn(tokens, d_model, generator=gen)
        eager_params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
        y_eager = torch.func.functional_call(model, dict(zip(
            [n for n, _ in model.named_parameters()], eager_params)), (x,))
        y_eager.square().sum().backward()
        model.zero_grad()
        y = compiled(x)
        y.square().sum().backward()
        torch.testing.assert_close(y, y_eager.detach(), rtol=1e-5, atol=1e-5)
        for p, e in zip(model.parameters(), eager_params):
            torch.testing.assert_close(p.grad, e.grad, rtol=1e-4, atol=1e-4)


# --- configs, out-variant, errors ---------------------------------------------------------

def test_get_configs_heuristics_and_cache(gen, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKAMAX_CACHE_DIR", str(tmp_path))
    lhs, rhs = randn(gen, 40, 32), randn(gen, 4, 32, 16)
    sizes = torch.tensor([10, 10, 10, 10], dtype=torch.int32)
    heur = T.get_configs("ragged_dot", lhs, rhs, sizes)
    assert [e["op"] for e in heur.forward] == ["ragged_dot"]
    assert len(heur.backward) == 2  # dlhs and drhs are two ragged_dot calls
    assert all(e["source"] == "heuristics" for e in heur.forward + heur.backward)
    # A tuned result in scope: the cache route sees it, the heuristics route does not.
    forced = dict(heur.forward[0]["config"], kc=8)
    bound = tokamax_cpp.get_bound_args(lambda: tokamax_cpp.ragged_dot(
        lhs.numpy(), rhs.numpy(), sizes.numpy()))
    assert len(bound) == 1
    result = tokamax_cpp.AutotuningResult.loads(json.dumps({
        "device_kind": tokamax_cpp.device_kind(),
        "data": [[json.loads(bound[0].to_json()),
                  {json.dumps(forced, sort_keys=True, separators=(",", ":")):
                   {"median_ms": 1.0, "samples_ms": [1.0]}}]]}))
    with result:
        cached = T.get_configs(T.ragged_dot, lhs, rhs, sizes, from_autotuning_cache=True)
        assert cached.forward[0]["source"] == "scope"
        assert cached.forward[0]["config"] == forced
        assert T.get_configs(T.ragged_dot, lhs, rhs, sizes).forward[0]["config"] != forced
        # The operators use the heuristics (deterministic graphs) unless given the config.
        out = T.ragged_dot(lhs, rhs, sizes, implementation="native",
                           config=cached.forward[0]["config"])
        torch.testing.assert_close(out, T.reference.ragged_dot(lhs, rhs, sizes))
    attn = T.get_configs("dot_product_attention", randn(gen, 1, 8, 2, 16),
                         randn(gen, 1, 8, 2, 16), randn(gen, 1, 8, 2, 16), is_causal=True)
    assert attn.forward[0]["op"] == "dot_product_attention"
    assert attn.backward[0]["op"] == "dot_product_attention_vjp"


def test_ragged_dot_out_writes_the_callers_buffer(gen):
    lhs, rhs = randn(gen, 12, 8), randn(gen, 2, 8, 6)
    sizes = torch.tensor([5, 4], dtype=torch.int32)
    out = torch.full((12, 6), float("nan"))
    ptr = out.data_ptr()
    assert T.ragged_dot_out(lhs, rhs, sizes, out) is out
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out, T.reference.ragged_dot(lhs, rhs, sizes))
    assert torch.all(out[9:] == 0)
    with pytest.raises(ValueError, match="expected a contiguous f32\\[12,6\\] buffer"):
        T.ragged_dot_out(lhs, rhs, sizes, torch.empty(12, 7))


def test_errors_are_python_exceptions(gen):
    lhs, rhs = randn(gen, 6, 8), randn(gen, 2, 8, 5)
    with pytest.raises(ValueError, match="group_sizes"):
        T.ragged_dot(lhs, rhs, torch.tensor([2.0, 4.0]))
    with pytest.raises(ValueError, match="contiguous"):
        T.ragged_dot(lhs.t().contiguous().t(), rhs, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="sum\\(group_sizes\\)"):
        T.ragged_dot(lhs, rhs, torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="device"):
        tokamax_cpp.ragged_dot(lhs.to("meta"), rhs, [3, 3])
    with pytest.raises(ValueError, match="rank 2"):
        T.ragged_dot(randn(gen, 6), rhs, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match="implementation"):
        T.ragged_dot(lhs, rhs, torch.tensor([3, 3]), implementation="nope")


def test_reference_and_fast_ops_share_a_signature():
    import inspect
    for name in ("ragged_dot", "dot_product_attention", "layer_norm", "gated_linear_unit",
                 "linear_softmax_cross_entropy_loss"):
        fast, ref = getattr(torch.ops.tokamax, name), getattr(torch.ops.tokamax, name + "_reference")
        assert str(fast.default._schema).replace(name + "(", "X(") == \
            str(ref.default._schema).replace(name + "_reference(", "X(")
        assert inspect.signature(getattr(T, name)) == inspect.signature(getattr(T.reference, name))


def test_numpy_results_stay_numpy(gen):
    out = tokamax_cpp.ragged_dot(np.ones((4, 3), np.float32), np.ones((1, 3, 2), np.float32), [4])
    assert isinstance(out, np.ndarray) and np.all(out == 3)
