""":func:`apply`: one step per part of the model, each binding the patched forwards of its modules
with their plans and recording in :class:`Patched` what it changed and what it skipped."""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from .backends import Backend, get_backend
from .forwards import (
    _attention_forward,
    _capture_collector,
    _decoder_layer_forward,
    _final_norm_forward,
    _fp8_linear_forward,
    _linear_forward,
    _mlp_forward,
    _rotary_forward,
    _router_forward,
)
from .fp8 import _fp8_gemm_check, _fp8_linear_unsupported, _Fp8Input, _is_fp8_linear
from .hub import JitKernelRMSNorm
from .merging import _merge_on_apply, _Merged
from .plans import (
    _PLAN,
    _attention_plan,
    _base_model,
    _Chain,
    _Fp8LinearPlan,
    _is_rmsnorm,
    _LayerPlan,
    _LinearPlan,
    _mlp_act,
    _MLPPlan,
    _NormPlan,
    _plain_linear,
    _rope_parameters,
    _RotaryPlan,
    _router_plan,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")
# Model types whose mixture-of-experts router is a softmax top-k (the ``router`` part).
ROUTER_MODEL_TYPES = ("qwen3_moe",)


@dataclasses.dataclass
class Patched:
    """What :func:`apply` changed: the number of modules per part, and what it skipped and why."""

    rmsnorm: int = 0
    fused_add_rmsnorm: int = 0
    mlp: int = 0
    qkv: int = 0
    rope: int = 0
    qk_norm: int = 0
    router: int = 0
    fp8: int = 0
    lm_head: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return any(
            (
                self.rmsnorm,
                self.fused_add_rmsnorm,
                self.mlp,
                self.qkv,
                self.rope,
                self.qk_norm,
                self.router,
                self.fp8,
                self.lm_head,
            )
        )


@dataclasses.dataclass(eq=False)
class _Target:
    """The model :func:`apply` patches, and what its steps share."""

    model: nn.Module
    base: nn.Module  # the decoder stack: layers, norm, rotary_emb
    device: torch.device
    backend: Backend
    report: Patched
    layers: list[nn.Module] = dataclasses.field(init=False)
    # Per decoder layer: the hand-off of its norms' quantised outputs to its fp8 linear layers.
    handoffs: dict[nn.Module, _Fp8Input] = dataclasses.field(init=False)
    # The fp8 linear layers patched: the attention and MLP steps run projections among them as fp8 GEMMs.
    fp8_linears: set[nn.Module] = dataclasses.field(default_factory=set)

    def __post_init__(self) -> None:
        self.layers = list(self.base.layers)
        self.handoffs = {layer: _Fp8Input() for layer in self.layers}

    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    def skip(self, parts: str, why: str) -> None:
        self.report.skipped.append(f"{parts}: {why}")

    def all_fp8(self, module: nn.Module, names: Sequence[str]) -> bool:
        """Whether ``module``'s projections ``names`` are all patched fp8 linear layers."""
        return all(getattr(module, name, None) in self.fp8_linears for name in names)


def apply(
    model: nn.Module,
    *,
    rmsnorm: bool = True,
    fused_add_rmsnorm: bool = True,
    mlp: bool = True,
    qkv: bool = True,
    rope: bool = True,
    qk_norm: bool = True,
    router: bool = True,
    fp8: bool = True,
    lm_head: bool = True,
    backend: str | Backend = "jit_kernel",
) -> Patched:
    """Make ``model`` (a transformers Llama, Mistral, Qwen2, Qwen3 or Qwen3-MoE model, any head)
    run on jit_kernel's ops, in place; returns what was patched.

    Options switch parts off: ``rmsnorm`` (RMSNorm layers), ``fused_add_rmsnorm`` (residual adds
    fused into the norms, across layer boundaries), ``mlp`` (gate/up as one GEMM + fused gated
    activation), ``qkv`` (q/k/v projections as one GEMM; with ``rope``), ``rope`` (rotary embedding
    from a cos/sin table), ``qk_norm`` (Qwen3's q/k norm fused into the rotation; with ``rope``),
    ``router`` (Qwen3-MoE's router: softmax top-k in one ``topk_softmax``; not with FlashInfer's ops),
    ``fp8`` (transformers' fine-grained fp8 linear layers: the input quantised by 1 x 128 groups, by
    the norm before them in the same launch where there is one, then jit_kernel's ``decode_linear_fp8``
    for up to 16 rows and ``torch._scaled_mm`` above; not with
    FlashInfer's ops), ``lm_head`` (the output head, a plain ``nn.Linear``, on the backend's
    ``linear``). Every linear layer the patched forwards call runs the backend's ``linear``:
    jit_kernel's is ``decode_linear`` for up to 16 rows of bf16/fp16 (the op sends the shapes its
    kernel does not serve to cuBLAS) and ``F.linear`` above; a one-token step's attention runs as
    the backend's ``one_token_attention`` says (:data:`~.backends.ONE_TOKEN_ATTENTION`).
    ``backend``: ``"jit_kernel"``, ``"flashinfer"`` (its ops in the same places, for comparison),
    ``"torch"`` (reference ops in torch, on any device) or a :class:`Backend`. A model whose
    parameters are not on a CUDA device (with a CUDA backend), or of another model type, is left
    unchanged; parts whose config is not supported are skipped; either way one warning names what
    was skipped. Applying twice changes nothing the second time."""
    ops = backend if isinstance(backend, Backend) else get_backend(backend)
    report = Patched()
    base, device = _base_model(model), _model_device(model)
    if base is not None and _already_applied(model):
        return report
    reason = _why_model_unsupported(model, base, device, ops)
    if reason is not None:
        report.skipped.append(f"everything: {reason}")
        _warn(report)
        return report
    assert base is not None and device is not None  # _why_model_unsupported names either missing
    target = _Target(model, base, device, ops, report)
    # fp8 linear layers first: the attention and MLP steps run projections among them as fp8 GEMMs.
    if fp8:
        _patch_fp8_linears(target)
    if lm_head:
        _patch_lm_head(target)
    if rope:
        _patch_rope_and_attention(target, qkv, qk_norm)
    if mlp:
        _patch_mlps(target)
    if router:
        _patch_routers(target)
    if fused_add_rmsnorm:
        _patch_decoder_layers(target)
    if rmsnorm:  # last: the norms no other step took
        _patch_rmsnorms(target)
    _warn(report)
    return report


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


def _already_applied(model: nn.Module) -> bool:
    return any(_PLAN in m.__dict__ for m in model.modules())


def _why_model_unsupported(
    model: nn.Module, base: nn.Module | None, device: torch.device | None, backend: Backend
) -> str | None:
    """Why :func:`apply` leaves the whole model as it is, or None."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    if base is None:
        return f"{type(model).__name__} has no decoder stack (layers, norm, rotary_emb)"
    if any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "the model is dispatched by accelerate (device_map): its hooks wrap the forwards"
    if device is None or (backend.cuda_only and device.type != "cuda"):
        return f"the model is on {device}, and the {backend.name} backend runs on CUDA devices"
    return None


def _patch_fp8_linears(target: _Target) -> None:
    """transformers' fp8 linear layers on the backend's group quantisation and fp8 GEMMs (:func:`._fp8_gemm`),
    where :func:`_fp8_linear_unsupported` finds nothing against the layer and the GEMM gives right
    products on its weight's shape (checked once per shape, on the model's device)."""
    found = [(name, m) for name, m in target.model.named_modules() if _is_fp8_linear(m)]
    ops, report = target.backend, target.report
    if not found:
        return
    if any(op is None for op in (ops.group_quant, ops.rmsnorm_group_quant, ops.fused_add_rmsnorm_group_quant)):
        target.skip("fp8", f"the {ops.name} backend has no fp8 group quantisation")
        return
    owner = {m: target.handoffs[layer] for layer in target.layers for m in layer.modules() if _is_fp8_linear(m)}
    reasons = []
    checked: dict[tuple[int, ...], str | None] = {}  # GEMM shape -> why it is wrong, or None
    for name, module in found:
        why = _fp8_linear_unsupported(module)
        if why is None:
            shape = tuple(module.weight.shape)
            if shape not in checked:
                with torch.no_grad():
                    checked[shape] = _fp8_gemm_check(module.weight, module.weight_scale_inv, ops)
            why = checked[shape]
        if why is not None:
            reasons.append(f"{name}: {why}")
            continue
        _bind(module, _fp8_linear_forward, _Fp8LinearPlan(ops, owner.get(module), type(module).forward))
        target.fp8_linears.add(module)
        report.fp8 += 1
    if reasons:
        target.skip("fp8", f"{len(reasons)} of {len(found)} fp8 linear layers ({reasons[0]})")


def _patch_lm_head(target: _Target) -> None:
    """The output head (``get_output_embeddings()``) on the backend's ``linear``, where it is a plain
    ``nn.Linear`` layer (a tied head too: the weight is the embedding's, read the same way)."""
    get_head = getattr(target.model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        return  # a base model: no head
    if not _plain_linear(head):
        target.skip("lm_head", f"{type(head).__name__} is not a plain nn.Linear layer")
        return
    _bind(head, _linear_forward, _LinearPlan(target.backend, type(head).forward))
    target.report.lm_head += 1


def _patch_rope_and_attention(target: _Target, merge_qkv: bool, qk_norm: bool) -> None:
    """RoPE from one cos/sin table, with q/k/v as one GEMM (``merge_qkv``) and Qwen3's q/k norm fused
    into the rotation (``qk_norm``). The patched rotary module returns the table and the positions
    instead of per-token cos/sin, which only patched attention layers take: every attention layer is
    patched, or none (the first reason is reported)."""
    table = _cos_sin_table_parameters(target.base)
    if isinstance(table, str):
        target.skip("rope, qkv, qk_norm", table)
        return
    inv_freq, scaling, max_positions = table
    rotary_dim = 2 * inv_freq.numel()
    why = _why_attention_unsupported(target, rotary_dim, qk_norm)
    if why is not None:
        target.skip("rope, qkv, qk_norm", why)
        return
    for layer in target.layers:
        _patch_attention(target, layer, rotary_dim, merge_qkv, qk_norm)
    _patch_rotary(target, inv_freq, scaling, max_positions)


def _cos_sin_table_parameters(base: nn.Module) -> tuple[torch.Tensor, float, int] | str:
    """(inverse frequencies, attention scaling, rows) of the model's cos/sin table, or why there is none."""
    params = _rope_parameters(base.rotary_emb, base.config)
    if isinstance(params, str):
        return params
    max_positions = int(getattr(base.config, "max_position_embeddings", 0) or 0)
    if max_positions <= 0:
        return "no max_position_embeddings in the config (the size of the cos/sin table)"
    inv_freq, scaling, _ = params
    return inv_freq, scaling, max_positions


def _why_attention_unsupported(target: _Target, rotary_dim: int, qk_norm: bool) -> str | None:
    """Why an attention layer cannot be patched (the first found), or None. The plans are built without
    merging q/k/v, so that no layer's weights move unless every layer can be patched."""
    for layer in target.layers:
        plan = _attention_plan(layer.self_attn, target.backend, rotary_dim, False, qk_norm, target.fp8_linears, None)
        if isinstance(plan, str):
            return plan
    return None


def _patch_attention(target: _Target, layer: nn.Module, rotary_dim: int, merge_qkv: bool, qk_norm: bool) -> None:
    """One attention layer on its plan, its q/k/v merged into one weight where the plan says so."""
    attn, report = layer.self_attn, target.report
    handed = target.handoffs[layer]
    plan = _attention_plan(attn, target.backend, rotary_dim, merge_qkv, qk_norm, target.fp8_linears, handed)
    assert not isinstance(plan, str)  # _why_attention_unsupported found nothing against it
    _bind(attn, _attention_forward, plan)
    if plan.qkv is not None:
        _merge_on_apply(attn, [plan.qkv])
        report.qkv += 1
    report.qk_norm += plan.qk_norm is not None
    report.rope += 1


def _patch_rotary(target: _Target, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
    """The rotary module returns the cos/sin table, built now on the model's device, and the positions."""
    rotary = target.base.rotary_emb
    plan = _RotaryPlan(target.backend, inv_freq, scaling, max_positions, type(rotary).forward)
    plan.cos_sin_cache(target.device)  # built here, not in a forward (traced, or captured)
    _bind(rotary, _rotary_forward, plan)


def _patch_mlps(target: _Target) -> None:
    """Each gated MLP: gate and up as one GEMM (an fp8 one where its three projections are patched fp8
    layers), then the backend's gated activation."""
    skipped = 0
    for layer in target.layers:
        mlp = layer.mlp
        if not (hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj")):
            continue  # not a gated MLP (a mixture-of-experts block)
        fp8_mlp = target.all_fp8(mlp, ("gate_proj", "up_proj", "down_proj"))
        act = _mlp_act(mlp, target.config, target.fp8_linears if fp8_mlp else set())
        if act is None:
            skipped += 1
            continue
        merged = _Merged([mlp.gate_proj, mlp.up_proj])
        handed = target.handoffs[layer] if fp8_mlp else None
        _bind(mlp, _mlp_forward, _MLPPlan(target.backend, act, merged, type(mlp).forward, fp8_mlp, handed))
        _merge_on_apply(mlp, [merged])
        target.report.mlp += 1
    if skipped:
        hidden_act = getattr(target.config, "hidden_act", None)
        target.skip(
            "mlp",
            f"{skipped} of {len(target.layers)} layers (projections that are not plain nn.Linear layers, "
            f"or hidden_act {hidden_act!r})",
        )


def _patch_routers(target: _Target) -> None:
    """Each softmax top-k router (Qwen3-MoE's) on the backend's ``topk_softmax``, where it has one."""
    config, ops = target.config, target.backend
    if getattr(config, "model_type", None) not in ROUTER_MODEL_TYPES or ops.topk_softmax is None:
        return
    reasons = []
    num_experts = int(getattr(config, "num_experts", 0) or 0)
    for layer in target.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(layer.mlp, "experts"):
            continue  # a dense MLP layer
        plan = _router_plan(gate, ops, num_experts) if isinstance(gate, nn.Module) else "no router module"
        if isinstance(plan, str):
            reasons.append(plan)
            continue
        _bind(gate, _router_forward, plan)
        target.report.router += 1
    if reasons:
        target.skip("router", f"{len(reasons)} of {len(target.layers)} layers ({reasons[0]})")


def _patch_decoder_layers(target: _Target) -> None:
    """Each decoder layer's residual adds fused into the norms after them, the last into the next
    layer's input norm (the final norm for the last layer), handed off through one chain; a norm that
    feeds fp8 projections quantises for them in the same launch."""
    layers, base, ops = target.layers, target.base, target.backend
    norms = [getattr(layer, name, None) for layer in layers for name in ("input_layernorm", "post_attention_layernorm")]
    if not layers or not all(_is_rmsnorm(norm) for norm in [*norms, base.norm]):
        target.skip("fused_add_rmsnorm", "decoder layers without RMSNorm input and post-attention norms")
        return
    chain, collector = _Chain(), _capture_collector()
    attn_fp8 = [target.all_fp8(layer.self_attn, ("q_proj", "k_proj", "v_proj")) for layer in layers]
    for i, layer in enumerate(layers):
        last = i + 1 == len(layers)
        next_norm = base.norm if last else layers[i + 1].input_layernorm
        plan = _LayerPlan(ops, chain, i == 0, layers[i - 1] if i else None, next_norm, collector, type(layer).forward)
        plan.attn_fp8 = attn_fp8[i]
        plan.mlp_fp8 = target.all_fp8(layer.mlp, ("gate_proj", "up_proj"))
        plan.next_fp8 = not last and attn_fp8[i + 1]
        if plan.attn_fp8 or plan.mlp_fp8:
            plan.fp8 = target.handoffs[layer]
        _bind(layer, _decoder_layer_forward, plan)
        target.report.fused_add_rmsnorm += 1
    _bind(base.norm, _final_norm_forward, _NormPlan(ops, chain))


def _patch_rmsnorms(target: _Target) -> None:
    """Every RMSNorm layer no other step patched (q/k norms included) on :class:`JitKernelRMSNorm`'s
    forward, rebound as ``kernels.kernelize`` rebinds it."""
    for module in target.base.modules():
        if _is_rmsnorm(module) and _PLAN not in module.__dict__:
            _bind(module, JitKernelRMSNorm.forward, _NormPlan(target.backend))
            target.report.rmsnorm += 1


def _bind(module: nn.Module, fn: Callable[..., Any], plan: object | None) -> None:
    """``module.forward`` (this instance's) becomes ``fn``, with ``plan`` kept in its ``__dict__``."""
    if plan is not None:
        module.__dict__[_PLAN] = plan
    module.forward = types.MethodType(fn, module)  # type: ignore[method-assign]


def _warn(report: Patched) -> None:
    """One warning naming what :func:`apply` skipped, attributed to apply's caller (``stacklevel=3``)."""
    if report.skipped:
        warnings.warn("jit_kernel.integrations.transformers.apply skipped " + "; ".join(report.skipped), stacklevel=3)


def patched_modules(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """The modules of ``model`` whose forward :func:`apply` replaced, with their names."""
    for name, module in model.named_modules():
        if _PLAN in module.__dict__:
            yield name, module
