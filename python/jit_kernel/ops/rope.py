"""Rotary position embedding: ``apply_rope_with_cos_sin_cache_inplace`` and ``fused_qknorm_rope``.

``apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
is_neox=True)`` has FlashInfer's / sgl-kernel's signature and semantics: for every token ``t`` with
``p = positions[t]``, ``half = rotary_dim / 2``, ``cos = cos_sin_cache[p, :half]`` and
``sin = cos_sin_cache[p, half:]``, every head of ``query`` and ``key`` is rotated in place, pair by
pair: ``(a, b) -> (a * cos[i] - b * sin[i], b * cos[i] + a * sin[i])``, in fp32, rounded once. The
pairs are ``(x[i], x[i + half])`` in NeoX style (``is_neox=True``, rotate halves) and
``(x[2i], x[2i + 1])`` in GPT-J style (interleaved). Elements at and beyond ``rotary_dim`` (partial
rotary) are left untouched.

- ``positions``: int32 or int64 ``[tokens]``, any stride.
- ``query``: ``[tokens, q_heads * head_size]`` or ``[tokens, q_heads, head_size]``; ``key`` likewise.
  Token and head strides are free (q and k may be views of one fused qkv tensor, or the rope part
  ``q[..., 512:]`` of MLA heads with ``head_size=64``); the elements of a head must be contiguous.
- ``cos_sin_cache``: ``[max_position, rotary_dim]``, fp32 or the activation dtype, rows may be strided.
- fp16, bf16 and fp32 activations; any even ``head_size`` up to 1024 and even ``rotary_dim <= head_size``.

Positions outside ``[0, max_position)``: with ``JIT_KERNEL_CHECK_INDICES=1`` the op raises
``IndexError`` naming ``positions`` and the first bad entry (one reduction and a host sync per call;
not usable under CUDA-graph capture). Without it the kernel never reads out of bounds: such a
token is skipped (its q and k are left unrotated; ``fused_qknorm_rope`` normalises them and does not
rotate them).

``fused_qknorm_rope(query, key, q_weight, k_weight, positions, cos_sin_cache, eps=1e-6,
is_neox=True)``: per-head RMSNorm of q (weight ``q_weight [head_size]``) and k (``k_weight``), then the
rotation above, in place, in one launch that reads and writes q and k once. It computes exactly
``fused_inplace_qknorm`` followed by ``apply_rope_with_cos_sin_cache_inplace``: the normalised value
is ROUNDED to the activation dtype before the rotation, as the two-launch path stores it (so the two
agree to the last bit, up to the order of the fp32 sum of squares).

Both are also ``torch.ops.jit_kernel.*`` custom ops (mutating ``query`` and ``key``), used under
``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import QKNORM_ROPE, ROPE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op

_ROPE_OP = "apply_rope_with_cos_sin_cache_inplace"
_QKR_OP = "fused_qknorm_rope"
_ROPE = Dispatcher(ROPE)
_QKNORM_ROPE = Dispatcher(QKNORM_ROPE)

_ROPE_KERNELS = KernelTable(_ROPE, "run", lambda dtype: (float_dtype(_ROPE_OP, "query", dtype),))
_QKR_KERNELS = KernelTable(_QKNORM_ROPE, "run", lambda dtype: (float_dtype(_QKR_OP, "query", dtype),))


def _check_bool(op: str, name: str, value: object) -> None:
    if type(value) is not bool:
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")


def _position_check(op: str) -> Any:
    """JIT_KERNEL_CHECK_INDICES=1: every position indexes a row of the cache (one sync)."""

    def check(values: Mapping[str, Any]) -> None:
        positions, cos_sin_cache = values["positions"], values["cos_sin_cache"]
        rows = cos_sin_cache.shape[0]
        bad = (positions < 0) | (positions >= rows)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise IndexError(
                f"{op}: positions[{first}] = {int(positions[first])} is out of range for cos_sin_cache "
                f"with {rows} rows (valid positions: 0 <= p < {rows})"
            )

    return check


# ---------------------------------------------------------------------------------------------
# The ops. ``enable_pdl``: launch with programmatic dependent launch; ``None`` (the default) turns
# it on for sm_90+ devices.


@kernel_op(_ROPE_OP, mutates=("query", "key"), index_check=_position_check(_ROPE_OP))
def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    enable_pdl: bool | None = None,
) -> Launch:
    """Rotary embedding of ``query`` and ``key`` in place from a ``[max_position, rotary_dim]``
    cos/sin cache (cos in the first half of a row, sin in the second), FlashInfer's semantics: see
    the module docstring."""
    if type(is_neox) is not bool:
        _check_bool(_ROPE_OP, "is_neox", is_neox)
    args = (positions, query, key, head_size, cos_sin_cache, is_neox, enable_pdl)
    return _ROPE_KERNELS, query.dtype, args, None


@kernel_op(_QKR_OP, mutates=("query", "key"), index_check=_position_check(_QKR_OP))
def fused_qknorm_rope(
    query: torch.Tensor,
    key: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    eps: float = 1e-6,
    is_neox: bool = True,
    enable_pdl: bool | None = None,
) -> Launch:
    """Per-head RMSNorm of ``query`` (``q_weight [head_size]``) and ``key`` (``k_weight``), then
    rotary embedding, in place and in one launch; equals ``fused_inplace_qknorm`` followed by
    :func:`apply_rope_with_cos_sin_cache_inplace` (the normalised value rounded to the dtype)."""
    if type(is_neox) is not bool:
        _check_bool(_QKR_OP, "is_neox", is_neox)
    args = (query, key, q_weight, k_weight, positions, cos_sin_cache, eps, is_neox, enable_pdl)
    return _QKR_KERNELS, query.dtype, args, None
