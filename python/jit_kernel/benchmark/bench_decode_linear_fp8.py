"""fp8 block-scaled decode GEMMs: jit_kernel.decode_linear_fp8 against torch._scaled_mm with the same
1 x 128 activation and 128 x 128 weight scales (cuBLAS's blockwise fp8 GEMM), on the linear layers of
DeepSeek-V3, Qwen3-8B-FP8 and Llama-3-8B (fp8 weights [N, K], one byte an element), at 1 to 16 rows,
each against the read ceiling of its weight measured in the same run. Times are medians in
microseconds of CUDA-graph replays, per call.

    python -m jit_kernel.benchmark.bench_decode_linear_fp8                # full grid
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_decode_linear_fp8  # rows 1, 4, 16
    python -m jit_kernel.benchmark.bench_decode_linear_fp8 --json-dir bench-json    # + JSON results (report.py)

Weights out of L2 as in bench_decode_linear: a timed call runs the op over copies of the weight and
its scales in turn (as many as span 256 MB, at most 20); the input rows and their scales are shared.
``_scaled_mm`` takes the input scales column-major (``[M, K / 128]`` at strides ``(1, M)``) and the
weight scales as ``weight_scale.t()``; jit_kernel reads the same tensors. cuBLAS refuses a row count
that is not a multiple of 4 there (CUBLAS_STATUS_NOT_SUPPORTED), so its 1- and 2-row calls run on the
rows padded with zeros to 4, as jit_kernel's own fallback does. Where this torch and cuBLAS
have no blockwise fp8 GEMM, its column reads n/a.

Read ceiling: the fp8 weight's bytes (N * K, plus its scales) at the read bandwidth of a 2 GiB
float32 sum measured once in the run; "% of ceiling" is that time over jit_kernel's.

Targets, checked on the same run and printed with the tables: jit_kernel at 60% of the read ceiling
or more on every row, and at least as fast as torch._scaled_mm on every row where it runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

import jit_kernel
from jit_kernel.benchmark import _tables
from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark._tables import (
    READ_NOTE,
    TARGET_HEADER,
    TARGETS_TITLE,
    Measurements,
    format_table,
    format_us,
    ratio_cell,
    read_gbps,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, get_benchmark_range, rotation_count
from jit_kernel.ops.gemm import SCALED_MM_ROW_ALIGN

FP8 = torch.float8_e4m3fn
BLOCK = 128
ROWS = get_benchmark_range([1, 2, 4, 8, 16], [1, 4, 16])
# model -> (layer, N, K) of each linear layer
MODELS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "DeepSeek-V3": (
        ("q_a", 1536, 7168),
        ("q_b", 24576, 1536),
        ("kv_a", 576, 7168),
        ("o", 7168, 16384),
        ("dense gate_up", 36864, 7168),
        ("dense down", 7168, 18432),
    ),
    "Qwen3-8B-FP8": (
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 24576, 4096),
        ("down", 4096, 12288),
    ),
    "Llama-3-8B": (
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ),
}
MAX_COPIES = 20
TARGET_SHARE = 0.60
PROVIDERS = ("jit", "scaled_mm")


def _blocks(size: int) -> int:
    return -(-size // BLOCK)


def weight_bytes(n: int, k: int) -> int:
    """The fp8 weight and its float32 block scales."""
    return n * k + 4 * _blocks(n) * _blocks(k)


def copies(n: int, k: int) -> int:
    return min(MAX_COPIES, rotation_count(weight_bytes(n, k)))


@functools.lru_cache(maxsize=1)
def weights(n: int, k: int, device: str = DEFAULT_DEVICE) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
    """Copies of one shape's fp8 weight ~ N(0, 1) and its scales (in [0.5, 1.5) / sqrt(K))."""
    return tuple(
        (
            torch.randn(n, k, device=device).to(FP8),
            (torch.rand(_blocks(n), _blocks(k), device=device) + 0.5) / math.sqrt(k),
        )
        for _ in range(copies(n, k))
    )


def linear_case(provider: str, n: int, k: int, rows: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """One provider's call over every copy of the weight, on one quantised ``[rows, k]`` input whose
    scales are column-major (the layout both providers take)."""
    ws = weights(n, k, device)
    q = torch.randn(rows, k, device=device).to(FP8)
    scales = (torch.rand(_blocks(k), rows, device=device) + 0.5).t()  # [rows, K / 128] at strides (1, rows)
    if provider == "jit":
        op = jit_kernel.decode_linear_fp8
        return lambda: [op(q, scales, w, s) for w, s in ws]
    if provider == "scaled_mm":
        # cuBLAS takes the column-major input scales only at a row count that keeps their columns on
        # 16 bytes: fewer rows run padded to SCALED_MM_ROW_ALIGN, as a caller of _scaled_mm pads them.
        padded = -(-rows // SCALED_MM_ROW_ALIGN) * SCALED_MM_ROW_ALIGN
        qp = torch.cat([q, q.new_zeros(padded - rows, k)]) if padded != rows else q
        sp = (torch.rand(_blocks(k), padded, device=device) + 0.5).t()
        scaled_mm = torch._scaled_mm
        return lambda: [scaled_mm(qp, w.t(), scale_a=sp, scale_b=s.t(), out_dtype=torch.bfloat16) for w, s in ws]
    raise ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


RESULTS = Measurements()

HEADER = ["layer", "N x K", "weight MB", "rows", "jit_kernel us", "_scaled_mm us", "_scaled_mm / ours",
          "read ceiling us", "% of ceiling"]  # fmt: skip


def _slug(model: str) -> str:
    return model.replace(" ", "-").replace(".", "").lower()


def measure(results: Measurements, gbps: float) -> tuple[list[tuple[str, str, list[list[object]]]], list[list[str]]]:
    """Every (layer, rows) of :data:`MODELS` timed for both providers: the tables (name, title,
    cells) per model and the targets' rows, from the same measurements."""
    tables, measured = [], []
    for model, layers in MODELS.items():
        cells: list[list[object]] = []
        for layer, n, k in layers:
            for rows in ROWS:
                key = ("linear_fp8", model, layer, rows)
                times = {
                    p: results.time(
                        key, p, lambda p=p, n=n, k=k, rows=rows: linear_case(p, n, k, rows), calls=copies(n, k)
                    )
                    for p in PROVIDERS
                }
                ceiling = weight_bytes(n, k) / (gbps * 1e3) if gbps > 0 else math.nan
                share = ceiling / times["jit"] if times["jit"] > 0 else math.nan
                speedup = times["scaled_mm"] / times["jit"] if times["jit"] > 0 else math.nan
                measured.append((f"{model} {layer}, rows {rows}", share, speedup))
                cells.append([
                    layer, f"{n} x {k}", f"{weight_bytes(n, k) / 1e6:.1f}", rows, format_us(times["jit"], 2),
                    format_us(times["scaled_mm"], 2), ratio_cell(times["scaled_mm"], times["jit"]),
                    format_us(ceiling, 2), "n/a" if math.isnan(share) else f"{100 * share:.0f}%",
                ])  # fmt: skip
        title = f"decode_linear_fp8, {model} linear layers (fp8 e4m3, 128 x 128 blocks, bf16 out)"
        tables.append((_slug(model), title, cells))
    targets = []
    for text, index, bound in (
        (f"decode_linear_fp8 >= {100 * TARGET_SHARE:.0f}% of the read ceiling", 1, TARGET_SHARE),
        ("decode_linear_fp8 >= 1.0x torch._scaled_mm", 2, 1.0),
    ):
        checked = [(m[index], m[0]) for m in measured if not math.isnan(m[index])]
        if not checked:
            targets.append([text, str(len(measured)), "n/a", "", "n/a"])
            continue
        worst, where = min(checked)
        met = sum(value >= bound for value, _ in checked)
        number = f"{100 * worst:.0f}%" if bound < 1 else f"{worst:.2f}x"
        targets.append([text, str(len(measured)), f"{met} of {len(checked)}", where, number])
    return tables, targets


def main(argv: Sequence[str] | None = None) -> None:
    """The read bandwidth, then every row, then the tables and the targets, printed and (with
    ``--json-dir``) written as JSON (``_tables.run_measured_script``; no empty kernel: every row is
    a ratio to the read ceiling)."""
    results = RESULTS
    measured: list[tuple[list[tuple[str, str, list[list[object]]]], list[list[str]]]] = []
    bandwidth = [math.nan]

    def run(save_path: str | None) -> None:
        bandwidth[0] = read_gbps(results)
        measured.append(measure(results, bandwidth[0]))

    def output(empty: float) -> _tables.ScriptOutput:
        declared, targets = measured[0] if measured else ([], [])
        note = (
            f"read ceiling: the fp8 weight's bytes (and its block scales) at {format_us(bandwidth[0], 0)} GB/s "
            f"({READ_NOTE}); weights rotated out of L2 (copies spanning 256 MB)"
        )
        json_tables = [result_files.cells_table(name, title, HEADER, cells) for name, title, cells in declared]
        json_tables.append(result_files.cells_table("targets", TARGETS_TITLE, TARGET_HEADER, targets))
        markdown = "\n".join(format_table(title, HEADER, cells) for _, title, cells in declared)
        return _tables.ScriptOutput(
            note, markdown + "\n" + format_table(TARGETS_TITLE, TARGET_HEADER, targets), json_tables, [note]
        )

    _tables.run_measured_script("bench_decode_linear_fp8", __doc__, argv, run, output, empty_kernel=False)


if __name__ == "__main__":
    main()
