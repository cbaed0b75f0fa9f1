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
    Launch,
    compile_state,
    dynamo_compiling,
    float_dtype,
    kernel_op,
)

_SCALE = Dispatcher(SCALE)
_KERNELS = KernelTable(_SCALE, "run", lambda dtype: (float_dtype("scale", "src", dtype),))


@kernel_op("scale", out="out")
def _scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> Launch:
    if out is None:
        out = src.new_empty(src.shape)
    # C++ checks the shapes, contiguity, dtype and device.
    return Launch(_KERNELS, src.dtype, (out, src, factor), out)


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor`` (contiguous ``src``, any shape); ``out`` may be ``src`` (in place)."""
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        return _scale.traced(src, float(factor), out)
    try:  # the fast path (_common.FAST_PATH_MISS)
        kernel = _KERNELS.get(src.dtype)
        if kernel is not None:
            if out is None:
                out = torch.empty_like(src)
            kernel(out, src, factor)
            return out
    except FAST_PATH_MISS:
        pass
    return _scale(src, factor, out)
