"""silu_and_mul, gelu_and_mul and gelu_tanh_and_mul (bf16) against torch eager, torch.compile, FlashInfer
and a device-to-device copy of the same bytes, measured in the same run. Times are CUDA-graph medians
in microseconds.

    python -m jit_kernel.benchmark.bench_activation                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_activation            # CI-sized grid
    python -m jit_kernel.benchmark.bench_activation --save-path bench-out/activation # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_activation --json-dir bench-json            # + JSON results (report.py)

Grid: input ``[N, 2 * d]`` bf16 (contiguous), d 14336 (Llama-3-70B / Mixtral MLP) and 4096, tokens 1,
16, 1024, 4096, 16384 (CI-sized grid, the one docs/benchmarks.md shows: d 14336, tokens 16, 4096). One
``triton.testing.perf_report`` benchmark per (op, d), with the providers of ``PROVIDERS`` as lines:
``jit`` (jit_kernel), ``eager`` (``F.silu(x[..., :d]) * x[..., d:]``, ``F.gelu`` /
``F.gelu(approximate="tanh")`` for the GELUs), ``compile`` (torch.compile of it, one static-shape graph
per shape), ``copy`` (a device-to-device copy moving the minimal bytes), ``flashinfer``
(``flashinfer.activation.<op>``; "n/a" where flashinfer is not installed) and ``jit_nopdl`` (jit_kernel
with ``enable_pdl=False``; the default turns programmatic dependent launch on for sm_90+). With a save
path, triton writes ``<plot_name>.png`` and ``<plot_name>.csv`` per benchmark, ``results.html`` shows
them all, and ``bench_activation.md`` holds the summary, derived from the same measurements (nothing is
re-measured); "vs empty" (our time in empty-kernel replays) is shown up to 16 tokens.

Minimal bytes: the input read once and the output written once, ``3 * N * d * elem`` (read ``2d``,
write ``d`` per token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
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
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range

DT = torch.bfloat16
OPS = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]
HIDDEN = get_benchmark_range([14336, 4096], [14336])
TOKENS = get_benchmark_range([1, 16, 1024, 4096, 16384], [16, 4096])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

# The providers, in one place: add an entry here and a branch in activation_case.
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "flashinfer": ("FlashInfer", ("tab:red", "-")),
    "jit_nopdl": ("jit_kernel, PDL off", ("tab:purple", ":")),
}
EXTRAS = {"flashinfer": "FlashInfer", "jit_nopdl": "no-PDL"}

RESULTS = Measurements.paired()


def activation_bytes(tokens: int, d: int, elem: int = DT.itemsize) -> int:
    """The input ``[N, 2d]`` read once and the output ``[N, d]`` written once."""
    return 3 * tokens * d * elem


# ---------------------------------------------------------------------------------------------
# torch baselines


def _torch_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def _torch_gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def _torch_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


TORCH = {
    "silu_and_mul": _torch_silu_and_mul,
    "gelu_and_mul": _torch_gelu_and_mul,
    "gelu_tanh_and_mul": _torch_gelu_tanh_and_mul,
}


def _flashinfer(op: str) -> Callable[..., torch.Tensor]:
    import flashinfer.activation  # may be missing: the case reads n/a

    return getattr(flashinfer.activation, op)


# ---------------------------------------------------------------------------------------------
# One provider at one config: inputs, and the callable to time


def activation_case(provider: str, op: str, tokens: int, d: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(activation_bytes(tokens, d), device)
    x = torch.randn(tokens, 2 * d, device=device, dtype=DT)
    out = torch.empty(tokens, d, device=device, dtype=DT)
    if provider == "jit":
        fn = getattr(jit_kernel, op)
        return lambda: fn(x, out=out)
    if provider == "jit_nopdl":
        fn = getattr(jit_kernel, op)
        return lambda: fn(x, out=out, enable_pdl=False)
    if provider == "flashinfer":
        fi = _flashinfer(op)
        return lambda: fi(x, out=out)
    if provider == "eager":
        ref = TORCH[op]
        return lambda: ref(x)
    if provider == "compile":
        compiled = compile_static(TORCH[op])
        return lambda: compiled(x)
    raise ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = tokens, one line per provider, one benchmark per (op, d)


@triton.testing.perf_report(
    [
        provider_benchmark(
            PROVIDERS,
            x_name="tokens",
            x_vals=TOKENS,
            xlabel=f"tokens (input [N, 2 x {d}])",
            plot_name=f"{op}-bf16-d{d}",
            args={"op": op, "d": d},
        )
        for op in OPS
        for d in HIDDEN
    ]
)
def bench_activation(tokens: int, op: str, d: int, provider: str) -> float:
    return RESULTS.time((op, tokens, d), provider, lambda: activation_case(provider, op, tokens, d))


REPORTS = [bench_activation]


def summary_tables() -> list[SummaryTable]:
    configs = [
        ((op, n, d), [op, f"{n}x2x{d}"], activation_bytes(n, d), n <= TINY_TOKENS)
        for op in OPS
        for d in HIDDEN
        for n in TOKENS
    ]
    return [SummaryTable("activation", "gated activations, bf16", ["op", "input"], configs, PROVIDERS, EXTRAS)]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_activation", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
