"""The computations of the backend contract (:class:`~.backends.Backend`) written in torch: the ops
of the ``torch`` backend. They run on any device: the CPU tests run on them, a patched model whose
tensors are not on a CUDA device falls back to them, and ``apply`` checks a router against
:func:`_torch_topk_softmax`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# Fine-grained fp8: 1 x 128 activation groups against 128 x 128 weight blocks (DeepSeek-V3's recipe,
# transformers' FineGrainedFP8Config default).
FP8_BLOCK = 128
FP8_E4M3_MAX = 448.0


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


def _torch_decode_attention(
    query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """``decode_attention`` in fp32: ``query [B, Hq, D]`` over the first ``seq_lens[b]`` keys of
    ``k_cache`` / ``v_cache [B, Hkv, max_len, D]``, query head ``h`` on KV head ``h // (Hq // Hkv)``;
    ``[B, Hq, D]`` in the query's dtype (0 for a length of 0)."""
    b, hq, d = query.shape
    hkv, max_len = k_cache.shape[1], k_cache.shape[2]
    q = query.float().view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,bhkd->bhgk", q, k_cache.float()) * scale
    visible = torch.arange(max_len, device=query.device) < seq_lens.view(b, 1, 1, 1).to(query.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty key set: all -inf, 0 out
    out = torch.einsum("bhgk,bhkd->bhgd", weights, v_cache.float())
    return out.reshape(b, hq, v_cache.shape[-1]).to(query.dtype)
