"""per_token_quant_fp8, per_token_group_quant_fp8 and silu_and_mul_per_token_group_quant_fp8 against
float32 torch references; bad inputs (CPU, through fake CUDA tensors and the C++ launchers' checks).

References: scale = absmax / 448 (group: max(absmax, eps) / 448) computed in float64 and rounded to
float32; q = fp8(clamp(x * (1 / scale), -448, 448)) with the kernel's own scale, so that the q check
does not depend on the scale's last bit. NaN is ignored by the absmax and stays NaN in q.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jit_kernel
from _norm_helpers import fake_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def assert_fp8_close(q: torch.Tensor, expected: torch.Tensor) -> None:
    """Exact but for rare ties; never off by more than one fp8 step (1/8 relative)."""
    a, b = q.float(), expected.float()
    assert not torch.isnan(a).any()
    assert (a == b).float().mean().item() > 0.999
    torch.testing.assert_close(a, b, rtol=0.125, atol=2.0**-9)


def _absmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """abs().amax() with NaN ignored (the kernels' fmaxf), inf kept."""
    a = x.float().abs()
    return torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(dim)


def _div448(m: torch.Tensor) -> torch.Tensor:
    return (m.double() / FP8_MAX).float()


def _quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * (1 / scale), scale broadcast, 0 for a zero scale; clamp keeps NaN."""
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def ref_group_scale(a: torch.Tensor, group: int, eps: float) -> torch.Tensor:
    g = a.float().reshape(*a.shape[:-1], a.shape[-1] // group, group)
    return _div448(_absmax(g).clamp(min=eps))


def ref_group_quant(a: torch.Tensor, group: int, scale: torch.Tensor) -> torch.Tensor:
    g = a.float().reshape(*a.shape[:-1], a.shape[-1] // group, group)
    return _quant(g, scale.float()[..., None]).reshape(a.shape)


def ref_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32, rounded once to x's dtype."""
    d = x.shape[-1] // 2
    g, u = x[..., :d].float(), x[..., d:].float()
    return (F.silu(g) * u).to(x.dtype)


def is_pow2(s: torch.Tensor) -> torch.Tensor:
    m, _ = torch.frexp(s)
    return m == 0.5


def poisoned(shape: tuple[int, ...], dtype: torch.dtype = FP8) -> torch.Tensor:
    return torch.full(shape, float("nan"), device="cuda").to(dtype)


# ---------------------------------------------------------------------------------------------
# per_token_quant_fp8 (GPU)

TOKEN_SHAPES = [
    (1, 4096),
    (7, 1000),
    (16, 7168),
    (33, 4097),  # not whole 16-byte vectors: the scalar kernel
    (1024, 4096),
    (5, 40000),  # wider than the registers hold (> 2048 vectors): the streamed part
    (3, 5, 512),
    (4096,),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", TOKEN_SHAPES)
def test_per_token_dynamic(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    q = poisoned(shape)
    s = torch.full((*shape[:-1], 1), 12345.0, device="cuda")
    rq, rs = jit_kernel.per_token_quant_fp8(x, q, s)
    assert rq is q and rs is s
    torch.testing.assert_close(s[..., 0], _div448(_absmax(x)), rtol=1e-6, atol=0)
    assert_fp8_close(q, _quant(x, s))
    q2, s2 = jit_kernel.per_token_quant_fp8(x * 0.5)
    assert q2.shape == x.shape and q2.dtype == FP8 and s2.shape == (*shape[:-1], 1) and s2.dtype == torch.float32
    torch.testing.assert_close(s2[..., 0], _div448(_absmax(x * 0.5)), rtol=1e-6, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_per_token_misaligned_rows(dtype: torch.dtype) -> None:
    base = (torch.randn(9, 4097, device="cuda") * 3).to(dtype)
    x = base[:, 1:]  # row stride 4097: rows not 16-byte aligned
    q, s = jit_kernel.per_token_quant_fp8(x)
    torch.testing.assert_close(s[:, 0], _div448(_absmax(x)), rtol=1e-6, atol=0)
    assert_fp8_close(q, _quant(x, s))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 4096), (37, 1000), (1024, 7168)])
def test_per_token_static(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    s = torch.tensor([0.004], device="cuda")
    q = poisoned(shape)
    rq, rs = jit_kernel.per_token_quant_fp8(x, q, s, is_static=True)
    assert rq is q and rs is s and s.item() == pytest.approx(0.004)
    assert_fp8_close(q, _quant(x, s))  # saturates at +-448
    qz, _ = jit_kernel.per_token_quant_fp8(x, output_s=torch.zeros(1, device="cuda"), is_static=True)
    assert torch.equal(qz.float(), torch.zeros(shape, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_per_token_zero_inf_nan_rows(dtype: torch.dtype) -> None:
    x = torch.randn(6, 1024, device="cuda").to(dtype)
    x[1] = 0  # scale 0, q 0
    x[2, 5] = float("nan")  # ignored by the absmax, NaN in q
    x[3, 7] = float("inf")  # scale inf: finite elements 0, the inf NaN
    x[4] = float("nan")  # all NaN: scale 0, q NaN
    q, s = jit_kernel.per_token_quant_fp8(x)
    qf = q.float()
    assert s[1].item() == 0.0 and torch.equal(qf[1], torch.zeros(1024, device="cuda"))
    ok = [0, 2, 5]
    torch.testing.assert_close(s[ok, 0], _div448(_absmax(x[ok])), rtol=1e-6, atol=0)
    assert torch.isnan(qf[2, 5]) and not torch.isnan(qf[2, :5]).any() and not torch.isnan(qf[2, 6:]).any()
    assert_fp8_close(q[[0, 5]], _quant(x[[0, 5]], s[[0, 5]]))
    assert s[3].item() == float("inf") and torch.isnan(qf[3, 7])
    assert torch.equal(torch.cat([qf[3, :7], qf[3, 8:]]), torch.zeros(1023, device="cuda"))
    assert s[4].item() == 0.0 and torch.isnan(qf[4]).all()


@pytest.mark.gpu
def test_per_token_empty() -> None:
    q, s = jit_kernel.per_token_quant_fp8(torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16))
    assert q.shape == (0, 4096) and s.shape == (0, 1)


# ---------------------------------------------------------------------------------------------
# per_token_group_quant_fp8 (GPU)

GROUP_SHAPES = [(1, 4096), (7, 7168), (33, 384), (1024, 4096), (2, 3, 512), (1024,)]


def _check_group(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, eps: float, ue8m0: bool) -> None:
    expected = ref_group_scale(x, group, eps)
    assert s.shape == expected.shape
    if ue8m0:
        assert is_pow2(s).all()
        assert (s >= expected).all() and (s < 2 * expected).all()
    else:
        torch.testing.assert_close(s, expected, rtol=1e-6, atol=0)
    assert_fp8_close(q, ref_group_quant(x, group, s))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("shape", GROUP_SHAPES)
def test_group_quant(shape, dtype, group: int, column_major: bool, ue8m0: bool) -> None:
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    q, s = jit_kernel.per_token_group_quant_fp8(x, group, column_major_scales=column_major, scale_ue8m0=ue8m0)
    assert q.shape == x.shape and q.dtype == FP8 and s.dtype == torch.float32
    tokens = x.numel() // x.shape[-1]
    if column_major and x.dim() == 2 and tokens > 1:
        assert s.stride() == (1, tokens)
    _check_group(x, q, s, group, 1e-10, ue8m0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("column_major", [False, True])
def test_group_quant_given_outputs(dtype: torch.dtype, column_major: bool) -> None:
    tokens, hidden, group = 37, 1024, 128
    x = (torch.randn(tokens, hidden, device="cuda") * 3).to(dtype)
    q = poisoned((tokens, hidden))
    if column_major:  # DeepGEMM's TMA-aligned layout: tokens padded to a multiple of 4
        buf = torch.full((hidden // group, 40), float("nan"), device="cuda")
        s = buf.t()[:tokens]
    else:
        s = torch.full((tokens, hidden // group), float("nan"), device="cuda")
    rq, rs = jit_kernel.per_token_group_quant_fp8(x, group, output_q=q, output_s=s)
    assert rq is q and rs is s
    _check_group(x, q, s, group, 1e-10, False)
    if column_major:
        assert torch.isnan(buf[:, tokens:]).all()  # the padding is left alone


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_group_quant_misaligned_rows(dtype: torch.dtype) -> None:
    base = (torch.randn(11, 512 + 1, device="cuda") * 3).to(dtype)
    x = base[:, 1:]  # rows of 512 at stride 513: not 16-byte aligned, the scalar loads
    q, s = jit_kernel.per_token_group_quant_fp8(x, 128)
    _check_group(x, q, s, 128, 1e-10, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_group_quant_zero_inf_nan(dtype: torch.dtype) -> None:
    x = torch.randn(4, 512, device="cuda").to(dtype)
    x[0, :128] = 0  # scale eps / 448, q 0
    x[1, 130] = float("nan")  # group 1 of row 1: NaN ignored by the scale, NaN in q
    x[2, 300] = float("inf")  # group 2 of row 2: scale inf, finite 0, inf NaN
    q, s = jit_kernel.per_token_group_quant_fp8(x, 128)
    qf = q.float().view(4, 4, 128)
    assert s[0, 0].item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert torch.equal(qf[0, 0], torch.zeros(128, device="cuda"))
    torch.testing.assert_close(s[1, 1], ref_group_scale(x, 128, 1e-10)[1, 1], rtol=1e-6, atol=0)
    assert torch.isnan(qf[1, 1, 2]) and torch.isnan(qf[1, 1]).sum() == 1
    assert s[2, 2].item() == float("inf") and torch.isnan(qf[2, 2, 44])
    assert (qf[2, 2][torch.arange(128, device="cuda") != 44] == 0).all()
    fine = torch.ones(4, 4, dtype=torch.bool, device="cuda")
    fine[0, 0] = fine[1, 1] = fine[2, 2] = False
    torch.testing.assert_close(s[fine], ref_group_scale(x, 128, 1e-10)[fine], rtol=1e-6, atol=0)
    # eps = 0: an all-zero group gets scale 0 and q 0 (finite)
    q0, s0 = jit_kernel.per_token_group_quant_fp8(torch.zeros(2, 128, device="cuda", dtype=dtype), 64, eps=0.0)
    assert torch.equal(s0, torch.zeros(2, 2, device="cuda")) and torch.equal(
        q0.float(), torch.zeros(2, 128, device="cuda")
    )


@pytest.mark.gpu
def test_group_quant_empty() -> None:
    q, s = jit_kernel.per_token_group_quant_fp8(torch.empty(0, 512, device="cuda"), 128)
    assert q.shape == (0, 512) and s.shape == (0, 4)


# ---------------------------------------------------------------------------------------------
# silu_and_mul_per_token_group_quant_fp8 (GPU)


def _check_fused(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, group: int, ue8m0: bool = False) -> None:
    """Bit for bit against jit_kernel.silu_and_mul followed by the group quant (when the package has
    silu_and_mul), and close to the fp32 torch reference (its F.silu is the accurate one; the
    kernels' fast __expf / __fdividef may move the activation by an ulp of T)."""
    if hasattr(jit_kernel, "silu_and_mul"):
        a = jit_kernel.silu_and_mul(x)
        eq, es = jit_kernel.per_token_group_quant_fp8(a, group, scale_ue8m0=ue8m0)
        assert torch.equal(s, es)  # values, whatever the layouts
        assert torch.equal(q.view(torch.uint8), eq.view(torch.uint8))
        _check_group(a, q, s, group, 1e-10, ue8m0)
    ref = ref_silu_and_mul(x)
    expected = ref_group_scale(ref, group, 1e-10)
    if ue8m0:
        assert is_pow2(s).all() and (s >= expected / 2).all() and (s < 4 * expected).all()
    else:
        torch.testing.assert_close(s, expected, rtol=1e-2, atol=0)
    dequant = q.float().reshape(*q.shape[:-1], -1, group) * s[..., None]
    torch.testing.assert_close(dequant.reshape(ref.shape), ref.float(), rtol=0.08, atol=s.max().item() * 2.0**-8)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("ue8m0", [False, True])
# Up to 1024 x 2 * 2048 the launch fits in one wave of an H100 (one vector of gate and up per lane);
# 4096 x 2 * 2048 takes the layout for more (two vectors per lane).
@pytest.mark.parametrize(
    "shape", [(1, 2 * 4096), (7, 2 * 7168), (33, 2 * 384), (1024, 2 * 2048), (4096, 2 * 2048), (2, 3, 1024)]
)
def test_fused_silu_and_mul_group_quant(shape, dtype, group: int, column_major: bool, ue8m0: bool) -> None:
    x = (torch.randn(shape, device="cuda") * 3).to(dtype)
    d = shape[-1] // 2
    q, s = jit_kernel.silu_and_mul_per_token_group_quant_fp8(
        x, group, column_major_scales=column_major, scale_ue8m0=ue8m0
    )
    assert q.shape == (*shape[:-1], d) and q.dtype == FP8 and s.shape == (*shape[:-1], d // group)
    _check_fused(x, q, s, group, ue8m0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [19, 8192])  # one wave of an H100, and more
def test_fused_given_outputs_and_strided_input(dtype: torch.dtype, tokens: int) -> None:
    d, group = 512, 128
    base = (torch.randn(tokens, 2 * d + 64, device="cuda") * 3).to(dtype)
    x = base[:, : 2 * d]  # row stride 2d + 64 (still aligned)
    q = poisoned((tokens, d))
    s = torch.full((d // group, tokens), float("nan"), device="cuda").t()
    rq, rs = jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, group, output_q=q, output_s=s)
    assert rq is q and rs is s
    _check_fused(x, q, s, group)


# ---------------------------------------------------------------------------------------------
# CUDA graphs, torch.compile (GPU)


@pytest.mark.gpu
def test_cuda_graph_replay() -> None:
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    xf = torch.randn(16, 2 * 4096, device="cuda", dtype=torch.bfloat16)
    q1, s1 = poisoned((16, 4096)), torch.empty(16, 1, device="cuda")
    q2, s2 = poisoned((16, 4096)), torch.empty(4096 // 128, 16, device="cuda").t()
    q3, s3 = poisoned((16, 4096)), torch.empty(16, 4096 // 128, device="cuda")
    calls = [
        lambda: jit_kernel.per_token_quant_fp8(x, q1, s1),
        lambda: jit_kernel.per_token_group_quant_fp8(x, 128, output_q=q2, output_s=s2),
        lambda: jit_kernel.silu_and_mul_per_token_group_quant_fp8(xf, 128, output_q=q3, output_s=s3),
    ]
    for call in calls:  # load / compile outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    x.copy_(torch.randn_like(x) * 5)
    xf.copy_(torch.randn_like(xf) * 5)
    for q in (q1, q2, q3):
        q.view(torch.uint8).fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(s1[:, 0], _div448(_absmax(x)), rtol=1e-6, atol=0)
    assert_fp8_close(q1, _quant(x, s1))
    _check_group(x, q2, s2, 128, 1e-10, False)
    _check_fused(xf, q3, s3, 128)


@pytest.mark.gpu
def test_pdl_on_and_off_agree() -> None:
    x = torch.randn(40, 2048, device="cuda", dtype=torch.bfloat16)
    for call in (
        lambda pdl: jit_kernel.per_token_quant_fp8(x, enable_pdl=pdl),
        lambda pdl: jit_kernel.per_token_group_quant_fp8(x, 128, enable_pdl=pdl),
        lambda pdl: jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, 64, enable_pdl=pdl),
    ):
        (q1, s1), (q2, s2) = call(True), call(False)
        assert torch.equal(q1.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s1, s2)


def _compiled_model(x: torch.Tensor, xf: torch.Tensor):
    q1, s1 = jit_kernel.per_token_quant_fp8(x)
    q2, s2 = jit_kernel.per_token_group_quant_fp8(x, 128, column_major_scales=True)
    q3, s3 = jit_kernel.silu_and_mul_per_token_group_quant_fp8(xf, 64, scale_ue8m0=True)
    return q1.float() * s1, q2.float(), s2, q3.float(), s3


@pytest.mark.gpu
def test_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    x = torch.randn(24, 1024, device="cuda", dtype=torch.bfloat16)
    xf = torch.randn(24, 2048, device="cuda", dtype=torch.bfloat16)
    expected = _compiled_model(x, xf)
    got = torch.compile(_compiled_model, fullgraph=True)(x, xf)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# CPU: registration, fake implementations, bad inputs


@pytest.mark.parametrize(
    "name", ["per_token_quant_fp8", "per_token_group_quant_fp8", "silu_and_mul_per_token_group_quant_fp8"]
)
def test_registered_with_mutated_outputs(name: str) -> None:
    schema = getattr(torch.ops.jit_kernel, name).default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"output_q", "output_s"}, schema


def test_fake_implementations() -> None:
    with fake_cuda():
        x = torch.empty(4, 512, device="cuda", dtype=torch.bfloat16)
        q = torch.empty(4, 512, device="cuda", dtype=FP8)
        torch.ops.jit_kernel.per_token_quant_fp8(x, q, torch.empty(4, 1, device="cuda"), False)
        torch.ops.jit_kernel.per_token_group_quant_fp8(x, q, torch.empty(4, 4, device="cuda"), 128, 1e-10, False)
        torch.ops.jit_kernel.silu_and_mul_per_token_group_quant_fp8(
            x, _e(4, 256, dtype=FP8), torch.empty(4, 4, device="cuda"), 64, 1e-10, True
        )


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=dtype)


def _strided(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty_strided(shape, strides, device="cuda", dtype=dtype)


TOKEN_BAD = [
    ({"input": lambda: _e(8, 64, dtype=torch.int32)}, TypeError, "per_token_quant_fp8: input must be one of"),
    ({"input": lambda: "x"}, TypeError, "per_token_quant_fp8: input must be a torch.Tensor, got str"),
    ({"input": lambda: torch.empty((), device="cuda")}, ValueError, "input must have at least one dimension"),
    ({"input": lambda: _strided((8, 64), (1, 8), torch.bfloat16)}, ValueError, r"(?s)'input'.*Stride mismatch"),
    ({"output_q": lambda: _e(8, 64)}, TypeError, r"(?s)'output_q'.*Dtype mismatch: expected float8_e4m3fn"),
    ({"output_q": lambda: _e(8, 65, dtype=FP8)}, ValueError, r"(?s)'output_q'.*Size mismatch"),
    ({"output_s": lambda: _e(8, 1)}, TypeError, r"(?s)'output_s'.*Dtype mismatch: expected float32"),
    ({"output_s": lambda: _e(8, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*mismatch"),
    ({"output_s": lambda: _e(1, 8, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*mismatch"),
    ({"output_q": lambda: [0]}, TypeError, "per_token_quant_fp8: output_q must be a torch.Tensor, got list"),
    ({"output_s": lambda: 3.0}, TypeError, "per_token_quant_fp8: output_s must be a torch.Tensor, got float"),
    ({"is_static": lambda: True}, ValueError, "is_static=True needs the scale"),
    ({"is_static": lambda: 1}, TypeError, "is_static must be a bool, got int"),
    ({"enable_pdl": lambda: "yes"}, TypeError, "enable_pdl must be a bool or None, got str"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), TOKEN_BAD)
def test_per_token_bad_inputs(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"input": _e(8, 64)} | {k: v() for k, v in kwargs.items()}
        with pytest.raises(error, match=match):
            jit_kernel.per_token_quant_fp8(**args)


def test_per_token_static_scale_must_be_one_value() -> None:
    with fake_cuda():
        with pytest.raises(ValueError, match=r"(?s)'output_s'.*Size mismatch"):
            jit_kernel.per_token_quant_fp8(_e(8, 64), output_s=_e(2, dtype=torch.float32), is_static=True)
        with pytest.raises(ValueError, match="output_s must hold one float32 scale"):
            jit_kernel.per_token_quant_fp8(_e(8, 64), output_s=_e(1, 2, dtype=torch.float32), is_static=True)
        with pytest.raises(TypeError, match=r"(?s)'output_s'.*Dtype mismatch: expected float32"):
            jit_kernel.per_token_quant_fp8(_e(8, 64), output_s=_e(1), is_static=True)


G = "per_token_group_quant_fp8"
GROUP_BAD = [
    (
        {"input": lambda: _e(8, 100)},
        ValueError,
        rf"{G}: the last dimension of input \(100\) must be a multiple of group_size \(64\)",
    ),
    ({"group_size": lambda: 32}, ValueError, rf"{G}: group_size must be 64 or 128, got 32"),
    ({"group_size": lambda: 256}, ValueError, rf"{G}: group_size must be 64 or 128, got 256"),
    ({"group_size": lambda: 0}, ValueError, r"must be a multiple of group_size \(0\)"),
    ({"group_size": lambda: 64.0}, TypeError, rf"{G}: group_size must be an int, got float"),
    ({"input": lambda: _e(8, 256, dtype=torch.int8)}, TypeError, rf"{G}: input must be one of"),
    ({"input": lambda: [1.0]}, TypeError, rf"{G}: input must be a torch.Tensor, got list"),
    ({"input": lambda: _strided((8, 256), (1, 8), torch.bfloat16)}, ValueError, r"(?s)'input'.*Stride mismatch"),
    ({"output_q": lambda: _e(8, 256)}, TypeError, r"(?s)'output_q'.*Dtype mismatch: expected float8_e4m3fn"),
    ({"output_q": lambda: _e(8, 128, dtype=FP8)}, ValueError, r"(?s)'output_q'.*Size mismatch"),
    ({"output_q": lambda: _strided((8, 256), (512, 1), FP8)}, ValueError, r"(?s)'output_q'.*not contiguous"),
    ({"output_q": lambda: [0]}, TypeError, rf"{G}: output_q must be a torch.Tensor, got list"),
    ({"output_s": lambda: 3.0}, TypeError, rf"{G}: output_s must be a torch.Tensor, got float"),
    ({"output_s": lambda: _e(8, 4)}, TypeError, r"(?s)'output_s'.*Dtype mismatch: expected float32"),
    ({"output_s": lambda: _e(8, 8, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*Size mismatch"),
    ({"output_s": lambda: _strided((8, 4), (1, 1))}, ValueError, r"output_s must be row-major .* got strides \(1, 1\)"),
    ({"output_s": lambda: _strided((8, 4), (2, 1))}, ValueError, r"output_s must be row-major .* got strides \(2, 1\)"),
    ({"eps": lambda: -1.0}, ValueError, rf"{G}: eps must be finite and >= 0, got -1"),
    ({"eps": lambda: float("nan")}, ValueError, rf"{G}: eps must be finite and >= 0"),
    ({"eps": lambda: "small"}, TypeError, rf"{G}: eps must be a float, got str"),
    ({"enable_pdl": lambda: "yes"}, TypeError, rf"{G}: enable_pdl must be a bool or None, got str"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), GROUP_BAD)
def test_group_bad_inputs(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"input": _e(8, 256), "group_size": 64} | {k: v() for k, v in kwargs.items()}
        with pytest.raises(error, match=match):
            jit_kernel.per_token_group_quant_fp8(**args)


F_ = "silu_and_mul_per_token_group_quant_fp8"
FUSED_BAD = [
    ({"input": lambda: _e(8, 257)}, ValueError, rf"{F_}: the last dimension of input \(257\) must be even"),
    (
        {"input": lambda: _e(8, 192)},
        ValueError,
        rf"{F_}: the last dimension of input / 2 \(96\) must be a multiple of group_size \(64\)",
    ),
    ({"group_size": lambda: 32}, ValueError, rf"{F_}: group_size must be 64 or 128, got 32"),
    ({"output_q": lambda: _e(8, 256, dtype=FP8)}, ValueError, r"(?s)'output_q'.*Size mismatch"),
    ({"output_s": lambda: _e(8, 4, dtype=torch.float32)}, ValueError, r"(?s)'output_s'.*Size mismatch"),
    ({"input": lambda: _e(8, 256, dtype=torch.float64)}, TypeError, rf"{F_}: input must be one of"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), FUSED_BAD)
def test_fused_bad_inputs(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"input": _e(8, 256), "group_size": 64} | {k: v() for k, v in kwargs.items()}
        with pytest.raises(error, match=match):
            jit_kernel.silu_and_mul_per_token_group_quant_fp8(**args)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: jit_kernel.per_token_quant_fp8(x),
        lambda x: jit_kernel.per_token_group_quant_fp8(x, 64),
        lambda x: jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, 64),
    ],
)
def test_rejects_cpu_tensors(call, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the kernels (whose C++ check this is) are built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'input'.*Device mismatch: expected cuda but got cpu"):
        call(torch.randn(8, 256))
