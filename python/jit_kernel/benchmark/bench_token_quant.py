"""per_token_quant_fp8, per_token_group_quant_fp8 (group 128) and silu_and_mul_per_token_group_quant_fp8
against torch eager, torch.compile and a device-to-device copy of the same bytes, measured in the same
run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_token_quant                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_token_quant            # CI-sized grid
    python -m jit_kernel.benchmark.bench_token_quant --save-path bench-out/token_quant  # + plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_token_quant --json-dir bench-json              # + JSON results (report.py)

Grid: bfloat16 inputs of tokens x hidden, hidden 4096 and 7168 (the fused op: input tokens x 2 * hidden),
tokens 1, 4, 16, 128, 1024, 4096, 16384 (CI-sized grid, the one docs/benchmarks.md shows: hidden 7168,
tokens 16, 4096). One ``triton.testing.perf_report`` benchmark per
(op, hidden), with the providers as lines:

- ``jit``: jit_kernel, outputs preallocated; ``eager``: the torch reference (per token:
  ``s = x.abs().amax(-1, keepdim=True).float() / 448``; per group: the same over ``[tokens, groups,
  128]`` with ``clamp(min=1e-10)``; ``q = (x.float() / s).clamp(-448, 448).to(float8_e4m3fn)``; fused:
  ``F.silu(g) * u`` first); ``compile``: torch.compile of it (one static-shape graph per shape);
  ``copy``: a device-to-device copy of the minimal bytes;
- per-group extras: ``jit_colmajor`` (column-major scales);
- fused extras: ``two_launch``: the unfused pair, ``jit_kernel.silu_and_mul`` (``F.silu(g) * u`` when
  the package has no silu_and_mul) then jit_kernel's group quant; its "vs 2-launch" column is the
  fused kernel's speed-up over it.

The summary's "vs empty" column (up to 16 tokens) is the time in empty-kernel CUDA-graph replays.

Minimal bytes (e = input element size, G = 128):
- per token: ``N * D * (e + 1) + 4 * N`` (input read, fp8 written, one scale per row);
- per group: ``N * D * (e + 1) + 4 * N * D / G``;
- fused: ``N * 2D * e + N * D + 4 * N * D / G`` (gate and up read once, fp8 and scales written).
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

FP8_MAX = 448.0
GROUP = 128
DTYPE = "bfloat16"
HIDDEN = get_benchmark_range([4096, 7168], [7168])
TOKENS = get_benchmark_range([1, 4, 16, 128, 1024, 4096, 16384], [16, 4096])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

TOKEN_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = dict(STANDARD_PROVIDERS)
GROUP_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "jit_colmajor": ("jit_kernel, column-major scales", ("tab:purple", ":")),
}
FUSED_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "two_launch": ("silu_and_mul + group quant (2 launches)", ("tab:red", "--")),
}
GROUP_EXTRAS = {"jit_colmajor": "col-major"}
FUSED_EXTRAS = {"two_launch": "2-launch"}

RESULTS = Measurements.paired()


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


def token_bytes(tokens: int, hidden: int, dtype: str) -> int:
    return tokens * hidden * (_itemsize(dtype) + 1) + 4 * tokens


def group_bytes(tokens: int, hidden: int, dtype: str) -> int:
    return tokens * hidden * (_itemsize(dtype) + 1) + 4 * tokens * (hidden // GROUP)


def fused_bytes(tokens: int, hidden: int, dtype: str) -> int:
    return tokens * 2 * hidden * _itemsize(dtype) + tokens * hidden + 4 * tokens * (hidden // GROUP)


def _torch_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().amax(-1, keepdim=True).float() / FP8_MAX
    q = (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def _torch_group(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = x.view(x.shape[0], -1, GROUP).float()
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    q = (g / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(x.shape), s.squeeze(-1)


def _torch_fused(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    return _torch_group(F.silu(x[:, :d]) * x[:, d:])


def _outputs(tokens: int, hidden: int, device: str, column_major: bool = False) -> tuple[torch.Tensor, ...]:
    q = torch.empty(tokens, hidden, device=device, dtype=torch.float8_e4m3fn)
    if column_major:
        s = torch.empty(hidden // GROUP, tokens, device=device).t()
    else:
        s = torch.empty(tokens, hidden // GROUP, device=device)
    return q, s


def token_case(
    provider: str, tokens: int, hidden: int, dtype: str, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(token_bytes(tokens, hidden, dtype), device)
    x = torch.randn(tokens, hidden, device=device, dtype=getattr(torch, dtype))
    if provider == "jit":
        q = torch.empty(tokens, hidden, device=device, dtype=torch.float8_e4m3fn)
        s = torch.empty(tokens, 1, device=device)
        return lambda: jit_kernel.per_token_quant_fp8(x, q, s)
    if provider == "eager":
        return lambda: _torch_token(x)
    if provider == "compile":
        compiled = compile_static(_torch_token)
        return lambda: compiled(x)
    raise ValueError(f"unknown provider {provider!r}; known: {list(TOKEN_PROVIDERS)}")


def group_case(
    provider: str, tokens: int, hidden: int, dtype: str, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(group_bytes(tokens, hidden, dtype), device)
    x = torch.randn(tokens, hidden, device=device, dtype=getattr(torch, dtype))
    if provider in ("jit", "jit_colmajor"):
        q, s = _outputs(tokens, hidden, device, column_major=provider == "jit_colmajor")
        return lambda: jit_kernel.per_token_group_quant_fp8(x, GROUP, output_q=q, output_s=s)
    if provider == "eager":
        return lambda: _torch_group(x)
    if provider == "compile":
        compiled = compile_static(_torch_group)
        return lambda: compiled(x)
    raise ValueError(f"unknown provider {provider!r}; known: {list(GROUP_PROVIDERS)}")


def fused_case(
    provider: str, tokens: int, hidden: int, dtype: str, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(fused_bytes(tokens, hidden, dtype), device)
    x = torch.randn(tokens, 2 * hidden, device=device, dtype=getattr(torch, dtype))
    if provider == "jit":
        q, s = _outputs(tokens, hidden, device)
        return lambda: jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, GROUP, output_q=q, output_s=s)
    if provider == "two_launch":
        q, s = _outputs(tokens, hidden, device)
        act = torch.empty(tokens, hidden, device=device, dtype=x.dtype)
        silu_and_mul = getattr(jit_kernel, "silu_and_mul", None)
        if silu_and_mul is not None:

            def two_launch() -> None:
                silu_and_mul(x, out=act)
                jit_kernel.per_token_group_quant_fp8(act, GROUP, output_q=q, output_s=s)
        else:

            def two_launch() -> None:
                a = F.silu(x[:, :hidden]) * x[:, hidden:]
                jit_kernel.per_token_group_quant_fp8(a, GROUP, output_q=q, output_s=s)

        return two_launch
    if provider == "eager":
        return lambda: _torch_fused(x)
    if provider == "compile":
        compiled = compile_static(_torch_fused)
        return lambda: compiled(x)
    raise ValueError(f"unknown provider {provider!r}; known: {list(FUSED_PROVIDERS)}")


def _reports(
    name: str, providers: dict[str, tuple[str, tuple[str, str]]], xlabel: str
) -> list[triton.testing.Benchmark]:
    return [
        provider_benchmark(
            providers,
            x_name="tokens",
            x_vals=TOKENS,
            xlabel=xlabel.format(hidden=hidden),
            plot_name=f"{name}-{DTYPE}-D{hidden}",
            args={"hidden": hidden, "dtype": DTYPE},
        )
        for hidden in HIDDEN
    ]


@triton.testing.perf_report(_reports("per_token_quant_fp8", TOKEN_PROVIDERS, "tokens (x {hidden})"))
def bench_per_token(tokens: int, hidden: int, dtype: str, provider: str) -> float:
    return RESULTS.time(
        ("per_token_quant_fp8", dtype, tokens, hidden),
        provider,
        lambda: token_case(provider, tokens, hidden, dtype),
    )


@triton.testing.perf_report(_reports("per_token_group_quant_fp8", GROUP_PROVIDERS, "tokens (x {hidden})"))
def bench_per_token_group(tokens: int, hidden: int, dtype: str, provider: str) -> float:
    return RESULTS.time(
        ("per_token_group_quant_fp8", dtype, tokens, hidden),
        provider,
        lambda: group_case(provider, tokens, hidden, dtype),
    )


@triton.testing.perf_report(
    _reports("silu_and_mul_per_token_group_quant_fp8", FUSED_PROVIDERS, "tokens (x 2 * {hidden})")
)
def bench_fused(tokens: int, hidden: int, dtype: str, provider: str) -> float:
    return RESULTS.time(
        ("silu_and_mul_per_token_group_quant_fp8", dtype, tokens, hidden),
        provider,
        lambda: fused_case(provider, tokens, hidden, dtype),
    )


REPORTS = [bench_per_token, bench_per_token_group, bench_fused]


def summary_tables() -> list[SummaryTable]:
    tables = []
    for op, nbytes, providers, extras, shape in (
        ("per_token_quant_fp8", token_bytes, TOKEN_PROVIDERS, {}, "{n}x{d}"),
        ("per_token_group_quant_fp8", group_bytes, GROUP_PROVIDERS, GROUP_EXTRAS, "{n}x{d}"),
        ("silu_and_mul_per_token_group_quant_fp8", fused_bytes, FUSED_PROVIDERS, FUSED_EXTRAS, "{n}x2*{d}"),
    ):
        configs = [
            ((op, DTYPE, n, d), [DTYPE, shape.format(n=n, d=d)], nbytes(n, d, DTYPE), n <= TINY_TOKENS)
            for d in HIDDEN
            for n in TOKENS
        ]
        title = op if op == "per_token_quant_fp8" else f"{op}, group {GROUP}"
        tables.append(SummaryTable(op, title, ["dtype", "shape"], configs, providers, extras))
    return tables


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_token_quant", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
