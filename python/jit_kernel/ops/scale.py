"""``scale``: ``out = src * factor`` on fp16, bf16 or fp32 CUDA tensors.

The product is computed in fp32 and rounded once, as torch does. ``factor`` is a run-time
argument: one kernel per dtype, prebuilt, whatever the value (the seeds' tutorial templated it
and compiled once per value).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import SCALE
from jit_kernel.ops._common import (
    FAST_PATH_MISS,
    KernelTable,
    compile_state,
    dynamo_compiling,
    explain,
    float_dtype,
    register,
)

_SCALE = Dispatcher(SCALE)
_KERNELS = KernelTable(_SCALE, "run", lambda dtype: (float_dtype("scale", "src", dtype),))
_KERNEL_ARGS = ("out", "src", "factor")


def _scale(src: torch.Tensor, factor: float, out: torch.Tensor | None, run: bool = True) -> torch.Tensor:
    try:
        kernel = _KERNELS.get_kernel(src.dtype, run)
        if out is None:
            out = src.new_empty(src.shape)
        if run:  # C++ checks the shapes, contiguity, dtype and device
            kernel(out, src, factor)
    except (TypeError, RuntimeError, AttributeError) as error:
        explain("scale", error, _KERNEL_ARGS, {"src": src, "out": out, "factor": factor}, ("src", "out"))
        raise
    return out


def _scale_functional(src: torch.Tensor, factor: float, run: bool = True) -> torch.Tensor:
    return _scale(src, factor, None, run)


def _scale_out(out: torch.Tensor, src: torch.Tensor, factor: float, run: bool = True) -> None:
    _scale(src, factor, out, run)


register("scale", _scale_functional, fake_checks=True)
register("scale_out", _scale_out, mutates=("out",), fake_checks=True)


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor`` (contiguous ``src``, any shape); ``out`` may be ``src`` (in place)."""
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        if out is None:
            return torch.ops.jit_kernel.scale(src, float(factor))
        torch.ops.jit_kernel.scale_out(out, src, float(factor))
        return out
    if out is not None:
        try:  # the fast path (_common.FAST_PATH_MISS)
            kernel = _KERNELS.get(src.dtype)
            if kernel is not None:
                kernel(out, src, factor)
                return out
        except FAST_PATH_MISS:
            pass
    return _scale(src, factor, out)
