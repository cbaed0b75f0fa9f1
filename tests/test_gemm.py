"""decode_linear on the GPU against a float64 reference (``input.double() @ weight.double().T + bias``)
within the output dtype's rounding, with an accumulation allowance that grows as sqrt(K): every row
count 1 to 16, column counts that are not a multiple of the kernel's 32-column blocks, K from 8 to
16384, shapes that split k over a cluster of 2, 4 and 8 blocks, bias on and off, fp16 and bf16, rows
at a stride, the output poisoned with NaN first so that an element never written fails. Also: the
shapes that go to ``torch.nn.functional.linear`` give its result, two calls give the same bits, PDL
chains match the same chain without PDL, CUDA-graph capture and replay, torch.compile(fullgraph=True).

decode_linear_fp8 likewise, against its float64 definition block by block (``(q . w)`` per 128-wide
k-block times the input's and the weight's block scales): every row count, partial column, weight and
k blocks, every scale layout the package's quantisers emit, the reference path, torch._scaled_mm's
blockwise GEMM where it runs."""

from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch

import jit_kernel
from jit_kernel.ops.gemm import decode_linear_serves

BF16, FP16 = torch.bfloat16, torch.float16
DTYPES = [BF16, FP16]
# Half a unit in the last place, relative: the output's one rounding.
EPS = {BF16: 2.0**-8, FP16: 2.0**-11}


def _inputs(
    m: int, n: int, k: int, dtype: torch.dtype, bias: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Fresh random inputs: ``x [m, k]`` ~ N(0, 1), ``weight [n, k]`` ~ N(0, 1 / k) (outputs of unit
    scale at every K), ``bias [n]`` ~ N(0, 1)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) / math.sqrt(k)).to(dtype)
    b = torch.randn(n, device="cuda", generator=g).to(dtype) if bias else None
    return x, w, b


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    ref = x.double() @ w.double().T
    return ref + b.double() if b is not None else ref


def assert_matches(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Within the output's rounding (rtol: half an ulp) and an fp32-accumulation allowance that
    grows as sqrt(K) (atol); NaN (an element never written) fails."""
    k = x.shape[-1]
    eps = EPS[out.dtype]
    ref = _reference(x.reshape(-1, k), w, b).reshape(out.shape)
    torch.testing.assert_close(out.double(), ref, rtol=eps, atol=eps * math.sqrt(k) / 64)


def _poisoned(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((m, n), float("nan"), device="cuda", dtype=dtype)


def _seed(*values: object) -> int:
    """A seed of its own for each case, the same in every process."""
    return zlib.crc32(repr(values).encode())


# ---------------------------------------------------------------------------------------------
# Against the float64 reference


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("m", range(1, 17))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_row_count(dtype: torch.dtype, m: int, bias: bool) -> None:
    """M = 1 to 16, N = 4097 (the last 32-column block holds one column), K = 1024."""
    n, k = 4097, 1024
    x, w, b = _inputs(m, n, k, dtype, bias, _seed("rows", dtype, m, bias))
    assert decode_linear_serves(x, w, b)
    out = _poisoned(m, n, dtype)
    assert jit_kernel.decode_linear(x, w, b, out=out) is out
    assert_matches(out, x, w, b)
    assert_matches(jit_kernel.decode_linear(x, w, b), x, w, b)


# (N, K): one column, seven, a partial last block; K of one 8-wide chunk, of a partial 32-wide step,
# of 16384; shapes whose column blocks fill the GPU (no cluster) and shapes split over 2, 4 and 8
# blocks of a cluster (sm_90+; one block each below).
SHAPES = [
    (1, 8),
    (7, 8),
    (4097, 8),
    (33, 72),
    (65, 520),
    (1, 16384),
    (7, 16384),
    (4095, 16384),  # the last column block partial, just under 128 MiB
    (4096, 4096),  # 128 column blocks: a cluster of 2
    (1280, 8192),  # 40 column blocks: a cluster of 4
    (6144, 4096),  # 192 column blocks: no cluster
    (100, 2048),  # 4 column blocks: a cluster of 8
]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize(("n", "k"), SHAPES, ids=[f"N{n}-K{k}" for n, k in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shapes(dtype: torch.dtype, n: int, k: int, m: int) -> None:
    bias = (m + n) % 2 == 1
    x, w, b = _inputs(m, n, k, dtype, bias, _seed("shapes", dtype, n, k, m))
    assert decode_linear_serves(x, w, b)
    out = _poisoned(m, n, dtype)
    jit_kernel.decode_linear(x, w, b, out=out)
    assert_matches(out, x, w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_lm_head_width(m: int) -> None:
    """Llama 3's vocabulary as N: 128,256 columns (4,008 column blocks, the widest grid), K 512 so
    that the weight stays under the 128 MiB the kernel takes (a whole LM head goes to cuBLAS)."""
    x, w, b = _inputs(m, 128256, 512, BF16, False, _seed("lm_head", m))
    assert decode_linear_serves(x, w)
    assert not decode_linear_serves(x, torch.empty(128256, 4096, device="cuda", dtype=BF16))
    out = _poisoned(m, 128256, BF16)
    jit_kernel.decode_linear(x, w, out=out)
    assert_matches(out, x, w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layouts(dtype: torch.dtype) -> None:
    """Input rows at a stride (a slice of wider rows), output rows at a stride, [..., K] inputs, a
    one-dimensional input, a strided bias, a weight that is a row slice of a larger one."""
    k, n = 512, 300
    x, w, b = _inputs(6, n, k, dtype, True, _seed("layouts", dtype))
    wide = torch.randn(6, k + 40, device="cuda").to(dtype)
    strided = wide[:, 16 : 16 + k]
    assert decode_linear_serves(strided, w, b)
    assert_matches(jit_kernel.decode_linear(strided, w, b), strided, w, b)
    out_buffer = torch.full((6, n + 9), float("nan"), device="cuda", dtype=dtype)
    out = out_buffer[:, :n]
    jit_kernel.decode_linear(x, w, b, out=out)
    assert_matches(out, x, w, b)
    assert torch.isnan(out_buffer[:, n:]).all()  # nothing written past the rows
    x3 = x.view(2, 3, k)
    assert_matches(jit_kernel.decode_linear(x3, w, b), x3, w, b)
    assert jit_kernel.decode_linear(x3, w).shape == (2, 3, n)
    assert_matches(jit_kernel.decode_linear(x[0], w, b), x[0], w, b)
    b_strided = torch.randn(2 * n, device="cuda").to(dtype)[::2]
    assert_matches(jit_kernel.decode_linear(x, w, b_strided), x, w, b_strided)
    big = torch.randn(n + 64, k, device="cuda").to(dtype) / math.sqrt(k)
    w_rows = big[32 : 32 + n]
    assert decode_linear_serves(x, w_rows)
    assert_matches(jit_kernel.decode_linear(x, w_rows), x, w_rows, None)
    # [2, 3, K] rows of a wider buffer, at one stride: served in place, and an output of that form
    rows3 = torch.randn(2, 3, k + 24, device="cuda").to(dtype)[..., 8 : 8 + k]
    assert decode_linear_serves(rows3, w, b)
    out3_buffer = torch.full((2, 3, n + 8), float("nan"), device="cuda", dtype=dtype)
    out3 = out3_buffer[..., :n]
    assert jit_kernel.decode_linear(rows3, w, b, out=out3) is out3
    assert_matches(out3, rows3, w, b)
    assert torch.isnan(out3_buffer[..., n:]).all()


@pytest.mark.gpu
def test_matches_nn_linear() -> None:
    layer = torch.nn.Linear(2048, 3000, device="cuda", dtype=BF16)
    x = torch.randn(5, 2048, device="cuda", dtype=BF16)
    with torch.no_grad():
        expected = layer(x)
        got = jit_kernel.decode_linear(x, layer.weight, layer.bias)
        assert_matches(got, x, layer.weight, layer.bias)
    # cuBLAS rounds the same fp32 sums (in another order): at most a unit in the last place apart
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * EPS[BF16], atol=1e-2)


# ---------------------------------------------------------------------------------------------
# The fallback


@pytest.mark.gpu
@pytest.mark.parametrize(
    "make",
    [
        lambda: _inputs(17, 1000, 1024, BF16, True, 1),
        lambda: _inputs(64, 1000, 1024, FP16, False, 2),
        lambda: _inputs(4, 100, 12, BF16, True, 3),
        lambda: (torch.randn(4, 256, device="cuda"), torch.randn(100, 256, device="cuda"), None),
        lambda: (
            torch.randn(4, 256, device="cuda", dtype=BF16),
            torch.randn(256, 100, device="cuda", dtype=BF16).t(),
            None,
        ),
        lambda: (  # an input that does not start on 16 bytes
            torch.randn(4 * 256 + 4, device="cuda", dtype=BF16)[4:].view(4, 256),
            torch.randn(100, 256, device="cuda", dtype=BF16),
            None,
        ),
        lambda: (  # a weight that does not start on 16 bytes
            torch.randn(4, 256, device="cuda", dtype=BF16),
            torch.randn(100 * 256 + 4, device="cuda", dtype=BF16)[4:].view(100, 256),
            None,
        ),
        lambda: (  # [2, 2, K] rows at two strides
            torch.randn(2, 4, 256, device="cuda", dtype=BF16)[:, :2],
            torch.randn(100, 256, device="cuda", dtype=BF16),
            None,
        ),
    ],
    ids=[
        "17-rows",
        "64-rows",
        "K12",
        "fp32",
        "weight-transposed",
        "misaligned-input",
        "misaligned-weight",
        "3d-strides",
    ],
)
def test_fallback_shapes_match_f_linear(make) -> None:
    x, w, b = make()
    assert not decode_linear_serves(x, w, b)
    expected = torch.nn.functional.linear(x, w, b)
    assert torch.equal(jit_kernel.decode_linear(x, w, b), expected)
    out = torch.full_like(expected, float("nan"))
    assert jit_kernel.decode_linear(x, w, b, out=out) is out
    assert torch.equal(out, expected)


@pytest.mark.gpu
def test_no_rows_and_mismatched_dtypes_are_f_linear_s() -> None:
    w = torch.randn(100, 256, device="cuda", dtype=BF16)
    assert jit_kernel.decode_linear(torch.empty(0, 256, device="cuda", dtype=BF16), w).shape == (0, 100)
    with pytest.raises(RuntimeError):  # torch's own error for a dtype mismatch
        jit_kernel.decode_linear(torch.randn(2, 256, device="cuda", dtype=FP16), w)


@pytest.mark.gpu
def test_registered_op_makes_the_same_choice() -> None:
    """``torch.ops.jit_kernel.decode_linear`` (what torch.compile runs) serves what the op serves and
    gives F.linear's result for the rest, a misaligned input among them."""
    w = torch.randn(100, 256, device="cuda", dtype=BF16) / 16
    x = torch.randn(2, 256, device="cuda", dtype=BF16)
    assert torch.equal(torch.ops.jit_kernel.decode_linear(x, w, None, None), jit_kernel.decode_linear(x, w))
    misaligned = torch.randn(2 * 256 + 4, device="cuda", dtype=BF16)[4:].view(2, 256)
    expected = torch.nn.functional.linear(misaligned, w)
    assert torch.equal(torch.ops.jit_kernel.decode_linear(misaligned, w, None, None), expected)


# ---------------------------------------------------------------------------------------------
# Determinism, PDL, CUDA graphs, torch.compile


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 16384), (16, 4096, 4096), (9, 1280, 8192), (4, 16384, 4096)])
def test_two_calls_give_the_same_bits(m: int, n: int, k: int) -> None:
    """A fixed reduction order: the same bits on every call, with or without a cluster split (the
    last weight is the largest the kernel takes, 128 MiB)."""
    x, w, b = _inputs(m, n, k, BF16, True, _seed("bits", m, n, k))
    assert decode_linear_serves(x, w, b)
    first = jit_kernel.decode_linear(x, w, b)
    for _ in range(3):
        assert torch.equal(jit_kernel.decode_linear(x, w, b), first)
    assert torch.equal(jit_kernel.decode_linear(x, w, b, enable_pdl=False), first)


def _chain(x: torch.Tensor, weights: list[torch.Tensor], outs: list[torch.Tensor], pdl: bool | None) -> None:
    """Each launch reads what the launch before it wrote: a torch add, then decode_linear layers."""
    x.add_(1.0)
    h = x
    for w, out in zip(weights, outs, strict=True):
        jit_kernel.decode_linear(h, w, out=out, enable_pdl=pdl)
        h = out


def _chain_inputs(m: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(m, 4096, device="cuda", generator=g).to(BF16)
    dims = [4096, 1024, 4096, 8192, 4096]
    weights = [
        (torch.randn(n, k, device="cuda", generator=g) / math.sqrt(k)).to(BF16) for k, n in itertools.pairwise(dims)
    ]
    return x, weights


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_pdl_chain_matches_the_chain_without_pdl(m: int) -> None:
    x, weights = _chain_inputs(m)
    outs = [torch.empty(m, w.shape[0], device="cuda", dtype=BF16) for w in weights]
    expected_x = x.clone()
    _chain(expected_x, weights, outs, pdl=False)
    expected = [o.clone() for o in outs]
    for pdl in (True, None):
        got_x = x.clone()
        got = [torch.full_like(o, float("nan")) for o in outs]
        _chain(got_x, weights, got, pdl=pdl)
        torch.cuda.synchronize()
        assert torch.equal(got_x, expected_x)
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay() -> None:
    """Captured with a served call, a cluster-split call and a fallback call: each replay reads the
    inputs as they are then (written in place between replays) and matches the eager calls."""
    x, w, b = _inputs(4, 4096, 4096, BF16, True, 11)
    small_w = _inputs(1, 7, 4096, BF16, False, 12)[1]
    many = torch.randn(32, 4096, device="cuda", dtype=BF16)

    def step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            jit_kernel.decode_linear(x, w, b),
            jit_kernel.decode_linear(x[:1], small_w),
            jit_kernel.decode_linear(many, w),
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # resolve the kernels outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for i in range(3):
        x.copy_(torch.randn_like(x, dtype=torch.float32).to(BF16))
        many.copy_(torch.randn_like(many, dtype=torch.float32).to(BF16))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1]), f"replay {i}"
        torch.testing.assert_close(captured[2], eager[2])  # cuBLAS, captured and eager
    assert_matches(captured[0], x, w, b)


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    x, w, b = _inputs(8, 3000, 2048, BF16, True, 21)
    many = torch.randn(40, 2048, device="cuda", dtype=BF16)

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, many: torch.Tensor):
        y = jit_kernel.decode_linear(x, w, b)
        z = jit_kernel.decode_linear(many, w)  # F.linear in the graph
        h = jit_kernel.decode_linear(x.view(2, 4, -1), w)
        return y * 2, z, h

    compiled = torch.compile(step, fullgraph=True)
    want = step(x, w, b, many)
    got = compiled(x, w, b, many)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1])  # inductor may pick another GEMM for F.linear
    explanation = torch._dynamo.explain(step)(x, w, b, many)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# decode_linear_fp8 against the float64 definition, block by block

FP8 = torch.float8_e4m3fn
FP32 = torch.float32
FP8_BLOCK = 128


def _blocks(size: int) -> int:
    return -(-size // FP8_BLOCK)


def _fp8_inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh random fp8 operands and scales: ``q [m, k]`` and ``w [n, k]`` e4m3 of N(0, 1),
    ``input_scale [m, ceil(k / 128)]`` in [0.5, 1.5), ``weight_scale [ceil(n / 128), ceil(k / 128)]``
    in [0.5, 1.5) / sqrt(k) (outputs of unit scale at every K)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(m, k, device="cuda", generator=g).to(FP8)
    xs = torch.rand(m, _blocks(k), device="cuda", generator=g) + 0.5
    w = torch.randn(n, k, device="cuda", generator=g).to(FP8)
    ws = (torch.rand(_blocks(n), _blocks(k), device="cuda", generator=g) + 0.5) / math.sqrt(k)
    return q, xs, w, ws


def _fp8_float64(
    q: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, b: torch.Tensor | None
) -> torch.Tensor:
    """out[m, n] = sum_b (q[m, block b] . w[n, block b]) * xs[m, b] * ws[n // 128, b] (+ b[n]), in float64."""
    k, n = q.shape[-1], w.shape[0]
    x2, s2 = q.reshape(-1, k).double(), xs.reshape(-1, xs.shape[-1]).double()
    out = torch.zeros(x2.shape[0], n, dtype=torch.float64, device=q.device)
    wscale = ws.double()[torch.arange(n, device=q.device) // FP8_BLOCK]
    for blk in range(_blocks(k)):
        cols = slice(blk * FP8_BLOCK, min(k, (blk + 1) * FP8_BLOCK))
        out += (x2[:, cols] @ w[:, cols].double().T) * s2[:, blk : blk + 1] * wscale[:, blk]
    if b is not None:
        out += b.double()
    return out.reshape(*q.shape[:-1], n)


def assert_fp8_matches(out, q, xs, w, ws, b) -> None:
    """Within the output's rounding (half an ulp) and an fp32-accumulation allowance growing as
    sqrt(K); NaN (an element never written) fails."""
    k = q.shape[-1]
    eps = EPS[out.dtype]
    ref = _fp8_float64(q, xs, w, ws, b).reshape(out.shape)
    torch.testing.assert_close(out.double(), ref, rtol=eps, atol=eps * math.sqrt(k) / 64 + 2.0**-14)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [None, BF16, FP32], ids=["no-bias", "bias-bf16", "bias-fp32"])
@pytest.mark.parametrize("m", range(1, 17))
def test_fp8_every_row_count(m: int, bias: torch.dtype | None) -> None:
    """M = 1 to 16, N = 4097 (a last column block of one column, a last weight block of one row), K = 1024."""
    from jit_kernel.ops.gemm import decode_linear_fp8_serves

    n, k = 4097, 1024
    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-rows", m, bias))
    b = torch.randn(n, device="cuda").to(bias) if bias is not None else None
    assert decode_linear_fp8_serves(q, xs, w, ws, BF16, b)
    out = _poisoned(m, n, BF16)
    assert jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b, out=out) is out
    assert_fp8_matches(out, q, xs, w, ws, b)


# (N, K): one column, seven, partial blocks; K of one 16-byte chunk, of a short last k-block, of one
# k-block, DeepSeek-V3's 7168 and 18432; shapes that fill the GPU and shapes split over 2, 4 and 8
# blocks of a cluster.
FP8_SHAPES = [
    (1, 16),
    (7, 144),
    (4097, 128),
    (33, 272),
    (300, 1040),
    (1, 7168),
    (129, 7168),
    (7168, 18432 // 8),
    (4096, 7168),  # 128 column blocks: a cluster of 2
    (1280, 8192),  # 40 column blocks: a cluster of 4
    (100, 4096),  # 4 column blocks: a cluster of 4 (32 k-blocks, 8 a block)
    (6144, 4096),  # 192 column blocks: no cluster
    (24576, 1536),  # DeepSeek-V3 q_b_proj
]


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [BF16, FP16], ids=str)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize(("n", "k"), FP8_SHAPES, ids=[f"N{n}-K{k}" for n, k in FP8_SHAPES])
def test_fp8_shapes(n: int, k: int, m: int, out_dtype: torch.dtype) -> None:
    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-shapes", n, k, m))
    b = torch.randn(n, device="cuda").to(out_dtype) if (m + n) % 2 else None
    out = _poisoned(m, n, out_dtype)
    jit_kernel.decode_linear_fp8(q, xs, w, ws, out_dtype, b, out=out)
    assert_fp8_matches(out, q, xs, w, ws, b)


@pytest.mark.gpu
def test_fp8_scale_layouts() -> None:
    """Column-major input scales, a TMA-padded column-major buffer, a strided weight-scale view,
    [..., K] inputs, a strided bias, input and output rows at a stride: the same bits as row-major."""
    from jit_kernel.ops.gemm import decode_linear_fp8_serves

    m, n, k = 6, 1000, 2048
    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-layouts"))
    want = jit_kernel.decode_linear_fp8(q, xs, w, ws)
    assert_fp8_matches(want, q, xs, w, ws, None)
    column = torch.empty(_blocks(k), m, device="cuda").t().copy_(xs)
    padded = torch.empty(_blocks(k), 8, device="cuda").t()[:m].copy_(xs)
    ws_view = torch.empty(_blocks(k), _blocks(n), device="cuda").t().copy_(ws)
    for scales in (column, padded):
        assert decode_linear_fp8_serves(q, scales, w, ws)
        assert torch.equal(jit_kernel.decode_linear_fp8(q, scales, w, ws), want)
    assert torch.equal(jit_kernel.decode_linear_fp8(q, xs, w, ws_view), want)
    assert torch.equal(jit_kernel.decode_linear_fp8(q.view(2, 3, k), xs.view(2, 3, -1), w, ws), want.view(2, 3, n))
    wide = torch.empty(m, k + 48, device="cuda").to(FP8)
    wide[:, 16 : 16 + k].copy_(q)
    assert torch.equal(jit_kernel.decode_linear_fp8(wide[:, 16 : 16 + k], xs, w, ws), want)
    out_buffer = torch.full((m, n + 9), float("nan"), device="cuda", dtype=BF16)
    jit_kernel.decode_linear_fp8(q, xs, w, ws, out=out_buffer[:, :n])
    assert torch.equal(out_buffer[:, :n], want) and torch.isnan(out_buffer[:, n:]).all()
    b = torch.randn(2 * n, device="cuda")[::2]
    assert_fp8_matches(jit_kernel.decode_linear_fp8(q, xs, w, ws, bias=b), q, xs, w, ws, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16])
def test_fp8_after_the_package_quantisers(m: int) -> None:
    """Activations quantised by per_token_group_quant_fp8 (both scale layouts) and by the fused
    add + RMSNorm + group quant (TMA-padded column-major scales): served, and within the output's
    rounding of the definition on the quantised operands."""
    k, n = 7168, 1536
    g = torch.Generator(device="cuda").manual_seed(_seed("fp8-producers", m))
    h = torch.randn(m, k, device="cuda", generator=g).to(BF16)
    _, _, w, ws = _fp8_inputs(1, n, k, _seed("fp8-producers-w", m))
    for column_major in (False, True):
        q, s = jit_kernel.per_token_group_quant_fp8(h, 128, column_major_scales=column_major)
        assert_fp8_matches(jit_kernel.decode_linear_fp8(q, s, w, ws), q, s, w, ws, None)
    residual, norm_w = torch.randn_like(h), torch.ones(k, device="cuda", dtype=BF16)
    padded = torch.empty(_blocks(k), (m + 3) // 4 * 4, device="cuda").t()[:m]
    q = torch.empty(m, k, device="cuda", dtype=FP8)
    jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(h, residual, norm_w, 128, output_q=q, output_s=padded)
    assert_fp8_matches(jit_kernel.decode_linear_fp8(q, padded, w, ws), q, padded, w, ws, None)


@pytest.mark.gpu
def test_fp8_matches_scaled_mm() -> None:
    """Against torch._scaled_mm with 1 x 128 and 128 x 128 block scales, where this torch and
    cuBLAS run it (skipped otherwise): the same sums in another order, a unit in the last place apart."""
    m, n, k = 16, 4096, 7168
    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-scaled-mm"))
    try:
        expected = torch._scaled_mm(
            q, w.t(), scale_a=xs.t().contiguous().t(), scale_b=ws.t(), out_dtype=BF16
        )  # scale_a [M, K/128] column-major, scale_b [K/128, N/128]
    except (RuntimeError, NotImplementedError, ValueError) as error:
        pytest.skip(f"torch._scaled_mm has no 1x128 x 128x128 blockwise GEMM here: {error}")
    got = jit_kernel.decode_linear_fp8(q, xs, w, ws)
    assert_fp8_matches(got, q, xs, w, ws, None)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * EPS[BF16], atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(17, 1024, 1024), (18, 256, 512), (18, 256, 128), (64, 257, 144), (4, 100, 24), (200, 4096, 7168)],
)
def test_fp8_fallback(m: int, n: int, k: int, bias: bool) -> None:
    """What the kernel does not serve (more than 16 rows, K not a multiple of 16) takes
    torch._scaled_mm where it applies (CUDA 12.9+, sm_90, no bias, K a multiple of 512, N of 16;
    17 and 18 rows run padded to a multiple of 4), else the float32 dequantised reference: either
    within the output's rounding of the definition."""
    from jit_kernel.ops.gemm import _scaled_mm_applies, decode_linear_fp8_serves

    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-fallback", m, n, k))
    b = torch.randn(n, device="cuda") if bias else None
    assert not decode_linear_fp8_serves(q, xs, w, ws, BF16, b)
    if not bias and k % 512 == 0 and n % 16 == 0 and torch.cuda.get_device_capability()[0] == 9:
        # an H100 / H200 with a CUDA 12.9+ torch: cuBLAS's blockwise GEMM
        assert _scaled_mm_applies(q, w, BF16, b) is (tuple(map(int, torch.version.cuda.split(".")[:2])) >= (12, 9))
    out = _poisoned(m, n, BF16)
    assert jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b, out=out) is out
    assert_fp8_matches(out, q, xs, w, ws, b)
    column = torch.empty(_blocks(k), m, device="cuda").t().copy_(xs)  # any scale layout, the same result
    torch.testing.assert_close(jit_kernel.decode_linear_fp8(q, column, w, ws, BF16, b), out, rtol=0, atol=0)


@pytest.mark.gpu
def test_fp8_kernel_refuses_a_misaligned_input() -> None:
    q = torch.zeros(2 * 256 + 8, device="cuda").to(FP8)[8:].view(2, 256)
    w, ws, xs = (
        torch.zeros(100, 256, device="cuda").to(FP8),
        torch.ones(1, 2, device="cuda"),
        torch.ones(2, 2, device="cuda"),
    )
    with pytest.raises(ValueError, match="decode_linear_fp8: input_q's rows must start on 16-byte boundaries"):
        torch.ops.jit_kernel.decode_linear_fp8(q, xs, w, ws)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 7168), (16, 4096, 7168), (9, 1280, 8192), (4, 24576, 1536)])
def test_fp8_two_calls_give_the_same_bits(m: int, n: int, k: int) -> None:
    q, xs, w, ws = _fp8_inputs(m, n, k, _seed("fp8-bits", m, n, k))
    b = torch.randn(n, device="cuda").to(BF16)
    first = jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b)
    for _ in range(3):
        assert torch.equal(jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b), first)
    assert torch.equal(jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b, enable_pdl=False), first)


@pytest.mark.gpu
def test_fp8_pdl_after_the_quantiser() -> None:
    """With PDL the kernel reads its input and input scales only after the quantiser before it has
    written them (a chain of quantise, then GEMM, rewritten in place): the same bits as without PDL."""
    m, n, k = 4, 4096, 7168
    _, _, w, ws = _fp8_inputs(1, n, k, _seed("fp8-pdl"))
    h0 = torch.randn(m, k, device="cuda").to(BF16)
    h = torch.empty_like(h0)
    q = torch.empty(m, k, device="cuda", dtype=FP8)
    s = torch.empty(m, _blocks(k), device="cuda")
    results = {}
    for pdl in (False, True):
        h.copy_(h0)
        outs = []
        for i in range(3):
            h.mul_(1.5 if i % 2 else 0.5)  # each step's input differs from the last one's
            jit_kernel.per_token_group_quant_fp8(h, 128, output_q=q, output_s=s, enable_pdl=pdl)
            outs.append(jit_kernel.decode_linear_fp8(q, s, w, ws, enable_pdl=pdl))
        results[pdl] = outs
    for a, b in zip(results[False], results[True], strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_fp8_cuda_graph_capture_and_replay() -> None:
    """A served call, a cluster-split call and a reference call captured; each replay reads the
    inputs as they are then and matches the eager calls."""
    q, xs, w, ws = _fp8_inputs(4, 4096, 7168, 31)
    _, _, small_w, small_ws = _fp8_inputs(1, 7, 7168, 32)
    many_q, many_xs, _, _ = _fp8_inputs(32, 1, 7168, 33)

    def step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            jit_kernel.decode_linear_fp8(q, xs, w, ws),
            jit_kernel.decode_linear_fp8(q[:1], xs[:1], small_w, small_ws),
            jit_kernel.decode_linear_fp8(many_q, many_xs, w, ws),
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for i in range(3):
        q.copy_(torch.randn(q.shape, device="cuda").to(FP8))
        xs.copy_(torch.rand_like(xs) + 0.5)
        many_q.copy_(torch.randn(many_q.shape, device="cuda").to(FP8))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1]), f"replay {i}"
        torch.testing.assert_close(captured[2], eager[2])
    assert_fp8_matches(captured[0], q, xs, w, ws, None)


@pytest.mark.gpu
def test_fp8_torch_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    q, xs, w, ws = _fp8_inputs(8, 3000, 2048, 41)
    many_q, many_xs, _, _ = _fp8_inputs(40, 1, 2048, 42)
    b = torch.randn(3000, device="cuda")

    def step(q, xs, w, ws, b, many_q, many_xs):
        y = jit_kernel.decode_linear_fp8(q, xs, w, ws, BF16, b)
        z = jit_kernel.decode_linear_fp8(many_q, many_xs, w, ws)  # the reference, in the graph
        h = jit_kernel.decode_linear_fp8(q.view(2, 4, -1), xs.view(2, 4, -1), w, ws, FP16)
        return y * 2, z, h

    compiled = torch.compile(step, fullgraph=True)
    want = step(q, xs, w, ws, b, many_q, many_xs)
    got = compiled(q, xs, w, ws, b, many_q, many_xs)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1])
    explanation = torch._dynamo.explain(step)(q, xs, w, ws, b, many_q, many_xs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
