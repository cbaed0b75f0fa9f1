"""TensorMatcher, RuntimeCheck and Panic from Python: exact messages, call sites, successes.

All on CPU tensors. `tests/cpp/matcher_cases.cc` holds the C++ side; it is built once with g++
(`cpp_files`) and, where nvcc exists, once more with nvcc (`cuda_files`), because kernels check
their tensors in code nvcc compiles, and nvcc reports call sites slightly differently (the first
line of a multi-line statement).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

import jit_kernel

CASES = Path(__file__).resolve().parent / "cpp" / "matcher_cases.cc"
SOURCE = CASES.read_text()
FILE = CASES.name


def _function_names() -> list[str]:
    block = re.search(r"// Functions:\n((?://.*\n)+?)//\n", SOURCE)
    assert block, "matcher_cases.cc lost its '// Functions:' list"
    return [name.strip() for name in block.group(1).replace("//", " ").split(",") if name.strip()]


FUNCTIONS = _function_names()


def _marker_line(tag: str, case: str) -> int:
    lines = [i for i, text in enumerate(SOURCE.splitlines(), 1) if re.search(rf"@{tag}:{case}\b", text)]
    assert len(lines) == 1, f"expected one @{tag}:{case} marker in {FILE}, found {len(lines)}"
    return lines[0]


def _have_nvcc() -> bool:
    try:
        from jit_kernel.engine import toolchain

        return toolchain.nvcc_path().is_file()
    except Exception:
        return shutil.which("nvcc") is not None


@pytest.fixture(scope="module", params=["g++", "nvcc"])
def build(request: pytest.FixtureRequest):
    """(compiler, module): the cases built as a C++ or as a CUDA translation unit."""
    wrappers = [(name, f"matcher_cases::{name}") for name in FUNCTIONS]
    if request.param == "g++":
        return "g++", jit_kernel.load_jit("matcher_cases", cpp_files=[str(CASES)], cpp_wrappers=wrappers)
    if not _have_nvcc():
        pytest.skip("nvcc not found")
    with pytest.MonkeyPatch.context() as patch:
        if not torch.cuda.is_available() and not os.environ.get("JIT_KERNEL_CUDA_ARCH"):
            patch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")  # compile-only target; nothing runs on a GPU
        module = jit_kernel.load_jit("matcher_cases", "nvcc", cuda_files=[str(CASES)], cuda_wrappers=wrappers)
    return "nvcc", module


@pytest.fixture
def mod(build):
    return build[1]


def line(build, case: str) -> int:
    """The line the message must name: nvcc names the first line of a multi-line statement."""
    compiler, _ = build
    if compiler == "nvcc" and re.search(rf"@chain:{case}\b", SOURCE):
        return _marker_line("chain", case)
    return _marker_line("line", case)


X = "Tensor<4, 16>[strides=<16, 1>, dtype=float32, device=cpu]"


def match_error(build, case: str, cause: str, tensor: str = X, name: str | None = None) -> str:
    named = f"'{name}': " if name else ""
    return f"Tensor match failed for {named}{tensor} at {FILE}:{line(build, case)}\n- Root cause: {cause}"


def expected_kind(message: str) -> type[Exception]:
    """The Python type host::ffi_export gives a failure: a dtype mismatch is a TypeError, any other
    check a ValueError, and a panic (not the caller's fault) a RuntimeError."""
    if message.startswith("Panic at"):
        return RuntimeError
    return TypeError if "Dtype mismatch" in message else ValueError


def raises(fn, *args) -> str:
    with pytest.raises(Exception) as info:
        fn(*args)
    message = str(info.value)
    assert type(info.value) is expected_kind(message), (type(info.value), message)
    return message


# ---- failure kinds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "tensor", "described", "cause"),
    [
        ("size_mismatch", lambda: torch.zeros(4, 16), X,
         "Size mismatch for shape#1('hidden_size'): expected 8 but got 16"),
        ("size_literal_mismatch", lambda: torch.zeros(4, 16), X,
         "Size mismatch for shape#1: expected 8 but got 16"),
        ("size_options", lambda: torch.zeros(4, 16), X,
         "Size mismatch for shape#1('head_dim'): expected one of [64, 128] but got 16"),
        ("rank_mismatch", lambda: torch.zeros(2, 3, 4),
         "Tensor<2, 3, 4>[strides=<12, 4, 1>, dtype=float32, device=cpu]",
         "Rank mismatch: expected 2 but got 3"),
        ("stride_mismatch", lambda: torch.zeros(4, 64)[:, :16],
         "Tensor<4, 16>[strides=<64, 1>, dtype=float32, device=cpu]",
         "Stride mismatch for stride#0('kv_stride'): expected 32 but got 64"),
        ("stride_literal_mismatch", lambda: torch.zeros(16, 4).T,
         "Tensor<4, 16>[strides=<1, 4>, dtype=float32, device=cpu]",
         "Stride mismatch for stride#1: expected 1 but got 4"),
        ("not_contiguous", lambda: torch.zeros(16, 4).T,
         "Tensor<4, 16>[strides=<1, 4>, dtype=float32, device=cpu]",
         "Tensor is not contiguous: expected strides <16, 1> but got <1, 4>"),
        ("dtype_bound", lambda: torch.zeros(4, 16), X,
         "Dtype mismatch: expected float16 but got float32"),
        ("dtype_symbol_options", lambda: torch.zeros(4, 16), X,
         "Dtype mismatch: expected one of [float16, bfloat16] but got float32"),
        ("dtype_options", lambda: torch.zeros(4, 16), X,
         "Dtype mismatch: expected one of [int32, int64] but got float32"),
        ("device_type", lambda: torch.zeros(4, 16), X,
         "Device mismatch: expected cuda but got cpu"),
        ("device_options", lambda: torch.zeros(4, 16), X,
         "Device mismatch: expected one of [cuda, cuda_host] but got cpu"),
        ("device_bound", lambda: torch.zeros(4, 16), X,
         "Device mismatch: expected cuda:0 but got cpu"),
        ("device_bound_host", lambda: torch.zeros(4, 16), X,
         "Device mismatch: expected cuda_host but got cpu"),
    ],
)  # fmt: skip
def test_failure_message(build, mod, case, tensor, described, cause):
    assert raises(getattr(mod, case), tensor()) == match_error(build, case, cause, described)


def test_named_tensor(build, mod):
    message = raises(mod.named_tensor, torch.zeros(4, 16))
    assert message == match_error(
        build, "named_tensor", "Size mismatch for shape#1('hidden_size'): expected 8 but got 16", name="k_cache"
    )


ROWS = "Tensor<4, 16>[strides=<64, 1>, dtype=float32, device=cpu]"  # rows of a wider buffer


@pytest.mark.parametrize(
    ("case", "tensor", "name", "described", "cause"),
    [
        ("cuda_rows_stride", lambda: torch.zeros(16, 4).T, "input",
         "Tensor<4, 16>[strides=<1, 4>, dtype=float32, device=cpu]",
         "Stride mismatch for stride#1: expected 1 but got 4"),
        ("cuda_rows_dtype", lambda: torch.zeros(4, 64, dtype=torch.float16)[:, :16], "input",
         "Tensor<4, 16>[strides=<64, 1>, dtype=float16, device=cpu]",
         "Dtype mismatch: expected one of [float32, float64] but got float16"),
        ("cuda_rows_device", lambda: torch.zeros(4, 64)[:, :16], "out", ROWS,
         "Device mismatch: expected cuda but got cpu"),
        ("cuda_rows_heads", lambda: torch.zeros(4, 3, 16)[:, :, :8], "q",
         "Tensor<4, 3, 8>[strides=<48, 16, 1>, dtype=float32, device=cpu]",
         "Device mismatch: expected cuda but got cpu"),
        ("cuda_rows_heads", lambda: torch.zeros(4, 24), "q",
         "Tensor<4, 24>[strides=<24, 1>, dtype=float32, device=cpu]",
         "Rank mismatch: expected 3 but got 2"),
    ],
)  # fmt: skip
def test_cuda_rows_names_the_argument(build, mod, case, tensor, name, described, cause):
    """`TensorMatcher::cuda_rows`: rows at any stride pass the layout check (the CPU tensors then fail
    on the device), a non-unit last stride, another dtype or rank fail, and every message names the
    argument and the caller's line."""
    assert raises(getattr(mod, case), tensor()) == match_error(build, case, cause, described, name=name)


def test_chain_shares_dtype(build, mod):
    message = raises(mod.dtype_chain, torch.zeros(3), torch.zeros(3, dtype=torch.int32))
    tensor = "Tensor<3>[strides=<1>, dtype=int32, device=cpu]"
    assert message == match_error(build, "dtype_chain", "Dtype mismatch: expected float32 but got int32", tensor)


def test_symbols_unify_across_tensors_and_matchers(build, mod):
    padded = torch.zeros(3, 16)[:, :8]
    message = raises(mod.bind_shared, padded, torch.zeros(3, 8), torch.zeros(8))
    tensor = "Tensor<3, 8>[strides=<8, 1>, dtype=float32, device=cpu]"
    cause = "Stride mismatch for stride#0('row_stride'): expected 16 but got 8"
    assert message == match_error(build, "bind_shared_b", cause, tensor)

    message = raises(mod.bind_shared, torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(8, dtype=torch.float64))
    tensor = "Tensor<8>[strides=<1>, dtype=float64, device=cpu]"
    cause = "Dtype mismatch: expected float32 but got float64"
    assert message == match_error(build, "bind_shared_w", cause, tensor)

    message = raises(mod.bind_shared, torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(9))
    tensor = "Tensor<9>[strides=<1>, dtype=float32, device=cpu]"
    cause = "Size mismatch for shape#0('hidden_size'): expected 8 but got 9"
    assert message == match_error(build, "bind_shared_w", cause, tensor)


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
     torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64],
)  # fmt: skip
def test_dtype_names_follow_torch(mod, dtype):
    name = str(dtype).removeprefix("torch.")
    message = raises(mod.dtype_options, torch.zeros(2, 3, dtype=dtype))
    assert f", dtype={name}, device=cpu]" in message
    assert message.endswith(f"- Root cause: Dtype mismatch: expected one of [int32, int64] but got {name}")


# ---- RuntimeCheck, Panic, symbols misused --------------------------------------------------------


def test_runtime_check(build, mod):
    expected = f"Runtime check failed at {FILE}:{line(build, 'runtime_check')}: x must be positive, got -1"
    assert raises(mod.runtime_check, -1) == expected
    mod.runtime_check(1)


def test_runtime_check_with_location(build, mod):
    expected = f"Runtime check failed at {FILE}:{line(build, 'runtime_check_at')}: x must be positive"
    assert raises(mod.runtime_check_at, -1) == expected
    mod.runtime_check_at(1)


def test_panic(build, mod):
    assert raises(mod.panic_now, 5) == f"Panic at {FILE}:{line(build, 'panic_now')}: unsupported value 5"
    assert mod.panic_now(0) == 0


def test_unwrap_unbound_symbol(build, mod):
    assert raises(mod.unwrap_unbound) == (
        f"Panic at {FILE}:{line(build, 'unwrap_unbound')}: unwrap() on unbound SymbolicSize('head_dim'): "
        "verify a tensor with it or call set_value() first"
    )


def test_set_value_conflict(build, mod):
    assert raises(mod.set_value_conflict) == (
        f"Panic at {FILE}:{line(build, 'set_value_conflict')}: "
        "SymbolicSize('head_dim') is already bound to 64, cannot set it to 128"
    )


# ---- successes ---------------------------------------------------------------------------------


def test_bind_shared_returns_unwrapped_values(mod):
    assert list(mod.bind_shared(torch.zeros(3, 8), torch.zeros(3, 8), torch.zeros(8))) == [3, 8, 8]
    rows = torch.zeros(5, 16, dtype=torch.float64)
    weight = torch.zeros(8, dtype=torch.float64)
    assert list(mod.bind_shared(rows[:, :8], rows[:, 8:], weight)) == [5, 8, 16]


def test_wildcard_matches_each_tensor(mod):
    assert mod.wildcard(torch.zeros(3, 8), torch.zeros(5, 8)) == 8


def test_size_one_strides_are_not_compared(mod):
    row = torch.zeros(4, 16)[1:2, :8]  # shape [1, 8], strides [16, 1]
    assert row.stride() == (16, 1)
    assert mod.size_one_stride(row) == 8
    assert mod.size_one_binds(row) == 16


DLPACK = {  # (code, bits, lanes) as DLPack spells them
    torch.bool: (6, 8, 1),
    torch.uint8: (1, 8, 1),
    torch.int8: (0, 8, 1),
    torch.int16: (0, 16, 1),
    torch.int32: (0, 32, 1),
    torch.int64: (0, 64, 1),
    torch.float32: (2, 32, 1),
    torch.float64: (2, 64, 1),
}


@pytest.mark.parametrize("dtype", list(DLPACK))
def test_unwrap_dtype(mod, dtype):
    assert tuple(mod.unwrap_dtype(torch.zeros(3, dtype=dtype))) == DLPACK[dtype]


def test_unwrap_device(mod):
    assert list(mod.unwrap_device(torch.zeros(3))) == [1, 0]  # kDLCPU, id 0


@pytest.mark.parametrize(
    "dtype",
    [torch.bool, torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
     torch.float32, torch.float64, torch.float8_e4m3fn, torch.complex64],
)  # fmt: skip
def test_dtype_bytes(mod, dtype):
    assert mod.dtype_bytes(torch.zeros(2, dtype=dtype)) == torch.zeros(0, dtype=dtype).element_size()


@pytest.mark.parametrize("n", [-3, 0, 1, 2, 5, 100])
def test_irange(mod, n):
    assert mod.irange_sum(n) == sum(range(n)) * 1000 + sum(range(2, n))


@pytest.mark.parametrize(("a", "b"), [(0, 4), (1, 4), (8, 4), (10, 4), (1 << 40, 3)])
def test_div_ceil(mod, a, b):
    assert mod.div_ceil(a, b) == -(-a // b)


# ---- device names that need a GPU --------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_device_names(build, mod):
    cuda = torch.zeros(4, 16, device="cuda")
    message = raises(mod.size_mismatch, cuda)
    assert message == match_error(
        build, "size_mismatch", "Size mismatch for shape#1('hidden_size'): expected 8 but got 16",
        "Tensor<4, 16>[strides=<16, 1>, dtype=float32, device=cuda:0]",
    )  # fmt: skip
    assert raises(mod.device_bound, cuda.cpu()).endswith("expected cuda:0 but got cpu")
    assert list(mod.unwrap_device(cuda[0])) == [2, 0]  # kDLCUDA, id 0
    rows = torch.zeros(5, 24, device="cuda")
    assert list(mod.cuda_rows_bind(rows[:, :8], rows[:, 16:])) == [5, 8, 0]
    message = raises(mod.cuda_rows_bind, rows[:, :8], rows[:4, 16:])
    assert message == match_error(
        build, "cuda_rows_bind", "Size mismatch for shape#0('num_tokens'): expected 5 but got 4",
        "Tensor<4, 8>[strides=<24, 1>, dtype=float32, device=cuda:0]", name="out",
    )  # fmt: skip
    if torch.cuda.device_count() > 1:
        message = raises(mod.device_bound, torch.zeros(4, 16, device="cuda:1"))
        assert message.endswith("- Root cause: Device mismatch: expected cuda:0 but got cuda:1")
