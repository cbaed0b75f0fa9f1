"""Shared benchmark helpers, in the style of the seeds' ``benchmark/utils.py``.

Kernel benchmarks time with CUDA graphs (``triton.testing.do_bench_cudagraph``) after a warm-up and
report medians; each compares against the baselines a user would otherwise pick and against the
device-copy ceiling measured in the same run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

DEFAULT_DEVICE = "cuda"
DEFAULT_DTYPE = torch.bfloat16
L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H100: 50 MB)


def is_in_ci() -> bool:
    """CI-sized ranges when ``CI`` or ``JIT_KERNEL_BENCH_CI`` is set."""
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("CI", "JIT_KERNEL_BENCH_CI"))


def get_benchmark_range(full_range: Sequence[T], ci_range: Sequence[T]) -> list[T]:
    return list(ci_range if is_in_ci() else full_range)


def run_benchmark(fn: Callable[[], object], *, use_cuda_graph: bool = True, rep_ms: int = 100) -> float:
    """Median time of ``fn`` in microseconds (CUDA-graph replays by default, events otherwise)."""
    import triton.testing

    if use_cuda_graph:
        ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    else:
        ms = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")
    return float(ms) * 1e3


def copy_ceiling_gbps(num_bytes: int, device: str = DEFAULT_DEVICE) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written per second) for a buffer of
    ``num_bytes``: the ceiling a memory-bound kernel moving that many bytes is compared against."""
    src = torch.empty(max(num_bytes // 2, 16), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    us = run_benchmark(lambda: dst.copy_(src))
    return 2 * src.numel() / (us * 1e-6) / 1e9


def gbps(num_bytes: int, us: float) -> float:
    return num_bytes / (us * 1e-6) / 1e9
