"""apply_rope_with_cos_sin_cache_inplace and fused_qknorm_rope against torch eager, torch.compile,
FlashInfer and a device-to-device copy of the same bytes, measured in the same run. Times are
CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_rope                                # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_rope          # CI-sized grid
    python -m jit_kernel.benchmark.bench_rope --save-path bench-out/rope     # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_rope --json-dir bench-json          # + JSON results (report.py)

Shape: NeoX style, bf16, 32 q heads and 8 kv heads of 128 (q ``[N, 4096]`` and k ``[N, 1024]``
contiguous), a ``[65536, 128]`` fp32 cos/sin cache, int64 positions drawn at random; tokens 1, 16,
1024, 4096, 16384 (CI-sized grid, the one docs/benchmarks.md shows: 16, 4096).

rope providers: ``jit`` (jit_kernel), ``eager`` (the rotation written with torch ops, computed in
fp32 and written back into q and k), ``compile`` (torch.compile of it, one static-shape graph per
shape), ``copy`` (a device-to-device copy moving the minimal bytes), ``flashinfer``
(``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace``; "n/a" where flashinfer is not
installed) and ``jit_nopdl`` (PDL off). fused_qknorm_rope providers: ``jit`` (the fused op),
``eager`` / ``compile`` (per-head RMSNorm then the rotation in torch), ``copy`` and ``two_launch``
(``fused_inplace_qknorm`` then ``apply_rope_with_cos_sin_cache_inplace``).

Minimal bytes (both ops): q and k read and written once, ``2 * N * (Hq + Hk) * D * 2``, plus one
cos/sin cache row per token, ``N * rotary_dim * 4``, plus the positions, ``N * 8`` (the weights of
the fused op, ``2 * D * 2``, are negligible and left out). In-place ops on a fresh buffer each
replay are not needed: the rotation of rotated data costs the same.
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
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range

DT = torch.bfloat16
HQ, HK, HEAD_DIM = 32, 8, 128
ROT = HEAD_DIM
MAX_POS = 65536
EPS = 1e-6
TOKENS = get_benchmark_range([1, 16, 1024, 4096, 16384], [16, 4096])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

ROPE_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "flashinfer": ("FlashInfer", ("tab:red", "-")),
    "jit_nopdl": ("jit_kernel, PDL off", ("tab:purple", ":")),
}
ROPE_EXTRAS = {"flashinfer": "FlashInfer", "jit_nopdl": "no-PDL"}
QKR_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "two_launch": ("qknorm + rope (two launches)", ("tab:red", "-")),
}
QKR_EXTRAS = {"two_launch": "two launches"}

RESULTS = Measurements.paired()


def rope_bytes(tokens: int, hq: int = HQ, hk: int = HK, head_dim: int = HEAD_DIM, rot: int = ROT) -> int:
    """q and k read and written once, one fp32 cos/sin row and one int64 position per token."""
    return 2 * tokens * (hq + hk) * head_dim * DT.itemsize + tokens * rot * 4 + tokens * 8


# ---------------------------------------------------------------------------------------------
# torch baselines


def _torch_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor) -> None:
    """NeoX rotation in fp32, written back in place (what the op computes)."""
    half = cache.shape[1] // 2
    rows = cache[positions]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    for x in (q, k):
        x3 = x.view(x.shape[0], -1, HEAD_DIM)
        a, b = x3[..., :half].float(), x3[..., half : 2 * half].float()
        x3[..., :half] = (a * cos - b * sin).to(x.dtype)
        x3[..., half : 2 * half] = (b * cos + a * sin).to(x.dtype)


def _torch_qknorm_rope(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, cache: torch.Tensor
) -> None:
    for x, w in ((q, qw), (k, kw)):
        x3 = x.view(x.shape[0], -1, HEAD_DIM)
        xf = x3.float()
        x3.copy_((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype))
    _torch_rope(positions, q, k, cache)


def _flashinfer_rope() -> Callable[..., None]:
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace  # may be missing: the case reads n/a

    return apply_rope_with_cos_sin_cache_inplace


def _inputs(tokens: int, device: str):
    q = torch.randn(tokens, HQ * HEAD_DIM, device=device, dtype=DT)
    k = torch.randn(tokens, HK * HEAD_DIM, device=device, dtype=DT)
    positions = torch.randint(0, MAX_POS, (tokens,), device=device, dtype=torch.int64)
    cache = torch.randn(MAX_POS, ROT, device=device, dtype=torch.float32)
    return positions, q, k, cache


def rope_case(provider: str, tokens: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(rope_bytes(tokens), device)
    positions, q, k, cache = _inputs(tokens, device)
    if provider == "jit":
        return lambda: jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, HEAD_DIM, cache, True)
    if provider == "jit_nopdl":
        return lambda: jit_kernel.apply_rope_with_cos_sin_cache_inplace(
            positions, q, k, HEAD_DIM, cache, True, enable_pdl=False
        )
    if provider == "flashinfer":
        fn = _flashinfer_rope()
        return lambda: fn(positions, q, k, HEAD_DIM, cache, True)
    if provider == "eager":
        return lambda: _torch_rope(positions, q, k, cache)
    if provider == "compile":
        compiled = compile_static(_torch_rope)
        return lambda: compiled(positions, q, k, cache)
    raise ValueError(f"unknown provider {provider!r}; known: {list(ROPE_PROVIDERS)}")


def qknorm_rope_case(provider: str, tokens: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(rope_bytes(tokens), device)
    positions, q, k, cache = _inputs(tokens, device)
    q3, k3 = q.view(tokens, HQ, HEAD_DIM), k.view(tokens, HK, HEAD_DIM)
    qw = torch.rand(HEAD_DIM, device=device, dtype=DT) + 0.5
    kw = torch.rand(HEAD_DIM, device=device, dtype=DT) + 0.5
    if provider == "jit":
        return lambda: jit_kernel.fused_qknorm_rope(q3, k3, qw, kw, positions, cache, EPS, True)

    if provider == "two_launch":

        def two() -> None:
            jit_kernel.fused_inplace_qknorm(q3, k3, qw, kw, EPS)
            jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q3, k3, HEAD_DIM, cache, True)

        return two
    if provider == "eager":
        return lambda: _torch_qknorm_rope(positions, q, k, qw, kw, cache)
    if provider == "compile":
        compiled = compile_static(_torch_qknorm_rope)
        return lambda: compiled(positions, q, k, qw, kw, cache)
    raise ValueError(f"unknown provider {provider!r}; known: {list(QKR_PROVIDERS)}")


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = tokens, one line per provider

_SHAPE = f"bf16-hq{HQ}-hk{HK}-d{HEAD_DIM}"


@triton.testing.perf_report(
    provider_benchmark(
        ROPE_PROVIDERS, x_name="tokens", x_vals=TOKENS, xlabel="tokens", plot_name=f"rope-neox-{_SHAPE}", args={}
    )
)
def bench_rope(tokens: int, provider: str) -> float:
    return RESULTS.time(("rope", tokens), provider, lambda: rope_case(provider, tokens))


@triton.testing.perf_report(
    provider_benchmark(
        QKR_PROVIDERS,
        x_name="tokens",
        x_vals=TOKENS,
        xlabel="tokens",
        plot_name=f"fused_qknorm_rope-neox-{_SHAPE}",
        args={},
    )
)
def bench_qknorm_rope(tokens: int, provider: str) -> float:
    return RESULTS.time(("qknorm_rope", tokens), provider, lambda: qknorm_rope_case(provider, tokens))


REPORTS = [bench_rope, bench_qknorm_rope]


def summary_tables() -> list[SummaryTable]:
    heads = f"{HQ}+{HK}x{HEAD_DIM}"
    return [
        SummaryTable(
            name,
            title,
            ["tokens", "heads"],
            [((op, n), [n, heads], rope_bytes(n), n <= TINY_TOKENS) for n in TOKENS],
            providers,
            extras,
        )
        for op, name, title, providers, extras in (
            (
                "rope",
                "apply_rope_with_cos_sin_cache_inplace",
                f"apply_rope_with_cos_sin_cache_inplace (NeoX, bf16, {heads}, fp32 cache)",
                ROPE_PROVIDERS,
                ROPE_EXTRAS,
            ),
            (
                "qknorm_rope",
                "fused_qknorm_rope",
                f"fused_qknorm_rope (NeoX, bf16, {heads}, fp32 cache)",
                QKR_PROVIDERS,
                QKR_EXTRAS,
            ),
        )
    ]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_rope", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
