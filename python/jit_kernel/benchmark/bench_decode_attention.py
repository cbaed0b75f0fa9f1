"""decode_attention against torch's scaled_dot_product_attention (over repeat_kv'd KV heads, as
transformers' SDPA path calls it, and with its grouped heads, enable_gqa=True) and the read ceiling of
the K and V caches, and merge_attn_states against torch eager, torch.compile and the copy ceiling,
measured in the same run. Times are medians in microseconds of CUDA-graph replays.

    python -m jit_kernel.benchmark.bench_decode_attention                                  # print only
    python -m jit_kernel.benchmark.bench_decode_attention --save-path bench-out/attention  # + PNG plots, CSVs
    python -m jit_kernel.benchmark.bench_decode_attention --json-dir bench-json            # + JSON (report.py)
    python -m jit_kernel.benchmark.bench_decode_attention --split-sweep                    # the split counts

decode_attention: one query token per sequence, Llama-3-8B's attention (32 query heads, 8 KV heads,
head dim 128, bf16) over a StaticCache of batch x context ``[B, 8, context, 128]`` K and V caches,
every sequence at the full context; batch 1, 8, 32 x context 1,024, 8,192, 32,768 (the full and the
CI-sized grid alike). Providers: ``jit`` (``jit_kernel.decode_attention(q, k_cache, v_cache,
seq_lens)``); ``sdpa_repeat_kv`` (each KV head expanded to its 4 query heads, a copy of K and V, then
``F.scaled_dot_product_attention`` of the ``[B, 32, 1, 128]`` query); ``sdpa_gqa`` (the same call on
the 8 KV heads with ``enable_gqa=True``); ``copy`` (a device copy of the op's minimal bytes, read and
written); and ``ceiling`` (computed, not measured): the minimal bytes, K and V read once, at the
read bandwidth measured once in the run (a sum over 2 GiB of float32, bytes read per second), plus
the empty kernel measured beside the row's jit time. "vs empty" (our time in empty-kernel replays)
is shown for the rows of at most 32 MiB of K and V.

merge_attn_states: two ``[N, 32, 128]`` bf16 results with their float32 LSEs into one, N 1, 16, 256,
4096 (CI-sized grid: 16, 4096); ``jit``, ``eager`` (the formula in torch: max, exp, a weighted sum in
float32), ``compile`` (torch.compile of it) and ``copy`` (its minimal bytes: both inputs and their
LSEs read, the output and its LSE written). "vs empty" is shown up to 16 tokens.

Targets, checked on the same run and printed after the tables: decode_attention within 2x the read
ceiling and at least as fast as the faster SDPA form at every point, merge_attn_states at 90% of
the copy ceiling at 4,096 tokens.

``--split-sweep`` times decode_attention's own launch (``DecodeAttention::run_with`` of
csrc/attention/decode.cuh, one module) with each split count of 1, 2, 4, 8, 12, 16, 24, 32 and 64
(those of at least ``kMinSplitKeys`` keys each) and each merge (the second kernel; up to 16
splits, a cluster as the scheduler places it and one it is asked to spread over SMs) at the grid's
shapes, beside the op (the launcher's own choice, named) and SDPA
enable_gqa: per shape the fastest form, and a table of every time (docs/design/attention.md).
``--rep-ms N`` sets each median's measuring time (default 60).
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F
import triton.testing

import jit_kernel
from jit_kernel.benchmark import _tables
from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark._tables import (
    CEILING,
    CEILING_LABEL,
    READ_NOTE,
    STANDARD_PROVIDERS,
    TARGET_HEADER,
    TARGETS_TITLE,
    Measurements,
    SummaryTable,
    Target,
    Timer,
    compile_static,
    device_name,
    format_table,
    format_us,
    provider_benchmark,
    read_gbps,
    summary_tables_markdown,
    sweep_timer,
    target_rows,
    targets_markdown,
    time_ratio,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range
from jit_kernel.engine import env, families

DTYPE = torch.bfloat16
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
BATCHES = [1, 8, 32]
CONTEXTS = [1024, 8192, 32768]
TINY_KV_BYTES = 32 << 20  # "vs empty" is shown for rows of at most this many bytes of K and V
MERGE_TOKENS = get_benchmark_range([1, 16, 256, 4096], [16, 4096])
TINY_TOKENS = 16

# provider -> (line name in the plots, (colour, line style)); the labels are the report's columns.
DECODE_PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    "jit": ("jit_kernel", ("tab:blue", "-")),
    "sdpa_repeat_kv": ("SDPA + repeat_kv", ("tab:orange", "--")),
    "sdpa_gqa": ("SDPA enable_gqa", ("tab:green", "-.")),
    "copy": ("device copy", ("tab:gray", ":")),
}
MERGE_PROVIDERS = dict(STANDARD_PROVIDERS)

# Every jit time bracketed by the empty kernel's.
RESULTS = Measurements.paired()


# ---------------------------------------------------------------------------------------------
# Minimal bytes


def kv_bytes(batch: int, context: int) -> int:
    """The K and V caches' bytes."""
    return 2 * batch * KV_HEADS * context * HEAD_DIM * DTYPE.itemsize


def decode_bytes(batch: int, context: int) -> int:
    """K and V read once, the query read and the output written, the int32 lengths read."""
    return kv_bytes(batch, context) + 2 * batch * HEADS * HEAD_DIM * DTYPE.itemsize + 4 * batch


def merge_bytes(tokens: int) -> int:
    """Both parts and their float32 LSEs read, the merged output and its LSE written."""
    return 3 * tokens * HEADS * (HEAD_DIM * DTYPE.itemsize + 4)


# ---------------------------------------------------------------------------------------------
# Inputs and the torch baselines


def make_decode_inputs(
    batch: int, context: int, device: str = DEFAULT_DEVICE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query [B, 32, 128], k_cache, v_cache [B, 8, context, 128], seq_lens int32 = context)."""
    q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device, dtype=DTYPE)
    v = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device, dtype=DTYPE)
    return q, k, v, torch.full((batch,), context, dtype=torch.int32, device=device)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, Hkv, L, D]`` -> ``[B, Hkv * groups, L, D]``, each KV head repeated for its query heads (a copy)."""
    batch, kv_heads, length, dim = x.shape
    return x[:, :, None].expand(batch, kv_heads, groups, length, dim).reshape(batch, kv_heads * groups, length, dim)


def sdpa_repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q[:, :, None], repeat_kv(k, groups), repeat_kv(v, groups))[:, :, 0]


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]


def torch_merge(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge formula in torch (finite LSEs): the weights and the sum in float32."""
    m = torch.maximum(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = wa + wb
    out = out_a.float() * (wa / total)[..., None] + out_b.float() * (wb / total)[..., None]
    return out.to(out_a.dtype), m + torch.log(total)


def make_merge_inputs(
    tokens: int, device: str = DEFAULT_DEVICE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(tokens, HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    b = torch.randn(tokens, HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    return a, torch.randn(tokens, HEADS, device=device) * 4, b, torch.randn(tokens, HEADS, device=device) * 4


def _unknown(provider: str, known: Mapping[str, object]) -> ValueError:
    return ValueError(f"unknown provider {provider!r}; known: {list(known)}")


def decode_case(provider: str, batch: int, context: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(decode_bytes(batch, context), device)
    q, k, v, lens = make_decode_inputs(batch, context, device)
    if provider == "jit":
        decode = jit_kernel.decode_attention  # looked up when the case is built (a test may stand in for it)
        return lambda: decode(q, k, v, lens)
    if provider == "sdpa_repeat_kv":
        return lambda: sdpa_repeat_kv(q, k, v)
    if provider == "sdpa_gqa":
        return lambda: sdpa_gqa(q, k, v)
    raise _unknown(provider, DECODE_PROVIDERS)


def merge_case(provider: str, tokens: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(merge_bytes(tokens), device)
    a, la, b, lb = make_merge_inputs(tokens, device)
    if provider == "jit":
        merge = jit_kernel.merge_attn_states
        return lambda: merge(a, la, b, lb)
    if provider == "eager":
        return lambda: torch_merge(a, la, b, lb)
    if provider == "compile":
        compiled = compile_static(torch_merge)
        return lambda: compiled(a, la, b, lb)
    raise _unknown(provider, MERGE_PROVIDERS)


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks


@triton.testing.perf_report(
    [
        provider_benchmark(
            DECODE_PROVIDERS,
            x_name="batch",
            x_vals=BATCHES,
            xlabel=f"batch (K, V [B, {KV_HEADS}, {context}, {HEAD_DIM}] bf16, {HEADS} query heads)",
            plot_name=f"decode_attention-bf16-ctx{context}",
            args={"context": context},
        )
        for context in CONTEXTS
    ]
)
def bench_decode(batch: int, context: int, provider: str) -> float:
    return RESULTS.time(("decode", batch, context), provider, lambda: decode_case(provider, batch, context))


@triton.testing.perf_report(
    provider_benchmark(
        MERGE_PROVIDERS,
        x_name="tokens",
        x_vals=MERGE_TOKENS,
        xlabel=f"tokens ([N, {HEADS}, {HEAD_DIM}] bf16)",
        plot_name="merge_attn_states-bf16",
        args={},
    )
)
def bench_merge(tokens: int, provider: str) -> float:
    return RESULTS.time(("merge", tokens), provider, lambda: merge_case(provider, tokens))


REPORTS = [bench_decode, bench_merge]


# ---------------------------------------------------------------------------------------------
# Summary tables and the read ceiling, from the measurements the reports made


def summary_tables() -> list[SummaryTable]:
    decode = [
        (("decode", b, n), [b, n], decode_bytes(b, n), kv_bytes(b, n) <= TINY_KV_BYTES)
        for n in CONTEXTS
        for b in BATCHES
    ]
    merge = [(("merge", n), [n], merge_bytes(n), n <= TINY_TOKENS) for n in MERGE_TOKENS]
    providers = {name: value for name, value in DECODE_PROVIDERS.items() if name != "copy"}
    return [
        SummaryTable(
            "decode_attention",
            f"decode_attention: {HEADS} query heads, {KV_HEADS} KV heads, head dim {HEAD_DIM}, bf16, "
            "every sequence at the full context",
            ["batch", "context"],
            decode,
            {**providers, CEILING: CEILING_LABEL, "copy": DECODE_PROVIDERS["copy"]},
        ),
        SummaryTable(
            "merge_attn_states",
            f"merge_attn_states: [N, {HEADS}, {HEAD_DIM}] bf16 with float32 LSEs",
            ["tokens"],
            merge,
            MERGE_PROVIDERS,
        ),
    ]


def _over_best_sdpa(times: Mapping[str, float]) -> float | None:
    """The faster SDPA form's time over jit_kernel's (None where a time is missing)."""
    ours = times.get("jit", math.nan)
    sdpa = [us for us in (times.get("sdpa_repeat_kv", math.nan), times.get("sdpa_gqa", math.nan)) if not math.isnan(us)]
    return None if math.isnan(ours) or ours <= 0 or not sdpa else min(sdpa) / ours


TARGETS = (
    Target(
        "decode_attention <= 2x the read ceiling (+ one empty kernel)",
        ("decode_attention",),
        time_ratio("jit", CEILING),
        2.0,
        at_most=True,
    ),
    Target("decode_attention >= 1.0x the faster SDPA form", ("decode_attention",), _over_best_sdpa, 1.0),
    Target(
        f"merge_attn_states, {MERGE_TOKENS[-1]} tokens: >= 90% of the copy ceiling",
        ("merge_attn_states",),
        time_ratio("copy", "jit"),
        0.9,
        applies=lambda columns: int(columns[0]) == MERGE_TOKENS[-1],
    ),
)


def bandwidth_note(gbps: float) -> str:
    return (
        f"read ceiling: K, V, the query and the output at {format_us(gbps, 0)} GB/s ({READ_NOTE}) plus the empty "
        "kernel measured beside the row's jit time"
    )


# ---------------------------------------------------------------------------------------------
# --split-sweep: the launcher's split counts and merges at the grid's shapes

DECODE_SOURCE = families.DECODE_ATTENTION.sources[0]
SWEEP_SPLITS = [1, 2, 4, 8, 12, 16, 24, 32, 64]
# run_with's merge (decode.cuh's Merge): the second kernel, a cluster, a cluster spread over SMs
SWEEP_MERGES = {"kernel": 1, "cluster": 2, "spread": 3}
SWEEP_REP_MS = 60

SplitKey = tuple[int, int]  # (batch, context)


@functools.cache
def decode_constants() -> dict[str, int]:
    """The integer constants of csrc/attention/decode.cuh (kMinSplitKeys, kMaxSplits,
    kMaxClusterBlocks, ...): the sweep reads the launcher's bounds from the header."""
    text = (env.CSRC_DIR / DECODE_SOURCE).read_text()
    return {name: int(value) for name, value in re.findall(r"constexpr int(?:64_t|32_t)? (k\w+) = (\d+);", text)}


def sweep_splits(context: int) -> list[int]:
    """The split counts timed at ``context``: one, and those of at least kMinSplitKeys keys each."""
    return [s for s in SWEEP_SPLITS if s == 1 or context // s >= decode_constants()["kMinSplitKeys"]]


def sweep_merges(splits: int) -> list[str]:
    """The merges timed at ``splits``: none at one split (its one form is "kernel"), a cluster up to
    the largest sm_90 runs."""
    if splits == 1:
        return ["kernel"]
    return list(SWEEP_MERGES) if splits <= decode_constants()["kMaxClusterBlocks"] else ["kernel"]


def sweep_keys() -> list[SplitKey]:
    return [(batch, context) for context in CONTEXTS for batch in BATCHES]


@functools.cache
def splits_module() -> object:
    """One module exporting the launcher's run_with and its choice (chosen_splits)."""
    launcher = f"jit_kernel::attention::DecodeAttention<{HEAD_DIM}, bf16_t>"
    wrappers = [(name, f"{launcher}::{name}") for name in ("run_with", "chosen_splits")]
    return jit_kernel.load_jit("decode_attention_splits", cuda_files=[DECODE_SOURCE], cuda_wrappers=wrappers)


def chosen(batch: int, context: int, device: str = DEFAULT_DEVICE) -> tuple[int, str]:
    """The launcher's (splits, merge) at a shape: it reads the shapes and the device only, so the
    cache is one element expanded."""
    q = torch.empty(1, device=device, dtype=DTYPE).expand(batch, HEADS, HEAD_DIM)
    k = torch.empty(1, device=device, dtype=DTYPE).expand(batch, KV_HEADS, context, HEAD_DIM)
    splits = int(splits_module().chosen_splits(q, k))  # type: ignore[attr-defined]
    return abs(splits), "cluster" if splits < 0 else "kernel"


def split_case(splits: int, merge: str, key: SplitKey, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """The launcher's launch with ``splits`` and ``merge`` at ``key``'s shape."""
    q, k, v, lens = make_decode_inputs(*key, device)
    out = torch.empty_like(q)
    run, scale, code = splits_module().run_with, HEAD_DIM**-0.5, SWEEP_MERGES[merge]  # type: ignore[attr-defined]
    return lambda: run(out, None, q, k, v, lens, scale, None, splits, code)


def split_sweep(results: Measurements) -> Measurements:
    """At every shape: SDPA enable_gqa, the op, then each (splits, merge), one after the other."""
    for key in sweep_keys():
        results.time(key, "sdpa_gqa", functools.partial(decode_case, "sdpa_gqa", *key))
        results.time(key, "op", functools.partial(decode_case, "jit", *key))
        for splits in sweep_splits(key[1]):
            for merge in sweep_merges(splits):
                results.time(key, f"{splits} {merge}", functools.partial(split_case, splits, merge, key))
    return results


def split_sweep_markdown(results: Measurements, choices: Mapping[SplitKey, tuple[int, str]]) -> str:
    """Per shape the op (its choice named), SDPA and the fastest form; then every form's time."""
    summary, every = [], []
    for key in sweep_keys():
        times = results.for_config(key)
        forms = {f: t for f, t in times.items() if f not in ("op", "sdpa_gqa")}
        fastest = min(forms, key=lambda f: forms[f])
        splits, merge = choices[key]
        summary.append(
            [*key, f"{format_us(times['op'], 2)} ({splits} {merge})", format_us(times["sdpa_gqa"], 2),
             f"{fastest}: {format_us(forms[fastest], 2)}"]
        )  # fmt: skip
        for form, us in forms.items():
            count, how = form.split()
            mark = " (op's choice)" if (int(count), how) == (splits, merge) or (int(count) == splits == 1) else ""
            every.append([*key, count, how, f"{format_us(us, 2)}{mark}"])
    return "\n".join(
        [
            format_table(
                "decode_attention's split counts: the op, SDPA enable_gqa and the fastest form (us)",
                ["batch", "context", "op us (splits, merge)", "SDPA enable_gqa us", "fastest (splits merge): us"],
                summary,
            ),
            format_table("every form (us)", ["batch", "context", "splits", "merge", "us"], every),
        ]
    )


def run_split_sweep(timer: Timer) -> str:
    """Build the module, time the sweep with ``timer``, return its markdown."""
    start = time.perf_counter()
    splits_module()
    built = time.perf_counter()
    results = split_sweep(Measurements(timer))
    done = time.perf_counter()
    choices = {key: chosen(*key) for key in sweep_keys()}
    return (
        f"device: {device_name()}; torch {torch.__version__}; {HEADS} query heads, {KV_HEADS} KV heads, head dim "
        f"{HEAD_DIM}, bf16; module loaded in {built - start:.1f} s, {len(results.times)} medians in "
        f"{done - built:.1f} s\n\n" + split_sweep_markdown(results, choices)
    )


def main(argv: Sequence[str] | None = None) -> None:
    """The perf_reports with the bandwidth measured first, then the summary with the read ceilings
    added and the targets table after it (``_tables.run_measured_script``)."""
    from jit_kernel.benchmark.utils import run_reports

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--split-sweep", action="store_true")
    parser.add_argument("--rep-ms", type=int, default=None)
    sweep, rest = parser.parse_known_args(argv)
    if sweep.split_sweep:
        if rest:
            parser.error(f"--split-sweep takes only --rep-ms; got {' '.join(rest)}")
        rep_ms = SWEEP_REP_MS if sweep.rep_ms is None else sweep.rep_ms
        if rep_ms < 1:
            parser.error("--rep-ms must be positive")
        torch.manual_seed(0)
        print(run_split_sweep(sweep_timer(rep_ms)))
        return
    if sweep.rep_ms is not None:
        parser.error("--rep-ms goes with --split-sweep")
    argv = rest

    bandwidth = [math.nan]

    def measure(save_path: str | None) -> None:
        bandwidth[0] = read_gbps(RESULTS)
        run_reports(REPORTS, save_path)

    def output(empty: float) -> _tables.ScriptOutput:
        measured, declared = RESULTS, summary_tables()
        _tables.add_read_ceilings(measured, declared, bandwidth[0], empty, lambda _, nbytes: nbytes)
        targets = target_rows(measured, declared, TARGETS)
        note = bandwidth_note(bandwidth[0])
        tables = _tables.tables_json(declared, measured, empty)
        tables.append(result_files.cells_table("targets", TARGETS_TITLE, TARGET_HEADER, targets))
        return _tables.ScriptOutput(
            f"{_tables.empty_kernel_line(empty)}; {note}",
            summary_tables_markdown(measured, declared) + "\n" + targets_markdown(targets),
            tables,
            [note],
        )

    _tables.run_measured_script("bench_decode_attention", __doc__, argv, measure, output)


if __name__ == "__main__":
    main()
