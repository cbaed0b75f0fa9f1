"""``jit_kernel.norm``: the seed's norm API (``sglang.jit_kernel.norm``), same names, signatures and semantics.

Thin wrappers over ``jit_kernel.ops.norm``. Unlike the top-level ``jit_kernel.rmsnorm`` (torch
style: ``rmsnorm(input, weight, eps=1e-6, out=None)`` returns a new tensor), the seed's
``rmsnorm(input, weight, out=None, eps=1e-6)`` takes ``out`` third, normalises ``input`` in place
when ``out`` is None, and returns None. docs/coming-from-sglang.md lists every difference.
"""

from __future__ import annotations

import logging

import torch

from jit_kernel.engine.jit import cache_once
from jit_kernel.ops import norm as _norm
from jit_kernel.ops._common import FLOAT_DTYPES

logger = logging.getLogger("jit_kernel")


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """``out = input * rsqrt(mean(input^2) + eps) * weight`` over the last dimension; with
    ``out=None`` the result overwrites ``input``. Returns None."""
    _norm.rmsnorm(input, weight, eps, out=input if out is None else out)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    cast_x_before_out_mul: bool = False,
) -> None:
    """In place: ``residual = input + residual``, then ``input = rmsnorm(residual) * weight``.

    ``cast_x_before_out_mul=True`` rounds as the seed's kernel does with it (Hugging Face parity):
    the normalised value, taken from the unrounded fp32 sum, is rounded to the dtype before the
    weight multiply. It must be a bool.
    """
    _norm.fused_add_rmsnorm(input, residual, weight, eps, cast_x_before_out_mul=cast_x_before_out_mul)


def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    head_dim: int = 0,
) -> None:
    """Per-head RMSNorm of q ``[N, Hq, D]`` and k ``[N, Hk, D]`` in place. ``head_dim`` (0: q's
    last dimension) must equal D when given."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"fused_inplace_qknorm: head_dim must be an int, got {type(head_dim).__name__}")
    if head_dim and isinstance(q, torch.Tensor) and q.dim() > 0 and head_dim != q.shape[-1]:
        raise ValueError(f"fused_inplace_qknorm: head_dim={head_dim} does not match q's last dimension {q.shape[-1]}")
    _norm.fused_inplace_qknorm(q, k, q_weight, k_weight, eps)


def fused_inplace_qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> None:
    """RMSNorm of whole rows in place: q ``[N, Hq*D]`` with ``q_weight`` ``[Hq*D]``, k ``[N, Hk*D]``
    with ``k_weight`` ``[Hk*D]`` (the top-level name is ``jit_kernel.qknorm_across_heads``)."""
    _norm.qknorm_across_heads(q, k, q_weight, k_weight, eps)


@torch.compiler.assume_constant_result
@cache_once
def can_use_fused_inplace_qknorm(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether :func:`fused_inplace_qknorm` runs for this head_dim and dtype: any head_dim in
    [1, 2^20] in fp16, bf16 or fp32 whose kernel loads (prebuilt, or JIT-compiled now). Logs why not."""
    if dtype not in FLOAT_DTYPES or isinstance(head_dim, bool) or not isinstance(head_dim, int):
        logger.warning("fused_inplace_qknorm: unsupported head_dim=%r dtype=%s", head_dim, dtype)
        return False
    if not 1 <= head_dim <= _norm.MAX_HIDDEN:
        logger.warning("fused_inplace_qknorm: unsupported head_dim=%d (1 to %d)", head_dim, _norm.MAX_HIDDEN)
        return False
    try:
        _norm.resolve_qknorm_kernel(head_dim, dtype)
    except Exception as error:
        logger.warning("fused_inplace_qknorm: cannot load the kernel for head_dim=%d %s: %s", head_dim, dtype, error)
        return False
    return True


def is_supported_jit_fused_add_rmsnorm_hidden_size(hidden_size: int) -> bool:
    """Whether :func:`fused_add_rmsnorm` takes rows of ``hidden_size`` (any size in [1, 2^20])."""
    return isinstance(hidden_size, int) and not isinstance(hidden_size, bool) and 1 <= hidden_size <= _norm.MAX_HIDDEN


__all__ = [
    "can_use_fused_inplace_qknorm",
    "fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "fused_inplace_qknorm_across_heads",
    "is_supported_jit_fused_add_rmsnorm_hidden_size",
    "rmsnorm",
]
