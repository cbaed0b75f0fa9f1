"""rmsnorm, fused_add_rmsnorm, fused_inplace_qknorm and qknorm_across_heads (bf16) against torch eager,
torch.compile and a device-to-device copy of the same bytes, measured in the same run. Times are
CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_norm                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_norm            # CI-sized grid
    python -m jit_kernel.benchmark.bench_norm --save-path bench-out/norm       # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_norm --json-dir bench-json            # + JSON results (report.py)
    JIT_KERNEL_BENCH_OUT=bench-out/norm python -m jit_kernel.benchmark.bench_norm   # the same, by env

Full grid: tokens 1, 16, 1024, 4096, 16384 x D 1024, 2048, 4096, 5120, 7168, 8192 (CI-sized grid, the
one docs/benchmarks.md shows: tokens 16, 4096 x D 4096); the q/k norms use Hq=32, Hk=8, head_dim 128
over the same tokens. Each benchmark is a
``triton.testing.perf_report`` with the providers of ``PROVIDERS`` as lines: ``jit`` (jit_kernel),
``eager`` (the torch code below), ``compile`` (torch.compile of it, one static-shape graph per shape),
``copy`` (a device-to-device copy moving the op's minimal bytes), ``jit_nopdl`` (jit_kernel with
``enable_pdl=False``; the default turns programmatic dependent launch on for sm_90+) and ``eager_hf``
(the obvious torch code, transformers' LlamaRMSNorm: float, mean of squares, rsqrt, cast, weight).
With a save path, triton writes one ``<plot_name>.png`` and ``<plot_name>.csv`` per benchmark (one
per D for rmsnorm and fused_add_rmsnorm), ``results.html`` shows them all, and ``bench_norm.md``
holds the summary. The markdown summary printed at the end is derived from the same measurements
(nothing is re-measured).

Minimal bytes: rmsnorm reads the input and writes the output once (2 * N * D * elem, plus the
weight); fused_add_rmsnorm reads input and residual and writes both (4 * N * D * elem, plus the
weight); both q/k norms read and write q and k once (2 * N * (Hq + Hk) * head_dim * elem).

q/k inputs are the q and k slices of one qkv tensor of width (Hq + 2 * Hk) * head_dim (strided rows).
fused_inplace_qknorm normalises each head ([N, H, head_dim] views); qknorm_across_heads normalises whole
rows ([N, Hq * head_dim] and [N, Hk * head_dim], weights [Hq * head_dim] and [Hk * head_dim]). Their eager
baseline is the two out-of-place ``F.rms_norm`` calls; compile runs the in-place version.
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
from jit_kernel.benchmark.utils import (
    DEFAULT_DEVICE,
    copy_fn,
    get_benchmark_range,
)

EPS = 1e-6
DT = torch.bfloat16
TOKENS = get_benchmark_range([1, 16, 1024, 4096, 16384], [16, 4096])
HIDDEN = get_benchmark_range([1024, 2048, 4096, 5120, 7168, 8192], [4096])
HQ, HK, HEAD_DIM = 32, 8, 128
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

# The providers, in one place: add an entry here and a branch in each *_case. Beyond the standard
# four: jit_kernel with programmatic dependent launch off (on by default on sm_90+), and the
# obvious torch code (Hugging Face's LlamaRMSNorm) run eagerly.
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "jit_nopdl": ("jit_kernel, PDL off", ("tab:purple", ":")),
    "eager_hf": ("torch eager, HF-style code", ("tab:red", "--")),
}
EXTRAS = {"jit_nopdl": "no-PDL", "eager_hf": "HF eager"}

RESULTS = Measurements.paired()


# ---------------------------------------------------------------------------------------------
# Minimal bytes


def rmsnorm_bytes(tokens: int, hidden: int, elem: int = DT.itemsize) -> int:
    return 2 * tokens * hidden * elem + hidden * elem


def fused_add_rmsnorm_bytes(tokens: int, hidden: int, elem: int = DT.itemsize) -> int:
    return 4 * tokens * hidden * elem + hidden * elem


def qknorm_bytes(tokens: int, hq: int = HQ, hk: int = HK, head_dim: int = HEAD_DIM, elem: int = DT.itemsize) -> int:
    """Both q/k norms: q and k read and written once."""
    return 2 * tokens * (hq + hk) * head_dim * elem


# ---------------------------------------------------------------------------------------------
# torch baselines


def _torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _hf_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The obvious torch code (transformers' LlamaRMSNorm): several kernels."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _hf_fused_add(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    r.add_(x)
    x.copy_(_hf_rmsnorm(r, w))


def _hf_qk(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _hf_rmsnorm(q, qw), _hf_rmsnorm(k, kw)


def _torch_fused_add(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    r.add_(x)
    x.copy_(F.rms_norm(r, (r.shape[-1],), w, EPS))


def _torch_qk(
    q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out of place, each over its own last dimension: per head for [N, H, D], per row for [N, H*D]."""
    return F.rms_norm(q, (q.shape[-1],), qw, EPS), F.rms_norm(k, (k.shape[-1],), kw, EPS)


def _torch_qk_inplace(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor) -> None:
    q.copy_(F.rms_norm(q, (q.shape[-1],), qw, EPS))
    k.copy_(F.rms_norm(k, (k.shape[-1],), kw, EPS))


# ---------------------------------------------------------------------------------------------
# One provider at one config: inputs, and the callable to time


def _unknown(provider: str) -> ValueError:
    return ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


def rmsnorm_case(provider: str, tokens: int, hidden: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(rmsnorm_bytes(tokens, hidden), device)
    x = torch.randn(tokens, hidden, device=device, dtype=DT)
    w = torch.randn(hidden, device=device, dtype=DT)
    out = torch.empty_like(x)
    if provider == "jit":
        return lambda: jit_kernel.rmsnorm(x, w, EPS, out=out)
    if provider == "jit_nopdl":
        return lambda: jit_kernel.rmsnorm(x, w, EPS, out=out, enable_pdl=False)
    if provider == "eager":
        return lambda: _torch_rmsnorm(x, w)
    if provider == "eager_hf":
        return lambda: _hf_rmsnorm(x, w)
    if provider == "compile":
        compiled = compile_static(_torch_rmsnorm)
        return lambda: compiled(x, w)
    raise _unknown(provider)


def fused_add_rmsnorm_case(
    provider: str, tokens: int, hidden: int, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(fused_add_rmsnorm_bytes(tokens, hidden), device)
    x = torch.randn(tokens, hidden, device=device, dtype=DT)
    w = torch.randn(hidden, device=device, dtype=DT)
    r = torch.randn_like(x)
    if provider == "jit":
        return lambda: jit_kernel.fused_add_rmsnorm(x, r, w, EPS)
    if provider == "jit_nopdl":
        return lambda: jit_kernel.fused_add_rmsnorm(x, r, w, EPS, enable_pdl=False)
    if provider == "eager":
        return lambda: _torch_fused_add(x, r, w)
    if provider == "eager_hf":
        return lambda: _hf_fused_add(x, r, w)
    if provider == "compile":
        compiled = compile_static(_torch_fused_add)
        return lambda: compiled(x, r, w)
    raise _unknown(provider)


def qkv_slices(
    tokens: int, hq: int, hk: int, head_dim: int, device: str = DEFAULT_DEVICE
) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[N, hq * head_dim]`` and k ``[N, hk * head_dim]``: slices of one qkv tensor (strided rows)."""
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_dim, device=device, dtype=DT)
    return qkv[:, : hq * head_dim], qkv[:, hq * head_dim : (hq + hk) * head_dim]


def _qk_case(
    provider: str,
    op: Callable[..., None],
    q: torch.Tensor,
    k: torch.Tensor,
    qw: torch.Tensor,
    kw: torch.Tensor,
) -> Callable[[], object]:
    """The non-copy providers of both q/k norms (``op`` is the jit_kernel op)."""
    if provider == "jit":
        return lambda: op(q, k, qw, kw, EPS)
    if provider == "jit_nopdl":
        return lambda: op(q, k, qw, kw, EPS, enable_pdl=False)
    if provider == "eager":
        return lambda: _torch_qk(q, k, qw, kw)
    if provider == "eager_hf":
        return lambda: _hf_qk(q, k, qw, kw)
    if provider == "compile":
        compiled = compile_static(_torch_qk_inplace)
        return lambda: compiled(q, k, qw, kw)
    raise _unknown(provider)


def fused_inplace_qknorm_case(
    provider: str, tokens: int, hq: int, hk: int, head_dim: int, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(qknorm_bytes(tokens, hq, hk, head_dim), device)
    q_rows, k_rows = qkv_slices(tokens, hq, hk, head_dim, device)
    q, k = q_rows.view(tokens, hq, head_dim), k_rows.view(tokens, hk, head_dim)
    qw = torch.randn(head_dim, device=device, dtype=DT)
    kw = torch.randn(head_dim, device=device, dtype=DT)
    return _qk_case(provider, jit_kernel.fused_inplace_qknorm, q, k, qw, kw)


def qknorm_across_heads_case(
    provider: str, tokens: int, hq: int, hk: int, head_dim: int, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(qknorm_bytes(tokens, hq, hk, head_dim), device)
    q, k = qkv_slices(tokens, hq, hk, head_dim, device)
    qw = torch.randn(hq * head_dim, device=device, dtype=DT)
    kw = torch.randn(hk * head_dim, device=device, dtype=DT)
    return _qk_case(provider, jit_kernel.qknorm_across_heads, q, k, qw, kw)


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = tokens, one line per provider


def _benchmark(plot_name: str, args: dict[str, object]) -> triton.testing.Benchmark:
    return provider_benchmark(
        PROVIDERS, x_name="tokens", x_vals=TOKENS, xlabel="tokens", plot_name=plot_name, args=args
    )


def _qk_args() -> dict[str, object]:
    return {"hq": HQ, "hk": HK, "head_dim": HEAD_DIM}


@triton.testing.perf_report([_benchmark(f"rmsnorm-bf16-D{d}", {"hidden": d}) for d in HIDDEN])
def bench_rmsnorm(tokens: int, hidden: int, provider: str) -> float:
    return RESULTS.time(("rmsnorm", tokens, hidden), provider, lambda: rmsnorm_case(provider, tokens, hidden))


@triton.testing.perf_report([_benchmark(f"fused_add_rmsnorm-bf16-D{d}", {"hidden": d}) for d in HIDDEN])
def bench_fused_add_rmsnorm(tokens: int, hidden: int, provider: str) -> float:
    return RESULTS.time(
        ("fused_add_rmsnorm", tokens, hidden), provider, lambda: fused_add_rmsnorm_case(provider, tokens, hidden)
    )


@triton.testing.perf_report(_benchmark(f"fused_inplace_qknorm-bf16-hq{HQ}-hk{HK}-d{HEAD_DIM}", _qk_args()))
def bench_fused_inplace_qknorm(tokens: int, hq: int, hk: int, head_dim: int, provider: str) -> float:
    return RESULTS.time(
        ("fused_inplace_qknorm", tokens, hq, hk, head_dim),
        provider,
        lambda: fused_inplace_qknorm_case(provider, tokens, hq, hk, head_dim),
    )


@triton.testing.perf_report(_benchmark(f"qknorm_across_heads-bf16-hq{HQ}-hk{HK}-d{HEAD_DIM}", _qk_args()))
def bench_qknorm_across_heads(tokens: int, hq: int, hk: int, head_dim: int, provider: str) -> float:
    return RESULTS.time(
        ("qknorm_across_heads", tokens, hq, hk, head_dim),
        provider,
        lambda: qknorm_across_heads_case(provider, tokens, hq, hk, head_dim),
    )


REPORTS = [bench_rmsnorm, bench_fused_add_rmsnorm, bench_fused_inplace_qknorm, bench_qknorm_across_heads]


# ---------------------------------------------------------------------------------------------
# Markdown summary, from the measurements the reports made


def summary_tables() -> list[SummaryTable]:
    heads = f"{HQ}+{HK}x{HEAD_DIM}"
    qk_note = "q/k slices of qkv; eager = the two out-of-place F.rms_norm calls, compile = in-place version"
    return [
        SummaryTable(
            "rmsnorm",
            "rmsnorm (bf16)",
            ["tokens", "D"],
            [(("rmsnorm", n, d), [n, d], rmsnorm_bytes(n, d), n <= TINY_TOKENS) for d in HIDDEN for n in TOKENS],
            PROVIDERS,
            EXTRAS,
        ),
        SummaryTable(
            "fused_add_rmsnorm",
            "fused_add_rmsnorm (bf16)",
            ["tokens", "D"],
            [
                (("fused_add_rmsnorm", n, d), [n, d], fused_add_rmsnorm_bytes(n, d), n <= TINY_TOKENS)
                for d in HIDDEN
                for n in TOKENS
            ],
            PROVIDERS,
            EXTRAS,
        ),
        SummaryTable(
            "fused_inplace_qknorm",
            f"fused_inplace_qknorm (bf16, Hq={HQ}, Hk={HK}, D={HEAD_DIM}, {qk_note})",
            ["tokens", "heads"],
            [
                (("fused_inplace_qknorm", n, HQ, HK, HEAD_DIM), [n, heads], qknorm_bytes(n), n <= TINY_TOKENS)
                for n in TOKENS
            ],
            PROVIDERS,
            EXTRAS,
        ),
        SummaryTable(
            "qknorm_across_heads",
            f"qknorm_across_heads (bf16, rows of {HQ * HEAD_DIM} and {HK * HEAD_DIM}, {qk_note})",
            ["tokens", "heads"],
            [
                (("qknorm_across_heads", n, HQ, HK, HEAD_DIM), [n, heads], qknorm_bytes(n), n <= TINY_TOKENS)
                for n in TOKENS
            ],
            PROVIDERS,
            EXTRAS,
        ),
    ]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_norm", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
