"""Generate docs/benchmarks.md from the benchmarks' JSON results (``run_all`` or the scripts'
``--json-dir``)::

    python -m jit_kernel.benchmark.report --json-dir docs/benchmarks/data --output docs/benchmarks.md

The document is a pure function of the JSON files: an introduction (how to reproduce, device, driver
and versions, how to read the tables), a summary table, then one section per benchmark script with
its tables (jit_kernel against each peer, the share of the copy ceiling, decode latency against an
empty kernel) and, where matplotlib is installed, a plot per family written under
``docs/benchmarks/plots/`` (``--plots-dir``). Without matplotlib, or with ``--no-plots``, the
document has no plots and links none.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jit_kernel.benchmark import results
from jit_kernel.benchmark.run_all import MANIFEST, RUN_SCHEMA

Json = dict[str, Any]

DEFAULT_JSON_DIR = "docs/benchmarks/data"
DEFAULT_OUTPUT = "docs/benchmarks.md"
MAX_LINES = 800

# (script, section title, plot name). Scripts not listed follow in name order, titled by name.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("bench_norm", "Norms", "norm"),
    ("bench_activation", "Gated activations", "activation"),
    ("bench_rope", "Rotary embedding", "rope"),
    ("bench_kv_store", "KV-cache stores", "kv_store"),
    ("bench_token_quant", "Per-token and per-group fp8 quantization", "token_quant"),
    ("bench_quant", "Per-tensor fp8 quantization", "quant"),
    ("bench_norm_quant", "Fused RMSNorm + fp8 quantization, Gemma's RMSNorm", "norm_quant"),
    ("bench_moe", "MoE routing, align and combine", "moe"),
    ("bench_sampling", "Sampling: top-k, top-p and min-p", "sampling"),
    ("bench_decode_linear", "Decode GEMMs: decode_linear", "decode_linear"),
    ("bench_decode_linear_fp8", "Decode GEMMs: decode_linear_fp8", "decode_linear_fp8"),
    ("bench_decode_attention", "Decode attention and merge_attn_states", "decode_attention"),
    ("bench_elementwise", "Elementwise: scale and add_constant", "elementwise"),
    ("bench_hicache", "hicache KV-cache transfers", "hicache"),
    ("bench_dispatch", "Dispatch overhead", "dispatch"),
    ("bench_first_call", "First call and module load", "first_call"),
    ("bench_model", "Whole models: transformers decode steps and prefill", "model"),
)
# Providers that are someone else's code (the rest are jit_kernel variants, the copy ceiling, or
# compositions of our own ops).
PEERS = (
    "eager",
    "eager_hf",
    "compile",
    "flashinfer",
    "liger",
    "vllm_torch",
    "torch_topk",
    "sdpa_repeat_kv",
    "sdpa_gqa",
)
# Peers only some scripts compare against, named in the summary's sentence where a table has them:
# provider -> (the tables' family, the peer).
OTHER_PEERS = {
    "vllm_torch": ("sampling", "vLLM's torch sampler"),
    "torch_topk": ("sampling", "torch.topk + torch.multinomial"),
    "sdpa_repeat_kv": ("decode attention", "torch SDPA over repeat_kv'd heads"),
    "sdpa_gqa": ("decode attention", "torch SDPA with enable_gqa"),
}
ENVIRONMENT_LABELS = (
    ("torch", "torch"),
    ("triton", "triton"),
    ("cuda", "CUDA (torch build)"),
    ("tvm_ffi", "apache-tvm-ffi"),
    ("jit_kernel", "jit_kernel"),
    ("flashinfer", "FlashInfer"),
    ("liger_kernel", "Liger-Kernel"),
    ("python", "Python"),
)


# ---------------------------------------------------------------------------------------------
# Formatting


def _us(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _span(values: Sequence[float], fmt: Any) -> str:
    """``min-max`` of ``values`` formatted by ``fmt`` (one value if they agree), "" if none."""
    if not values:
        return ""
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low} - {high}"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], left: int = 1) -> list[str]:
    """A markdown table: the first ``left`` columns left-aligned, the others right-aligned."""
    align = ["---" if i < left else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join("" if cell is None else str(cell) for cell in row) + " |" for row in rows]
    return lines


def _public_command(command: str) -> str:
    """The script's command with its results folder written as ``DIR``."""
    return re.sub(r"--json-dir(=|\s+)\S+", r"--json-dir\1DIR", command)


# ---------------------------------------------------------------------------------------------
# Providers tables


def _others(table: Json) -> list[str]:
    """Providers shown as columns after ours: peers first, then our own variants."""
    providers = [p for p in table["providers"] if p not in ("jit", "copy")]
    return sorted(providers, key=lambda p: (p not in PEERS, PEERS.index(p) if p in PEERS else 0))


def provider_table_lines(table: Json) -> list[str]:
    """Key columns, jit_kernel's time, its share of the copy ceiling, its decode time over the
    empty kernel, then every other provider's time with its ratio to ours, then the copy's time."""
    labels = table["providers"]
    others = _others(table)
    tiny = any(row.get("tiny") for row in table["rows"])
    header = [*table["key_columns"], f"{labels.get('jit', 'jit_kernel')} us", "% of copy"]
    header += ["vs empty"] if tiny else []
    header += [f"{labels[p]} us" for p in others]
    header += ["copy us"] if "copy" in labels else []
    rows = []
    for row in table["rows"]:
        us, ours = row["us"], row["us"].get("jit")
        cells: list[object] = [*row["key"], _us(ours), _percent(row["of_copy_ceiling"].get("jit"))]
        if tiny:
            cells.append(_ratio(row.get("vs_empty")) if row.get("tiny") else "")
        for provider in others:
            theirs = us.get(provider)
            ratio = theirs / ours if theirs and ours else None
            cells.append("n/a" if theirs is None else f"{_us(theirs)} ({_ratio(ratio)})")
        if "copy" in labels:
            cells.append(_us(us.get("copy")))
        rows.append(cells)
    return _table(header, rows, left=len(table["key_columns"]))


def summary_row(table: Json) -> list[object] | None:
    """One line of the summary: decode time and its ratio to the empty kernel, the largest rows'
    share of the copy ceiling, and the fastest peer's time over ours at both sizes."""
    decode = [row for row in table["rows"] if row.get("tiny") and row["us"].get("jit")]
    large = [row for row in table["rows"] if not row.get("tiny") and row["us"].get("jit")]
    if not decode and not large:
        return None

    def peer_ratio(row: Json) -> float | None:
        peers = [row["us"][p] for p in PEERS if row["us"].get(p)]
        return min(peers) / row["us"]["jit"] if peers else None

    def ratios(rows: list[Json]) -> list[float]:
        return [r for r in map(peer_ratio, rows) if r is not None]

    return [
        table["name"],
        _span([row["us"]["jit"] for row in decode], _us),
        _span([row["vs_empty"] for row in decode if row.get("vs_empty")], _ratio),
        _span([row["of_copy_ceiling"]["jit"] for row in large if row["of_copy_ceiling"].get("jit")], _percent),
        _span(ratios(decode), _ratio),
        _span(ratios(large), _ratio),
    ]


SUMMARY_HEADER = [
    "op",
    "decode us",
    "decode vs empty",
    "prefill % of copy",
    "fastest peer / ours, decode",
    "fastest peer / ours, prefill",
]


# ---------------------------------------------------------------------------------------------
# Plots


def plot_provider_tables(doc: Json, path: Path) -> bool:
    """Bars per row and provider: each other provider's time over jit_kernel's (log scale, above
    1: ours is faster), one panel per table. False when there is nothing to plot."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    tables = [t for t in doc["tables"] if t["kind"] == "providers" and t["rows"]]
    if not tables:
        return False
    fig, axes = plt.subplots(len(tables), 1, figsize=(10, 2.6 * len(tables) + 0.6), squeeze=False)
    for ax, table in zip(axes[:, 0], tables, strict=True):
        others = _others(table)
        labels = [" / ".join(str(k) for k in row["key"]) for row in table["rows"]]
        width = 0.8 / max(len(others), 1)
        shown = [1.0]
        for i, provider in enumerate(others):
            values = []
            for row in table["rows"]:
                ours, theirs = row["us"].get("jit"), row["us"].get(provider)
                values.append(theirs / ours if ours and theirs else math.nan)
            shown += [v for v in values if not math.isnan(v)]
            positions = [x + (i - (len(others) - 1) / 2) * width for x in range(len(labels))]
            ax.bar(positions, values, width, label=table["providers"][provider])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(min(shown) / 1.5, max(shown) * 1.5)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel("time / jit_kernel's")
        ax.set_title(table["title"], fontsize=9)
        ax.legend(fontsize=7, ncol=3)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Each alternative's time over jit_kernel's (above 1: jit_kernel is faster)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_quota_sweep(doc: Json, path: Path) -> bool:
    """hicache: bandwidth against block_quota, host<->device and device->device panels."""
    import matplotlib.pyplot as plt

    table = next((t for t in doc["tables"] if t["name"] == "quota_sweep" and t["rows"]), None)
    if table is None:
        return False
    quota_columns = [(i, int(h[2:])) for i, h in enumerate(table["header"]) if re.fullmatch(r"q=\d+", h)]
    fig, (host_ax, dev_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for row in table["rows"]:
        ax = dev_ax if row[0] == "d2d" else host_ax
        values = [float(row[i]) for i, _ in quota_columns]
        ax.plot([q for _, q in quota_columns], values, marker="o", label=f"{row[0]} {row[1]} B")
    for ax, title in ((host_ax, "host <-> device"), (dev_ax, "device -> device")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([q for _, q in quota_columns], [str(q) for _, q in quota_columns])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("block_quota (blocks of 1024 threads)")
        ax.set_ylabel("GB/s")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(table["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _decode_tables(doc: Json) -> list[Json]:
    return [t for t in doc["tables"] if t["name"].endswith("_decode") and t["rows"]]


def plot_model_decode(doc: Json, path: Path) -> bool:
    """bench_model: a decode step's time per mode and batch, each variant a bar, one panel per model."""
    import matplotlib.pyplot as plt

    tables = _decode_tables(doc)
    if not tables:
        return False
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4), squeeze=False)
    for ax, table in zip(axes[0], tables, strict=True):
        columns = [(i, h.removesuffix(" us")) for i, h in enumerate(table["header"]) if h.endswith(" us")]
        labels = [f"{row[0]} b{row[1]}" for row in table["rows"]]
        width = 0.8 / len(columns)
        for k, (i, variant) in enumerate(columns):
            values = [_number(row[i]) / 1e3 for row in table["rows"]]
            positions = [x + (k - (len(columns) - 1) / 2) * width for x in range(len(labels))]
            ax.bar(positions, values, width, label=variant)
        ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=45)
        ax.set_ylabel("ms per decode step")
        ax.set_title(table["title"], fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("One decode step (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _number(cell: object) -> float:
    try:
        return float(str(cell))
    except ValueError:  # "n/a", an error cell
        return math.nan


# script -> (whether its data has a plot, the plotter); the other scripts plot their provider tables.
PLOTTERS = {
    "bench_hicache": (
        lambda doc: any(t["name"] == "quota_sweep" and t["rows"] for t in doc["tables"]),
        plot_quota_sweep,
    ),
    "bench_model": (lambda doc: bool(_decode_tables(doc)), plot_model_decode),
}


def device_and_notes_lines(doc: Json) -> list[str]:
    """The device a section was measured on and the script's notes (bench_sampling and
    bench_decode_attention: where their read ceilings come from)."""
    device = doc["environment"].get("device") or {}
    if device.get("name"):
        lines = [f"Device: {device['name']} (compute capability {device['capability']}, {device['sms']} SMs)."]
    else:
        lines = ["Device: no CUDA device."]
    notes = doc.get("notes") or []
    return lines + ([""] + [f"- {note}" for note in notes] if notes else [])


# script -> the lines its section adds after its command.
SECTION_LINES = {
    "bench_sampling": device_and_notes_lines,
    "bench_decode_attention": device_and_notes_lines,
    "bench_decode_linear": device_and_notes_lines,
    "bench_decode_linear_fp8": device_and_notes_lines,
}


def has_plot(doc: Json) -> bool:
    """Whether ``doc`` gets a plot (decided from the data alone, so the document does not depend
    on whether matplotlib ran)."""
    if doc["script"] in PLOTTERS:
        return PLOTTERS[doc["script"]][0](doc)
    return any(t["kind"] == "providers" and t["rows"] for t in doc["tables"])


def write_plots(docs: Sequence[Json], plots_dir: Path) -> list[Path]:
    """Write each family's plot as ``<plots_dir>/<family>.png`` and remove the folder's other PNGs
    (no plot outlives its data). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for doc in docs:
        if has_plot(doc):
            path = plots_dir / f"{family(doc['script'])[1]}.png"
            plotter = PLOTTERS[doc["script"]][1] if doc["script"] in PLOTTERS else plot_provider_tables
            plotter(doc, path)
            written.append(path)
    for stale in set(plots_dir.glob("*.png")) - set(written):
        stale.unlink()
    return written


# ---------------------------------------------------------------------------------------------
# The document


def family(script: str) -> tuple[str, str]:
    """(section title, plot name) of a script."""
    for name, title, plot in FAMILIES:
        if name == script:
            return title, plot
    short = script.removeprefix("bench_")
    return short, short


def _ordered(docs: Sequence[Json]) -> list[Json]:
    known = [name for name, _, _ in FAMILIES]
    return sorted(docs, key=lambda d: (known.index(d["script"]) if d["script"] in known else len(known), d["script"]))


def _common(docs: Sequence[Json], field: str) -> tuple[object, list[str]]:
    """The most common value of environment ``field`` and the scripts whose value differs."""
    values = [json.dumps(doc["environment"].get(field), sort_keys=True) for doc in docs]
    value = collections.Counter(values).most_common(1)[0][0]
    return json.loads(value), [doc["script"] for doc, v in zip(docs, values, strict=True) if v != value]


def environment_lines(docs: Sequence[Json]) -> list[str]:
    device, odd_device = _common(docs, "device")
    lines = []
    if device and device.get("name"):
        lines.append(f"- **Device**: {device['name']} (compute capability {device['capability']}, {device['sms']} SMs)")
    else:
        lines.append("- **Device**: no CUDA device")
    for field, label in (("driver", "NVIDIA driver"), ("commit", "Source commit")):
        value, _ = _common(docs, field)
        if value:
            lines.append(f"- **{label}**: {value}")
    grid, _ = _common(docs, "grid")
    if grid:
        lines.append("- **Grid**: " + ("CI-sized (`JIT_KERNEL_BENCH_CI=1`)" if grid == "ci" else "full"))
    versions = []
    odd: dict[str, list[str]] = {}
    absent: dict[str, list[str]] = {}
    for field, label in ENVIRONMENT_LABELS:
        value, scripts = _common(docs, field)
        if value:
            versions.append(f"{label} {value}")
        # A script that ran without the package (a peer not importable there) is not another version.
        without = {doc["script"] for doc in docs if doc["environment"].get(field) is None} if value else set()
        if without & set(scripts):
            absent[label] = [s for s in scripts if s in without]
        if set(scripts) - without:
            odd[label] = [s for s in scripts if s not in without]
    lines.append("- **Software**: " + ", ".join(versions))
    dates = sorted({doc.get("date") for doc in docs if doc.get("date")})
    if dates:
        lines.append(f"- **Measured**: {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else ""))
    if odd_device:
        lines.append(f"- Measured on another device: {', '.join(odd_device)}")
    for label, scripts in odd.items():
        lines.append(f"- Another {label} version: {', '.join(scripts)}")
    for label, scripts in absent.items():
        lines.append(f"- Without {label}: {', '.join(scripts)}")
    return lines


def _manifest(json_dir: Path) -> Json | None:
    try:
        data = json.loads((json_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == RUN_SCHEMA else None


READING = """\
How to read the tables:

- Kernel times are medians in microseconds of CUDA-graph replays (`triton.testing.do_bench_cudagraph`,
  100 ms of replays after a warm-up); every provider of a row was measured in the same process.
- "jit_kernel us" is the op as a user calls it. Every other provider's cell is its time and, in
  parentheses, its time over jit_kernel's: above 1.00x, jit_kernel is faster.
- "% of copy" is the time of a device-to-device copy of the op's minimal bytes (measured in the same
  run) over jit_kernel's time: 100% moves the bytes as fast as a plain copy. Above 100% appears where
  the data stay in L2 across replays. Tables of "inputs rotated" time each call on inputs no recent
  call left in L2 (copies spanning 256 MB, used in turn), the copy as well: there, % of copy is the
  share of the DRAM ceiling.
- "vs empty" (decode-sized rows) is jit_kernel's time over an empty kernel (a 1-element torch
  `add_`) replayed just before and after it: 1.00x is the cost of any launch.
- Decode-sized rows are those of up to 16 tokens (elementwise: up to 128K elements;
  moe_align_block_size: up to 1,024 token-expert pairs); the summary's "prefill" columns cover the
  other rows."""


def render(docs: Sequence[Json], manifest: Json | None = None, *, plots: str | None = None) -> str:
    """The markdown document. ``plots`` is the folder of the plots relative to the document (None:
    no plots)."""
    docs = _ordered(docs)
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m jit_kernel.benchmark.report` from the benchmarks' JSON results; "
        "edit the scripts or the generator, not this file. -->",
        "",
        "jit_kernel's kernels against what a user would otherwise call (torch eager, torch.compile and, "
        "where it has the op, FlashInfer), on one GPU, with the copy of the same bytes as the ceiling; "
        "then the host-side costs: dispatch per call, first call in a fresh process.",
        "",
        *(environment_lines(docs) if docs else ["No results."]),
        "",
        "To reproduce, with the package (and FlashInfer, for its columns) installed on a GPU machine:",
        "",
        "```bash",
        f"python -m jit_kernel.benchmark.run_all --json-dir {DEFAULT_JSON_DIR}",
        f"python -m jit_kernel.benchmark.report --json-dir {DEFAULT_JSON_DIR} --output {DEFAULT_OUTPUT}",
        "```",
        "",
        "On a GPU machine, `bash ci/bench-docs.sh` builds the package and runs both. `run_all` runs "
        "each script on its CI-sized grid within a time budget; each section gives its script's own command.",
    ]
    if manifest:
        entries = manifest.get("scripts", [])
        if entries:
            statuses = ", ".join(f"{e['script']} {e.get('seconds', 0):.0f} s" for e in entries)
            total = sum(e.get("seconds", 0) for e in entries)
            out += ["", f"Run time: {total:.0f} s for the scripts together, each from its latest run ({statuses})."]
    out += ["", READING]

    summary = [row for doc in docs for t in doc["tables"] if t["kind"] == "providers" if (row := summary_row(t))]
    if summary:
        present = {p for doc in docs for t in doc["tables"] if t["kind"] == "providers" for p in t["providers"]}
        named: dict[str, list[str]] = {}
        for provider, (where, label) in OTHER_PEERS.items():
            if provider in present:
                named.setdefault(where, []).append(label)
        others = "; ".join(f"{where}: also {' and '.join(labels)}" for where, labels in named.items())
        out += [
            "",
            "## Summary",
            "",
            "Ranges over each table's rows. The fastest peer is the fastest of torch eager (the norms: either "
            "torch form), torch.compile and FlashInfer in that row" + (f" ({others})." if others else "."),
            "",
            *_table(SUMMARY_HEADER, summary),
        ]

    by_script = {doc["script"]: doc for doc in docs}
    run_of = {doc["script"]: (doc.get("date"), doc["environment"].get("commit")) for doc in docs}
    usual_run = collections.Counter(run_of.values()).most_common(1)[0][0] if docs else None
    not_run = [
        entry
        for entry in (manifest or {}).get("scripts", [])
        if entry["script"] not in by_script and entry.get("status")
    ]
    for doc in docs:
        title, plot = family(doc["script"])
        out += ["", f"## {title}", "", doc["summary"], "", f"`{_public_command(doc['command'])}`"]
        if doc["script"] in SECTION_LINES:
            out += ["", *SECTION_LINES[doc["script"]](doc)]
        if run_of[doc["script"]] != usual_run:
            date, commit = run_of[doc["script"]]
            out += ["", f"_From another run than the other sections: {date}, commit {commit}._"]
        if not doc.get("complete", True):
            out += ["", "_The script stopped at its time bound: the rows below are those it measured._"]
        if doc.get("empty_kernel_us"):
            out += ["", f"Empty kernel at the end of the run: {_us(doc['empty_kernel_us'])} us."]
        if plots is not None and has_plot(doc):
            out += ["", f"![{title}]({plots}/{plot}.png)"]
        for table in doc["tables"]:
            out += ["", f"### {table['title']}", ""]
            if not table["rows"]:
                out.append("_No rows measured._")
            elif table["kind"] == "providers":
                out += provider_table_lines(table)
            else:
                out += _table(table["header"], table["rows"])
    if not_run:
        out += ["", "## Not in this run", ""]
        out += [f"- {entry['script']}: {entry['status']}" for entry in not_run]
    return "\n".join(out) + "\n"


def generate(
    json_dir: str | os.PathLike[str],
    output: str | os.PathLike[str],
    plots_dir: str | os.PathLike[str] | None = None,
    *,
    with_plots: bool = True,
) -> str:
    """Read ``json_dir``, write the plots (when ``with_plots`` and matplotlib is installed) and the
    document ``output``; return the document."""
    folder, out_path = Path(json_dir), Path(output)
    docs = results.load(folder)
    if not docs:
        raise SystemExit(f"no benchmark results (*.json of schema {results.SCHEMA}) in {folder}")
    plots_path = Path(plots_dir) if plots_dir else out_path.parent / "benchmarks" / "plots"
    relative: str | None = None
    if with_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("matplotlib is not installed: the document gets no plots")
        else:
            write_plots(docs, plots_path)
            relative = Path(os.path.relpath(plots_path, out_path.parent)).as_posix()
    text = render(docs, _manifest(folder), plots=relative)
    lines = text.count("\n")
    if lines > MAX_LINES:
        print(f"warning: {out_path} has {lines} lines, more than {MAX_LINES}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    print(f"wrote {out_path} ({lines} lines)")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-dir", default=DEFAULT_JSON_DIR, help=f"the JSON results (default {DEFAULT_JSON_DIR})")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help=f"the document (default {DEFAULT_OUTPUT})")
    parser.add_argument("--plots-dir", help="where the PNGs go (default: benchmarks/plots/ beside the document)")
    parser.add_argument("--no-plots", action="store_true", help="no plots, even with matplotlib")
    args = parser.parse_args(argv)
    generate(args.json_dir, args.output, args.plots_dir, with_plots=not args.no_plots)


if __name__ == "__main__":
    main()
