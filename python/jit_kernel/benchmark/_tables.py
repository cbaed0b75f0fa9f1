"""Helpers shared by the norm / quant / elementwise benchmarks: the providers every one of them
compares, the memo of measured times that the perf_report plots and the markdown summary share, the
derived columns of that summary (pure functions), a torch.compile baseline that reads "n/a" when it
fails, and the empty-kernel reference for tiny inputs.

Nothing here touches CUDA or imports triton at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark.utils import gbps, median_time_us

# provider -> (line name in the plot, (colour, line style)). A script copies this into its own
# ``PROVIDERS`` (the one place its providers are listed) and may add entries, e.g. "jit_nopdl"; it
# names those in its ``EXTRAS`` (provider -> summary label) to give each two summary columns.
STANDARD_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    "jit": ("jit_kernel", ("tab:blue", "-")),
    "eager": ("torch eager", ("tab:orange", "--")),
    "compile": ("torch.compile", ("tab:green", "-.")),
    "copy": ("device copy (ceiling)", ("tab:gray", ":")),
}

# Columns every norm / quant / elementwise summary row ends with, after its own key columns.
COMPARISON_HEADER = [
    "jit us",
    "eager us",
    "compile us",
    "copy us",
    "jit GB/s",
    "% ceiling",
    "vs eager",
    "vs compile",
    "vs empty",
]


def extra_header(extras: Mapping[str, str]) -> list[str]:
    """Summary columns of a script's extra providers: each one's time, and that time over jit's
    ("vs <label>": above 1.00x, jit_kernel's default is faster)."""
    return [column for label in extras.values() for column in (f"{label} us", f"vs {label}")]


def line_names(providers: Mapping[str, tuple[str, tuple[str, str]]]) -> list[str]:
    return [name for name, _ in providers.values()]


def line_styles(providers: Mapping[str, tuple[str, tuple[str, str]]]) -> list[tuple[str, str]]:
    return [style for _, style in providers.values()]


def provider_benchmark(
    providers: Mapping[str, tuple[str, tuple[str, str]]],
    *,
    x_name: str,
    x_vals: Sequence[int],
    xlabel: str,
    plot_name: str,
    args: dict[str, object],
) -> Any:
    """A log-log ``triton.testing.Benchmark`` in us with one line per provider of ``providers``."""
    import triton.testing

    return triton.testing.Benchmark(
        x_names=[x_name],
        x_vals=list(x_vals),
        x_log=True,
        y_log=True,
        xlabel=xlabel,
        line_arg="provider",
        line_vals=list(providers),
        line_names=line_names(providers),
        styles=line_styles(providers),
        ylabel="us",
        plot_name=plot_name,
        args=args,
    )


# ---------------------------------------------------------------------------------------------
# Derived columns (pure)


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value) or value <= 0


def format_us(us: float, digits: int = 1) -> str:
    return "n/a" if _missing(us) else f"{us:.{digits}f}"


def ratio_cell(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as ``"1.23x"``; "n/a" when either time is missing."""
    if _missing(numerator) or _missing(denominator):
        return "n/a"
    return f"{numerator / denominator:.2f}x"


def percent_of_ceiling(ours_us: float, copy_us: float) -> float:
    """Our bandwidth as a share of the copy's for the same bytes: ``copy_us / ours_us`` (1.0 = 100%)."""
    return copy_us / ours_us


def comparison_cells(
    nbytes: int, ours: float, eager: float, compiled: float, copy: float, empty: float, tiny: bool
) -> list[str]:
    """Times (us), our GB/s of the minimal bytes, % of the copy ceiling (copy time / our time), the
    speed-ups over eager and compile, and, only for tiny inputs, our time in empty-kernel replays."""
    ours_missing = _missing(ours)
    return [
        format_us(ours),
        format_us(eager),
        format_us(compiled),
        format_us(copy),
        "n/a" if ours_missing else f"{gbps(nbytes, ours):.0f}",
        "n/a" if ours_missing or _missing(copy) else f"{100 * percent_of_ceiling(ours, copy):.0f}%",
        ratio_cell(eager, ours),
        ratio_cell(compiled, ours),
        ratio_cell(ours, empty) if tiny else "",
    ]


def comparison_row(
    times: Mapping[str, float], nbytes: int, empty: float, tiny: bool, extras: Mapping[str, str] | None = None
) -> list[str]:
    """:func:`comparison_cells` of one config's ``provider -> us`` (a missing provider reads "n/a"),
    then the :func:`extra_header` columns of ``extras``."""
    nan = float("nan")
    ours = times.get("jit", nan)
    empty = times.get(EMPTY_PROVIDER, empty)  # measured beside ours when paired
    cells = comparison_cells(
        nbytes, ours, times.get("eager", nan), times.get("compile", nan), times.get("copy", nan), empty, tiny
    )
    for provider in extras or {}:
        cells += [format_us(times.get(provider, nan)), ratio_cell(times.get(provider, nan), ours)]
    return cells


@dataclasses.dataclass(frozen=True)
class SummaryTable:
    """One table of a script's summary: ``configs`` holds ``(key, key cells, minimal bytes, tiny)``
    per row, ``key_columns`` names the key cells; ``providers`` are the script's (labels for the
    JSON), ``extras`` the providers given two columns each after the standard ones."""

    name: str
    title: str
    key_columns: Sequence[str]
    configs: Sequence[tuple[Hashable, Sequence[object], int, bool]]
    providers: Mapping[str, tuple[str, tuple[str, str]]]
    extras: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def header(self) -> list[str]:
        return [*self.key_columns, *COMPARISON_HEADER, *extra_header(self.extras)]


def tables_markdown(tables: Sequence[SummaryTable], results: Measurements, empty: float) -> str:
    """The markdown summary: one :func:`format_table` per table, rows from :func:`summary_rows`."""
    return "\n".join(
        format_table(table.title, table.header(), summary_rows(results, table.configs, empty, table.extras))
        for table in tables
    )


def tables_json(tables: Sequence[SummaryTable], results: Measurements, empty: float) -> list[dict[str, Any]]:
    """The same tables for the JSON results: per measured config, every provider's median us, its
    share of the copy ceiling and, for tiny configs, the paired empty kernel (see :mod:`results`)."""
    out = []
    for table in tables:
        labels = {provider: label for provider, (label, _) in table.providers.items()}
        rows = [
            result_files.provider_row(columns, times, nbytes, tiny, list(labels), empty, EMPTY_PROVIDER)
            for key, columns, nbytes, tiny in table.configs
            if (times := results.for_config(key))
        ]
        out.append(result_files.provider_table(table.name, table.title, table.key_columns, labels, rows))
    return out


def format_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Measuring


def time_or_nan(fn: Callable[[], object]) -> float:
    try:
        fn()  # compile / warm up outside the graph
        torch.cuda.synchronize()
        return median_time_us(fn)
    except Exception as error:  # e.g. torch.compile unavailable on this machine
        if result_files.stop_requested():  # an interrupt the clean-up turned into this error
            raise KeyboardInterrupt from error
        print(f"<!-- baseline failed: {type(error).__name__}: {str(error)[:200]} -->")
        return float("nan")


def time_case(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
    """Build one provider's callable for one config (allocating its inputs) and time it; nan on failure."""
    try:
        fn = make()
    except Exception as error:  # e.g. out of memory
        if result_files.stop_requested():
            raise KeyboardInterrupt from error
        print(f"<!-- {provider} {key}: setup failed: {type(error).__name__}: {str(error)[:200]} -->")
        return float("nan")
    return time_or_nan(fn)


Timer = Callable[[Hashable, str, Callable[[], Callable[[], object]]], float]


def sweep_timer(rep_ms: int) -> Timer:
    """A sweep's timer: the CUDA-graph median of one form's call, measured for ``rep_ms``, after one
    checked call (a failing form raises: it is a bug, not a row)."""

    def timer(key: Hashable, form: str, make: Callable[[], Callable[[], object]]) -> float:
        fn = make()
        fn()
        torch.cuda.synchronize()
        return median_time_us(fn, rep_ms=rep_ms)

    return timer


# The provider key under which Measurements keeps the empty kernel's time beside each jit time.
EMPTY_PROVIDER = "empty"


class Measurements:
    """Times measured by a script's perf_report functions, memoized by (config, provider), so the
    markdown summary reads the very numbers the plots show instead of measuring again.

    With a ``reference`` (:meth:`paired`), every jit measurement is bracketed by two measurements of
    the empty kernel, whose mean is kept as provider :data:`EMPTY_PROVIDER` of that config: a
    graph-replayed launch's time follows the GPU's state (the first graphs of a process replay
    faster than later ones, the empty kernel and ours alike), so "vs empty" compares two times taken
    together, not one taken at the end of the run."""

    def __init__(self, timer: Timer = time_case, reference: Callable[[], float] | None = None) -> None:
        self.timer = timer
        self.reference = reference
        self.times: dict[tuple[Hashable, str], float] = {}

    @classmethod
    def paired(cls) -> Measurements:
        """Measured with :func:`time_case`, jit times bracketed by the empty kernel's."""
        return cls(time_case, empty_kernel_now_us)

    def time(self, key: Hashable, provider: str, make: Callable[[], Callable[[], object]], calls: int = 1) -> float:
        """The median us of ``provider`` at config ``key``; measured on the first request only.
        ``calls``: how many calls of the op one call of ``make``'s callable makes (each on inputs
        of its own, see :func:`rotated`); the time kept is per call."""
        result_files.check_stop()
        if (key, provider) not in self.times:
            paired = self.reference is not None and provider == "jit"
            before = self.reference() if paired else math.nan
            self.times[(key, provider)] = self.timer(key, provider, make) / calls
            if paired:
                self.times[(key, EMPTY_PROVIDER)] = (before + self.reference()) / 2
        return self.times[(key, provider)]

    def for_config(self, key: Hashable) -> dict[str, float]:
        """``provider -> us`` of every provider measured at ``key`` (empty if none was)."""
        return {provider: us for (k, provider), us in self.times.items() if k == key}


def summary_rows(
    results: Measurements,
    configs: Sequence[tuple[Hashable, Sequence[object], int, bool]],
    empty: float,
    extras: Mapping[str, str] | None = None,
) -> list[list[object]]:
    """One row per measured config: ``configs`` holds ``(key, key columns, minimal bytes, tiny)``."""
    rows: list[list[object]] = []
    for key, columns, nbytes, tiny in configs:
        times = results.for_config(key)
        if times:
            rows.append([*columns, *comparison_row(times, nbytes, empty, tiny, extras)])
    return rows


# ---------------------------------------------------------------------------------------------
# Baselines and references


def allow_recompiles() -> None:
    """One static-shape torch.compile graph per benchmarked shape: dynamo's default limit (8)
    would silently fall back to eager for the rest of the grid."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 1024)


@functools.cache
def compile_static(fn: Callable[..., object]) -> Callable[..., object]:
    """``torch.compile(fn, dynamic=False)``, made once per function, with the recompile limit raised."""
    allow_recompiles()
    return torch.compile(fn, dynamic=False)


_EMPTY: list[float] = []


def empty_kernel_us() -> float:
    """CUDA-graph replay time of the empty-kernel reference: ``x.add_(1)`` on a 1-element float32
    tensor, as in bench_dispatch and bench_versions. Not our add_constant, which, PDL-chained to
    itself, replays faster than any kernel a user's model launches between two of ours: the decode
    targets are ratios to torch's launch."""
    if not _EMPTY:
        _EMPTY.append(empty_kernel_now_us())
    return _EMPTY[0]


def empty_kernel_now_us() -> float:
    """The empty-kernel reference (see :func:`empty_kernel_us`) measured now, not cached."""
    one = torch.zeros(1, device="cuda")
    return time_or_nan(lambda: one.add_(1))


def device_name() -> str:
    return torch.cuda.get_device_name()


CEILING = "ceiling"  # a provider computed per row: the row's minimal bytes / bandwidth + empty kernel
CEILING_LABEL = ("read ceiling", ("", ""))


READ_BYTES = 2 << 30  # the read that measures the read ceiling's bandwidth
READ_KEY = ("read", READ_BYTES)


def read_case(device: str = "cuda") -> Callable[[], object]:
    """A read of READ_BYTES: torch's sum over a float32 tensor of that size."""
    buffer = torch.zeros(READ_BYTES // 4, dtype=torch.float32, device=device)
    return lambda: buffer.sum()


def read_gbps(results: Measurements) -> float:
    """Read bandwidth (bytes read per second, GB/s) of a 2 GiB sum, measured once per run: the
    bandwidth of a kernel that only reads, the ceiling of the decode GEMMs and decode attention."""
    us = results.time(READ_KEY, "read", read_case)
    return math.nan if math.isnan(us) or us <= 0 else READ_BYTES / us / 1e3


READ_NOTE = "torch.sum over 2 GiB of float32, bytes read per second, measured in this run"


def add_read_ceilings(
    results: Measurements,
    tables: Sequence[SummaryTable],
    gbps: float,
    empty: float,
    ceiling_bytes: Callable[[Hashable, int], int],
) -> None:
    """Record each row's read ceiling, in the tables with a :data:`CEILING` provider, as that
    provider's time: ``ceiling_bytes(key, nbytes)`` at ``gbps`` plus the empty kernel measured beside
    the row's jit time (else ``empty``). Nothing without a bandwidth (NaN)."""
    if math.isnan(gbps):
        return
    for table in tables:
        if CEILING not in table.providers:
            continue
        for key, _, nbytes, _ in table.configs:
            times = results.for_config(key)
            if times:
                reference = times.get(EMPTY_PROVIDER, empty)
                results.times[(key, CEILING)] = ceiling_bytes(key, nbytes) / (gbps * 1e3) + reference


EMPTY_KERNEL_NOTE = '"vs empty" divides by the empty kernel measured beside each jit time'


def empty_kernel_line(empty: float) -> str:
    """The device line's words on the empty kernel measured at the end of a run."""
    return (
        f"empty-kernel CUDA-graph replay at the end of the run: {format_us(empty, 2)} us (1-element torch add_); "
        + EMPTY_KERNEL_NOTE
    )


@dataclasses.dataclass(frozen=True)
class ScriptOutput:
    """What a script prints and writes from its measurements: the rest of the device line, the
    markdown below it, the JSON tables, and notes for the JSON."""

    header: str
    markdown: str
    tables: Sequence[result_files.Json]
    notes: Sequence[str] = ()


def run_measured_script(
    name: str,
    description: str | None,
    argv: Sequence[str] | None,
    measure: Callable[[str | None], None],
    output: Callable[[float], ScriptOutput],
    *,
    empty_kernel: bool = True,
) -> None:
    """A benchmark script's main: ``measure(save_path)`` (its perf_reports, and what they are
    compared with), the empty kernel (when ``empty_kernel``), then ``output(empty)`` printed and saved
    as markdown and, with ``--json-dir DIR`` (or ``$BENCH_JSON_DIR``), written as ``DIR/<name>.json``.

    Interrupted (Ctrl-C, or SIGINT from ``run_all`` at the script's time bound), it still writes
    what it measured, marked incomplete, and exits with status 130."""
    from jit_kernel.benchmark.utils import SAVE_PATH_ENV, bench_arg_parser, write_summary

    args = bench_arg_parser(description).parse_args(argv)
    save_path = args.save_path or os.environ.get(SAVE_PATH_ENV) or None
    json_dir = result_files.resolve_json_dir(args.json_dir)
    command = result_files.command_line(name, argv)
    torch.manual_seed(0)
    complete, empty = True, math.nan
    with result_files.stoppable():
        try:
            measure(save_path)
            if empty_kernel:
                empty = empty_kernel_us()
        except KeyboardInterrupt:
            complete = False
        except Exception:
            if not result_files.stop_requested():
                raise
            complete = False
    out = output(empty)
    text = f"device: {device_name()}; torch {torch.__version__}; {out.header}\n\n{out.markdown}"
    if not complete:
        text = "interrupted: the tables hold what was measured before the stop\n\n" + text
    print("\n" + text)
    write_summary(save_path, f"{name}.md", text)
    if json_dir:
        doc = result_files.document(
            name,
            result_files.first_paragraph(description),
            command,
            out.tables,
            complete=complete,
            notes=out.notes,
            empty_kernel_us=empty if empty_kernel else None,
        )
        print(f"results: {result_files.write(json_dir, doc)}")
    if not complete:
        raise SystemExit(130)


def run_script(
    name: str,
    description: str | None,
    argv: Sequence[str] | None,
    reports: Sequence[object],
    results: Callable[[], Measurements],
    tables: Callable[[], Sequence[SummaryTable]],
) -> None:
    """A benchmark script's main for perf_reports summarised by ``tables()`` over ``results()``
    (see :func:`run_measured_script`)."""
    from jit_kernel.benchmark.utils import run_reports

    def output(empty: float) -> ScriptOutput:
        measured, declared = results(), tables()
        return ScriptOutput(
            empty_kernel_line(empty), tables_markdown(declared, measured, empty), tables_json(declared, measured, empty)
        )

    run_measured_script(name, description, argv, lambda save_path: run_reports(reports, save_path), output)


# ---------------------------------------------------------------------------------------------
# Speed targets checked on the rows of summary tables, and the summary tables' markdown


# The targets table: what each speed target is, where it applies, how many rows met it, the worst.
TARGET_HEADER = ["target", "rows", "met", "worst row", "worst"]
TARGETS_TITLE = "targets, checked on this run"


@dataclasses.dataclass(frozen=True)
class Target:
    """A speed target checked on every row of ``tables`` that ``applies`` to: ``value(times)`` (None
    where a time is missing) against ``bound``, met when at least it (or at most, ``at_most``)."""

    text: str
    tables: tuple[str, ...]
    value: Callable[[Mapping[str, float]], float | None]
    bound: float
    at_most: bool = False
    applies: Callable[[Sequence[Any]], bool] = lambda columns: True
    unit: str = "x"

    def met(self, value: float) -> bool:
        return value <= self.bound if self.at_most else value >= self.bound


def time_ratio(numerator: str, denominator: str) -> Callable[[Mapping[str, float]], float | None]:
    def value(times: Mapping[str, float]) -> float | None:
        a, b = times.get(numerator, math.nan), times.get(denominator, math.nan)
        return None if math.isnan(a) or math.isnan(b) or a <= 0 or b <= 0 else a / b

    return value


def jit_us(times: Mapping[str, float]) -> float | None:
    us = times.get("jit", math.nan)
    return None if math.isnan(us) or us <= 0 else us


def target_rows(results: Measurements, tables: Sequence[SummaryTable], targets: Sequence[Target]) -> list[list[str]]:
    """Per target: the rows it applies to, how many were measured and met it, and the worst row (named
    by its key columns, after the last word of its table's name where the target spans tables)."""
    by_name = {table.name: table for table in tables}
    rows = []
    for target in targets:
        checked: list[tuple[float, str]] = []
        applicable = 0
        for name in target.tables:
            table = by_name[name]
            prefix = [] if len(target.tables) == 1 else [name.rsplit("_", 1)[-1]]
            for key, columns, _, _ in table.configs:
                times = results.for_config(key)
                if not times or not target.applies(columns):
                    continue
                applicable += 1
                value = target.value(times)
                if value is not None:
                    cells = [f"{column} {cell}" for column, cell in zip(table.key_columns, columns, strict=True)]
                    checked.append((value, ", ".join([*prefix, *cells])))
        if not checked:
            rows.append([target.text, str(applicable), "n/a", "", "n/a"])
            continue
        worst = max(checked) if target.at_most else min(checked)
        met = sum(target.met(value) for value, _ in checked)
        number = f"{worst[0]:.2f}{target.unit}"
        rows.append([target.text, str(applicable), f"{met} of {len(checked)}", worst[1], number])
    return rows


def _cell(times: Mapping[str, float], provider: str, ours: float) -> str:
    us = times.get(provider, math.nan)
    if provider == "jit":
        return format_us(us, 2)
    return "n/a" if math.isnan(us) else f"{format_us(us, 2)} ({ratio_cell(us, ours)})"


def summary_tables_markdown(results: Measurements, tables: Sequence[SummaryTable]) -> str:
    """Each table: key columns, jit_kernel's time, then every other provider's time and its time over
    ours (above 1.00x, jit_kernel is faster), and "vs empty" on the rows marked tiny."""
    out = []
    for table in tables:
        providers = list(table.providers)
        header = [*table.key_columns, *(f"{table.providers[p][0]} us" for p in providers), "vs empty"]
        rows = []
        for key, columns, _, tiny in table.configs:
            times = results.for_config(key)
            if not times:
                continue
            ours = times.get("jit", math.nan)
            vs_empty = ratio_cell(ours, times.get(EMPTY_PROVIDER, math.nan)) if tiny else ""
            rows.append([*columns, *(_cell(times, p, ours) for p in providers), vs_empty])
        out.append(format_table(table.title, header, rows))
    return "\n".join(out)


def targets_markdown(rows: Sequence[Sequence[str]]) -> str:
    return format_table(TARGETS_TITLE, TARGET_HEADER, rows)
