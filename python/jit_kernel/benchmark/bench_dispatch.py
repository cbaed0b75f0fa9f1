"""Dispatch overhead: ``add_constant`` vs calling its tvm-ffi function directly vs ``torch.add``.

Host-side cost of a call on a tiny tensor, timed with ``timeit`` (median of repeats), on the CPU
and, where there is one, on the GPU (where it is launch overhead; the kernel itself is ~2 us).

    python -m jit_kernel.benchmark.bench_dispatch
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable

import torch

import jit_kernel
from jit_kernel.ops import add_constant as op


def _median_us(fn: Callable[[], object], number: int = 20000, repeats: int = 7) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def measure(device: str) -> list[tuple[str, float]]:
    x = torch.arange(16, dtype=torch.int32, device=device)
    out = torch.empty_like(x)
    dispatcher = op._CUDA if device == "cuda" else op._HOST
    direct = dispatcher.function("run", (1,))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(fn: Callable[[], object]) -> float:
        us = _median_us(fn)
        sync()
        return us

    return [
        ("torch.add(x, 1)", timed(lambda: torch.add(x, 1))),
        ("tvm-ffi function, direct", timed(lambda: direct(out, x))),
        ("dispatcher lookup + call", timed(lambda: dispatcher.function("run", (1,))(out, x))),
        ("jit_kernel.add_constant(x, 1, out=out)", timed(lambda: jit_kernel.add_constant(x, 1, out=out))),
        ("jit_kernel.add_constant(x, 1)", timed(lambda: jit_kernel.add_constant(x, 1))),
    ]


def main() -> None:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        rows = dict(measure(device))
        print(f"\n{device}: 16-element int32 tensor, host time per call (median)")
        print("| call | us | vs torch.add |\n|---|---:|---:|")
        for name, us in rows.items():
            print(f"| {name} | {us:.2f} | {us / rows['torch.add(x, 1)']:.2f}x |")
        overhead = rows["dispatcher lookup + call"] - rows["tvm-ffi function, direct"]
        print(f"dispatch overhead above the direct tvm-ffi call: {overhead:.2f} us")


if __name__ == "__main__":
    main()
