"""tvm-ffi tensors with a FakeTensor's shape, strides, dtype and device, and no data.

torch.compile's fake implementations hand these to the C++ launchers, which run their checks (the
one copy of every tensor rule) and return before any CUDA call on a tensor without data
(``host::has_no_data``). A FakeTensor itself cannot cross: under torch.compile its storage throws
on any data-pointer access, as DLPack's export makes. So the DLPack capsule is written here, with
a null data pointer, from the metadata alone. Used at trace time only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
import tvm_ffi


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


# The capsules' memory, by address, until the consumer's deleter gives it back.
_alive: dict[int, tuple[object, ...]] = {}


@_Deleter
def _release(address: int | None) -> None:
    if address is not None:
        _alive.pop(address, None)


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DL_DEVICE = {"cuda": 2, "cpu": 1}  # kDLCUDA, kDLCPU


class _Metadata:
    """A DLPack producer (``__dlpack__``) for ``t``'s metadata with a null data pointer."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def __dlpack_device__(self) -> tuple[int, int]:
        device = self._t.device
        if device.type not in _DL_DEVICE:
            raise ValueError(f"no DLPack device for {device}")
        return _DL_DEVICE[device.type], device.index or 0

    def __dlpack__(self, *args: object, **kwargs: object) -> object:
        t = self._t
        ndim = t.dim()
        shape = (ctypes.c_int64 * max(ndim, 1))(*t.shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*t.stride())
        dtype = tvm_ffi.dtype(str(t.dtype).removeprefix("torch."))
        managed = _DLManagedTensor()
        managed.dl_tensor.data = None
        managed.dl_tensor.device = _Device(*self.__dlpack_device__())
        managed.dl_tensor.ndim = ndim
        managed.dl_tensor.dtype = _DType(dtype.type_code, dtype.bits, dtype.lanes)
        managed.dl_tensor.shape = shape
        managed.dl_tensor.strides = strides
        managed.deleter = _release
        address = ctypes.addressof(managed)
        _alive[address] = (managed, shape, strides)
        return _capsule_new(address, b"dltensor", None)


def without_data(t: torch.Tensor) -> Any:
    """``t`` as a tvm-ffi tensor with its metadata and no data."""
    return tvm_ffi.from_dlpack(_Metadata(t))


def checks_only(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` called with every tensor argument replaced by one without data."""

    def call(*args: Any) -> Any:
        return kernel(*(without_data(a) if isinstance(a, torch.Tensor) else a for a in args))

    return call
