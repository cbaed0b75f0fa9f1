"""Helpers shared by the norm / quant / elementwise benchmarks: markdown tables, a torch.compile
baseline that falls back to "n/a", and the empty-kernel reference for tiny inputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from jit_kernel.benchmark.utils import gbps, run_benchmark

# Columns every norm / quant / elementwise row ends with, after its own key columns.
COMPARISON_HEADER = ["jit us", "eager us", "compile us", "jit GB/s", "% ceiling", "vs eager", "vs compile", "vs empty"]


def comparison_cells(
    nbytes: int, ours: float, eager: float, compiled: float, ceiling: float, empty: float, tiny: bool
) -> list[object]:
    """Times, bandwidth, % of the copy ceiling, and speed-ups; "vs empty" only for tiny inputs."""
    return [
        ours,
        eager,
        compiled,
        f"{gbps(nbytes, ours):.0f}",
        f"{100 * gbps(nbytes, ours) / ceiling:.0f}%",
        f"{eager / ours:.2f}x",
        f"{compiled / ours:.2f}x",
        f"{ours / empty:.2f}x" if tiny else "",
    ]


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row) + " |")


class StreamingTable:
    """Prints the header at once and every row as it is measured (a killed run keeps its rows)."""

    def __init__(self, title: str, header: Sequence[str]) -> None:
        print(f"\n### {title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---:" for _ in header) + "|", flush=True)

    def add(self, row: Sequence[object]) -> None:
        print("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row) + " |", flush=True)


def time_or_nan(fn: Callable[[], object]) -> float:
    try:
        fn()  # compile / warm up outside the graph
        torch.cuda.synchronize()
        return run_benchmark(fn)
    except Exception as error:  # e.g. torch.compile unavailable on this machine
        print(f"<!-- baseline failed: {type(error).__name__}: {str(error)[:200]} -->")
        return float("nan")


def allow_recompiles() -> None:
    """One static-shape torch.compile graph per benchmarked shape: dynamo's default limit (8)
    would silently fall back to eager for the rest of the grid."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)


_EMPTY: list[float] = []


def empty_kernel_us() -> float:
    """CUDA-graph replay time of a (nearly) empty kernel: add_constant on one int32."""
    if not _EMPTY:
        import jit_kernel

        one = torch.zeros(1, dtype=torch.int32, device="cuda")
        out = torch.empty_like(one)
        _EMPTY.append(time_or_nan(lambda: jit_kernel.add_constant(one, 1, out=out)))
    return _EMPTY[0]


def device_name() -> str:
    return torch.cuda.get_device_name()
