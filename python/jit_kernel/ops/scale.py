"""``scale``: ``out = src * factor`` on fp16, bf16 or fp32 CUDA tensors.

The product is computed in fp32 and rounded once, as torch does. ``factor`` is a run-time
argument: one kernel per dtype, prebuilt, whatever the value (the seeds' tutorial templated it
and compiled once per value).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import SCALE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op

_SCALE = Dispatcher(SCALE)
_KERNELS = KernelTable(_SCALE, "run", lambda dtype: (float_dtype("scale", "src", dtype),))


@kernel_op("scale", out="out")
def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> Launch:
    """``src * factor`` (contiguous ``src``, any shape); ``out`` may be ``src`` (in place)."""
    if out is None:
        out = torch.empty_like(src)
    # C++ checks the shapes, contiguity, dtype and device.
    return _KERNELS, src.dtype, (out, src, factor), out
