"""per_tensor_quant_fp8 against a float32 torch reference (scale = absmax / 448, q = fp8(x / scale))."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FP8_MAX = 448.0


def ref_scale(x: torch.Tensor) -> torch.Tensor:
    """absmax / 448, correctly rounded to fp32 (the kernel divides; torch's tensor / scalar multiplies
    by the rounded reciprocal, one ulp off at times)."""
    return (x.float().abs().max().double() / FP8_MAX).float()


def ref_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def assert_fp8_close(q: torch.Tensor, expected: torch.Tensor) -> None:
    a, b = q.float(), expected.float()
    assert not torch.isnan(a).any()
    # Same fp32 arithmetic and rounding as the reference: exact but for rare ties; never off by
    # more than one fp8 step (1/8 relative).
    assert (a == b).float().mean().item() > 0.999
    torch.testing.assert_close(a, b, rtol=0.125, atol=2.0**-9)


SHAPES = [
    (1,),
    (7,),
    (7, 1000),
    (16, 4096),
    (128, 4096),
    (100003,),  # a cluster of blocks (sm_90+), with a tail of n % 8 elements
    (262144,),  # the largest input one cluster round covers
    (262145,),  # the smallest that takes the cooperative kernel
    (1000003,),
    (4097, 1024),
    (2048, 4096),  # the one-pass kernel's shared-memory stash in use
    (4096, 4096),  # 16M: fp32 overflows what the H100 holds on chip, so part is re-read
    pytest.param((16384, 4096), id="big"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_dynamic(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    q = torch.full(shape, float("nan"), device="cuda").to(torch.float8_e4m3fn)
    s = torch.full((1,), 12345.0, device="cuda")  # garbage: the op must not need it zeroed
    rq, rs = jit_kernel.per_tensor_quant_fp8(x, q, s)
    assert rq is q and rs is s
    torch.testing.assert_close(s[0], ref_scale(x), rtol=0, atol=0)
    assert_fp8_close(q, ref_quant(x, s))
    # twice in a row: the previous scale must not leak into the next
    q2, s2 = jit_kernel.per_tensor_quant_fp8(x * 0.5)
    torch.testing.assert_close(s2[0], ref_scale(x * 0.5), rtol=0, atol=0)
    assert s2.shape == (1,) and q2.dtype == torch.float8_e4m3fn


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1000, 1 << 20])
def test_static_and_misaligned(n: int, dtype: torch.dtype) -> None:
    x = (torch.randn(n + 1, device="cuda") * 3).to(dtype)[1:]  # misaligned view
    s = torch.tensor([0.004], device="cuda")
    q, rs = jit_kernel.per_tensor_quant_fp8(x, output_s=s, is_static=True)
    assert rs is s and s.item() == pytest.approx(0.004)
    assert_fp8_close(q, ref_quant(x, s))  # saturates at +-448
    qd, sd = jit_kernel.per_tensor_quant_fp8(x)
    assert_fp8_close(qd, ref_quant(x, sd))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [100, 1 << 20])
def test_zero_input(n: int) -> None:
    q, s = jit_kernel.per_tensor_quant_fp8(torch.zeros(n, device="cuda", dtype=torch.bfloat16))
    assert s.item() == 0.0
    assert torch.equal(q.float(), torch.zeros(n, device="cuda"))
    e = torch.empty(0, device="cuda", dtype=torch.bfloat16)
    q, s = jit_kernel.per_tensor_quant_fp8(e)
    assert q.numel() == 0 and s.item() == 0.0


@pytest.mark.gpu
@pytest.mark.multigpu
def test_quant_on_second_gpu() -> None:
    x = torch.randn(1 << 20, device="cuda:1", dtype=torch.bfloat16)
    with torch.cuda.device(0):
        q, s = jit_kernel.per_tensor_quant_fp8(x)
    torch.cuda.synchronize("cuda:1")
    assert q.device == x.device
    torch.testing.assert_close(s[0], ref_scale(x), rtol=0, atol=0)
    assert_fp8_close(q, ref_quant(x, s))


def test_quant_rejects_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the kernel (whose C++ check this is) is built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'input'.*Device mismatch: expected cuda but got cpu"):
        jit_kernel.per_tensor_quant_fp8(torch.randn(8))


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"input": lambda: _e(8, dtype=torch.int32)}, TypeError, "input must be one of"),
        ({"output_q": lambda: _e(8)}, TypeError, r"(?s)'output_q'.*Dtype mismatch: expected float8_e4m3fn"),
        ({"output_q": lambda: _e(8, dtype=torch.float8_e5m2)}, TypeError, r"(?s)'output_q'.*Dtype mismatch"),
        ({"output_q": lambda: _e(9, dtype=torch.float8_e4m3fn)}, ValueError, r"(?s)'output_q'.*Size mismatch"),
        ({"output_q": lambda: _e(2, 4, dtype=torch.float8_e4m3fn)}, ValueError, r"(?s)'output_q'.*Rank mismatch"),
        ({"output_s": lambda: _e(1)}, TypeError, r"(?s)'output_s'.*Dtype mismatch: expected float32"),
        ({"output_s": lambda: _e(2, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*Size mismatch"),
        ({"output_s": lambda: _e(2, 1, dtype=torch.float32)}, ValueError, "output_s must hold one"),
        ({"input": lambda: torch.empty_strided((8,), (2,), device="cuda")}, ValueError, r"(?s)'input'.*not contiguous"),
        ({"is_static": lambda: True}, ValueError, "is_static=True needs the scale"),
        ({"is_static": lambda: 1}, TypeError, "is_static must be a bool"),
    ],
)
def test_quant_bad_inputs(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"input": _e(8)} | {k: v() for k, v in kwargs.items()}
        with pytest.raises(error, match=match):
            jit_kernel.per_tensor_quant_fp8(**args)
