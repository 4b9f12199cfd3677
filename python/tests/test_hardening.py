"""Bad arguments and odd inputs from Python: a clear ValueError or TypeError naming the argument,
never a RuntimeError from a C++ cast, a crash or a silent wrong answer; scopes that end on
another thread than the one that entered them."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tokamax_cpp as tc


def _qkv(rng, b=1, t=4, n=2, h=8):
    q = rng.standard_normal((b, t, n, h)).astype(np.float32)
    return q, q.copy(), q.copy()


@pytest.mark.parametrize(
    "call",
    [
        lambda: tc.layer_norm(np.ones((2, 3), np.float32), implementation=5),
        lambda: tc.ragged_dot(
            np.ones((2, 3), np.float32),
            np.ones((1, 3, 4), np.float32),
            np.array([2], np.int32),
            implementation=5,
        ),
        lambda: tc.gated_linear_unit(
            np.ones((2, 3), np.float32), np.ones((3, 2, 4), np.float32), implementation=["native"]
        ),
    ],
)
def test_implementation_of_the_wrong_type_is_a_type_error_naming_it(call):
    with pytest.raises(TypeError, match=r"implementation is .*expected None or one of 'native'"):
        call()


@pytest.mark.parametrize(
    "x, pattern",
    [
        (np.ones((2, 3), ">f4"), "big-endian array"),
        (np.ones((2, 3), object), "object array"),
    ],
)
def test_unexportable_numpy_arrays_say_why(x, pattern):
    want = f"layer_norm: x is an? {pattern}.*numpy.ascontiguousarray"
    with pytest.raises(ValueError, match=want):
        tc.layer_norm(x)


def test_zero_heads_return_empty_outputs_in_every_implementation(rng):
    q = np.zeros((1, 4, 0, 8), np.float32)
    for impl in tc._core.implementation_names("dot_product_attention"):
        out = tc.dot_product_attention(q, q, q, implementation=impl)
        assert out.shape == (1, 4, 0, 8)


@pytest.mark.parametrize("impl", ["native", "composed", "reference"])
def test_huge_window_is_no_window(rng, impl):
    q, k, v = _qkv(rng)
    big = 2**63 - 1
    want = tc.dot_product_attention(q, k, v, implementation=impl)
    got = tc.dot_product_attention(q, k, v, local_window_size=(big, big), implementation=impl)
    np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("kw", [{"scale": 1e300}, {"scale": 1e-300}, {"logits_soft_cap": 1e300}])
def test_arguments_outside_f32_are_refused(rng, kw):
    q, k, v = _qkv(rng)
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} = .*the kernels compute in f32"):
        tc.dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("impl", ["native", "composed", "reference"])
def test_nan_key_reaches_its_rows_under_a_causal_mask(rng, impl):
    q, k, v = _qkv(rng, t=6)
    k[0, 3, 0, 0] = np.nan
    out = tc.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
    # Rows 0-2 do not see position 3; rows 3-5 do (kv head 0 serves query head 0 only).
    assert np.isfinite(out[0, :3]).all()
    assert np.isnan(out[0, 3:, 0]).all()
    assert np.isfinite(out[0, :, 1]).all()


@pytest.mark.parametrize("impl", ["native", "composed", "reference"])
def test_nan_weight_reaches_every_row_of_the_loss(rng, impl):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 40)).astype(np.float32)
    w[3, 7] = np.nan
    labels = rng.integers(0, 40, 8).astype(np.int32)
    loss = tc.linear_softmax_cross_entropy_loss(
        x, labels, w, reduction="none", implementation=impl
    )
    assert np.isnan(loss).all()


def _scoped_result(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    return tc.autotune(tc.layer_norm, x, budget_s=2), x


def test_scope_exited_on_another_thread(rng):
    result, x = _scoped_result(rng)

    def scoped():
        with result:
            yield
            yield

    gen = scoped()
    next(gen)  # entered on this thread
    done = []

    def finish():
        for _ in gen:  # exits the `with` on this other thread
            pass
        done.append(tc.layer_norm(x))

    t = threading.Thread(target=finish)
    t.start()
    t.join()
    assert len(done) == 1
    # The scope left this thread's stack: calls here run, and outside any scope.
    tc.layer_norm(x)
    with result:
        tc.layer_norm(x)
    tc.layer_norm(x)


def test_glu_weights_of_three_items_name_the_argument():
    x = np.ones((2, 3), np.float32)
    w = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"gated_linear_unit: weights is a sequence of 3 items"):
        tc.gated_linear_unit(x, (w, w, w))


def test_empty_input_with_huge_rows_runs_at_once_or_names_what_it_cannot_allocate():
    x = np.zeros((10**12, 0), np.float32)  # no elements, 10^12 rows of none
    for impl in ["native", "composed", "reference"]:
        assert tc.layer_norm(x, implementation=impl).shape == x.shape  # nothing to compute
    # The residuals (a mean and rstd per row) are 4 TB each: a MemoryError naming them.
    with pytest.raises(MemoryError, match=r"f32\[1000000000000\] \(4000000000000 bytes\)"):
        tc.layer_norm(x, return_residuals=True)


@pytest.mark.parametrize("where", ["x", "w", "dy"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_ragged_dot_vjp_non_finite_outputs_match_the_reference(rng, where, value):
    # ragged_dot's backward is no family of its own (the contract test covers the families):
    # the same promise, checked here.
    x = rng.standard_normal((9, 16)).astype(np.float32)
    w = rng.standard_normal((3, 16, 8)).astype(np.float32)
    dy = rng.standard_normal((9, 8)).astype(np.float32)
    groups = np.array([4, 0, 5], np.int32)
    arrays = {"x": x, "w": w, "dy": dy}
    arrays[where].flat[int(rng.integers(arrays[where].size))] = value
    ref = tc.ragged_dot_vjp(x, w, groups, dy, implementation="reference")
    want = [~np.isfinite(a) for a in ref]
    for impl in ["native", "blas"]:
        got = tc.ragged_dot_vjp(x, w, groups, dy, implementation=impl)
        for g, m in zip(got, want):
            np.testing.assert_array_equal(~np.isfinite(g), m)
