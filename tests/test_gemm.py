"""decode_linear on the GPU against a float64 reference (``input.double() @ weight.double().T + bias``)
within the output dtype's rounding, with an accumulation allowance that grows as sqrt(K): every row
count 1 to 16, column counts that are not a multiple of the kernel's 32-column blocks, K from 8 to
16384, shapes that split k over a cluster of 2, 4 and 8 blocks, bias on and off, fp16 and bf16, rows
at a stride, the output poisoned with NaN first so that an element never written fails. Also: the
shapes that go to ``torch.nn.functional.linear`` give its result, two calls give the same bits, PDL
chains match the same chain without PDL, CUDA-graph capture and replay, torch.compile(fullgraph=True)."""

from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch

import jit_kernel
from jit_kernel.ops import gemm
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
    (4097, 16384),
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
    out = _poisoned(m, n, dtype)
    jit_kernel.decode_linear(x, w, b, out=out)
    assert_matches(out, x, w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_lm_head(m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 3's LM head: 128,256 x 4096 in bf16 (1 GB of weight, 4,008 column blocks), through the
    kernel (the size bound lifted: decode_linear gives weights this large to cuBLAS)."""
    monkeypatch.setattr(gemm, "MAX_KERNEL_WEIGHT_BYTES", 1 << 40)
    x, w, b = _inputs(m, 128256, 4096, BF16, False, _seed("lm_head", m))
    assert gemm.decode_linear_serves(x, w)
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
    ],
    ids=["17-rows", "64-rows", "K12", "fp32", "weight-transposed", "misaligned-input"],
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
def test_kernel_refuses_a_misaligned_input() -> None:
    """The registered op is the kernel alone: a pointer off 16 bytes is refused, naming the input."""
    x = torch.randn(2 * 256 + 4, device="cuda", dtype=BF16)[4:].view(2, 256)
    w = torch.randn(100, 256, device="cuda", dtype=BF16)
    with pytest.raises(ValueError, match="decode_linear: input's rows must start on 16-byte boundaries"):
        torch.ops.jit_kernel.decode_linear(x, w)


# ---------------------------------------------------------------------------------------------
# Determinism, PDL, CUDA graphs, torch.compile


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 16384), (16, 4096, 4096), (9, 1280, 8192), (4, 28672, 4096)])
def test_two_calls_give_the_same_bits(m: int, n: int, k: int) -> None:
    """A fixed reduction order: the same bits on every call, with or without a cluster split (the
    kernel itself: decode_linear gives the 28,672 x 4,096 weight to cuBLAS)."""
    x, w, b = _inputs(m, n, k, BF16, True, _seed("bits", m, n, k))
    kernel = torch.ops.jit_kernel.decode_linear  # no fallback
    first = kernel(x, w, b)
    for _ in range(3):
        assert torch.equal(kernel(x, w, b), first)
    assert torch.equal(kernel(x, w, b, enable_pdl=False), first)


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
