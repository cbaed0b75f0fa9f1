"""Argument checks shared by the norm, quant and scale ops: cheap, and naming the argument."""

from __future__ import annotations

import functools

import torch

from jit_kernel.jit import make_cpp_args

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Config values name dtypes as C++ types; make_cpp_args owns that table.
CPP_DTYPE = {dtype: make_cpp_args(dtype)[0] for dtype in FLOAT_DTYPES}


def check_dense(op: str, name: str, t: object) -> torch.Tensor:
    """``t`` is a tensor with data: not some other object, not sparse, not on the meta device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(
            f"{op}: {name} is a sparse tensor ({str(t.layout).removeprefix('torch.')}); "
            "jit_kernel ops take dense tensors (call .to_dense() first)"
        )
    if t.device.type == "meta":
        raise ValueError(
            f"{op}: {name} is on the meta device, which holds no data; pass a real tensor "
            "(torch.compile traces jit_kernel ops through their fake implementations, not meta tensors)"
        )
    return t


def check_cuda(op: str, name: str, t: object, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        check_dense(op, name, t)  # a meta or sparse tensor gets its own message
        raise ValueError(f"{op}: {name} must be a CUDA tensor, got a tensor on {t.device}")
    if t.layout != torch.strided:
        check_dense(op, name, t)
    if t.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{op}: {name} must be one of ({names}), got {str(t.dtype).removeprefix('torch.')}")
    return t


def check_like(op: str, name: str, t: object, ref: torch.Tensor, ref_name: str) -> torch.Tensor:
    """``t`` must be a tensor on ``ref``'s device with ``ref``'s dtype."""
    check_cuda(op, name, t, (ref.dtype,))
    if t.device != ref.device:
        raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}")
    return t


def check_last_stride(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() > 0 and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{op}: {name} must have a unit stride in its last dimension, got strides {t.stride()}")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{op}: {name} must be contiguous, got shape {tuple(t.shape)} strides {t.stride()}")


def check_pdl(op: str, enable_pdl: object) -> None:
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"{op}: enable_pdl must be a bool or None, got {type(enable_pdl).__name__}")


@functools.cache
def _supports_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def resolve_pdl(enable_pdl: bool | None, device: torch.device) -> bool:
    """``enable_pdl=None`` means: on where the device has programmatic dependent launch (sm_90+).
    The kernels wait for their predecessor before their first memory access, so it is always safe;
    it lets a kernel's launch overlap the tail of the one before it."""
    if enable_pdl is None:
        return _supports_pdl(device.index if device.index is not None else torch.cuda.current_device())
    return enable_pdl
