"""scale (run-time factor) and add_constant (vectorized path) against torch eager, torch.compile and a
device-to-device copy of the same bytes, measured in the same run. Times are CUDA-graph medians in
microseconds.

    python -m jit_kernel.benchmark.bench_elementwise                                # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_elementwise          # CI-sized grid
    python -m jit_kernel.benchmark.bench_elementwise --save-path bench-out/elementwise   # + plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_elementwise --json-dir bench-json               # + JSON results (report.py)
    JIT_KERNEL_BENCH_OUT=bench-out/elementwise python -m jit_kernel.benchmark.bench_elementwise   # by env

Grid: scale on bfloat16, float16 and float32, add_constant on int32; 1K, 64K, 1M, 16M and 64M elements
(CI-sized grid, the one docs/benchmarks.md shows: scale on bfloat16 only; 1K and 16M elements). One
``triton.testing.perf_report`` benchmark per (op, dtype), with the providers of ``PROVIDERS`` as lines:
``jit`` (jit_kernel), ``eager`` (``x * 0.75`` and ``x + 1``), ``compile`` (torch.compile of it, one
static-shape graph per shape) and ``copy`` (a device-to-device copy moving the minimal bytes). With a
save path, triton writes ``<plot_name>.png`` and ``<plot_name>.csv`` per benchmark, ``results.html``
shows them all, and ``bench_elementwise.md`` holds the summary. The markdown summary printed at the end
is derived from the same measurements (nothing is re-measured).

Minimal bytes: read once, write once (2 * N * elem).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton.testing

import jit_kernel
from jit_kernel.benchmark._tables import (
    STANDARD_PROVIDERS,
    Measurements,
    SummaryTable,
    compile_static,
    provider_benchmark,
    run_script,
    tables_markdown,
)
from jit_kernel.benchmark.utils import (
    DEFAULT_DEVICE,
    copy_fn,
    get_benchmark_range,
)

SIZES = get_benchmark_range([1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26], [1 << 10, 1 << 24])
SCALE_DTYPES = get_benchmark_range(["bfloat16", "float16", "float32"], ["bfloat16"])
ADD_DTYPES = ["int32"]
FACTOR = 0.75
CONSTANT = 1
TINY_ELEMENTS = 16 * 8192  # "vs empty" is shown up to this many elements

# The providers, in one place: add an entry here (e.g. "jit_pdl") and a branch in each *_case.
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = dict(STANDARD_PROVIDERS)

RESULTS = Measurements.paired()


def elementwise_bytes(elements: int, dtype: str) -> int:
    """Read once, write once."""
    return 2 * elements * getattr(torch, dtype).itemsize


def _torch_scale(x: torch.Tensor) -> torch.Tensor:
    return x * FACTOR


def _torch_add(x: torch.Tensor) -> torch.Tensor:
    return x + CONSTANT


def _unknown(provider: str) -> ValueError:
    return ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


def scale_case(provider: str, elements: int, dtype: str, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(elementwise_bytes(elements, dtype), device)
    x = torch.randn(elements, device=device).to(getattr(torch, dtype))
    if provider == "jit":
        out = torch.empty_like(x)
        return lambda: jit_kernel.scale(x, FACTOR, out=out)
    if provider == "eager":
        return lambda: _torch_scale(x)
    if provider == "compile":
        compiled = compile_static(_torch_scale)
        return lambda: compiled(x)
    raise _unknown(provider)


def add_constant_case(provider: str, elements: int, dtype: str, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(elementwise_bytes(elements, dtype), device)
    x = torch.randint(0, 100, (elements,), device=device, dtype=getattr(torch, dtype))
    if provider == "jit":
        out = torch.empty_like(x)
        return lambda: jit_kernel.add_constant(x, CONSTANT, out=out)
    if provider == "eager":
        return lambda: _torch_add(x)
    if provider == "compile":
        compiled = compile_static(_torch_add)
        return lambda: compiled(x)
    raise _unknown(provider)


def _benchmark(op: str, dtype: str) -> triton.testing.Benchmark:
    return provider_benchmark(
        PROVIDERS, x_name="elements", x_vals=SIZES, xlabel="elements", plot_name=f"{op}-{dtype}", args={"dtype": dtype}
    )


@triton.testing.perf_report([_benchmark("scale", dtype) for dtype in SCALE_DTYPES])
def bench_scale(elements: int, dtype: str, provider: str) -> float:
    return RESULTS.time(("scale", dtype, elements), provider, lambda: scale_case(provider, elements, dtype))


@triton.testing.perf_report([_benchmark("add_constant", dtype) for dtype in ADD_DTYPES])
def bench_add_constant(elements: int, dtype: str, provider: str) -> float:
    return RESULTS.time(
        ("add_constant", dtype, elements), provider, lambda: add_constant_case(provider, elements, dtype)
    )


REPORTS = [bench_scale, bench_add_constant]


def summary_tables() -> list[SummaryTable]:
    cases = [("scale", dtype) for dtype in SCALE_DTYPES] + [("add_constant", dtype) for dtype in ADD_DTYPES]
    configs = [
        ((op, dtype, n), [op, dtype, n], elementwise_bytes(n, dtype), n <= TINY_ELEMENTS)
        for op, dtype in cases
        for n in SIZES
    ]
    return [SummaryTable("elementwise", "scale / add_constant", ["op", "dtype", "elements"], configs, PROVIDERS)]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_elementwise", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
