"""The functions and operators made from the ops' descriptions: signatures and defaults equal
the library's, the fake tensors' shape rules equal the library's output specs on every arg
spec, add_rms_norm (a family written in C++ alone) from Python and torch, and the stubs."""

import inspect
import pathlib

import numpy as np
import pytest
import torch

import tokamax_cpp as tc
import tokamax_cpp.torch_ops as T
from tokamax_cpp import _core, _ops


def test_defaults_are_the_librarys():
    """Every default in a Python signature is the one the C++ description holds (written once,
    in the call struct)."""
    for op in _ops.described_ops():
        fn = getattr(tc, op)
        params = inspect.signature(fn).parameters
        for a in _ops.description(op).args:
            if not a.user or a.is_array:
                continue
            assert params[a.py_name].default == a.default, (op, a.name)
            assert params[a.py_name].kind == inspect.Parameter.KEYWORD_ONLY


def test_decided_defaults():
    """The two defaults that had drifted apart, decided once as Google's tokamax has them: the
    GLU's activation is the identity, the loss reduces by sum (C++ and Python alike)."""
    glu = {a["name"]: a for a in _core.describe("gated_linear_unit")["arguments"]}
    assert glu["activation"]["default"] == "none"
    loss = {a["name"]: a for a in _core.describe("linear_softmax_cross_entropy_loss")["arguments"]}
    assert loss["reduction"]["default"] == "sum"
    assert inspect.signature(tc.linear_softmax_cross_entropy_loss).parameters[
        "reduction"].default == "sum"
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((8, 2, 5)).astype(np.float32)
    np.testing.assert_array_equal(tc.gated_linear_unit(x, w),
                                  tc.gated_linear_unit(x, w, activation="none"))
    labels = np.array([0, 4, 2], np.int32)
    wl = rng.standard_normal((8, 5)).astype(np.float32)
    np.testing.assert_array_equal(tc.linear_softmax_cross_entropy_loss(x, labels, wl),
                                  tc.linear_softmax_cross_entropy_loss(x, labels, wl,
                                                                       reduction="sum"))


def test_help_states_shapes_options_and_outputs():
    doc = tc.add_rms_norm.__doc__
    for text in ("residual_out", "epsilon", "default 1e-06", "implementation", "native",
                 "x + residual"):
        assert text in doc, text
    doc = tc.dot_product_attention.__doc__
    for text in ("query", "[B, T, N, H]", "is_causal", "return_residuals", "lse"):
        assert text in doc, text


class _Abstract:
    """An array's shape and dtype only (what a fake tensor or jax's abstract value offers)."""

    def __init__(self, spec):
        shape, self.dtype = spec
        self.shape = tuple(shape)


def _parse(spec: str):
    dtype, dims = spec.rstrip("]").split("[")
    return tuple(int(d) for d in dims.split(",") if d), dtype


def test_shape_rules_match_the_librarys_output_specs():
    """The outputs' shape and dtype rules (which the torch fakes evaluate on symbolic sizes)
    agree with the library's own output specs, for every described op and smoke spec, with
    and without residuals."""
    checked = 0
    for op in _ops.tensor_ops() + [_ops.description(o).vjp for o in _ops.tensor_ops()]:
        if op is None:
            continue
        d = _ops.description(op)
        for spec in _smoke_arguments(op):
            for residuals in ([False, True] if d.residuals_flag else [False]):
                args = dict(spec)
                if d.residuals_flag:
                    args[d.residuals_flag] = residuals
                want = [(tuple(s), t) for s, t in _core.output_specs(op, args)]
                values = {}
                for a in d.args:
                    if a.name in args and args[a.name] is not None:
                        values[a.name] = (_Abstract(_parse(args[a.name])) if a.is_array
                                          else args[a.name])
                got = []
                for shape, dtype in _ops.output_shapes(op, values, residuals):
                    dt = values[dtype].dtype if dtype in values else \
                        {"float32": "f32", "bfloat16": "bf16"}[dtype]
                    got.append((tuple(shape), dt))
                assert got == want, (op, spec, residuals)
                checked += 1
    assert checked >= 12


def _smoke_arguments(op):
    """The smoke specs' arguments of op (its own and, for a backward, the derived ones)."""
    return [s["arguments"] for s in _core.arg_specs(op, "smoke")]


def _add_rms_norm_want(x, r, scale, eps):
    s = (x.astype(np.float64) + r.astype(np.float64)).astype(x.dtype).astype(np.float64)
    y = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + eps)
    return y * (scale if scale is not None else 1.0), s


@pytest.mark.parametrize("impl", [None, "native", "composed", "reference"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 130), (2, 3, 33)])
def test_add_rms_norm_matches_float64(impl, shape):
    rng = np.random.default_rng()
    x = rng.standard_normal(shape).astype(np.float32)
    r = rng.standard_normal(shape).astype(np.float32)
    scale = rng.standard_normal(shape[-1]).astype(np.float32)
    y, s = tc.add_rms_norm(x, r, scale, epsilon=1e-5, implementation=impl)
    want_y, want_s = _add_rms_norm_want(x, r, scale, 1e-5)
    np.testing.assert_array_equal(s, want_s.astype(np.float32))
    np.testing.assert_allclose(y, want_y, rtol=2e-5, atol=2e-5)
    y2, _ = tc.add_rms_norm(x, r)  # no scale
    np.testing.assert_allclose(y2, _add_rms_norm_want(x, r, None, 1e-6)[0], rtol=2e-5, atol=2e-5)


def test_add_rms_norm_errors_name_the_argument():
    x = np.zeros((4, 6), np.float32)
    with pytest.raises(ValueError, match=r"residual has spec f32\[4,5\]"):
        tc.add_rms_norm(x, np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="epsilon"):
        tc.add_rms_norm(x, x, epsilon="big")
    with pytest.raises(TypeError, match="add_rms_norm"):
        tc.add_rms_norm(x, x, eps=1.0)
    with pytest.raises(ValueError, match="residual is a NoneType"):
        tc.add_rms_norm(x, None)


def test_add_rms_norm_torch_op_and_compile():
    """The torch operator made from the description alone: fast and reference agree, opcheck
    passes (schema, fake, no graph break), torch.compile with a changing token count."""
    gen = torch.Generator().manual_seed(7)
    x, r = torch.randn(5, 64, generator=gen), torch.randn(5, 64, generator=gen)
    scale = torch.randn(64, generator=gen)
    y, s = T.add_rms_norm(x, r, scale)
    y_ref, s_ref = T.reference.add_rms_norm(x, r, scale)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(s, s_ref)
    torch.library.opcheck(torch.ops.tokamax.add_rms_norm, (x, r, scale))
    torch.library.opcheck(torch.ops.tokamax.add_rms_norm, (x, r))
    f = torch.compile(lambda a, b: T.add_rms_norm(a, b, scale, epsilon=1e-5), fullgraph=True,
                      dynamic=True)
    for tokens in (3, 9, 17):
        a, b = torch.randn(tokens, 64, generator=gen), torch.randn(tokens, 64, generator=gen)
        got, got_s = f(a, b)
        want, want_s = T.add_rms_norm(a, b, scale, epsilon=1e-5)
        torch.testing.assert_close(got, want)
        assert torch.equal(got_s, want_s)
    assert inspect.signature(T.add_rms_norm) == inspect.signature(tc.add_rms_norm)


def test_stubs_are_current(tmp_path):
    """The committed stubs are what the descriptions give now (python -m tokamax_cpp._stubs)."""
    from tokamax_cpp import _stubs

    folder = pathlib.Path(tc.__file__).parent
    assert (folder / "py.typed").exists()
    assert (folder / "__init__.pyi").read_text() == _stubs.init_stub()
    assert (folder / "_core.pyi").read_text() == _stubs.core_stub()


def test_numpy_scalars_and_bad_statics():
    """numpy scalars are accepted where Python numbers are (np.float32 epsilon, np.bool_,
    np.int64 axis); a malformed window is a ValueError naming it."""
    rng = np.random.default_rng()
    x = rng.standard_normal((3, 8)).astype(np.float32)
    want = tc.layer_norm(x, epsilon=1e-5, axis=-1, subtract_mean=False)
    got = tc.layer_norm(x, epsilon=np.float32(1e-5), axis=np.int64(-1),
                        subtract_mean=np.bool_(False))
    np.testing.assert_array_equal(got, want)
    q = rng.standard_normal((1, 4, 2, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="local_window_size is 5"):
        tc.dot_product_attention(q, q, q, local_window_size=5)
    with pytest.raises(ValueError, match="epsilon"):
        tc.layer_norm(x, epsilon=object())


def test_ragged_dot_vjp_reads_float64_cotangents():
    """A float64 cotangent (numpy's default) gives the same gradients as its f32 copy."""
    rng = np.random.default_rng()
    lhs = rng.standard_normal((6, 5)).astype(np.float32)
    rhs = rng.standard_normal((2, 5, 7)).astype(np.float32)
    dout = rng.standard_normal((6, 7))
    a = tc.ragged_dot_vjp(lhs, rhs, [2, 4], dout, activation="silu")
    b = tc.ragged_dot_vjp(lhs, rhs, [2, 4], dout.astype(np.float32), activation="silu")
    for g, h in zip(a, b):
        np.testing.assert_allclose(g, h, rtol=1e-6, atol=1e-6)
