"""``add_constant``: the self-test family, ``out = src + constant`` on int32 tensors.

On CUDA it runs a kernel, on the CPU a host loop, so both dispatcher paths (prebuilt and JIT)
can be exercised on any machine. The constant is a template parameter, as in the seeds'
tutorial: 1, 2 and 3 are prebuilt, any other value is compiled on first use.
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import ADD_CONSTANT_CUDA, ADD_CONSTANT_HOST
from jit_kernel.ops._common import KernelTable, Launch, kernel_op

_CUDA = Dispatcher(ADD_CONSTANT_CUDA)
_HOST = Dispatcher(ADD_CONSTANT_HOST)
# constant -> kernel; the dispatcher checks the constant against the family's domain (int32).
_KERNELS = {True: KernelTable(_CUDA, "run", lambda c: (c,)), False: KernelTable(_HOST, "run", lambda c: (c,))}


@kernel_op("add_constant", out="out", register=False)
def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> Launch:
    """Return ``src + constant`` for a contiguous int32 tensor on CUDA or the CPU."""
    if type(constant) is not int:
        raise TypeError(f"add_constant: constant must be an int, got {type(constant).__name__}")
    if out is None:
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
    # C++ checks the shapes, contiguity, dtype and device.
    return _KERNELS[src.is_cuda], constant, (out, src), out
