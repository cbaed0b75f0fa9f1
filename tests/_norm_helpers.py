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
    """Fake CUDA tensors: shapes, strides and dtypes without a GPU, enough for Python validation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        yield


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), **TOL[dtype])
