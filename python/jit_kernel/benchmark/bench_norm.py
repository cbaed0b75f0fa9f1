# ruff: noqa: B023  (every lambda is timed before the loop variables change)
"""rmsnorm, fused_add_rmsnorm and fused_inplace_qknorm against torch eager, torch.compile and the
device-copy ceiling measured in the same run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_norm            # full grid
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_norm   # CI-sized

Minimal bytes: rmsnorm reads the input and writes the output once (2 * N * D * elem, plus the
weight); fused_add_rmsnorm reads input and residual and writes both (4 * N * D * elem); qknorm
reads and writes q and k once (2 * N * (Hq + Hk) * D * elem).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import jit_kernel
from jit_kernel.benchmark._tables import (
    COMPARISON_HEADER,
    StreamingTable,
    allow_recompiles,
    comparison_cells,
    device_name,
    empty_kernel_us,
    time_or_nan,
)
from jit_kernel.benchmark.utils import copy_ceiling_gbps, get_benchmark_range

EPS = 1e-6
DT = torch.bfloat16
TOKENS = get_benchmark_range([1, 16, 1024, 4096, 16384], [1, 16, 4096])
HIDDEN = get_benchmark_range([1024, 2048, 4096, 5120, 7168, 8192], [4096])


def _torch_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _torch_fused_add(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> None:
    r.add_(x)
    x.copy_(F.rms_norm(r, (r.shape[-1],), w, EPS))


def _torch_qk(q: torch.Tensor, k: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor):
    d = q.shape[-1]
    return F.rms_norm(q, (d,), qw, EPS), F.rms_norm(k, (d,), kw, EPS)


allow_recompiles()
_compiled_rmsnorm = torch.compile(_torch_rmsnorm, dynamic=False)
_compiled_fused = torch.compile(_torch_fused_add, dynamic=False)


def _torch_qk_inplace(q, k, qw, kw) -> None:
    d = q.shape[-1]
    q.copy_(F.rms_norm(q, (d,), qw, EPS))
    k.copy_(F.rms_norm(k, (d,), kw, EPS))


_compiled_qk = torch.compile(_torch_qk_inplace, dynamic=False)


def _row(n, d, nbytes, ours, eager, compiled, ceiling, empty):
    return [n, d, *comparison_cells(nbytes, ours, eager, compiled, ceiling, empty, tiny=n <= 16)]


HEADER = ["tokens", "D", *COMPARISON_HEADER]


def bench_rmsnorm() -> None:
    empty = empty_kernel_us()
    print(f"\ndevice: {device_name()}; empty-kernel CUDA-graph replay: {empty:.2f} us")
    plain = StreamingTable("rmsnorm (bf16)", HEADER)
    for d in HIDDEN:
        for n in TOKENS:
            x = torch.randn(n, d, device="cuda", dtype=DT)
            w = torch.randn(d, device="cuda", dtype=DT)
            out = torch.empty_like(x)
            nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
            ceiling = copy_ceiling_gbps(nbytes)
            ours = time_or_nan(lambda: jit_kernel.rmsnorm(x, w, EPS, out=out))
            eager = time_or_nan(lambda: _torch_rmsnorm(x, w))
            compiled = time_or_nan(lambda: _compiled_rmsnorm(x, w))
            plain.add(_row(n, d, nbytes, ours, eager, compiled, ceiling, empty))
    fused = StreamingTable("fused_add_rmsnorm (bf16)", HEADER)
    for d in HIDDEN:
        for n in TOKENS:
            x = torch.randn(n, d, device="cuda", dtype=DT)
            w = torch.randn(d, device="cuda", dtype=DT)
            r = torch.randn_like(x)
            nbytes = 4 * x.numel() * x.element_size() + w.numel() * w.element_size()
            ceiling = copy_ceiling_gbps(nbytes)
            ours = time_or_nan(lambda: jit_kernel.fused_add_rmsnorm(x, r, w, EPS))
            eager = time_or_nan(lambda: _torch_fused_add(x, r, w))
            compiled = time_or_nan(lambda: _compiled_fused(x, r, w))
            fused.add(_row(n, d, nbytes, ours, eager, compiled, ceiling, empty))


def bench_qknorm(hq: int = 32, hk: int = 8, d: int = 128) -> None:
    empty = empty_kernel_us()
    t = StreamingTable(
        f"fused_inplace_qknorm (bf16, Hq={hq}, Hk={hk}, D={d}, q/k slices of qkv; eager = the two "
        "out-of-place F.rms_norm calls, compile = in-place version)",
        HEADER,
    )
    for n in TOKENS:
        qkv = torch.randn(n, (hq + 2 * hk) * d, device="cuda", dtype=DT)
        q = qkv[:, : hq * d].view(n, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
        qw, kw = torch.randn(d, device="cuda", dtype=DT), torch.randn(d, device="cuda", dtype=DT)
        nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
        ceiling = copy_ceiling_gbps(nbytes)
        ours = time_or_nan(lambda: jit_kernel.fused_inplace_qknorm(q, k, qw, kw, EPS))
        eager = time_or_nan(lambda: _torch_qk(q, k, qw, kw))
        compiled = time_or_nan(lambda: _compiled_qk(q, k, qw, kw))
        t.add(_row(n, f"{hq}+{hk}x{d}", nbytes, ours, eager, compiled, ceiling, empty))


if __name__ == "__main__":
    bench_qknorm()
    bench_rmsnorm()
