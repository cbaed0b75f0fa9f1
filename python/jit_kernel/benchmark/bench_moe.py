"""MoE routing, moe_align_block_size and moe_sum_reduce against torch eager, torch.compile, FlashInfer
(where importable) and, for the memory-bound combine, a device-to-device copy of the same bytes,
measured in the same run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_moe                          # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_moe    # CI-sized grid
    python -m jit_kernel.benchmark.bench_moe --json-dir bench-json    # + JSON results (report.py)
    python -m jit_kernel.benchmark.bench_moe --align-sweep            # moe_align_block_size's paths

``--align-sweep`` times each path of moe_align_block_size (csrc/moe/align.cuh) at the same sizes,
each forced by the launcher compiled with other bounds (``MoeAlignPaths``, one module for all): the
one-pair-per-thread kernel (up to kThreads pairs), the one-CTA kernel and the three kernels
(histogram, count, scatter), at 512 to 32,768 pairs, top-2, 4 and 8 of 64, 128 and 256 experts,
block size 64. It prints one table of the paths' times, each series' crossover from one CTA to three
kernels, and the bound ``kSmallPairs`` (the one-CTA path's most pairs) that loses the least time over
the grid (docs/design/moe.md). ``--rep-ms N`` sets each median's measuring time (default 10 ms: about
200 medians, some 30 s of GPU time, the module's first build not counted).

Grid: tokens 1, 16, 128, 1024, 4096, and 16,384 for moe_align_block_size. The CI-sized grid keeps
every size for the three routing ops (their FlashInfer and torch.compile comparisons span decode and
prefill) and takes 16 and 4096 for the others, and 128 and 16,384 for the align. Cases:

- ``grouped_topk``: DeepSeek-V3 routing, bf16 logits of 256 experts, 8 groups, top-4 groups, top-8
  experts, sigmoid scores + float32 correction bias, renormalised, x 2.5. ``flashinfer``:
  ``flashinfer.fused_moe.fused_topk_deepseek`` (the same job; it always renormalises).
- ``topk_softmax``: Qwen3-MoE routing, bf16 logits of 128 experts, top-8, renormalised.
- ``topk_sigmoid``: sigmoid top-8 of 256 experts with a correction bias, renormalised.
- ``moe_align_block_size``: the top-8 ids of each token over 256 experts, block size 64.
- ``moe_sum_reduce``: bf16 ``[tokens, 8, 7168]`` with float32 weights into ``[tokens, 7168]``;
  ``copy``: a copy of its minimal bytes, ``tokens * 7168 * 2 * 9 + tokens * 8 * 4``.

``eager`` is the torch code a model would otherwise run; ``compile`` is torch.compile of it (one
static-shape graph per shape). The summary's "vs empty" column (up to 16 tokens; for the align, up to
1,024 token-expert pairs, 128 tokens x top-8) is the time in empty-kernel CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import triton.testing

import jit_kernel
from jit_kernel.benchmark._tables import (
    STANDARD_PROVIDERS,
    Measurements,
    SummaryTable,
    Timer,
    compile_static,
    device_name,
    format_table,
    provider_benchmark,
    run_script,
    sweep_timer,
    tables_markdown,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range
from jit_kernel.engine import env, families

DT = torch.bfloat16
FULL_TOKENS = [1, 16, 128, 1024, 4096]
TOKENS = get_benchmark_range(FULL_TOKENS, [16, 4096])
ROUTING_OPS = ("grouped_topk", "topk_softmax", "topk_sigmoid")
TINY_TOKENS = 16
# moe_align_block_size also at 128 tokens x top-8 (1,024 pairs, the end of its "vs empty" range) and
# 16,384 (where its target compares it with torch.compile), in every grid.
ALIGN_TINY_PAIRS = 1024
ALIGN_TOKENS = sorted({*TOKENS, 128, 16384})
HIDDEN = 7168
TOPK = 8
DSV3 = {"experts": 256, "groups": 8, "topk_group": 4, "scale": 2.5}
QWEN3_EXPERTS = 128
BLOCK = 64

_NO_COPY = {k: v for k, v in STANDARD_PROVIDERS.items() if k != "copy"}
_WITH_FI = {**_NO_COPY, "flashinfer": ("FlashInfer", ("tab:brown", "-"))}
OPS: dict[str, tuple[dict[str, tuple[str, tuple[str, str]]], dict[str, str]]] = {
    "grouped_topk": (_WITH_FI, {"flashinfer": "FlashInfer"}),
    "topk_softmax": (_NO_COPY, {}),
    "topk_sigmoid": (_NO_COPY, {}),
    "moe_align_block_size": (_NO_COPY, {}),
    "moe_sum_reduce": (dict(STANDARD_PROVIDERS), {}),
}

RESULTS = Measurements.paired()


def sum_reduce_bytes(tokens: int) -> int:
    return tokens * HIDDEN * DT.itemsize * (TOPK + 1) + tokens * TOPK * 4


def op_bytes(op: str, tokens: int) -> int:
    """Minimal bytes: routing reads the logits and writes float32 weights and int32 ids; align reads
    the int32 ids and writes the sorted ids (padding included) and the block experts."""
    if op == "moe_sum_reduce":
        return sum_reduce_bytes(tokens)
    if op == "moe_align_block_size":
        sorted_len = tokens * TOPK + min(tokens * TOPK, DSV3["experts"]) * (BLOCK - 1)
        return 4 * (tokens * TOPK + sorted_len + sorted_len // BLOCK)
    experts = QWEN3_EXPERTS if op == "topk_softmax" else DSV3["experts"]
    return tokens * experts * DT.itemsize + tokens * TOPK * 8


# ---------------------------------------------------------------------------------------------
# torch baselines


def torch_grouped_topk(g: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scores = g.float().sigmoid()
    choice = scores + bias
    t = g.shape[0]
    groups = choice.view(t, DSV3["groups"], -1).topk(2, dim=-1).values.sum(-1)
    keep = groups.topk(DSV3["topk_group"], dim=-1).indices
    mask = torch.zeros_like(groups).scatter_(1, keep, 1.0).repeat_interleave(DSV3["experts"] // DSV3["groups"], 1)
    ids = choice.masked_fill(mask == 0, float("-inf")).topk(TOPK, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True) * DSV3["scale"], ids.int()


def torch_topk_softmax(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    w, ids = torch.softmax(g.float(), dim=-1).topk(TOPK, dim=-1)
    return w / w.sum(-1, keepdim=True), ids.int()


def torch_topk_sigmoid(g: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scores = g.float().sigmoid()
    ids = (scores + bias).topk(TOPK, dim=-1).indices
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True), ids.int()


def torch_moe_align(topk_ids: torch.Tensor, experts: int, block: int) -> tuple[torch.Tensor, ...]:
    """The align layout with torch ops of data-independent shapes (so CUDA graphs capture it, and
    torch.compile traces it without a graph break): a stable sort by expert, each expert's run padded
    to ``block``, each block's expert found among the runs' ends."""
    flat = topk_ids.flatten().long()
    numel = flat.numel()
    counts = torch.zeros(experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    order = torch.sort(flat, stable=True).indices
    sorted_experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    pos = (ends - padded)[sorted_experts] + torch.arange(numel, device=flat.device) - first[sorted_experts]
    length = numel + min(numel, experts) * (block - 1)
    out = torch.full((length,), numel, dtype=torch.int32, device=flat.device)
    out[pos] = order.int()
    rows = torch.arange((length + block - 1) // block, device=flat.device) * block
    total = ends[-1]
    expert_ids = torch.where(rows < total, torch.searchsorted(ends, rows, right=True), 0).int()
    return out, expert_ids, total.view(1).int()


def torch_moe_sum_reduce(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.float() * w[..., None]).sum(1).to(x.dtype)


TORCH: dict[str, Callable[..., object]] = {
    "grouped_topk": torch_grouped_topk,
    "topk_softmax": torch_topk_softmax,
    "topk_sigmoid": torch_topk_sigmoid,
    "moe_align_block_size": torch_moe_align,
    "moe_sum_reduce": torch_moe_sum_reduce,
}


# ---------------------------------------------------------------------------------------------
# One provider at one config


def moe_case(provider: str, op: str, tokens: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if op == "moe_sum_reduce" and provider == "copy":
        return copy_fn(sum_reduce_bytes(tokens), device)
    experts = QWEN3_EXPERTS if op == "topk_softmax" else DSV3["experts"]
    g = torch.randn(tokens, experts, device=device, dtype=DT)
    bias = torch.randn(experts, device=device) * 0.01
    ids = torch.rand(tokens, experts, device=device).topk(TOPK, dim=-1).indices.int()
    x = torch.randn(tokens, TOPK, HIDDEN, device=device, dtype=DT) if op == "moe_sum_reduce" else None
    w = torch.rand(tokens, TOPK, device=device)
    args: tuple[object, ...] = {
        "grouped_topk": (g, bias),
        "topk_softmax": (g,),
        "topk_sigmoid": (g, bias),
        "moe_align_block_size": (ids.long(), experts, BLOCK),  # bincount and sort want int64
        "moe_sum_reduce": (x, w),
    }[op]
    if provider in ("eager", "compile"):
        fn = TORCH[op] if provider == "eager" else compile_static(TORCH[op])
        return lambda: fn(*args)
    if provider == "jit":
        if op == "grouped_topk":
            k, grp, tg, scale = TOPK, DSV3["groups"], DSV3["topk_group"], DSV3["scale"]
            return lambda: jit_kernel.grouped_topk(g, k, grp, tg, True, bias, scale)
        if op == "topk_softmax":
            return lambda: jit_kernel.topk_softmax(g, TOPK, True)
        if op == "topk_sigmoid":
            return lambda: jit_kernel.topk_sigmoid(g, TOPK, True, bias)
        if op == "moe_align_block_size":
            return lambda: jit_kernel.moe_align_block_size(ids, experts, BLOCK)
        out = torch.empty(tokens, HIDDEN, device=device, dtype=DT)
        return lambda: jit_kernel.moe_sum_reduce(x, w, out)
    if provider == "flashinfer" and op == "grouped_topk":
        from flashinfer.fused_moe import fused_topk_deepseek  # may be missing: reported as n/a

        values = torch.empty(tokens, TOPK, device=device, dtype=g.dtype)  # 0.7.2 wants the logits' dtype
        indices = torch.empty(tokens, TOPK, device=device, dtype=torch.int32)
        return lambda: fused_topk_deepseek(
            g, bias, DSV3["groups"], DSV3["topk_group"], TOPK, DSV3["scale"], values, indices, True
        )
    raise ValueError(f"unknown provider {provider!r} for {op}; known: {list(OPS[op][0])}")


def tokens_of(op: str) -> list[int]:
    if op in ROUTING_OPS:
        return FULL_TOKENS
    return ALIGN_TOKENS if op == "moe_align_block_size" else TOKENS


def _benchmark(op: str) -> triton.testing.Benchmark:
    return provider_benchmark(
        OPS[op][0], x_name="tokens", x_vals=tokens_of(op), xlabel="tokens", plot_name=f"{op}-bf16", args={"op": op}
    )


@triton.testing.perf_report([_benchmark(op) for op in OPS])
def bench_moe(tokens: int, op: str, provider: str) -> float:
    return RESULTS.time((op, tokens), provider, lambda: moe_case(provider, op, tokens))


REPORTS = [bench_moe]


def _tiny(op: str, tokens: int) -> bool:
    """Whether the row gets a "vs empty" figure."""
    if op == "moe_align_block_size":
        return tokens * TOPK <= ALIGN_TINY_PAIRS
    return tokens <= TINY_TOKENS


def summary_tables() -> list[SummaryTable]:
    titles = {
        "grouped_topk": "grouped_topk (DeepSeek-V3: bf16, 256 experts, 8 groups, top-4 groups, top-8, bias, x 2.5)",
        "topk_softmax": "topk_softmax (Qwen3-MoE: bf16, 128 experts, top-8, renormalised)",
        "topk_sigmoid": "topk_sigmoid (bf16, 256 experts, top-8, bias, renormalised)",
        "moe_align_block_size": f"moe_align_block_size (top-8 of 256 experts, block {BLOCK})",
        "moe_sum_reduce": f"moe_sum_reduce (bf16, top-8, H={HIDDEN}, float32 weights)",
    }
    tables = []
    for op, (providers, extras) in OPS.items():
        configs = [((op, n), [n], op_bytes(op, n), _tiny(op, n)) for n in tokens_of(op)]
        tables.append(SummaryTable(op, titles[op], ["tokens"], configs, providers, extras))
    return tables


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


# ---------------------------------------------------------------------------------------------
# --align-sweep: moe_align_block_size's paths at the same sizes

ALIGN_SOURCE = families.MOE_ALIGN.sources[0]
# Each path alone: the bounds <per-thread pairs, one-CTA pairs> of the C++ launcher, MoeAlignPaths.
ALIGN_PATHS = {
    "per_thread": "jit_kernel::moe_align::kThreads, 0",  # compared only where it applies: up to kThreads pairs
    "one_cta": "0, INT32_MAX",
    "three_kernels": "0, 0",
}
ALIGN_PATH_LABELS = {"per_thread": "per-thread", "one_cta": "one CTA", "three_kernels": "three kernels"}
ALIGN_SWEEP_PAIRS = [512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384, 32768]
ALIGN_SWEEP_SERIES = [(topk, experts) for topk in (8, 4, 2) for experts in (256, 128, 64)]
ALIGN_SWEEP_REP_MS = 10

SweepKey = tuple[int, int, int]  # (topk, experts, pairs)


@functools.cache
def align_constants() -> dict[str, int]:
    """The integer constants of csrc/moe/align.cuh (kThreads, kSmallPairs, kFillPerCta, ...): the
    sweep reads the op's bounds from the header, not from a copy of them."""
    text = (env.CSRC_DIR / ALIGN_SOURCE).read_text()
    pattern = r"inline constexpr int(?:64_t|32_t)? (k\w+) = (\d+);"
    return {name: int(value) for name, value in re.findall(pattern, text)}


def align_paths_of(pairs: int) -> list[str]:
    """The paths timed at ``pairs``: the one-pair-per-thread kernel only up to kThreads pairs."""
    return [p for p in ALIGN_PATHS if p != "per_thread" or pairs <= align_constants()["kThreads"]]


def op_path(pairs: int) -> str:
    """The path the op takes at ``pairs`` (MoeAlign: the header's bounds)."""
    c = align_constants()
    return "per_thread" if pairs <= c["kThreads"] else "one_cta" if pairs <= c["kSmallPairs"] else "three_kernels"


def per_thread_ctas(pairs: int, experts: int, block: int = BLOCK) -> int:
    """The one-pair-per-thread kernel's CTAs (the launcher's rule): one per kFillPerCta sorted
    positions, at most kMaxSlicedCtas."""
    c = align_constants()
    sorted_len = pairs + min(pairs, experts) * (block - 1)
    return min(max(-(-sorted_len // c["kFillPerCta"]), 1), c["kMaxSlicedCtas"])


def align_sweep_keys() -> list[SweepKey]:
    return [(topk, experts, pairs) for topk, experts in ALIGN_SWEEP_SERIES for pairs in ALIGN_SWEEP_PAIRS]


@functools.cache
def align_paths_module() -> object:
    """One module exporting every path (one build)."""
    wrappers = [(path, f"jit_kernel::moe_align::MoeAlignPaths<{bounds}>::run") for path, bounds in ALIGN_PATHS.items()]
    return jit_kernel.load_jit("moe_align_paths", cuda_files=[ALIGN_SOURCE], cuda_wrappers=wrappers)


def align_path_case(path: str, key: SweepKey, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """One path's call on ``pairs // topk`` tokens' distinct top-k ids (int32, as routing gives them),
    the same ids for every path of a key."""
    topk, experts, pairs = key
    kernel = getattr(align_paths_module(), path)
    generator = torch.Generator(device=device).manual_seed(pairs * 1000 + experts * 10 + topk)
    scores = torch.rand(pairs // topk, experts, device=device, generator=generator)
    ids = scores.topk(topk, dim=-1).indices.int()
    length = pairs + min(pairs, experts) * (BLOCK - 1)
    sorted_ids = torch.empty(length, dtype=torch.int32, device=device)
    expert_ids = torch.empty(-(-length // BLOCK), dtype=torch.int32, device=device)
    post_padded = torch.empty(1, dtype=torch.int32, device=device)
    return lambda: kernel(sorted_ids, expert_ids, post_padded, ids, experts, BLOCK, None, None)


def align_sweep(results: Measurements) -> Measurements:
    """Every path at every key, the paths of one key timed one after the other."""
    for key in align_sweep_keys():
        for path in align_paths_of(key[2]):
            results.time(key, path, functools.partial(align_path_case, path, key))
    return results


def _fastest(times: Mapping[str, float]) -> str:
    return min(times, key=lambda p: times[p])


def series_crossover(results: Measurements, topk: int, experts: int) -> tuple[int | None, int | None]:
    """Above kThreads pairs: the most pairs at which one CTA is faster than three kernels, and the
    fewest from which three kernels are faster at every larger size (None where there is none)."""
    above = [p for p in ALIGN_SWEEP_PAIRS if p > align_constants()["kThreads"]]
    faster = {p: (t := results.for_config((topk, experts, p)))["three_kernels"] < t["one_cta"] for p in above}
    one_cta_up_to = max((p for p in above if not faster[p]), default=None)
    from_ = next((p for i, p in enumerate(above) if all(faster[q] for q in above[i:])), None)
    return one_cta_up_to, from_


def threshold_costs(results: Measurements) -> list[tuple[int, float, float]]:
    """Per candidate kSmallPairs (kThreads: three kernels above it; or a measured size): the time it
    loses over the grid against the faster of one CTA and three kernels at each key above kThreads,
    summed (us) and the worst ratio - 1."""
    low = align_constants()["kThreads"]
    keys = [k for k in align_sweep_keys() if k[2] > low]
    costs = []
    for bound in [low, *sorted({k[2] for k in keys})]:
        total, worst = 0.0, 0.0
        for key in keys:
            t = results.for_config(key)
            best = min(t["one_cta"], t["three_kernels"])
            chosen = t["one_cta"] if key[2] <= bound else t["three_kernels"]
            total += chosen - best
            worst = max(worst, chosen / best - 1)
        costs.append((bound, total, worst))
    return costs


def suggested_small_pairs(results: Measurements) -> int:
    """The candidate kSmallPairs that loses the least time in all (the smaller one of equal loss)."""
    return min(threshold_costs(results), key=lambda c: (round(c[1], 6), c[0]))[0]


def align_sweep_markdown(results: Measurements) -> str:
    """The paths' table, the crossovers per series, the candidate bounds and the suggested one."""
    c = align_constants()
    labels = [ALIGN_PATH_LABELS[p] for p in ALIGN_PATHS]
    header = ["top-k", "experts", "pairs", "tokens", *(f"{label} us" for label in labels), "fastest", "op's path"]
    rows: list[list[object]] = []
    for key in align_sweep_keys():
        topk, experts, pairs = key
        times = results.for_config(key)
        cells = [f"{times[p]:.2f}" if p in times else "-" for p in ALIGN_PATHS]
        if "per_thread" in times:
            cells[0] += f" ({per_thread_ctas(pairs, experts)} CTA)"
        rows.append(
            [
                topk,
                experts,
                pairs,
                pairs // topk,
                *cells,
                ALIGN_PATH_LABELS[_fastest(times)],
                ALIGN_PATH_LABELS[op_path(pairs)],
            ]
        )
    title = (
        f"moe_align_block_size paths (block {BLOCK}; CUDA-graph medians, us; the op's bounds: "
        f"kThreads {c['kThreads']}, kSmallPairs {c['kSmallPairs']})"
    )
    out = [format_table(title, header, rows)]
    crossings = []
    for topk, experts in ALIGN_SWEEP_SERIES:
        up_to, from_ = series_crossover(results, topk, experts)
        crossings.append([topk, experts, "-" if up_to is None else up_to, "-" if from_ is None else from_])
    out.append(
        format_table(
            "crossover: one CTA faster up to, three kernels faster from (pairs)",
            ["top-k", "experts", "one CTA faster up to", "three kernels faster from"],
            crossings,
        )
    )
    costs = [[bound, f"{total:.2f}", f"{100 * worst:.0f}%"] for bound, total, worst in threshold_costs(results)]
    out.append(
        format_table(
            "kSmallPairs candidates: time lost against the faster path, over every key above kThreads",
            ["kSmallPairs", "lost us (sum)", "worst"],
            costs,
        )
    )
    out.append(f"suggested kSmallPairs: {suggested_small_pairs(results)} (csrc/moe/align.cuh has {c['kSmallPairs']})\n")
    return "\n".join(out)


def run_align_sweep(timer: Timer) -> str:
    """Build the paths' module, time the sweep with ``timer``, return its markdown."""
    start = time.perf_counter()
    align_paths_module()
    built = time.perf_counter()
    results = align_sweep(Measurements(timer))
    done = time.perf_counter()
    return (
        f"device: {device_name()}; torch {torch.__version__}; module loaded in {built - start:.1f} s, "
        f"{len(results.times)} medians in {done - built:.1f} s\n\n" + align_sweep_markdown(results)
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--align-sweep", action="store_true")
    parser.add_argument("--rep-ms", type=int, default=None)
    sweep, rest = parser.parse_known_args(argv)
    if not sweep.align_sweep:
        if sweep.rep_ms is not None:
            parser.error("--rep-ms goes with --align-sweep")
        run_script("bench_moe", __doc__, rest, REPORTS, lambda: RESULTS, summary_tables)
        return
    if rest:
        parser.error(f"--align-sweep takes only --rep-ms; got {' '.join(rest)}")
    rep_ms = ALIGN_SWEEP_REP_MS if sweep.rep_ms is None else sweep.rep_ms
    if rep_ms < 1:
        parser.error("--rep-ms must be positive")
    torch.manual_seed(0)
    print(run_align_sweep(sweep_timer(rep_ms)))


if __name__ == "__main__":
    main()
