"""RMSNorm fused with fp8 quantisation, and Gemma's RMSNorm (bf16, hidden 4096), against our own two
launches, torch eager, torch.compile, FlashInfer and a device-to-device copy of the same bytes,
measured in the same run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_norm_quant                                   # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_norm_quant             # CI-sized grid
    python -m jit_kernel.benchmark.bench_norm_quant --save-path bench-out/norm_quant  # + plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_norm_quant --json-dir bench-json             # + JSON results (report.py)

Grid: bfloat16 rows of 4096, tokens 1, 16, 128, 256, 512, 1024, 4096, 16384 (CI-sized grid, the one
the docs show: tokens 1, 16, 128, 1024, 4096, 16384). At 4096 tokens the copy's 25-60 MB stays
partly in the 50 MB L2 between replays; at 16384 tokens neither the copy nor the op does. So from
4096 tokens each op is also timed with its inputs rotated: as many copies of its inputs and outputs
as span 256 MB, used in turn (the time is per call), and so is the copy: no replay finds its data in
L2, as in a model, where the layers between two calls evict it. The "rotated" table holds jit_kernel,
the copy and FlashInfer, and is where the share of the DRAM ceiling is read.
One ``triton.testing.perf_report`` benchmark per op, with these providers as lines:

- ``jit``: jit_kernel's fused op, outputs preallocated; ``copy``: a device-to-device copy of the
  op's minimal bytes (the ceiling);
- ``two_launch``: our two launches it replaces (``rmsnorm`` / ``fused_add_rmsnorm``, then
  ``per_tensor_quant_fp8(is_static=True)``, ``per_token_quant_fp8`` or ``per_token_group_quant_fp8``);
- ``eager``: the torch code (``F.rms_norm``, then ``(y.float() / s).clamp(-448, 448).to(fp8)`` with
  the op's scale; Gemma: transformers' GemmaRMSNorm), ``compile``: torch.compile of it (one
  static-shape graph per shape);
- ``flashinfer``: FlashInfer's op of the same job where it has one (``flashinfer.norm.rmsnorm_quant``,
  ``fused_add_rmsnorm_quant``, ``fused_add_rmsnorm_fp8_block_quant``, ``gemma_rmsnorm``,
  ``gemma_fused_add_rmsnorm``), "n/a" where FlashInfer is not importable. Its fp8 ops quantise the
  unrounded normalised value (ours round it to bf16 first, as the two launches do), and FlashInfer
  picks its CUDA path or, where nvidia-cutlass-dsl is installed, CuTe-DSL kernels: say which ran
  next to its numbers.

The per-group op is timed as FlashInfer's block-quant op works: groups of 128, column-major scales
padded to 4 tokens (TMA), and the bf16 normalised rows written too (``normed_out``); ``jit_q_only``
leaves ``normed_out`` out. The fused ops update ``residual`` in place at every replay, as a layer does.
The summary's "vs empty" column (up to 16 tokens) is the time in empty-kernel CUDA-graph replays.

Minimal bytes (N tokens, D = 4096, e = 2): the input read, the residual read and written (fused),
the fp8 output written, the scales written (4 bytes each) and the weight read:
``rmsnorm_quant_fp8`` N*D*(e+1); ``fused_add_rmsnorm_quant_fp8`` N*D*(3e+1); per token, + 4N; per
group, + N*D*e (normed_out) + 4*N*D/128; ``gemma_rmsnorm`` 2*N*D*e; ``gemma_fused_add_rmsnorm``
4*N*D*e; each + D*e.
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
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range, rotated, rotation_count

EPS = 1e-6
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
GROUP = 128
SCALE = 0.02  # the static scale: a float32 tensor of one element
DT = torch.bfloat16
HIDDEN = 4096
TOKENS = get_benchmark_range([1, 16, 128, 256, 512, 1024, 4096, 16384], [1, 16, 128, 1024, 4096, 16384])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens
ROTATED_TOKENS = [n for n in TOKENS if n >= 4096]  # also timed with rotated inputs (module docstring)
ROTATED_PROVIDERS = ("jit", "copy", "flashinfer")

QUANT_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "two_launch": ("jit_kernel, two launches", ("tab:red", "--")),
    "flashinfer": ("FlashInfer", ("tab:brown", "-")),
}
QUANT_EXTRAS = {"two_launch": "2-launch", "flashinfer": "FlashInfer"}
TOKEN_PROVIDERS = {k: v for k, v in QUANT_PROVIDERS.items() if k != "flashinfer"}  # FlashInfer has no such op
TOKEN_EXTRAS = {"two_launch": "2-launch"}
GROUP_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **QUANT_PROVIDERS,
    "jit_q_only": ("jit_kernel, no normed_out", ("tab:purple", ":")),
}
GROUP_EXTRAS = {**QUANT_EXTRAS, "jit_q_only": "q only"}
GEMMA_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "flashinfer": ("FlashInfer", ("tab:brown", "-")),
}
GEMMA_EXTRAS = {"flashinfer": "FlashInfer"}

# op -> (its providers, the extra providers given two summary columns each)
OPS: dict[str, tuple[dict[str, tuple[str, tuple[str, str]]], dict[str, str]]] = {
    "rmsnorm_quant_fp8": (QUANT_PROVIDERS, QUANT_EXTRAS),
    "fused_add_rmsnorm_quant_fp8": (QUANT_PROVIDERS, QUANT_EXTRAS),
    "fused_add_rmsnorm_per_token_quant_fp8": (TOKEN_PROVIDERS, TOKEN_EXTRAS),
    "fused_add_rmsnorm_per_token_group_quant_fp8": (GROUP_PROVIDERS, GROUP_EXTRAS),
    "gemma_rmsnorm": (GEMMA_PROVIDERS, GEMMA_EXTRAS),
    "gemma_fused_add_rmsnorm": (GEMMA_PROVIDERS, GEMMA_EXTRAS),
}

RESULTS = Measurements.paired()


# ---------------------------------------------------------------------------------------------
# Minimal bytes


def op_bytes(op: str, tokens: int, hidden: int = HIDDEN, elem: int = DT.itemsize) -> int:
    """The op's minimal bytes (module docstring)."""
    n, d, e = tokens, hidden, elem
    per_row = {
        "rmsnorm_quant_fp8": d * (e + 1),
        "fused_add_rmsnorm_quant_fp8": d * (3 * e + 1),
        "fused_add_rmsnorm_per_token_quant_fp8": d * (3 * e + 1) + 4,
        "fused_add_rmsnorm_per_token_group_quant_fp8": d * (4 * e + 1) + 4 * (d // GROUP),
        "gemma_rmsnorm": 2 * d * e,
        "gemma_fused_add_rmsnorm": 4 * d * e,
    }[op]
    return n * per_row + d * e


# ---------------------------------------------------------------------------------------------
# torch baselines


def _to_fp8(y: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (y.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def torch_rmsnorm_quant(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return _to_fp8(F.rms_norm(x, (x.shape[-1],), w, EPS), scale)


def torch_fused_add_rmsnorm_quant(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    r.add_(x)
    return _to_fp8(F.rms_norm(r, (r.shape[-1],), w, EPS), scale)


def torch_fused_add_rmsnorm_per_token(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r.add_(x)
    y = F.rms_norm(r, (r.shape[-1],), w, EPS)
    s = y.abs().amax(-1, keepdim=True).float() / FP8_MAX
    return _to_fp8(y, s), s


def torch_fused_add_rmsnorm_group(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r.add_(x)
    y = F.rms_norm(r, (r.shape[-1],), w, EPS)
    g = y.view(y.shape[0], -1, GROUP).float()
    s = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    q = (g / s).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(y.shape), s.squeeze(-1).t().contiguous().t(), y  # column-major scales, normed rows


def torch_gemma_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' GemmaRMSNorm."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (out * (1.0 + w.float())).type_as(x)


def torch_gemma_fused_add_rmsnorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    r.add_(x)
    x.copy_(torch_gemma_rmsnorm(r, w))


TORCH: dict[str, Callable[..., object]] = {
    "rmsnorm_quant_fp8": torch_rmsnorm_quant,
    "fused_add_rmsnorm_quant_fp8": torch_fused_add_rmsnorm_quant,
    "fused_add_rmsnorm_per_token_quant_fp8": torch_fused_add_rmsnorm_per_token,
    "fused_add_rmsnorm_per_token_group_quant_fp8": torch_fused_add_rmsnorm_group,
    "gemma_rmsnorm": torch_gemma_rmsnorm,
    "gemma_fused_add_rmsnorm": torch_gemma_fused_add_rmsnorm,
}


def _flashinfer_norm() -> object:
    import flashinfer.norm  # may be missing: time_case reports the failure as n/a

    return flashinfer.norm


# ---------------------------------------------------------------------------------------------
# One provider at one config: inputs, and the callable to time


def _scales_colmajor(tokens: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Group scales as FlashInfer's block-quant op writes them: a contiguous [D / 128, tokens padded
    to 4] buffer, and our [tokens, D / 128] view of it."""
    buffer = torch.empty(HIDDEN // GROUP, (tokens + 3) // 4 * 4, device=device)
    return buffer, buffer.t()[:tokens]


def norm_quant_case(provider: str, op: str, tokens: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(op_bytes(op, tokens), device)
    x = torch.randn(tokens, HIDDEN, device=device, dtype=DT)
    r = torch.randn_like(x)
    w = torch.rand(HIDDEN, device=device, dtype=DT) + 0.5
    scale = torch.tensor([SCALE], device=device)
    q = torch.empty(tokens, HIDDEN, device=device, dtype=FP8)
    if provider in ("eager", "compile"):
        fn = TORCH[op] if provider == "eager" else compile_static(TORCH[op])
        if op in ("rmsnorm_quant_fp8", "fused_add_rmsnorm_quant_fp8"):
            args: tuple[torch.Tensor, ...] = (x, w, scale) if op == "rmsnorm_quant_fp8" else (x, r, w, scale)
        elif op == "gemma_rmsnorm":
            args = (x, w)
        else:
            args = (x, r, w)
        return lambda: fn(*args)
    if op == "rmsnorm_quant_fp8":
        if provider == "jit":
            return lambda: jit_kernel.rmsnorm_quant_fp8(x, w, scale, EPS, out=q)
        if provider == "two_launch":
            y = torch.empty_like(x)

            def two_launch() -> None:
                jit_kernel.rmsnorm(x, w, EPS, out=y)
                jit_kernel.per_tensor_quant_fp8(y, q, scale, is_static=True)

            return two_launch
        if provider == "flashinfer":
            fi = _flashinfer_norm()
            return lambda: fi.rmsnorm_quant(q, x, w, scale, EPS)  # type: ignore[attr-defined]
    if op == "fused_add_rmsnorm_quant_fp8":
        if provider == "jit":
            return lambda: jit_kernel.fused_add_rmsnorm_quant_fp8(x, r, w, scale, EPS, out=q)
        if provider == "two_launch":

            def two_launch_add() -> None:
                jit_kernel.fused_add_rmsnorm(x, r, w, EPS)  # x becomes the normed rows
                jit_kernel.per_tensor_quant_fp8(x, q, scale, is_static=True)

            return two_launch_add
        if provider == "flashinfer":
            fi = _flashinfer_norm()
            return lambda: fi.fused_add_rmsnorm_quant(q, x, r, w, scale, EPS)  # type: ignore[attr-defined]
    if op == "fused_add_rmsnorm_per_token_quant_fp8":
        s = torch.empty(tokens, 1, device=device)
        if provider == "jit":
            return lambda: jit_kernel.fused_add_rmsnorm_per_token_quant_fp8(x, r, w, EPS, q, s)

        if provider == "two_launch":

            def two_launch_token() -> None:
                jit_kernel.fused_add_rmsnorm(x, r, w, EPS)
                jit_kernel.per_token_quant_fp8(x, q, s)

            return two_launch_token
    if op == "fused_add_rmsnorm_per_token_group_quant_fp8":
        buffer, s = _scales_colmajor(tokens, device)
        normed = torch.empty_like(x)
        if provider in ("jit", "jit_q_only"):
            out = normed if provider == "jit" else None
            return lambda: jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
                x, r, w, GROUP, EPS, output_q=q, output_s=s, normed_out=out
            )
        if provider == "two_launch":

            def two_launch_group() -> None:
                jit_kernel.fused_add_rmsnorm(x, r, w, EPS)  # x becomes the normed rows
                jit_kernel.per_token_group_quant_fp8(x, GROUP, output_q=q, output_s=s)

            return two_launch_group
        if provider == "flashinfer":
            fi = _flashinfer_norm()
            return lambda: fi.fused_add_rmsnorm_fp8_block_quant(q, buffer, normed, x, r, w, EPS)  # type: ignore[attr-defined]
    if op == "gemma_rmsnorm":
        out = torch.empty_like(x)
        if provider == "jit":
            return lambda: jit_kernel.gemma_rmsnorm(x, w, EPS, out=out)
        if provider == "flashinfer":
            fi = _flashinfer_norm()
            return lambda: fi.gemma_rmsnorm(x, w, EPS, out=out)  # type: ignore[attr-defined]
    if op == "gemma_fused_add_rmsnorm":
        if provider == "jit":
            return lambda: jit_kernel.gemma_fused_add_rmsnorm(x, r, w, EPS)
        if provider == "flashinfer":
            fi = _flashinfer_norm()
            return lambda: fi.gemma_fused_add_rmsnorm(x, r, w, EPS)  # type: ignore[attr-defined]
    raise ValueError(f"unknown provider {provider!r} for {op}; known: {list(OPS[op][0])}")


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = tokens, one line per provider, one benchmark per op


def _rotated_providers(op: str) -> dict[str, tuple[str, tuple[str, str]]]:
    return {p: line for p, line in OPS[op][0].items() if p in ROTATED_PROVIDERS}


def _benchmark(op: str, rotated_inputs: bool = False) -> triton.testing.Benchmark:
    suffix = "-rotated" if rotated_inputs else ""
    return provider_benchmark(
        _rotated_providers(op) if rotated_inputs else OPS[op][0],
        x_name="tokens",
        x_vals=ROTATED_TOKENS if rotated_inputs else TOKENS,
        xlabel=f"tokens (x {HIDDEN})" + (", inputs rotated" if rotated_inputs else ""),
        plot_name=f"{op}-bf16-D{HIDDEN}{suffix}",
        args={"op": op},
    )


@triton.testing.perf_report([_benchmark(op) for op in OPS])
def bench_norm_quant(tokens: int, op: str, provider: str) -> float:
    return RESULTS.time((op, tokens), provider, lambda: norm_quant_case(provider, op, tokens))


@triton.testing.perf_report([_benchmark(op, rotated_inputs=True) for op in OPS])
def bench_norm_quant_rotated(tokens: int, op: str, provider: str) -> float:
    copies = rotation_count(op_bytes(op, tokens))
    return RESULTS.time(
        (op, tokens, "rotated"),
        provider,
        lambda: rotated(lambda: norm_quant_case(provider, op, tokens), copies),
        calls=copies,
    )


REPORTS = [bench_norm_quant, bench_norm_quant_rotated]


# ---------------------------------------------------------------------------------------------
# Markdown summary, from the measurements the reports made


def summary_tables() -> list[SummaryTable]:
    tables = []
    for op, (providers, extras) in OPS.items():
        title = f"{op} (bf16, D={HIDDEN})"
        if op == "fused_add_rmsnorm_per_token_group_quant_fp8":
            title = f"{op} (bf16, D={HIDDEN}, groups of {GROUP}, column-major TMA-padded scales, normed_out written)"
        configs = [((op, n), [n], op_bytes(op, n), n <= TINY_TOKENS) for n in TOKENS]
        tables.append(SummaryTable(op, title, ["tokens"], configs, providers, extras))
    rotated_configs = [((op, n, "rotated"), [op, n], op_bytes(op, n), False) for op in OPS for n in ROTATED_TOKENS]
    rotated_providers = {p: line for p, line in QUANT_PROVIDERS.items() if p in ROTATED_PROVIDERS}
    title = f"every op (bf16, D={HIDDEN}), inputs rotated over 256 MB: no L2 reuse between calls"
    tables.append(
        SummaryTable(
            "rotated", title, ["op", "tokens"], rotated_configs, rotated_providers, {"flashinfer": "FlashInfer"}
        )
    )
    return tables


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_norm_quant", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
