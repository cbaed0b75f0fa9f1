"""per_tensor_quant_fp8 (dynamic) against torch eager, torch.compile and a device-to-device copy of the
same bytes, measured in the same run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_quant                                 # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_quant           # CI-sized grid
    python -m jit_kernel.benchmark.bench_quant --save-path bench-out/quant     # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_quant --json-dir bench-json           # + JSON results (report.py)
    JIT_KERNEL_BENCH_OUT=bench-out/quant python -m jit_kernel.benchmark.bench_quant   # the same, by env

Grid: bfloat16, float16 and float32 inputs of tokens x 4096, tokens 1, 16, 128, 1024, 4096, 16384
(CI-sized grid, the one docs/benchmarks.md shows: bfloat16, tokens 16, 4096). One
``triton.testing.perf_report`` benchmark per dtype, with the providers of ``PROVIDERS`` as lines:
``jit`` (jit_kernel), ``eager`` (``s = x.abs().max().float() / 448; q = (x.float() / s).clamp(-448,
448).to(float8_e4m3fn)``), ``compile`` (torch.compile of it, one static-shape graph per shape), ``copy``
(a device-to-device copy moving the minimal bytes) and ``jit_nopdl`` (jit_kernel with
``enable_pdl=False``; the default turns programmatic dependent launch on for sm_90+). With a save path,
triton writes ``<plot_name>.png`` and ``<plot_name>.csv`` per dtype, ``results.html`` shows them all,
and ``bench_quant.md`` holds the summary. The markdown summary printed at the end is derived from the
same measurements (nothing is re-measured).

Minimal bytes: the input read once plus the fp8 output written (N * D * (elem + 1)). The dynamic
kernel reads HBM once for the part of the input that stays on chip across its grid barrier (about
40 MB on an H100) and twice for the rest.
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

FP8_MAX = 448.0
D = 4096
DTYPES = get_benchmark_range(["bfloat16", "float16", "float32"], ["bfloat16"])
TOKENS = get_benchmark_range([1, 16, 128, 1024, 4096, 16384], [16, 4096])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

# The providers, in one place: add an entry here and a branch in quant_case. Beyond the standard four:
# jit_kernel with programmatic dependent launch off (on by default on sm_90+).
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "jit_nopdl": ("jit_kernel, PDL off", ("tab:purple", ":")),
}
EXTRAS = {"jit_nopdl": "no-PDL"}

RESULTS = Measurements.paired()


def quant_bytes(tokens: int, hidden: int, dtype: str) -> int:
    """The input read once plus the fp8 output written once."""
    return tokens * hidden * (getattr(torch, dtype).itemsize + 1)


def _torch_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().max().float() / FP8_MAX
    q = (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def quant_case(
    provider: str, tokens: int, hidden: int, dtype: str, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(quant_bytes(tokens, hidden, dtype), device)
    x = torch.randn(tokens, hidden, device=device, dtype=getattr(torch, dtype))
    if provider == "jit":
        q = torch.empty(tokens, hidden, device=device, dtype=torch.float8_e4m3fn)
        s = torch.empty(1, device=device)
        return lambda: jit_kernel.per_tensor_quant_fp8(x, q, s)
    if provider == "jit_nopdl":
        q = torch.empty(tokens, hidden, device=device, dtype=torch.float8_e4m3fn)
        s = torch.empty(1, device=device)
        return lambda: jit_kernel.per_tensor_quant_fp8(x, q, s, enable_pdl=False)
    if provider == "eager":
        return lambda: _torch_quant(x)
    if provider == "compile":
        compiled = compile_static(_torch_quant)
        return lambda: compiled(x)
    raise ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


@triton.testing.perf_report(
    [
        provider_benchmark(
            PROVIDERS,
            x_name="tokens",
            x_vals=TOKENS,
            xlabel=f"tokens (x {D})",
            plot_name=f"per_tensor_quant_fp8-{dtype}-D{D}",
            args={"hidden": D, "dtype": dtype},
        )
        for dtype in DTYPES
    ]
)
def bench_quant(tokens: int, hidden: int, dtype: str, provider: str) -> float:
    return RESULTS.time(
        ("per_tensor_quant_fp8", dtype, tokens, hidden), provider, lambda: quant_case(provider, tokens, hidden, dtype)
    )


REPORTS = [bench_quant]


def summary_tables() -> list[SummaryTable]:
    configs = [
        (("per_tensor_quant_fp8", dtype, n, D), [dtype, f"{n}x{D}"], quant_bytes(n, D, dtype), n <= TINY_TOKENS)
        for dtype in DTYPES
        for n in TOKENS
    ]
    return [
        SummaryTable(
            "per_tensor_quant_fp8", "per_tensor_quant_fp8, dynamic", ["dtype", "shape"], configs, PROVIDERS, EXTRAS
        )
    ]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_quant", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
