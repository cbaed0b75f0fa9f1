"""per_tensor_quant_fp8 against a float32 torch reference (scale = absmax / 448, q = fp8(x / scale))."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_helpers import assert_builds_for_arch

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
    (3, 10000),  # a cluster of 8 blocks (sm_90+)
    (16, 4096),  # the smallest input a cluster of 16 blocks takes (where the GPU runs them)
    (128, 4096),
    (100003,),  # a cluster of 16 blocks, with a tail of n % 8 elements
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


# ---------------------------------------------------------------------------------------------
# per_tensor_absmax_fp8: output_s = max(output_s, absmax(x) / 448), an absmax-only kernel.

ABSMAX_SIZES = [0, 1, 7, 4095, 4096, 65537, (1 << 22) + 3]


def _absmax(x: torch.Tensor, s: torch.Tensor, enable_pdl: bool | None = None) -> None:
    from jit_kernel.ops.quant import per_tensor_absmax_fp8

    assert per_tensor_absmax_fp8(x, s, enable_pdl) is None


def _bits(t: torch.Tensor) -> int:
    return t.view(torch.int32).item()


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "offset1"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ABSMAX_SIZES)
def test_absmax(n: int, dtype: torch.dtype, offset: int) -> None:
    x = (torch.randn(n + offset, device="cuda") * 3).to(dtype)[offset:]  # offset 1: not 16-byte aligned
    x_copy = x.clone()
    s = torch.zeros(1, device="cuda")
    _absmax(x, s)
    expected = ref_scale(x) if n else torch.tensor(0.0)
    assert _bits(s.cpu()) == _bits(expected.view(1).cpu())  # exact: a max, then one fp32 division
    assert torch.equal(x, x_copy)
    # Bit-equal to the scale dynamic quantisation computes (for n = 0 both are 0).
    _, dynamic = jit_kernel.per_tensor_quant_fp8(x)
    assert _bits(s) == _bits(dynamic)


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", [None, True, False])
@pytest.mark.parametrize("n", [4096, 1 << 20])
def test_absmax_accumulates(n: int, enable_pdl: bool | None) -> None:
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = a * 4
    sa, sb = ref_scale(a).item(), ref_scale(b).item()
    s = torch.full((1,), sb * 2, device="cuda")  # larger: unchanged
    _absmax(a, s, enable_pdl)
    assert s.item() == sb * 2
    s.fill_(sa / 2)  # smaller: replaced
    _absmax(a, s, enable_pdl)
    assert s.item() == sa
    s.zero_()  # two tensors: the maximum of both, in either order
    _absmax(b, s, enable_pdl)
    _absmax(a, s, enable_pdl)
    assert s.item() == sb
    s.zero_()
    _absmax(a, s, enable_pdl)
    _absmax(b, s, enable_pdl)
    assert s.item() == sb
    for old in (-1.0, -0.0, float("-inf")):  # negative old values compare as floats too
        s.fill_(old)
        _absmax(a, s, enable_pdl)
        assert s.item() == sa
    s.fill_(float("inf"))
    _absmax(a, s, enable_pdl)
    assert s.item() == float("inf")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_absmax_zero_empty_and_shapes(dtype: torch.dtype) -> None:
    s = torch.zeros(1, device="cuda")
    _absmax(torch.zeros(1 << 20, device="cuda", dtype=dtype), s)
    assert _bits(s) == 0  # +0.0
    s.fill_(0.5)
    _absmax(torch.zeros(100, device="cuda", dtype=dtype), s)
    assert s.item() == 0.5
    _absmax(torch.empty(0, 4096, device="cuda", dtype=dtype), s)  # empty: no launch, unchanged
    assert s.item() == 0.5
    x = torch.randn(3, 5, 4097, device="cuda").to(dtype)  # any shape; a 0-d output_s
    s0 = torch.zeros((), device="cuda")
    _absmax(x, s0)
    assert s0.item() == ref_scale(x).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_absmax_non_finite(dtype: torch.dtype) -> None:
    """NaN elements are ignored, as in dynamic mode; an inf gives inf. A (positive) NaN already in
    output_s stays (the documented difference from a float max: the atomic compares bits)."""
    x = (torch.randn(70000, device="cuda") * 3).to(dtype)
    x[[0, 12345, 69999]] = float("nan")
    s = torch.zeros(1, device="cuda")
    _absmax(x, s)
    assert s.item() == ref_scale(torch.nan_to_num(x, nan=0.0)).item()
    _, dynamic = jit_kernel.per_tensor_quant_fp8(x)
    assert _bits(s) == _bits(dynamic)
    s.zero_()
    _absmax(torch.full((9,), float("nan"), device="cuda", dtype=dtype), s)
    assert s.item() == 0.0
    x[5] = float("-inf")
    _absmax(x, s)
    assert s.item() == float("inf")
    s.fill_(float("nan"))
    _absmax(x[6:100], s)
    assert s.isnan().item()


@pytest.mark.gpu
def test_absmax_seed_form_and_compile() -> None:
    from jit_kernel.ops.quant import per_tensor_absmax_fp8
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_absmax_fp8 as seed_absmax

    x = torch.randn(3000, 7, device="cuda", dtype=torch.float16)
    s = torch.zeros(1, device="cuda")
    assert seed_absmax(x, s) is None
    assert s.item() == ref_scale(x).item()

    def scale_of(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(1, device=t.device)
        per_tensor_absmax_fp8(t, out)
        return out

    compiled = torch.compile(scale_of, fullgraph=True)
    assert compiled(x).item() == ref_scale(x).item()
    g = torch.cuda.CUDAGraph()
    s.zero_()
    with torch.cuda.graph(g):
        per_tensor_absmax_fp8(x, s)
    s.zero_()
    g.replay()
    assert s.item() == ref_scale(x).item()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"input": lambda: _e(8, dtype=torch.int32)}, TypeError, "per_tensor_absmax_fp8: input must be one of"),
        ({"input": lambda: [1.0]}, TypeError, "input must be a torch.Tensor, got list"),
        ({"output_s": lambda: 0.5}, TypeError, "output_s must be a torch.Tensor, got float"),
        (
            {"input": lambda: torch.empty_strided((8,), (2,), device="cuda", dtype=torch.bfloat16)},
            ValueError,
            r"(?s)'input'.*not contiguous",
        ),
        ({"input": lambda: torch.empty(8, dtype=torch.bfloat16)}, ValueError, r"(?s)'input'.*Device mismatch"),
        ({"output_s": lambda: _e(1)}, TypeError, r"(?s)'output_s'.*Dtype mismatch: expected float32"),
        ({"output_s": lambda: _e(1, dtype=torch.float64)}, TypeError, r"(?s)'output_s'.*Dtype mismatch"),
        ({"output_s": lambda: _e(2, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*Size mismatch"),
        ({"output_s": lambda: _e(0, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*Size mismatch"),
        ({"output_s": lambda: _e(2, 1, dtype=torch.float32)}, ValueError, "output_s must hold one"),
        (
            {"output_s": lambda: torch.empty(1, dtype=torch.float32)},
            ValueError,
            r"(?s)'output_s'.*Device mismatch: expected cuda:0 but got cpu",
        ),
        (
            {"output_s": lambda: torch.empty(1, device="cuda:1", dtype=torch.float32)},
            ValueError,
            r"(?s)'output_s'.*Device mismatch: expected cuda:0 but got cuda:1",
        ),
        ({"enable_pdl": lambda: "yes"}, TypeError, "enable_pdl must be a bool or None, got str"),
    ],
)
def test_absmax_bad_inputs(kwargs, error: type[Exception], match: str) -> None:
    from jit_kernel.ops.quant import per_tensor_absmax_fp8

    with fake_cuda():
        args = {"input": _e(8), "output_s": _e(1, dtype=torch.float32)} | {k: v() for k, v in kwargs.items()}
        with pytest.raises(error, match=match):
            per_tensor_absmax_fp8(**args)


def test_absmax_checks_pass_without_a_gpu() -> None:
    """Good arguments reach the C++ launcher (fake tensors: checked, nothing launched), for every
    dtype, any input shape (empty too) and an output_s of any one-element shape; the seed form and
    torch.ops' fake implementation run the same checks."""
    from jit_kernel.ops.quant import per_tensor_absmax_fp8
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_absmax_fp8 as seed_absmax

    with fake_cuda():
        s = _e(1, dtype=torch.float32)
        for x in (_e(8), _e(0), _e(3, 5, 4097), _e(1 << 22, dtype=torch.float32), _e(9, dtype=torch.float16)):
            assert per_tensor_absmax_fp8(x, s) is None
        assert per_tensor_absmax_fp8(_e(8), torch.empty((), device="cuda")) is None  # a 0-d output_s
        assert per_tensor_absmax_fp8(_e(8), _e(1, 1, dtype=torch.float32), enable_pdl=False) is None
        assert seed_absmax(_e(8), s) is None
        with pytest.raises(ValueError, match=r"(?s)'input'.*not contiguous"):
            seed_absmax(torch.empty_strided((4, 4), (1, 4), device="cuda", dtype=torch.bfloat16), s)
        torch.ops.jit_kernel.per_tensor_absmax_fp8(_e(8), s, None)
        with pytest.raises(TypeError, match=r"(?s)'output_s'.*Dtype mismatch"):
            torch.ops.jit_kernel.per_tensor_absmax_fp8(_e(8), _e(1), None)


def test_absmax_registered_op() -> None:
    schema = torch.ops.jit_kernel.per_tensor_absmax_fp8.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"output_s"}, schema


def test_absmax_compiles_for_sm90a() -> None:
    """Every export of the fp32 config (the widest element, so the fewest elements per vector)
    builds for sm_90a without a GPU (the prebuilt library is the proof where it holds the config for
    sm_90a; see ``assert_builds_for_arch``)."""
    from jit_kernel.engine import families

    spec, config = families.PER_TENSOR_QUANT_FP8, ("fp32_t",)
    assert "absmax" in spec.exports
    assert_builds_for_arch(spec, config, "9.0a")
