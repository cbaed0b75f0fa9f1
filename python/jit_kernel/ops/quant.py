"""``per_tensor_quant_fp8``: one float32 scale for a whole tensor, values in ``float8_e4m3fn``.

``q = fp8(clamp(x * (1 / scale), -448, 448))``. Dynamic mode (the default) computes
``scale = absmax(x) / 448`` into ``output_s`` itself, so ``output_s`` needs no zeroing by the
caller; static mode (``is_static=True``) reads the scale given in ``output_s``. A zero scale
(an all-zero input) gives an all-zero ``q``.
"""

from __future__ import annotations

import torch

from jit_kernel.dispatch import Dispatcher
from jit_kernel.families import PER_TENSOR_QUANT_FP8
from jit_kernel.ops._common import CPP_DTYPE, check_contiguous, check_cuda, check_pdl, resolve_pdl

_QUANT = Dispatcher(PER_TENSOR_QUANT_FP8)
FP8_E4M3_MAX = 448.0
# One float per block of the one-pass dynamic kernel; it caps that kernel's grid (H100: 264 blocks).
_DYNAMIC_WORKSPACE_FLOATS = 1024


def _check(input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor) -> None:
    op = "per_tensor_quant_fp8"
    check_cuda(op, "input", input)
    check_contiguous(op, "input", input)
    check_cuda(op, "output_q", output_q, (torch.float8_e4m3fn,))
    if output_q.device != input.device:
        raise ValueError(f"{op}: output_q is on {output_q.device} but input is on {input.device}")
    if output_q.shape != input.shape:
        raise ValueError(
            f"{op}: output_q must have the shape of input {tuple(input.shape)}, got {tuple(output_q.shape)}"
        )
    check_contiguous(op, "output_q", output_q)
    check_cuda(op, "output_s", output_s, (torch.float32,))
    if output_s.device != input.device:
        raise ValueError(f"{op}: output_s is on {output_s.device} but input is on {input.device}")
    if output_s.numel() != 1:
        raise ValueError(f"{op}: output_s must hold one float32 scale, got shape {tuple(output_s.shape)}")


def _quant(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, enable_pdl: bool | None
) -> None:
    check_pdl("per_tensor_quant_fp8", enable_pdl)
    _check(input, output_q, output_s)
    pdl = resolve_pdl(enable_pdl, input.device)
    args = (output_q.view(-1), output_s.view(1), input.view(-1))
    if is_static:
        _QUANT.function("static", (CPP_DTYPE[input.dtype],))(*args, pdl)
    else:
        # A fresh workspace per call keeps concurrent streams (and CUDA graphs) independent.
        workspace = torch.empty(_DYNAMIC_WORKSPACE_FLOATS, dtype=torch.float32, device=input.device)
        _QUANT.function("dynamic", (CPP_DTYPE[input.dtype],))(*args, workspace, pdl)


@torch.library.custom_op("jit_kernel::per_tensor_quant_fp8", mutates_args=("output_q", "output_s"))
def _quant_op(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, enable_pdl: bool | None = None
) -> None:
    _quant(input, output_q, output_s, is_static, enable_pdl)


# The fake runs the real op's checks, so torch.compile rejects what eager rejects.
@_quant_op.register_fake
def _(
    input: torch.Tensor, output_q: torch.Tensor, output_s: torch.Tensor, is_static: bool, enable_pdl: bool | None = None
) -> None:
    check_pdl("per_tensor_quant_fp8", enable_pdl)
    _check(input, output_q, output_s)


def per_tensor_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    is_static: bool = False,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``input`` (fp16, bf16 or fp32, any shape, contiguous) to ``float8_e4m3fn`` with one
    per-tensor scale. Returns ``(output_q, output_s)``; ``output_s`` has shape ``(1,)``.

    ``enable_pdl``: launch with programmatic dependent launch (``None``: on for sm_90+). The
    cooperative kernel that dynamic mode uses above 64K elements is never launched with it."""
    if not isinstance(is_static, bool):
        raise TypeError(f"per_tensor_quant_fp8: is_static must be a bool, got {type(is_static).__name__}")
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"per_tensor_quant_fp8: input must be a torch.Tensor, got {type(input).__name__}")
    if output_q is None:
        output_q = torch.empty(input.shape, dtype=torch.float8_e4m3fn, device=input.device)
    if output_s is None:
        if is_static:
            raise ValueError("per_tensor_quant_fp8: is_static=True needs the scale in output_s")
        output_s = torch.empty(1, dtype=torch.float32, device=input.device)
    if torch.compiler.is_compiling():
        torch.ops.jit_kernel.per_tensor_quant_fp8(input, output_q, output_s, is_static, enable_pdl)
    else:
        _quant(input, output_q, output_s, is_static, enable_pdl)
    return output_q, output_s
