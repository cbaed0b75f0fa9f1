"""rmsnorm, fused_add_rmsnorm, fused_inplace_qknorm and qknorm_across_heads against a float64
torch reference (fused_add_rmsnorm's cast_x_before_out_mul=True against an fp32 one). Outputs are
poisoned (NaN) first; inputs are fresh random tensors per test."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import assert_close, fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel.engine import families

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-6


def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    xf = x.double()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _inputs(n: int, d: int, dtype: torch.dtype, pad: int = 0, offset: int = 0):
    """x [n, d] (rows strided by d + pad, data shifted by offset elements) and w [d]."""
    base = torch.randn(n * (d + pad) + offset, device="cuda", dtype=torch.float32).to(dtype)
    x = base[offset:].view(n, d + pad)[:, :d]
    w = (torch.rand(d, device="cuda") + 0.5).to(dtype)
    return x, w


# The full token x D grid for small token counts; big token counts at representative D
# (ids `big-*`: the sanitizer run deselects them with -k 'not big', memcheck makes them slow).
SHAPES = [(n, d) for n in (1, 7, 128) for d in (64, 128, 1000, 1024, 4096, 5120, 8192, 16384)]
# Widths no kernel is specialised for, held in registers by the generic single-pass kernel at 1, 2
# and 4 vectors per thread (16-bit types; fp32 rows of 4096 and more take 2 and 4).
SHAPES += [(n, d) for n in (1, 7, 128) for d in (3072, 6144, 12288)]
SHAPES += [pytest.param(4097, d, id=f"big-4097-{d}") for d in (1000, 1024, 4096, 7168)]
SHAPES += [pytest.param(16384, d, id=f"big-16384-{d}") for d in (2048, 5120, 8192, 16384)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d"), SHAPES)
def test_rmsnorm(n: int, d: int, dtype: torch.dtype) -> None:
    if n * d >= 16384 * 8192 and dtype != torch.bfloat16:
        pytest.skip("largest sizes in bf16 only (memory and time)")
    x, w = _inputs(n, d, dtype)
    out = torch.full_like(x, float("nan"))
    res = jit_kernel.rmsnorm(x, w, EPS, out=out)
    assert res is out
    assert_close(out, ref_rmsnorm(x, w), dtype)
    assert_close(jit_kernel.rmsnorm(x, w, EPS), ref_rmsnorm(x, w), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("d", "pad", "offset"), [(4096, 64, 0), (4096, 3, 0), (4096, 0, 1), (1024, 8, 1), (1000, 5, 3)]
)
def test_rmsnorm_strided_and_misaligned(d: int, pad: int, offset: int, dtype: torch.dtype) -> None:
    x, w = _inputs(33, d, dtype, pad=pad, offset=offset)
    out = torch.full((33, d + pad), float("nan"), device="cuda", dtype=dtype)[:, :d]
    jit_kernel.rmsnorm(x, w, EPS, out=out)
    assert_close(out, ref_rmsnorm(x, w), dtype)


@pytest.mark.gpu
def test_rmsnorm_input_1_view_and_3d_and_inplace() -> None:
    dtype = torch.bfloat16
    full = torch.randn(9, 4096, device="cuda", dtype=dtype)
    x, w = full[1:], torch.randn(4096, device="cuda", dtype=dtype)
    assert_close(jit_kernel.rmsnorm(x, w), ref_rmsnorm(x, w), dtype)
    flat = torch.randn(8 * 4096 + 1, device="cuda", dtype=dtype)[1:].view(8, 4096)  # 2-byte misaligned
    assert_close(jit_kernel.rmsnorm(flat, w), ref_rmsnorm(flat, w), dtype)
    x3 = torch.randn(2, 5, 4096, device="cuda", dtype=dtype)
    expected = ref_rmsnorm(x3, w)
    assert jit_kernel.rmsnorm(x3, w).shape == x3.shape
    assert jit_kernel.rmsnorm(x3, w, out=x3) is x3  # in place
    assert_close(x3, expected, dtype)
    empty = torch.empty(0, 4096, device="cuda", dtype=dtype)
    assert jit_kernel.rmsnorm(empty, w).shape == (0, 4096)


@pytest.mark.gpu
def test_eager_fast_path_keeps_every_form_and_error() -> None:
    """A 2-D call with ``out`` remembers its kernel and later calls launch it directly; what the
    launcher refuses still goes through the full path: a 3-D input is viewed as rows, and a bad
    ``out`` gets the launcher's error naming it."""
    dtype = torch.bfloat16
    x = torch.randn(4, 3, 4096, device="cuda").to(dtype)
    w = torch.randn(4096, device="cuda").to(dtype)
    rows = torch.full((12, 4096), float("nan"), device="cuda", dtype=dtype)
    jit_kernel.rmsnorm(x.view(12, 4096), w, out=rows)
    jit_kernel.rmsnorm(x.view(12, 4096), w, out=rows)  # the fast path
    assert_close(rows, ref_rmsnorm(x.view(12, 4096), w), dtype)
    out3 = torch.full_like(x, float("nan"))
    assert jit_kernel.rmsnorm(x, w, out=out3) is out3
    assert_close(out3, ref_rmsnorm(x, w), dtype)
    with pytest.raises(ValueError, match=r"(?s)'out'.*Size mismatch"):
        jit_kernel.rmsnorm(x.view(12, 4096), w, out=rows[:6])
    with pytest.raises(TypeError, match=r"rmsnorm: weight must be a torch\.Tensor, got list"):
        jit_kernel.rmsnorm(x.view(12, 4096), [1.0], out=rows)  # type: ignore[arg-type]
    r3 = torch.randn_like(x)
    x3, expected = x.clone(), ref_fused_add(x, r3, w)
    jit_kernel.fused_add_rmsnorm(x.view(12, 4096).clone(), r3.view(12, 4096).clone(), w)  # remembers
    jit_kernel.fused_add_rmsnorm(x3, r3, w)  # 3-D: refused by the remembered kernel, served as rows
    torch.testing.assert_close(r3, expected[1], rtol=0, atol=0)
    assert_close(x3, expected[0], dtype)


def ref_fused_add(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
    new_r = (x.float() + r.float()).to(x.dtype)
    return ref_rmsnorm(new_r, w), new_r


FUSED_SHAPES = [(n, d) for n in (1, 7, 128) for d in (64, 1000, 1024, 4096, 5120, 6144, 8192, 12288, 16384)]
FUSED_SHAPES += [pytest.param(4097, 4096, id="big-4097-4096")]
FUSED_SHAPES += [pytest.param(16384, d, id=f"big-16384-{d}") for d in (1000, 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d"), FUSED_SHAPES)
def test_fused_add_rmsnorm(n: int, d: int, dtype: torch.dtype) -> None:
    x, w = _inputs(n, d, dtype)
    r, _ = _inputs(n, d, dtype)
    x, r = x.clone(), r.clone()
    expected_out, expected_r = ref_fused_add(x, r, w)
    assert jit_kernel.fused_add_rmsnorm(x, r, w, EPS) is None
    torch.testing.assert_close(r, expected_r, rtol=0, atol=0)  # one fp32 add, one rounding
    assert_close(x, expected_out, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("d", "pad", "offset"), [(4096, 64, 0), (4096, 0, 1), (5120, 3, 0)])
def test_fused_add_rmsnorm_strided(d: int, pad: int, offset: int, dtype: torch.dtype) -> None:
    x, w = _inputs(17, d, dtype, pad=pad, offset=offset)
    r, _ = _inputs(17, d, dtype, pad=pad + 8, offset=offset)
    expected_out, expected_r = ref_fused_add(x, r, w)
    jit_kernel.fused_add_rmsnorm(x, r, w, EPS)
    torch.testing.assert_close(r, expected_r, rtol=0, atol=0)
    assert_close(x, expected_out, dtype)


# ---------------------------------------------------------------------------------------------
# fused_add_rmsnorm(..., cast_x_before_out_mul=True): SGLang 0.5.16's flag (its
# jit_kernel/csrc/elementwise/fused_add_rmsnorm.cuh, FusedAddRMSNormKernel<kCastXBeforeOutMul, T>).


def ref_fused_add_cast(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float = EPS):
    """The flag's rounding, in fp32 as the kernel computes it: s = x + r stays unrounded (only the
    stored residual is rounded), rrms comes from the unrounded s, and the normalised value is
    rounded to the dtype before the weight multiply (Hugging Face's ``weight * x.to(dtype)``)."""
    s = x.float() + r.float()
    rrms = torch.rsqrt(s.double().pow(2).mean(-1, keepdim=True) + eps).float()
    return (w.float() * (s * rrms).to(x.dtype).float()).to(x.dtype), s.to(x.dtype)


# Two units in the last place of the dtype: the kernel's rrms differs from the reference's in the
# last fp32 bits (reduction order, rsqrtf), which moves a rounding of the normalised value now and
# then (CPU simulation with rrms off by 3 fp32 ulps: 0.004% of bf16 and 0.04% of fp16 elements,
# at most 1.4% resp. 0.14% apart). The default rounding differs from this one in about a third of
# the elements, normalising the rounded sum instead in about a fifth: the mismatch bound below
# (1%) tells them apart.
CAST_RTOL = {torch.bfloat16: 2**-6, torch.float16: 2**-9}


def assert_cast_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.float32:  # both roundings are the identity: the default kernels run
        assert_close(actual, expected, dtype)
        return
    torch.testing.assert_close(actual.float(), expected.float(), rtol=CAST_RTOL[dtype], atol=1e-6)
    mismatched = int((actual != expected).sum())
    assert mismatched <= max(2, actual.numel() // 100), f"{mismatched} of {actual.numel()} elements differ"


class _Poisoned:
    """[n, d] rows of random data (row stride d + pad, starting `offset` elements in) inside a
    NaN-filled buffer with a tail. fused_add_rmsnorm writes in place, so its outputs cannot be
    poisoned themselves; an unwritten element keeps its input value, which the comparison rejects.
    The NaN around the rows catches writes outside them."""

    def __init__(self, n: int, d: int, dtype: torch.dtype, pad: int = 0, offset: int = 0, tail: int = 64) -> None:
        self.shape = (n, d, pad, offset)
        self.buf = torch.full((offset + n * (d + pad) + tail,), float("nan"), device="cuda", dtype=dtype)
        self.rows = self._view(self.buf)
        self.rows.copy_(torch.randn(n, d, device="cuda").to(dtype))

    def _view(self, t: torch.Tensor) -> torch.Tensor:
        n, d, pad, offset = self.shape
        return t[offset : offset + n * (d + pad)].view(n, d + pad)[:, :d]

    def assert_outside_untouched(self) -> None:
        outside = torch.ones_like(self.buf, dtype=torch.bool)
        self._view(outside).fill_(False)
        assert torch.isnan(self.buf[outside]).all(), "fused_add_rmsnorm wrote outside its rows"


# Specialised sizes (1024 ... 16384: one and several vectors per thread, latency- and
# bandwidth-bound variants at 1-256 and 300+ rows) and generic ones: whole vectors held in
# registers at 1, 2 and 4 per thread (64, 1000, 3000, 6144, 12288), the scalar two-pass kernel
# (3001: not whole 16-byte vectors) and the vector two-pass kernel (40000: too long to hold).
CAST_SHAPES = [
    (n, d) for n in (1, 7, 300) for d in (64, 1000, 1024, 3000, 3001, 4096, 5120, 6144, 8192, 12288, 16384, 40000)
]
CAST_SHAPES += [pytest.param(4097, d, id=f"big-4097-{d}") for d in (1024, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "d"), CAST_SHAPES)
def test_fused_add_rmsnorm_cast_x_before_out_mul(n: int, d: int, dtype: torch.dtype) -> None:
    x, r = _Poisoned(n, d, dtype), _Poisoned(n, d, dtype)
    w = (torch.rand(d, device="cuda") + 0.5).to(dtype)
    expected_out, expected_r = ref_fused_add_cast(x.rows, r.rows, w)
    assert jit_kernel.fused_add_rmsnorm(x.rows, r.rows, w, EPS, cast_x_before_out_mul=True) is None
    torch.testing.assert_close(r.rows, expected_r, rtol=0, atol=0)  # one fp32 add, one rounding
    assert_cast_close(x.rows, expected_out, dtype)
    x.assert_outside_untouched()
    r.assert_outside_untouched()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("d", "pad", "offset"), [(4096, 64, 0), (4096, 3, 0), (4096, 0, 1), (3000, 8, 0), (1000, 5, 3)]
)
def test_fused_add_rmsnorm_cast_strided_and_misaligned(d: int, pad: int, offset: int, dtype: torch.dtype) -> None:
    x, r = _Poisoned(17, d, dtype, pad=pad, offset=offset), _Poisoned(17, d, dtype, pad=pad + 8, offset=offset)
    w = (torch.rand(d, device="cuda") + 0.5).to(dtype)
    expected_out, expected_r = ref_fused_add_cast(x.rows, r.rows, w)
    jit_kernel.fused_add_rmsnorm(x.rows, r.rows, w, EPS, cast_x_before_out_mul=True)
    torch.testing.assert_close(r.rows, expected_r, rtol=0, atol=0)
    assert_cast_close(x.rows, expected_out, dtype)
    x.assert_outside_untouched()
    r.assert_outside_untouched()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [4096, 3000])
def test_fused_add_rmsnorm_cast_flag_selects_the_rounding(d: int, dtype: torch.dtype) -> None:
    """False is the default call (the same kernel, the same bits); True rounds differently in 16-bit
    types, and is the default's computation in fp32 (where both roundings are the identity)."""
    x, w = _inputs(64, d, dtype)
    r, _ = _inputs(64, d, dtype)
    outs = {}
    for flag in (None, False, True):
        xi, ri = x.clone(), r.clone()
        if flag is None:
            jit_kernel.fused_add_rmsnorm(xi, ri, w, EPS)
        else:
            jit_kernel.fused_add_rmsnorm(xi, ri, w, EPS, cast_x_before_out_mul=flag)
        outs[flag] = (xi, ri)
    assert torch.equal(outs[False][0], outs[None][0]) and torch.equal(outs[False][1], outs[None][1])
    assert torch.equal(outs[True][1], outs[False][1])  # the stored residual: T(x + r) either way
    differing = (outs[True][0] != outs[False][0]).float().mean().item()
    if dtype == torch.float32:
        assert differing == 0
    else:
        assert differing > 0.1, differing  # about a third of the elements round differently


@pytest.mark.gpu
def test_fused_add_rmsnorm_cast_under_torch_compile() -> None:
    def layer(h: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        jit_kernel.fused_add_rmsnorm(h, residual, w, cast_x_before_out_mul=True)
        return h * 2

    torch._dynamo.reset()
    x, w = _inputs(48, 4096, torch.bfloat16)
    r, _ = _inputs(48, 4096, torch.bfloat16)
    eager = (x.clone(), r.clone())
    compiled = (x.clone(), r.clone())
    expected = layer(*eager, w)
    got = torch.compile(layer, fullgraph=True)(*compiled, w)
    assert torch.equal(got, expected)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    explanation = torch._dynamo.explain(layer)(x.clone(), r.clone(), w)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_fused_add_rmsnorm_op_takes_the_flag() -> None:
    """The custom op's schema has the flag with its default, and the fake implementation takes it."""
    schema = torch.ops.jit_kernel.fused_add_rmsnorm.default._schema
    flag = next(a for a in schema.arguments if a.name == "cast_x_before_out_mul")
    assert str(flag.type) == "bool" and flag.default_value is False
    with fake_cuda():
        x, w = _bf16(4, 4096), _bf16(4096)
        torch.ops.jit_kernel.fused_add_rmsnorm(x, torch.empty_like(x), w, 1e-6, None, True)
        with pytest.raises(ValueError, match=r"(?s)'residual'.*Size mismatch"):
            torch.ops.jit_kernel.fused_add_rmsnorm(x, _bf16(4, 8), w, 1e-6, None, True)


@pytest.mark.slow
def test_fused_add_cast_compiles_for_sm90a_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The new export (specialised, bounded and two-pass kernels of both flag values, in one
    specialised config's translation unit) builds with nvcc for sm_90a on a machine without a GPU."""
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    assert_builds_for_arch(families.RMSNORM, (4096, "bf16_t"), "9.0a")


def _qkv(n: int, hq: int, hk: int, d: int, dtype: torch.dtype, pad: int = 0):
    qkv = torch.randn(n, (hq + 2 * hk) * d + pad, device="cuda", dtype=torch.float32).to(dtype)
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    v = qkv[:, (hq + hk) * d :]
    return qkv, q, k, v


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256, 96])
@pytest.mark.parametrize(
    ("n", "hq", "hk"), [(1, 8, 1), (7, 32, 8), (128, 16, 16), pytest.param(4097, 32, 8, id="big-4097")]
)
def test_fused_inplace_qknorm(n: int, hq: int, hk: int, d: int, dtype: torch.dtype) -> None:
    _, q, k, v = _qkv(n, hq, hk, d, dtype, pad=8)
    qw, kw = (torch.rand(d, device="cuda") + 0.5).to(dtype), (torch.rand(d, device="cuda") + 0.5).to(dtype)
    eq, ek, ev = ref_rmsnorm(q, qw), ref_rmsnorm(k, kw), v.clone()
    jit_kernel.fused_inplace_qknorm(q, k, qw, kw, EPS)
    assert_close(q, eq, dtype)
    assert_close(k, ek, dtype)
    assert torch.equal(v, ev)  # untouched


@pytest.mark.gpu
def test_fused_inplace_qknorm_misaligned() -> None:
    dtype = torch.bfloat16
    flat = torch.randn(5 * 4 * 128 + 1, device="cuda", dtype=dtype)[1:]
    q = flat.view(5, 4, 128)
    k = torch.randn(5, 2, 128, device="cuda", dtype=dtype)
    qw, kw = torch.randn(128, device="cuda", dtype=dtype), torch.randn(128, device="cuda", dtype=dtype)
    eq, ek = ref_rmsnorm(q, qw), ref_rmsnorm(k, kw)
    jit_kernel.fused_inplace_qknorm(q, k, qw, kw)
    assert_close(q, eq, dtype)
    assert_close(k, ek, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "wq", "wk"),
    [
        (1, 4096, 4096),
        (7, 4096, 1024),
        (128, 1000, 1000),
        (128, 2048, 2048),
        (1024, 4096, 1024),  # many tokens, different widths: two specialised launches
        (300, 1000, 1024),  # the same with a generic width for q
        (128, 6144, 1024),  # one generic single-pass launch: 2 and 1 vectors per thread
        (16, 12288, 1000),  # 4 vectors per thread for q
        pytest.param(4097, 4096, 4096, id="big-4097"),
    ],
)
def test_qknorm_across_heads(n: int, wq: int, wk: int, dtype: torch.dtype) -> None:
    qkv = torch.randn(n, wq + 2 * wk, device="cuda", dtype=torch.float32).to(dtype)
    q, k = qkv[:, :wq], qkv[:, wq : wq + wk]
    qw, kw = (torch.rand(wq, device="cuda") + 0.5).to(dtype), (torch.rand(wk, device="cuda") + 0.5).to(dtype)
    eq, ek = ref_rmsnorm(q, qw), ref_rmsnorm(k, kw)
    jit_kernel.qknorm_across_heads(q, k, qw, kw, EPS)
    assert_close(q, eq, dtype)
    assert_close(k, ek, dtype)


@pytest.mark.gpu
@pytest.mark.multigpu
def test_norms_on_second_gpu() -> None:
    dev = torch.device("cuda:1")
    dtype = torch.bfloat16
    x = torch.randn(64, 4096, device=dev, dtype=dtype)
    w = torch.randn(4096, device=dev, dtype=dtype)
    with torch.cuda.device(0):  # the current device is another GPU: the op must launch on x's
        out = jit_kernel.rmsnorm(x, w)
        expected = ref_rmsnorm(x, w)
        r = torch.randn_like(x)
        expected_out, expected_r = ref_fused_add(x, r, w)
        jit_kernel.fused_add_rmsnorm(x, r, w)
        _, q, k, _ = _qkv(16, 8, 2, 128, dtype)
        q, k = q.to(dev), k.to(dev)
        qw = torch.randn(128, device=dev, dtype=dtype)
        eq, ek = ref_rmsnorm(q, qw), ref_rmsnorm(k, qw)
        jit_kernel.fused_inplace_qknorm(q, k, qw, qw)
    torch.cuda.synchronize(dev)
    assert out.device == dev
    assert_close(out, expected, dtype)
    assert_close(x, expected_out, dtype)
    torch.testing.assert_close(r, expected_r, rtol=0, atol=0)
    assert_close(q, eq, dtype)
    assert_close(k, ek, dtype)


# ---------------------------------------------------------------------------------------------
# Bad inputs: rejected by the C++ launchers (the one owner of each tensor rule) or, for what only
# Python sees (the config choice, reshaping), by the op; both name the argument. Fake CUDA tensors:
# these run on the CPU.


def _bf16(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16)


def test_rmsnorm_rejects_cpu_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the kernel (whose C++ check this is) is built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'input'.*Device mismatch: expected cuda but got cpu"):
        jit_kernel.rmsnorm(torch.randn(4, 8), torch.randn(8))
    with pytest.raises(ValueError, match=r"(?s)'q'.*Device mismatch: expected cuda but got cpu"):
        jit_kernel.fused_inplace_qknorm(torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(8), torch.randn(8))
    with pytest.raises(TypeError, match=r"input must be a torch\.Tensor"):
        jit_kernel.rmsnorm([1.0], torch.randn(8))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: jit_kernel.rmsnorm(_bf16(4, 8).int(), _bf16(8)), TypeError, "input must be one of"),
        (
            lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8).half()),
            TypeError,
            r"(?s)'weight'.*Dtype mismatch: expected bfloat16 but got float16",
        ),
        (
            lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(7)),
            ValueError,
            r"(?s)'weight'.*Size mismatch.*expected 8 but got 7",
        ),
        (lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8, 1)), ValueError, r"(?s)'weight'.*(Rank|Size) mismatch"),
        (
            lambda: jit_kernel.rmsnorm(_bf16(8, 4).t(), _bf16(8)),
            ValueError,
            r"(?s)'input'.*Stride mismatch for stride#1: expected 1",
        ),
        (
            lambda: jit_kernel.rmsnorm(
                _bf16(4, 8), torch.empty_strided((8,), (2,), device="cuda", dtype=torch.bfloat16)
            ),
            ValueError,
            r"(?s)'weight'.*not contiguous",
        ),
        (lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), out=_bf16(4, 9)), ValueError, r"(?s)'out'.*Size mismatch"),
        (
            lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), out=_bf16(2, 2, 8)),
            ValueError,
            r"(?s)'out'.*Rank mismatch",
        ),
        (
            lambda: jit_kernel.rmsnorm(_bf16(2, 2, 8), _bf16(8), out=_bf16(4, 8)),
            ValueError,
            r"out must have the shape of \(2, 2, 8\), got \(4, 8\)",
        ),
        (
            lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), out=_bf16(4, 8).half()),
            TypeError,
            r"(?s)'out'.*Dtype mismatch",
        ),
        (lambda: jit_kernel.rmsnorm(_bf16(4, 0), _bf16(0)), ValueError, r"must be in \[1, 1048576\]"),
        (lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), eps=-1.0), ValueError, "eps must be >= 0"),
        (lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), eps="x"), TypeError, "eps must be a float"),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 9), _bf16(8)),
            ValueError,
            r"(?s)'residual'.*Size mismatch",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 8).float(), _bf16(8)),
            TypeError,
            r"(?s)'residual'.*Dtype mismatch",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(2, 2, 8), _bf16(2, 8), _bf16(8)),
            ValueError,
            r"residual must have the shape of \(2, 2, 8\), got \(2, 8\)",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(8, 4).t(), _bf16(8)),
            ValueError,
            r"(?s)'residual'.*Stride mismatch",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 8), _bf16(4)),
            ValueError,
            r"(?s)'weight'.*Size mismatch",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 8), _bf16(8), cast_x_before_out_mul=1),
            TypeError,
            "cast_x_before_out_mul must be a bool, got int",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 8), _bf16(8), cast_x_before_out_mul=None),
            TypeError,
            "cast_x_before_out_mul must be a bool, got NoneType",
        ),
        (
            lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 9), _bf16(8), cast_x_before_out_mul=True),
            ValueError,
            r"(?s)'residual'.*Size mismatch",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 2, 8), _bf16(5, 2, 8), _bf16(8), _bf16(8)),
            ValueError,
            r"(?s)'k'.*Size mismatch for shape#0\('num_tokens'\)",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 2, 8), _bf16(4, 2, 16), _bf16(8), _bf16(8)),
            ValueError,
            r"(?s)'k'.*shape#2\('head_dim'\): expected 8 but got 16",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 16), _bf16(4, 16), _bf16(8), _bf16(8)),
            ValueError,
            r"(?s)'q'.*Rank mismatch: expected 3",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 2, 8), _bf16(4, 2, 8), _bf16(8), _bf16(4)),
            ValueError,
            r"(?s)'k_weight'.*Size mismatch",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 2, 8), _bf16(4, 2, 8).half(), _bf16(8), _bf16(8)),
            TypeError,
            r"(?s)'k'.*Dtype mismatch",
        ),
        (
            lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 8, 2).transpose(1, 2), _bf16(4, 2, 8), _bf16(8), _bf16(8)),
            ValueError,
            r"(?s)'q'.*Stride mismatch",
        ),
        (
            lambda: jit_kernel.qknorm_across_heads(_bf16(4, 16), _bf16(3, 16), _bf16(16), _bf16(16)),
            ValueError,
            r"(?s)'k'.*Size mismatch for shape#0\('num_tokens'\)",
        ),
        (
            lambda: jit_kernel.qknorm_across_heads(_bf16(4, 16), _bf16(4, 8), _bf16(16), _bf16(16)),
            ValueError,
            r"(?s)'k_weight'.*Size mismatch",
        ),
        (
            lambda: jit_kernel.qknorm_across_heads(_bf16(4, 16), _bf16(4, 16), _bf16(16).float(), _bf16(16)),
            TypeError,
            r"(?s)'q_weight'.*Dtype mismatch",
        ),
    ],
)
def test_norm_bad_inputs(call, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call()


def test_rmsnorm_error_names_unsupported_hidden_limit() -> None:
    with fake_cuda(), pytest.raises(ValueError, match="1048576"):
        jit_kernel.rmsnorm(_bf16(1, (1 << 20) + 1), _bf16((1 << 20) + 1))
