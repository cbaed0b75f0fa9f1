"""Gemma's RMSNorm: ``gemma_rmsnorm`` and ``gemma_fused_add_rmsnorm`` (csrc/norm/gemma.cuh).

``out = T(x * rsqrt(mean(x^2) + eps) * (1 + w))``, computed in fp32 with the weight applied as
``1 + float(w)`` and rounded once, at the end: transformers' ``GemmaRMSNorm`` (``(x.float() * rrms)
* (1.0 + weight.float())``, then ``.type_as(x)``), which Gemma 1, 2 and 3 use (weights stored as
offsets from 1). Not ``rmsnorm(x, 1 + w)``: that rounds ``1 + w`` to the dtype first.
``gemma_fused_add_rmsnorm`` stores ``residual = T(input + residual)`` and writes the normalised
value of that stored residual into ``input``, as :func:`jit_kernel.fused_add_rmsnorm` does.

``input`` ``[..., D]`` in fp16, bf16 or fp32 on a CUDA device, with a unit last stride (rows may be
strided); ``weight [D]`` of the same dtype; any D. Both are ``torch.ops.jit_kernel.*`` ops (fake
implementations, mutated tensors declared) and switch to them under ``torch.compile``.
``enable_pdl``: programmatic dependent launch (``None``: on for sm_90+).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import GEMMA_RMSNORM
from jit_kernel.ops._common import (
    KernelTable,
    Launch,
    float_dtype,
    kernel_op,
    not_a_tensor,
    rows,
    rows_and_out,
    rows_like,
)

_GEMMA = Dispatcher(GEMMA_RMSNORM)
_OP = "gemma_rmsnorm"
_ADD_OP = "gemma_fused_add_rmsnorm"
# Config = dtype only (D is a run-time value).
_RMSNORM = KernelTable(_GEMMA, "rmsnorm", lambda dtype: (float_dtype(_OP, "input", dtype),))
_FUSED_ADD = KernelTable(_GEMMA, "fused_add", lambda dtype: (float_dtype(_ADD_OP, "input", dtype),))


def _dtype(op: str, input: object) -> torch.dtype:
    if not isinstance(input, torch.Tensor):
        not_a_tensor(op, "input", input)
    return input.dtype


@kernel_op(_OP, out="out")
def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    """Gemma's RMSNorm of the last dimension: ``out = input * rsqrt(mean(input^2) + eps) * (1 +
    weight)`` in fp32, rounded once. ``out`` may be ``input`` (in place). Returns ``out``."""
    if input.ndim == 2:  # the rows the kernel takes as they are
        if out is None:
            out = torch.empty_like(input)
        return _RMSNORM, input.dtype, (out, input, weight, eps, enable_pdl), out
    key = _dtype(_OP, input)
    in_rows, out, out_rows = rows_and_out(_OP, input, out)
    return _RMSNORM, key, (out_rows, in_rows, weight, eps, enable_pdl), out


@kernel_op(_ADD_OP, mutates=("input", "residual"))
def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> Launch:
    """In place: ``residual = input + residual`` (added in fp32, stored in the dtype), then
    ``input = gemma_rmsnorm(residual, weight, eps)``."""
    if input.ndim == 2:
        return _FUSED_ADD, input.dtype, (input, residual, weight, eps, enable_pdl), None
    key = _dtype(_ADD_OP, input)
    in_rows = rows(_ADD_OP, "input", input)
    res_rows = rows_like(_ADD_OP, "residual", residual, input)
    return _FUSED_ADD, key, (in_rows, res_rows, weight, eps, enable_pdl), None
