"""Hugging Face transformers models on jit_kernel's ops, in one call::

    import jit_kernel.integrations.transformers as jk_transformers

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda()
    jk_transformers.apply(model)          # Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE

What changes, per part (each one an option of :func:`apply`):

- ``rmsnorm``: every RMSNorm layer runs ``rmsnorm``. transformers marks these layers for the
  ``kernels`` package (``@use_kernel_forward_from_hub("RMSNorm")``); the replacement is a layer class
  that follows that package's contract (stateless, the same ``forward`` signature), installed the
  way ``kernels.kernelize`` installs one, and offered to ``kernels`` users too (:func:`kernel_mapping`).
- ``fused_add_rmsnorm``: each decoder layer adds its residuals and normalises in ``fused_add_rmsnorm``
  calls, the MLP's residual add fused with the next layer's input norm (the last layer's with the
  final norm). A layer never writes into a tensor the model returns: it writes into its own input
  only when that input is the previous layer's output and nothing records it (no forward hook other
  than transformers' output capture, and that one not collecting).
- ``mlp``: gate and up projections run as one GEMM on one ``[2 * intermediate, hidden]`` weight, then
  ``silu_and_mul`` (``gelu_tanh_and_mul`` / ``gelu_and_mul`` for GELU MLPs). The two ``nn.Parameter``
  objects stay (same names, same values): their data is moved into the halves of that one tensor.
- ``qkv``: q, k and v projections as one GEMM, the same way.
- ``rope``: rotary embedding through ``apply_rope_with_cos_sin_cache_inplace`` with positions and a
  ``[max_position_embeddings, rotary_dim]`` fp32 cos/sin table built once from the model's RoPE
  parameters (default, linear, Llama-3 and YaRN scaling; partial rotary). The model's rotary module
  then returns that table and the token positions instead of per-token cos/sin.
- ``qk_norm``: Qwen3's per-head q/k RMSNorm and the rotation in one ``fused_qknorm_rope`` call.
- ``router``: Qwen3-MoE's router (softmax over the experts, top-k, renormalised with the config's
  ``norm_topk_prob``) in one ``topk_softmax`` call after its GEMM; it returns what transformers'
  router returns (the same expert ids, as int64; the weights in transformers' dtype).
- ``fp8``: transformers' fine-grained fp8 linear layers (``FP8Linear``: 128 x 128 weight blocks,
  dynamic activation scales, as ``FineGrainedFP8Config`` loads them) run as ``torch._scaled_mm`` on
  the input quantised by 1 x 128 groups (``per_token_group_quant_fp8``); where a decoder layer's norm
  feeds them (q/k/v, gate/up), the norm quantises in the same launch
  (``fused_add_rmsnorm_per_token_group_quant_fp8``) and hands q and scales to the projections.

The patched forwards run jit_kernel's ops on CUDA tensors with autograd off (``torch.no_grad()`` or
``torch.inference_mode()``, as ``generate()`` runs); with autograd on they run the model's own
forwards, and on tensors of other devices the torch reference ops (``backend="torch"``) of the same
computation. ``state_dict()`` keeps its keys and values, and a model on CPU, or a part whose config
is not supported, is left as it is with one warning naming what was skipped.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BACKENDS",
    "SUPPORTED_MODEL_TYPES",
    "Backend",
    "JitKernelRMSNorm",
    "Patched",
    "apply",
    "get_backend",
    "kernel_mapping",
]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")
# Model types whose mixture-of-experts router is a softmax top-k (the ``router`` part).
ROUTER_MODEL_TYPES = ("qwen3_moe",)
BACKENDS = ("jit_kernel", "flashinfer", "torch")
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
_PLAN = "_jit_kernel_plan"
# Fine-grained fp8: 1 x 128 activation groups against 128 x 128 weight blocks (DeepSeek-V3's recipe,
# transformers' FineGrainedFP8Config default).
FP8_BLOCK = 128
FP8_E4M3_MAX = 448.0
# torch._scaled_mm's blockwise path on sm_90 (cuBLAS) rejects row counts that are not multiples of
# 4: activations are quantised into buffers of whole multiples, the padding rows' products dropped.
FP8_ROW_ALIGN = 4
# ... and returns wrong products, without an error, where in_features / 128 (the weight scales'
# row length) is not a multiple of 4 (on the H100: 2816 and 1152 wrong, 1024 and 3072 right).
# out_features are taken in whole 128-row blocks only (the shapes measured right there).
FP8_IN_ALIGN = 4 * FP8_BLOCK


# ---------------------------------------------------------------------------------------------
# Backends: the five computations the patched forwards call


@dataclasses.dataclass(frozen=True)
class Backend:
    """The ops a patched model calls. ``rmsnorm(x, w, eps) -> Tensor`` (rows of ``x``);
    ``fused_add_rmsnorm(x, residual, w, eps)`` in place (``residual += x``, ``x = rmsnorm(residual)``);
    ``act_and_mul[name](x) -> Tensor`` for ``name`` in silu, gelu_tanh, gelu;
    ``rope(positions, q, k, head_dim, cos_sin_cache, is_neox)`` and
    ``qknorm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps, is_neox)`` in place on
    ``q [tokens, heads, head_dim]`` and ``k``; ``topk_softmax(logits, topk, renormalize) ->
    (weights float32 [T, topk], ids int32 [T, topk])``, or None where the backend has no such op
    (the router then stays the model's). The fp8 ops quantise ``[T, D]`` rows by groups of 128
    elements into given buffers (``q`` fp8 ``[T, D]``, ``s`` float32 scales ``[T, D / 128]``,
    column-major): ``group_quant(x, q, s)``; ``rmsnorm_group_quant(x, w, eps, q, s) -> normed``
    (the norm's output quantised, and returned); ``fused_add_rmsnorm_group_quant(x, residual, w, eps,
    q, s) -> normed`` (``residual += x`` in place first; ``x`` may be overwritten by the result);
    ``silu_and_mul_group_quant(x [T, 2 * I], q, s)`` (``act_and_mul["silu"]``, then quantised); None
    where the backend has none (fp8 linear layers then stay the model's; without the last, an fp8
    MLP quantises the activation's output in a launch of its own). ``cuda_only``: the ops take CUDA
    tensors only."""

    name: str
    cuda_only: bool
    rmsnorm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    fused_add_rmsnorm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], None]
    act_and_mul: dict[str, Callable[[torch.Tensor], torch.Tensor]]
    rope: Callable[..., None]
    qknorm_rope: Callable[..., None]
    topk_softmax: Callable[[torch.Tensor, int, bool], tuple[torch.Tensor, torch.Tensor]] | None = None
    group_quant: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object] | None = None
    rmsnorm_group_quant: Callable[..., torch.Tensor] | None = None
    fused_add_rmsnorm_group_quant: Callable[..., torch.Tensor] | None = None
    silu_and_mul_group_quant: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object] | None = None


def _torch_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _torch_fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    residual.copy_(x.float() + residual.float())
    x.copy_(_torch_rmsnorm(residual, weight, eps))


def _torch_gated(act: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def gated(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return (act(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)

    return gated


def _torch_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> None:
    """Rotate the first ``2 * cos.shape[-1]`` elements of every head of ``x [N, H, D]`` in place."""
    half = cos.shape[-1]
    if is_neox:
        a, b = x[..., :half], x[..., half : 2 * half]
    else:
        a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
    af, bf = a.float(), b.float()
    rotated_a, rotated_b = af * cos - bf * sin, bf * cos + af * sin  # both before either is written
    a.copy_(rotated_a)
    b.copy_(rotated_b)


def _torch_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    head_dim: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    rows = cos_sin_cache.index_select(0, positions).float()
    half = rows.shape[-1] // 2
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    for x in (q, k):
        _torch_rotate(x.unflatten(-1, (-1, head_dim)) if x.dim() == 2 else x, cos, sin, is_neox)


def _torch_qknorm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    eps: float = 1e-6,
    is_neox: bool = True,
) -> None:
    q.copy_(_torch_rmsnorm(q, q_weight, eps))
    k.copy_(_torch_rmsnorm(k, k_weight, eps))
    _torch_rope(positions, q, k, q.shape[-1], cos_sin_cache, is_neox)


def _torch_topk_softmax(logits: torch.Tensor, topk: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's own computation: top-k of the fp32 softmax, divided by their sum with
    ``renormalize``; ids as int32, as ``jit_kernel.topk_softmax`` returns them."""
    weights, ids = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float32), topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def _torch_group_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    """``per_token_group_quant_fp8``'s computation: ``s = max(absmax(group), 1e-10) / 448``,
    ``q = fp8(x * (1 / s))``."""
    rows, d = x.shape
    groups = x.float().view(rows, d // FP8_BLOCK, FP8_BLOCK)
    scale = groups.abs().amax(-1).clamp(min=1e-10) / FP8_E4M3_MAX
    scaled = (groups * (1.0 / scale)[..., None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    q.copy_(scaled.view(rows, d).to(torch.float8_e4m3fn))
    s.copy_(scale)


def _torch_rmsnorm_group_quant(
    x: torch.Tensor, weight: torch.Tensor, eps: float, q: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    normed = _torch_rmsnorm(x, weight, eps)
    _torch_group_quant(normed, q, s)
    return normed


def _torch_fused_add_rmsnorm_group_quant(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, q: torch.Tensor, s: torch.Tensor
) -> torch.Tensor:
    residual.copy_(x.float() + residual.float())
    return _torch_rmsnorm_group_quant(residual, weight, eps, q, s)


def _torch_silu_and_mul_group_quant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> None:
    _torch_group_quant(_torch_gated(F.silu)(x), q, s)


TORCH = Backend(
    name="torch",
    cuda_only=False,
    rmsnorm=_torch_rmsnorm,
    fused_add_rmsnorm=_torch_fused_add_rmsnorm,
    act_and_mul={
        "silu": _torch_gated(F.silu),
        "gelu_tanh": _torch_gated(lambda x: F.gelu(x, approximate="tanh")),
        "gelu": _torch_gated(F.gelu),
    },
    rope=_torch_rope,
    qknorm_rope=_torch_qknorm_rope,
    topk_softmax=_torch_topk_softmax,
    group_quant=_torch_group_quant,
    rmsnorm_group_quant=_torch_rmsnorm_group_quant,
    fused_add_rmsnorm_group_quant=_torch_fused_add_rmsnorm_group_quant,
    silu_and_mul_group_quant=_torch_silu_and_mul_group_quant,
)


def _jit_kernel_backend() -> Backend:
    import jit_kernel

    def rope(positions, q, k, head_dim, cache, is_neox=True):  # type: ignore[no-untyped-def]
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_dim, cache, is_neox)

    def rmsnorm_group_quant(x, w, eps, q, s):  # type: ignore[no-untyped-def]
        normed = torch.empty_like(x)
        jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, FP8_BLOCK, eps, output_q=q, output_s=s, normed_out=normed)
        return normed

    def fused_add_rmsnorm_group_quant(x, residual, w, eps, q, s):  # type: ignore[no-untyped-def]
        normed = torch.empty_like(x)
        jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
            x, residual, w, FP8_BLOCK, eps, output_q=q, output_s=s, normed_out=normed
        )
        return normed

    return Backend(
        name="jit_kernel",
        cuda_only=True,
        rmsnorm=jit_kernel.rmsnorm,
        fused_add_rmsnorm=jit_kernel.fused_add_rmsnorm,
        act_and_mul={
            "silu": jit_kernel.silu_and_mul,
            "gelu_tanh": jit_kernel.gelu_tanh_and_mul,
            "gelu": jit_kernel.gelu_and_mul,
        },
        rope=rope,
        qknorm_rope=jit_kernel.fused_qknorm_rope,
        topk_softmax=jit_kernel.topk_softmax,
        group_quant=lambda x, q, s: jit_kernel.per_token_group_quant_fp8(x, FP8_BLOCK, output_q=q, output_s=s),
        rmsnorm_group_quant=rmsnorm_group_quant,
        fused_add_rmsnorm_group_quant=fused_add_rmsnorm_group_quant,
        silu_and_mul_group_quant=lambda x, q, s: jit_kernel.silu_and_mul_per_token_group_quant_fp8(
            x, FP8_BLOCK, output_q=q, output_s=s
        ),
    )


def _flashinfer_backend() -> Backend:
    """FlashInfer's norm, activation and RoPE ops in the same places. FlashInfer has no fused q/k
    norm + RoPE: its ``rmsnorm`` normalises the heads (a copy where q/k are not contiguous rows),
    then its RoPE rotates them. It has no softmax top-k either: the router stays the model's."""
    from flashinfer import activation as fi_act
    from flashinfer import norm as fi_norm
    from flashinfer import rope as fi_rope

    def rope(positions, q, k, head_dim, cache, is_neox=True):  # type: ignore[no-untyped-def]
        q2 = q.flatten(-2) if q.dim() == 3 else q
        k2 = k.flatten(-2) if k.dim() == 3 else k
        fi_rope.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, head_dim, cache, is_neox)

    def qknorm_rope(q, k, q_weight, k_weight, positions, cache, eps=1e-6, is_neox=True):  # type: ignore[no-untyped-def]
        d = q.shape[-1]
        for x, w in ((q, q_weight), (k, k_weight)):
            x.copy_(fi_norm.rmsnorm(x.reshape(-1, d), w, eps).view(x.shape))
        rope(positions, q, k, d, cache, is_neox)

    return Backend(
        name="flashinfer",
        cuda_only=True,
        rmsnorm=lambda x, w, eps: fi_norm.rmsnorm(x, w, eps),
        fused_add_rmsnorm=lambda x, r, w, eps: fi_norm.fused_add_rmsnorm(x, r, w, eps),
        act_and_mul={
            "silu": fi_act.silu_and_mul,
            "gelu_tanh": fi_act.gelu_tanh_and_mul,
            "gelu": fi_act.gelu_and_mul,
        },
        rope=rope,
        qknorm_rope=qknorm_rope,
    )


def get_backend(name: str) -> Backend:
    """The backend ``name`` (one of :data:`BACKENDS`); ``flashinfer`` imports FlashInfer."""
    if name == "jit_kernel":
        return _jit_kernel_backend()
    if name == "flashinfer":
        return _flashinfer_backend()
    if name == "torch":
        return TORCH
    raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {name!r}")


def _ops_for(backend: Backend, x: torch.Tensor) -> Backend:
    """The backend for a call on ``x``: the torch reference where ``backend`` needs CUDA and ``x``
    is elsewhere."""
    return backend if (x.is_cuda or not backend.cuda_only) else TORCH


_DEFAULT_BACKEND: list[Backend] = []


def _default_backend() -> Backend:
    if not _DEFAULT_BACKEND:
        _DEFAULT_BACKEND.append(_jit_kernel_backend())
    return _DEFAULT_BACKEND[0]


# ---------------------------------------------------------------------------------------------
# RMSNorm: a layer in the ``kernels`` package's contract


class JitKernelRMSNorm(nn.Module):
    """The forward of an RMSNorm layer (``weight [D]``, ``variance_epsilon``) on ``rmsnorm``.

    Stateless, with the forward signature of transformers' RMSNorm layers, so that it is a valid
    replacement layer for ``kernels.kernelize`` (:func:`kernel_mapping`); :func:`apply` installs it
    the same way (the instance's ``forward`` rebound). With autograd on, it runs the layer's own
    forward. The norm is computed in fp32 and rounded once (transformers rounds the normalised
    value to the dtype before the weight multiply, so results differ by at most about one ulp)."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return type(self).forward(self, hidden_states)
        plan = self.__dict__.get(_PLAN)
        ops = _ops_for(_default_backend() if plan is None else plan.backend, hidden_states)
        d = hidden_states.shape[-1]
        out = ops.rmsnorm(hidden_states.reshape(-1, d), self.weight, self.variance_epsilon)
        return out.view(hidden_states.shape)


class _LayerRepository:
    """A ``kernels`` repository (``load()`` returns the layer class) for a layer of this package."""

    def __init__(self, layer: type[nn.Module]) -> None:
        self.layer = layer
        self.layer_name = layer.__name__

    def load(self) -> type[nn.Module]:
        return self.layer

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LayerRepository) and other.layer is self.layer

    def __hash__(self) -> int:
        return hash(self.layer)

    def __str__(self) -> str:
        return f"jit_kernel layer `{self.layer_name}`"


def kernel_mapping(device: str = "cuda") -> dict[str, Any]:
    """A mapping for the ``kernels`` package: transformers' ``RMSNorm`` layers to
    :class:`JitKernelRMSNorm`. Use it where a project already kernelizes::

        from kernels import Mode, kernelize, use_kernel_mapping
        with use_kernel_mapping(kernel_mapping()):
            kernelize(model, mode=Mode.INFERENCE, device="cuda")

    That covers the norms only; :func:`apply` also does the parts no hub layer covers."""
    from kernels import Mode

    return {"RMSNorm": {device: {Mode.INFERENCE | Mode.TORCH_COMPILE: _LayerRepository(JitKernelRMSNorm)}}}


# ---------------------------------------------------------------------------------------------
# Linear layers merged into one weight, parameters kept


class _Merged:
    """Several ``nn.Linear`` layers of one input as one GEMM. Their weights (and biases) are moved
    into consecutive rows of one tensor and each ``nn.Parameter`` keeps its identity, name and
    values, its data now a view of that tensor: ``state_dict()`` is unchanged, ``load_state_dict``
    writes through to the merged tensor, and ``save_pretrained`` clones the disjoint views. A move
    of the module (``.to()``, ``.half()``) merges again; in eager mode each call checks that the
    parameters still view the merged tensor (``load_state_dict(assign=True)`` replaces them) and
    merges again where they do not. fp8 linear layers' 128 x 128 block scales (``weight_scale_inv``,
    whole blocks of rows) are merged the same way, into ``scale``."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = list(linears)
        self.weight = torch.empty(0)
        self.bias: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self.merge()

    def merge(self) -> None:
        with torch.no_grad():
            self.weight = self._merge([lin.weight for lin in self.linears])
            biases = [lin.bias for lin in self.linears]
            self.bias = None if biases[0] is None else self._merge(biases)  # type: ignore[arg-type]
            scales = [getattr(lin, "weight_scale_inv", None) for lin in self.linears]
            self.scale = None if scales[0] is None else self._merge(scales)  # type: ignore[arg-type]

    @staticmethod
    def _merge(params: Sequence[torch.Tensor]) -> torch.Tensor:
        merged = _static(torch.cat([p.detach() for p in params], 0))
        row = 0
        for p in params:
            n = p.shape[0]
            p.data = merged[row : row + n]
            row += n
        return merged

    def intact(self) -> bool:
        """Every parameter is still its slice of the merged tensors (a host-side check)."""
        for merged, name in ((self.weight, "weight"), (self.bias, "bias"), (self.scale, "weight_scale_inv")):
            if merged is None:
                continue
            row, step = 0, merged.stride(0) * merged.element_size()
            for lin in self.linears:
                p = getattr(lin, name, None)
                if p is None or p.dtype != merged.dtype or p.data_ptr() != merged.data_ptr() + row * step:
                    return False
                row += p.shape[0]
        return True

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not torch.compiler.is_compiling() and not self.intact():
            self.merge()
        return self.weight, self.bias


def _static(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a tensor the patched forwards read (not a parameter or buffer) as having a fixed
    address, so that torch.compile's CUDA graphs read it in place rather than copying it in."""
    torch._dynamo.mark_static_address(tensor)
    return tensor


def _merge_on_apply(module: nn.Module, merged: Sequence[_Merged]) -> None:
    """After ``module._apply`` (``.to()``, ``.cuda()``, ``.half()``: new tensors for every parameter),
    merge its linear layers again."""

    def _apply(self: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> nn.Module:
        result = type(self)._apply(self, fn, *args, **kwargs)
        for m in merged:
            m.merge()
        return result

    module._apply = types.MethodType(_apply, module)  # type: ignore[method-assign]


def _plain_linear(module: object) -> bool:
    return (
        type(module) is nn.Linear
        and module.weight.is_floating_point()  # type: ignore[attr-defined]
        and module.weight.device.type != "meta"  # type: ignore[attr-defined]
        and not hasattr(module, "_hf_hook")
    )


# ---------------------------------------------------------------------------------------------
# Fine-grained fp8 linear layers: jit_kernel's group quant, then torch._scaled_mm


class _Fp8Input:
    """An activation quantised for the fp8 linear layers it is handed to: ``src`` (the tensor the
    layers are called with), ``q [P, K]`` fp8 and ``s [P, K / 128]`` its column-major scales, ``P``
    its rows padded to :data:`FP8_ROW_ALIGN`. A decoder layer sets it around the calls whose input
    its norm quantised in the same launch, and clears it after."""

    __slots__ = ("q", "s", "src")

    def __init__(self) -> None:
        self.src: torch.Tensor | None = None
        self.q: torch.Tensor | None = None
        self.s: torch.Tensor | None = None

    def hand(self, src: torch.Tensor | None, quantized: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.src = src
        self.q, self.s = quantized if quantized is not None else (None, None)


def _fp8_buffers(rows: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [P, d]`` fp8 and column-major scales ``[P, d / 128]`` (the transpose of a contiguous
    ``[d / 128, P]``), ``P`` = ``rows`` rounded up to :data:`FP8_ROW_ALIGN`; the ops write the first
    ``rows`` rows."""
    padded = -(-rows // FP8_ROW_ALIGN) * FP8_ROW_ALIGN
    q = torch.empty(padded, d, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(d // FP8_BLOCK, padded, dtype=torch.float32, device=device).t()
    return q, s


def _norm_quant(
    op: Callable[..., object], x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``norm`` of the rows ``x [T, D]`` (``residual += x`` first when given) by the backend's
    ``rmsnorm_group_quant`` / ``fused_add_rmsnorm_group_quant`` ``op``: (normed ``[T, D]``, (q, s))."""
    rows, d = x.shape
    q, s = _fp8_buffers(rows, d, x.device)
    if residual is None:
        normed = op(x, norm.weight, norm.variance_epsilon, q[:rows], s[:rows])
    else:
        normed = op(x, residual, norm.weight, norm.variance_epsilon, q[:rows], s[:rows])
    return normed, (q, s)  # type: ignore[return-value]


def _dequantize(values: torch.Tensor, scales: torch.Tensor, block_rows: int) -> torch.Tensor:
    """fp32 ``values [R, K]`` times their scales, one per ``block_rows x 128`` block."""
    rows, cols = values.shape
    expanded = scales.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return values.float() * expanded


def _fp8_gemm(
    activation: tuple[torch.Tensor, torch.Tensor, int],
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``[rows, N]`` in ``dtype``: the quantised activation ``(q, s, rows)`` (:func:`_fp8_input`)
    times an fp8 weight ``[N, K]`` with its 128 x 128 block scales, plus the bias. On CUDA one
    ``torch._scaled_mm`` (blockwise 1 x 128 by 128 x 128, fp32 accumulation); elsewhere the same
    product of the dequantised operands in fp32."""
    q, s, rows = activation
    if q.is_cuda:
        out = torch._scaled_mm(q, weight.t(), scale_a=s, scale_b=weight_scale.t(), out_dtype=dtype)[:rows]
    else:
        a = _dequantize(q[:rows], s[:rows], 1)
        out = (a @ _dequantize(weight, weight_scale, FP8_BLOCK).t()).to(dtype)
    return out if bias is None else out + bias


def _fp8_input(x: torch.Tensor, handed: _Fp8Input | None, backend: Backend) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``x [..., K]`` quantised by 1 x 128 groups as ``(q, s, rows)`` (:func:`_fp8_buffers`): the
    decoder layer's hand-off where ``x`` is the tensor its norm quantised, else by ``group_quant``."""
    k = x.shape[-1]
    rows = x.numel() // k
    if handed is not None and handed.src is x and handed.q is not None and handed.s is not None:
        return handed.q, handed.s, rows
    q, s = _fp8_buffers(rows, k, x.device)
    _ops_for(backend, x).group_quant(x.reshape(rows, k), q[:rows], s[:rows])  # type: ignore[misc]
    return q, s, rows


@dataclasses.dataclass(eq=False)
class _Fp8LinearPlan:
    backend: Backend
    handed: _Fp8Input | None  # its decoder layer's hand-off (None: outside the decoder layers)
    original: Callable[..., Any]


def _fp8_linear_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """transformers' ``FP8Linear`` (128 x 128 weight blocks, dynamic activation scales): the input
    quantised by 1 x 128 groups (or taken as its decoder layer's norm quantised it), then
    :func:`_fp8_gemm`."""
    plan: _Fp8LinearPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, input)
    if input.numel() == 0:
        return input.new_empty((*input.shape[:-1], self.weight.shape[0]))
    activation = _fp8_input(input, plan.handed, plan.backend)
    out = _fp8_gemm(activation, self.weight, self.weight_scale_inv, self.bias, input.dtype)
    return out.view(*input.shape[:-1], out.shape[-1])


def _fp8_linear_unsupported(module: nn.Module) -> str | None:
    """Why transformers' fp8 linear layer ``module`` cannot run on :func:`_fp8_gemm`, or None."""
    weight, scale = getattr(module, "weight", None), getattr(module, "weight_scale_inv", None)
    if not (isinstance(weight, torch.Tensor) and isinstance(scale, torch.Tensor)) or weight.dim() != 2:
        return f"{type(module).__name__} without an [N, K] weight and weight_scale_inv"
    if weight.dtype != torch.float8_e4m3fn or scale.dtype != torch.float32:
        return f"fp8 weights of {weight.dtype} with {scale.dtype} scales (float8_e4m3fn with float32 scales run)"
    if tuple(getattr(module, "block_size", None) or ()) != (FP8_BLOCK, FP8_BLOCK):
        return f"weight blocks {getattr(module, 'block_size', None)} (128 x 128 run)"
    if getattr(module, "activation_scale", None) is not None:
        return "static activation scales (dynamic ones run)"
    n, k = weight.shape
    if k % FP8_IN_ALIGN or n % FP8_BLOCK or scale.shape != (n // FP8_BLOCK, k // FP8_BLOCK):
        return (
            f"an fp8 weight of {n} x {k} (torch._scaled_mm's blockwise GEMM: in_features in multiples of 512, "
            "out_features of 128)"
        )
    if weight.device.type == "meta" or hasattr(module, "_hf_hook"):
        return "fp8 weights on the meta device or behind hooks"
    return None


def _fp8_gemm_check(weight: torch.Tensor, scale: torch.Tensor, backend: Backend) -> str | None:
    """Why :func:`_fp8_gemm` cannot serve this weight's shape on its device, or None: it raises, or
    its product with 4 random quantised rows differs from the dequantised product in the first and
    last 128 output features (``torch._scaled_mm`` has returned wrong products, without an error,
    for shapes it accepts)."""
    n, k = weight.shape
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(0)).to(weight.device, torch.bfloat16)
    q, s = _fp8_buffers(4, k, weight.device)
    try:
        _ops_for(backend, x).group_quant(x, q[:4], s[:4])  # type: ignore[misc]
        got = _fp8_gemm((q, s, 4), weight, scale, None, torch.float32)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
        first = str(error).splitlines()[0] if str(error) else ""
        return f"the fp8 GEMM fails on {n} x {k} ({type(error).__name__}: {first})"
    a = _dequantize(q[:4], s[:4], 1)
    for block in sorted({0, n // FP8_BLOCK - 1}):
        rows = slice(block * FP8_BLOCK, (block + 1) * FP8_BLOCK)
        expected = a @ _dequantize(weight[rows], scale[block : block + 1], FP8_BLOCK).t()
        if (got[:, rows] - expected).abs().max() > 1e-2 * expected.abs().max():
            return f"torch._scaled_mm's products on {n} x {k} differ from the dequantised ones"
    return None


def _is_fp8_linear(module: object) -> bool:
    """transformers' fine-grained fp8 linear layer (``FP8Linear``, its subclasses excluded)."""
    cls = type(module)
    return cls.__name__ == "FP8Linear" and cls.__module__.endswith("finegrained_fp8")


# ---------------------------------------------------------------------------------------------
# Who sees a module's output


def _capture_collector() -> Any:
    """transformers' output-capture context variable (``output_hidden_states`` and friends), or None
    where this transformers has none (then any forward hook counts as an observer)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


def _observed(module: nn.Module, collector: Any) -> bool:
    """Whether something may hold ``module``'s output after it returns: a global forward hook, a
    forward hook of the module other than transformers' output capture, or that capture collecting."""
    if nn.modules.module._global_forward_hooks:
        return True
    hooks = module._forward_hooks
    if not hooks:
        return False
    for hook in hooks.values():
        if getattr(hook, "__name__", None) != "output_capturing_hook":
            return True
    # The capture hooks record only while a forward collects something (the collector is then a
    # non-empty dict); without the collector to ask, any hook may record.
    return collector is None or bool(collector.get())


# ---------------------------------------------------------------------------------------------
# Plans: what a patched module needs, kept out of the module's parameters, buffers and children


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


# ---------------------------------------------------------------------------------------------
# The patched forwards (bound to instances: ``module.forward = MethodType(fn, module)``)


def _final_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The model's last norm: the last decoder layer has computed it where it handed it off."""
    if torch.is_grad_enabled():
        return type(self).forward(self, hidden_states)
    plan: _NormPlan = self.__dict__[_PLAN]
    chain = plan.chain
    if chain is not None and chain.src is hidden_states and chain.normed is not None:
        out = chain.normed
        chain.src = chain.normed = None
        return out
    ops = _ops_for(plan.backend, hidden_states)
    d = hidden_states.shape[-1]
    return ops.rmsnorm(hidden_states.reshape(-1, d), self.weight, self.variance_epsilon).view(hidden_states.shape)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    plan: _MLPPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, x)
    ops = _ops_for(plan.backend, x)
    weight, bias = plan.gate_up.tensors()
    shape = x.shape
    down = self.down_proj
    if plan.fp8:
        gate_up = _fp8_gemm(_fp8_input(x, plan.handed, plan.backend), weight, plan.gate_up.scale, bias, x.dtype)  # type: ignore[arg-type]
        rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
        q, s = _fp8_buffers(rows, inner, x.device)
        if plan.act == "silu" and ops.silu_and_mul_group_quant is not None:
            ops.silu_and_mul_group_quant(gate_up, q[:rows], s[:rows])
        else:
            ops.group_quant(ops.act_and_mul[plan.act](gate_up), q[:rows], s[:rows])  # type: ignore[misc]
        out = _fp8_gemm((q, s, rows), down.weight, down.weight_scale_inv, down.bias, x.dtype)
    else:
        gate_up = F.linear(x.reshape(-1, shape[-1]), weight, bias)
        out = F.linear(ops.act_and_mul[plan.act](gate_up), down.weight, down.bias)
    return out.view(*shape[:-1], out.shape[-1])


def _rotary_forward(self: nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Instead of per-token cos/sin: the cos/sin table and the position of every token ``[B * S]``,
    which the patched attention layers take."""
    plan: _RotaryPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, x, position_ids)
    positions = position_ids.expand(x.shape[0], x.shape[1]).reshape(-1)
    return plan.cos_sin_cache(x.device), positions


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    plan: _AttentionPlan = self.__dict__[_PLAN]
    if args or torch.is_grad_enabled():
        return plan.original(self, hidden_states, position_embeddings, attention_mask, *args, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ops = _ops_for(plan.backend, hidden_states)
    cos_sin_cache, positions = position_embeddings  # type: ignore[misc]
    input_shape = hidden_states.shape[:-1]
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    d, hq, hk = plan.head_dim, plan.q_heads, plan.kv_heads
    if plan.qkv is not None:
        weight, bias = plan.qkv.tensors()
        if plan.fp8:  # quantised as the tensor the layer was given: the one its norm quantised
            activation = _fp8_input(hidden_states, plan.handed, plan.backend)
            qkv = _fp8_gemm(activation, weight, plan.qkv.scale, bias, x.dtype)  # type: ignore[arg-type]
        else:
            qkv = F.linear(x, weight, bias)
        q, k, v = qkv.split((hq * d, hk * d, hk * d), -1)
    elif plan.fp8:  # called on the tensor the layer was given: the one its norm quantised
        q, k, v = (p(hidden_states).reshape(x.shape[0], -1) for p in (self.q_proj, self.k_proj, self.v_proj))
    else:
        q = F.linear(x, self.q_proj.weight, self.q_proj.bias)
        k = F.linear(x, self.k_proj.weight, self.k_proj.bias)
        v = F.linear(x, self.v_proj.weight, self.v_proj.bias)
    q, k = q.unflatten(-1, (hq, d)), k.unflatten(-1, (hk, d))
    if plan.qk_norm is not None:
        q_norm, k_norm = plan.qk_norm
        ops.qknorm_rope(q, k, q_norm.weight, k_norm.weight, positions, cos_sin_cache, q_norm.variance_epsilon, True)
    else:
        if plan.separate_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        ops.rope(positions, q, k, d, cos_sin_cache, True)
    query = q.view(*input_shape, hq, d).transpose(1, 2)
    key = k.view(*input_shape, hk, d).transpose(1, 2)
    value = v.view(*input_shape, hk, d).transpose(1, 2)
    cache = kwargs.pop("cache", None)
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    if _decode_packs_heads(self, query, attention_mask, hq, hk):
        out, weights = _packed_decode_attention(query, key, value, attention_mask, self.scaling, hq // hk), None
    else:
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, plan.eager_attention)
        out, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **plan.attention_kwargs,
            **kwargs,
        )
    o = self.o_proj
    out = out.reshape(x.shape[0], -1)
    out = o(out) if plan.fp8 else F.linear(out, o.weight, o.bias)
    return out.view(*input_shape, out.shape[-1]), weights


def _router_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' top-k softmax router: the logits' GEMM, then one ``topk_softmax``. Returns what
    the router returns: (its first output, the routing weights in that output's dtype, int64 ids)."""
    plan: _RouterPlan = self.__dict__[_PLAN]
    ops = _ops_for(plan.backend, hidden_states)
    if torch.is_grad_enabled() or ops.topk_softmax is None:
        return plan.original(self, hidden_states)
    logits = F.linear(hidden_states.reshape(-1, hidden_states.shape[-1]), self.weight)
    weights, ids = ops.topk_softmax(logits, plan.top_k, plan.renormalize)
    first = F.softmax(logits, dim=-1, dtype=torch.float32) if plan.returns_probabilities else logits
    return first, weights.to(first.dtype), ids.to(torch.int64)


def _decode_packs_heads(
    module: nn.Module, query: torch.Tensor, mask: torch.Tensor | None, q_heads: int, kv_heads: int
) -> bool:
    """Whether a decode step's SDPA attention runs on the KV heads with the query heads packed as
    rows (one query token, grouped KV heads, a mask shared by the heads, no dropout): transformers'
    sdpa path otherwise copies every KV head ``q_heads // kv_heads`` times (``repeat_kv``), the
    step's largest memory traffic after the weights."""
    return (
        q_heads > kv_heads
        and query.shape[2] == 1
        and module.config._attn_implementation == "sdpa"
        and not module.training
        and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1))
    )


def _packed_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float, groups: int
) -> torch.Tensor:
    """SDPA of one query token per sequence, ``query [B, Hq, 1, D]`` seen as ``[B, Hkv, groups, D]``
    (query head h reads KV head h // groups, as repeat_kv pairs them): the same products and
    softmax per row, without expanding the KV heads. Returns ``[B, 1, Hq, D]`` as transformers'
    attention functions do."""
    b, hq, _, d = query.shape
    packed = query.reshape(b, hq // groups, groups, d)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scale)
    return out.reshape(b, hq, 1, out.shape[-1]).transpose(1, 2).contiguous()


def _decoder_layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """residual + attention(norm) + mlp(norm), the adds fused into the norms after them; the last
    norm of this layer is the next layer's input norm, handed off through the chain. A norm whose
    output feeds fp8 linear layers quantises it in the same launch and hands it to them."""
    plan: _LayerPlan = self.__dict__[_PLAN]
    if args or torch.is_grad_enabled():
        return plan.original(self, hidden_states, *args, **kwargs)
    ops = _ops_for(plan.backend, hidden_states)
    chain, x, fp8 = plan.chain, hidden_states, plan.fp8
    shape, d = x.shape, x.shape[-1]
    handed, quantized = None, None
    if not plan.first and chain.src is x:
        handed, quantized = chain.normed, chain.quantized
    chain.src = chain.normed = chain.quantized = None
    in_norm, post_norm = self.input_layernorm, self.post_attention_layernorm
    if handed is None:
        if plan.attn_fp8:
            normed, quantized = _norm_quant(ops.rmsnorm_group_quant, x.reshape(-1, d), in_norm)  # type: ignore[arg-type]
            handed = normed.view(shape)
        else:
            handed = ops.rmsnorm(x.reshape(-1, d), in_norm.weight, in_norm.variance_epsilon).view(shape)
        own_input = False
    else:
        # x is the previous layer's output: this layer may add into it unless someone records it.
        own_input = plan.previous is not None and not _observed(plan.previous, plan.collector)
    if fp8 is not None:
        fp8.hand(handed, quantized)
    attn, _ = self.self_attn(hidden_states=handed, **kwargs)
    if not attn.is_contiguous():  # written in place below through a [tokens, hidden] view
        attn = attn.contiguous()
    quantized = None
    if own_input and not _observed(self.self_attn, plan.collector):
        h = x
        if plan.mlp_fp8:
            op = ops.fused_add_rmsnorm_group_quant
            normed, quantized = _norm_quant(op, attn.view(-1, d), post_norm, h.view(-1, d))  # type: ignore[arg-type]
            normed = normed.view(shape)
        else:
            ops.fused_add_rmsnorm(attn.view(-1, d), h.view(-1, d), post_norm.weight, post_norm.variance_epsilon)
            normed = attn
    else:
        h = x + attn
        if plan.mlp_fp8:
            normed, quantized = _norm_quant(ops.rmsnorm_group_quant, h.view(-1, d), post_norm)  # type: ignore[arg-type]
            normed = normed.view(shape)
        else:
            normed = ops.rmsnorm(h.view(-1, d), post_norm.weight, post_norm.variance_epsilon).view(shape)
    if fp8 is not None:
        fp8.hand(normed, quantized)
    mlp_out = self.mlp(normed)
    if fp8 is not None:
        fp8.hand(None, None)
    if _observed(self.mlp, plan.collector):
        return h + mlp_out
    if not mlp_out.is_contiguous():
        mlp_out = mlp_out.contiguous()
    nxt = plan.next_norm
    if plan.next_fp8:
        op = ops.fused_add_rmsnorm_group_quant
        normed, quantized = _norm_quant(op, mlp_out.view(-1, d), nxt, h.view(-1, d))  # type: ignore[arg-type]
        chain.src, chain.normed, chain.quantized = h, normed.view(shape), quantized
    else:
        ops.fused_add_rmsnorm(mlp_out.view(-1, d), h.view(-1, d), nxt.weight, nxt.variance_epsilon)
        chain.src, chain.normed = h, mlp_out
    return h


# ---------------------------------------------------------------------------------------------
# apply()


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
    skipped: list[str] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return any(
            (self.rmsnorm, self.fused_add_rmsnorm, self.mlp, self.qkv, self.rope, self.qk_norm, self.router, self.fp8)
        )


def _bind(module: nn.Module, fn: Callable[..., Any], plan: object | None) -> None:
    if plan is not None:
        module.__dict__[_PLAN] = plan
    module.forward = types.MethodType(fn, module)  # type: ignore[method-assign]


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


def _model_device(model: nn.Module) -> torch.device | None:
    for p in model.parameters():
        return p.device
    return None


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
    the norm before them in the same launch where there is one, then ``torch._scaled_mm``; not with
    FlashInfer's ops).
    ``backend``: ``"jit_kernel"``, ``"flashinfer"`` (its ops in the same places, for comparison),
    ``"torch"`` (reference ops in torch, on any device) or a :class:`Backend`. A model whose
    parameters are not on a CUDA device (with a CUDA backend), or of another model type, is left
    unchanged; parts whose config is not supported are skipped; either way one warning names what
    was skipped. Applying twice changes nothing the second time."""
    report = Patched()
    ops = backend if isinstance(backend, Backend) else get_backend(backend)
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    base = _base_model(model)
    device = _model_device(model)
    if base is not None and any(_PLAN in m.__dict__ for m in base.modules()):
        return report  # already applied
    reason = None
    if model_type not in SUPPORTED_MODEL_TYPES:
        reason = f"model type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
    elif base is None:
        reason = f"{type(model).__name__} has no decoder stack (layers, norm, rotary_emb)"
    elif any(hasattr(m, "_hf_hook") for m in model.modules()):
        reason = "the model is dispatched by accelerate (device_map): its hooks wrap the forwards"
    elif device is None or (ops.cuda_only and device.type != "cuda"):
        reason = f"the model is on {device}, and the {ops.name} backend runs on CUDA devices"
    if reason is not None:
        report.skipped.append(f"everything: {reason}")
        _warn(report)
        return report
    assert base is not None
    layers = list(base.layers)

    # fp8 linear layers first: attention layers whose projections are among them call them as modules.
    fp8_linears: set[nn.Module] = set()
    handoffs = {layer: _Fp8Input() for layer in layers}
    if fp8:
        found = [(name, m) for name, m in model.named_modules() if _is_fp8_linear(m)]
        fp8_ops = (ops.group_quant, ops.rmsnorm_group_quant, ops.fused_add_rmsnorm_group_quant)
        if found and any(op is None for op in fp8_ops):
            report.skipped.append(f"fp8: the {ops.name} backend has no fp8 group quantisation")
        elif found:
            owner = {m: handoffs[layer] for layer in layers for m in layer.modules() if _is_fp8_linear(m)}
            reasons = []
            checked: dict[tuple[int, int], str | None] = {}  # GEMM shape -> why it is wrong, or None
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
                fp8_linears.add(module)
                report.fp8 += 1
            if reasons:
                report.skipped.append(f"fp8: {len(reasons)} of {len(found)} fp8 linear layers ({reasons[0]})")

    # RoPE (and with it the attention layers): all or none, as the rotary module changes its output.
    rotary_dim = 0
    attention_plans: list[_AttentionPlan] = []
    if rope:
        params = _rope_parameters(base.rotary_emb, base.config)
        max_positions = int(getattr(base.config, "max_position_embeddings", 0) or 0)
        if not isinstance(params, str) and max_positions <= 0:
            params = "no max_position_embeddings in the config (the size of the cos/sin table)"
        if isinstance(params, str):
            report.skipped.append(f"rope, qkv, qk_norm: {params}")
        else:
            inv_freq, scaling, _ = params
            rotary_dim = 2 * inv_freq.numel()
            reasons = []
            for layer in layers:
                plan = _attention_plan(layer.self_attn, ops, rotary_dim, False, qk_norm, fp8_linears, None)
                if isinstance(plan, str):
                    reasons.append(plan)
            if reasons:
                report.skipped.append(f"rope, qkv, qk_norm: {reasons[0]}")
            else:
                for layer in layers:
                    plan = _attention_plan(layer.self_attn, ops, rotary_dim, qkv, qk_norm, fp8_linears, handoffs[layer])
                    assert not isinstance(plan, str)
                    attention_plans.append(plan)
                    _bind(layer.self_attn, _attention_forward, plan)
                    if plan.qkv is not None:
                        _merge_on_apply(layer.self_attn, [plan.qkv])
                        report.qkv += 1
                    report.qk_norm += plan.qk_norm is not None
                    report.rope += 1
                rotary_plan = _RotaryPlan(ops, inv_freq, scaling, max_positions, type(base.rotary_emb).forward)
                rotary_plan.cos_sin_cache(device)  # built here, not in a forward (traced, or captured)
                _bind(base.rotary_emb, _rotary_forward, rotary_plan)

    if mlp:
        skipped_mlp = 0
        for layer in layers:
            if not (hasattr(layer.mlp, "gate_proj") and hasattr(layer.mlp, "up_proj")):
                continue  # not a gated MLP (a mixture-of-experts block)
            fp8_mlp = all(getattr(layer.mlp, p, None) in fp8_linears for p in ("gate_proj", "up_proj", "down_proj"))
            act = _mlp_act(layer.mlp, config, fp8_linears if fp8_mlp else set())
            if act is None:
                skipped_mlp += 1
                continue
            merged = _Merged([layer.mlp.gate_proj, layer.mlp.up_proj])
            plan = _MLPPlan(ops, act, merged, type(layer.mlp).forward, fp8_mlp, handoffs[layer] if fp8_mlp else None)
            _bind(layer.mlp, _mlp_forward, plan)
            _merge_on_apply(layer.mlp, [merged])
            report.mlp += 1
        if skipped_mlp:
            hidden_act = getattr(config, "hidden_act", None)
            report.skipped.append(
                f"mlp: {skipped_mlp} of {len(layers)} layers (projections that are not plain nn.Linear layers, "
                f"or hidden_act {hidden_act!r})"
            )

    if router and model_type in ROUTER_MODEL_TYPES and ops.topk_softmax is not None:
        reasons = []
        num_experts = int(getattr(config, "num_experts", 0) or 0)
        for layer in layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not hasattr(layer.mlp, "experts"):
                continue  # a dense MLP layer
            plan = _router_plan(gate, ops, num_experts) if isinstance(gate, nn.Module) else "no router module"
            if isinstance(plan, str):
                reasons.append(plan)
                continue
            _bind(gate, _router_forward, plan)
            report.router += 1
        if reasons:
            report.skipped.append(f"router: {len(reasons)} of {len(layers)} layers ({reasons[0]})")

    norms_ok = all(
        _is_rmsnorm(getattr(layer, "input_layernorm", None))
        and _is_rmsnorm(getattr(layer, "post_attention_layernorm", None))
        for layer in layers
    ) and _is_rmsnorm(base.norm)
    chain = _Chain()
    if fused_add_rmsnorm:
        if not norms_ok or not layers:
            report.skipped.append("fused_add_rmsnorm: decoder layers without RMSNorm input and post-attention norms")
        else:
            collector = _capture_collector()

            def fp8_inputs(module: nn.Module, names: Sequence[str]) -> bool:
                return all(getattr(module, name, None) in fp8_linears for name in names)

            attn_fp8 = [fp8_inputs(layer.self_attn, ("q_proj", "k_proj", "v_proj")) for layer in layers]
            for i, layer in enumerate(layers):
                nxt = layers[i + 1].input_layernorm if i + 1 < len(layers) else base.norm
                previous = layers[i - 1] if i else None
                plan = _LayerPlan(ops, chain, i == 0, previous, nxt, collector, type(layer).forward)
                plan.attn_fp8 = attn_fp8[i]
                plan.mlp_fp8 = fp8_inputs(layer.mlp, ("gate_proj", "up_proj"))
                plan.next_fp8 = i + 1 < len(layers) and attn_fp8[i + 1]
                if plan.attn_fp8 or plan.mlp_fp8:
                    plan.fp8 = handoffs[layer]
                _bind(layer, _decoder_layer_forward, plan)
                report.fused_add_rmsnorm += 1
            _bind(base.norm, _final_norm_forward, _NormPlan(ops, chain))

    if rmsnorm:
        for module in base.modules():
            if _is_rmsnorm(module) and _PLAN not in module.__dict__:
                _bind(module, JitKernelRMSNorm.forward, _NormPlan(ops))
                report.rmsnorm += 1
    _warn(report)
    return report


def _warn(report: Patched) -> None:
    if report.skipped:
        warnings.warn("jit_kernel.integrations.transformers.apply skipped " + "; ".join(report.skipped), stacklevel=3)


def patched_modules(model: nn.Module) -> Iterable[tuple[str, nn.Module]]:
    """The modules of ``model`` whose forward :func:`apply` replaced, with their names."""
    for name, module in model.named_modules():
        if _PLAN in module.__dict__:
            yield name, module
