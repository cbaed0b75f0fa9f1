"""``add_constant``: the self-test family, ``out = src + constant`` on int32 tensors.

On CUDA it runs a kernel, on the CPU a host loop, so both dispatcher paths (prebuilt and JIT)
can be exercised on any machine. The constant is a template parameter, as in the seeds'
tutorial: 1, 2 and 3 are prebuilt, any other value is compiled on first use.
"""

from __future__ import annotations

import torch

from jit_kernel.dispatch import Dispatcher
from jit_kernel.families import ADD_CONSTANT_CUDA, ADD_CONSTANT_HOST
from jit_kernel.ops._common import check_dense

_CUDA = Dispatcher(ADD_CONSTANT_CUDA)
_HOST = Dispatcher(ADD_CONSTANT_HOST)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def add_constant(src: torch.Tensor, constant: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return ``src + constant`` for a contiguous int32 tensor on CUDA or the CPU."""
    if type(constant) is not int:
        raise TypeError(f"add_constant: constant must be an int, got {type(constant).__name__}")
    if not _INT32_MIN <= constant <= _INT32_MAX:
        raise ValueError(f"add_constant: constant {constant} does not fit in int32")
    check_dense("add_constant", "src", src)
    if src.dtype != torch.int32:
        raise TypeError(f"add_constant: src must be int32, got {src.dtype}")
    if not src.is_contiguous():
        raise ValueError("add_constant: src must be contiguous")
    if out is None:
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
    elif (
        check_dense("add_constant", "out", out).dtype != torch.int32
        or out.shape != src.shape
        or out.device != src.device
    ):
        raise ValueError(
            f"add_constant: out must be an int32 tensor of shape {tuple(src.shape)} on {src.device}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    elif not out.is_contiguous():
        raise ValueError("add_constant: out must be contiguous")
    run = (_CUDA if src.is_cuda else _HOST).function("run", (constant,))
    if src.dim() == 1:
        run(out, src)
    else:  # the kernels take flat tensors; a view costs ~0.5 us, so only when needed
        run(out.view(-1), src.view(-1))
    return out
