# ruff: noqa: B023  (every lambda is timed before the loop variables change)
"""per_tensor_quant_fp8 (dynamic) against torch eager, torch.compile and the copy ceiling.

    python -m jit_kernel.benchmark.bench_quant

Minimal bytes: the input read once plus the fp8 output written (N * (elem + 1)); the dynamic
kernel actually reads the input twice (absmax pass, then quantise pass).
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

FP8_MAX = 448.0
D = 4096
TOKENS = get_benchmark_range([1, 16, 128, 1024, 4096, 16384], [16, 4096])


def _torch_quant(x: torch.Tensor):
    s = x.abs().max().float() / FP8_MAX
    q = (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


allow_recompiles()
_compiled_quant = torch.compile(_torch_quant, dynamic=False)


def main() -> None:
    empty = empty_kernel_us()
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n in TOKENS:
            x = torch.randn(n, D, device="cuda", dtype=dtype)
            q = torch.empty(n, D, device="cuda", dtype=torch.float8_e4m3fn)
            s = torch.empty(1, device="cuda")
            nbytes = x.numel() * (x.element_size() + 1)
            ceiling = copy_ceiling_gbps(nbytes)
            ours = time_or_nan(lambda: jit_kernel.per_tensor_quant_fp8(x, q, s))
            eager = time_or_nan(lambda: _torch_quant(x))
            compiled = time_or_nan(lambda: _compiled_quant(x))
            rows.append(
                [
                    str(dtype).removeprefix("torch."),
                    f"{n}x{D}",
                    *comparison_cells(nbytes, ours, eager, compiled, ceiling, empty, tiny=n <= 16),
                ]
            )
    print(f"\ndevice: {device_name()}; empty-kernel CUDA-graph replay: {empty:.2f} us")
    header = ["dtype", "shape", *COMPARISON_HEADER]
    table("per_tensor_quant_fp8, dynamic", header, rows)


if __name__ == "__main__":
    main()
