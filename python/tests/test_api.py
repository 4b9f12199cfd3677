"""Tests of the tokamax_cpp Python API (the nanobind bindings and the package around them).

Numerics are checked against independent float64 computations written here (numpy for the
forwards, torch autograd in float64 for the VJPs), and for ragged_dot and attention against
jax.lax.ragged_dot, jax.nn.dot_product_attention and Google's tokamax on the same inputs.
bf16 references are computed in float64 from the bf16-rounded inputs. Sizes stay tiny: the
machine running them may have two cores.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
import torch

import tokamax_cpp as tc

BF16 = ml_dtypes.bfloat16
F32 = np.float32
IMPLS = {
    "ragged_dot": ["native", "blas", "reference"],
    "attention": ["native", "composed", "reference"],
    "other": ["native", "composed", "reference"],
}
# Relative tolerances (of the largest reference magnitude): f32 results and bf16 results.
TOL_F32 = 1e-4
TOL_BF16 = 1e-2


# --- helpers --------------------------------------------------------------------------------


def f64(a) -> np.ndarray:
    """Any array (numpy incl. bf16, torch, jax) as a float64 numpy array."""
    if isinstance(a, torch.Tensor):
        a = a.detach().to(torch.float64).numpy()
    return np.asarray(a).astype(np.float64)


def randn(rng, shape, dtype=F32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def assert_close(actual, expected, tol, what=""):
    """|actual - expected| <= tol * max(1, max|expected|) elementwise, and the same shape."""
    a, e = f64(actual), f64(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    np.testing.assert_array_equal(np.isfinite(a), np.isfinite(e), f"{what}: non-finite values")
    scale = max(1.0, float(np.abs(e[np.isfinite(e)]).max(initial=0.0)))
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * scale, err_msg=what)


def tol_of(dtype) -> float:
    return TOL_BF16 if np.dtype(dtype) == np.dtype(BF16) else TOL_F32


_erf = np.vectorize(math.erf, otypes=[np.float64])


def act_np(name, x):
    if name in (None, "none"):
        return x
    if name == "relu":
        return np.maximum(x, 0)
    if name == "silu":
        return x / (1 + np.exp(-x))
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    raise AssertionError(name)


def act_torch(name, x):
    F = torch.nn.functional
    return {
        None: lambda v: v,
        "relu": F.relu,
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "gelu": F.gelu,
        "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
    }[name](x)


def t64(a, grad=False):
    t = torch.from_numpy(f64(a))
    return t.requires_grad_(True) if grad else t


# --- ragged_dot: references -----------------------------------------------------------------


def ragged_ref(lhs, rhs, gs, *, dims="forward", activation=None, round_lhs=False):
    """float64 ragged_dot. round_lhs: an f32 lhs rounded to bf16 first (precision 'default'
    with a bf16 rhs)."""
    x = f64(np.asarray(lhs).astype(BF16) if round_lhs else lhs)
    w = f64(rhs)
    offs = np.concatenate([[0], np.cumsum(np.asarray(gs, np.int64))])
    if dims == "ragged_contracting":
        out = np.zeros((len(gs), x.shape[1], w.shape[1]))
        for g in range(len(gs)):
            out[g] = x[offs[g]:offs[g + 1]].T @ w[offs[g]:offs[g + 1]]
        return out
    n = w.shape[2] if dims == "forward" else w.shape[1]
    out = np.zeros((x.shape[0], n))
    for g in range(len(gs)):
        wg = w[g] if dims == "forward" else w[g].T
        out[offs[g]:offs[g + 1]] = x[offs[g]:offs[g + 1]] @ wg
    out = act_np(activation, out)
    out[offs[-1]:] = 0  # rows past sum(group_sizes) are zero, whatever the activation
    return out


# (M, K, N, group_sizes): edge sizes included.
RAGGED_SHAPES = [
    (0, 8, 5, [0, 0]),  # M = 0
    (1, 3, 5, [1]),  # M = 1, one group
    (9, 17, 19, [3, 0, 4]),  # odd K, N; an empty group; sum < M
    (33, 40, 31, [0, 13, 20]),  # leading empty group; sum == M
    (24, 1, 33, [24, 0]),  # K = 1
    (7, 20, 1, [2, 2, 2, 0]),  # N = 1, sum < M
]
RAGGED_DTYPES = {
    # name: (lhs dtype, rhs dtype, kwargs, expected out dtype, lhs rounded in the reference)
    "f32": (F32, F32, {}, F32, False),
    "bf16": (BF16, BF16, {}, BF16, False),
    "bf16_to_f32": (BF16, BF16, {"preferred_element_type": "float32"}, F32, False),
    "f32xbf16_default": (F32, BF16, {}, F32, True),
    "f32xbf16_highest": (F32, BF16, {"precision": "highest"}, F32, False),
}


def ragged_inputs(rng, M, K, N, gs, ldt=F32, rdt=F32, dims="forward"):
    lhs = randn(rng, (M, K), ldt)
    G = len(gs)
    shape = {"forward": (G, K, N), "transposed_rhs": (G, N, K), "ragged_contracting": (M, N)}
    return lhs, randn(rng, shape[dims], rdt)


# --- ragged_dot: numerics -------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS["ragged_dot"])
@pytest.mark.parametrize("dt", list(RAGGED_DTYPES))
@pytest.mark.parametrize("shape", RAGGED_SHAPES, ids=lambda s: "M{}K{}N{}G{}".format(
    s[0], s[1], s[2], len(s[3])))
def test_ragged_dot_matches_float64(rng, impl, dt, shape):
    M, K, N, gs = shape
    ldt, rdt, kw, odt, round_lhs = RAGGED_DTYPES[dt]
    lhs, rhs = ragged_inputs(rng, M, K, N, gs, ldt, rdt)
    out = tc.ragged_dot(lhs, rhs, np.array(gs, np.int32), implementation=impl, **kw)
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(odt)
    expected = ragged_ref(lhs, rhs, gs, round_lhs=round_lhs)
    assert_close(out, expected, tol_of(odt), f"{impl} {dt}")
    assert not f64(out)[sum(gs):].any(), "rows past sum(group_sizes) must be zero"


def test_ragged_dot_precision_default_rounds_f32_lhs(rng):
    # With a bf16 rhs, 'default' rounds the f32 lhs to bf16 and 'highest' keeps it: the two
    # differ, and each matches its own float64 reference tightly (the test tells them apart).
    lhs, rhs = ragged_inputs(rng, 16, 32, 8, [10, 6], F32, BF16)
    for impl in IMPLS["ragged_dot"]:
        d = tc.ragged_dot(lhs, rhs, [10, 6], implementation=impl, precision="default")
        h = tc.ragged_dot(lhs, rhs, [10, 6], implementation=impl, precision="highest")
        assert_close(d, ragged_ref(lhs, rhs, [10, 6], round_lhs=True), 1e-5, impl)
        assert_close(h, ragged_ref(lhs, rhs, [10, 6]), 1e-5, impl)
        assert np.abs(d - h).max() > 1e-4, "precision had no effect"


@pytest.mark.parametrize("impl", IMPLS["ragged_dot"])
@pytest.mark.parametrize("activation", ["relu", "silu", "gelu", "gelu_tanh", "sigmoid"])
def test_ragged_dot_activation(rng, impl, activation):
    gs = [4, 0, 5]  # sum 9 < M = 12: sigmoid(0) = 0.5 must not leak into the padding rows
    lhs, rhs = ragged_inputs(rng, 12, 9, 11, gs)
    out = tc.ragged_dot(lhs, rhs, gs, activation=activation, implementation=impl)
    assert_close(out, ragged_ref(lhs, rhs, gs, activation=activation), TOL_F32, activation)
    plain = tc.ragged_dot(lhs, rhs, gs, implementation=impl)
    assert np.abs(out - plain).max() > 1e-3, "the activation was not applied"


@pytest.mark.parametrize("impl", IMPLS["ragged_dot"])
@pytest.mark.parametrize("dims", ["transposed_rhs", "ragged_contracting"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_ragged_dot_general(rng, impl, dims, dt):
    gs = [3, 0, 6, 2]  # an empty group; sum 11 < M = 13
    ldt, rdt, _, odt, _ = RAGGED_DTYPES[dt]
    lhs, rhs = ragged_inputs(rng, 13, 7, 10, gs, ldt, rdt, dims=dims)
    out = tc.ragged_dot_general(lhs, rhs, gs, dims, implementation=impl)
    assert out.dtype == np.dtype(odt)
    assert_close(out, ragged_ref(lhs, rhs, gs, dims=dims), tol_of(odt), dims)
    if dims == "ragged_contracting":
        assert out.shape == (4, 7, 10)
        assert not f64(out)[1].any(), "an empty group's rhs gradient must be zero"


def test_ragged_dot_group_size_forms_agree(rng):
    import jax.numpy as jnp

    lhs, rhs = ragged_inputs(rng, 10, 6, 5, [3, 4, 2])
    expected = tc.ragged_dot(lhs, rhs, [3, 4, 2])
    for gs in ([3, 4, 2], (3, 4, 2), np.array([3, 4, 2], np.int32), np.array([3, 4, 2], np.int64),
               torch.tensor([3, 4, 2]), jnp.array([3, 4, 2], jnp.int32)):
        np.testing.assert_array_equal(tc.ragged_dot(lhs, rhs, gs), expected, err_msg=repr(gs))
    assert_close(expected, ragged_ref(lhs, rhs, [3, 4, 2]), TOL_F32)


@pytest.mark.parametrize("dt", ["f32", "bf16", "f32xbf16_default", "f32xbf16_highest"])
def test_pack_rhs_matches_unpacked(rng, dt):
    ldt, rdt, kw, odt, round_lhs = RAGGED_DTYPES[dt]
    gs = [5, 0, 9]
    lhs, rhs = ragged_inputs(rng, 17, 24, 40, gs, ldt, rdt)
    packed = tc.pack_rhs(rhs, precision=kw.get("precision"))
    assert packed.shape == (3, 24, 40)
    assert packed.dim_nums == "forward"
    assert packed.dtype == ("bf16" if rdt == BF16 else "f32")
    out = tc.ragged_dot(lhs, packed, gs, implementation="native", **kw)
    assert out.dtype == np.dtype(odt)
    assert_close(out, ragged_ref(lhs, rhs, gs, round_lhs=round_lhs), tol_of(odt), dt)
    # Packing copies the weights: changing rhs afterwards does not change the packed result.
    before = np.array(out)
    rhs[...] = 0
    np.testing.assert_array_equal(tc.ragged_dot(lhs, packed, gs, **kw), before)


def test_pack_rhs_transposed(rng):
    gs = [4, 3]
    lhs, rhs = ragged_inputs(rng, 7, 12, 9, gs, dims="transposed_rhs")
    packed = tc.pack_rhs(rhs, "transposed_rhs")
    assert packed.shape == (2, 9, 12) and packed.dim_nums == "transposed_rhs"
    out = tc.ragged_dot(lhs, packed, gs)
    assert_close(out, ragged_ref(lhs, rhs, gs, dims="transposed_rhs"), TOL_F32)


# --- ragged_dot: against jax and Google's tokamax --------------------------------------------


@pytest.mark.parametrize("dt", ["f32", "bf16", "bf16_to_f32"])
def test_ragged_dot_matches_jax_and_tokamax(rng, dt):
    import jax
    import jax.numpy as jnp
    import tokamax

    ldt, rdt, kw, odt, _ = RAGGED_DTYPES[dt]
    gs = np.array([5, 0, 11, 3], np.int32)  # sum 19 < M = 21
    lhs, rhs = ragged_inputs(rng, 21, 19, 13, gs, ldt, rdt)
    jl, jr, jg = jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(gs)
    pet = jnp.float32 if kw else None
    want_jax = jax.lax.ragged_dot(jl, jr, jg, precision=jax.lax.Precision.HIGHEST,
                                  preferred_element_type=pet)
    want_tokamax = tokamax.ragged_dot(jl, jr, jg, precision=jax.lax.Precision.HIGHEST,
                                      preferred_element_type=pet)
    assert want_jax.dtype == np.dtype(odt) and want_tokamax.dtype == np.dtype(odt)
    for impl in IMPLS["ragged_dot"]:
        # jax arrays in: read through DLPack, numpy out.
        out = tc.ragged_dot(jl, jr, jg, implementation=impl, **kw)
        assert isinstance(out, np.ndarray) and out.dtype == np.dtype(odt)
        # Against jax/tokamax: both round bf16 results, so allow two roundings.
        tol = 2 * tol_of(odt)
        assert_close(out, want_jax, tol, f"{impl} vs jax.lax.ragged_dot")
        assert_close(out, want_tokamax, tol, f"{impl} vs tokamax.ragged_dot")


def test_ragged_dot_general_matches_jax(rng):
    import jax
    import jax.numpy as jnp

    gs = np.array([2, 6, 0], np.int32)
    lhs, rhs = ragged_inputs(rng, 9, 5, 7, gs, dims="ragged_contracting")
    dn = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([0], [0]), ([], [])),
        lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
    want = jax.lax.ragged_dot_general(jnp.asarray(lhs), jnp.asarray(rhs), jnp.asarray(gs), dn,
                                      precision=jax.lax.Precision.HIGHEST)
    out = tc.ragged_dot_general(lhs, rhs, gs, "ragged_contracting")
    assert_close(out, want, TOL_F32)


# --- ragged_dot: VJP ------------------------------------------------------------------------


def ragged_torch(x, w, gs, activation=None):
    offs = np.concatenate([[0], np.cumsum(gs)])
    rows = [x[offs[g]:offs[g + 1]] @ w[g] for g in range(len(gs))]
    rows.append(torch.zeros(x.shape[0] - offs[-1], w.shape[2], dtype=x.dtype))
    out = act_torch(activation, torch.cat(rows))
    return torch.cat([out[:offs[-1]], torch.zeros_like(out[offs[-1]:])])


@pytest.mark.parametrize("impl", IMPLS["ragged_dot"])
@pytest.mark.parametrize("activation", [None, "silu", "gelu_tanh"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_ragged_dot_vjp(rng, impl, activation, dt):
    ldt, rdt, _, odt, _ = RAGGED_DTYPES[dt]
    gs = [4, 0, 7, 2]  # sum 13 < M = 15
    lhs, rhs = ragged_inputs(rng, 15, 11, 9, gs, ldt, rdt)
    dout = randn(rng, (15, 9), odt)
    dlhs, drhs = tc.ragged_dot_vjp(lhs, rhs, gs, dout, activation=activation, implementation=impl)
    assert dlhs.dtype == np.dtype(ldt) and drhs.dtype == np.dtype(rdt)
    x, w = t64(lhs, True), t64(rhs, True)
    ragged_torch(x, w, gs, activation).backward(t64(dout))
    assert_close(dlhs, x.grad, tol_of(ldt), "dlhs")
    assert_close(drhs, w.grad, tol_of(rdt), "drhs")
    assert not f64(dlhs)[13:].any(), "rows past sum(group_sizes) get no gradient"
    assert not f64(drhs)[1].any(), "an empty group gets a zero gradient"


def test_ragged_dot_vjp_matches_jax_vjp(rng):
    import jax
    import jax.numpy as jnp

    gs = np.array([3, 5, 0, 4], np.int32)
    lhs, rhs = ragged_inputs(rng, 14, 10, 6, gs)
    dout = randn(rng, (14, 6))
    _, pullback = jax.vjp(
        lambda a, b: jax.lax.ragged_dot(a, b, jnp.asarray(gs), precision="highest"),
        jnp.asarray(lhs), jnp.asarray(rhs))
    want_l, want_r = pullback(jnp.asarray(dout))
    dlhs, drhs = tc.ragged_dot_vjp(lhs, rhs, gs, dout)
    assert_close(dlhs, want_l, TOL_F32, "dlhs")
    assert_close(drhs, want_r, TOL_F32, "drhs")


# --- ragged_dot: the out-variant ------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS["ragged_dot"])
def test_ragged_dot_out_writes_into_buffer(rng, impl):
    gs = [3, 2]
    lhs, rhs = ragged_inputs(rng, 7, 5, 6, gs)
    out = np.full((7, 6), np.nan, F32)  # every element must be written, padding rows too
    ret = tc.ragged_dot(lhs, rhs, gs, out=out, implementation=impl)
    assert ret is out
    assert np.shares_memory(ret, out)
    assert_close(out, ragged_ref(lhs, rhs, gs), TOL_F32)
    # Packed rhs, bf16 result buffer, and a torch buffer (returned as the same object).
    packed = tc.pack_rhs(rhs)
    out2 = np.full((7, 6), np.nan, F32)
    assert tc.ragged_dot(lhs, packed, gs, out=out2) is out2
    assert_close(out2, ragged_ref(lhs, rhs, gs), TOL_F32)
    lb, rb = lhs.astype(BF16), rhs.astype(BF16)
    outb = np.full((7, 6), np.nan, BF16)
    assert tc.ragged_dot(lb, rb, gs, out=outb, implementation=impl) is outb
    assert_close(outb, ragged_ref(lb, rb, gs), TOL_BF16)
    tout = torch.full((7, 6), float("nan"))
    assert tc.ragged_dot(lhs, rhs, gs, out=tout, implementation=impl) is tout
    assert_close(tout, ragged_ref(lhs, rhs, gs), TOL_F32)


def test_ragged_dot_out_refuses_bad_buffers(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 7, [1, 2])
    with pytest.raises(ValueError, match=r"out.*f32\[6,8\].*expected a contiguous f32\[6,7\]"):
        tc.ragged_dot(lhs, rhs, [1, 2], out=np.empty((6, 8), F32))
    with pytest.raises(ValueError, match=r"bf16\[6,7\]"):
        tc.ragged_dot(lhs, rhs, [1, 2], out=np.empty((6, 7), BF16))
    with pytest.raises(ValueError, match="contiguous"):
        tc.ragged_dot(lhs, rhs, [1, 2], out=np.empty((6, 14), F32)[:, ::2])
    ro = np.empty((6, 7), F32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tc.ragged_dot(lhs, rhs, [1, 2], out=ro)
    buf = np.zeros(100, F32)  # out overlapping lhs: refused, so the library saw lhs in place
    lhs_in_buf = buf[:30].reshape(6, 5)
    lhs_in_buf[...] = lhs
    with pytest.raises(ValueError, match="overlaps input 'lhs'"):
        tc.ragged_dot(lhs_in_buf, rhs, [1, 2], out=buf[20:62].reshape(6, 7))
    # A jax array is immutable.
    import jax.numpy as jnp

    with pytest.raises(ValueError, match="read-only"):
        tc.ragged_dot(lhs, rhs, [1, 2], out=jnp.zeros((6, 7), jnp.float32))


# --- zero-copy in and out -------------------------------------------------------------------


def test_contiguous_view_of_larger_buffer_is_read_in_place(rng):
    big = randn(rng, (20, 6))
    view = big[4:12]  # contiguous rows of a larger buffer
    assert view.base is big and view.flags.c_contiguous
    w = randn(rng, (2, 6, 3))
    out = tc.ragged_dot(view, w, [5, 3])
    assert_close(out, ragged_ref(big[4:12].copy(), w, [5, 3]), TOL_F32)
    # In place: the op reads the view's memory (an out buffer that overlaps it is refused).
    with pytest.raises(ValueError, match="overlaps input 'lhs'"):
        tc.ragged_dot(view, w, [5, 3], out=big[8:12].reshape(8, 3))
    # The same through DLPack: a torch view of the buffer is read in place too.
    t_view = torch.from_numpy(big)[4:12]
    with pytest.raises(ValueError, match="overlaps input 'lhs'"):
        tc.ragged_dot(t_view, w, [5, 3], out=big[8:12].reshape(8, 3))
    np.testing.assert_array_equal(f64(tc.ragged_dot(t_view, w, [5, 3])), f64(out))
    # pack_rhs reads a contiguous sub-block of a larger weight buffer.
    wbig = randn(rng, (5, 6, 3))
    packed = tc.pack_rhs(wbig[1:3])
    assert_close(tc.ragged_dot(view, packed, [5, 3]), ragged_ref(view, wbig[1:3], [5, 3]),
                 TOL_F32)


@pytest.mark.parametrize("make", [
    lambda a: a[:, ::2],  # strided columns
    lambda a: a.T,  # transposed
    lambda a: np.asfortranarray(a),
    lambda a: torch.from_numpy(a).t(),
    lambda a: torch.from_numpy(a)[::2],  # every other row
], ids=["numpy_strided", "numpy_T", "fortran", "torch_t", "torch_rows"])
def test_non_contiguous_input_refused(rng, make):
    x = make(randn(rng, (8, 8)))
    w = randn(rng, (1, x.shape[1], 3))
    with pytest.raises(ValueError, match="contiguous") as e:
        tc.ragged_dot(x, w, [x.shape[0]])
    assert "lhs" in str(e.value) and "ascontiguousarray" in str(e.value)
    # The same for the weights pack_rhs reads.
    with pytest.raises(ValueError, match="rhs .* has element strides"):
        tc.pack_rhs(make(randn(rng, (8, 8)))[None])
    # The contiguous copy the message suggests works.
    fixed = x.contiguous() if isinstance(x, torch.Tensor) else np.ascontiguousarray(x)
    assert_close(tc.ragged_dot(fixed, w, [x.shape[0]]), ragged_ref(f64(x), w, [x.shape[0]]),
                 TOL_F32)


def test_read_only_inputs_are_accepted(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 4, [2, 4])
    lhs.flags.writeable = False
    rhs.flags.writeable = False
    assert_close(tc.ragged_dot(lhs, rhs, [2, 4]), ragged_ref(lhs, rhs, [2, 4]), TOL_F32)
    x = randn(rng, (3, 8))
    x.flags.writeable = False
    assert tc.layer_norm(x).shape == (3, 8)


def test_torch_in_torch_out(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 4, [2, 3])
    tl, tr = torch.from_numpy(lhs), torch.from_numpy(rhs)
    out = tc.ragged_dot(tl, tr, torch.tensor([2, 3]))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert_close(out, ragged_ref(lhs, rhs, [2, 3]), TOL_F32)
    outb = tc.ragged_dot(tl.bfloat16(), tr.bfloat16(), [2, 3])
    assert isinstance(outb, torch.Tensor) and outb.dtype == torch.bfloat16
    # The first array argument decides: numpy lhs with a torch rhs gives numpy.
    assert isinstance(tc.ragged_dot(lhs, tr, [2, 3]), np.ndarray)
    # requires_grad tensors are read as they are (no autograd: the VJPs are separate ops).
    assert isinstance(tc.ragged_dot(tl.clone().requires_grad_(), tr, [2, 3]), torch.Tensor)


def test_outputs_are_handed_over_without_copy(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 4, [2, 3])
    # A torch output seen through DLPack by numpy: the same memory, alive after the tensor goes.
    t_out = tc.ragged_dot(torch.from_numpy(lhs), rhs, [2, 3])
    n = np.from_dlpack(t_out)
    assert n.ctypes.data == t_out.data_ptr()
    t_out[0, 0] = 1234.0
    assert n[0, 0] == 1234.0
    expected = np.array(n)
    del t_out
    gc.collect()
    np.testing.assert_array_equal(n, expected)
    # A numpy output seen by torch: the same memory.
    n_out = tc.ragged_dot(lhs, rhs, [2, 3])
    assert n_out.flags.writeable and n_out.flags.c_contiguous
    t = torch.from_dlpack(n_out)
    assert t.data_ptr() == n_out.ctypes.data
    t[1, 1] = -77.0
    assert n_out[1, 1] == -77.0
    # bf16 numpy output (an ml_dtypes view) into torch too.
    nb = tc.ragged_dot(lhs.astype(BF16), rhs.astype(BF16), [2, 3])
    assert nb.dtype == np.dtype(BF16)
    tb = torch.from_dlpack(nb)
    assert tb.dtype == torch.bfloat16 and tb.data_ptr() == nb.ctypes.data


@pytest.mark.parametrize("family", ["ragged_dot", "attention", "layer_norm", "glu", "loss"])
def test_inputs_from_torch_and_jax(rng, family):
    """Each family gives the same numbers for numpy, torch and jax inputs (f32 and bf16), in the
    type of its first array argument."""
    import jax.numpy as jnp

    def call(conv, dt):
        if family == "ragged_dot":
            a = (randn(r, (9, 6), dt), randn(r, (2, 6, 5), dt))
            return tc.ragged_dot(conv(a[0]), conv(a[1]), [4, 3])
        if family == "attention":
            a = (randn(r, (1, 5, 4, 8), dt), randn(r, (1, 6, 2, 8), dt), randn(r, (1, 6, 2, 8), dt))
            return tc.dot_product_attention(*map(conv, a), is_causal=True)
        if family == "layer_norm":
            return tc.layer_norm(conv(randn(r, (3, 7), dt)), conv(randn(r, (7,), dt)))
        if family == "glu":
            return tc.gated_linear_unit(conv(randn(r, (4, 6), dt)), conv(randn(r, (6, 2, 5), dt)),
                                        activation="silu")
        x, w = randn(r, (5, 6), dt), randn(r, (6, 9), dt)
        labels = r.integers(0, 9, 5).astype(np.int32)
        return tc.linear_softmax_cross_entropy_loss(conv(x), conv(labels), conv(w),
                                                    reduction="none")

    def to_torch(a):
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) if a.dtype == BF16 \
            else torch.from_numpy(a)

    for dt in (F32, BF16):
        r = np.random.default_rng(int(rng.integers(1 << 31)))
        state = r.bit_generator.state
        want = call(lambda a: a, dt)
        assert isinstance(want, np.ndarray)
        r.bit_generator.state = state
        got_t = call(to_torch, dt)
        assert isinstance(got_t, torch.Tensor)
        np.testing.assert_array_equal(f64(got_t), f64(want))
        r.bit_generator.state = state
        got_j = call(jnp.asarray, dt)
        assert isinstance(got_j, np.ndarray) and got_j.dtype == want.dtype
        np.testing.assert_array_equal(f64(got_j), f64(want))


def test_concurrent_calls_from_threads(rng):
    """Kernels release the GIL; calls from several Python threads give each its own result."""
    from concurrent.futures import ThreadPoolExecutor

    cases = [ragged_inputs(rng, 20 + i, 16, 12, [10, 10 + i]) for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        outs = list(pool.map(lambda i: tc.ragged_dot(*cases[i], [10, 10 + i]), range(6)))
    for i, ((lhs, rhs), out) in enumerate(zip(cases, outs)):
        assert_close(out, ragged_ref(lhs, rhs, [10, 10 + i]), TOL_F32, f"thread case {i}")


def test_bf16_kernels_survive_another_librarys_amx_use():
    """torch's oneDNN releases the AMX tiles (TILERELEASE) after its bf16 matmuls; tokamax's
    bf16 kernels running on the same thread afterwards must load their tile configuration again
    instead of faulting (SIGILL kills the process, so this runs in a child)."""
    script = textwrap.dedent("""
        import ml_dtypes, numpy as np, torch, tokamax_cpp as tc
        rng = np.random.default_rng(0)
        x = rng.standard_normal((256, 256)).astype(ml_dtypes.bfloat16)
        w = rng.standard_normal((2, 256, 256)).astype(ml_dtypes.bfloat16)
        a = torch.randn(512, 512, dtype=torch.bfloat16)
        for _ in range(10):
            tc.ragged_dot(x, w, [128, 128], implementation="native")
            a @ a
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, (
        f"child exited with {r.returncode} (-4 is SIGILL): {r.stderr[-2000:]}")


# --- ragged_dot: errors ---------------------------------------------------------------------


def test_value_error_carries_the_library_message(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 7, [1, 2])
    with pytest.raises(ValueError) as e:
        tc.ragged_dot(lhs, rhs, [1, 2, 3])
    # Exactly the C++ InvalidArgument text (src/ops/ragged_dot/base.cc), nothing added.
    assert str(e.value) == ("ragged_dot: group_sizes has length 3 but rhs f32[2,5,7] has G=2 "
                            "groups; expected equal")
    with pytest.raises(ValueError) as e:
        tc.ragged_dot(lhs, rhs, [4, 3])
    assert str(e.value) == "ragged_dot: sum(group_sizes) = 7 exceeds the 6 rows of lhs f32[6,5]"


@pytest.mark.parametrize("case, pattern", [
    (lambda x, w: tc.ragged_dot(x, w, [1.0, 2.0]), r"group_sizes\[0\] is a float"),
    (lambda x, w: tc.ragged_dot(x, w, np.array([1.0, 2.0], F32)),
     r"group_sizes has spec f32\[2\]; expected an integer array"),
    (lambda x, w: tc.ragged_dot(x, w, np.array([[1, 2]], np.int32)), r"group_sizes has spec"),
    (lambda x, w: tc.ragged_dot(x, w, [True, 2]), r"group_sizes\[0\] is a bool"),
    (lambda x, w: tc.ragged_dot(x, w, [-1, 2]), r"group_sizes\[0\] = -1"),
    (lambda x, w: tc.ragged_dot(x, w, np.array([-1, 2], np.int32)), r"group_sizes\[0\] = -1"),
    (lambda x, w: tc.ragged_dot(x, w, np.array([2**33, 0], np.int64)), "does not fit in int32"),
    (lambda x, w: tc.ragged_dot(x[None], w, [1, 2]),
     r"lhs has shape f32\[1,6,5\]; expected rank 2"),
    (lambda x, w: tc.ragged_dot(x, w[0], [1, 2]), r"rhs has shape f32\[5,7\]; expected rank 3"),
    (lambda x, w: tc.ragged_dot(np.ascontiguousarray(x[:, :4]), w, [1, 2]), "K=4"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], activation="tanh"), "activation 'tanh'"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], implementation="pallas"),
     "unknown implementation 'pallas'"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], precision="high"), "precision is 'high'"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], preferred_element_type="bfloat16"),
     "preferred_element_type bf16 is not available"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], preferred_element_type=np.float16),
     "preferred_element_type is 'float16'"),
    (lambda x, w: tc.ragged_dot(x.astype(np.float64), w, [1, 2]), "unsupported dtype combination"),
    (lambda x, w: tc.ragged_dot(x.astype(np.int16), w, [1, 2]), "has a dtype tokamax does not read"),
    (lambda x, w: tc.ragged_dot(x.tolist(), w, [1, 2]), "lhs is a list; expected an array"),
    (lambda x, w: tc.ragged_dot(None, w, [1, 2]), "lhs is a NoneType; expected an array"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], config={"mr": 8, "mc": 64, "kc": 256, "nc": 256}),
     "a config needs the implementation"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], implementation="native",
                                config={"mr": 8, "mc": 63, "kc": 256, "nc": 256}), "mc"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], implementation="native", config='{"mr": 8'),
     "malformed JSON"),
    (lambda x, w: tc.ragged_dot_general(x, w, [1, 2], "backward"), "dimension_numbers 'backward'"),
    (lambda x, w: tc.ragged_dot(x, w, [1, 2], representative_group_sizes=[1, 2, 3]),
     "representative_group_sizes has length 3"),
    (lambda x, w: tc.ragged_dot_vjp(x, w, [1, 2], np.ones((6, 8), F32)), "dout has spec"),
])
def test_ragged_dot_value_errors(rng, case, pattern):
    x, w = ragged_inputs(rng, 6, 5, 7, [1, 2])
    with pytest.raises(ValueError, match=pattern):
        case(x, w)


def test_meta_and_cuda_tensors_refused(rng):
    w = randn(rng, (2, 5, 7))
    with pytest.raises(ValueError, match="lhs"):
        tc.ragged_dot(torch.empty(6, 5, device="meta"), w, [1, 2])
    with pytest.raises(ValueError, match="out"):
        tc.ragged_dot(randn(rng, (6, 5)), w, [1, 2], out=torch.empty(6, 7, device="meta"))
    with pytest.raises(ValueError, match="query"):
        q = torch.empty(1, 2, 1, 4, device="meta")
        tc.dot_product_attention(q, q, q)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU"):
            tc.ragged_dot(torch.ones(6, 5, device="cuda"), w, [1, 2])


def has_bf16_dot() -> bool:
    """Whether the kernels the library picks here have a bf16 dot (AVX-512 BF16; TOKAMAX_ISA may
    cap them below it): only then does pack_rhs keep bf16 weights as pairs for 'default'."""
    if os.environ.get("TOKAMAX_ISA") in ("avx2", "portable"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any("avx512_bf16" in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


def test_not_implemented_for_unsupported_forced_implementation(rng):
    lhs, rhs = ragged_inputs(rng, 6, 5, 7, [1, 2])
    packed = tc.pack_rhs(rhs)
    with pytest.raises(NotImplementedError, match="blas cannot use native pre-packed weights"):
        tc.ragged_dot(lhs, packed, [1, 2], implementation="blas")
    with pytest.raises(NotImplementedError, match="the reference needs the unpacked rhs"):
        tc.ragged_dot(lhs, packed, [1, 2], implementation="reference")
    rhs_bf16 = rhs.astype(BF16)
    packed_bf16 = tc.pack_rhs(rhs_bf16)  # packed for precision 'default'
    if has_bf16_dot():  # bf16 pairs for the dot, which 'highest' may not use
        with pytest.raises(NotImplementedError, match="precision differs"):
            tc.ragged_dot(lhs, packed_bf16, [1, 2], implementation="native", precision="highest")
    else:  # both precisions widen bf16 weights to f32 panels: the same packing serves both
        out = tc.ragged_dot(lhs, packed_bf16, [1, 2], implementation="native", precision="highest")
        assert_close(out, ragged_ref(lhs, rhs_bf16, [1, 2]), 1e-5, "packed bf16, 'highest'")
    x = randn(rng, (3, 5, 4))
    with pytest.raises(NotImplementedError, match="native layer_norm normalizes a contiguous axis"):
        tc.layer_norm(x, axis=1, implementation="native")
    pw = tc.pack_glu_weights(randn(rng, (4, 2, 3)))
    with pytest.raises(NotImplementedError, match="unpacked weights"):
        tc.gated_linear_unit(randn(rng, (2, 4)), pw, implementation="reference")


# --- dot_product_attention -------------------------------------------------------------------


def attention_valid(B, N, T, S, *, mask=None, is_causal=False, q_lens=None, kv_lens=None,
                    window=None):
    t = np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    valid = np.ones((B, N, T, S), bool)
    if is_causal:
        valid &= s <= t
    if mask is not None:
        valid &= np.broadcast_to(mask, valid.shape)
    if q_lens is not None:
        valid &= np.arange(T)[None, None, :, None] < np.asarray(q_lens)[:, None, None, None]
    if kv_lens is not None:
        valid &= np.arange(S)[None, None, None, :] < np.asarray(kv_lens)[:, None, None, None]
    if window is not None:
        left, right = window
        valid &= (s >= t - left) & (s <= t + right)
    return valid


def rows_with_keys(q, k, opts):
    """[B,T,N,1]: whether a query row has any logit left under the options' masks."""
    masks = {n: opts[n] for n in ("mask", "is_causal", "q_lens", "kv_lens", "window") if n in opts}
    rows = attention_valid(q.shape[0], q.shape[2], q.shape[1], k.shape[1], **masks).any(-1)
    return np.transpose(rows, (0, 2, 1))[..., None]


def attention_ref(q, k, v, *, bias=None, scale=None, soft_cap=None, **masks):
    """float64 attention: (out [B,T,N,Hv], lse [B,N,T]); a fully masked row gives 0, -inf."""
    q, k, v = f64(q), f64(k), f64(v)
    B, T, N, H = q.shape
    S, Nk = k.shape[1], k.shape[2]
    k = np.repeat(k, N // Nk, axis=2)
    v = np.repeat(v, N // Nk, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) * (1 / math.sqrt(H) if scale is None else scale)
    if bias is not None:
        s = s + f64(bias)
    if soft_cap is not None:
        s = soft_cap * np.tanh(s / soft_cap)
    valid = attention_valid(B, N, T, S, **masks)
    s = np.where(valid, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    out = np.einsum("bnts,bsnh->btnh", p / np.where(l > 0, l, 1), v)
    lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1)) + m[..., 0],
                   -np.inf)
    return out, lse


def attention_torch(q, k, v, bias, valid, scale, soft_cap):
    """The same in torch (float64, differentiable)."""
    N, Nk = q.shape[2], k.shape[2]
    k = k.repeat_interleave(N // Nk, dim=2)
    v = v.repeat_interleave(N // Nk, dim=2)
    s = torch.einsum("btnh,bsnh->bnts", q, k) * scale
    if bias is not None:
        s = s + bias
    if soft_cap is not None:
        s = soft_cap * torch.tanh(s / soft_cap)
    valid = torch.from_numpy(valid)
    s = s.masked_fill(~valid, -math.inf)
    m = s.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m) * valid
    l = p.sum(-1, keepdim=True)
    return torch.einsum("bnts,bsnh->btnh", p / torch.where(l > 0, l, torch.ones_like(l)), v)


# name: (B, T, S, N, Nk, H, Hv, options). Options with array values are built per test.
ATTENTION_CASES = {
    "plain": (2, 5, 7, 2, 2, 8, 8, {}),
    "gqa_causal": (1, 9, 9, 6, 2, 16, 16, {"is_causal": True}),
    "mqa_hv": (2, 4, 6, 4, 1, 8, 5, {}),  # Nk = 1, Hv != H
    "t1": (1, 1, 13, 2, 1, 7, 7, {}),  # decode: one query row, odd H
    "causal_t_gt_s": (1, 8, 5, 2, 2, 8, 8, {"is_causal": True}),  # rows past S see all keys
    "seq_lengths": (3, 6, 7, 2, 1, 8, 8, {"q_lens": [6, 2, 0], "kv_lens": [7, 3, 5]}),
    "window": (1, 11, 11, 2, 2, 8, 8, {"window": (2, 1)}),
    "window_causal": (1, 10, 12, 2, 1, 8, 8, {"window": (3, 0), "is_causal": True}),
    "soft_cap": (1, 6, 9, 4, 2, 8, 8, {"soft_cap": 1.5, "scale": 0.9}),
    "bias_full": (2, 5, 6, 2, 2, 8, 8, {"bias": (2, 2, 5, 6)}),
    "bias_bcast": (2, 5, 6, 4, 2, 8, 8, {"bias": (1, 4, 5, 6)}),
    "bias_2d_mask": (2, 4, 6, 2, 2, 8, 8, {"bias": (4, 6), "mask": (2, 1, 4, 6)}),
    "everything": (2, 7, 8, 4, 2, 8, 6, {"bias": (1, 1, 7, 8), "mask": (1, 4, 7, 8),
                                        "is_causal": True, "kv_lens": [8, 5],
                                        "soft_cap": 2.0, "window": (4, 2)}),
}


def attention_case(rng, name, dtype):
    B, T, S, N, Nk, H, Hv, opts = ATTENTION_CASES[name]
    q, k, v = randn(rng, (B, T, N, H), dtype), randn(rng, (B, S, Nk, H), dtype), \
        randn(rng, (B, S, Nk, Hv), dtype)
    opts = dict(opts)
    if "bias" in opts:
        opts["bias"] = randn(rng, opts["bias"])
    if "mask" in opts:
        opts["mask"] = rng.random(opts["mask"]) > 0.25
    return q, k, v, opts


def attention_call_kwargs(opts):
    """The ref's options as tokamax_cpp.dot_product_attention keywords."""
    kw = {}
    for a, b in [("bias", "bias"), ("mask", "mask"), ("is_causal", "is_causal"),
                 ("scale", "scale"), ("soft_cap", "logits_soft_cap"),
                 ("window", "local_window_size")]:
        if a in opts:
            kw[b] = opts[a]
    if "q_lens" in opts:
        kw["query_seq_lengths"] = np.array(opts["q_lens"], np.int32)
    if "kv_lens" in opts:
        kw["key_value_seq_lengths"] = np.array(opts["kv_lens"], np.int32)
    return kw


@pytest.mark.parametrize("impl", IMPLS["attention"])
@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_matches_float64(rng, impl, dt, case):
    q, k, v, opts = attention_case(rng, case, dt)
    out, lse = tc.dot_product_attention(q, k, v, implementation=impl, return_residuals=True,
                                        **attention_call_kwargs(opts))
    want, want_lse = attention_ref(q, k, v, **opts)
    assert out.dtype == np.dtype(dt) and lse.dtype == np.float32
    assert_close(out, want, tol_of(dt), "out")
    assert_close(lse, want_lse, 1e-4 if dt == F32 else 1e-3, "lse")
    # The plain call gives the same output as the one with residuals.
    plain = tc.dot_product_attention(q, k, v, implementation=impl, **attention_call_kwargs(opts))
    np.testing.assert_array_equal(f64(plain), f64(out))
    if "q_lens" in opts:  # batch 2 has no query rows: 0 out, -inf lse
        assert not f64(out)[2].any() and np.isneginf(lse[2]).all()


@pytest.mark.parametrize("case", ["plain", "gqa_causal", "mqa_hv", "seq_lengths", "window",
                                  "bias_bcast", "bias_2d_mask"])
def test_attention_matches_jax(rng, case):
    import jax
    import jax.numpy as jnp

    q, k, v, opts = attention_case(rng, case, F32)
    if case == "mqa_hv":  # jax.nn needs Hv == H
        v = randn(rng, k.shape)
    kw = attention_call_kwargs(opts)
    jkw = {name: (jnp.asarray(val) if isinstance(val, np.ndarray) else val)
           for name, val in kw.items()}
    if "query_seq_lengths" in kw:
        jkw["query_seq_lengths"] = jnp.asarray(kw["query_seq_lengths"])
    with jax.default_matmul_precision("highest"):
        want = np.asarray(jax.nn.dot_product_attention(
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), implementation="xla", **jkw))
    for impl in IMPLS["attention"]:
        out = tc.dot_product_attention(q, k, v, implementation=impl, **kw)
        # jax gives a row with no logit left (padding) its own value; compare the others.
        rows = rows_with_keys(q, k, opts)
        assert_close(np.where(rows, out, 0), np.where(rows, want, 0), TOL_F32,
                     f"{impl} vs jax.nn.dot_product_attention")


@pytest.mark.parametrize("case", ["gqa_causal", "soft_cap", "bias_bcast", "window", "everything"])
def test_attention_matches_tokamax(rng, case):
    import jax
    import jax.numpy as jnp
    import tokamax

    q, k, v, opts = attention_case(rng, case, F32)
    kw = attention_call_kwargs(opts)
    jkw = {n: (jnp.asarray(val) if isinstance(val, np.ndarray) else val) for n, val in kw.items()}
    want = np.asarray(tokamax.dot_product_attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), implementation="xla",
        precision=jax.lax.Precision.HIGHEST, **jkw))
    for impl in IMPLS["attention"]:
        out = tc.dot_product_attention(q, k, v, implementation=impl, **kw)
        rows = rows_with_keys(q, k, opts)  # tokamax gives fully masked rows its own value
        assert_close(np.where(rows, out, 0), np.where(rows, want, 0), TOL_F32,
                     f"{impl} vs tokamax.dot_product_attention")


@pytest.mark.parametrize("impl", IMPLS["attention"])
@pytest.mark.parametrize("case", ["plain", "gqa_causal", "mqa_hv", "seq_lengths", "window",
                                  "soft_cap", "bias_full", "bias_bcast", "bias_2d_mask",
                                  "everything"])
def test_attention_vjp_matches_float64(rng, impl, case):
    q, k, v, opts = attention_case(rng, case, F32)
    kw = attention_call_kwargs(opts)
    out, lse = tc.dot_product_attention(q, k, v, return_residuals=True, **kw)
    dout = randn(rng, out.shape)
    dq, dk, dv, dbias = tc.dot_product_attention_vjp(q, k, v, out, lse, dout, implementation=impl,
                                                     **kw)
    B, T, N, H = q.shape
    valid = attention_valid(B, N, T, k.shape[1], **{n: opts[n] for n in (
        "mask", "is_causal", "q_lens", "kv_lens", "window") if n in opts})
    tq, tk, tv = t64(q, True), t64(k, True), t64(v, True)
    tb = t64(opts["bias"], True) if "bias" in opts else None
    scale = opts.get("scale", 1 / math.sqrt(H))
    attention_torch(tq, tk, tv, tb, valid, scale, opts.get("soft_cap")).backward(t64(dout))
    assert_close(dq, tq.grad, TOL_F32, "dq")
    assert_close(dk, tk.grad, TOL_F32, "dk")
    assert_close(dv, tv.grad, TOL_F32, "dv")
    if tb is None:
        assert dbias is None
    else:
        assert dbias.shape == opts["bias"].shape and dbias.dtype == np.float32
        assert_close(dbias, tb.grad, TOL_F32, "dbias")


@pytest.mark.parametrize("impl", IMPLS["attention"])
def test_attention_vjp_bf16(rng, impl):
    q, k, v, opts = attention_case(rng, "everything", BF16)
    kw = attention_call_kwargs(opts)
    out, lse = tc.dot_product_attention(q, k, v, return_residuals=True, **kw)
    dout = randn(rng, out.shape, BF16)
    dq, dk, dv, dbias = tc.dot_product_attention_vjp(q, k, v, out, lse, dout, implementation=impl,
                                                     **kw)
    assert dq.dtype == dk.dtype == dv.dtype == np.dtype(BF16) and dbias.dtype == np.float32
    B, T, N, H = q.shape
    valid = attention_valid(B, N, T, k.shape[1], **{n: opts[n] for n in (
        "mask", "is_causal", "kv_lens", "window") if n in opts})
    tq, tk, tv, tb = t64(q, True), t64(k, True), t64(v, True), t64(opts["bias"], True)
    attention_torch(tq, tk, tv, tb, valid, 1 / math.sqrt(H), opts["soft_cap"]).backward(t64(dout))
    for name, got, want in [("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad),
                            ("dbias", dbias, tb.grad)]:
        assert_close(got, want, 2 * TOL_BF16, name)


def test_attention_vjp_matches_jax_vjp(rng):
    import jax
    import jax.numpy as jnp

    q, k, v, opts = attention_case(rng, "bias_bcast", F32)
    kw = attention_call_kwargs(opts)
    jb = jnp.asarray(opts["bias"])
    with jax.default_matmul_precision("highest"):
        _, pullback = jax.vjp(
            lambda a, b, c, d: jax.nn.dot_product_attention(a, b, c, d, implementation="xla"),
            jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jb)
        dout = randn(rng, q.shape[:3] + (v.shape[3],))
        want = pullback(jnp.asarray(dout))
    out, lse = tc.dot_product_attention(q, k, v, return_residuals=True, **kw)
    got = tc.dot_product_attention_vjp(q, k, v, out, lse, dout, **kw)
    for name, g, w in zip(["dq", "dk", "dv", "dbias"], got, want):
        assert_close(g, w, TOL_F32, name)


@pytest.mark.parametrize("case, pattern", [
    (lambda q, k, v: tc.dot_product_attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(
        3, 2)), "expected N a multiple of Nk"),
    (lambda q, k, v: tc.dot_product_attention(q, k.astype(BF16), v), "expected one dtype"),
    (lambda q, k, v: tc.dot_product_attention(q[0], k, v), "expected rank 4"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v[:, :4].copy()), "the same S"),
    (lambda q, k, v: tc.dot_product_attention(
        q, k, v, query_seq_lengths=np.array([1, 2], np.int64)), "query_seq_lengths|q_seq_lengths"),
    (lambda q, k, v: tc.dot_product_attention(
        q, k, v, key_value_seq_lengths=np.array([9, 2], np.int32)), r"expected in \[0, 6\]"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v, mask=np.ones((2, 1, 5, 6), F32)),
     "expected bool"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v, bias=np.ones((3, 1, 5, 6), F32)),
     "not broadcastable"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v, local_window_size=(-1, 2)),
     "expected both >= 0"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v, logits_soft_cap=0.0), "soft_cap"),
    (lambda q, k, v: tc.dot_product_attention(q, k, v, scale=float("nan")),
     "scale = nan; expected 0 or a number"),
])
def test_attention_value_errors(rng, case, pattern):
    q, k, v = randn(rng, (2, 5, 4, 8)), randn(rng, (2, 6, 2, 8)), randn(rng, (2, 6, 2, 8))
    with pytest.raises(ValueError, match=pattern):
        case(q, k, v)


# --- layer_norm / rms_norm ------------------------------------------------------------------


def norm_ref(x, scale, offset, axis=-1, eps=1e-6, subtract_mean=True):
    x = f64(x)
    mean = x.mean(axis, keepdims=True) if subtract_mean else 0 * x.sum(axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis, keepdims=True)
    rstd = 1 / np.sqrt(var + eps)
    y = (x - mean) * rstd
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if scale is not None:
        y = y * f64(scale).reshape(shape)
    if offset is not None:
        y = y + f64(offset).reshape(shape)
    return y, np.squeeze(mean, axis), np.squeeze(rstd, axis)


NORM_CASES = [  # (shape, axis, with scale, with offset)
    ((6, 17), -1, True, True),
    ((2, 3, 8), -1, True, False),
    ((1, 33), -1, False, True),
    ((0, 5), -1, True, True),  # no rows
    ((4, 7, 1), 1, True, True),  # a contiguous axis followed by a size-1 dim (native serves it)
    ((5, 3, 4), 0, True, True),  # a strided axis (composed and reference only)
]


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("subtract_mean", [True, False], ids=["layer_norm", "rms_norm"])
@pytest.mark.parametrize("case", NORM_CASES, ids=lambda c: f"{c[0]}ax{c[1]}")
def test_layer_norm_matches_float64(rng, impl, dt, subtract_mean, case):
    shape, axis, with_scale, with_offset = case
    x = randn(rng, shape, dt, scale=3.0) + dt(1.5)
    d = shape[axis]
    scale = randn(rng, (d,), dt) if with_scale else None
    offset = randn(rng, (d,), dt) if with_offset else None
    eps = 1e-5
    if impl == "native" and axis == 0:  # a strided axis: native cannot serve it
        with pytest.raises(NotImplementedError, match="contiguous axis"):
            tc.layer_norm(x, scale, offset, axis=axis, subtract_mean=subtract_mean,
                          implementation=impl)
        return
    if subtract_mean or offset is not None:
        y, (mean, rstd) = tc.layer_norm(x, scale, offset, axis=axis, epsilon=eps,
                                        subtract_mean=subtract_mean, implementation=impl,
                                        return_residuals=True)
    else:
        y, (mean, rstd) = tc.rms_norm(x, scale, axis=axis, epsilon=eps, implementation=impl,
                                      return_residuals=True)
    want, want_mean, want_rstd = norm_ref(x, scale, offset, axis, eps, subtract_mean)
    assert y.dtype == np.dtype(dt) and mean.dtype == rstd.dtype == np.float32
    assert_close(y, want, tol_of(dt), "y")
    assert_close(mean, want_mean, 1e-5, "mean")
    assert_close(rstd, want_rstd, 1e-5, "rstd")


def test_layer_norm_matches_tokamax(rng):
    import jax.numpy as jnp
    import tokamax

    x, s, o = randn(rng, (8, 24)), randn(rng, (24,)), randn(rng, (24,))
    want = tokamax.layer_norm(jnp.asarray(x), jnp.asarray(s), jnp.asarray(o), epsilon=1e-5)
    want_rms = tokamax.layer_norm(jnp.asarray(x), jnp.asarray(s), None, epsilon=1e-5,
                                  subtract_mean=False)
    for impl in IMPLS["other"]:
        assert_close(tc.layer_norm(x, s, o, epsilon=1e-5, implementation=impl), want, TOL_F32)
        assert_close(tc.rms_norm(x, s, epsilon=1e-5, implementation=impl), want_rms, TOL_F32)


def norm_torch(x, scale, offset, axis, eps, subtract_mean):
    mean = x.mean(axis, keepdim=True) if subtract_mean else 0
    var = ((x - mean) ** 2).mean(axis, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    if scale is not None:
        y = y * scale.reshape(shape)
    if offset is not None:
        y = y + offset.reshape(shape)
    return y


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", [((5, 12), -1, True, True, True), ((2, 3, 9), -1, True, False,
                                                                    False),
                                  ((4, 6), -1, False, False, True), ((6, 5, 3), 1, True, True,
                                                                     True)],
                         ids=["ln", "rms", "bare", "axis1"])
def test_layer_norm_vjp_matches_float64(rng, impl, dt, case):
    shape, axis, with_scale, with_offset, subtract_mean = case
    x = randn(rng, shape, dt) + dt(0.5)
    d = shape[axis]
    scale = randn(rng, (d,), dt) if with_scale else None
    offset = randn(rng, (d,), dt) if with_offset else None
    eps = 1e-6
    y, (mean, rstd) = tc.layer_norm(x, scale, offset, axis=axis, epsilon=eps,
                                    subtract_mean=subtract_mean, return_residuals=True)
    dy = randn(rng, shape, dt)
    if impl == "native" and axis == 1:  # a strided axis: native cannot serve it
        with pytest.raises(NotImplementedError, match="contiguous axis"):
            tc.layer_norm_vjp(x, mean, rstd, dy, scale, offset, axis=axis, implementation=impl)
        return
    dx, dscale, doffset = tc.layer_norm_vjp(x, mean, rstd, dy, scale, offset, axis=axis,
                                            epsilon=eps, subtract_mean=subtract_mean,
                                            implementation=impl)
    tx = t64(x, True)
    ts = t64(scale, True) if with_scale else None
    to = t64(offset, True) if with_offset else None
    norm_torch(tx, ts, to, axis, eps, subtract_mean).backward(t64(dy))
    assert dx.dtype == np.dtype(dt) and dx.shape == shape
    assert_close(dx, tx.grad, tol_of(dt), "dx")
    if with_scale:
        assert dscale.dtype == np.float32
        assert_close(dscale, ts.grad, 1e-4, "dscale")
    else:
        assert dscale is None
    if with_offset:
        assert_close(doffset, to.grad, 1e-4, "doffset")
    else:
        assert doffset is None


def test_layer_norm_value_errors(rng):
    x = randn(rng, (4, 6))
    with pytest.raises(ValueError, match="axis"):
        tc.layer_norm(x, axis=2)
    with pytest.raises(ValueError, match="scale"):
        tc.layer_norm(x, randn(rng, (5,)))
    with pytest.raises(ValueError):
        tc.layer_norm(x, epsilon=-1.0)


# --- gated_linear_unit ----------------------------------------------------------------------


def glu_ref(x, w, activation):
    x, w = f64(x), f64(w)
    return act_np(activation, x @ w[:, 0]) * (x @ w[:, 1])


GLU_DTYPES = {"f32": (F32, F32, TOL_F32), "bf16": (BF16, BF16, TOL_BF16),
              "f32_x_bf16_w": (F32, BF16, TOL_BF16)}  # x may be rounded to bf16 for the bf16 dot


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("dt", list(GLU_DTYPES))
@pytest.mark.parametrize("activation", [None, "silu", "gelu", "relu", "sigmoid"])
@pytest.mark.parametrize("xshape, K, N", [((7,), 9, 5), ((2, 3), 16, 33), ((0,), 8, 4),
                                          ((1,), 1, 1)], ids=["M7", "batch", "M0", "tiny"])
def test_glu_matches_float64(rng, impl, dt, activation, xshape, K, N):
    xdt, wdt, tol = GLU_DTYPES[dt]
    x = randn(rng, xshape + (K,), xdt)
    w = randn(rng, (K, 2, N), wdt)
    out = tc.gated_linear_unit(x, w, activation=activation, implementation=impl)
    assert out.dtype == np.dtype(xdt) and out.shape == xshape + (N,)
    assert_close(out, glu_ref(x, w, activation), tol)
    # Separate weights give the same, and so do packed ones (native).
    pair = (np.ascontiguousarray(w[:, 0]), np.ascontiguousarray(w[:, 1]))
    out2 = tc.gated_linear_unit(x, pair, activation=activation, implementation=impl)
    assert_close(out2, glu_ref(x, w, activation), tol)
    if impl == "native":
        out3 = tc.gated_linear_unit(x, tc.pack_glu_weights(w), activation=activation)
        assert_close(out3, glu_ref(x, w, activation), tol)
        out4 = tc.gated_linear_unit(x, tc.pack_glu_weights(pair), activation=activation)
        assert_close(out4, glu_ref(x, w, activation), tol)


def test_glu_default_activation_is_none(rng):
    x, w = randn(rng, (6, 8)), randn(rng, (8, 2, 5))
    out = tc.gated_linear_unit(x, w)
    assert_close(out, glu_ref(x, w, None), TOL_F32)
    assert np.abs(out - tc.gated_linear_unit(x, w, activation="silu")).max() > 1e-2


@pytest.mark.parametrize("activation", [None, "silu"])
def test_glu_matches_tokamax(rng, activation):
    import jax
    import jax.numpy as jnp
    import tokamax

    x, w = randn(rng, (2, 5, 12)), randn(rng, (12, 2, 7))
    want = tokamax.gated_linear_unit(jnp.asarray(x), jnp.asarray(w),
                                     activation=jax.nn.silu if activation else None,
                                     precision=jax.lax.Precision.HIGHEST)
    for impl in IMPLS["other"]:
        assert_close(tc.gated_linear_unit(x, w, activation=activation, implementation=impl), want,
                     TOL_F32, impl)


def glu_torch(x, w, activation):
    return act_torch(activation, x @ w[:, 0]) * (x @ w[:, 1])


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("activation", [None, "silu", "gelu_tanh"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_glu_vjp_matches_float64(rng, impl, activation, dt):
    xdt, wdt, tol = GLU_DTYPES[dt]
    x, w = randn(rng, (2, 5, 11), xdt), randn(rng, (11, 2, 6), wdt)
    out, h = tc.gated_linear_unit(x, w, activation=activation, return_residuals=True)
    assert h.shape == (2, 5, 2, 6) and h.dtype == np.float32
    assert_close(h, np.einsum("bmk,kjn->bmjn", f64(x), f64(w)), tol, "h = x w")
    dout = randn(rng, out.shape, xdt)
    dx, dw = tc.gated_linear_unit_vjp(x, w, h, dout, activation=activation, implementation=impl)
    assert dx.dtype == np.dtype(xdt) and dw.dtype == np.float32 and dw.shape == w.shape
    tx, tw = t64(x, True), t64(w, True)
    glu_torch(tx, tw, activation).backward(t64(dout))
    assert_close(dx, tx.grad, tol, "dx")
    assert_close(dw, tw.grad, tol, "dw")


def test_glu_value_errors(rng):
    x, w = randn(rng, (4, 6)), randn(rng, (6, 2, 5))
    with pytest.raises(ValueError):
        tc.gated_linear_unit(x, randn(rng, (5, 2, 5)))  # K mismatch
    with pytest.raises(ValueError):
        tc.gated_linear_unit(x, randn(rng, (6, 3, 5)))  # not [K, 2, N]
    with pytest.raises(ValueError, match="return_residuals needs fused"):
        tc.gated_linear_unit(x, (w[:, 0].copy(), w[:, 1].copy()), return_residuals=True)
    with pytest.raises(ValueError, match="activation 'swiglu'"):
        tc.gated_linear_unit(x, w, activation="swiglu")


# --- linear_softmax_cross_entropy_loss ------------------------------------------------------


def loss_ref(x, labels, w, reduction):
    logits = f64(x) @ f64(w)
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[:, 0]
    loss = lse - logits[np.arange(len(labels)), labels]
    red = {"sum": loss.sum(), "mean": loss.mean() if len(labels) else np.nan, "none": loss}
    return np.asarray(red[reduction]), lse


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("B, H, V", [(6, 8, 11), (1, 3, 1), (9, 17, 130)])
def test_loss_matches_float64(rng, impl, dt, reduction, B, H, V):
    x, w = randn(rng, (B, H), dt), randn(rng, (H, V), dt)
    labels = rng.integers(0, V, B).astype(np.int32)
    loss, lse = tc.linear_softmax_cross_entropy_loss(x, labels, w, reduction=reduction,
                                                     implementation=impl, return_residuals=True)
    want, want_lse = loss_ref(x, labels, w, reduction)
    assert loss.dtype == np.float32 and loss.shape == want.shape
    assert_close(loss, want, 1e-4, "loss")  # f32 from exact (bf16) products: tight either way
    assert_close(lse, want_lse, 1e-4, "lse")


def test_loss_default_reduction_is_sum(rng):
    x, w = randn(rng, (5, 4)), randn(rng, (4, 7))
    labels = rng.integers(0, 7, 5).astype(np.int32)
    default = tc.linear_softmax_cross_entropy_loss(x, labels, w)
    assert_close(default, loss_ref(x, labels, w, "sum")[0], 1e-5)
    assert abs(float(default) - float(loss_ref(x, labels, w, "mean")[0])) > 1e-3


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_loss_matches_tokamax(rng, reduction):
    import jax
    import jax.numpy as jnp
    import tokamax

    x, w = randn(rng, (8, 16)), randn(rng, (16, 40))
    labels = rng.integers(0, 40, 8).astype(np.int32)
    with jax.default_matmul_precision("highest"):  # its precision argument is not supported
        want = tokamax.linear_softmax_cross_entropy_loss(
            jnp.asarray(x), jnp.asarray(labels), jnp.asarray(w), reduction=reduction)
    for impl in IMPLS["other"]:
        got = tc.linear_softmax_cross_entropy_loss(x, labels, w, reduction=reduction,
                                                   implementation=impl)
        assert_close(got, want, TOL_F32, impl)


@pytest.mark.parametrize("impl", IMPLS["other"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
@pytest.mark.parametrize("dt", [F32, BF16], ids=["f32", "bf16"])
def test_loss_vjp_matches_float64(rng, impl, reduction, dt):
    B, H, V = 7, 10, 23
    x, w = randn(rng, (B, H), dt), randn(rng, (H, V), dt)
    labels = rng.integers(0, V, B).astype(np.int32)
    loss, lse = tc.linear_softmax_cross_entropy_loss(x, labels, w, reduction=reduction,
                                                     return_residuals=True)
    dloss = randn(rng, loss.shape)
    dx, dw = tc.linear_softmax_cross_entropy_loss_vjp(x, labels, w, lse, dloss,
                                                      reduction=reduction, implementation=impl)
    assert dx.dtype == np.dtype(dt) and dw.dtype == np.float32 and dw.shape == (H, V)
    tx, tw = t64(x, True), t64(w, True)
    per_row = torch.nn.functional.cross_entropy(tx @ tw, torch.from_numpy(labels).long(),
                                                reduction=reduction)
    per_row.backward(t64(dloss))
    assert_close(dx, tx.grad, tol_of(dt), "dx")
    assert_close(dw, tw.grad, 1e-4, "dw")


def test_loss_value_errors(rng):
    x, w = randn(rng, (4, 6)), randn(rng, (6, 9))
    labels = np.array([0, 1, 2, 3], np.int32)
    with pytest.raises(ValueError) as e:
        tc.linear_softmax_cross_entropy_loss(x, labels, w, reduction="max")
    assert str(e.value) == ('linear_softmax_cross_entropy_loss: reduction = "max"; expected sum, '
                            "mean or none")
    with pytest.raises(ValueError, match="labels"):
        tc.linear_softmax_cross_entropy_loss(x, np.array([0, 1, 9, 3], np.int32), w)
    with pytest.raises(ValueError, match="labels"):
        tc.linear_softmax_cross_entropy_loss(x, labels[:3].copy(), w)
    with pytest.raises(ValueError):
        tc.linear_softmax_cross_entropy_loss(x, labels, randn(rng, (5, 9)))


# --- configs, autotuning, scopes, cache-miss policy -----------------------------------------


def tiny_ragged(shape=(16, 8, 12), gs=(5, 9)):
    M, K, N = shape
    rng = np.random.default_rng(0)
    return randn(rng, (M, K)), randn(rng, (len(gs), K, N)), list(gs)


def test_get_bound_args_and_json_roundtrip():
    x, w, gs = tiny_ragged()
    bound = tc.get_bound_args(lambda a, b: tc.ragged_dot(a, b, gs, implementation="native"), x, w)
    assert len(bound) == 1
    b = bound[0]
    assert b.op == "ragged_dot" and b.implementation == "native"
    assert b.arguments["lhs"] == "f32[16,8]" and b.arguments["rhs"] == "f32[2,8,12]"
    assert json.loads(b.key) == b.arguments
    again = tc.BoundArguments.from_json(b.to_json())
    assert again == b and hash(again) == hash(b)
    listed = tc.bound_args_from_json(tc.bound_args_to_json(bound))
    assert listed == bound
    # Different shapes are different keys.
    other = tc.get_bound_args(lambda: tc.ragged_dot(x[:8], w, [4, 4]))[0]
    assert other != b


def test_query_configs_resolves_without_running():
    x, w, gs = tiny_ragged((13, 6, 10), (6, 7))
    out = np.full((13, 10), np.nan, F32)
    calls = tc.query_configs(lambda: tc.ragged_dot(x, w, gs, implementation="native", out=out))
    assert np.isnan(out).all(), "query_configs must not run the op"
    assert len(calls) == 1
    c = calls[0]
    assert c["op"] == "ragged_dot" and c["implementation"] == "native"
    assert c["rung"] == "heuristics" and c["config"] == c["heuristics"]
    # The config it reports, passed explicitly, is taken as given ('explicit').
    explicit = tc.query_configs(lambda: tc.ragged_dot(x, w, gs, implementation="native",
                                                      config=c["config"]))
    assert explicit[0]["rung"] == "explicit" and explicit[0]["config"] == c["config"]
    got = tc.ragged_dot(x, w, gs, implementation="native", config=json.dumps(c["config"]))
    assert_close(got, ragged_ref(x, w, gs), TOL_F32)
    # The reference has nothing to tune.
    ref = tc.query_configs(lambda: tc.ragged_dot(x, w, gs, implementation="reference"))
    assert ref[0]["rung"] == "null_config" and ref[0]["config"] is None


@pytest.fixture
def tuned(monkeypatch, tmp_path):
    """A tiny autotuning result for one ragged_dot shape (and the function that calls it)."""
    monkeypatch.setenv("TOKAMAX_CACHE_DIR", str(tmp_path))
    x, w, gs = tiny_ragged((16, 8, 12), (5, 9))

    def f(a, b):
        return tc.ragged_dot(a, b, gs, implementation="native")

    result = tc.autotune(f, x, w, budget_s=5, measure_budget_s=1, max_candidates=3)
    assert list(tmp_path.iterdir()) == [], "autotune(fn) must not write the disk cache"
    return result, f, x, w


def rung(f, *args):
    (c,) = tc.query_configs(lambda: f(*args))
    return c["rung"], c["detail"]


def test_autotune_result_roundtrip(tuned, tmp_path):
    result, f, x, w = tuned
    assert isinstance(result, tc.AutotuningResult) and len(result) == 1
    assert result.device_kind == tc.device_kind()
    (bound, data), = result.data
    assert bound == tc.get_bound_args(f, x, w)[0]
    assert any(v.get("chosen") for v in data.values()), data.keys()
    loaded = tc.AutotuningResult.loads(result.dumps())
    assert len(loaded) == 1 and loaded.data[0][0] == bound
    path = tmp_path / "result.json"
    result.dump(str(path))
    assert len(tc.AutotuningResult.load(str(path))) == 1
    assert len(result | tc.AutotuningResult()) == 1
    with pytest.raises(ValueError, match="malformed JSON"):
        tc.AutotuningResult.loads("{not json")


def test_with_result_scopes_nest(tuned):
    result, f, x, w = tuned
    assert rung(f, x, w)[0] == "heuristics"
    loaded = tc.AutotuningResult.loads(result.dumps())
    with result:
        r, detail = rung(f, x, w)
        assert r == "scope"
        with loaded as inner:
            assert inner is loaded
            r2, detail2 = rung(f, x, w)
            assert r2 == "scope" and detail2 != detail  # the innermost scope answers
            with loaded:  # the same result entered again inside itself
                assert rung(f, x, w)[0] == "scope"
            assert rung(f, x, w) == (r2, detail2)
        assert rung(f, x, w) == (r, detail)
        # The scoped config runs and computes the right numbers.
        assert_close(f(x, w), ragged_ref(x, w, [5, 9]), TOL_F32)
        # autotune skips what an active scope answers, unless told to ignore it.
        assert len(tc.autotune(f, x, w, budget_s=5, measure_budget_s=1, max_candidates=2)) == 0
    assert rung(f, x, w)[0] == "heuristics", "__exit__ must pop the scope"
    # A scope applies to the thread that entered it.
    from concurrent.futures import ThreadPoolExecutor

    with result, ThreadPoolExecutor(1) as pool:
        assert rung(f, x, w)[0] == "scope"
        assert pool.submit(rung, f, x, w).result()[0] == "heuristics"
    # An exception inside the block pops the scope too, and propagates.
    with pytest.raises(RuntimeError, match="boom"):
        with result:
            raise RuntimeError("boom")
    assert rung(f, x, w)[0] == "heuristics"
    # A scope does not answer another shape.
    x2, w2, _ = tiny_ragged((17, 8, 12))
    with result:
        assert rung(f, x2, w2)[0] == "heuristics"


def test_autotune_bound_args_and_file(tuned, tmp_path):
    result, f, x, w = tuned
    bound = tc.get_bound_args(f, x, w)
    r = tc.autotune(bound, budget_s=5, measure_budget_s=1, max_candidates=2)
    assert len(r) == 1 and r.data[0][0] == bound[0]
    path = tmp_path / "bound.json"
    path.write_text(tc.bound_args_to_json(bound))
    assert len(tc.autotune(str(path), budget_s=5, measure_budget_s=1, max_candidates=2)) == 1
    with pytest.raises(ValueError, match="positional arguments are for a callable"):
        tc.autotune(bound, x)
    with pytest.raises(ValueError, match=r"bound_args\[0\] is a str"):
        tc.autotune(["ragged_dot"])
    with pytest.raises(ValueError):
        tc.autotune(f, x, w, budget_s=0)


def test_autotune_with_a_store(tuned, tmp_path, monkeypatch):
    """Sharded tuning from Python: the in-process store (mem://) stands in for Redis here (the
    multi-process runs against a real redis-server are tests/fleet/fleet_cli_test.py)."""
    result, f, x, w = tuned
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the host measurement lock's directory
    bound = tc.get_bound_args(f, x, w)
    r = tc.autotune(bound, store="mem://py", run_id="py1", budget_s=5, measure_budget_s=1,
                    max_candidates=2)
    assert len(r) == 1 and r.data[0][0] == bound[0]
    # A second process of the run finds the result published: nothing left to tune.
    again = tc.autotune(bound, store="mem://py", run_id="py1", max_candidates=2)
    assert again.dumps() == r.dumps()
    with pytest.raises(ValueError, match="other bound arguments"):
        tc.autotune(bound + tc.get_bound_args(lambda: tc.ragged_dot(*tiny_ragged((9, 8, 12), (4, 5)),
                                                                    implementation="native")),
                    store="mem://py", run_id="py1")
    with pytest.raises(ConnectionError, match="cannot connect"):
        tc.autotune(bound, store="redis://127.0.0.1:1/0", run_id="x")
    with pytest.raises(ValueError, match="needs a run_id"):
        tc.autotune(bound, store="mem://py")
    with pytest.raises(ValueError, match="run_id needs a store"):
        tc.autotune(bound, run_id="x")
    with pytest.raises(ValueError, match="tunes a list or file"):
        tc.autotune(f, x, w, store="mem://py", run_id="y")


def test_cache_miss_policy_error(monkeypatch, tuned):
    result, f, x, w = tuned
    x2, w2, gs2 = tiny_ragged((37, 19, 23), (11, 0, 20))  # a shape nothing has tuned
    monkeypatch.setenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", "error")
    with pytest.raises(tc.CacheMissError, match="no tuned config for op ragged_dot") as e:
        tc.ragged_dot(x2, w2, gs2, implementation="native")
    assert isinstance(e.value, LookupError)
    assert "f32[37,19]" in str(e.value)
    # heuristics_only bypasses the ladder; the reference has no config to miss.
    want = ragged_ref(x2, w2, gs2)
    assert_close(tc.ragged_dot(x2, w2, gs2, implementation="native", heuristics_only=True), want,
                 TOL_F32)
    assert_close(tc.ragged_dot(x2, w2, gs2, implementation="reference"), want, TOL_F32)
    # A scope answers the tuned shape, so no miss there.
    with pytest.raises(tc.CacheMissError):
        f(x, w)
    with result:
        assert_close(f(x, w), ragged_ref(x, w, [5, 9]), TOL_F32)
    # The policy is read at call time.
    monkeypatch.setenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", "heuristics")
    assert_close(tc.ragged_dot(x2, w2, gs2, implementation="native"), want, TOL_F32)
    monkeypatch.setenv("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", "bogus")
    with pytest.raises(ValueError, match="TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK"):
        tc.ragged_dot(x2, w2, gs2, implementation="native")


# --- cache misses: one warning line for a process ------------------------------------------


def test_cache_misses_warn_once_and_count_at_exit(tmp_path):
    # Four distinct keys with no tuning data: one warning line when the first misses, one
    # counting them at exit, each key at debug level only; missed_keys() lists them once each
    # however often they run.
    script = textwrap.dedent("""
        import numpy as np, tokamax_cpp as tc
        rng = np.random.default_rng(0)
        for rows in (3, 5, 7):
            x = rng.standard_normal((rows, 33)).astype(np.float32)
            for _ in range(3):
                tc.layer_norm(x, implementation="native")
        x = rng.standard_normal((6, 16)).astype(np.float32)
        w = rng.standard_normal((2, 16, 8)).astype(np.float32)
        tc.ragged_dot(x, w, [2, 4], implementation="native")
        keys = tc.missed_keys()
        print(len(keys), sorted({(op, impl) for op, impl, _ in keys}))
    """)
    env = dict(os.environ, TOKAMAX_CACHE_DIR=str(tmp_path / "cache"),
               TOKAMAX_DATA_DIR=str(tmp_path / "no-data"))
    env.pop("TOKAMAX_LOG", None)
    env.pop("TOKAMAX_AUTOTUNING_CACHE_MISS_FALLBACK", None)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "4 [('layer_norm', 'native'), ('ragged_dot', 'native')]"
    lines = [l for l in r.stderr.splitlines() if l.startswith("[tokamax:")]
    assert len(lines) == 2, r.stderr
    assert "op calls not in the tuning data for" in lines[0]
    assert "(first: layer_norm/native)" in lines[0]
    assert "4 op call keys were not in the tuning data" in lines[1]
    assert all(len(l) < 300 for l in lines), lines
