"""RMSNorm fused with fp8 quantisation (static per-tensor, per-token, per-token-group) and Gemma's RMSNorm.

The fused ops are checked bit for bit against the two-launch composition they replace (jit_kernel's
rmsnorm or fused_add_rmsnorm on tensors of the same layout, then per_tensor_quant_fp8(is_static=True),
per_token_quant_fp8 or per_token_group_quant_fp8), and within one fp8 step of a float64 reference.
Outputs are poisoned first (NaN, or 0xFF bytes: NaN in float8_e4m3fn); inputs are fresh random tensors.
CPU tests (everywhere): registration, fake implementations and torch.compile tracing, bad inputs
(fake CUDA tensors through the C++ launchers' checks), and the sources compiling for sm_90a.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import jit_kernel
from _norm_helpers import assert_close, fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel.engine import families

REPO = Path(__file__).resolve().parent.parent
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
EPS = 1e-6
NAN = float("nan")


# ---------------------------------------------------------------------------------------------
# Inputs and references


def _rows(src: torch.Tensor, pad: int = 0, offset: int = 0) -> torch.Tensor:
    """``src [n, d]`` copied into rows of stride ``d + pad``, ``offset`` elements into a NaN buffer."""
    n, d = src.shape
    buf = torch.full((offset + n * (d + pad) + 16,), NAN, device="cuda", dtype=src.dtype)
    rows = buf[offset : offset + n * (d + pad)].view(n, d + pad)[:, :d]
    rows.copy_(src)
    return rows


def _same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its sizes, strides and storage offset (so the same alignment)."""
    elements = t.untyped_storage().nbytes() // t.element_size()
    storage = torch.as_strided(t, (elements,), (1,), 0).clone()
    return torch.as_strided(storage, t.size(), t.stride(), t.storage_offset())


def _case(n: int, d: int, dtype: torch.dtype, pad: int = 0, offset: int = 0):
    """x, residual (rows of one layout) and weight."""
    x = _rows((torch.randn(n, d, device="cuda") * 2).to(dtype), pad, offset)
    r = _rows(torch.randn(n, d, device="cuda").to(dtype), pad, offset)
    w = (torch.rand(d, device="cuda") + 0.5).to(dtype)
    return x, r, w


def composed_norm(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float = EPS):
    """The first launch of the composition: (y, new residual) as rmsnorm / fused_add_rmsnorm compute
    them on tensors of x's and r's layouts (the layout picks the launch whose sums the fused op repeats)."""
    if r is None:
        return jit_kernel.rmsnorm(x, w, eps), None
    xc, rc = _same_layout(x), _same_layout(r)
    jit_kernel.fused_add_rmsnorm(xc, rc, w, eps)
    return xc, rc


def ref_normed(x: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """float64 rmsnorm of x (or of T(x + r)), unrounded."""
    if r is not None:
        x = (x.float() + r.float()).to(x.dtype)
    xf = x.double()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def assert_q_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), int(
        (a.view(torch.uint8) != b.view(torch.uint8)).sum()
    )


def assert_within_one_fp8_step(q: torch.Tensor, expected: torch.Tensor) -> None:
    """At most one e4m3 step apart (1/8 relative; 2^-9 near zero), and mostly equal: the rounding of
    y to the dtype moves an element across an fp8 rounding boundary now and then (bf16: about 1.6%
    of them, a quarter of a bf16 step over an fp8 step)."""
    a, b = q.float(), expected.float()
    assert not torch.isnan(a).any()
    torch.testing.assert_close(a, b, rtol=0.125, atol=2.0**-9)
    if a.numel() >= 1000:
        assert (a == b).float().mean().item() > 0.95


def _quant(y: torch.Tensor, scale: torch.Tensor, max_value: float = FP8_MAX, dtype: torch.dtype = FP8) -> torch.Tensor:
    """fp8(clamp(y * (1 / scale), -max, max)), scale broadcast; 0 for a zero scale."""
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    return (y.float() * inv).clamp(-max_value, max_value).to(dtype)


def poisoned_q(shape: tuple[int, ...], dtype: torch.dtype = FP8) -> torch.Tensor:
    q = torch.empty(shape, device="cuda", dtype=dtype)
    q.view(torch.uint8).fill_(0xFF)  # NaN in float8_e4m3fn and float8_e5m2
    return q


def pack_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """float32 power-of-two scales [N, G] as DeepGEMM's packed UE8M0 words, int32 [N, ceil(G / 4)]:
    group g is byte g % 4 (little-endian) of word g // 4, the scale's biased exponent; 0 bytes pad."""
    exponents = ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    g = exponents.shape[-1]
    exponents = F.pad(exponents, (0, (g + 3) // 4 * 4 - g))
    return exponents.contiguous().view(torch.int32)


# The row shapes a launch can take (csrc/norm/norm_quant.cuh), by hidden size: specialised bf16
# configs (2048 ... 8192), the generic config's RowShape for rmsnorm's other sizes (1024, 16384)
# and its bounded kernel at 1, 2 and 4 vectors per thread (64, 1000, 3000, 6144, 12288), the
# scalar two-pass kernel (1001: not whole 16-byte vectors) and the vector one (40000: too long).
# Token counts: 1 and 7 (latency-bound, weight loaded with the row), 300 (weight after the sum).
STATIC_SHAPES = [
    (n, d)
    for n in (1, 7, 300)
    for d in (64, 1000, 1001, 1024, 2048, 3000, 4096, 5120, 6144, 7168, 8192, 12288, 16384, 40000)
]
STATIC_SHAPES += [pytest.param(2048, 1024, id="big-2048-1024"), pytest.param(4097, 4096, id="big-4097-4096")]
# The last row count whose rows run over a cluster of CTAs (norm_quant.cuh's kClusterMaxRows) and the
# first that does not, at the hidden sizes whose rows are split (12 or more warps with the residual).
KERNEL_EDGE_SHAPES = [(n, d) for n in (16, 17) for d in (4096, 5120, 7168, 8192)]
# Rows of one vector a thread with the residual (D 4096) run two vectors a thread from there up to
# norm_quant.cuh's kPairedMaxRows (epilogue_paired_kernel): its last row count and the first after.
KERNEL_EDGE_SHAPES += [(256, 4096), (257, 4096)]
STATIC_SHAPES += KERNEL_EDGE_SHAPES


# ---------------------------------------------------------------------------------------------
# Static per-tensor scale (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(("n", "d"), STATIC_SHAPES)
def test_static_matches_composition(n: int, d: int, fused: bool, dtype: torch.dtype) -> None:
    x, r, w = _case(n, d, dtype)
    residual = r if fused else None
    scale = torch.tensor([0.0125], device="cuda")  # |y| / scale passes 448: the clamp is exercised
    y, new_r = composed_norm(x, residual, w)
    expected, _ = jit_kernel.per_tensor_quant_fp8(y.contiguous(), output_s=scale, is_static=True)
    reference = _quant(ref_normed(x, residual, w), scale)
    x_before = x.clone()
    q, normed = poisoned_q((n, d)), torch.full((n, d), NAN, device="cuda", dtype=dtype)
    if fused:
        got = jit_kernel.fused_add_rmsnorm_quant_fp8(x, r, w, scale, EPS, out=q, normed_out=normed)
        torch.testing.assert_close(r, new_r, rtol=0, atol=0)
        assert torch.equal(x, x_before)  # input is only read
    else:
        got = jit_kernel.rmsnorm_quant_fp8(x, w, scale, EPS, out=q, normed_out=normed)
    assert got is q
    assert_q_equal(q, expected)
    assert torch.equal(normed, y)
    assert_within_one_fp8_step(q, reference)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
def test_static_scale_forms_and_e5m2(fused: bool, dtype: torch.dtype) -> None:
    """A tensor of one element (any shape) and a float give the same bits; a zero scale gives 0; a
    float8_e5m2 ``out`` is fp8_e5m2(clamp(y * (1 / scale), -57344, 57344)) of the same y."""
    x, r, w = _case(37, 4096, dtype)

    def call(scale: torch.Tensor | float, **kwargs: torch.Tensor) -> torch.Tensor:
        if fused:
            return jit_kernel.fused_add_rmsnorm_quant_fp8(x, r.clone(), w, scale, **kwargs)
        return jit_kernel.rmsnorm_quant_fp8(x, w, scale, **kwargs)

    a = call(torch.tensor([0.02], device="cuda"))
    assert a.dtype == FP8 and a.shape == x.shape
    assert_q_equal(call(0.02), a)
    assert_q_equal(call(torch.tensor(0.02, device="cuda")), a)
    assert_q_equal(call(torch.tensor([[0.02]], device="cuda")), a)
    assert torch.equal(call(torch.zeros(1, device="cuda")).float(), torch.zeros(x.shape, device="cuda"))
    assert torch.equal(call(0.0).float(), torch.zeros(x.shape, device="cuda"))
    q5, normed = poisoned_q(x.shape, torch.float8_e5m2), torch.full_like(x, NAN)
    assert call(0.001, out=q5, normed_out=normed) is q5
    assert_q_equal(q5, _quant(normed, torch.tensor(0.001, device="cuda"), 57344.0, torch.float8_e5m2))


# ---------------------------------------------------------------------------------------------
# Dynamic per-token scales (GPU)

TOKEN_SHAPES = [(n, d) for n in (1, 7, 300) for d in (64, 1000, 1001, 1024, 4096, 5120, 7168, 12288, 16384, 40000)]
TOKEN_SHAPES += [pytest.param(2048, 1024, id="big-2048-1024"), pytest.param(4097, 8192, id="big-4097-8192")]
TOKEN_SHAPES += KERNEL_EDGE_SHAPES
# The scale's closeness to the float64 reference: one rounding of the largest element to the dtype
# (at most half a step: 2^-8 relative in bf16, 2^-11 in fp16), with room for rrms's last bits.
SCALE_RTOL = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 1e-5}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(("n", "d"), TOKEN_SHAPES)
def test_per_token_matches_composition(n: int, d: int, fused: bool, dtype: torch.dtype) -> None:
    x, r, w = _case(n, d, dtype)
    residual = r if fused else None
    y, new_r = composed_norm(x, residual, w)
    expected_q, expected_s = jit_kernel.per_token_quant_fp8(y.contiguous())
    reference = ref_normed(x, residual, w)
    q, s = poisoned_q((n, d)), torch.full((n, 1), NAN, device="cuda")
    normed = torch.full((n, d), NAN, device="cuda", dtype=dtype)
    if fused:
        got = jit_kernel.fused_add_rmsnorm_per_token_quant_fp8(x, r, w, EPS, q, s, normed_out=normed)
        torch.testing.assert_close(r, new_r, rtol=0, atol=0)
    else:
        got = jit_kernel.rmsnorm_per_token_quant_fp8(x, w, EPS, q, s, normed_out=normed)
    assert got[0] is q and got[1] is s
    assert_q_equal(q, expected_q)
    assert torch.equal(s, expected_s)
    assert torch.equal(normed, y)
    expected_scale = (reference.abs().amax(-1, keepdim=True) / FP8_MAX).float()
    torch.testing.assert_close(s, expected_scale, rtol=SCALE_RTOL[dtype], atol=0)
    assert_within_one_fp8_step(q, _quant(reference, s))


# ---------------------------------------------------------------------------------------------
# Dynamic per-token-group scales (GPU)

GROUP_SHAPES = [(n, d) for n in (1, 7, 300) for d in (128, 1024, 2048, 4096, 5120, 7168, 16384, 40960)]
GROUP_SHAPES += [pytest.param(4097, 7168, id="big-4097-7168")]
GROUP_SHAPES += KERNEL_EDGE_SHAPES


def _group_scales(layout: str, n: int, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """output_s for ``layout`` (poisoned) and the buffer it views."""
    if layout == "row":
        buf = torch.full((n, groups), NAN, device="cuda")
        return buf, buf
    if layout == "column":
        buf = torch.full((groups, n), NAN, device="cuda")
        return buf.t(), buf
    padded = (n + 3) // 4 * 4
    if layout == "padded":  # DeepGEMM's TMA-aligned float layout: tokens padded to 4
        buf = torch.full((groups, padded), NAN, device="cuda")
        return buf.t()[:n], buf
    words = (groups + 3) // 4  # packed UE8M0
    buf = torch.full((words, padded), -1, device="cuda", dtype=torch.int32)
    return buf.t()[:n], buf


def _check_group(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    w: torch.Tensor,
    call: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    group: int,
    layout: str,
    ue8m0: bool,
) -> None:
    """``call(output_q, output_s, normed_out)`` against the composition and the float64 reference."""
    n, d = x.shape
    y, new_r = composed_norm(x, residual, w)
    packed = layout == "packed"
    expected_q, expected_s = jit_kernel.per_token_group_quant_fp8(y.contiguous(), group, scale_ue8m0=ue8m0 or packed)
    reference = ref_normed(x, residual, w)
    q, normed = poisoned_q((n, d)), torch.full((n, d), NAN, device="cuda", dtype=x.dtype)
    s, buf = _group_scales(layout, n, d // group)
    got = call(q, s, normed)
    assert got[0] is q and got[1] is s
    if residual is not None:
        torch.testing.assert_close(residual, new_r, rtol=0, atol=0)
    assert_q_equal(q, expected_q)
    assert torch.equal(normed, y)
    if packed:
        assert torch.equal(s, pack_ue8m0(expected_s))
        assert (buf.t()[n:] == -1).all()  # padding tokens are left alone
        return
    assert torch.equal(s, expected_s)  # values, whatever the layout
    if layout == "padded":
        assert torch.isnan(buf.t()[n:]).all()
    groups = reference.reshape(n, d // group, group)
    expected_scale = (groups.abs().amax(-1).clamp(min=1e-10) / FP8_MAX).float()
    if ue8m0:
        mantissa, _ = torch.frexp(s)
        assert (mantissa == 0.5).all() and (s >= expected_scale * (1 - SCALE_RTOL[x.dtype])).all()
    else:
        torch.testing.assert_close(s, expected_scale, rtol=SCALE_RTOL[x.dtype], atol=0)
    assert_within_one_fp8_step(q, _quant(groups, s[..., None]).reshape(n, d))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize(("n", "d"), GROUP_SHAPES)
def test_group_matches_composition(n: int, d: int, group: int, fused: bool, dtype: torch.dtype) -> None:
    x, r, w = _case(n, d, dtype)
    if fused:
        call = lambda q, s, normed: jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(  # noqa: E731
            x, r, w, group, output_q=q, output_s=s, normed_out=normed
        )
    else:
        call = lambda q, s, normed: jit_kernel.rmsnorm_per_token_group_quant_fp8(  # noqa: E731
            x, w, group, output_q=q, output_s=s, normed_out=normed
        )
    _check_group(x, r if fused else None, w, call, group, "row", False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    ("layout", "ue8m0"), [("row", True), ("column", False), ("column", True), ("padded", False), ("packed", True)]
)
@pytest.mark.parametrize(("n", "d"), [(1, 4096), (37, 4096), (37, 7168), (300, 1024), (5, 40960), (9, 640)])
def test_group_scale_layouts(n: int, d: int, layout: str, ue8m0: bool, fused: bool, dtype: torch.dtype) -> None:
    """Row-, column-major and TMA-padded float32 scales, power-of-two scales, and the packed UE8M0
    words (d 640: 5 groups of 128, a partial last word) against a reference packing."""
    x, r, w = _case(n, d, dtype)
    group = 128
    op = (
        jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8
        if fused
        else jit_kernel.rmsnorm_per_token_group_quant_fp8
    )
    head = (x, r, w) if fused else (x, w)
    call = lambda q, s, normed: op(  # noqa: E731
        *head, group, scale_ue8m0=ue8m0, output_q=q, output_s=s, normed_out=normed
    )
    _check_group(x, r if fused else None, w, call, group, layout, ue8m0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("n", [1, 37, 300])
def test_group_allocated_layouts(n: int, dtype: torch.dtype) -> None:
    """The scales the ops allocate: row-major, column-major ``[groups, tokens]`` transposed, and packed
    int32 over a ``[words, tokens padded to 4]`` buffer; each equal to the composition's."""
    x, _, w = _case(n, 5120, dtype)
    y, _ = composed_norm(x, None, w)
    _, rows = jit_kernel.per_token_group_quant_fp8(y, 128)
    _, pow2 = jit_kernel.per_token_group_quant_fp8(y, 128, scale_ue8m0=True)
    _, s = jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, 128)
    assert s.stride() == (40, 1) and torch.equal(s, rows)
    _, s = jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, 128, column_major_scales=True)
    assert torch.equal(s, rows) and (n == 1 or s.stride() == (1, n))
    q, s = jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, 128, packed_ue8m0=True)
    assert s.dtype == torch.int32 and s.shape == (n, 10) and s.stride(1) == (n + 3) // 4 * 4
    assert n == 1 or s.stride(0) == 1
    assert torch.equal(s, pack_ue8m0(pow2))
    expected_q, _ = jit_kernel.per_token_group_quant_fp8(y, 128, scale_ue8m0=True)
    assert_q_equal(q, expected_q)


# ---------------------------------------------------------------------------------------------
# Every quantiser: layouts, edge shapes, forms (GPU)


def _mode_calls(mode: str, fused: bool, x, r, w) -> Callable[..., object]:
    """The op of ``mode`` as ``call(**outputs)``."""
    if mode == "static":
        f = jit_kernel.fused_add_rmsnorm_quant_fp8 if fused else jit_kernel.rmsnorm_quant_fp8
        return lambda **kw: f(*((x, r, w) if fused else (x, w)), 0.0125, **kw)
    if mode == "token":
        f = jit_kernel.fused_add_rmsnorm_per_token_quant_fp8 if fused else jit_kernel.rmsnorm_per_token_quant_fp8
        return lambda **kw: f(*((x, r, w) if fused else (x, w)), **kw)
    f = (
        jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8
        if fused
        else jit_kernel.rmsnorm_per_token_group_quant_fp8
    )
    return lambda **kw: f(*((x, r, w) if fused else (x, w)), 128, **kw)


def _composition(mode: str, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = y.contiguous()
    if mode == "static":
        return (jit_kernel.per_tensor_quant_fp8(y, output_s=torch.tensor([0.0125], device="cuda"), is_static=True)[0],)
    if mode == "token":
        return jit_kernel.per_token_quant_fp8(y)
    return jit_kernel.per_token_group_quant_fp8(y, 128)


def _as_tuple(result: object) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)  # type: ignore[return-value]


def _assert_results(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    assert_q_equal(got[0], expected[0])
    for a, b in zip(got[1:], expected[1:], strict=True):
        assert torch.equal(a, b)


MODES = ["static", "token", "group"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("d", "pad", "offset"), [(4096, 64, 0), (4096, 8, 1), (1024, 0, 1), (5120, 3, 0), (7168, 128, 0), (3072, 8, 0)]
)
def test_strided_and_misaligned_rows(d: int, pad: int, offset: int, mode: str, fused: bool, dtype: torch.dtype) -> None:
    """Rows at a stride, or off 16-byte alignment (the scalar two-pass kernel, as rmsnorm takes it)."""
    x, r, w = _case(17, d, dtype, pad=pad, offset=offset)
    y, new_r = composed_norm(x, r if fused else None, w)
    expected = _composition(mode, y)
    got = _as_tuple(_mode_calls(mode, fused, x, r, w)())
    _assert_results(got, expected)
    if fused:
        torch.testing.assert_close(r, new_r, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize(
    ("d", "mode"),
    # 8000: a width no group of 128 tiles, for the modes that take it.
    [(d, mode) for d in (4096, 3072, 8000) for mode in MODES if mode != "group" or d % 128 == 0],
)
def test_misaligned_outputs_keep_the_bits(d: int, mode: str, fused: bool) -> None:
    """q and normed_out at odd offsets are written element by element; the rows are reduced as
    before, so the results are still the composition's bit for bit."""
    dtype = torch.bfloat16
    x, r, w = _case(9, d, dtype)
    y, _ = composed_norm(x, r if fused else None, w)
    expected = _composition(mode, y)
    q = poisoned_q((9 * d + 1,))[1:].view(9, d)
    normed = torch.full((9 * d + 1,), NAN, device="cuda", dtype=dtype)[1:].view(9, d)
    out = {"out": q} if mode == "static" else {"output_q": q}
    got = _as_tuple(_mode_calls(mode, fused, x, r, w)(normed_out=normed, **out))
    assert got[0] is q
    _assert_results(got, expected)
    assert torch.equal(normed, y)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_empty_3d_and_functional_forms(mode: str, fused: bool) -> None:
    """0 tokens; a 3-D input (viewed as rows); the functional form twice (the second call takes the
    eager fast path) equals the out= form."""
    dtype = torch.bfloat16
    x, r, w = _case(0, 4096, dtype)
    got = _as_tuple(_mode_calls(mode, fused, x, r, w)())
    assert got[0].shape == (0, 4096) and got[0].dtype == FP8
    x, r, w = _case(12, 4096, dtype)
    x3, r3 = x.view(3, 4, 4096), r.view(3, 4, 4096)
    y, _ = composed_norm(x, r if fused else None, w)
    expected = _composition(mode, y)
    for _ in range(2):
        rr = _same_layout(r3)
        got = _as_tuple(_mode_calls(mode, fused, x3, rr, w)())
        assert got[0].shape == (3, 4, 4096)
        _assert_results(tuple(t.reshape(12, -1) for t in got), expected)
    for _ in range(2):  # 2-D: the full path, then the fast path
        rr = _same_layout(r)
        _assert_results(_as_tuple(_mode_calls(mode, fused, x, rr, w)()), expected)


@pytest.mark.gpu
def test_cuda_graph_reads_the_current_scale() -> None:
    """The static scale tensor is read on the device: a graph replay after the scale changes uses
    the new value; the dynamic ops replay as well."""
    x, _, w = _case(16, 4096, torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    q1, q2, s2 = poisoned_q((16, 4096)), poisoned_q((16, 4096)), torch.empty(16, 1, device="cuda")
    q3, s3 = poisoned_q((16, 4096)), torch.empty(4096 // 128, 16, device="cuda").t()
    calls = [
        lambda: jit_kernel.rmsnorm_quant_fp8(x, w, scale, out=q1),
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(x, w, output_q=q2, output_s=s2),
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, 128, output_q=q3, output_s=s3),
    ]
    for call in calls:  # load (or compile) outside the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    scale.fill_(0.05)
    x.copy_(torch.randn_like(x) * 3)
    for q in (q1, q2, q3):
        q.view(torch.uint8).fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    y, _ = composed_norm(x, None, w)
    assert_q_equal(
        q1, jit_kernel.per_tensor_quant_fp8(y, output_s=torch.tensor([0.05], device="cuda"), is_static=True)[0]
    )
    _assert_results((q2, s2), jit_kernel.per_token_quant_fp8(y))
    _assert_results((q3, s3), jit_kernel.per_token_group_quant_fp8(y, 128))


@pytest.mark.gpu
def test_pdl_on_and_off_agree() -> None:
    x, r, w = _case(40, 2048, torch.bfloat16)
    for mode in MODES:
        for fused in (False, True):
            runs = []
            for pdl in (True, False):
                rr = r.clone()
                runs.append((_as_tuple(_mode_calls(mode, fused, x, rr, w)(enable_pdl=pdl)), rr))
            _assert_results(runs[0][0], runs[1][0])
            assert torch.equal(runs[0][1], runs[1][1])


def _compiled_layer(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, scale: torch.Tensor):
    q1 = jit_kernel.fused_add_rmsnorm_quant_fp8(x, r, w, scale)
    q2, s2 = jit_kernel.rmsnorm_per_token_quant_fp8(r, w)
    q3, s3 = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(x, r, w, 128, column_major_scales=True)
    g = jit_kernel.gemma_rmsnorm(x, w)
    return q1.float(), q2.float() * s2, q3.float(), s3, g * 2


@pytest.mark.gpu
def test_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    x, r, w = _case(24, 1024, torch.bfloat16)
    scale = torch.tensor([0.02], device="cuda")
    r_eager, r_compiled = r.clone(), r.clone()
    expected = _compiled_layer(x, r_eager, w, scale)
    got = torch.compile(_compiled_layer, fullgraph=True)(x, r_compiled, w, scale)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(r_compiled, r_eager)


# ---------------------------------------------------------------------------------------------
# Gemma's RMSNorm (GPU)


def ref_gemma(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """transformers' GemmaRMSNorm: fp32 throughout, (1 + w) in fp32, one rounding at the end."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + w.float())).to(x.dtype)


def assert_gemma_close(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Close, and in 16-bit types exact but for rare roundings moved by rrms's last bits (rounding
    1 + w to the dtype first, as rmsnorm(x, 1 + w) would, changes about half of them)."""
    assert_close(out, expected, dtype)
    if dtype != torch.float32 and out.numel():
        assert (out == expected).float().mean().item() > 0.99


GEMMA_SHAPES = [(n, d) for n in (1, 7, 300) for d in (256, 1001, 1152, 2304, 2560, 3584, 3840, 4096, 5376, 40000)]
GEMMA_SHAPES += [pytest.param(4097, 2304, id="big-4097-2304"), pytest.param(2048, 1024, id="big-2048-1024")]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("n", "d"), GEMMA_SHAPES)
def test_gemma_rmsnorm(n: int, d: int, dtype: torch.dtype) -> None:
    x = (torch.randn(n, d, device="cuda") * 2).to(dtype)
    w = (torch.randn(d, device="cuda") * 0.3).to(dtype)  # Gemma's weights: offsets from 1
    out = torch.full_like(x, NAN)
    assert jit_kernel.gemma_rmsnorm(x, w, EPS, out=out) is out
    assert_gemma_close(out, ref_gemma(x, w), dtype)
    assert torch.equal(jit_kernel.gemma_rmsnorm(x, w, EPS), out)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("n", "d"), GEMMA_SHAPES)
def test_gemma_fused_add_rmsnorm(n: int, d: int, dtype: torch.dtype) -> None:
    x, r, _ = _case(n, d, dtype)
    w = (torch.randn(d, device="cuda") * 0.3).to(dtype)
    expected_r = (x.float() + r.float()).to(dtype)
    expected = ref_gemma(expected_r, w)
    assert jit_kernel.gemma_fused_add_rmsnorm(x, r, w, EPS) is None
    torch.testing.assert_close(r, expected_r, rtol=0, atol=0)
    assert_gemma_close(x, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("d", "pad", "offset"), [(2304, 64, 0), (2304, 8, 1), (3840, 0, 1), (1001, 3, 2)])
def test_gemma_strided_misaligned_in_place_and_3d(d: int, pad: int, offset: int, dtype: torch.dtype) -> None:
    x, r, _ = _case(17, d, dtype, pad=pad, offset=offset)
    w = (torch.randn(d, device="cuda") * 0.3).to(dtype)
    expected = ref_gemma(x, w)
    assert_gemma_close(jit_kernel.gemma_rmsnorm(x, w), expected, dtype)
    expected_r = (x.float() + r.float()).to(dtype)
    xf = _same_layout(x)
    jit_kernel.gemma_fused_add_rmsnorm(xf, r, w)
    torch.testing.assert_close(r, expected_r, rtol=0, atol=0)
    assert_gemma_close(xf, ref_gemma(expected_r, w), dtype)
    assert jit_kernel.gemma_rmsnorm(x, w, out=x) is x  # in place
    assert_gemma_close(x, expected, dtype)
    x3 = (torch.randn(2, 3, d, device="cuda")).to(dtype)
    assert_gemma_close(jit_kernel.gemma_rmsnorm(x3, w), ref_gemma(x3, w), dtype)


@pytest.mark.gpu
def test_gemma_empty_and_pdl() -> None:
    w = torch.randn(2304, device="cuda", dtype=torch.bfloat16)
    assert jit_kernel.gemma_rmsnorm(torch.empty(0, 2304, device="cuda", dtype=torch.bfloat16), w).shape == (0, 2304)
    x = torch.randn(40, 2304, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(
        jit_kernel.gemma_rmsnorm(x, w, enable_pdl=True), jit_kernel.gemma_rmsnorm(x, w, enable_pdl=False)
    )


# ---------------------------------------------------------------------------------------------
# CPU: the shapes' source of truth, config choice, registration, fakes, tracing, bad inputs


def test_rmsnorm_hidden_sizes_match_the_kernels_list() -> None:
    """norm_quant.cuh reduces rows of rmsnorm's specialised sizes in RowShape's order: its list must
    be the one ops/norm.py specialises for, or the fused ops stop being bit-equal to rmsnorm."""
    text = "".join((REPO / "csrc" / "norm" / name).read_text() for name in ("norm_quant.cuh", "epilogue_row.cuh"))
    match = re.search(r"kRmsnormHiddenSizes\[\] = \{([^}]*)\}", text)
    assert match is not None
    assert tuple(int(v) for v in match.group(1).split(",")) == families.NORM_HIDDEN_SIZES


def test_config_choice_and_grid() -> None:
    from jit_kernel.ops import norm_quant

    table = norm_quant._KERNELS["rmsnorm_quant_fp8"]
    assert table.config((torch.bfloat16, 4096)) == (4096, "bf16_t")
    assert table.config((torch.bfloat16, 1024)) == (0, "bf16_t")  # not in the grid: the run-time-D kernel
    assert table.config((torch.float16, 4096)) == (0, "fp16_t")
    assert table.config((torch.float32, 4096)) == (0, "fp32_t")
    with pytest.raises(TypeError, match=r"rmsnorm_quant_fp8: input must be one of"):
        table.config((torch.int32, 4096))
    for kernels in norm_quant._KERNELS.values():  # every prebuilt config is one the op chooses
        chosen = {kernels.config((dtype, d)) for dtype in DTYPES for d in (*families.NORM_QUANT_HIDDEN_SIZES, 1000)}
        assert set(kernels._dispatcher.spec.prebuilt) <= chosen
    assert families.GEMMA_RMSNORM.prebuilt == (("bf16_t",),)


OPS = {
    "rmsnorm_quant_fp8": {"normed_out"},
    "rmsnorm_quant_fp8_out": {"out", "normed_out"},
    "fused_add_rmsnorm_quant_fp8": {"residual", "normed_out"},
    "fused_add_rmsnorm_quant_fp8_out": {"out", "residual", "normed_out"},
    "rmsnorm_per_token_quant_fp8": {"output_q", "output_s", "normed_out"},
    "fused_add_rmsnorm_per_token_quant_fp8": {"residual", "output_q", "output_s", "normed_out"},
    "rmsnorm_per_token_group_quant_fp8": {"output_q", "output_s", "normed_out"},
    "fused_add_rmsnorm_per_token_group_quant_fp8": {"residual", "output_q", "output_s", "normed_out"},
    "gemma_rmsnorm": set(),
    "gemma_rmsnorm_out": {"out"},
    "gemma_fused_add_rmsnorm": {"input", "residual"},
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_registered_with_mutated_tensors(name: str) -> None:
    schema = getattr(torch.ops.jit_kernel, name).default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == OPS[name], schema


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=dtype)


def test_fake_implementations() -> None:
    """The registered ops run their launchers' checks on fake tensors (no kernel runs). Ops with an
    optional mutated tensor (``normed_out``) are registered without defaults: every argument passed."""
    ops = torch.ops.jit_kernel
    with fake_cuda():
        x, r, w, scale = _e(4, 256), _e(4, 256), _e(256), _e(1, dtype=torch.float32)
        assert ops.rmsnorm_quant_fp8(x, w, scale, None, 1e-6, None, None).dtype == FP8
        assert ops.fused_add_rmsnorm_quant_fp8(x, r, w, None, 0.5, 1e-6, x, None).shape == (4, 256)
        ops.rmsnorm_per_token_quant_fp8(x, w, _e(4, 256, dtype=FP8), _e(4, 1, dtype=torch.float32), 1e-6, None, None)
        ops.fused_add_rmsnorm_per_token_group_quant_fp8(
            x, r, w, _e(4, 256, dtype=FP8), _e(1, 4, dtype=torch.int32).t(), 64, 1e-6, 1e-10, True, None, None
        )
        assert ops.gemma_rmsnorm(x, w).shape == (4, 256)
        ops.gemma_fused_add_rmsnorm(x, r, w)
        with pytest.raises(ValueError, match=r"(?s)'residual'.*Size mismatch"):
            ops.fused_add_rmsnorm_quant_fp8(x, _e(4, 128), w, scale, None, 1e-6, None, None)
        with pytest.raises(ValueError, match="group_size must be 64 or 128, got 32"):
            ops.rmsnorm_per_token_group_quant_fp8(
                x, w, _e(4, 256, dtype=FP8), _e(4, 8, dtype=torch.float32), 32, 1e-6, 1e-10, False, None, None
            )


def test_ops_with_an_optional_mutated_tensor_have_no_defaults() -> None:
    """torch before 2.13 bumps mutated arguments' versions by position and fails on one the
    dispatcher dropped at its default: such ops are registered with every argument required."""
    for name in ("rmsnorm_quant_fp8", "fused_add_rmsnorm_quant_fp8_out", "rmsnorm_per_token_group_quant_fp8"):
        schema = getattr(torch.ops.jit_kernel, name).default._schema
        assert "normed_out" in [a.name for a in schema.arguments]
        assert all(not a.has_default_value() for a in schema.arguments), schema
    assert torch.ops.jit_kernel.gemma_rmsnorm.default._schema.arguments[-1].has_default_value()


def test_torch_compile_traces_without_graph_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """fullgraph tracing of fake CUDA tensors (on a CPU machine too): the graph holds every op, and
    the fakes (the launchers' checks) ran."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not torch.cuda.is_available():  # the fakes' checks need a kernel: built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    torch._dynamo.reset()
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        return gm

    def model(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, q: torch.Tensor):
        a = jit_kernel.fused_add_rmsnorm_quant_fp8(x, r, w, scale)
        jit_kernel.rmsnorm_quant_fp8(x, w, 0.5, out=q)
        b, bs = jit_kernel.fused_add_rmsnorm_per_token_quant_fp8(x, r, w)
        c, cs = jit_kernel.rmsnorm_per_token_group_quant_fp8(x, w, 128, packed_ue8m0=True)
        d, ds = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(x, r, w, 64, column_major_scales=True)
        e, es = jit_kernel.rmsnorm_per_token_quant_fp8(x, w)
        g = jit_kernel.gemma_rmsnorm(x, w)
        jit_kernel.gemma_fused_add_rmsnorm(x, r, w)
        return a.float() + b.float() * bs + c.float() + d.float() + e.float() * es + g, cs, ds

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, r, w = _e(3, 256), _e(3, 256), _e(256)
        scale, q = _e(1, dtype=torch.float32), _e(3, 256, dtype=FP8)
        out, cs, ds = torch.compile(model, fullgraph=True, backend=backend)(x, r, w, scale, q)
    assert out.shape == (3, 256) and cs.dtype == torch.int32 and cs.shape == (3, 1) and ds.shape == (3, 4)
    (graph,) = graphs
    targets = {str(node.target).removesuffix(".default") for node in graph.graph.nodes if node.op == "call_function"}
    expected = {f"jit_kernel.{name}" for name in OPS if name not in ("rmsnorm_quant_fp8", "gemma_rmsnorm_out")}
    expected -= {"jit_kernel.fused_add_rmsnorm_quant_fp8_out"}
    assert expected <= targets, targets


S = "rmsnorm_quant_fp8"
SA = "fused_add_rmsnorm_quant_fp8"
BAD_STATIC = [
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64, dtype=torch.int32), _e(64), 0.5),
        TypeError,
        f"{S}: input must be one of",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8([1.0], _e(64), 0.5),
        TypeError,
        f"{S}: input must be a torch.Tensor, got list",
    ),
    (lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(32), 0.5), ValueError, r"(?s)'weight'.*Size mismatch"),
    (lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64).half(), 0.5), TypeError, r"(?s)'weight'.*Dtype mismatch"),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), 0.5, out=_e(4, 64)),
        TypeError,
        r"(?s)'out'.*Dtype mismatch: expected one of \[float8_e4m3fn, float8_e5m2\]",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), 0.5, out=_e(4, 32, dtype=FP8)),
        ValueError,
        r"(?s)'out'.*Size mismatch",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), 0.5, normed_out=_e(4, 64).half()),
        TypeError,
        r"(?s)'normed_out'.*Dtype mismatch",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), _e(1)),
        TypeError,
        r"(?s)'scale'.*Dtype mismatch: expected float32",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), _e(2, dtype=torch.float32)),
        ValueError,
        r"(?s)'scale'.*Size mismatch",
    ),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), "x"),
        TypeError,
        f"{S}: scale must be a float32 tensor of one element or a float, got str",
    ),
    (lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), float("inf")), ValueError, f"{S}: scale must be finite"),
    (lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), 0.5, eps=-1.0), ValueError, "eps must be >= 0"),
    (lambda: jit_kernel.rmsnorm_quant_fp8(_e(64, 4).t(), _e(64), 0.5), ValueError, r"(?s)'input'.*Stride mismatch"),
    (
        lambda: jit_kernel.rmsnorm_quant_fp8(_e(4, 64), _e(64), 0.5, enable_pdl="yes"),
        TypeError,
        f"{S}: enable_pdl must be a bool or None, got str",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_quant_fp8(_e(4, 64), _e(4, 32), _e(64), 0.5),
        ValueError,
        r"(?s)'residual'.*Size mismatch",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_quant_fp8(_e(4, 64), _e(4, 64).half(), _e(64), 0.5),
        TypeError,
        r"(?s)'residual'.*Dtype mismatch",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_quant_fp8(_e(4, 64), None, _e(64), 0.5),
        TypeError,
        f"{SA}: residual must be a torch.Tensor, got NoneType",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_quant_fp8(_e(2, 2, 64), _e(4, 64), _e(64), 0.5),
        ValueError,
        r"residual must have the shape of \(2, 2, 64\), got \(4, 64\)",
    ),
]
T = "rmsnorm_per_token_quant_fp8"
BAD_TOKEN = [
    (
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(_e(4, 64), _e(64), output_q=_e(4, 64)),
        TypeError,
        r"(?s)'output_q'.*Dtype mismatch: expected float8_e4m3fn",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(_e(4, 64), _e(64), output_s=_e(4, 1)),
        TypeError,
        r"(?s)'output_s'.*Dtype mismatch: expected float32",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(_e(4, 64), _e(64), output_s=_e(4, dtype=torch.float32)),
        ValueError,
        r"(?s)'output_s'.*Rank mismatch",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(_e(2, 2, 64), _e(64), output_s=_e(4, 1, dtype=torch.float32)),
        ValueError,
        rf"{T}: output_s must have shape \(2, 2, 1\)",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_quant_fp8(_e(4, 64), _e(64), output_q=[0]),
        TypeError,
        f"{T}: output_q must be a torch.Tensor, got list",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_per_token_quant_fp8(_e(4, 64), _e(5, 64), _e(64)),
        ValueError,
        r"(?s)'residual'.*Size mismatch",
    ),
]
G = "rmsnorm_per_token_group_quant_fp8"
GA = "fused_add_rmsnorm_per_token_group_quant_fp8"
BAD_GROUP = [
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 32),
        ValueError,
        f"{G}: group_size must be 64 or 128, got 32",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 64.0),
        TypeError,
        f"{G}: group_size must be an int, got float",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 100), _e(100), 64),
        ValueError,
        rf"{G}: the last dimension of input \(100\) must be a multiple of group_size \(64\)",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 0),
        ValueError,
        r"must be a multiple of group_size \(0\)",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 64, quant_eps=-1.0),
        ValueError,
        f"{G}: quant_eps must be finite and >= 0",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(
            _e(4, 256), _e(256), 64, output_s=_e(4, 8, dtype=torch.float32)
        ),
        ValueError,
        r"(?s)'output_s'.*Size mismatch",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(
            _e(4, 256), _e(256), 64, output_s=torch.empty_strided((4, 4), (1, 1), device="cuda")
        ),
        ValueError,
        rf"{G}: output_s must be row-major .* got strides \(1, 1\)",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 64, output_s=_e(4, 4)),
        TypeError,
        r"(?s)'output_s'.*Dtype mismatch: expected one of \[float32, int32\]",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(
            _e(4, 256), _e(256), 64, output_s=_e(1, 4, dtype=torch.int32).t()
        ),
        ValueError,
        rf"{G}: an int32 output_s holds packed UE8M0 exponents, which needs scale_ue8m0=True",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(
            _e(4, 512), _e(512), 64, scale_ue8m0=True, output_s=_e(4, 2, dtype=torch.int32)
        ),
        ValueError,
        rf"{G}: a packed \(int32\) output_s must be column-major",
    ),
    (
        lambda: jit_kernel.rmsnorm_per_token_group_quant_fp8(_e(4, 256), _e(256), 64, output_q=_e(4, 256)),
        TypeError,
        r"(?s)'output_q'.*Dtype mismatch: expected float8_e4m3fn",
    ),
    (
        lambda: jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(_e(4, 256), "r", _e(256), 64),
        TypeError,
        f"{GA}: residual must be a torch.Tensor, got str",
    ),
]
BAD_GEMMA = [
    (
        lambda: jit_kernel.gemma_rmsnorm(_e(4, 64, dtype=torch.int8), _e(64)),
        TypeError,
        "gemma_rmsnorm: input must be one of",
    ),
    (lambda: jit_kernel.gemma_rmsnorm(_e(4, 64), _e(63)), ValueError, r"(?s)'weight'.*Size mismatch"),
    (lambda: jit_kernel.gemma_rmsnorm(_e(4, 64), _e(64), out=_e(4, 32)), ValueError, r"(?s)'out'.*Size mismatch"),
    (lambda: jit_kernel.gemma_rmsnorm(_e(4, 64), _e(64), eps=-1.0), ValueError, "eps must be >= 0"),
    (lambda: jit_kernel.gemma_rmsnorm(_e(4, 0), _e(0)), ValueError, r"must be in \[1, 1048576\]"),
    (
        lambda: jit_kernel.gemma_fused_add_rmsnorm(_e(4, 64), _e(4, 64).float(), _e(64)),
        TypeError,
        r"(?s)'residual'.*Dtype mismatch",
    ),
    (
        lambda: jit_kernel.gemma_fused_add_rmsnorm(_e(4, 64), _e(4, 64), [1.0]),
        TypeError,
        "gemma_fused_add_rmsnorm: weight must be a torch.Tensor, got list",
    ),
]


@pytest.mark.parametrize(("call", "error", "match"), BAD_STATIC + BAD_TOKEN + BAD_GROUP + BAD_GEMMA)
def test_bad_inputs(call: Callable[[], object], error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call()


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: jit_kernel.fused_add_rmsnorm_quant_fp8(x, x.clone(), _bf16(256), 0.5),
        lambda x: jit_kernel.rmsnorm_per_token_quant_fp8(x, _bf16(256)),
        lambda x: jit_kernel.rmsnorm_per_token_group_quant_fp8(x, _bf16(256), 128),
        lambda x: jit_kernel.gemma_rmsnorm(x, _bf16(256)),
    ],
)
def test_rejects_cpu_tensors(call: Callable[[torch.Tensor], object], monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 rows of a run-time width: configs in the prebuilt grid, so an installed package checks
    them without compiling."""
    if not torch.cuda.is_available():  # the kernels (whose C++ check this is) are built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'input'.*Device mismatch: expected cuda but got cpu"):
        call(_bf16(8, 256))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "config"),
    [
        # One specialised and one run-time-width config through the JIT; the prebuilt build
        # compiles every family's bf16 grid (specialised widths included) from the same sources.
        (families.RMSNORM_QUANT_FP8, (7168, "bf16_t")),
        (families.RMSNORM_PER_TOKEN_GROUP_QUANT_FP8, (0, "fp32_t")),
        (families.GEMMA_RMSNORM, ("fp16_t",)),
    ],
    ids=lambda v: getattr(v, "family", None) or "-".join(map(str, v)),
)
def test_compiles_for_sm90a_without_a_gpu(spec, config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Specialised and run-time-D configs build with nvcc for sm_90a on a machine without a GPU (the
    prebuilt library is the proof where it holds the config for sm_90a; see ``assert_builds_for_arch``)."""
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    assert_builds_for_arch(spec, config, "9.0a")


# ---------------------------------------------------------------------------------------------
# The benchmark script (tests/test_benchmarks.py covers the shared helpers)


def _load_bench(monkeypatch: pytest.MonkeyPatch):
    import importlib

    for module in ("triton", "matplotlib", "pandas"):
        pytest.importorskip(module)
    monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
    monkeypatch.delenv("JIT_KERNEL_BENCH_OUT", raising=False)
    return importlib.reload(importlib.import_module("jit_kernel.benchmark.bench_norm_quant"))


def test_bench_norm_quant_on_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Imports without CUDA, declares one perf_report per op, runs main() with a fake timer (every
    config and provider timed once), and its torch baselines compute the ops' references."""
    from jit_kernel.benchmark import _tables
    from jit_kernel.benchmark._tables import Measurements

    cuda_before = torch.cuda.is_initialized()
    bench = _load_bench(monkeypatch)
    try:
        assert torch.cuda.is_initialized() == cuda_before  # importing it touches no GPU
        assert bench.op_bytes("fused_add_rmsnorm_quant_fp8", 4) == 4 * 4096 * 7 + 4096 * 2
        assert [b.plot_name for b in bench.bench_norm_quant.benchmarks] == [f"{op}-bf16-D4096" for op in bench.OPS]
        x, r = torch.randn(3, 4096).bfloat16(), torch.randn(3, 4096).bfloat16()
        w = (torch.randn(4096) * 0.3).bfloat16()
        torch.testing.assert_close(bench.torch_gemma_rmsnorm(x, w), ref_gemma(x, w), rtol=0, atol=0)
        q, s = bench.torch_fused_add_rmsnorm_per_token(x, r.clone(), w)
        assert q.dtype == FP8 and s.shape == (3, 1)
        q, s, _ = bench.torch_fused_add_rmsnorm_group(x, r.clone(), w)
        assert s.shape == (3, 32) and s.stride() == (1, 3)

        calls: list[tuple[object, str]] = []

        def timer(key: object, provider: str, make: object) -> float:
            calls.append((key, provider))
            return 10.0

        monkeypatch.setattr(bench, "RESULTS", Measurements(timer))
        monkeypatch.setattr(_tables, "empty_kernel_us", lambda: 2.5)
        monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
        monkeypatch.chdir(tmp_path)  # no save path: nothing may be written
        bench.main([])
        assert list(tmp_path.iterdir()) == []
        expected = sum(len(providers) for providers, _ in bench.OPS.values()) * len(bench.TOKENS)
        rotated = {(key, p) for key, p in calls if key[-1] == "rotated"}
        assert bench.ROTATED_TOKENS == [4096, 16384]
        assert rotated == {
            ((op, n, "rotated"), p)
            for op, (providers, _) in bench.OPS.items()
            for n in bench.ROTATED_TOKENS
            for p in providers
            if p in ("jit", "copy", "flashinfer")
        }
        assert len(calls) == len(set(calls)) == expected + len(rotated)
        summary = capsys.readouterr().out.split("device: Fake GPU")[1]
        rows = [line for line in summary.splitlines() if line.startswith("| ") and "jit us" not in line]
        assert len(rows) == len(bench.OPS) * (len(bench.TOKENS) + len(bench.ROTATED_TOKENS))
        # a rotated time is per call: the timer's 10 us over the copies one timed call makes
        copies = bench.rotation_count(bench.op_bytes("rmsnorm_quant_fp8", 4096))
        assert copies == 6  # 48 MB of minimal bytes, 256 MB of rotated copies
        assert bench.RESULTS.for_config(("rmsnorm_quant_fp8", 4096, "rotated"))["jit"] == 10.0 / copies
    finally:
        monkeypatch.undo()


@pytest.mark.gpu
def test_bench_norm_quant_cases_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every provider's callable runs once (FlashInfer's where it is importable)."""
    import importlib.util

    bench = _load_bench(monkeypatch)
    for op, (providers, _) in bench.OPS.items():
        for provider in providers:
            if provider == "compile" or (provider == "flashinfer" and importlib.util.find_spec("flashinfer") is None):
                continue
            bench.norm_quant_case(provider, op, 16)()
    torch.cuda.synchronize()
