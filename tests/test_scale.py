"""scale (run-time factor) and the vectorized add_constant path, against torch."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import assert_close, fake_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def ref_scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return (x.float() * torch.tensor(factor, dtype=torch.float32)).to(x.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(), (1,), (7,), (1000,), (128, 4096), (4097, 1000), (3, 5, 7), pytest.param((16 * 2**20 + 3,), id="big")],
)
@pytest.mark.parametrize("factor", [2.5, -0.3])
def test_scale(shape: tuple[int, ...], factor: float, dtype: torch.dtype) -> None:
    x = torch.randn(shape, device="cuda").to(dtype)
    out = torch.full_like(x, float("nan"))
    assert jit_kernel.scale(x, factor, out=out) is out
    assert_close(out, ref_scale(x, factor), dtype)
    assert_close(jit_kernel.scale(x, factor), ref_scale(x, factor), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_misaligned_and_inplace(dtype: torch.dtype) -> None:
    x = torch.randn(100001, device="cuda").to(dtype)[1:]
    expected = ref_scale(x, 3.0)
    assert_close(jit_kernel.scale(x, 3.0), expected, dtype)
    assert jit_kernel.scale(x, 3, out=x) is x
    assert_close(x, expected, dtype)
    assert jit_kernel.scale(torch.empty(0, device="cuda", dtype=dtype), 2.0).numel() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4095, 4096, 1 << 20, (1 << 24) + 3])
def test_add_constant_vectorized(n: int) -> None:
    x = torch.randint(-1000, 1000, (n,), device="cuda", dtype=torch.int32)
    out = torch.full_like(x, -7)
    jit_kernel.add_constant(x, 2, out=out)
    assert torch.equal(out, x + 2)
    y = torch.randint(-1000, 1000, (n + 1,), device="cuda", dtype=torch.int32)[1:]  # misaligned: scalar path
    assert torch.equal(jit_kernel.add_constant(y, 3), y + 3)
    rows = x[: n - n % 4].view(4, -1)  # any rank is taken as is (no flattening view)
    assert torch.equal(jit_kernel.add_constant(rows, 5, out=torch.empty_like(rows)), rows + 5)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_scale_on_second_gpu() -> None:
    x = torch.randn(1 << 20, device="cuda:1", dtype=torch.bfloat16)
    with torch.cuda.device(0):
        out = jit_kernel.scale(x, 0.5)
    torch.cuda.synchronize("cuda:1")
    assert_close(out, ref_scale(x, 0.5), torch.bfloat16)


def test_scale_rejects_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the kernel (whose C++ check this is) is built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'src'.*Device mismatch: expected cuda but got cpu"):
        jit_kernel.scale(torch.randn(8), 2.0)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: jit_kernel.scale(e(8, dtype=torch.int32), 2.0), TypeError, "src must be one of"),
        (lambda e: jit_kernel.scale(e(8), "2"), TypeError, "factor must be a float"),
        (lambda e: jit_kernel.scale(e(8), 2.0, out=e(9)), ValueError, r"(?s)'out'.*Size mismatch"),
        (lambda e: jit_kernel.scale(e(2, 4), 2.0, out=e(4, 2)), ValueError, r"(?s)'out'.*Size mismatch"),
        (lambda e: jit_kernel.scale(e(8), 2.0, out=e(2, 4)), ValueError, r"(?s)'out'.*Rank mismatch"),
        (lambda e: jit_kernel.scale(e(8), 2.0, out=e(8, dtype=torch.float16)), TypeError, r"(?s)'out'.*Dtype mismatch"),
        (lambda e: jit_kernel.scale(e(4, 2).t(), 2.0), ValueError, r"(?s)'src'.*not contiguous"),
    ],
)
def test_scale_bad_inputs(call, error: type[Exception], match: str) -> None:
    def e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(*shape, device="cuda", dtype=dtype)

    with fake_cuda(), pytest.raises(error, match=match):
        call(e)
