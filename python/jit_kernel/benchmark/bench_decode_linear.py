"""Decode GEMMs: jit_kernel.decode_linear against cuBLAS (torch.nn.functional.linear) on the linear
layers of Llama-3-8B, Llama-3-70B at tensor-parallel 8, Qwen3-8B and Qwen3-30B-A3B, at 1 to 16 rows,
each against the read ceiling of its weight measured in the same run. Times are medians in
microseconds of CUDA-graph replays, per call.

    python -m jit_kernel.benchmark.bench_decode_linear                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_decode_linear            # CI-sized grid
    python -m jit_kernel.benchmark.bench_decode_linear --save-path bench-out/gemm       # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_decode_linear --json-dir bench-json            # + JSON results (report.py)

Shapes, bf16 weights ``[N, K]`` as ``nn.Linear`` holds them (``N x K``): Llama-3-8B's fused q/k/v
6144 x 4096, o 4096 x 4096, fused gate/up 28672 x 4096, down 4096 x 14336 and the LM head 128256 x
4096; Llama-3-70B at tensor-parallel 8: o 8192 x 1024, q/k/v 1280 x 8192, gate/up 7168 x 8192, down
8192 x 3584; Qwen3-8B (its q/k/v and o are Llama-3-8B's): gate/up 24576 x 4096, down 4096 x 12288,
the LM head 151936 x 4096; Qwen3-30B-A3B: q/k/v 5120 x 2048, o 2048 x 4096, the router 128 x 2048,
the LM head 151936 x 2048. Rows (tokens): 1, 4 and 16 (the CI-sized grid, the one
docs/benchmarks.md shows; full grid: 1, 2, 4, 8, 16). Input rows ``randn``, weights ``N(0, 1 /
K)``. "jit_kernel runs" says what ``decode_linear`` runs for the layer: its kernel, or cuBLAS where
its rule (``decode_linear_serves``) gives the shape to cuBLAS.

Weights out of L2: a timed call runs the op over copies of the weight in turn (distinct tensors, as
many as it takes to span 256 MB, at most 512), so that no call finds its weight in L2, as a layer's
weight never is in a decode step; the time kept is per op call. The input rows are shared, and stay
in L2 as the previous layer's output would. Both providers run on the same copies. jit_kernel's
calls are launched with PDL (its default on sm_90+): each call's first weight loads overlap the tail
of the call before it, as they overlap the kernel before a layer in a model.

Read ceiling: the weight's bytes at the read bandwidth measured once in the run (``torch.sum`` over
a 2 GiB float32 tensor, bytes read per second); "% of ceiling" is that time over jit_kernel's.

Targets, each checked on the same run and printed with the tables: jit_kernel within 88% of the read
ceiling for weights of 50 MB and more and within 75% for 16 to 50 MB, at least as fast as cuBLAS on
every row, and 1.25x cuBLAS where cuBLAS reaches less than 70% of the read ceiling.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import torch
import triton.testing

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
    provider_benchmark,
    ratio_cell,
    read_gbps,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, get_benchmark_range, rotation_count
from jit_kernel.ops.gemm import decode_linear_serves

DTYPE = torch.bfloat16
ROWS = get_benchmark_range([1, 2, 4, 8, 16], [1, 4, 16])
# model -> (layer, N, K) of each linear layer (N x K weights)
MODELS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "Llama-3-8B": (
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
        ("lm_head", 128256, 4096),
    ),
    "Llama-3-70B TP8": (
        ("o", 8192, 1024),
        ("qkv", 1280, 8192),
        ("gate_up", 7168, 8192),
        ("down", 8192, 3584),
    ),
    # Qwen3-8B's q/k/v and o are Llama-3-8B's shapes (32 heads of 128, 8 KV heads, hidden 4096).
    "Qwen3-8B": (
        ("gate_up", 24576, 4096),
        ("down", 4096, 12288),
        ("lm_head", 151936, 4096),
    ),
    # Qwen3-30B-A3B: hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts (the router);
    # the experts' GEMMs are the MoE kernels'.
    "Qwen3-30B-A3B": (
        ("qkv", 5120, 2048),
        ("o", 2048, 4096),
        ("router", 128, 2048),
        ("lm_head", 151936, 2048),
    ),
}
LAYERS: list[tuple[str, str, int, int]] = [
    (model, layer, n, k) for model, layers in MODELS.items() for layer, n, k in layers
]
MAX_COPIES = 512  # weight copies a timed call cycles through: 256 MB of Qwen3-30B-A3B's router
TARGET_SHARE = 0.88  # of the read ceiling, for weights of TARGET_MIN_BYTES and more
TARGET_MIN_BYTES = 50 * 10**6
MID_TARGET_SHARE = 0.75  # of the read ceiling, for weights of MID_TARGET_MIN_BYTES up to TARGET_MIN_BYTES
MID_TARGET_MIN_BYTES = 16 * 10**6
WEAK_CUBLAS_SHARE = 0.70  # where cuBLAS reaches less of the read ceiling, jit_kernel is to be 1.25x it
WEAK_CUBLAS_SPEEDUP = 1.25

# provider -> (line name in the plots, (colour, line style)); the labels are the tables' columns.
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    "jit": ("jit_kernel", ("tab:blue", "-")),
    "cublas": ("cuBLAS (F.linear)", ("tab:red", "--")),
}


def _slug(model: str) -> str:
    return model.replace(" ", "-").replace(".", "")


def weight_bytes(n: int, k: int) -> int:
    return n * k * DTYPE.itemsize


def copies(n: int, k: int) -> int:
    """Weight copies one timed call runs over: enough to span the rotation's 256 MB, at most 512."""
    return min(MAX_COPIES, rotation_count(weight_bytes(n, k)))


# ---------------------------------------------------------------------------------------------
# Inputs and the ops measured


@functools.lru_cache(maxsize=1)
def weights(n: int, k: int, device: str = DEFAULT_DEVICE) -> tuple[torch.Tensor, ...]:
    """The copies of one shape's weight, kept while that shape's rows and providers are measured."""
    return tuple(
        torch.empty(n, k, dtype=DTYPE, device=device).normal_(0.0, 1.0 / math.sqrt(k)) for _ in range(copies(n, k))
    )


def linear_case(provider: str, n: int, k: int, rows: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """One provider's call over every copy of the weight, on one ``[rows, k]`` input."""
    ws = weights(n, k, device)
    x = torch.randn(rows, k, device=device).to(DTYPE)
    if provider == "jit":
        op = jit_kernel.decode_linear  # looked up when a case is built (so that a test can stand in for it)
        return lambda: [op(x, w) for w in ws]
    if provider == "cublas":
        linear = torch.nn.functional.linear
        return lambda: [linear(x, w) for w in ws]
    raise ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


RESULTS = Measurements()


def ceiling_us(n: int, k: int, gbps: float) -> float:
    """The weight's bytes at ``gbps``."""
    return math.nan if math.isnan(gbps) or gbps <= 0 else weight_bytes(n, k) / (gbps * 1e3)


def _key(model: str, layer: str, rows: int) -> tuple[str, str, str, int]:
    return ("linear", model, layer, rows)


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = rows, one line per provider, one benchmark per layer


@triton.testing.perf_report(
    [
        provider_benchmark(
            PROVIDERS,
            x_name="rows",
            x_vals=ROWS,
            xlabel=f"rows ({model} {layer}: [rows, {k}] x [{n}, {k}]^T, bf16)",
            plot_name=f"decode_linear-{_slug(model)}-{layer}",
            args={"model": model, "layer": layer, "n": n, "k": k},
        )
        for model, layer, n, k in LAYERS
    ]
)
def bench_decode_linear(rows: int, model: str, layer: str, n: int, k: int, provider: str) -> float:
    return RESULTS.time(
        _key(model, layer, rows), provider, lambda: linear_case(provider, n, k, rows), calls=copies(n, k)
    )


REPORTS = [bench_decode_linear]


# ---------------------------------------------------------------------------------------------
# Tables and targets, from the measurements the reports made

HEADER = [
    "layer",
    "N x K",
    "weight MB",
    "rows",
    "jit_kernel runs",
    "jit_kernel us",
    "cuBLAS us",
    "cuBLAS / ours",
    "read ceiling us",
    "% of ceiling",
]


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured (layer, rows): the times and the ceiling in us (nan where missing)."""

    model: str
    layer: str
    n: int
    k: int
    rows: int
    jit: float
    cublas: float
    ceiling: float

    def share(self) -> float:
        return self.ceiling / self.jit if self.jit > 0 and self.ceiling > 0 else math.nan

    def speedup(self) -> float:
        return self.cublas / self.jit if self.jit > 0 and self.cublas > 0 else math.nan

    def path(self) -> str:
        """What jit_kernel.decode_linear runs for this layer: its kernel, or cuBLAS by its rule."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode():  # contiguous tensors: the rule by shape
            x = torch.empty(self.rows, self.k, dtype=DTYPE, device="cuda")
            w = torch.empty(self.n, self.k, dtype=DTYPE, device="cuda")
            return "kernel" if decode_linear_serves(x, w) else "cuBLAS (rule)"

    def cells(self) -> list[object]:
        share = self.share()
        return [
            self.layer,
            f"{self.n} x {self.k}",
            f"{weight_bytes(self.n, self.k) / 1e6:.1f}",
            self.rows,
            self.path(),
            format_us(self.jit, 2),
            format_us(self.cublas, 2),
            ratio_cell(self.cublas, self.jit),
            format_us(self.ceiling, 2),
            "n/a" if math.isnan(share) else f"{100 * share:.0f}%",
        ]


def measured_rows(results: Measurements, gbps: float) -> list[Row]:
    out = []
    for model, layer, n, k in LAYERS:
        for rows in ROWS:
            times = results.for_config(_key(model, layer, rows))
            if not times:
                continue
            nan = math.nan
            jit, cublas = times.get("jit", nan), times.get("cublas", nan)
            out.append(Row(model, layer, n, k, rows, jit, cublas, ceiling_us(n, k, gbps)))
    return out


def target_rows(rows: Sequence[Row]) -> list[list[str]]:
    """Per target: the rows it applies to, how many were measured and met it, and the worst row."""
    targets: list[tuple[str, Callable[[Row], bool], Callable[[Row], float], float]] = [
        (
            f"decode_linear, weights >= {TARGET_MIN_BYTES // 10**6} MB: "
            f">= {100 * TARGET_SHARE:.0f}% of the read ceiling",
            lambda r: weight_bytes(r.n, r.k) >= TARGET_MIN_BYTES,
            Row.share,
            TARGET_SHARE,
        ),
        (
            f"decode_linear, weights of {MID_TARGET_MIN_BYTES // 10**6}-{TARGET_MIN_BYTES // 10**6} MB: "
            f">= {100 * MID_TARGET_SHARE:.0f}% of the read ceiling",
            lambda r: MID_TARGET_MIN_BYTES <= weight_bytes(r.n, r.k) < TARGET_MIN_BYTES,
            Row.share,
            MID_TARGET_SHARE,
        ),
        (
            "decode_linear >= 1.0x cuBLAS (F.linear)",
            lambda r: True,
            Row.speedup,
            1.0,
        ),
        (
            f"decode_linear >= {WEAK_CUBLAS_SPEEDUP:.2f}x cuBLAS where cuBLAS is below "
            f"{100 * WEAK_CUBLAS_SHARE:.0f}% of the read ceiling",
            lambda r: r.cublas > 0 and r.ceiling / r.cublas < WEAK_CUBLAS_SHARE,
            Row.speedup,
            WEAK_CUBLAS_SPEEDUP,
        ),
    ]
    out = []
    for text, applies, value, bound in targets:
        applicable = [r for r in rows if applies(r)]
        checked = [(v, r) for r in applicable if not math.isnan(v := value(r))]
        if not checked:
            out.append([text, str(len(applicable)), "n/a", "", "n/a"])
            continue
        worst, row = min(checked, key=lambda pair: pair[0])
        met = sum(v >= bound for v, _ in checked)
        where = f"{row.model} {row.layer}, rows {row.rows}"
        number = f"{100 * worst:.0f}%" if bound < 1 else f"{worst:.2f}x"
        out.append([text, str(len(applicable)), f"{met} of {len(checked)}", where, number])
    return out


def tables(rows: Sequence[Row]) -> list[tuple[str, str, list[list[object]]]]:
    """(name, title, cells) per model."""
    out = []
    for model in MODELS:
        cells = [r.cells() for r in rows if r.model == model]
        title = f"decode_linear, {model} linear layers (bf16): jit_kernel against cuBLAS and the read ceiling"
        out.append((_slug(model).lower(), title, cells))
    return out


def bandwidth_note(gbps: float) -> str:
    return (
        f"read ceiling: the weight's bytes at {format_us(gbps, 0)} GB/s ({READ_NOTE}); weights rotated out of "
        "L2 (copies spanning 256 MB)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """The perf_reports with the read bandwidth measured first, then the tables and the targets
    (``_tables.run_measured_script``; no empty kernel: every row is a ratio to the read ceiling)."""
    from jit_kernel.benchmark.utils import run_reports

    bandwidth = [math.nan]

    def measure(save_path: str | None) -> None:
        bandwidth[0] = read_gbps(RESULTS)
        run_reports(REPORTS, save_path)

    def output(empty: float) -> _tables.ScriptOutput:
        rows = measured_rows(RESULTS, bandwidth[0])
        declared = tables(rows)
        targets = target_rows(rows)
        note = bandwidth_note(bandwidth[0])
        json_tables = [result_files.cells_table(name, title, HEADER, cells) for name, title, cells in declared]
        json_tables.append(result_files.cells_table("targets", TARGETS_TITLE, TARGET_HEADER, targets))
        return _tables.ScriptOutput(
            note,
            "\n".join(format_table(title, HEADER, cells) for _, title, cells in declared)
            + "\n"
            + format_table(TARGETS_TITLE, TARGET_HEADER, targets),
            json_tables,
            [note],
        )

    _tables.run_measured_script("bench_decode_linear", __doc__, argv, measure, output, empty_kernel=False)


if __name__ == "__main__":
    main()
