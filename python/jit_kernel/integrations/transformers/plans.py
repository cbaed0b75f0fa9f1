"""Plans: what a patched module's forward needs (its backend, merged weights, tables, hand-offs),
kept in the module's ``__dict__`` under :data:`_PLAN`, out of its parameters, buffers and children;
and the functions that read a module and return its plan, or why it cannot be patched."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .backends import Backend, _ops_for
from .fp8 import _Fp8Input
from .merging import _Merged, _static
from .reference import _torch_topk_softmax

_PLAN = "_jit_kernel_plan"
# RoPE types whose inverse frequencies are fixed at construction (the others change with the
# sequence length, which one cos/sin table cannot follow).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# config.hidden_act -> the gated activation op.
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
}


class _Chain:
    """The hand-off between consecutive decoder layers: ``normed`` is the next norm of ``src``,
    computed by the layer that returned ``src``; ``quantized`` its fp8 form (q, s) where the next
    layer's q/k/v projections are fp8 linear layers."""

    __slots__ = ("normed", "quantized", "src")

    def __init__(self) -> None:
        self.src: torch.Tensor | None = None
        self.normed: torch.Tensor | None = None
        self.quantized: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclasses.dataclass(eq=False)
class _NormPlan:
    backend: Backend
    chain: _Chain | None = None  # the final norm: takes the last layer's hand-off


@dataclasses.dataclass(eq=False)
class _MLPPlan:
    backend: Backend
    act: str
    gate_up: _Merged
    original: Callable[..., Any]
    fp8: bool = False  # fp8 projections: gate/up one fp8 GEMM, the activation quantised for down_proj
    handed: _Fp8Input | None = None  # the decoder layer's hand-off (fp8)


@dataclasses.dataclass(eq=False)
class _RotaryPlan:
    backend: Backend
    inv_freq: torch.Tensor  # fp32, on the CPU
    scaling: float
    max_positions: int
    original: Callable[..., Any]
    table: torch.Tensor | None = None

    def cos_sin_cache(self, device: torch.device) -> torch.Tensor:
        """``[max_positions, rotary_dim]`` fp32: ``cos(p * inv_freq) * scaling`` then the sines."""
        table = self.table
        if table is None or table.device != device:
            freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), self.inv_freq)
            table = torch.cat((freqs.cos(), freqs.sin()), -1) * self.scaling
            self.table = table = _static(table.to(device))
        return table


@dataclasses.dataclass(eq=False)
class _AttentionPlan:
    backend: Backend
    head_dim: int
    q_heads: int
    kv_heads: int
    qkv: _Merged | None
    fp8: bool  # fp8 projections: merged into one fp8 GEMM, or called as modules (their patched forwards)
    handed: _Fp8Input | None  # the decoder layer's hand-off (fp8)
    qk_norm: tuple[nn.Module, nn.Module] | None  # fused into the rotation
    separate_qk_norm: bool  # the layer's own q_norm / k_norm modules, then the rotation
    eager_attention: Callable[..., Any]
    attention_kwargs: dict[str, Any]
    original: Callable[..., Any]


@dataclasses.dataclass(eq=False)
class _RouterPlan:
    backend: Backend
    top_k: int
    renormalize: bool
    # What the router returns first: its logits, or (in transformers releases whose router reused
    # the name) their fp32 softmax; its routing weights have that output's dtype.
    returns_probabilities: bool
    original: Callable[..., Any]


@dataclasses.dataclass(eq=False)
class _LayerPlan:
    backend: Backend
    chain: _Chain
    first: bool
    previous: nn.Module | None  # the layer whose output this one takes
    next_norm: nn.Module
    collector: Any
    original: Callable[..., Any]
    # fp8 linear layers: the hand-off to this layer's (None: none), and whether the norm before the
    # q/k/v projections, before gate/up, and the next layer's input norm quantise for them
    fp8: _Fp8Input | None = None
    attn_fp8: bool = False
    mlp_fp8: bool = False
    next_fp8: bool = False


@dataclasses.dataclass(eq=False)
class _LinearPlan:
    backend: Backend
    original: Callable[..., Any]


@dataclasses.dataclass(eq=False)
class _Fp8LinearPlan:
    backend: Backend
    handed: _Fp8Input | None  # its decoder layer's hand-off (None: outside the decoder layers)
    original: Callable[..., Any]


# ---------------------------------------------------------------------------------------------
# Reading a model: its parts, and each part's plan or why it stays the model's


def _plain_linear(module: object) -> bool:
    """An ``nn.Linear`` layer (no subclass) with floating-point weights on a real device and no hooks:
    one a patched forward may call as ``F.linear`` or merge."""
    return (
        type(module) is nn.Linear
        and module.weight.is_floating_point()  # type: ignore[attr-defined]
        and module.weight.device.type != "meta"  # type: ignore[attr-defined]
        and not hasattr(module, "_hf_hook")
    )


def _is_rmsnorm(module: nn.Module) -> bool:
    """A transformers RMSNorm layer: marked for the ``kernels`` hub as ``RMSNorm`` (when ``kernels``
    is installed, transformers' decorator sets ``kernel_layer_name``), or one of the supported
    families' RMSNorm classes; with a ``[D]`` weight and a float ``variance_epsilon``."""
    cls = type(module)
    hub = getattr(cls, "kernel_layer_name", None) == "RMSNorm"
    known = cls.__name__ in ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm")
    weight = getattr(module, "weight", None)
    return (
        (hub or known)
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def _base_model(model: nn.Module) -> nn.Module | None:
    """The decoder stack (``layers``, ``norm``, ``rotary_emb``) of ``model`` or of its base model."""
    for candidate in (model, getattr(model, "base_model", None), getattr(model, "model", None)):
        if candidate is not None and all(hasattr(candidate, a) for a in ("layers", "norm", "rotary_emb")):
            return candidate
    return None


def _rope_parameters(rotary: nn.Module, config: Any) -> tuple[torch.Tensor, float, str] | str:
    """(inverse frequencies in fp32, attention scaling, rope type), or why the rotary module is not
    supported. The frequencies are computed again from the config in fp32 (the module's buffer is
    cast with the model by ``.to(dtype)``)."""
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        return f"rope_type {rope_type!r} (its frequencies change with the sequence length)"
    inv_freq = None
    try:
        if rope_type == "default" and hasattr(type(rotary), "compute_default_rope_parameters"):
            inv_freq, scaling = type(rotary).compute_default_rope_parameters(config)
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    except Exception:  # a transformers without these functions: the module's own buffer
        inv_freq = None
    if inv_freq is None:
        inv_freq, scaling = rotary.inv_freq, getattr(rotary, "attention_scaling", 1.0)
    inv_freq = inv_freq.detach().to("cpu", torch.float32)
    if inv_freq.shape != rotary.inv_freq.shape:
        return "rotary frequencies that do not match the model's"
    return inv_freq, float(scaling), rope_type


def _attention_plan(
    attn: nn.Module,
    backend: Backend,
    rotary_dim: int,
    merge_qkv: bool,
    qk_norm: bool,
    fp8: set[nn.Module],
    handed: _Fp8Input | None,
) -> _AttentionPlan | str:
    """The attention layer's plan, or why it is not supported. ``fp8``: the fp8 linear layers
    patched (projections all among them run as fp8 GEMMs); ``handed``: its decoder layer's hand-off."""
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "layer_idx", "config")
    missing = [name for name in needed if not hasattr(attn, name)]
    if missing:
        return f"{type(attn).__name__} without {', '.join(missing)}"
    projections = [getattr(attn, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    fp8_projections = all(p in fp8 for p in projections)
    if not (fp8_projections or all(_plain_linear(p) for p in projections)):
        return f"{type(attn).__name__} with projections that are not plain nn.Linear or patched fp8 layers"
    d = attn.head_dim
    if d % 2 or rotary_dim > d:
        return f"head_dim {d} with rotary dim {rotary_dim}"
    has_qk_norm = hasattr(attn, "q_norm") or hasattr(attn, "k_norm")
    if has_qk_norm and not (_is_rmsnorm(attn.q_norm) and _is_rmsnorm(attn.k_norm)):
        return f"{type(attn).__name__} with q/k norms that are not RMSNorm layers"
    module = sys.modules.get(type(attn).__module__)
    eager = getattr(module, "eager_attention_forward", None)
    if eager is None:
        return f"{type(attn).__name__}: no eager_attention_forward in {type(attn).__module__}"
    # The sliding window the family's attention passes to the attention function.
    if hasattr(attn, "sliding_window"):
        attention_kwargs = {"sliding_window": attn.sliding_window}
    elif getattr(attn.config, "model_type", None) == "mistral":
        attention_kwargs = {"sliding_window": getattr(attn.config, "sliding_window", None)}
    else:
        attention_kwargs = {}
    merged = _Merged([attn.q_proj, attn.k_proj, attn.v_proj]) if merge_qkv else None
    return _AttentionPlan(
        backend=backend,
        head_dim=d,
        q_heads=attn.q_proj.out_features // d,
        kv_heads=attn.k_proj.out_features // d,
        qkv=merged,
        fp8=fp8_projections,
        handed=handed if fp8_projections else None,
        qk_norm=(attn.q_norm, attn.k_norm) if has_qk_norm and qk_norm else None,
        separate_qk_norm=has_qk_norm and not qk_norm,
        eager_attention=eager,
        attention_kwargs=attention_kwargs,
        original=type(attn).forward,
    )


def _mlp_act(mlp: nn.Module, config: Any, fp8: set[nn.Module]) -> str | None:
    """The gated MLP's activation op, or None where its projections are not plain nn.Linear layers
    (or all patched fp8 ones, ``fp8``) or its activation has no gated op."""
    projections = [getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
    if not (all(p in fp8 for p in projections) or all(_plain_linear(p) for p in projections)):
        return None
    return ACTIVATIONS.get(getattr(getattr(mlp, "config", config), "hidden_act", None))


def _router_plan(gate: nn.Module, backend: Backend, num_experts: int) -> _RouterPlan | str:
    """The plan of a Qwen3-MoE router module (``weight [E, hidden]``, ``top_k``, ``norm_topk_prob``),
    or why it is not supported. The router's own forward runs once on four random rows: it must
    return a softmax top-k of ``weight @ x`` (renormalised as ``norm_topk_prob`` says) with int64
    ids, and its first output tells whether it returns the logits or their fp32 softmax
    (transformers releases differ), and with it the dtype of its routing weights. The backend's
    ``topk_softmax`` runs on the same rows, so that a shape it rejects is skipped here, with its
    message, rather than failing in a forward."""
    name = type(gate).__name__
    weight = getattr(gate, "weight", None)
    top_k, renormalize = getattr(gate, "top_k", None), getattr(gate, "norm_topk_prob", None)
    if not (isinstance(weight, nn.Parameter) and weight.dim() == 2 and weight.is_floating_point()):
        return f"{name} without a [num_experts, hidden] weight"
    if type(top_k) is not int or type(renormalize) is not bool or getattr(gate, "bias", None) is not None:
        return f"{name} without an int top_k and a bool norm_topk_prob, or with a bias"
    if weight.shape[0] != num_experts or not 1 <= top_k <= num_experts:
        return f"{name} of {weight.shape[0]} experts, top-{top_k}, in a model of {num_experts} experts"
    if weight.device.type == "meta" or hasattr(gate, "_hf_hook"):
        return f"{name} with weights on the meta device or behind hooks"
    original = type(gate).forward
    rows = torch.randn(4, weight.shape[1], generator=torch.Generator().manual_seed(0))
    rows = rows.to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            out = original(gate, rows)
        except Exception as error:  # a router this integration does not know
            return f"{name} failed on probe rows ({type(error).__name__}: {error})"
        logits = F.linear(rows, weight)
        expected_weights, expected_ids = _torch_topk_softmax(logits, top_k, renormalize)
        try:
            _ops_for(backend, logits).topk_softmax(logits, top_k, renormalize)  # type: ignore[misc]
        except (ValueError, TypeError) as error:  # the op's own rules (C++ checks them)
            return f"topk_softmax of {backend.name} rejects {num_experts} experts, top-{top_k}: {error}"
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
        return f"{name} does not return (logits, weights, ids)"
    first, weights, ids = out
    if first.dtype == logits.dtype and torch.equal(first, logits):
        returns_probabilities = False
    elif first.dtype == torch.float32 and torch.allclose(first, F.softmax(logits, dim=-1, dtype=torch.float32)):
        returns_probabilities = True
    else:
        return f"{name} whose first output is neither its logits nor their softmax"
    if ids.dtype != torch.int64 or not torch.equal(ids, expected_ids.long()) or weights.dtype != first.dtype:
        return f"{name} whose routing is not a softmax top-{top_k} with int64 ids"
    expected = expected_weights.to(first.dtype).float()
    if not torch.allclose(weights.float(), expected, rtol=torch.finfo(first.dtype).eps, atol=0):
        return f"{name} whose weights are not the softmax top-{top_k} with norm_topk_prob={renormalize}"
    return _RouterPlan(backend, top_k, renormalize, returns_probabilities, original)
