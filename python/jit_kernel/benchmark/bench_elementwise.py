# ruff: noqa: B023  (every lambda is timed before the loop variables change)
"""scale (run-time factor) and add_constant (vectorized path) against torch eager, torch.compile
and the copy ceiling. Minimal bytes: read once, write once (2 * N * elem).

    python -m jit_kernel.benchmark.bench_elementwise
"""

from __future__ import annotations

import torch

import jit_kernel
from jit_kernel.benchmark._tables import (
    COMPARISON_HEADER,
    allow_recompiles,
    comparison_cells,
    device_name,
    empty_kernel_us,
    table,
    time_or_nan,
)
from jit_kernel.benchmark.utils import copy_ceiling_gbps, get_benchmark_range

SIZES = get_benchmark_range([1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26], [1 << 10, 1 << 24])


def _torch_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 0.75


def _torch_add(x: torch.Tensor) -> torch.Tensor:
    return x + 1


allow_recompiles()
_compiled_scale = torch.compile(_torch_scale, dynamic=False)
_compiled_add = torch.compile(_torch_add, dynamic=False)


def main() -> None:
    empty = empty_kernel_us()
    rows = []
    cases = [("scale", dt) for dt in (torch.bfloat16, torch.float16, torch.float32)] + [("add_constant", torch.int32)]
    for name, dtype in cases:
        for n in SIZES:
            if name == "scale":
                x = torch.randn(n, device="cuda").to(dtype)
                out = torch.empty_like(x)
                ours = time_or_nan(lambda: jit_kernel.scale(x, 0.75, out=out))
                eager = time_or_nan(lambda: _torch_scale(x))
                compiled = time_or_nan(lambda: _compiled_scale(x))
            else:
                x = torch.randint(0, 100, (n,), device="cuda", dtype=dtype)
                out = torch.empty_like(x)
                ours = time_or_nan(lambda: jit_kernel.add_constant(x, 1, out=out))
                eager = time_or_nan(lambda: _torch_add(x))
                compiled = time_or_nan(lambda: _compiled_add(x))
            nbytes = 2 * n * x.element_size()
            ceiling = copy_ceiling_gbps(nbytes)
            rows.append(
                [
                    name,
                    str(dtype).removeprefix("torch."),
                    n,
                    *comparison_cells(nbytes, ours, eager, compiled, ceiling, empty, tiny=n <= 16 * 8192),
                ]
            )
    print(f"\ndevice: {device_name()}; empty-kernel CUDA-graph replay: {empty:.2f} us")
    header = ["op", "dtype", "elements", *COMPARISON_HEADER]
    table("scale / add_constant", header, rows)


if __name__ == "__main__":
    main()
