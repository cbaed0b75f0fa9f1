"""Shared benchmark helpers: the seed's ``benchmark/utils.py`` API (``sglang.jit_kernel.benchmark.utils``:
``run_benchmark`` returning ``(median_us, max_us, min_us)``, ``run_benchmark_no_cudagraph``,
``DEFAULT_QUANTILES``, ``create_empty``, ``create_random``, ``get_benchmark_range``, ``is_in_ci``,
and from 0.5.16 ``multigpu_bench_main``, the torchrun entry point of multi-GPU scripts, in
``multigpu.py``) plus this package's report plumbing.

Kernel benchmarks time with CUDA graphs (``triton.testing.do_bench_cudagraph``) after a warm-up and
report medians; each compares against the baselines a user would otherwise pick and against the
device-copy ceiling measured in the same run. Scripts declare ``triton.testing.perf_report``
benchmarks and run them through :func:`run_reports`, which writes the plots and CSVs to the directory
given by ``--save-path DIR`` or ``JIT_KERNEL_BENCH_OUT`` (see :func:`resolve_save_path`); with
``--json-dir DIR`` or ``BENCH_JSON_DIR`` they also write their results as JSON (``results.py``),
from which ``python -m jit_kernel.benchmark.report`` generates docs/benchmarks.md.

Nothing here touches CUDA or imports triton at import time.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import torch

from jit_kernel.benchmark.multigpu import multigpu_bench_main as multigpu_bench_main  # the seed's name
from jit_kernel.engine import env as package_env

T = TypeVar("T")

DEFAULT_DEVICE = "cuda"
DEFAULT_DTYPE = torch.bfloat16
L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H100: 50 MB)
SAVE_PATH_ENV = "JIT_KERNEL_BENCH_OUT"
DEFAULT_QUANTILES = [0.5, 0.2, 0.8]  # run_benchmark's (median, "min", "max") percentiles


def is_in_ci() -> bool:
    """CI-sized ranges when ``CI`` or ``JIT_KERNEL_BENCH_CI`` is set."""
    return package_env.in_ci()


def get_benchmark_range(full_range: list[T], ci_range: list[T]) -> list[T]:
    """``ci_range`` in CI, else ``full_range`` (the list given, not a copy)."""
    return ci_range if is_in_ci() else full_range


def create_empty(*shape: int, dtype: torch.dtype = DEFAULT_DTYPE, device: str = DEFAULT_DEVICE) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def create_random(*shape: int, dtype: torch.dtype = DEFAULT_DTYPE, device: str = DEFAULT_DEVICE) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device)


def run_benchmark(
    fn: Callable[[], object],
    quantiles: Sequence[float] = (),
    scale: float = 1.0,
    *,
    use_cuda_graph: bool = True,
    rep_ms: int = 100,
) -> tuple[float, float, float]:
    """Time ``fn``: ``(median_us, max_us, min_us)``, each divided by ``scale`` (e.g. the number of
    layers one call covers).

    ``quantiles`` are three quantiles in the order (median, low, high); the default
    :data:`DEFAULT_QUANTILES` makes "max" the 80th and "min" the 20th percentile. CUDA-graph replays
    (``triton.testing.do_bench_cudagraph``) by default, event-timed launches with
    ``use_cuda_graph=False``; ``rep_ms`` is the measuring time (100 ms; the seed used triton's
    default, 20 ms, with graphs).
    """
    import triton.testing

    quantiles = list(quantiles or DEFAULT_QUANTILES)
    if use_cuda_graph:
        ms, low_ms, high_ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=quantiles)
    else:
        ms, low_ms, high_ms = triton.testing.do_bench(fn, warmup=25, rep=rep_ms, quantiles=quantiles)
    return 1e3 * ms / scale, 1e3 * high_ms / scale, 1e3 * low_ms / scale


def run_benchmark_no_cudagraph(
    fn: Callable[[], object], quantiles: Sequence[float] = (), scale: float = 1.0
) -> tuple[float, float, float]:
    """:func:`run_benchmark` timing plain launches with CUDA events (for code a graph cannot capture)."""
    return run_benchmark(fn, quantiles, scale, use_cuda_graph=False)


def median_time_us(fn: Callable[[], object], *, use_cuda_graph: bool = True, rep_ms: int = 100) -> float:
    """The median of :func:`run_benchmark`, in microseconds: what the report tables show."""
    return run_benchmark(fn, use_cuda_graph=use_cuda_graph, rep_ms=rep_ms)[0]


def copy_fn(num_bytes: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """A device-to-device copy of ``num_bytes / 2`` bytes: ``num_bytes / 2`` read plus ``num_bytes / 2``
    written, the ceiling a memory-bound kernel moving ``num_bytes`` in all is compared against."""
    src = torch.empty(max(num_bytes // 2, 16), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def rotation_count(num_bytes: int) -> int:
    """How many copies of an op's inputs and outputs, used in turn, span :data:`L2_FLUSH_BYTES`:
    then no call finds the data of its previous call in L2, as a layer's op never does."""
    return max(1, -(-L2_FLUSH_BYTES // max(num_bytes, 1)))


def rotated(make: Callable[[], Callable[[], object]], copies: int) -> Callable[[], object]:
    """One callable running ``copies`` callables of ``make`` (each allocating its own inputs and
    outputs) in turn: one call of it is ``copies`` calls of the op."""
    calls = [make() for _ in range(copies)]

    def run() -> None:
        for call in calls:
            call()

    return run


def copy_time_us(num_bytes: int, device: str = DEFAULT_DEVICE) -> float:
    """CUDA-graph median time of :func:`copy_fn` (``num_bytes`` moved: half read, half written)."""
    return median_time_us(copy_fn(num_bytes, device))


def copy_ceiling_gbps(num_bytes: int, device: str = DEFAULT_DEVICE) -> float:
    """Device-to-device copy bandwidth (bytes read + bytes written per second) for a buffer of
    ``num_bytes``: the ceiling a memory-bound kernel moving that many bytes is compared against."""
    moved = 2 * max(num_bytes // 2, 16)
    return gbps(moved, copy_time_us(num_bytes, device))


def gbps(num_bytes: int, us: float) -> float:
    return num_bytes / (us * 1e-6) / 1e9


# ---------------------------------------------------------------------------------------------
# perf_report plumbing: where the plots go, and running a script's reports


class PerfReport(Protocol):
    """What ``triton.testing.perf_report`` returns (``triton.testing.Mark``)."""

    benchmarks: Any

    def run(self, show_plots: bool = ..., print_data: bool = ..., save_path: str = ..., **kwargs: Any) -> Any: ...


def bench_arg_parser(description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--save-path",
        metavar="DIR",
        default=None,
        help=f"write the PNG plots, CSVs and the markdown summary here (default: ${SAVE_PATH_ENV}; unset: print only)",
    )
    parser.add_argument(
        "--json-dir",
        metavar="DIR",
        default=None,
        help="write the results as DIR/<script>.json for jit_kernel.benchmark.report (default: $BENCH_JSON_DIR)",
    )
    return parser


def resolve_save_path(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, description: str | None = None
) -> str | None:
    """The directory for plots and CSVs: ``--save-path DIR``, else ``$JIT_KERNEL_BENCH_OUT``, else None
    (print only). An empty value counts as unset."""
    args = bench_arg_parser(description).parse_args(argv)
    if args.save_path:
        return str(args.save_path)
    env = os.environ if environ is None else environ
    return env.get(SAVE_PATH_ENV) or None


def plot_names(reports: Sequence[PerfReport]) -> list[str]:
    """The ``plot_name`` of every Benchmark of ``reports``, in run order (one PNG and CSV each)."""
    names = []
    for report in reports:
        benchmarks = report.benchmarks if isinstance(report.benchmarks, (list, tuple)) else [report.benchmarks]
        names.extend(bench.plot_name for bench in benchmarks)
    return names


def run_reports(reports: Sequence[PerfReport], save_path: str | None) -> None:
    """Run every perf_report, printing its table; with ``save_path``, triton writes ``<plot_name>.png``
    and ``<plot_name>.csv`` there, and ``results.html`` shows every plot of the script."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if save_path:
        os.makedirs(save_path, exist_ok=True)  # triton saves the PNG before it creates the directory
    for report in reports:
        report.run(print_data=True, save_path=save_path or "")
        plt.close("all")  # triton never closes its figures
    if save_path:
        # Each Mark.run rewrote results.html with its own plots only: list them all.
        with open(os.path.join(save_path, "results.html"), "w") as html:
            html.write("<html><body>\n")
            html.writelines(f'<image src="{name}.png"/>\n' for name in plot_names(reports))
            html.write("</body></html>\n")


def write_summary(save_path: str | None, filename: str, text: str) -> None:
    """Save the markdown summary next to the plots (nothing without a save path)."""
    if save_path:
        os.makedirs(save_path, exist_ok=True)
        with open(os.path.join(save_path, filename), "w") as f:
            f.write(text)
