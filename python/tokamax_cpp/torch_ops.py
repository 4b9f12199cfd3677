"""PyTorch custom operators: ``torch.ops.tokamax.<op>`` for every op family and its VJP.

Importing this module registers, through ``torch.library.custom_op``:

* per family, two operators with the same signature, as Google's tokamax PyTorch bridge has:
  ``tokamax::<op>`` (the fast path: the library's dispatch, native first) and
  ``tokamax::<op>_reference`` (the reference implementation, the ground truth);
* their VJP operators ``tokamax::<op>_vjp`` / ``tokamax::<op>_reference_vjp``, wired in with
  ``register_autograd``: the forward's residuals (attention's log-sum-exp, the norms' mean and
  rstd, the GLU's pre-activation product, the loss's log-sum-exp) are saved in
  ``setup_context`` and handed to the VJP operator in ``backward``;
* fake (meta) implementations (``register_fake``) whose shapes follow the inputs' symbolic
  sizes, so ``torch.compile(fullgraph=True)`` traces them without a graph break, including a
  token count that changes from step to step;
* ``tokamax::ragged_dot_out``, the out-variant writing into a caller's buffer
  (``mutates_args=("out",)``), the analogue of buffer donation.

Config choice follows the original's PyTorch bridge: a call with no config uses the
implementation's heuristics (no cache lookup, so a compiled graph does not depend on which
tuning files a machine has). ``get_configs(op, *args, from_autotuning_cache=...)`` returns the
forward and backward configs, from the heuristics or from the autotuning cache (falling back to
the heuristics); pass one back as ``config=`` with its ``implementation=``.

Operators that return residuals internally return a tuple; the Python functions below
(``ragged_dot``, ``dot_product_attention``, ...) return what Google's tokamax returns.
Tensors must be contiguous CPU tensors (``.contiguous()`` otherwise); gradients arriving
strided (an expanded ``sum().backward()``) are made contiguous before the VJP.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from . import _core

__all__ = [
    "Configs",
    "dot_product_attention",
    "gated_linear_unit",
    "get_configs",
    "layer_norm",
    "linear_softmax_cross_entropy_loss",
    "ragged_dot",
    "ragged_dot_out",
    "reference",
    "rms_norm",
]

_UNBOUNDED = 1 << 40  # a local-window side with no bound


def _config_text(config: Any) -> Optional[str]:
    if config is None or isinstance(config, str):
        return config
    return json.dumps(config)


def _impl(fixed: Optional[str], implementation: Optional[str]) -> Optional[str]:
    return fixed if fixed is not None else implementation


def _window(left: Optional[int], right: Optional[int]) -> Optional[tuple[int, int]]:
    return None if left is None and right is None else (left, right)


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _ragged_out_dtype(lhs: Tensor, rhs: Tensor, preferred: Optional[torch.dtype]) -> torch.dtype:
    if preferred is not None:
        return preferred
    return torch.float32 if torch.float32 in (lhs.dtype, rhs.dtype) else lhs.dtype


def _register(suffix: str, fixed_impl: Optional[str]) -> dict[str, Callable[..., Any]]:
    """Registers every family's forward and VJP operators under tokamax::<op><suffix>."""
    ns = "tokamax::"
    ops: dict[str, Callable[..., Any]] = {}

    # --- ragged_dot ---
    @torch.library.custom_op(ns + "ragged_dot" + suffix, mutates_args=())
    def ragged_dot_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor,
                      preferred_element_type: Optional[torch.dtype] = None,
                      activation: Optional[str] = None, precision: Optional[str] = None,
                      implementation: Optional[str] = None,
                      config: Optional[str] = None) -> Tensor:
        return _core.ragged_dot(lhs, rhs, group_sizes,
                                preferred_element_type=preferred_element_type,
                                activation=activation, precision=precision,
                                implementation=_impl(fixed_impl, implementation), config=config,
                                heuristics_only=True)

    @ragged_dot_op.register_fake
    def _(lhs, rhs, group_sizes, preferred_element_type=None, activation=None, precision=None,
          implementation=None, config=None):
        return lhs.new_empty((lhs.shape[0], rhs.shape[2]),
                             dtype=_ragged_out_dtype(lhs, rhs, preferred_element_type))

    @torch.library.custom_op(ns + "ragged_dot" + suffix + "_vjp", mutates_args=())
    def ragged_dot_vjp_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor, dout: Tensor,
                          preferred_element_type: Optional[torch.dtype] = None,
                          activation: Optional[str] = None, precision: Optional[str] = None,
                          implementation: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.ragged_dot_vjp(lhs, rhs, group_sizes, dout,
                                    preferred_element_type=preferred_element_type,
                                    activation=activation, precision=precision,
                                    implementation=_impl(fixed_impl, implementation),
                                    heuristics_only=True)

    @ragged_dot_vjp_op.register_fake
    def _(lhs, rhs, group_sizes, dout, preferred_element_type=None, activation=None,
          precision=None, implementation=None):
        return torch.empty_like(lhs), torch.empty_like(rhs)

    def ragged_dot_setup(ctx, inputs, output):
        lhs, rhs, group_sizes, preferred, activation, precision, implementation, _ = inputs
        ctx.save_for_backward(lhs, rhs, group_sizes)
        ctx.statics = (preferred, activation, precision, implementation)

    def ragged_dot_backward(ctx, dout):
        lhs, rhs, group_sizes = ctx.saved_tensors
        preferred, activation, precision, implementation = ctx.statics
        dlhs, drhs = ragged_dot_vjp_op(lhs, rhs, group_sizes, dout.contiguous(), preferred,
                                       activation, precision, implementation)
        return dlhs, drhs, None, None, None, None, None, None

    ragged_dot_op.register_autograd(ragged_dot_backward, setup_context=ragged_dot_setup)
    ops["ragged_dot"], ops["ragged_dot_vjp"] = ragged_dot_op, ragged_dot_vjp_op

    # --- dot_product_attention: (out, lse) ---
    @torch.library.custom_op(ns + "dot_product_attention" + suffix, mutates_args=())
    def attention_op(query: Tensor, key: Tensor, value: Tensor, bias: Optional[Tensor] = None,
                     mask: Optional[Tensor] = None, scale: Optional[float] = None,
                     is_causal: bool = False, query_seq_lengths: Optional[Tensor] = None,
                     key_value_seq_lengths: Optional[Tensor] = None,
                     window_left: Optional[int] = None, window_right: Optional[int] = None,
                     logits_soft_cap: Optional[float] = None,
                     implementation: Optional[str] = None,
                     config: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.dot_product_attention(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=_window(window_left, window_right), logits_soft_cap=logits_soft_cap,
            implementation=_impl(fixed_impl, implementation), config=config,
            return_residuals=True, heuristics_only=True)

    @attention_op.register_fake
    def _(query, key, value, bias=None, mask=None, scale=None, is_causal=False,
          query_seq_lengths=None, key_value_seq_lengths=None, window_left=None,
          window_right=None, logits_soft_cap=None, implementation=None, config=None):
        b, t, n, _ = query.shape
        out = query.new_empty((b, t, n, value.shape[3]))
        lse = query.new_empty((b, n, t), dtype=torch.float32)
        return out, lse

    @torch.library.custom_op(ns + "dot_product_attention" + suffix + "_vjp", mutates_args=())
    def attention_vjp_op(query: Tensor, key: Tensor, value: Tensor, out: Tensor, lse: Tensor,
                         dout: Tensor, bias: Optional[Tensor] = None,
                         mask: Optional[Tensor] = None, scale: Optional[float] = None,
                         is_causal: bool = False, query_seq_lengths: Optional[Tensor] = None,
                         key_value_seq_lengths: Optional[Tensor] = None,
                         window_left: Optional[int] = None, window_right: Optional[int] = None,
                         logits_soft_cap: Optional[float] = None,
                         implementation: Optional[str] = None,
                         config: Optional[str] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        dq, dk, dv, dbias = _core.dot_product_attention_vjp(
            query, key, value, out, lse, dout, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=_window(window_left, window_right), logits_soft_cap=logits_soft_cap,
            implementation=_impl(fixed_impl, implementation), config=config,
            heuristics_only=True)
        return dq, dk, dv, (dbias if dbias is not None else _empty(dq))

    @attention_vjp_op.register_fake
    def _(query, key, value, out, lse, dout, bias=None, *args):
        dbias = (bias.new_empty(bias.shape, dtype=torch.float32) if bias is not None
                 else query.new_empty((0,)))
        return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dbias)

    def attention_setup(ctx, inputs, output):
        q, k, v, bias, mask, *statics = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, bias, mask, out, lse, statics[2], statics[3])
        ctx.statics = (statics[0], statics[1]) + tuple(statics[4:])

    def attention_backward(ctx, dout, dlse):
        q, k, v, bias, mask, out, lse, q_lens, kv_lens = ctx.saved_tensors
        scale, is_causal, wl, wr, cap, implementation, config = ctx.statics
        dq, dk, dv, dbias = attention_vjp_op(q, k, v, out, lse, dout.contiguous(), bias, mask,
                                             scale, is_causal, q_lens, kv_lens, wl, wr, cap,
                                             implementation, None)
        dbias = dbias.to(bias.dtype) if bias is not None else None
        return (dq, dk, dv, dbias) + (None,) * 10

    attention_op.register_autograd(attention_backward, setup_context=attention_setup)
    ops["dot_product_attention"] = attention_op
    ops["dot_product_attention_vjp"] = attention_vjp_op

    # --- layer_norm: (y, mean, rstd) ---
    @torch.library.custom_op(ns + "layer_norm" + suffix, mutates_args=())
    def norm_op(x: Tensor, scale: Optional[Tensor] = None, offset: Optional[Tensor] = None,
                axis: int = -1, epsilon: float = 1e-6, subtract_mean: bool = True,
                implementation: Optional[str] = None,
                config: Optional[str] = None) -> tuple[Tensor, Tensor, Tensor]:
        y, (mean, rstd) = _core.layer_norm(
            x, scale, offset, axis=axis, epsilon=epsilon, subtract_mean=subtract_mean,
            implementation=_impl(fixed_impl, implementation), config=config,
            return_residuals=True, heuristics_only=True)
        return y, mean, rstd

    @norm_op.register_fake
    def _(x, scale=None, offset=None, axis=-1, epsilon=1e-6, subtract_mean=True,
          implementation=None, config=None):
        a = axis % x.dim()
        stats = x.new_empty(tuple(x.shape[:a]) + tuple(x.shape[a + 1:]), dtype=torch.float32)
        return torch.empty_like(x), stats, torch.empty_like(stats)

    @torch.library.custom_op(ns + "layer_norm" + suffix + "_vjp", mutates_args=())
    def norm_vjp_op(x: Tensor, scale: Optional[Tensor], offset: Optional[Tensor], mean: Tensor,
                    rstd: Tensor, dy: Tensor, axis: int = -1, epsilon: float = 1e-6,
                    subtract_mean: bool = True, implementation: Optional[str] = None,
                    config: Optional[str] = None) -> tuple[Tensor, Tensor, Tensor]:
        dx, dscale, doffset = _core.layer_norm_vjp(
            x, scale, offset, mean, rstd, dy, axis=axis, epsilon=epsilon,
            subtract_mean=subtract_mean, implementation=_impl(fixed_impl, implementation),
            config=config, heuristics_only=True)
        return (dx, dscale if dscale is not None else _empty(dx),
                doffset if doffset is not None else _empty(dx))

    @norm_vjp_op.register_fake
    def _(x, scale, offset, mean, rstd, dy, axis=-1, epsilon=1e-6, subtract_mean=True,
          implementation=None, config=None):
        d = x.shape[axis % x.dim()]
        dscale = x.new_empty((d,), dtype=torch.float32) if scale is not None else x.new_empty((0,))
        doffset = (x.new_empty((d,), dtype=torch.float32) if offset is not None
                   else x.new_empty((0,)))
        return torch.empty_like(x), dscale, doffset

    def norm_setup(ctx, inputs, output):
        x, scale, offset, *statics = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, scale, offset, mean, rstd)
        ctx.statics = tuple(statics[:4])

    def norm_backward(ctx, dy, dmean, drstd):
        x, scale, offset, mean, rstd = ctx.saved_tensors
        axis, epsilon, subtract_mean, implementation = ctx.statics
        dx, dscale, doffset = norm_vjp_op(x, scale, offset, mean, rstd, dy.contiguous(), axis,
                                          epsilon, subtract_mean, implementation, None)
        return (dx, dscale.to(scale.dtype) if scale is not None else None,
                doffset.to(offset.dtype) if offset is not None else None, None, None, None, None,
                None)

    norm_op.register_autograd(norm_backward, setup_context=norm_setup)
    ops["layer_norm"], ops["layer_norm_vjp"] = norm_op, norm_vjp_op

    # --- gated_linear_unit: (out, h) ---
    @torch.library.custom_op(ns + "gated_linear_unit" + suffix, mutates_args=())
    def glu_op(x: Tensor, weights: Tensor, activation: Optional[str] = None,
               implementation: Optional[str] = None,
               config: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.gated_linear_unit(x, weights, activation=activation,
                                       implementation=_impl(fixed_impl, implementation),
                                       config=config, return_residuals=True,
                                       heuristics_only=True)

    @glu_op.register_fake
    def _(x, weights, activation=None, implementation=None, config=None):
        n = weights.shape[2]
        out = x.new_empty(tuple(x.shape[:-1]) + (n,))
        h = x.new_empty(tuple(x.shape[:-1]) + (2, n), dtype=torch.float32)
        return out, h

    @torch.library.custom_op(ns + "gated_linear_unit" + suffix + "_vjp", mutates_args=())
    def glu_vjp_op(x: Tensor, weights: Tensor, h: Tensor, dout: Tensor,
                   activation: Optional[str] = None, implementation: Optional[str] = None,
                   config: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.gated_linear_unit_vjp(x, weights, h, dout, activation=activation,
                                           implementation=_impl(fixed_impl, implementation),
                                           config=config, heuristics_only=True)

    @glu_vjp_op.register_fake
    def _(x, weights, h, dout, *args):
        return torch.empty_like(x), weights.new_empty(weights.shape, dtype=torch.float32)

    def glu_setup(ctx, inputs, output):
        x, weights, activation, implementation, _ = inputs
        ctx.save_for_backward(x, weights, output[1])
        ctx.statics = (activation, implementation)

    def glu_backward(ctx, dout, dh):
        x, weights, h = ctx.saved_tensors
        activation, implementation = ctx.statics
        dx, dw = glu_vjp_op(x, weights, h, dout.contiguous(), activation, implementation, None)
        return dx, dw.to(weights.dtype), None, None, None

    glu_op.register_autograd(glu_backward, setup_context=glu_setup)
    ops["gated_linear_unit"], ops["gated_linear_unit_vjp"] = glu_op, glu_vjp_op

    # --- linear_softmax_cross_entropy_loss: (loss, lse) ---
    @torch.library.custom_op(ns + "linear_softmax_cross_entropy_loss" + suffix, mutates_args=())
    def loss_op(x: Tensor, labels: Tensor, weights: Tensor, reduction: str = "sum",
                implementation: Optional[str] = None,
                config: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.linear_softmax_cross_entropy_loss(
            x, labels, weights, reduction=reduction,
            implementation=_impl(fixed_impl, implementation), config=config,
            return_residuals=True, heuristics_only=True)

    @loss_op.register_fake
    def _(x, labels, weights, reduction="sum", implementation=None, config=None):
        b = x.shape[0]
        loss = x.new_empty((b,) if reduction == "none" else (), dtype=torch.float32)
        return loss, x.new_empty((b,), dtype=torch.float32)

    @torch.library.custom_op(ns + "linear_softmax_cross_entropy_loss" + suffix + "_vjp",
                             mutates_args=())
    def loss_vjp_op(x: Tensor, labels: Tensor, weights: Tensor, lse: Tensor, dloss: Tensor,
                    reduction: str = "sum", implementation: Optional[str] = None,
                    config: Optional[str] = None) -> tuple[Tensor, Tensor]:
        return _core.linear_softmax_cross_entropy_loss_vjp(
            x, labels, weights, lse, dloss, reduction=reduction,
            implementation=_impl(fixed_impl, implementation), config=config,
            heuristics_only=True)

    @loss_vjp_op.register_fake
    def _(x, labels, weights, lse, dloss, *args):
        return torch.empty_like(x), weights.new_empty(weights.shape, dtype=torch.float32)

    def loss_setup(ctx, inputs, output):
        x, labels, weights, reduction, implementation, _ = inputs
        ctx.save_for_backward(x, labels, weights, output[1])
        ctx.statics = (reduction, implementation)

    def loss_backward(ctx, dloss, dlse):
        x, labels, weights, lse = ctx.saved_tensors
        reduction, implementation = ctx.statics
        dx, dw = loss_vjp_op(x, labels, weights, lse,
                             dloss.to(torch.float32).contiguous(), reduction, implementation,
                             None)
        return dx, None, dw.to(weights.dtype), None, None, None

    loss_op.register_autograd(loss_backward, setup_context=loss_setup)
    ops["linear_softmax_cross_entropy_loss"] = loss_op
    ops["linear_softmax_cross_entropy_loss_vjp"] = loss_vjp_op
    return ops


_FAST = _register("", None)
_REFERENCE = _register("_reference", "reference")


@torch.library.custom_op("tokamax::ragged_dot_out", mutates_args=("out",))
def _ragged_dot_out_op(lhs: Tensor, rhs: Tensor, group_sizes: Tensor, out: Tensor,
                       activation: Optional[str] = None, precision: Optional[str] = None,
                       implementation: Optional[str] = None,
                       config: Optional[str] = None) -> None:
    _core.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out.dtype,
                     activation=activation, precision=precision, implementation=implementation,
                     config=config, out=out, heuristics_only=True)


@_ragged_dot_out_op.register_fake
def _(lhs, rhs, group_sizes, out, activation=None, precision=None, implementation=None,
      config=None):
    return None


class _Family:
    """The Python face of one family's operators (fast or reference): tokamax's signatures."""

    def __init__(self, ops: dict[str, Callable[..., Any]]):
        self._ops = ops

    def ragged_dot(self, lhs, rhs, group_sizes, *, preferred_element_type=None, activation=None,
                   precision=None, implementation=None, config=None):
        return self._ops["ragged_dot"](lhs, rhs, group_sizes, preferred_element_type,
                                       activation, precision, implementation,
                                       _config_text(config))

    def dot_product_attention(self, query, key, value, bias=None, mask=None, *, scale=None,
                              is_causal=False, query_seq_lengths=None,
                              key_value_seq_lengths=None, local_window_size=None,
                              logits_soft_cap=None, implementation=None, config=None,
                              return_residuals=False):
        left = right = None
        if local_window_size is not None:
            left, right = local_window_size
            left = _UNBOUNDED if left is None else int(left)
            right = _UNBOUNDED if right is None else int(right)
        out, lse = self._ops["dot_product_attention"](
            query, key, value, bias, mask, scale, is_causal, query_seq_lengths,
            key_value_seq_lengths, left, right, logits_soft_cap, implementation,
            _config_text(config))
        return (out, lse) if return_residuals else out

    def layer_norm(self, x, scale=None, offset=None, *, axis=-1, epsilon=1e-6,
                   subtract_mean=True, implementation=None, config=None,
                   return_residuals=False):
        y, mean, rstd = self._ops["layer_norm"](x, scale, offset, axis, epsilon, subtract_mean,
                                                implementation, _config_text(config))
        return (y, (mean, rstd)) if return_residuals else y

    def rms_norm(self, x, scale=None, *, axis=-1, epsilon=1e-6, implementation=None,
                 config=None, return_residuals=False):
        return self.layer_norm(x, scale, None, axis=axis, epsilon=epsilon, subtract_mean=False,
                               implementation=implementation, config=config,
                               return_residuals=return_residuals)

    def gated_linear_unit(self, x, weights, *, activation=None, implementation=None,
                          config=None, return_residuals=False):
        out, h = self._ops["gated_linear_unit"](x, weights, activation, implementation,
                                                _config_text(config))
        return (out, h) if return_residuals else out

    def linear_softmax_cross_entropy_loss(self, x, labels, weights, *, reduction="sum",
                                          implementation=None, config=None,
                                          return_residuals=False):
        loss, lse = self._ops["linear_softmax_cross_entropy_loss"](
            x, labels, weights, reduction, implementation, _config_text(config))
        return (loss, lse) if return_residuals else loss


_fast = _Family(_FAST)
reference = _Family(_REFERENCE)
"""The reference implementations with the same signatures (ground truth)."""

ragged_dot = _fast.ragged_dot
dot_product_attention = _fast.dot_product_attention
layer_norm = _fast.layer_norm
rms_norm = _fast.rms_norm
gated_linear_unit = _fast.gated_linear_unit
linear_softmax_cross_entropy_loss = _fast.linear_softmax_cross_entropy_loss


def ragged_dot_out(lhs, rhs, group_sizes, out, *, activation=None, precision=None,
                   implementation=None, config=None):
    """ragged_dot into ``out`` (its dtype is the result's); returns ``out``."""
    _ragged_dot_out_op(lhs, rhs, group_sizes, out, activation, precision, implementation,
                       _config_text(config))
    return out


@dataclass(frozen=True)
class Configs:
    """The configs a call would use: one entry per library op call the forward (or the VJP)
    makes, each {"op", "implementation", "config", "source"}."""

    forward: list[dict]
    backward: list[dict]


# op name -> (run the forward with residuals, run the VJP from them) on the _core functions.
def _ragged_dot_pair(kw):
    def fwd(lhs, rhs, group_sizes):
        return _core.ragged_dot(lhs, rhs, group_sizes, **kw)

    def bwd(res, lhs, rhs, group_sizes):
        kw2 = {k: v for k, v in kw.items() if k not in ("config", "representative_group_sizes")}
        return _core.ragged_dot_vjp(lhs, rhs, group_sizes, res, **kw2)

    return fwd, bwd


def _attention_pair(kw):
    def fwd(*args):
        return _core.dot_product_attention(*args, return_residuals=True, **kw)

    def bwd(res, q, k, v, bias=None, mask=None):
        out, lse = res
        kw2 = {k_: v_ for k_, v_ in kw.items() if k_ != "config"}
        return _core.dot_product_attention_vjp(q, k, v, out, lse, out, bias, mask, **kw2)

    return fwd, bwd


def _norm_pair(kw):
    def fwd(*args):
        return _core.layer_norm(*args, return_residuals=True, **kw)

    def bwd(res, x, scale=None, offset=None):
        y, (mean, rstd) = res
        kw2 = {k: v for k, v in kw.items() if k != "config"}
        return _core.layer_norm_vjp(x, scale, offset, mean, rstd, y, **kw2)

    return fwd, bwd


def _glu_pair(kw):
    def fwd(x, weights):
        return _core.gated_linear_unit(x, weights, return_residuals=True, **kw)

    def bwd(res, x, weights):
        out, h = res
        kw2 = {k: v for k, v in kw.items() if k != "config"}
        return _core.gated_linear_unit_vjp(x, weights, h, out, **kw2)

    return fwd, bwd


def _loss_pair(kw):
    def fwd(x, labels, weights):
        return _core.linear_softmax_cross_entropy_loss(x, labels, weights, return_residuals=True,
                                                       **kw)

    def bwd(res, x, labels, weights):
        loss, lse = res
        kw2 = {k: v for k, v in kw.items() if k != "config"}
        return _core.linear_softmax_cross_entropy_loss_vjp(x, labels, weights, lse, loss, **kw2)

    return fwd, bwd


_PAIRS = {
    "ragged_dot": _ragged_dot_pair,
    "dot_product_attention": _attention_pair,
    "layer_norm": _norm_pair,
    "gated_linear_unit": _glu_pair,
    "linear_softmax_cross_entropy_loss": _loss_pair,
}


def get_configs(op, *args, from_autotuning_cache: bool = False, **kwargs) -> Configs:
    """The forward and backward configs of ``op(*args, **kwargs)``, nothing run.

    ``op``: a family name ("ragged_dot", ...) or one of this module's functions. With
    ``from_autotuning_cache=False`` (the default, what the operators use) the heuristics; with
    True the autotuning ladder (active ``with result:`` scopes, the disk cache) falling back to
    the heuristics. ``kwargs`` are the op's keyword arguments (activation, is_causal, ...).
    """
    name = op if isinstance(op, str) else getattr(op, "__name__", "")
    if name == "rms_norm":
        name, kwargs = "layer_norm", dict(kwargs, subtract_mean=False)
    if name not in _PAIRS:
        raise ValueError(f"get_configs: unknown op {op!r}; expected one of {sorted(_PAIRS)}")
    if "local_window_size" in kwargs and kwargs["local_window_size"] is not None:
        left, right = kwargs["local_window_size"]
        kwargs["local_window_size"] = (_UNBOUNDED if left is None else left,
                                       _UNBOUNDED if right is None else right)
    fwd, bwd = _PAIRS[name](kwargs)
    residuals = {}

    def forward():
        residuals["r"] = fwd(*args)

    def pick(entries):
        key = "config" if from_autotuning_cache else "heuristics"
        return [{"op": e["op"], "implementation": e["implementation"], "config": e[key],
                 "source": e["rung"] if from_autotuning_cache else "heuristics"}
                for e in entries]

    forward_entries = _core.query_configs(forward)
    backward_entries = _core.query_configs(lambda: bwd(residuals["r"], *args))
    return Configs(pick(forward_entries), pick(backward_entries))
