"""Backends: the ops a patched model calls (:class:`Backend`), from jit_kernel, from FlashInfer (for
comparisons) or written in torch (:mod:`.reference`), and which one a call runs on."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .reference import (
    FP8_BLOCK,
    _torch_decode_attention,
    _torch_fused_add_rmsnorm,
    _torch_fused_add_rmsnorm_group_quant,
    _torch_gated,
    _torch_group_quant,
    _torch_qknorm_rope,
    _torch_rmsnorm,
    _torch_rmsnorm_group_quant,
    _torch_rope,
    _torch_silu_and_mul_group_quant,
    _torch_topk_softmax,
)

BACKENDS = ("jit_kernel", "flashinfer", "torch")

# How a patched attention layer runs a step of one query token per sequence (see
# :func:`.forwards._one_token_attention` for when each applies):
# - "decode_attention": the backend's ``decode_attention`` over the StaticCache's tensors, each
#   sequence's keys the first ``cumulative_length`` of the cache (the mask is not read);
# - "sdpa_gqa": ``F.scaled_dot_product_attention(..., enable_gqa=True)`` on the KV heads as the cache
#   holds them where the step has no mask; with one (a StaticCache step has one), the model's own
#   sdpa attention function, as the unpatched model runs it (SDPA's enable_gqa with a mask runs
#   torch's math kernel on CUDA);
# - "packed": SDPA on the KV heads with the query heads packed as rows (:func:`.forwards._packed_decode_attention`).
ONE_TOKEN_ATTENTION_CHOICES = ("decode_attention", "sdpa_gqa", "packed")
#: The choice of every backend built here: the one place to change it. docs/integrations.md says what
#: each choice runs; the benchmarks (bench_decode_attention, bench_model) measure them.
ONE_TOKEN_ATTENTION = "decode_attention"


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
    tensors only.

    ``linear(x, weight, bias) -> Tensor`` is ``F.linear`` for every floating-point linear layer a
    patched forward calls (q/k/v or the merged qkv, o, gate/up, down, the router's GEMM, the head);
    jit_kernel's runs ``decode_linear`` at decode sizes. ``fp8_decode_linear(q [T, K], s [T, K /
    128], weight, weight_scale, dtype, bias) -> [T, N]``: an fp8 linear layer's product for up to 16
    quantised rows (1 x 128 input groups, 128 x 128 weight blocks), or None (``torch._scaled_mm``
    then runs every size). ``decode_attention(query [B, Hq, D], k_cache,
    v_cache [B, Hkv, max_len, D], seq_lens [B], scale) -> [B, Hq, D]``: one query token per sequence
    over the first ``seq_lens[b]`` keys, or None. ``one_token_attention``: one of
    :data:`ONE_TOKEN_ATTENTION_CHOICES`, how a one-token step's attention runs (``decode_attention``
    needs the op; without it the step runs ``sdpa_gqa``)."""

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
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] = F.linear
    fp8_decode_linear: Callable[..., torch.Tensor] | None = None
    decode_attention: Callable[..., torch.Tensor] | None = None
    one_token_attention: str = ONE_TOKEN_ATTENTION

    def __post_init__(self) -> None:
        if self.one_token_attention not in ONE_TOKEN_ATTENTION_CHOICES:
            choices = ", ".join(ONE_TOKEN_ATTENTION_CHOICES)
            raise ValueError(f"one_token_attention must be one of {choices}; got {self.one_token_attention!r}")


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
    decode_attention=_torch_decode_attention,
)


def _jit_kernel_backend() -> Backend:
    import jit_kernel
    from jit_kernel.ops.gemm import MAX_ROWS

    def linear(x, weight, bias=None):  # type: ignore[no-untyped-def]
        # Decode sizes (up to MAX_ROWS rows of bf16/fp16) go to decode_linear, whose own rule (its
        # launcher's) sends the shapes its kernel does not serve to cuBLAS; prefill sizes go to
        # cuBLAS directly.
        if (x.dtype == torch.bfloat16 or x.dtype == torch.float16) and x.numel() <= MAX_ROWS * x.shape[-1]:
            return jit_kernel.decode_linear(x, weight, bias)
        return F.linear(x, weight, bias)

    def decode_attention(query, k_cache, v_cache, seq_lens, scale):  # type: ignore[no-untyped-def]
        return jit_kernel.decode_attention(query, k_cache, v_cache, seq_lens, scale=scale)

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
        linear=linear,
        fp8_decode_linear=jit_kernel.decode_linear_fp8,
        decode_attention=decode_attention,
    )


def _flashinfer_backend() -> Backend:
    """FlashInfer's norm, activation and RoPE ops in the same places. FlashInfer has no fused q/k
    norm + RoPE: its ``rmsnorm`` normalises the heads (a copy where q/k are not contiguous rows),
    then its RoPE rotates them. It has no softmax top-k either: the router stays the model's. Its
    linear layers run ``F.linear`` (cuBLAS) at every size, and it has no ``decode_attention``: a
    one-token step runs SDPA (``packed`` where that is the choice, else ``sdpa_gqa``)."""
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
