"""Sampling a token per request from logits (jit_kernel.sample: temperature, top-k, top-p, min-p) and the
FlashInfer-compatible sampling ops against FlashInfer's ops of the same names, vLLM's torch sampler,
torch.topk + torch.multinomial, torch.compile of that, a read of the logits (torch's row max) and the
read ceiling, measured in the same run. Times are medians in microseconds of CUDA-graph replays (the
two torch.multinomial forms: of event-timed launches).

    python -m jit_kernel.benchmark.bench_sampling                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_sampling            # CI-sized grid
    python -m jit_kernel.benchmark.bench_sampling --save-path bench-out/sampling   # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_sampling --json-dir bench-json            # + JSON results (report.py)

Grid: batch 1, 8, 32, 256, 1024 (CI-sized grid, the one docs/benchmarks.md shows: 1, 32, 256) x vocab
128,256 (Llama 3) and 151,936 (Qwen), and 262,144 (Gemma 3) at batch 1 and 32. Logits are
``randn * 3`` (the middle of the normal distributions FlashInfer's own sampling benchmark draws), fp32,
and a bf16 set at vocab 128,256 (full grid: both vocabs). Every request parameter is a per-request
CUDA tensor of length batch: temperature 1.0 (float32), top_k 50 (int32), top_p 0.9 and min_p 0.1
(float32), seed and offset (int64; jit_kernel.sample advances offset on the device, FlashInfer's ops
do not).

Tables (one ``triton.testing.perf_report`` benchmark per series, x = batch):

- ``sample``: top-k 50 then top-p 0.9 from logits. ``jit``: ``jit_kernel.sample(logits,
  temperature=, top_k=, top_p=, seed=, offset=)``. ``flashinfer``:
  ``flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, top_k, top_p, seed=, offset=)``
  (no temperature: at 1.0 it does not change the distribution, and FlashInfer's call does not take
  one). ``vllm_torch``: vLLM's torch sampler written here as vLLM does it: the float32 logits divided
  by the temperature in place, the row sorted, top-k then top-p masked on the sorted row by
  cumulative sums, scattered back in place, softmax, and an exponential race (``probs / q`` with
  ``q ~ Exp(1)``, argmax). ``torch_topk``: ``torch.topk`` of the 50 largest, per-request k and top-p
  on those, ``torch.multinomial``. ``compile``: ``torch.compile`` of ``torch_topk``'s form.
  ``torch.multinomial`` checks its input on the host (a device sync), which a CUDA graph cannot
  capture: those two are event-timed launches (triton's ``do_bench``: L2 flushed before each
  call), the sync included.
  ``read``: ``logits.amax(-1)``, one read of the logits by torch.
- ``filters``: one filter from logits: top-k only, top-p only, min-p only. ``jit``:
  ``jit_kernel.sample`` with that filter; ``flashinfer``: FlashInfer's softmax
  (``flashinfer.sampling.softmax``, the temperature applied) then its ``top_k_sampling_from_probs`` /
  ``top_p_sampling_from_probs`` / ``min_p_sampling_from_probs`` (FlashInfer has no from-logits op
  for one filter); ``vllm_torch``: vLLM's torch sampler with that filter (min-p as its logits
  processor does it: softmax, mask below min_p times the row's largest probability).
- ``compat``: the FlashInfer-compatible entry points (``jit_kernel.<op>``) against
  ``flashinfer.sampling.<op>``, same arguments: top_p / top_k / min_p_sampling_from_probs, top_k /
  top_p_renorm_probs (on ``softmax(logits)``), top_k_mask_logits and
  top_k_top_p_sampling_from_logits (on the logits).

``copy`` is a device-to-device copy moving the op's minimal bytes (the logits or probabilities read
once; renorm and mask also write a row each). The read ceiling (``ceiling``, computed, not a
measured provider) is the logits' bytes over the copy bandwidth measured once in the run (a copy of
1 GiB: 512 MiB read, 512 MiB written) plus the empty kernel measured beside the jit time of the same
row. "vs empty" (our time in empty-kernel CUDA-graph replays) is shown up to batch 16. The inputs
are not rotated: rows that fit in L2 (batch 1 and 32) are read from it on every replay, as the
logits an LM head just wrote would be.

Targets, each checked on the same run and printed with the tables: jit_kernel.sample (top-k + top-p)
at least 3x FlashInfer's top_k_top_p_sampling_from_logits and 10x vLLM's torch sampler, within 3x
of the read ceiling at batch >= 32 and at most 5 us at batch 1; each FlashInfer-compatible op at
least as fast as FlashInfer's op of the same name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch
import triton.testing

import jit_kernel
from jit_kernel.benchmark import _tables
from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark._tables import (
    CEILING,
    CEILING_LABEL,
    TARGET_HEADER,
    TARGETS_TITLE,
    Measurements,
    SummaryTable,
    Target,
    compile_static,
    format_us,
    jit_us,
    provider_benchmark,
    summary_tables_markdown,
    target_rows,
    targets_markdown,
    time_ratio,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range, median_time_us

TOP_K = 50
TOP_P = 0.9
MIN_P = 0.1
TEMPERATURE = 1.0
LOGITS_STD = 3.0
SEED = 1234

BATCHES = get_benchmark_range([1, 8, 32, 256, 1024], [1, 32, 256])
VOCABS = [128256, 151936]  # Llama 3, Qwen 2.5 / 3
GEMMA_VOCAB, GEMMA_BATCHES = 262144, [1, 32]  # Gemma 3
BF16_VOCABS = get_benchmark_range(VOCABS, [128256])
SIDE_VOCABS = get_benchmark_range(VOCABS, [128256])  # the filters and the compatible ops
TINY_BATCH = 16  # "vs empty" is shown up to this batch
BANDWIDTH_BYTES = 1 << 30  # the copy that measures the bandwidth of the read ceiling
# Per request besides its row: temperature, top_k, top_p (4 bytes each), seed (8), offset read and
# written (16), the sampled id (4).
REQUEST_BYTES = 40

# provider -> (line name in the plots, (colour, line style)); the labels are the report's columns.
PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    "jit": ("jit_kernel", ("tab:blue", "-")),
    "flashinfer": ("FlashInfer", ("tab:red", "-")),
    "vllm_torch": ("vLLM torch", ("tab:purple", "--")),
    "torch_topk": ("torch.topk + multinomial", ("tab:orange", "--")),
    "compile": ("torch.compile", ("tab:green", "-.")),
    "read": ("torch amax (read)", ("tab:olive", ":")),
    "copy": ("device copy", ("tab:gray", ":")),
}
EVENT_TIMED = ("torch_topk", "compile")  # torch.multinomial syncs: no CUDA-graph capture


def _subset(*names: str) -> dict[str, tuple[str, tuple[str, str]]]:
    return {name: PROVIDERS[name] for name in names}


SAMPLE_PROVIDERS = dict(PROVIDERS)
FILTER_PROVIDERS = _subset("jit", "flashinfer", "vllm_torch", "copy")
COMPAT_PROVIDERS = _subset("jit", "flashinfer", "copy")

FILTERS = ("top_k", "top_p", "min_p")
COMPAT_OPS = (
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "top_k_mask_logits",
    "top_k_top_p_sampling_from_logits",
)
FROM_LOGITS = ("top_k_mask_logits", "top_k_top_p_sampling_from_logits")  # the others take probabilities
WRITES_ROWS = ("top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits")

# (dtype, vocab, batches) of the sample series.
SAMPLE_SERIES: list[tuple[str, int, list[int]]] = [
    *(("float32", vocab, BATCHES) for vocab in VOCABS),
    ("float32", GEMMA_VOCAB, GEMMA_BATCHES),
    *(("bfloat16", vocab, BATCHES) for vocab in BF16_VOCABS),
]


# ---------------------------------------------------------------------------------------------
# Minimal bytes


def logits_bytes(batch: int, vocab: int, dtype: str = "float32") -> int:
    return batch * vocab * getattr(torch, dtype).itemsize


def sample_bytes(batch: int, vocab: int, dtype: str = "float32") -> int:
    """A sampling op from logits or probabilities: the rows read once, plus each request's parameters
    and its id."""
    return logits_bytes(batch, vocab, dtype) + batch * REQUEST_BYTES


def compat_bytes(op: str, batch: int, vocab: int) -> int:
    """Renorm and mask read a float32 row and write one; the sampling ops read it and write an id."""
    if op in WRITES_ROWS:
        return 2 * logits_bytes(batch, vocab) + batch * 4
    return sample_bytes(batch, vocab)


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass(frozen=True)
class Requests:
    """Per-request parameters, one CUDA tensor of length batch each."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    offset: torch.Tensor


def make_requests(batch: int, device: str = DEFAULT_DEVICE) -> Requests:
    return Requests(
        temperature=torch.full((batch,), TEMPERATURE, device=device),
        top_k=torch.full((batch,), TOP_K, dtype=torch.int32, device=device),
        top_p=torch.full((batch,), TOP_P, device=device),
        min_p=torch.full((batch,), MIN_P, device=device),
        seed=torch.arange(SEED, SEED + batch, dtype=torch.int64, device=device),
        offset=torch.zeros(batch, dtype=torch.int64, device=device),
    )


def make_logits(batch: int, vocab: int, dtype: str = "float32", device: str = DEFAULT_DEVICE) -> torch.Tensor:
    return (torch.randn(batch, vocab, device=device) * LOGITS_STD).to(getattr(torch, dtype))


# ---------------------------------------------------------------------------------------------
# torch baselines


def torch_topk_sample(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """torch.topk of the TOP_K largest scaled logits (every request's k is at most TOP_K), each
    request's own k and top-p on those (a token stays while the mass ranked above it is below p),
    torch.multinomial."""
    x = logits.float() / temperature.unsqueeze(1)
    values, indices = torch.topk(x, TOP_K, dim=-1)  # sorted, largest first
    rank = torch.arange(TOP_K, device=x.device)
    values = values.masked_fill(rank >= top_k.unsqueeze(1), float("-inf"))
    probs = values.softmax(dim=-1)
    above = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(above >= top_p.unsqueeze(1), 0.0)
    choice = torch.multinomial(probs, 1)
    return indices.gather(1, choice).squeeze(1)


def vllm_torch_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """vLLM's torch sampler: float32 logits (fp32 input: modified in place, as vLLM does), temperature,
    min-p (softmax, tokens below min_p x the largest probability masked), then top-k and top-p on the
    sorted row (the k-th largest value as the threshold; top-p masks the ascending prefix whose mass
    is at most 1 - p, never the largest token), scattered back, softmax, and the exponential race."""
    x = logits.to(torch.float32)
    x.div_(temperature.unsqueeze(1))
    if min_p is not None:
        probs = x.softmax(dim=-1)
        x.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1), float("-inf"))
    if top_k is not None or top_p is not None:
        values, order = x.sort(dim=-1)  # ascending
        if top_k is not None:
            kth = values.gather(1, (values.shape[1] - top_k.long()).unsqueeze(1))
            values.masked_fill_(values < kth, float("-inf"))
        if top_p is not None:
            cumulative = values.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= 1 - top_p.unsqueeze(1)
            drop[:, -1] = False
            values.masked_fill_(drop, float("-inf"))
        x.scatter_(-1, order, values)
    probs = x.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def read_logits(logits: torch.Tensor) -> torch.Tensor:
    return logits.amax(dim=-1)


# ---------------------------------------------------------------------------------------------
# The ops measured


def jit_op(name: str) -> Callable[..., object]:
    """jit_kernel's op ``name``, looked up when a case is built (so that a test can stand in for it)."""
    return getattr(jit_kernel, name)


def flashinfer_sampling() -> Any:
    import flashinfer.sampling  # may be missing: time_case reports the cell as n/a

    return flashinfer.sampling


def _unknown(provider: str, known: Mapping[str, object]) -> ValueError:
    return ValueError(f"unknown provider {provider!r}; known: {list(known)}")


def sample_case(
    provider: str, dtype: str, batch: int, vocab: int, device: str = DEFAULT_DEVICE
) -> Callable[[], object]:
    """top-k + top-p from logits, one provider."""
    if provider == "copy":
        return copy_fn(sample_bytes(batch, vocab, dtype), device)
    logits = make_logits(batch, vocab, dtype, device)
    r = make_requests(batch, device)
    if provider == "jit":
        sample = jit_op("sample")
        return lambda: sample(
            logits, temperature=r.temperature, top_k=r.top_k, top_p=r.top_p, seed=r.seed, offset=r.offset
        )
    if provider == "flashinfer":
        fi = flashinfer_sampling().top_k_top_p_sampling_from_logits
        return lambda: fi(logits, r.top_k, r.top_p, seed=r.seed, offset=r.offset)
    if provider == "vllm_torch":
        return lambda: vllm_torch_sample(logits, r.temperature, r.top_k, r.top_p)
    if provider == "torch_topk":
        return lambda: torch_topk_sample(logits, r.temperature, r.top_k, r.top_p)
    if provider == "compile":
        compiled = compile_static(torch_topk_sample)
        return lambda: compiled(logits, r.temperature, r.top_k, r.top_p)
    if provider == "read":
        return lambda: read_logits(logits)
    raise _unknown(provider, SAMPLE_PROVIDERS)


def filter_case(provider: str, name: str, batch: int, vocab: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """One filter (``top_k``, ``top_p`` or ``min_p``) from fp32 logits, one provider."""
    if name not in FILTERS:
        raise ValueError(f"unknown filter {name!r}; known: {list(FILTERS)}")
    if provider == "copy":
        return copy_fn(sample_bytes(batch, vocab), device)
    logits = make_logits(batch, vocab, "float32", device)
    r = make_requests(batch, device)
    value = getattr(r, name)
    if provider == "jit":
        sample = jit_op("sample")
        kwargs = {name: value}
        return lambda: sample(logits, temperature=r.temperature, seed=r.seed, offset=r.offset, **kwargs)
    if provider == "flashinfer":
        fi = flashinfer_sampling()
        softmax = fi.softmax
        from_probs = getattr(fi, f"{name}_sampling_from_probs")
        return lambda: from_probs(softmax(logits, r.temperature), value, seed=r.seed, offset=r.offset)
    if provider == "vllm_torch":
        return lambda: vllm_torch_sample(logits, r.temperature, **{name: value})
    raise _unknown(provider, FILTER_PROVIDERS)


def compat_call(module: Any, op: str, x: torch.Tensor, r: Requests) -> Callable[[], object]:
    """``module.<op>`` on ``x`` with the per-request tensors, as both FlashInfer and jit_kernel take them."""
    fn = getattr(module, op) if module is not None else jit_op(op)
    if op == "top_p_sampling_from_probs":
        return lambda: fn(x, r.top_p, seed=r.seed, offset=r.offset)
    if op == "top_k_sampling_from_probs":
        return lambda: fn(x, r.top_k, seed=r.seed, offset=r.offset)
    if op == "min_p_sampling_from_probs":
        return lambda: fn(x, r.min_p, seed=r.seed, offset=r.offset)
    if op == "top_k_renorm_probs" or op == "top_k_mask_logits":
        return lambda: fn(x, r.top_k)
    if op == "top_p_renorm_probs":
        return lambda: fn(x, r.top_p)
    if op == "top_k_top_p_sampling_from_logits":
        return lambda: fn(x, r.top_k, r.top_p, seed=r.seed, offset=r.offset)
    raise ValueError(f"unknown op {op!r}; known: {list(COMPAT_OPS)}")


def compat_case(provider: str, op: str, batch: int, vocab: int, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    """A FlashInfer-compatible op, one provider: fp32 logits, or their softmax for the from-probs ops."""
    if op not in COMPAT_OPS:
        raise ValueError(f"unknown op {op!r}; known: {list(COMPAT_OPS)}")
    if provider == "copy":
        return copy_fn(compat_bytes(op, batch, vocab), device)
    logits = make_logits(batch, vocab, "float32", device)
    x = logits if op in FROM_LOGITS else logits.softmax(dim=-1)
    r = make_requests(batch, device)
    if provider == "jit":
        return compat_call(None, op, x, r)
    if provider == "flashinfer":
        return compat_call(flashinfer_sampling(), op, x, r)
    raise _unknown(provider, COMPAT_PROVIDERS)


# ---------------------------------------------------------------------------------------------
# Timing


def event_timed_case(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
    """:func:`_tables.time_case` with event-timed launches instead of CUDA-graph replays, for code
    that syncs with the host (a graph cannot capture it); nan on failure."""
    try:
        fn = make()
        fn()  # compile / warm up
        torch.cuda.synchronize()
        return median_time_us(fn, use_cuda_graph=False)
    except Exception as error:  # e.g. torch.compile unavailable on this machine
        if result_files.stop_requested():
            raise KeyboardInterrupt from error
        print(f"<!-- {provider} {key}: failed: {type(error).__name__}: {str(error)[:200]} -->")
        return float("nan")


def time_case(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
    if provider in EVENT_TIMED:
        return event_timed_case(key, provider, make)
    return _tables.time_case(key, provider, make)


# Every jit time bracketed by the empty kernel's, as Measurements.paired() does.
RESULTS = Measurements(time_case, _tables.empty_kernel_now_us)
BANDWIDTH_KEY = ("bandwidth", BANDWIDTH_BYTES)


def bandwidth_gbps(results: Measurements) -> float:
    """Device copy bandwidth (bytes read + written per second, GB/s) of a 1 GiB copy, measured once."""
    us = results.time(BANDWIDTH_KEY, "copy", lambda: copy_fn(BANDWIDTH_BYTES))
    return math.nan if math.isnan(us) or us <= 0 else BANDWIDTH_BYTES / us / 1e3


# ---------------------------------------------------------------------------------------------
# perf_report benchmarks: x = batch, one line per provider


@triton.testing.perf_report(
    [
        provider_benchmark(
            SAMPLE_PROVIDERS,
            x_name="batch",
            x_vals=batches,
            xlabel=f"batch (logits [B, {vocab}] {dtype})",
            plot_name=f"sample-{dtype}-V{vocab}",
            args={"dtype": dtype, "vocab": vocab},
        )
        for dtype, vocab, batches in SAMPLE_SERIES
    ]
)
def bench_sample(batch: int, dtype: str, vocab: int, provider: str) -> float:
    return RESULTS.time(("sample", dtype, batch, vocab), provider, lambda: sample_case(provider, dtype, batch, vocab))


@triton.testing.perf_report(
    [
        provider_benchmark(
            FILTER_PROVIDERS,
            x_name="batch",
            x_vals=BATCHES,
            xlabel=f"batch (logits [B, {vocab}] float32)",
            plot_name=f"{name}-float32-V{vocab}",
            args={"name": name, "vocab": vocab},
        )
        for name in FILTERS
        for vocab in SIDE_VOCABS
    ]
)
def bench_filter(batch: int, name: str, vocab: int, provider: str) -> float:
    return RESULTS.time(("filter", name, batch, vocab), provider, lambda: filter_case(provider, name, batch, vocab))


@triton.testing.perf_report(
    [
        provider_benchmark(
            COMPAT_PROVIDERS,
            x_name="batch",
            x_vals=BATCHES,
            xlabel=f"batch ([B, {vocab}] float32)",
            plot_name=f"{op}-float32-V{vocab}",
            args={"op": op, "vocab": vocab},
        )
        for op in COMPAT_OPS
        for vocab in SIDE_VOCABS
    ]
)
def bench_compat(batch: int, op: str, vocab: int, provider: str) -> float:
    return RESULTS.time(("compat", op, batch, vocab), provider, lambda: compat_case(provider, op, batch, vocab))


REPORTS = [bench_sample, bench_filter, bench_compat]


# ---------------------------------------------------------------------------------------------
# Summary tables, the read ceiling and the targets, from the measurements the reports made


def _with_ceiling(providers: Mapping[str, tuple[str, tuple[str, str]]]) -> dict[str, tuple[str, tuple[str, str]]]:
    """``providers`` with the computed read ceiling before the copy."""
    out = {name: value for name, value in providers.items() if name != "copy"}
    return {**out, CEILING: CEILING_LABEL, "copy": providers["copy"]}


def summary_tables() -> list[SummaryTable]:
    filters = {"top_k": f"top-k {TOP_K}", "top_p": f"top-p {TOP_P}", "min_p": f"min-p {MIN_P}"}
    params = f"temperature {TEMPERATURE}, per-request tensors"
    tables = []
    for dtype in ("float32", "bfloat16"):
        configs = [
            (("sample", d, b, v), [b, v], sample_bytes(b, v, d), b <= TINY_BATCH)
            for d, v, batches in SAMPLE_SERIES
            if d == dtype
            for b in batches
        ]
        tables.append(
            SummaryTable(
                f"sample_{dtype}",
                f"sample: top-k {TOP_K} then top-p {TOP_P} from {dtype} logits ({params})",
                ["batch", "vocab"],
                configs,
                _with_ceiling(SAMPLE_PROVIDERS),
            )
        )
    tables.append(
        SummaryTable(
            "filters",
            f"sample with one filter from float32 logits ({params}); FlashInfer: softmax + its from-probs op",
            ["filter", "batch", "vocab"],
            [
                (("filter", name, b, v), [filters[name], b, v], sample_bytes(b, v), b <= TINY_BATCH)
                for name in FILTERS
                for v in SIDE_VOCABS
                for b in BATCHES
            ],
            _with_ceiling(FILTER_PROVIDERS),
        )
    )
    tables.append(
        SummaryTable(
            "compat",
            f"FlashInfer-compatible ops against FlashInfer's (float32, top-k {TOP_K}, top-p {TOP_P}, "
            f"min-p {MIN_P}, per-request tensors)",
            ["op", "batch", "vocab"],
            [
                (("compat", op, b, v), [op, b, v], compat_bytes(op, b, v), b <= TINY_BATCH)
                for op in COMPAT_OPS
                for v in SIDE_VOCABS
                for b in BATCHES
            ],
            COMPAT_PROVIDERS,
        )
    )
    return tables


def _ceiling_bytes(key: Hashable, nbytes: int) -> int:
    """The logits' bytes of a ``sample`` or ``filters`` row (its read ceiling's bytes)."""
    kind, what, batch, vocab = key  # type: ignore[misc]
    return logits_bytes(batch, vocab, what if kind == "sample" else "float32")


SAMPLE_TABLES = ("sample_float32", "sample_bfloat16")
TARGETS = (
    Target(
        "sample (top-k + top-p) >= 3x FlashInfer's top_k_top_p_sampling_from_logits",
        SAMPLE_TABLES,
        time_ratio("flashinfer", "jit"),
        3.0,
    ),
    Target("sample (top-k + top-p) >= 10x vLLM's torch sampler", SAMPLE_TABLES, time_ratio("vllm_torch", "jit"), 10.0),
    Target(
        "sample (top-k + top-p), batch >= 32: <= 3x the read ceiling",
        SAMPLE_TABLES,
        time_ratio("jit", CEILING),
        3.0,
        at_most=True,
        applies=lambda columns: int(columns[0]) >= 32,
    ),
    Target(
        "sample (top-k + top-p), batch 1: <= 5 us",
        SAMPLE_TABLES,
        jit_us,
        5.0,
        at_most=True,
        applies=lambda columns: int(columns[0]) == 1,
        unit=" us",
    ),
    Target(
        "each FlashInfer-compatible op >= 1.0x FlashInfer's op of the same name",
        ("compat",),
        time_ratio("flashinfer", "jit"),
        1.0,
    ),
)


def bandwidth_note(gbps: float) -> str:
    return (
        f"read ceiling: the logits' bytes at {format_us(gbps, 0)} GB/s (a 1 GiB device copy, bytes read + "
        "written per second, measured in this run) plus the empty kernel measured beside the row's jit time"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """The perf_reports with the bandwidth measured first, the read ceilings added to the tables, and
    the targets table after them (``_tables.run_measured_script``)."""
    from jit_kernel.benchmark.utils import run_reports

    bandwidth = [math.nan]

    def measure(save_path: str | None) -> None:
        bandwidth[0] = bandwidth_gbps(RESULTS)
        run_reports(REPORTS, save_path)

    def output(empty: float) -> _tables.ScriptOutput:
        measured, declared = RESULTS, summary_tables()
        _tables.add_read_ceilings(measured, declared, bandwidth[0], empty, _ceiling_bytes)
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

    _tables.run_measured_script("bench_sampling", __doc__, argv, measure, output)


if __name__ == "__main__":
    main()
