"""Shared helpers for the norm / quant / scale tests: tolerances, fake CUDA tensors for CPU-side
bad-input checks."""

from __future__ import annotations

import contextlib

import torch

TOL = {
    torch.bfloat16: {"rtol": 1e-2, "atol": 1e-2},
    torch.float16: {"rtol": 1e-3, "atol": 2e-3},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
}


@contextlib.contextmanager
def fake_cuda():
    """Fake CUDA tensors: shapes, strides and dtypes without a GPU. tvm-ffi hands them to the C++
    launchers, whose checks (the one owner of every tensor rule) run on the CPU; without a GPU the
    kernels are built for sm_90 (prebuilt in CI, else JIT-compiled once into the test cache)."""
    import os

    from torch._subclasses.fake_tensor import FakeTensorMode

    saved = os.environ.get("JIT_KERNEL_CUDA_ARCH")
    if not torch.cuda.is_available() and saved is None:
        os.environ["JIT_KERNEL_CUDA_ARCH"] = "9.0"
    try:
        with FakeTensorMode():
            yield
    finally:
        if saved is None:
            os.environ.pop("JIT_KERNEL_CUDA_ARCH", None)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype])
