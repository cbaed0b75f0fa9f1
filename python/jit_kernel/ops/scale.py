"""``scale``: ``out = src * factor`` on fp16, bf16 or fp32 CUDA tensors.

The product is computed in fp32 and rounded once, as torch does. ``factor`` is a run-time
argument: one kernel per dtype, prebuilt, whatever the value (the seeds' tutorial templated it
and compiled once per value).
"""

from __future__ import annotations

import torch

from jit_kernel.dispatch import Dispatcher
from jit_kernel.families import SCALE
from jit_kernel.ops._common import CPP_DTYPE, check_contiguous, check_cuda, check_like

_SCALE = Dispatcher(SCALE)


def _scale(src: torch.Tensor, factor: float, out: torch.Tensor | None, run: bool = True) -> torch.Tensor:
    op = "scale"
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise TypeError(f"{op}: factor must be a float, got {type(factor).__name__}")
    check_cuda(op, "src", src)
    check_contiguous(op, "src", src)
    if out is None:
        out = torch.empty(src.shape, dtype=src.dtype, device=src.device)
    else:
        check_like(op, "out", out, src, "src")
        if out.shape != src.shape:
            raise ValueError(f"{op}: out must have the shape of src {tuple(src.shape)}, got {tuple(out.shape)}")
        check_contiguous(op, "out", out)
    if run:
        _SCALE.function("run", (CPP_DTYPE[src.dtype],))(out.view(-1), src.view(-1), float(factor))
    return out


@torch.library.custom_op("jit_kernel::scale", mutates_args=())
def _scale_op(src: torch.Tensor, factor: float) -> torch.Tensor:
    return _scale(src, factor, None)


# The fakes run the real op's checks (run=False), so torch.compile rejects what eager rejects.
@_scale_op.register_fake
def _(src: torch.Tensor, factor: float) -> torch.Tensor:
    return _scale(src, factor, None, run=False)


@torch.library.custom_op("jit_kernel::scale_out", mutates_args=("out",))
def _scale_out_op(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    _scale(src, factor, out)


@_scale_out_op.register_fake
def _(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    _scale(src, factor, out, run=False)


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor`` (contiguous ``src``, any shape); ``out`` may be ``src`` (in place)."""
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.jit_kernel.scale(src, float(factor))
        torch.ops.jit_kernel.scale_out(out, src, float(factor))
        return out
    return _scale(src, factor, out)
