"""Hugging Face transformers on tokamax_cpp in one call.

    from tokamax_cpp.transformers import apply_tokamax, apply_tokamax_to, revert_tokamax
    model = AutoModelForCausalLM.from_config(config)   # or from_pretrained(...)
    apply_tokamax(model)              # patched in place; returns the model
    revert_tokamax(model)             # back to stock, bit for bit

    apply_tokamax_to("qwen3_moe")     # the classes, before from_pretrained builds the model
    revert_tokamax("qwen3_moe")

What is patched (each part can be turned off):

* ``attention``: the model's attention runs on ``dot_product_attention``, registered as
  ``attn_implementation="tokamax"`` (with transformers' sdpa masks): grouped key/value heads are
  read in place, never repeated. What it does not take (a sliding window, sinks, a position bias,
  dropout while training, a paged cache) runs on transformers' sdpa.
* ``experts``: every mixture-of-experts experts module that transformers dispatches through its
  ``ExpertsInterface`` (Qwen3-MoE, OLMoE, Mixtral, DeepSeek-V2, ...) runs on ``moe_experts``,
  registered as ``experts_implementation="tokamax"``. With ``pack_experts`` (the default) each
  module's weights are packed once, now, into the native kernels' layout. This costs a second
  copy of the expert weights and makes prefill fast (docs/moe.md). The pack is a snapshot: after
  changing the expert weights (loading other weights, a training step), revert and apply again.
  Without it the op reads the module's own weights in place.
* ``norm``: RMSNorm modules (``weight * x / rms(x)``, the Llama form) run on ``rms_norm``.
* ``linear`` (off by default): ``nn.Linear`` layers (attention projections, dense MLPs, the
  vocabulary projection) run on ``ragged_dot``'s transposed form when they see at most 4 rows
  (decode): the weights are read in place, once, as one sequential stream. Longer inputs stay on
  torch's GEMM. Off by default because torch's bf16 GEMV already reads at the memory's rate on
  the machines measured (docs/transformers.md), and each call adds the library's call overhead.

A module the library cannot serve is left as it is, with one warning naming it: a device other
than the CPU, a dtype other than f32/bf16, biases, an activation it lacks, Gemma's
``1 + weight`` norm. Whenever gradients are needed (training), an experts module runs transformers'
stock backend, because ``moe_experts`` has no backward yet. Nothing is downloaded: transformers is
an optional dependency (``pip install transformers``).
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import torch

import tokamax_cpp as tc
from tokamax_cpp import torch_ops

_EXPERTS = "tokamax"
# transformers' activation modules by class name -> the library's activation.
_ACTIVATIONS = {"SiLUActivation": "silu", "SiLU": "silu", "GELUActivation": "gelu",
                "GELUTanh": "gelu_tanh", "PytorchGELUTanh": "gelu_tanh",
                "NewGELUActivation": "gelu_tanh", "ReLU": "relu", "Sigmoid": "sigmoid"}
_STATE = "_tokamax_state"  # on a patched model: what revert_tokamax restores


def _warn(module_name: str, why: str) -> None:
    warnings.warn(f"tokamax: {module_name} left as transformers' own: {why}", stacklevel=3)


def _activation(module: torch.nn.Module) -> str | None:
    act = getattr(module, "act_fn", None)
    return _ACTIVATIONS.get(type(act).__name__) if act is not None else None


def _experts_unsupported(module: torch.nn.Module) -> str | None:
    """Why moe_experts cannot serve an experts module (None: it can)."""
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dn, torch.Tensor):
        return "no gate_up_proj / down_proj weights (a separate gate and up projection)"
    if gu.device.type != "cpu" or dn.device.type != "cpu":
        return f"weights on {gu.device}; the library runs on the CPU"
    if gu.dtype not in (torch.float32, torch.bfloat16) or dn.dtype != gu.dtype:
        return f"weights of dtype {gu.dtype} / {dn.dtype}; expected float32 or bfloat16"
    if getattr(module, "has_bias", False) or not getattr(module, "has_gate", True):
        return "biases or an ungated MLP"
    if getattr(module, "has_post_expert_norm", False):
        return "a norm after each expert"
    if not getattr(module, "is_concatenated", True):
        return "interleaved gate and up columns"
    if getattr(module, "_is_expert_parallel", False):
        return "expert parallelism"
    if _activation(module) is None:
        return f"activation {type(getattr(module, 'act_fn', None)).__name__}"
    return None


def _experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                     top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                     state: tuple | None = None) -> torch.Tensor:
    """The experts backend registered as experts_implementation="tokamax". `state` is
    (activation, packed weights or None); by default the one apply_tokamax left on the module."""
    if state is None:
        state = getattr(self, "_tokamax_experts", None)
    needs_grad = torch.is_grad_enabled() and (
        hidden_states.requires_grad or self.gate_up_proj.requires_grad
        or self.down_proj.requires_grad or top_k_weights.requires_grad)
    if state is None or needs_grad or hidden_states.device.type != "cpu":
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    activation, packed = state
    x = hidden_states.contiguous()
    if x.dtype not in (torch.float32, torch.bfloat16):
        x = x.to(self.gate_up_proj.dtype)
    weights = top_k_weights.contiguous()
    if packed is not None:
        out = tc.moe_experts_packed(x, top_k_index.contiguous(), weights, packed,
                                    activation=activation, heuristics_only=True)
    else:
        # transformers' is_transposed=False is [E, 2N, K]: our transposed_weights layout.
        out = torch.ops.tokamax.moe_experts(
            x, top_k_index.contiguous(), weights, self.gate_up_proj.detach(),
            self.down_proj.detach(), activation=activation,
            transposed_weights=not getattr(self, "is_transposed", False))
    return out.to(hidden_states.dtype)


def _register_experts() -> None:
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(_EXPERTS, _experts_forward)


_ATTENTION = "tokamax"


def _attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None,
                       dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """The attention registered as attn_implementation="tokamax": transformers' [B, N, T, H]
    heads on dot_product_attention ([B, T, N, H]; grouped keys and values read as they are,
    never repeated). What it does not take (dropout while training, a position bias, sinks,
    a sliding window, a paged cache, attention weights asked for, another device or dtype)
    runs on transformers' sdpa."""
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    unsupported = (
        (dropout > 0 and module.training) or kwargs.get("position_bias") is not None
        or kwargs.get("s_aux") is not None or kwargs.get("sliding_window") is not None
        or kwargs.get("cache") is not None or kwargs.get("output_attentions", False)
        or query.device.type != "cpu" or query.dtype not in (torch.float32, torch.bfloat16)
        or key.dtype != query.dtype or value.dtype != query.dtype
        or (attention_mask is None and causal and q_len > 1 and kv_len != q_len))
    if unsupported:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    options = dict(scale=scaling, logits_soft_cap=kwargs.get("softcap"), heuristics_only=True)
    if attention_mask is None:
        out = torch_ops.dot_product_attention(q, k, v, is_causal=causal and q_len > 1, **options)
    elif attention_mask.dtype == torch.bool:
        out = torch_ops.dot_product_attention(q, k, v, mask=attention_mask, **options)
    else:  # an additive mask (0 where attended, a large negative number elsewhere)
        out = torch_ops.dot_product_attention(q, k, v, bias=attention_mask.to(q.dtype), **options)
    return out, None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_ATTENTION, _attention_forward)
    # transformers' sdpa masks: bool, True where a query attends, None where causal suffices.
    AttentionMaskInterface.register(_ATTENTION, sdpa_mask)


def _norm_unsupported(module: torch.nn.Module) -> str | None:
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1:
        return "no 1-D weight"
    if "Gemma" in type(module).__name__:
        return "Gemma's (1 + weight) scale"
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return f"weight {w.dtype} on {w.device}"
    if _norm_epsilon(module) is None:
        return "no variance_epsilon / eps attribute"
    return None


def _norm_epsilon(module: torch.nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(module, name, None)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """Llama's RMSNorm (the statistics in f32, y in the input's dtype) on rms_norm."""
    x = hidden_states
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return self._tokamax_stock_forward(hidden_states)
    w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
    return torch_ops.rms_norm(x.contiguous(), w, epsilon=_norm_epsilon(self))


# Rows up to which a Linear runs on the library (ragged_dot's dotrows stream: the weights read
# once at the memory's rate); longer inputs are compute-bound GEMMs, torch's.
_LINEAR_ROWS = 4
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _linear_unsupported(module: torch.nn.Module) -> str | None:
    w = module.weight
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return f"weight {w.dtype} on {w.device}"
    if not w.is_contiguous():
        return "a strided weight"
    return None


def _linear_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear at decode: y = x W^T (+ b) with W [N, K] read in place by ragged_dot."""
    rows = x.numel() // x.shape[-1] if x.dim() > 0 and x.shape[-1] > 0 else 0
    w = self.weight
    if (rows == 0 or rows > _LINEAR_ROWS or x.dtype != w.dtype or x.device.type != "cpu"
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        return self._tokamax_stock_forward(x)
    y = tc.ragged_dot_general(x.reshape(rows, x.shape[-1]).contiguous(), w.detach().unsqueeze(0),
                              [rows], "transposed_rhs", heuristics_only=True,
                              preferred_element_type=_DTYPE_NAMES[x.dtype])
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], w.shape[0])


def _is_rms_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm")


def _is_experts(module: torch.nn.Module) -> bool:
    return hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and hasattr(
        module, "num_experts")


def _lazy_experts_state(self: torch.nn.Module, pack: bool) -> tuple | None:
    """(activation, packed weights) for a module of a patched class, made on its first call and
    made again whenever its weights change (a new tensor, or one written in place: loading
    weights after construction, an optimizer step); None where the library cannot serve it."""
    gu, dn = getattr(self, "gate_up_proj", None), getattr(self, "down_proj", None)
    key = tuple((t.data_ptr(), t._version, t.dtype, t.device.type, tuple(t.shape))
                if isinstance(t, torch.Tensor) else None for t in (gu, dn))
    cached = getattr(self, "_tokamax_lazy", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    why = _experts_unsupported(self)
    state = None
    if why:
        _warn(type(self).__name__, why)
    else:
        packed = None
        if pack:
            packed = tc.pack_moe_weights(gu.detach(), dn.detach(),
                                         transposed_weights=not getattr(self, "is_transposed",
                                                                        False))
        state = (_activation(self), packed)
    self._tokamax_lazy = (key, state)
    return state


# apply_tokamax_to: model type -> [(class, attribute, what it was)] to restore on revert.
_CLASS_PATCHES: dict[str, list[tuple[type, str, Any]]] = {}
_MISSING = object()


def _patch_class(patches: list, cls: type, name: str, value: Any) -> None:
    patches.append((cls, name, cls.__dict__.get(name, _MISSING)))
    setattr(cls, name, value)


def apply_tokamax_to(model_type: str, *, experts: bool = True, norm: bool = True,
                     pack_experts: bool = True) -> None:
    """Patches the module classes of a transformers model type ("qwen3_moe", "olmoe",
    "mixtral", "llama", ...) so that every model of that type, built before or after, runs on
    tokamax_cpp: call it before ``from_pretrained``. Its experts classes run on ``moe_experts``
    whatever ``experts_implementation`` the model was given, their weights packed on a module's
    first call and again whenever they change (loading, a training step); its RMSNorm classes
    run on ``rms_norm``. A module the library cannot serve keeps the stock code, with one
    warning. ``nn.Linear`` is shared by every model type and is not patched here (apply_tokamax
    on a loaded model does it). ``revert_tokamax(model_type)`` restores the classes."""
    import importlib

    if model_type in _CLASS_PATCHES:
        raise ValueError(f"apply_tokamax_to: {model_type!r} is already patched; "
                         f"revert_tokamax({model_type!r}) first")
    try:
        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ModuleNotFoundError as e:
        raise ValueError(f"apply_tokamax_to: transformers has no model type {model_type!r} "
                         f"(transformers.models.{model_type}.modeling_{model_type}: {e})") from e
    patches: list[tuple[type, str, Any]] = []
    for name, cls in sorted(vars(module).items()):
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)
                and cls.__module__ == module.__name__):
            continue
        # transformers' use_experts_implementation gives its experts classes _apply_gate.
        if experts and name.endswith("Experts") and hasattr(cls, "_apply_gate"):
            def experts_forward(self, hidden_states, top_k_index, top_k_weights,
                                *, _pack=pack_experts):
                return _experts_forward(self, hidden_states, top_k_index, top_k_weights,
                                        state=_lazy_experts_state(self, _pack))
            _patch_class(patches, cls, "forward", experts_forward)
        elif norm and name.endswith("RMSNorm"):
            def norm_forward(self, hidden_states):
                if _norm_unsupported(self) is not None:
                    return self._tokamax_stock_forward(hidden_states)
                return _norm_forward(self, hidden_states)
            _patch_class(patches, cls, "_tokamax_stock_forward", cls.forward)
            _patch_class(patches, cls, "forward", norm_forward)
    _CLASS_PATCHES[model_type] = patches


def _revert_classes(model_type: str) -> None:
    patches = _CLASS_PATCHES.pop(model_type, None)
    if patches is None:
        raise ValueError(f"revert_tokamax: model type {model_type!r} is not patched by "
                         "apply_tokamax_to")
    for cls, name, was in reversed(patches):
        if was is _MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, was)


def apply_tokamax(model: torch.nn.Module, *, attention: bool = True, experts: bool = True,
                  norm: bool = True, linear: bool = False,
                  pack_experts: bool = True) -> torch.nn.Module:
    """Patches a loaded transformers model in place to run on tokamax_cpp; returns it.

    A second call on the same model is refused with a ValueError: revert first."""
    if getattr(model, _STATE, None) is not None:
        raise ValueError("apply_tokamax: the model is already patched; revert_tokamax(model) "
                         "first")
    state: dict[str, Any] = {"experts": [], "norms": [], "linears": [], "config": None,
                             "attention": None}
    if attention and hasattr(model, "set_attn_implementation") and getattr(
            model.config, "_attn_implementation", None) is not None:
        if model._can_set_attn_implementation():
            _register_attention()
            state["attention"] = model.config._attn_implementation
            model.set_attn_implementation(_ATTENTION)
        else:
            _warn(type(model).__name__, "its attention is not dispatched through "
                  "transformers' AttentionInterface")

    def servable(is_kind, unsupported):
        """The modules of a kind the library serves; a warning for each one it cannot."""
        for name, m in model.named_modules():
            if not is_kind(m):
                continue
            why = unsupported(m)
            if why:
                _warn(name or type(m).__name__, why)
            else:
                yield m

    if experts and any(_is_experts(m) for m in model.modules()):
        _register_experts()
        for m in servable(_is_experts, _experts_unsupported):
            packed = None
            if pack_experts:
                packed = tc.pack_moe_weights(
                    m.gate_up_proj.detach(), m.down_proj.detach(),
                    transposed_weights=not getattr(m, "is_transposed", False))
            m._tokamax_experts = (_activation(m), packed)
            state["experts"].append(m)
        if state["experts"]:
            state["config"] = model.get_experts_implementation() if hasattr(
                model, "get_experts_implementation") else None
            model.set_experts_implementation(_EXPERTS)
    swaps = [(norm, "norms", _is_rms_norm, _norm_unsupported, _norm_forward),
             (linear, "linears", lambda m: type(m) is torch.nn.Linear, _linear_unsupported,
              _linear_forward)]
    for wanted, kind, is_kind, unsupported, forward in swaps:
        if not wanted:
            continue
        for m in servable(is_kind, unsupported):
            m._tokamax_stock_forward = m.forward
            m.forward = types.MethodType(forward, m)
            state[kind].append(m)
    setattr(model, _STATE, state)
    return model


def revert_tokamax(model: torch.nn.Module | str) -> torch.nn.Module | None:
    """Undoes apply_tokamax on a model (returned: it computes exactly what it did before it was
    patched), or apply_tokamax_to on a model type's classes (given its name)."""
    if isinstance(model, str):
        _revert_classes(model)
        return None
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("revert_tokamax: the model is not patched by apply_tokamax")
    for m in state["norms"] + state["linears"]:
        del m.forward  # the instance attribute; the class's forward again
        del m._tokamax_stock_forward
    for m in state["experts"]:
        del m._tokamax_experts
    if state["attention"] is not None:
        model.set_attn_implementation(state["attention"])
    if state["experts"]:
        previous = state["config"]
        if isinstance(previous, dict):
            previous = {k: v for k, v in previous.items() if v is not None}
        model.set_experts_implementation(previous or "grouped_mm")
    delattr(model, _STATE)
    return model


def patched_modules(model: torch.nn.Module) -> dict[str, int]:
    """How many modules apply_tokamax patched, by kind (0 each on an unpatched model)."""
    state = getattr(model, _STATE, None) or {"experts": [], "norms": [], "linears": [],
                                             "attention": None}
    counts = {k: len(state[k]) for k in ("experts", "norms", "linears")}
    counts["attention"] = int(state["attention"] is not None)
    return counts
