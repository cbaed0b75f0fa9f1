"""decode_linear on the CPU: the kernel built for sm_90a (and sm_80, the release's oldest arch) without
spills, the rule (which calls the launcher serves and which go to ``torch.nn.functional.linear``),
asked of fake CUDA tensors, and the fallback itself, the launcher's checks on fake CUDA tensors
(nothing launches), the shapes the op and its fakes give (FakeTensor and torch.compile tracing), the
registered ops and the launcher's cluster split."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel.engine import families
from jit_kernel.ops import gemm
from jit_kernel.ops.gemm import (
    FP8_BLOCK,
    decode_linear,
    decode_linear_fp8,
    decode_linear_fp8_serves,
    decode_linear_serves,
)

ROOT = Path(__file__).resolve().parents[1]
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
M, N, K = 4, 1000, 4096


@pytest.fixture(autouse=True)
def _sm90a(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU the launcher's checks run in kernels built for sm_90a, the ones the compile
    tests build, so that each config compiles once."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")


@pytest.fixture
def reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _e(*shape: int, dtype: torch.dtype = BF16, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=device)


def _strided(rows: int, cols: int, row_stride: int, inner: int = 1) -> torch.Tensor:
    """A [rows, cols] bf16 CUDA tensor at the given strides (fake tensors cannot be sliced without a GPU)."""
    return torch.empty_strided((rows, cols), (row_stride, inner), dtype=BF16, device="cuda")


def _t(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype)


def _value(v: object) -> object:
    return v() if callable(v) else v


# ---------------------------------------------------------------------------------------------
# The spec and the builds


def test_family_spec() -> None:
    spec = families.DECODE_LINEAR
    assert spec in families.ALL_FAMILIES
    assert spec.sources == ("gemm/decode_linear.cuh",)
    assert spec.params == ("dtype",)
    assert spec.prebuilt == (("bf16_t",), ("fp16_t",))
    assert gemm.MAX_ROWS == max(families.DECODE_LINEAR_ROWS) == 16


@pytest.mark.parametrize("config", families.DECODE_LINEAR.prebuilt, ids=lambda c: "-".join(map(str, c)))
def test_prebuilt_configs_compile_for_sm90a_without_a_gpu(config: tuple[str, ...]) -> None:
    """Every prebuilt config builds for sm_90a and exports its symbol (from the installed prebuilt
    library where it holds it; see ``assert_builds_for_arch``)."""
    assert_builds_for_arch(families.DECODE_LINEAR, config, "9.0a")


def test_compiles_for_sm80() -> None:
    """The release's oldest arch: mma.sync exists there, the cluster path compiles to a trap (the
    launcher splits k over a cluster on sm_90+ only)."""
    assert_builds_for_arch(families.DECODE_LINEAR, ("bf16_t",), "8.0")


def _ptxas_report(config: tuple[str, ...], tmp_path: Path) -> str:
    import tvm_ffi.libinfo

    from jit_kernel.engine import toolchain
    from jit_kernel.engine.unit import TranslationUnit

    unit = TranslationUnit.for_config(families.DECODE_LINEAR, config)
    source = tmp_path / "unit.cu"
    source.write_text(unit.text())
    includes = [f"-I{tvm_ffi.libinfo.find_include_path()}", f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}"]
    command = [str(toolchain.nvcc_path()), "-cubin", "-arch=sm_90a", "-Xptxas", "-v", *unit.compile_args(), *includes]
    result = subprocess.run([*command, str(source), "-o", str(tmp_path / "unit.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("config", families.DECODE_LINEAR.prebuilt, ids=lambda c: "-".join(map(str, c)))
def test_kernel_does_not_spill_on_sm90a(config: tuple[str, ...], tmp_path: Path) -> None:
    """ptxas keeps every thread's loads in flight in registers in both row tiles: no spill, no stack
    frame, within the 128 registers that two blocks of 256 threads per SM leave
    (``__launch_bounds__``)."""
    report = _ptxas_report(config, tmp_path)
    properties = re.findall(
        r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
        report,
    )
    kernels = [p for p in properties if "decode_linear_kernel" in p[0]]
    assert len(kernels) == 2, report[-4000:]
    assert all(k[1:] == ("0", "0", "0") for k in kernels), kernels
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert registers and max(registers) <= 128, report[-4000:]


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_launcher_cluster_split(tmp_path: Path) -> None:
    """The launcher's split of k over a cluster (host code of csrc/gemm/decode_linear.cuh, built and
    run here): the largest of 1, 2, 4, 8 blocks that keeps the grid within one wave and gives each
    block's 8 warps a k-step each."""
    import tvm_ffi

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "split.cu"
    # (column blocks, k-steps, blocks per wave): H200's 132 SMs at two blocks each hold 264.
    cases = [(128, 128, 264), (40, 256, 264), (1, 512, 264), (1, 1, 264), (192, 128, 264), (1, 16, 264),
             (1, 24, 264), (132, 448, 264), (66, 128, 264), (4008, 128, 264), (33, 8, 264)]  # fmt: skip
    calls = "".join(f'  std::printf("%u\\n", split_log2({g}, {s}, {w}));\n' for g, s, w in cases)
    source.write_text(
        "#include <gemm/decode_linear.cuh>\n#include <cstdio>\n"
        "using jit_kernel::gemm::detail::split_log2;\n"
        f"int main() {{\n{calls}}}\n"
    )
    tvm = Path(tvm_ffi.__file__).parent
    subprocess.run(
        [nvcc, "-std=c++20", "--expt-relaxed-constexpr", f"-I{ROOT / 'include'}", f"-I{ROOT / 'csrc'}",
         f"-I{tvm / 'include'}", f"-L{tvm / 'lib'}", "-ltvm_ffi", f"-Xlinker=-rpath,{tvm / 'lib'}",
         "-o", str(tmp_path / "split"), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    run = subprocess.run([str(tmp_path / "split")], check=True, capture_output=True, text=True)
    got = [1 << int(line) for line in run.stdout.split()]
    # N 4096 (128 blocks of 32 columns): 2; N 1280 (40 blocks): 4 (8 would need 320 of 264); one
    # block with K 16384: 8 (the most); K 32 (one step): 1; N 6144 (192 blocks): 1 (two waves
    # otherwise); 16 steps: 2; 24 steps: 2 (4 would leave warps without a step); 132 blocks: 2 (264);
    # 66 blocks: 4; N 128256: 1; 8 steps: 1.
    assert got == [2, 4, 8, 1, 1, 2, 2, 2, 4, 1, 1]


# ---------------------------------------------------------------------------------------------
# The rule, asked of fake CUDA tensors (taken as aligned: the GPU tests try misaligned pointers)


SERVES: list[tuple[str, Callable[[], tuple[object, ...]], bool]] = [
    ("1 row", lambda: (_e(1, 64), _e(32, 64)), True),
    ("16 rows", lambda: (_e(16, 64), _e(32, 64)), True),
    ("fp16 with bias", lambda: (_e(5, 64, dtype=FP16), _e(32, 64, dtype=FP16), _e(32, dtype=FP16)), True),
    ("3-D input, 16 rows", lambda: (_e(2, 8, 64), _e(32, 64)), True),
    ("3-D input of one token a row", lambda: (_e(4, 1, 64), _e(32, 64)), True),
    ("1-D input (one row)", lambda: (_e(64), _e(32, 64)), True),
    ("K = 8", lambda: (_e(3, 8), _e(7, 8)), True),
    ("N = 1", lambda: (_e(3, 64), _e(1, 64)), True),
    ("rows at a stride of 72", lambda: (_strided(4, 64, 72), _e(32, 64)), True),
    ("one row at a stride of 68", lambda: (_strided(1, 64, 68), _e(32, 64)), True),
    ("3-D rows at one stride of 72", lambda: (torch.empty_strided((2, 2, 64), (144, 72, 1), dtype=BF16, device="cuda"),
                                            _e(32, 64)), True),
    ("bias at a stride of 2", lambda: (_e(2, 64), _e(32, 64), torch.empty_strided((32,), (2,), dtype=BF16,
                                                                                  device="cuda")), True),
    ("17 rows", lambda: (_e(17, 64), _e(32, 64)), False),
    ("3-D input, 18 rows", lambda: (_e(2, 9, 64), _e(32, 64)), False),
    ("no rows", lambda: (_e(0, 64), _e(32, 64)), False),
    ("K = 12", lambda: (_e(2, 12), _e(32, 12)), False),
    ("K = 4", lambda: (_e(2, 4), _e(32, 4)), False),
    ("float32", lambda: (_e(2, 64, dtype=FP32), _e(32, 64, dtype=FP32)), False),
    ("input bf16, weight fp16", lambda: (_e(2, 64), _e(32, 64, dtype=FP16)), False),
    ("input fp16, weight bf16", lambda: (_e(2, 64, dtype=FP16), _e(32, 64)), False),
    ("bias fp32", lambda: (_e(2, 64), _e(32, 64), _e(32, dtype=FP32)), False),
    ("bias 2-D", lambda: (_e(2, 64), _e(32, 64), _e(1, 32)), False),
    ("weight transposed", lambda: (_e(2, 64), _e(64, 32).t()), False),
    ("weight rows at a stride of 72", lambda: (_e(2, 64), _strided(32, 64, 72)), False),
    ("rows at a stride of 68", lambda: (_strided(4, 64, 68), _e(32, 64)), False),
    ("input columns strided", lambda: (_strided(2, 64, 128, 2), _e(32, 64)), False),
    ("3-D rows at two strides", lambda: (torch.empty_strided((2, 2, 64), (256, 72, 1), dtype=BF16, device="cuda"),
                                       _e(32, 64)), False),
    ("K mismatch", lambda: (_e(2, 64), _e(32, 72)), False),
    ("weight 3-D", lambda: (_e(2, 64), _e(1, 32, 64)), False),
    ("weight 1-D", lambda: (_e(2, 64), _e(64)), False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "make", "served"), SERVES, ids=[case for case, _, _ in SERVES])
def test_rule(case: str, make: Callable[[], tuple[object, ...]], served: bool) -> None:
    with fake_cuda():
        assert decode_linear_serves(*make()) is served


@pytest.mark.parametrize(("rows", "served"), [(1, True), (16, True), (17, False), (64, False), (0, False)])
def test_rule_with_out_given_counts_the_rows_in_the_launcher(rows: int, served: bool) -> None:
    """With ``out`` given the op reads only the device and the dtype: the launcher bounds the rows."""
    with fake_cuda():
        assert decode_linear.op.serves(_e(rows, 64), _e(32, 64), out=_e(rows, 32)) is served


@pytest.mark.parametrize(
    ("n", "k", "served"),
    [(4096, 14336, True), (7168, 8192, True), (8192, 8192, True), (8193, 8192, False), (28672, 4096, False)],
    ids=["Llama-3-8B down", "Llama-3-70B TP8 gate_up", "128 MiB", "above 128 MiB", "Llama-3-8B gate_up"],
)
def test_weights_above_the_size_bound_go_to_cublas(n: int, k: int, served: bool) -> None:
    """Weights of more than 128 MiB go to cuBLAS, which streams them as fast."""
    with fake_cuda():
        assert decode_linear_serves(_e(4, k), _e(n, k)) is served


def test_nn_parameter_weights_are_served() -> None:
    with fake_cuda():
        weight, bias = torch.nn.Parameter(_e(32, 64)), torch.nn.Parameter(_e(32))
        assert decode_linear_serves(_e(3, 64), weight, bias)


# ---------------------------------------------------------------------------------------------
# The fallback (CPU tensors: F.linear runs for real)


@pytest.mark.parametrize(
    "make",
    [
        lambda: (torch.randn(17, 64), torch.randn(32, 64), torch.randn(32)),
        lambda: (torch.randn(2, 12).bfloat16(), torch.randn(5, 12).bfloat16(), None),
        lambda: (torch.randn(3, 64), torch.randn(32, 64), None),
        lambda: (torch.randn(2, 3, 64).half(), torch.randn(64, 32).half().t(), None),
        lambda: (torch.randn(40, 64).bfloat16(), torch.randn(32, 64).bfloat16(), None),
    ],
    ids=["17 rows fp32", "K 12", "fp32", "weight transposed", "40 rows"],
)
def test_fallback_is_torch_linear(make: Callable[[], tuple[torch.Tensor, ...]]) -> None:
    x, w, b = make()
    expected = torch.nn.functional.linear(x, w, b)
    assert torch.equal(decode_linear(x, w, b), expected)
    out = torch.full_like(expected, float("nan"))
    assert decode_linear(x, w, b, out=out) is out
    assert torch.equal(out, expected)
    assert torch.equal(jit_kernel.decode_linear(x, w, b), expected)
    assert torch.equal(torch.ops.jit_kernel.decode_linear(x, w, b, None), expected)


def test_cpu_tensors_are_f_linear_s_without_a_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input off the GPU goes to F.linear before any kernel is loaded (no arch needed)."""
    monkeypatch.delenv("JIT_KERNEL_CUDA_ARCH", raising=False)
    x, w, b = torch.randn(4, 64).bfloat16(), torch.randn(32, 64).bfloat16(), torch.randn(32).bfloat16()
    assert torch.equal(decode_linear(x, w, b), torch.nn.functional.linear(x, w, b))


def test_fallback_checks_out() -> None:
    x, w = torch.randn(17, 64), torch.randn(32, 64)
    with pytest.raises(ValueError, match=r"decode_linear: out must have shape \(17, 32\) and dtype torch.float32"):
        decode_linear(x, w, out=torch.empty(17, 31))
    with pytest.raises(ValueError, match=r"decode_linear: out must have shape \(17, 32\)"):
        decode_linear(x, w, out=torch.empty(17, 32, dtype=FP16))
    with pytest.raises(TypeError, match=r"^decode_linear: out must be a torch\.Tensor, got list$"):
        decode_linear(x, w, out=[0.0])


def test_fallback_errors_are_torch_linear_s() -> None:
    """Shapes that cannot be multiplied reach torch.nn.functional.linear, which says why."""
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        decode_linear(torch.randn(2, 64).bfloat16(), torch.randn(32, 72).bfloat16())
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        decode_linear(torch.randn(2, 64), torch.randn(32, 72))


# ---------------------------------------------------------------------------------------------
# The kernel path on fake CUDA tensors: the launcher's checks run, nothing launches


BAD = [
    ({"input": [1.0]}, TypeError, r"^decode_linear: input must be a torch\.Tensor, got list$"),
    ({"weight": "w"}, TypeError, r"^decode_linear: weight must be a torch\.Tensor, got str$"),
    ({"weight": lambda: _e(N, K, device="cpu")}, ValueError,
     r"decode_linear: weight must be on input's device \(cuda:0\), got cpu"),
    ({"bias": lambda: _e(N + 1)}, ValueError,
     r"decode_linear: bias must have out_features \(1000\) elements, got 1001"),
    ({"bias": lambda: _e(N, device="cpu")}, ValueError, r"decode_linear: bias must be on input's device"),
    ({"bias": [0.0]}, TypeError, r"^decode_linear: bias must be a torch\.Tensor, got list$"),
    ({"out": lambda: _e(M, N, dtype=FP16)}, TypeError, r"decode_linear: out must have input's dtype, got float16"),
    ({"out": lambda: _e(M, N + 1)}, ValueError, r"decode_linear: out must have shape \(4, 1000\), got \(4, 1001\)"),
    ({"out": lambda: _e(M + 1, N)}, ValueError, r"decode_linear: out must have shape \(4, 1000\), got \(5, 1000\)"),
    ({"out": lambda: _e(M, 1, N)}, ValueError, r"decode_linear: out must have shape \(4, 1000\), got \(4, 1, 1000\)"),
    ({"out": lambda: torch.empty_strided((M, N), (1, M), dtype=BF16, device="cuda")}, ValueError,
     r"decode_linear: out must be rows: a contiguous last dimension"),
    ({"out": lambda: _e(M, N, device="cpu")}, ValueError, r"decode_linear: out must be on input's device"),
    ({"out": [0]}, TypeError, r"^decode_linear: out must be a torch\.Tensor, got list$"),
    ({"enable_pdl": "yes"}, TypeError, r"^decode_linear: enable_pdl must be a bool or None, got str$"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), BAD)
def test_bad_inputs(overrides: dict[str, object], error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"input": _e(M, K), "weight": _e(N, K), "bias": None} | {k: _value(v) for k, v in overrides.items()}
        with pytest.raises(error, match=match):
            decode_linear(**args)


DECLINED = [
    ("17 rows", lambda: (_e(17, K), _e(N, K)), (17, N)),
    ("K 12", lambda: (_e(M, 12), _e(N, 12)), (M, N)),
    ("float32", lambda: (_e(M, K, dtype=FP32), _e(N, K, dtype=FP32)), (M, N)),
    ("weight transposed", lambda: (_e(M, K), _e(K, N).t()), (M, N)),
    ("rows at a stride of K + 4", lambda: (_strided(M, K, K + 4), _e(N, K)), (M, N)),
    ("input columns strided", lambda: (_strided(M, K, 2 * K, 2), _e(N, K)), (M, N)),
]


@pytest.mark.parametrize(("case", "make", "shape"), DECLINED, ids=[case for case, _, _ in DECLINED])
def test_registered_op_declines_to_f_linear(case: str, make: Callable[[], tuple], shape: tuple[int, ...]) -> None:
    """``torch.ops.jit_kernel.decode_linear`` makes the op's choice: what the launcher does not serve
    is torch.nn.functional.linear's result (its fake as well)."""
    with fake_cuda():
        x, w = make()
        assert not decode_linear_serves(x, w)
        assert torch.ops.jit_kernel.decode_linear(x, w, None, None).shape == shape
        assert decode_linear(x, w).shape == shape


def test_registered_op_errors_name_the_argument() -> None:
    with fake_cuda():
        with pytest.raises(TypeError, match=r"decode_linear: out must have input's dtype, got float16"):
            torch.ops.jit_kernel.decode_linear_out(_e(M, N, dtype=FP16), _e(M, K), _e(N, K), None, None)
        with pytest.raises(ValueError, match=r"decode_linear: weight must be on input's device"):
            torch.ops.jit_kernel.decode_linear(_e(M, K), _e(N, K, device="cpu"), None, None)


@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16])
def test_shapes_and_dtypes(dtype: torch.dtype, rows: int) -> None:
    with fake_cuda():
        y = decode_linear(_e(rows, K, dtype=dtype), _e(N, K, dtype=dtype), _e(N, dtype=dtype))
        assert y.shape == (rows, N) and y.dtype == dtype and y.device.type == "cuda"


def test_output_forms() -> None:
    with fake_cuda():
        w = _e(N, K)
        assert decode_linear(_e(2, 3, K), w).shape == (2, 3, N)
        assert decode_linear(_e(K), w).shape == (N,)
        out = _e(2, 3, N)
        assert decode_linear(_e(2, 3, K), w, out=out) is out
        wide = _strided(M, N, N + 24)  # rows of a wider buffer
        assert decode_linear(_e(M, K), w, out=wide) is wide
        assert decode_linear(_strided(M, K, K + 64), w, enable_pdl=False).shape == (M, N)
        assert decode_linear(_e(M, K), w, torch.empty_strided((N,), (2,), dtype=BF16, device="cuda")).shape == (M, N)
        with pytest.raises(ValueError, match=r"decode_linear: out must have shape \(2, 3, 1000\), got \(6, 1000\)"):
            decode_linear(_e(2, 3, K), w, out=_e(6, N))
        # 17 rows: torch.nn.functional.linear's result
        assert decode_linear(_e(17, K), w).shape == (17, N)


def test_registered_ops_declare_what_they_write() -> None:
    functional = torch.ops.jit_kernel.decode_linear.default._schema
    with_out = torch.ops.jit_kernel.decode_linear_out.default._schema
    assert [a.name for a in functional.arguments] == ["input", "weight", "bias", "enable_pdl"]
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in functional.arguments)
    assert [a.name for a in with_out.arguments if a.alias_info and a.alias_info.is_write] == ["out"]


def test_registered_fakes_run_the_launchers_checks() -> None:
    with fake_cuda():
        y = torch.ops.jit_kernel.decode_linear(_e(3, 5, K, dtype=FP16), _e(N, K, dtype=FP16), None)
        assert y.shape == (3, 5, N) and y.dtype == FP16
        out = _e(M, N)
        torch.ops.jit_kernel.decode_linear_out(out, _e(M, K), _e(N, K), _e(N))
        with pytest.raises(ValueError, match=r"decode_linear: bias must have out_features \(1000\) elements"):
            torch.ops.jit_kernel.decode_linear(_e(M, K), _e(N, K), _e(N - 1))


def test_torch_compile_traces_without_graph_break(reset_dynamo: None) -> None:
    """fullgraph tracing on fake CUDA tensors: every call is the registered op (its fake runs the
    launcher's checks, or gives F.linear's result where the launcher declines), which makes the
    choice when it runs."""
    from torch._dynamo.testing import EagerAndRecordGraphs
    from torch._subclasses.fake_tensor import FakeTensorMode

    backend = EagerAndRecordGraphs()

    def step(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, many: torch.Tensor, out: torch.Tensor):
        y = decode_linear(x, w, b)
        decode_linear(x, w, out=out)
        z = decode_linear(many, w)  # 32 rows: F.linear
        h = jit_kernel.decode_linear(x.view(2, 2, K), w)
        return y * 2, z, h, out + 1

    with FakeTensorMode(allow_non_fake_inputs=True):
        y, z, h, o = torch.compile(step, backend=backend, fullgraph=True)(
            _e(M, K), _e(N, K), _e(N), _e(32, K), _e(M, N)
        )
    assert (y.shape, z.shape, h.shape, o.shape) == ((M, N), (32, N), (2, 2, N), (M, N))
    [graph] = backend.graphs
    assert graph.code.count("torch.ops.jit_kernel.decode_linear(") == 3
    assert graph.code.count("torch.ops.jit_kernel.decode_linear_out(") == 1
    assert graph.code.count("torch._C._nn.linear(") == 0


def test_torch_compile_dynamic_rows_do_not_recompile_at_the_row_bound(reset_dynamo: None) -> None:
    """With the row count dynamic, one graph serves 4 and 40 rows: the choice is made when the op
    runs, so tracing guards on no row bound."""
    from torch._dynamo.testing import CompileCounter
    from torch._subclasses.fake_tensor import FakeTensorMode

    counter = CompileCounter()
    step = torch.compile(lambda x, w: decode_linear(x, w) + 1, backend=counter, dynamic=True, fullgraph=True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        w = _e(N, K)
        assert step(_e(4, K), w).shape == (4, N)
        assert step(_e(40, K), w).shape == (40, N)
    assert counter.frame_count == 1


def test_public_names() -> None:
    assert jit_kernel.decode_linear is decode_linear
    assert "decode_linear" in jit_kernel.__all__


# ---------------------------------------------------------------------------------------------
# decode_linear_fp8: the spec and builds, the rule, the reference path (CPU tensors, for real), the
# launcher's checks on fake CUDA tensors, every scale layout the producers emit, the fakes

E4M3 = torch.float8_e4m3fn


def _blocks(size: int) -> int:
    return -(-size // FP8_BLOCK)


def test_fp8_family_spec() -> None:
    spec = families.DECODE_LINEAR_FP8
    assert spec in families.ALL_FAMILIES
    assert spec.sources == ("gemm/decode_linear_fp8.cuh",)
    assert spec.params == ("rows", "out_dtype")
    assert spec.prebuilt == ((8, "bf16_t"), (16, "bf16_t"))


@pytest.mark.parametrize("config", families.DECODE_LINEAR_FP8.prebuilt, ids=lambda c: "-".join(map(str, c)))
def test_fp8_prebuilt_configs_compile_for_sm90a_without_a_gpu(config: tuple[int, str]) -> None:
    assert_builds_for_arch(families.DECODE_LINEAR_FP8, config, "9.0a")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["8.9", "8.0"])
def test_fp8_compiles_for_sm89_and_sm80(arch: str) -> None:
    """sm_89 has the e4m3 mma (no clusters: the launcher never splits there); on sm_80 the kernel
    compiles to a trap the launcher never reaches (it refuses devices below sm_89)."""
    assert_builds_for_arch(families.DECODE_LINEAR_FP8, (16, "fp16_t"), arch)


@pytest.mark.slow
@pytest.mark.parametrize("config", [(8, "bf16_t"), (16, "bf16_t"), (8, "fp16_t"), (16, "fp16_t")])
def test_fp8_kernel_does_not_spill_on_sm90a(config: tuple[int, str], tmp_path: Path) -> None:
    import tvm_ffi.libinfo

    from jit_kernel.engine import toolchain
    from jit_kernel.engine.unit import TranslationUnit

    unit = TranslationUnit.for_config(families.DECODE_LINEAR_FP8, config)
    source = tmp_path / "unit.cu"
    source.write_text(unit.text())
    includes = [f"-I{tvm_ffi.libinfo.find_include_path()}", f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}"]
    command = [str(toolchain.nvcc_path()), "-cubin", "-arch=sm_90a", "-Xptxas", "-v", *unit.compile_args(), *includes]
    result = subprocess.run([*command, str(source), "-o", str(tmp_path / "unit.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    report = result.stderr
    properties = re.findall(
        r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
        report,
    )
    kernels = [p for p in properties if "decode_linear_fp8_kernel" in p[0]]
    assert len(kernels) == 1, report[-4000:]
    assert kernels[0][1:] == ("0", "0", "0"), kernels
    registers = [int(r) for r in re.findall(r"Used (\d+) registers", report)]
    assert registers and max(registers) <= 128, report[-4000:]


def _q(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=E4M3)


def _s(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, dtype=FP32)


FP8_SERVES: list[tuple[str, Callable[[], tuple[object, ...]], bool]] = [
    ("1 row", lambda: (_q(1, 256), _s(1, 2), _q(300, 256), _s(3, 2)), True),
    ("16 rows, K 7168", lambda: (_q(16, 7168), _s(16, 56), _q(128, 7168), _s(1, 56)), True),
    ("column-major scales", lambda: (_q(4, 256), _s(2, 4).t(), _q(300, 256), _s(3, 2)), True),
    ("TMA-padded column-major scales", lambda: (_q(3, 256), _s(2, 4).t()[:3], _q(300, 256), _s(3, 2)), True),
    ("weight scales transposed view", lambda: (_q(4, 256), _s(4, 2), _q(300, 256), _s(2, 3).t()), True),
    ("K 144 (a short last block)", lambda: (_q(2, 144), _s(2, 2), _q(7, 144), _s(1, 2)), True),
    ("3-D input", lambda: (_q(2, 8, 256), _s(2, 8, 2), _q(300, 256), _s(3, 2)), True),
    ("1-D input", lambda: (_q(256), _s(2), _q(300, 256), _s(3, 2)), True),
    ("fp16 out, fp32 bias", lambda: (_q(2, 256), _s(2, 2), _q(300, 256), _s(3, 2), FP16, _s(300)), True),
    ("bf16 out, bf16 bias", lambda: (_q(2, 256), _s(2, 2), _q(300, 256), _s(3, 2), BF16, _t(300)), True),
    ("rows at a stride of 16", lambda: (_q(4, 272)[:, :256], _s(4, 2), _q(300, 256), _s(3, 2)), True),
    ("17 rows", lambda: (_q(17, 256), _s(17, 2), _q(300, 256), _s(3, 2)), False),
    ("no rows", lambda: (_q(0, 256), _s(0, 2), _q(300, 256), _s(3, 2)), False),
    ("K 24", lambda: (_q(2, 24), _s(2, 1), _q(8, 24), _s(1, 1)), False),
    ("fp32 out", lambda: (_q(2, 256), _s(2, 2), _q(300, 256), _s(3, 2), FP32), False),
    ("bias fp16 with bf16 out", lambda: (_q(2, 256), _s(2, 2), _q(300, 256), _s(3, 2), BF16, _t(300, dtype=FP16)),
     False),
    ("int32 (packed UE8M0) input scales", lambda: (_q(2, 256), torch.empty(2, 1, dtype=torch.int32), _q(300, 256),
                                                   _s(3, 2)), False),
    ("e8m0 weight scales", lambda: (_q(2, 256), _s(2, 2), _q(300, 256),
                                    torch.empty(3, 2, dtype=torch.float8_e8m0fnu)), False),
    ("bf16 input", lambda: (_t(2, 256), _s(2, 2), _q(300, 256), _s(3, 2)), False),
    ("weight scales per tensor", lambda: (_q(2, 256), _s(2, 2), _q(300, 256), _s(1, 1)), False),
    ("input scales per token", lambda: (_q(2, 256), _s(2, 1), _q(300, 256), _s(3, 2)), False),
    ("weight transposed", lambda: (_q(2, 256), _s(2, 2), _q(256, 300).t(), _s(3, 2)), False),
    ("rows at a stride of 264", lambda: (_q(4, 264)[:, :256], _s(4, 2), _q(300, 256), _s(3, 2)), False),
    ("input at an odd offset", lambda: (_q(2 * 256 + 8)[8:].view(2, 256), _s(2, 2), _q(300, 256), _s(3, 2)), False),
    ("input a list", lambda: ([0.0], _s(2, 2), _q(300, 256), _s(3, 2)), False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "make", "served"), FP8_SERVES, ids=[case for case, _, _ in FP8_SERVES])
def test_fp8_rule(case: str, make: Callable[[], tuple[object, ...]], served: bool) -> None:
    args = make()
    with fake_cuda():
        cuda = tuple(
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda")
            if isinstance(a, torch.Tensor) and a.storage_offset() == 0
            else a
            for a in args
        )
    assert decode_linear_fp8_serves(*args) is False  # CPU tensors: the reference
    if all(not isinstance(a, torch.Tensor) or a.storage_offset() == 0 for a in args):
        assert decode_linear_fp8_serves(*cuda) is served
    else:  # an offset view: the rule reads the offset (fake tensors cannot be built at one without a GPU)
        assert not served


def _fp8_inputs(
    m: int, n: int, k: int, seed: int, lead: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = lead or (m,)
    q = torch.randn(*rows, k, generator=g).to(E4M3)
    xs = torch.rand(*rows, _blocks(k), generator=g) + 0.5
    w = torch.randn(n, k, generator=g).to(E4M3)
    ws = (torch.rand(_blocks(n), _blocks(k), generator=g) + 0.5) / k**0.5
    return q, xs, w, ws


def _fp8_float64(q: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, b: torch.Tensor | None):
    """The definition, block by block in float64."""
    k, n = q.shape[-1], w.shape[0]
    x2, s2 = q.reshape(-1, k).double(), xs.reshape(-1, xs.shape[-1]).double()
    out = torch.zeros(x2.shape[0], n, dtype=torch.float64)
    wscale = ws.double()[torch.arange(n) // FP8_BLOCK]
    for blk in range(_blocks(k)):
        cols = slice(blk * FP8_BLOCK, min(k, (blk + 1) * FP8_BLOCK))
        out += (x2[:, cols] @ w[:, cols].double().T) * s2[:, blk : blk + 1] * wscale[:, blk]
    if b is not None:
        out += b.double()
    return out.reshape(*q.shape[:-1], n)


@pytest.mark.parametrize(
    ("m", "n", "k", "out_dtype", "bias"),
    [(4, 300, 1024, BF16, None), (17, 129, 144, FP16, FP32), (1, 7, 16, BF16, BF16), (40, 256, 7168, FP32, None)],
)
def test_fp8_reference_path_matches_the_definition(
    m: int, n: int, k: int, out_dtype: torch.dtype, bias: torch.dtype | None
) -> None:
    """The path every call the kernel does not serve takes (CPU tensors here): float32 dequantised
    operands and F.linear, within the output's rounding of the float64 definition."""
    q, xs, w, ws = _fp8_inputs(m, n, k, m + n + k)
    b = torch.randn(n).to(bias) if bias is not None else None
    got = decode_linear_fp8(q, xs, w, ws, out_dtype, b)
    assert got.dtype == out_dtype and got.shape == (m, n)
    eps = {BF16: 2.0**-8, FP16: 2.0**-11, FP32: 2.0**-20}[out_dtype]
    torch.testing.assert_close(got.double(), _fp8_float64(q, xs, w, ws, b), rtol=eps, atol=eps * 4)
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    assert decode_linear_fp8(q, xs, w, ws, out_dtype, b, out=out) is out
    assert torch.equal(out, got)


def test_fp8_reference_takes_every_scale_layout() -> None:
    q, xs, w, ws = _fp8_inputs(5, 200, 512, 3)
    want = decode_linear_fp8(q, xs, w, ws)
    column = torch.empty(4, 8).t()[:5].copy_(xs)  # TMA-padded column-major
    assert torch.equal(decode_linear_fp8(q, column, w, ws), want)
    assert torch.equal(decode_linear_fp8(q, xs, w, ws.t().contiguous().t()), want)
    q3, xs3 = q[:4].view(2, 2, 512), xs[:4].view(2, 2, 4)
    assert torch.equal(decode_linear_fp8(q3, xs3, w, ws), want[:4].view(2, 2, 200))


def test_fp8_reference_serves_transformers_fp8linear_parameters() -> None:
    """FP8Linear's own tensors (weight [N, K] e4m3, weight_scale_inv [ceil(N / 128), ceil(K / 128)]
    float32, block_size (128, 128)) are this op's weight and weight_scale, as they are."""
    finegrained = pytest.importorskip("transformers.integrations.finegrained_fp8")
    layer = finegrained.FP8Linear(384, 300, block_size=(128, 128))
    assert layer.weight.dtype == E4M3 and layer.weight_scale_inv.dtype == FP32
    assert tuple(layer.weight_scale_inv.shape) == (_blocks(300), _blocks(384))
    with torch.no_grad():
        layer.weight.copy_(torch.randn(300, 384).to(E4M3))
        layer.weight_scale_inv.copy_(torch.rand(3, 3) + 0.5)
    q, xs = torch.randn(2, 384).to(E4M3), torch.rand(2, 3) + 0.5
    got = decode_linear_fp8(q, xs, layer.weight, layer.weight_scale_inv)
    torch.testing.assert_close(
        got.double(), _fp8_float64(q, xs, layer.weight, layer.weight_scale_inv, None), rtol=2.0**-8, atol=2.0**-6
    )


FP8_REFERENCE_BAD = [
    (lambda: (_q(2, 256), torch.zeros(2, 1, dtype=torch.int32), _q(8, 256), _s(1, 2)), TypeError,
     r"^decode_linear_fp8: input_scale must be float32 .*got int32$"),
    (lambda: (_q(2, 256), _s(2, 2), _q(8, 256), torch.ones(1, 2, dtype=torch.float8_e8m0fnu)), TypeError,
     r"^decode_linear_fp8: weight_scale must be float32 .*got float8_e8m0fnu$"),
    (lambda: (_t(2, 256), _s(2, 2), _q(8, 256), _s(1, 2)), TypeError,
     r"^decode_linear_fp8: input_q must be float8_e4m3fn, got bfloat16$"),
    (lambda: (_q(2, 256), _s(2, 2), _q(8, 256), _s(2, 2)), ValueError,
     r"^decode_linear_fp8: weight_scale must be \[ceil\(N / 128\), ceil\(K / 128\)\] = \(1, 2\), got \(2, 2\)$"),
    (lambda: (_q(2, 256), _s(2, 1), _q(8, 256), _s(1, 2)), ValueError,
     r"^decode_linear_fp8: input_scale must be \[\.\.\., ceil\(K / 128\)\] = \(2, 2\), got \(2, 1\)$"),
    (lambda: (_q(2, 128), _s(2, 1), _q(8, 256), _s(1, 2)), ValueError,
     r"^decode_linear_fp8: input_q must be \[\.\.\., 256\]"),
    (lambda: (_q(2, 256), [1.0], _q(8, 256), _s(1, 2)), TypeError,
     r"^decode_linear_fp8: input_scale must be a torch\.Tensor, got list$"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "error", "match"), FP8_REFERENCE_BAD)
def test_fp8_reference_names_the_bad_argument(make: Callable[[], tuple], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        decode_linear_fp8(*make())


def test_fp8_reference_checks_bias_and_out() -> None:
    q, xs, w, ws = _fp8_inputs(20, 64, 256, 5)
    with pytest.raises(ValueError, match=r"^decode_linear_fp8: bias must be \[64\], got shape \(65,\)$"):
        decode_linear_fp8(q, xs, w, ws, bias=torch.zeros(65))
    with pytest.raises(ValueError, match=r"decode_linear_fp8: out must have shape \(20, 64\) and dtype torch.bfloat16"):
        decode_linear_fp8(q, xs, w, ws, out=torch.empty(20, 64))
    with pytest.raises(TypeError, match=r"^decode_linear_fp8: out must be a torch\.Tensor, got list$"):
        decode_linear_fp8(q, xs, w, ws, out=[0.0])


# The kernel path on fake CUDA tensors


def _fe(*shape: int, dtype: torch.dtype = E4M3, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=device)


def _fp8_args(m: int = M, n: int = N, k: int = K) -> dict[str, object]:
    return {
        "input_q": _fe(m, k),
        "input_scale": _fe(m, _blocks(k), dtype=FP32),
        "weight": _fe(n, k),
        "weight_scale": _fe(_blocks(n), _blocks(k), dtype=FP32),
    }


@pytest.mark.parametrize("out_dtype", [BF16, FP16])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 16])
def test_fp8_shapes_and_dtypes(out_dtype: torch.dtype, rows: int) -> None:
    with fake_cuda():
        y = decode_linear_fp8(**_fp8_args(m=rows), out_dtype=out_dtype, bias=_fe(N, dtype=FP32))
        assert y.shape == (rows, N) and y.dtype == out_dtype and y.device.type == "cuda"


@pytest.mark.parametrize("column_major", [False, True], ids=["row-major", "column-major"])
@pytest.mark.parametrize("lead", [(4,), (2, 3)], ids=["2-D", "3-D"])
def test_fp8_takes_the_scales_per_token_group_quant_fp8_returns(column_major: bool, lead: tuple[int, ...]) -> None:
    with fake_cuda():
        h = _fe(*lead, K, dtype=BF16)
        q, s = jit_kernel.per_token_group_quant_fp8(h, 128, column_major_scales=column_major)
        w, ws = _fe(N, K), _fe(_blocks(N), _blocks(K), dtype=FP32)
        assert decode_linear_fp8_serves(q, s, w, ws)
        assert decode_linear_fp8(q, s, w, ws).shape == (*lead, N)


@pytest.mark.parametrize("column_major", [False, True], ids=["row-major", "column-major"])
def test_fp8_takes_the_scales_the_fused_norm_quant_returns(column_major: bool) -> None:
    with fake_cuda():
        x, residual, weight = _fe(M, K, dtype=BF16), _fe(M, K, dtype=BF16), _fe(K, dtype=BF16)
        q, s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
            x, residual, weight, 128, column_major_scales=column_major
        )
        w, ws = _fe(N, K), _fe(_blocks(N), _blocks(K), dtype=FP32)
        assert decode_linear_fp8_serves(q, s, w, ws)
        assert decode_linear_fp8(q, s, w, ws).shape == (M, N)
        # A TMA-padded column-major buffer (tokens padded to 4), as FlashInfer's block quant takes it.
        padded = torch.empty_strided((M, _blocks(K)), (1, 8), dtype=FP32, device="cuda")
        assert decode_linear_fp8_serves(q, padded, w, ws)
        assert decode_linear_fp8(q, padded, w, ws).shape == (M, N)


def test_fp8_output_forms() -> None:
    with fake_cuda():
        args = _fp8_args()
        out = _fe(M, N, dtype=BF16)
        assert decode_linear_fp8(**args, out=out) is out
        wide = torch.empty_strided((M, N), (N + 24, 1), dtype=BF16, device="cuda")
        assert decode_linear_fp8(**args, out=wide, enable_pdl=False) is wide
        assert decode_linear_fp8(_fe(K), _fe(_blocks(K), dtype=FP32), args["weight"], args["weight_scale"]).shape == (
            N,
        )
        out3 = _fe(2, 2, N, dtype=FP16)
        q3, s3 = _fe(2, 2, K), _fe(2, 2, _blocks(K), dtype=FP32)
        assert decode_linear_fp8(q3, s3, args["weight"], args["weight_scale"], FP16, out=out3) is out3
        with pytest.raises(ValueError, match=r"decode_linear_fp8: out must have shape \(2, 2, 1000\), got \(4, 1000\)"):
            decode_linear_fp8(q3, s3, args["weight"], args["weight_scale"], out=_fe(4, N, dtype=BF16))


FP8_KERNEL_BAD = [
    ({"input_q": lambda: _fe(17, K)}, ValueError, r"(?s)'input_scale'.*Size mismatch for shape#0\('rows'\)"),
    ({"weight_scale": lambda: _fe(_blocks(N) + 1, _blocks(K), dtype=FP32)}, ValueError,
     r"(?s)'weight_scale'.*Size mismatch for shape#0\('n_blocks'\): expected 8 but got 9"),
    ({"weight_scale": lambda: _fe(_blocks(N), _blocks(K), dtype=BF16)}, TypeError,
     r"(?s)'weight_scale'.*Dtype mismatch: expected float32 but got bfloat16"),
    ({"input_scale": lambda: _fe(M, 1, dtype=FP32)}, ValueError,
     r"(?s)'input_scale'.*Size mismatch for shape#1\('k_blocks'\): expected 32 but got 1"),
    ({"input_scale": lambda: _fe(M, _blocks(K), dtype=torch.int32)}, TypeError,
     r"(?s)'input_scale'.*Dtype mismatch: expected float32 but got int32"),
    ({"input_scale": lambda: _fe(M, _blocks(K), dtype=FP32, device="cpu")}, ValueError, r"(?s)'input_scale'.*Device"),
    ({"weight": lambda: _fe(K, N).t()}, ValueError, r"(?s)'weight'.*not contiguous"),
    ({"weight": lambda: _fe(N, K, dtype=BF16)}, TypeError, r"(?s)'weight'.*Dtype mismatch: expected float8_e4m3fn"),
    ({"input_q": lambda: _fe(M, K, dtype=BF16)}, TypeError, r"(?s)'input_q'.*Dtype mismatch: expected float8_e4m3fn"),
    ({"input_q": lambda: torch.empty_strided((M, K), (K + 8, 1), dtype=E4M3, device="cuda")}, ValueError,
     r"decode_linear_fp8: input_q's rows must start on 16-byte boundaries"),
    ({"bias": lambda: _fe(N, dtype=FP16)}, TypeError,
     r"(?s)'bias'.*Dtype mismatch: expected one of \[bfloat16, float32\]"),
    ({"bias": lambda: _fe(N + 1, dtype=FP32)}, ValueError, r"(?s)'bias'.*Size mismatch for shape#0\('out_features'\)"),
    ({"out": lambda: _fe(M, N, dtype=FP16)}, TypeError,
     r"(?s)'out'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"out_dtype": FP32}, TypeError, r"^decode_linear_fp8: out_dtype must be float16 or bfloat16, got float32$"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), FP8_KERNEL_BAD)
def test_fp8_kernel_alone_names_the_bad_argument(
    overrides: dict[str, object], error: type[Exception], match: str
) -> None:
    """``torch.ops.jit_kernel.decode_linear_fp8`` is the kernel alone: what it does not take, it
    refuses, naming the argument (its fake as well)."""
    with fake_cuda():
        args = _fp8_args() | {"out_dtype": BF16, "bias": None} | {k: _value(v) for k, v in overrides.items()}
        out = args.pop("out", None)
        with pytest.raises(error, match=match):
            if out is None:
                torch.ops.jit_kernel.decode_linear_fp8(**args)
            else:
                torch.ops.jit_kernel.decode_linear_fp8_out(out, **args)


def test_fp8_enable_pdl_must_be_a_bool() -> None:
    message = r"^decode_linear_fp8: enable_pdl must be a bool or None, got str$"
    with fake_cuda(), pytest.raises(TypeError, match=message):
        decode_linear_fp8(**_fp8_args(), enable_pdl="yes")


def test_fp8_kernel_alone_refuses_k_not_a_multiple_of_16() -> None:
    with fake_cuda():
        args = _fp8_args(k=24) | {"out_dtype": BF16, "bias": None}
        with pytest.raises(ValueError, match=r"must be a positive multiple of 16, got 24"):
            torch.ops.jit_kernel.decode_linear_fp8(**args)


def test_fp8_registered_ops_declare_what_they_write() -> None:
    functional = torch.ops.jit_kernel.decode_linear_fp8.default._schema
    with_out = torch.ops.jit_kernel.decode_linear_fp8_out.default._schema
    assert [a.name for a in functional.arguments] == [
        "input_q", "input_scale", "weight", "weight_scale", "out_dtype", "bias", "enable_pdl"
    ]  # fmt: skip
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in functional.arguments)
    assert [a.name for a in with_out.arguments if a.alias_info and a.alias_info.is_write] == ["out"]


def test_fp8_torch_compile_traces_without_graph_break(reset_dynamo: None) -> None:
    """fullgraph on fake CUDA tensors: served calls are the registered op, 32 rows the reference."""
    from torch._dynamo.testing import EagerAndRecordGraphs
    from torch._subclasses.fake_tensor import FakeTensorMode

    backend = EagerAndRecordGraphs()

    def step(q, s, w, ws, b, many_q, many_s, cpu_w, cpu_ws, out):
        y = decode_linear_fp8(q, s, w, ws, torch.bfloat16, b)
        decode_linear_fp8(q, s, w, ws, out=out)
        z = decode_linear_fp8(many_q, many_s, cpu_w, cpu_ws)  # 32 rows (CPU here): the reference
        return y * 2, z, out + 1

    with FakeTensorMode(allow_non_fake_inputs=True):
        args = _fp8_args()
        y, z, o = torch.compile(step, backend=backend, fullgraph=True)(
            args["input_q"], args["input_scale"], args["weight"], args["weight_scale"], _fe(N, dtype=FP32),
            _fe(32, K, device="cpu"), _fe(32, _blocks(K), dtype=FP32, device="cpu"), _fe(N, K, device="cpu"),
            _fe(_blocks(N), _blocks(K), dtype=FP32, device="cpu"), _fe(M, N, dtype=BF16),
        )  # fmt: skip
    assert (y.shape, z.shape, o.shape) == ((M, N), (32, N), (M, N))
    [graph] = backend.graphs
    assert graph.code.count("torch.ops.jit_kernel.decode_linear_fp8(") == 1
    assert graph.code.count("torch.ops.jit_kernel.decode_linear_fp8_out(") == 1
    assert graph.code.count("torch._C._nn.linear(") == 1


def test_fp8_public_names() -> None:
    assert jit_kernel.decode_linear_fp8 is decode_linear_fp8
    assert "decode_linear_fp8" in jit_kernel.__all__


def test_fp8_benchmark_cases_call_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_decode_linear_fp8's jit case: one call per weight copy, on the input and its
    column-major scales, each with that copy's weight scales (CPU tensors: the reference runs)."""
    bench = pytest.importorskip("jit_kernel.benchmark.bench_decode_linear_fp8")
    monkeypatch.setattr(bench, "MAX_COPIES", 3)
    bench.weights.cache_clear()
    calls = []
    monkeypatch.setattr(jit_kernel, "decode_linear_fp8", lambda *args: calls.append(args) or decode_linear_fp8(*args))
    outputs = bench.linear_case("jit", 300, 256, 4, device="cpu")()
    bench.weights.cache_clear()
    assert len(outputs) == len(calls) == 3 and all(o.shape == (4, 300) and o.dtype == BF16 for o in outputs)
    q, scales, w, ws = calls[0]
    assert q.dtype == E4M3 and scales.shape == (4, 2) and scales.stride() == (1, 4)
    assert w.shape == (300, 256) and ws.shape == (3, 2)
    assert bench.weight_bytes(300, 256) == 300 * 256 + 4 * 3 * 2


def test_fp8_fallback_takes_scaled_mm_where_cublas_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback's choice: torch._scaled_mm on sm_90 with a CUDA 12.9+ torch, bf16 out, no bias,
    K a multiple of 512 and N of 16; the float32 reference otherwise."""
    import types

    major = [9]
    monkeypatch.setattr(gemm, "_CUDA_VERSION", (12, 9))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(major=major[0]))
    with fake_cuda():
        q, w = _fe(32, 512), _fe(304, 512)
        assert gemm._scaled_mm_applies(q, w, BF16, None)
        assert not gemm._scaled_mm_applies(_fe(32, 256), _fe(304, 256), BF16, None)  # K / 128 not a multiple of 4
        assert not gemm._scaled_mm_applies(q, w, FP16, None)
        assert not gemm._scaled_mm_applies(q, w, BF16, _fe(304, dtype=BF16))
        assert not gemm._scaled_mm_applies(_fe(32, 144), _fe(304, 144), BF16, None)
        assert not gemm._scaled_mm_applies(q, _fe(300, 512), BF16, None)
        assert not gemm._scaled_mm_applies(q, _fe(512, 304).t(), BF16, None)
        major[0] = 10
        assert not gemm._scaled_mm_applies(q, w, BF16, None)
        major[0] = 9
        monkeypatch.setattr(gemm, "_CUDA_VERSION", (12, 8))
        assert not gemm._scaled_mm_applies(q, w, BF16, None)
    assert not gemm._scaled_mm_applies(_q(32, 256), _q(304, 256), BF16, None)  # CPU
