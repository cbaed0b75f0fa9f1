"""Gated activations (silu_and_mul, gelu_and_mul, gelu_tanh_and_mul) against an fp64 torch reference;
bad inputs, the registered torch ops and torch.compile tracing on the CPU."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import jit_kernel
from _norm_helpers import assert_close, fake_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NAMES = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]


def _act(name: str, g: torch.Tensor) -> torch.Tensor:
    if name == "silu_and_mul":
        return g * torch.sigmoid(g)
    if name == "gelu_and_mul":
        return 0.5 * g * (1.0 + torch.erf(g / math.sqrt(2.0)))
    if name == "gelu_tanh_and_mul":
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
    raise ValueError(name)


def ref(name: str, x: torch.Tensor) -> torch.Tensor:
    """act(gate) * up in fp64 from the dtype's values (gate = first half of the last dimension)."""
    x64 = x.double()
    d = x.shape[-1] // 2
    return _act(name, x64[..., :d]) * x64[..., d:]


def op(name: str) -> Callable[..., torch.Tensor]:
    return getattr(jit_kernel, name)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def randn(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    # Scaled so that gates reach the saturated parts of every activation (|x| up to about 15).
    return (3 * torch.randn(*shape, device="cuda")).to(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 7, 64, 4096, 11008, 14336, 14337])
@pytest.mark.parametrize("tokens", [0, 1, 5, 16, 1000])
def test_act_and_mul(name: str, dtype: torch.dtype, d: int, tokens: int) -> None:
    x = randn(tokens, 2 * d, dtype=dtype)
    expected = ref(name, x)
    out = poisoned((tokens, d), dtype)
    assert op(name)(x, out=out) is out
    assert_close(out, expected, dtype)
    got = op(name)(x)
    assert got.shape == (tokens, d) and got.dtype == dtype and got.device == x.device
    assert_close(got, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 1000])  # 8-byte (decode) and 16-byte vectors
def test_non_finite_gates(name: str, dtype: torch.dtype, tokens: int) -> None:
    """The documented results (ops/activation.py) for gates inf, -inf and NaN with up = 1, placed in
    every lane position of a vector; finite gates beside them keep the reference."""
    d = 64
    x = randn(tokens, 2 * d, dtype=dtype)
    x[:, d:] = 1
    specials = torch.tensor([float("inf"), float("-inf"), float("nan")], device="cuda", dtype=dtype)
    cols = torch.arange(d, device="cuda")
    pick = cols % 11 < 3  # columns 0-2, 11-13, ...: every position of 8- and 16-byte vectors
    x[:, :d][:, pick] = specials[cols[pick] % 11]
    out = poisoned((tokens, d), dtype)
    op(name)(x, out=out)
    got = out[:, pick].float()
    which = (cols[pick] % 11).expand_as(got)
    minus_inf = torch.tensor(0.0 if name == "gelu_and_mul" else float("nan"), device="cuda")
    expected = torch.where(which == 0, float("inf"), torch.where(which == 1, minus_inf, float("nan")))
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got[~got.isnan()], expected[~expected.isnan()])
    assert_close(out[:, ~pick], ref(name, x)[:, ~pick], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "d"),
    # Blocks that loop over tokens (4097 and 16383 tokens of d 4096: the last pair of a loop is
    # half-empty), many tokens of short rows (several tokens per block), and both of them unaligned.
    [(4097, 4096), (16383, 4096), (100000, 64), (3001, 7), (2049, 1000)],
)
def test_many_tokens(name: str, dtype: torch.dtype, tokens: int, d: int) -> None:
    x = randn(tokens, 2 * d, dtype=dtype)
    out = poisoned((tokens, d), dtype)
    op(name)(x, out=out)
    assert_close(out, ref(name, x), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pad", [8, 3])  # 8: rows stay whole 16-byte vectors (bf16/fp16); 3: scalar path
@pytest.mark.parametrize("d", [64, 4096, 14336])
@pytest.mark.parametrize("tokens", [1, 5, 1000])
def test_strided_rows(name: str, dtype: torch.dtype, pad: int, d: int, tokens: int) -> None:
    wide = randn(tokens, 2 * d + pad, dtype=dtype)
    x = wide[:, : 2 * d]
    out_wide = poisoned((tokens, d + pad), dtype)
    out = out_wide[:, :d]
    assert op(name)(x, out=out) is out
    assert_close(out, ref(name, x), dtype)
    assert torch.isnan(out_wide[:, d:]).all()  # nothing written past d
    assert_close(op(name)(x), ref(name, x), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_pointers(name: str, dtype: torch.dtype) -> None:
    tokens, d = 16, 4096
    flat = randn(tokens * 2 * d + 1, dtype=dtype)
    x = flat[1:].view(tokens, 2 * d)  # off a 16-byte boundary: scalar path
    out = poisoned((tokens * d + 1,), dtype)[1:].view(tokens, d)
    op(name)(x, out=out)
    assert_close(out, ref(name, x), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(2, 3, 8192), (8192,), (4, 1, 22), (2, 0, 64)])
def test_shapes(name: str, shape: tuple[int, ...]) -> None:
    dtype = torch.bfloat16
    x = randn(*shape, dtype=dtype)
    out = poisoned((*shape[:-1], shape[-1] // 2), dtype)
    assert op(name)(x, out=out) is out
    assert_close(out, ref(name, x), dtype)
    got = op(name)(x)
    assert got.shape == out.shape
    assert_close(got, ref(name, x), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("enable_pdl", [True, False])
def test_pdl_on_and_off(name: str, enable_pdl: bool) -> None:
    x = randn(16, 2 * 14336, dtype=torch.bfloat16)
    out = poisoned((16, 14336), torch.bfloat16)
    op(name)(x, out=out, enable_pdl=enable_pdl)
    # Back-to-back launches: the second reads what the first wrote (PDL must wait for it).
    y = op(name)(torch.cat([out, out], dim=-1), enable_pdl=enable_pdl)
    assert_close(out, ref(name, x), torch.bfloat16)
    assert_close(y, ref(name, torch.cat([out, out], dim=-1)), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("tokens", [1, 16, 1024])
def test_cuda_graph_capture_and_replay(name: str, tokens: int) -> None:
    d, dtype = 14336, torch.bfloat16
    x = randn(tokens, 2 * d, dtype=dtype)
    out = poisoned((tokens, d), dtype)
    op(name)(x, out=out)  # load the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(name)(x, out=out)
    for _ in range(2):
        x.copy_(randn(tokens, 2 * d, dtype=dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, ref(name, x), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_torch_compile_fullgraph(name: str) -> None:
    torch._dynamo.reset()

    def model(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        op(name)(x, out=out)
        return op(name)(x * 2) + out

    x = randn(8, 2 * 4096, dtype=torch.bfloat16)
    out_eager, out_compiled = poisoned((8, 4096), torch.bfloat16), poisoned((8, 4096), torch.bfloat16)
    expected = model(x, out_eager)
    got = torch.compile(model, fullgraph=True)(x, out_compiled)
    assert_close(got, expected, torch.bfloat16)
    assert_close(out_compiled, out_eager, torch.bfloat16)


@pytest.mark.gpu
def test_matches_torch_functional() -> None:
    """The conventions (which half is the gate, erf vs tanh GELU) against torch.nn.functional."""
    import torch.nn.functional as F

    x = randn(64, 2 * 512, dtype=torch.float32)
    g, u = x[:, :512], x[:, 512:]
    torch.testing.assert_close(jit_kernel.silu_and_mul(x), F.silu(g) * u, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(jit_kernel.gelu_and_mul(x), F.gelu(g) * u, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(jit_kernel.gelu_tanh_and_mul(x), F.gelu(g, approximate="tanh") * u, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# CPU: bad inputs (C++ checks on fake CUDA tensors, kernels built for sm_90), registration, tracing


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


BAD_INPUTS = [
    pytest.param(lambda f: f(_e(4, 7)), ValueError, r"input: the last dimension .* must be even, got 7", id="odd"),
    pytest.param(lambda f: f(_e(4, 8), out=_e(4, 5)), ValueError, r"out must have shape \(4, 4\)", id="out-shape"),
    pytest.param(lambda f: f(_e(4, 8), out=_e(3, 4)), ValueError, r"out must have shape \(4, 4\)", id="out-rows"),
    pytest.param(
        lambda f: f(_e(4, 8), out=_e(4, 4, dtype=torch.float16)),
        TypeError,
        r"(?s)'out'.*Dtype mismatch",
        id="out-dtype",
    ),
    pytest.param(
        lambda f: f(_e(4, 8), out=_e(4, 4, device="cpu")), ValueError, r"(?s)'out'.*Device mismatch", id="out-device"
    ),
    pytest.param(lambda f: f(_e(4, 8, dtype=torch.int32)), TypeError, "input must be one of", id="int-input"),
    pytest.param(lambda f: f([1.0, 2.0]), TypeError, "input must be a torch.Tensor, got list", id="non-tensor"),
    pytest.param(lambda f: f(_e(4, 8), out="x"), TypeError, "out must be a torch.Tensor, got str", id="out-non-tensor"),
    pytest.param(lambda f: f(_e(())), ValueError, "input must have at least one dimension", id="0-dim"),
    pytest.param(lambda f: f(_e(8, 4).t()), ValueError, r"(?s)'input'.*Stride mismatch", id="last-stride"),
    pytest.param(
        lambda f: f(_e(4, 8), out=_e(1, 4).expand(4, 4)), ValueError, "out: rows must not overlap", id="out-overlap"
    ),
    pytest.param(
        lambda f: f(_e(4, 8), enable_pdl=[1]), TypeError, "enable_pdl must be a bool or None, got list", id="pdl"
    ),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("call", "error", "match"), BAD_INPUTS)
def test_bad_inputs(name: str, call, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call(op(name))


@pytest.mark.parametrize("name", NAMES)
def test_valid_fake_calls_pass_the_checks_and_launch_nothing(name: str) -> None:
    """The C++ checks accept what the GPU tests run (strided rows, 3-D, out=) and, given
    FakeTensors (no data), return before any CUDA call."""
    with fake_cuda():
        assert op(name)(_e(4, 2 * 4096)).shape == (4, 4096)
        strided_in = torch.empty_strided((4, 2 * 4096), (2 * 4096 + 8, 1), device="cuda", dtype=torch.bfloat16)
        strided_out = torch.empty_strided((4, 4096), (4096 + 3, 1), device="cuda", dtype=torch.bfloat16)
        assert op(name)(strided_in, out=strided_out) is strided_out
        assert op(name)(_e(2, 3, 14, dtype=torch.float32), enable_pdl=False).shape == (2, 3, 7)
        assert op(name)(_e(0, 64, dtype=torch.float16)).shape == (0, 32)


def test_rejects_cpu_input(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the kernel (whose C++ check this is) is built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match=r"(?s)'input'.*Device mismatch: expected cuda but got cpu"):
        jit_kernel.silu_and_mul(torch.randn(4, 8))


@pytest.mark.parametrize("name", NAMES)
def test_registered_ops_and_fakes(name: str) -> None:
    functional = getattr(torch.ops.jit_kernel, name).default._schema
    with_out = getattr(torch.ops.jit_kernel, f"{name}_out").default._schema
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in functional.arguments)
    assert {a.name for a in with_out.arguments if a.alias_info is not None and a.alias_info.is_write} == {"out"}
    with fake_cuda():
        x = _e(3, 5, 2 * 96)
        y = getattr(torch.ops.jit_kernel, name)(x)
        assert y.shape == (3, 5, 96) and y.dtype == x.dtype and y.device == x.device
        # The fakes run the launcher's checks (fake_checks=True): tracing rejects what eager rejects.
        with pytest.raises(ValueError, match="must be even, got 7"):
            getattr(torch.ops.jit_kernel, name)(_e(4, 7))
        with pytest.raises(ValueError, match="out must have shape"):
            getattr(torch.ops.jit_kernel, f"{name}_out")(_e(4, 5), _e(4, 8))


def test_torch_compile_traces_without_graph_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """fullgraph tracing of fake CUDA tensors (on a CPU machine too): a backend that records the
    graph and hands it back, run on fake tensors (the ops' fake implementations, which run the
    launchers' checks), so no kernel runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not torch.cuda.is_available():  # the fakes' checks need a kernel: built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    torch._dynamo.reset()
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        return gm

    def model(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        a = jit_kernel.silu_and_mul(x)
        jit_kernel.gelu_and_mul(x, out=out)
        return a + jit_kernel.gelu_tanh_and_mul(x, enable_pdl=False)

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, out = torch.empty(3, 16, device="cuda"), torch.empty(3, 8, device="cuda")
        got = torch.compile(model, fullgraph=True, backend=backend)(x, out)
    assert got.shape == (3, 8)
    (graph,) = graphs
    targets = {str(node.target).removesuffix(".default") for node in graph.graph.nodes if node.op == "call_function"}
    assert {"jit_kernel.silu_and_mul", "jit_kernel.gelu_and_mul_out", "jit_kernel.gelu_tanh_and_mul"} <= targets, (
        targets
    )


# ---------------------------------------------------------------------------------------------
# The benchmark script on the CPU (tests/test_benchmarks.py covers the shared helpers)


def test_bench_activation_on_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Imports without CUDA, declares one perf_report per (op, d), runs main() with a fake timer
    (every config and provider timed once), and its torch baselines compute the reference."""
    import importlib

    for module in ("triton", "matplotlib", "pandas"):
        pytest.importorskip(module)
    from jit_kernel.benchmark import _tables
    from jit_kernel.benchmark._tables import Measurements

    monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
    monkeypatch.delenv("JIT_KERNEL_BENCH_OUT", raising=False)
    cuda_before = torch.cuda.is_initialized()
    bench = importlib.reload(importlib.import_module("jit_kernel.benchmark.bench_activation"))
    try:
        assert torch.cuda.is_initialized() == cuda_before  # importing it touches no GPU
        assert bench.activation_bytes(4, 14336) == 3 * 4 * 14336 * 2
        names = [b.plot_name for b in bench.bench_activation.benchmarks]
        assert names == [f"{name}-bf16-d14336" for name in NAMES]
        x = torch.randn(3, 16)
        for name in NAMES:
            torch.testing.assert_close(bench.TORCH[name](x).double(), ref(name, x), rtol=1e-5, atol=1e-5)

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
        configs = len(NAMES) * len(bench.HIDDEN) * len(bench.TOKENS)
        assert len(calls) == len(set(calls)) == configs * len(bench.PROVIDERS)
        summary = capsys.readouterr().out.split("device: Fake GPU")[1]
        assert len([line for line in summary.splitlines() if line.startswith("| ") and "jit us" not in line]) == configs
    finally:
        monkeypatch.undo()
        importlib.reload(bench)
