"""Tensor-parallel all-reduce: jit_kernel.distributed.CustomAllReduce against NCCL
(``torch.distributed.all_reduce``) and torch's symmetric-memory one-shot all-reduce, at the
activation sizes of tensor-parallel serving (hidden 8192, bf16, 1 to 2048 tokens), and its fused
forms (all-reduce + residual add + RMSNorm, and the same with static per-tensor or per-token-group
fp8 quantisation) against the same work unfused. Times are medians in microseconds of CUDA-graph
replays, per call, measured by every rank at once.

    python -m jit_kernel.benchmark.bench_allreduce                      # one rank per GPU (2 ranks on a 1-GPU host)
    python -m jit_kernel.benchmark.bench_allreduce --world 4            # 4 ranks spread over the GPUs
    python -m jit_kernel.benchmark.bench_allreduce --ranks-per-gpu 2    # 2 ranks on each GPU
    torchrun --nproc_per_node 8 -m jit_kernel.benchmark.bench_allreduce # under torchrun: rank r on GPU LOCAL_RANK
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_allreduce --json-dir bench-json

Run alone, the script starts its ranks itself (one process each, on 127.0.0.1) and stops them all
when one fails or ``--time-limit`` passes; under torchrun (``RANK`` / ``WORLD_SIZE`` set) each process
is one rank. Ranks are placed on the GPUs in blocks of ``--ranks-per-gpu`` (default: one per GPU,
two when the host has one GPU). Where ranks share a GPU, NCCL cannot run (it refuses two ranks on
one device) and neither can the symmetric-memory all-reduce: their columns say so, and the custom
kernels and their unfused forms are timed alone. Those times include the GPU's time-slicing between
the ranks' processes: they show that the kernels run, not their speed on separate GPUs.

Sizes: 512 B, then ``[tokens, 8192]`` bf16 for 1, 8, 32, 128, 512 and 2048 tokens (16 KiB to
32 MiB; CI-sized grid: 1, 128 and 2048); the fused forms at 1, 8, 32 and 128 tokens (CI: 1 and
128). Providers:

- jit_kernel: ``comm.all_reduce(x, out=out)`` (one launch; the input is copied into the shared
  buffer inside the kernel);
- jit_kernel registered: the same call on a communicator made with ``graph_inputs="register"``:
  the captured calls' inputs are registered at the end of ``capture()`` and the replays read every
  rank's input in place, no copy-in (its check is made on the replays' output, as its eager call
  copies in);
- NCCL: ``torch.distributed.all_reduce(x)`` in place on an NCCL group, captured in the graph too,
  where every rank has a GPU of its own;
- symm_mem one-shot: the input copied into a ``torch.distributed._symmetric_memory`` buffer (made
  once with ``symm_mem.empty`` and ``rendezvous``) and ``torch.ops.symm_mem.one_shot_all_reduce_out``,
  where it imports and works (its error is reported otherwise);
- fused forms: ``comm.all_reduce_fused_add_rmsnorm`` against ``comm.all_reduce`` then
  ``jit_kernel.fused_add_rmsnorm``, ``comm.all_reduce_fused_add_rmsnorm_quant_fp8`` against
  ``comm.all_reduce`` then ``jit_kernel.fused_add_rmsnorm_quant_fp8``, and
  ``comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8`` (groups of 128, row-major
  float32 scales) against ``comm.all_reduce`` then
  ``jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8`` (``normed_out=x``, as the fused form
  leaves ``x``); each also after an NCCL all-reduce where NCCL runs.

Timing: every provider's calls are first made eagerly and checked (jit_kernel bit for bit against
the fp32 sum in rank order, NCCL and symm_mem within bf16 rounding, each fused form bit for bit
against its unfused form), then ``--calls`` calls are captured in one CUDA graph, replayed for a
warm-up and ``--reps`` times between CUDA events, after a barrier of all ranks. A cell shows rank
0's median per call and, in parentheses, the largest median over the ranks. "algbw" is the input's
bytes over jit_kernel's time, "busbw" that times 2 (W - 1) / W (the bytes each link carries in a
ring all-reduce, as nccl-tests counts them); "vs empty" is jit_kernel's time over an empty kernel's
(a 1-element ``add_``) replayed the same way; "copy-in / registered" is jit_kernel's time over
jit_kernel registered's (above 1: reading the inputs in place is faster).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark._tables import format_table, format_us, ratio_cell
from jit_kernel.benchmark.utils import bench_arg_parser, gbps, get_benchmark_range

NAME = "bench_allreduce"
DTYPE = torch.bfloat16
HIDDEN = 8192
TINY_BYTES = 512
TOKENS = get_benchmark_range([1, 8, 32, 128, 512, 2048], [1, 128, 2048])
FUSED_TOKENS = get_benchmark_range([1, 8, 32, 128], [1, 128])
EPS = 1e-6
FP8_SCALE = 0.05
GROUP_SIZE = 128  # the per-token-group form's group
MAX_RANKS = 8  # jit_kernel.ops.allreduce.MAX_RANKS (not imported here: that module loads the kernels' spec)
DECODE_TOKENS = 128  # rows up to this many tokens are decode-sized: "vs empty" is shown for them

#: Set in the environment of the ranks this script starts itself.
SPAWNED_ENV = "_JIT_KERNEL_BENCH_ALLREDUCE_RANK"

# provider -> column label
ALL_REDUCE_PROVIDERS = {
    "jit": "jit_kernel",
    "jit_registered": "jit_kernel registered",
    "nccl": "NCCL",
    "symm_mem": "symm_mem one-shot",
}
FUSED_PROVIDERS = {"fused": "fused", "unfused": "unfused", "nccl_unfused": "NCCL + norm"}
FUSED_FORMS = {
    "rmsnorm": "all-reduce + fused_add_rmsnorm",
    "rmsnorm_fp8": "all-reduce + fused_add_rmsnorm_quant_fp8 (static fp8)",
    "rmsnorm_group_fp8": f"all-reduce + fused_add_rmsnorm_per_token_group_quant_fp8 (fp8, groups of {GROUP_SIZE})",
}
EMPTY = "empty"


@dataclasses.dataclass(frozen=True)
class Size:
    """One all-reduce input: ``numel`` bf16 elements, ``tokens`` rows of HIDDEN (None: a flat input)."""

    numel: int
    tokens: int | None

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE.itemsize

    @property
    def label(self) -> str:
        return f"{self.nbytes} B" if self.tokens is None else f"{self.tokens} x {HIDDEN}"

    @property
    def decode(self) -> bool:
        return self.tokens is None or self.tokens <= DECODE_TOKENS


def all_reduce_sizes(tokens: Sequence[int] = TOKENS) -> list[Size]:
    return [Size(TINY_BYTES // DTYPE.itemsize, None), *(Size(t * HIDDEN, t) for t in tokens)]


def fused_sizes(tokens: Sequence[int] = FUSED_TOKENS) -> list[Size]:
    return [Size(t * HIDDEN, t) for t in tokens]


def max_bytes(sizes: Sequence[Size]) -> int:
    """The communicator's buffer: the largest input, rounded up to 16 bytes."""
    return -(-max(s.nbytes for s in sizes) // 16) * 16


# ---------------------------------------------------------------------------------------------
# Arguments and placement (pure)


def arg_parser() -> argparse.ArgumentParser:
    parser = bench_arg_parser(__doc__)
    parser.add_argument("--world", type=int, default=None, help="ranks to start (default: GPUs x --ranks-per-gpu)")
    parser.add_argument(
        "--ranks-per-gpu",
        type=int,
        default=None,
        help="ranks on each GPU, in blocks: rank r on GPU r // K (default: 1, or 2 on a 1-GPU host)",
    )
    parser.add_argument("--calls", type=int, default=None, help="calls captured in one graph (default 20; 5 shared)")
    parser.add_argument("--reps", type=int, default=None, help="timed replays (default 50; 10 where ranks share a GPU)")
    parser.add_argument("--warmup", type=int, default=3, help="replays before the timed ones (default 3)")
    parser.add_argument(
        "--peer-timeout", type=float, default=20.0, help="CustomAllReduce's timeout_s: seconds a rank waits (20)"
    )
    parser.add_argument(
        "--time-limit", type=float, default=1200.0, help="seconds before the started ranks are stopped (1200)"
    )
    return parser


def parse_args(argv: Sequence[str] | None, parser: argparse.ArgumentParser | None = None) -> argparse.Namespace:
    """The arguments, checked; ``parser``: :func:`arg_parser`'s, or a parser built on it (another
    rank-level benchmark's, with arguments of its own)."""
    parser = parser or arg_parser()
    args = parser.parse_args(argv)
    for name in ("world", "ranks_per_gpu", "calls", "reps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.warmup < 0 or args.peer_timeout <= 0 or args.time_limit <= 0:
        parser.error("--warmup must be >= 0, --peer-timeout and --time-limit > 0")
    return args


def plan_world(world: int | None, ranks_per_gpu: int | None, gpus: int) -> tuple[int, int]:
    """``(world size, ranks per GPU)`` of a run this script starts on a host with ``gpus`` GPUs."""
    if gpus < 1:
        raise ValueError("bench_allreduce: no CUDA device")
    if world is None:
        per_gpu = ranks_per_gpu or (1 if gpus >= 2 else 2)
        world = gpus * per_gpu
    else:
        per_gpu = ranks_per_gpu or -(-world // gpus)
    if not 2 <= world <= MAX_RANKS:
        raise ValueError(f"--world {world}: the custom all-reduce takes 2 to {MAX_RANKS} ranks")
    if -(-world // per_gpu) > gpus:
        raise ValueError(f"--world {world} at --ranks-per-gpu {per_gpu} needs {-(-world // per_gpu)} GPUs; {gpus} here")
    return world, per_gpu


def rank_device(local_rank: int, local_world: int, gpus: int, ranks_per_gpu: int | None) -> int:
    """The GPU of a rank: ranks in blocks of ``ranks_per_gpu`` (default: as many as the GPUs need)."""
    if gpus < 1:
        raise ValueError("bench_allreduce: no CUDA device")
    per_gpu = ranks_per_gpu or -(-local_world // gpus)
    device = local_rank // per_gpu
    if device >= gpus:
        raise ValueError(f"rank {local_rank} at {per_gpu} ranks per GPU would need GPU {device}; {gpus} here")
    return device


def timing_counts(args: argparse.Namespace, shared: bool) -> tuple[int, int]:
    """``(calls per graph, timed replays)``: fewer where ranks share a GPU (each call waits for the
    GPU to switch between the ranks' processes)."""
    return (args.calls or (5 if shared else 20)), (args.reps or (10 if shared else 50))


def unavailable(shared: bool, nccl_built: bool) -> dict[str, str]:
    """provider -> why it cannot be measured, decided before any attempt (absent: it is tried)."""
    out: dict[str, str] = {}
    if shared:
        why = "ranks share a GPU (NCCL refuses two ranks on one device)"
        out.update({"nccl": why, "nccl_unfused": why, "symm_mem": why})
    elif not nccl_built:
        out.update({"nccl": "this torch has no NCCL", "nccl_unfused": "this torch has no NCCL"})
        out["symm_mem"] = "it is rendezvoused on the NCCL group, and this torch has no NCCL"
    return out


# ---------------------------------------------------------------------------------------------
# Measurements and tables (pure)


@dataclasses.dataclass(frozen=True)
class Timing:
    """One provider at one size: rank 0's median us per call and the largest median over the
    ranks (nan when not measured, ``reason`` saying why), and its correctness check."""

    us: float = math.nan
    max_us: float = math.nan
    reason: str | None = None
    check: str = ""

    @classmethod
    def missing(cls, reason: str) -> Timing:
        return cls(reason=reason)


def time_cell(t: Timing | None) -> str:
    if t is None or math.isnan(t.us):
        return "n/a"
    return f"{format_us(t.us, 2)} ({format_us(t.max_us, 2)})"


def algbw(nbytes: int, us: float) -> float:
    """The input's bytes per second (GB/s)."""
    return math.nan if math.isnan(us) or us <= 0 else gbps(nbytes, us)


def busbw(nbytes: int, us: float, world: int) -> float:
    """algbw times 2 (W - 1) / W: what each link carries in a ring all-reduce (nccl-tests' count)."""
    return algbw(nbytes, us) * 2 * (world - 1) / world


def _bw_cell(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


ALL_REDUCE_HEADER = [
    "size",
    "bytes",
    "jit_kernel us",
    "jit_kernel registered us",
    "NCCL us",
    "symm_mem one-shot us",
    "copy-in / registered",
    "NCCL / ours",
    "symm_mem / ours",
    "algbw GB/s",
    "busbw GB/s",
    "vs empty",
    "checks",
]

FUSED_HEADER = [
    "tokens",
    "bytes",
    "fused us",
    "unfused us",
    "NCCL + norm us",
    "unfused / fused",
    "NCCL + norm / fused",
    "checks",
]


Results = Mapping[tuple[str, int, str], Timing]  # (table, numel, provider) -> Timing


def _checks(results: Results, table: str, numel: int, providers: Sequence[str]) -> str:
    found = [f"{p}: {t.check}" for p in providers if (t := results.get((table, numel, p))) and t.check]
    return "; ".join(found)


def all_reduce_rows(results: Results, sizes: Sequence[Size], world: int) -> list[list[object]]:
    """One row per size measured (or tried) in the ``all_reduce`` table."""
    rows: list[list[object]] = []
    for size in sizes:
        cells = {p: results.get(("all_reduce", size.numel, p)) for p in ALL_REDUCE_PROVIDERS}
        if not any(cells.values()):
            continue
        ours, registered, nccl, symm = (cells[p] or Timing() for p in ALL_REDUCE_PROVIDERS)
        empty = results.get(("all_reduce", size.numel, EMPTY)) or Timing()
        rows.append(
            [
                size.label,
                size.nbytes,
                time_cell(ours),
                time_cell(registered),
                time_cell(nccl),
                time_cell(symm),
                ratio_cell(ours.us, registered.us),
                ratio_cell(nccl.us, ours.us),
                ratio_cell(symm.us, ours.us),
                _bw_cell(algbw(size.nbytes, ours.us)),
                _bw_cell(busbw(size.nbytes, ours.us, world)),
                ratio_cell(ours.us, empty.us) if size.decode else "",
                _checks(results, "all_reduce", size.numel, list(ALL_REDUCE_PROVIDERS)),
            ]
        )
    return rows


def fused_rows(results: Results, form: str, sizes: Sequence[Size]) -> list[list[object]]:
    rows: list[list[object]] = []
    for size in sizes:
        cells = {p: results.get((form, size.numel, p)) for p in FUSED_PROVIDERS}
        if not any(cells.values()):
            continue
        fused, unfused, nccl = (cells[p] or Timing() for p in FUSED_PROVIDERS)
        rows.append(
            [
                size.tokens,
                size.nbytes,
                time_cell(fused),
                time_cell(unfused),
                time_cell(nccl),
                ratio_cell(unfused.us, fused.us),
                ratio_cell(nccl.us, fused.us),
                _checks(results, form, size.numel, list(FUSED_PROVIDERS)),
            ]
        )
    return rows


def reasons(results: Results) -> list[str]:
    """Each provider's reason for a missing time, once per (table, provider, reason)."""
    labels = {**ALL_REDUCE_PROVIDERS, **FUSED_PROVIDERS, EMPTY: "empty kernel"}
    seen: dict[tuple[str, str, str], None] = {}
    for (table, _, provider), timing in results.items():
        if timing.reason:
            seen[(table, labels.get(provider, provider), timing.reason)] = None
    return [f"{table}, {label}: not measured: {reason}" for table, label, reason in seen]


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What the device line says about a run."""

    world: int
    gpus: int
    shared: bool
    calls: int
    reps: int
    custom_path: str  # "custom kernels" or why every call falls back


def header_line(info: RunInfo) -> str:
    line = (
        f"{info.world} ranks on {info.gpus} GPU(s); {info.calls} calls per CUDA graph, median of {info.reps} "
        f"replays; a cell: rank 0's median us per call (the largest median over the ranks)"
    )
    if info.custom_path != "custom kernels":
        line += f"; CustomAllReduce falls back to torch.distributed ({info.custom_path})"
    return line


SHARED_NOTE = (
    "ranks share a GPU: NCCL and symm_mem cannot run, and the times include the GPU's time-slicing "
    "between the ranks' processes; they show that the kernels run, not their speed on separate GPUs"
)


def output(
    results: Results, info: RunInfo, sizes: Sequence[Size], fused: Sequence[Size]
) -> tuple[str, list[result_files.Json], list[str]]:
    """(markdown, JSON tables, notes) of a run's measurements."""
    declared = [
        (
            "all_reduce",
            f"all_reduce, {str(DTYPE).removeprefix('torch.')} over {info.world} ranks: "
            "jit_kernel (copy-in and registered) against NCCL and symm_mem",
            ALL_REDUCE_HEADER,
            all_reduce_rows(results, sizes, info.world),
        )
    ]
    for form, title in FUSED_FORMS.items():
        declared.append(
            (form, f"{title}, hidden {HIDDEN}: fused against unfused", FUSED_HEADER, fused_rows(results, form, fused))
        )
    notes = ([SHARED_NOTE] if info.shared else []) + reasons(results)
    markdown = "\n".join(format_table(title, header, rows) for _, title, header, rows in declared)
    if notes:
        markdown += "\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    tables = [result_files.cells_table(name, title, header, rows) for name, title, header, rows in declared]
    return markdown, tables, notes


# ---------------------------------------------------------------------------------------------
# The fused forms' steps (what a rank calls; pure but for the calls)


@dataclasses.dataclass(frozen=True)
class FusedTensors:
    """One fused-form step's tensors: ``x`` and ``residual`` (written in place), the fp8 output ``q``
    and the per-token-group form's scales ``s`` (float32 ``[tokens, HIDDEN // GROUP_SIZE]``)."""

    x: torch.Tensor
    residual: torch.Tensor
    q: torch.Tensor
    s: torch.Tensor


def _check_form(form: str) -> None:
    if form not in FUSED_FORMS:
        raise ValueError(f"unknown fused form {form!r}; one of {sorted(FUSED_FORMS)}")


def fused_step(form: str, comm: Any, t: FusedTensors, weight: torch.Tensor, scale: torch.Tensor) -> None:
    """``form``'s one launch on ``comm`` (a :class:`~jit_kernel.distributed.CustomAllReduce`)."""
    _check_form(form)
    if form == "rmsnorm":
        comm.all_reduce_fused_add_rmsnorm(t.x, t.residual, weight, EPS)
    elif form == "rmsnorm_fp8":
        comm.all_reduce_fused_add_rmsnorm_quant_fp8(t.x, t.residual, weight, scale, EPS, out=t.q)
    else:
        comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
            t.x, t.residual, weight, GROUP_SIZE, EPS, output_q=t.q, output_s=t.s
        )


def unfused_step(
    form: str, all_reduce: Callable[[torch.Tensor], object], t: FusedTensors, weight: torch.Tensor, scale: torch.Tensor
) -> None:
    """The same work unfused: ``all_reduce(x)`` (in place), then the norm op ``form`` fuses."""
    import jit_kernel

    _check_form(form)
    all_reduce(t.x)
    if form == "rmsnorm":
        jit_kernel.fused_add_rmsnorm(t.x, t.residual, weight, EPS)
    elif form == "rmsnorm_fp8":
        jit_kernel.fused_add_rmsnorm_quant_fp8(t.x, t.residual, weight, scale, EPS, out=t.q)
    else:
        jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
            t.x, t.residual, weight, GROUP_SIZE, EPS, output_q=t.q, output_s=t.s, normed_out=t.x
        )


def same_outputs(form: str, a: FusedTensors, b: FusedTensors) -> bool:
    """Whether two steps of ``form`` left the same bits in what the form writes: the residual, and
    ``x`` (the plain and per-token-group forms leave it normalised), ``q`` (the fp8 forms), ``s``
    (the per-token-group form)."""
    _check_form(form)
    pairs = [(a.residual, b.residual)]
    if form != "rmsnorm_fp8":
        pairs.append((a.x, b.x))
    if form != "rmsnorm":
        pairs.append((a.q.view(torch.uint8), b.q.view(torch.uint8)))
    if form == "rmsnorm_group_fp8":
        pairs.append((a.s.view(torch.int32), b.s.view(torch.int32)))
    return all(torch.equal(p, q) for p, q in pairs)


# ---------------------------------------------------------------------------------------------
# A rank


class RankGroup:
    """One rank of the gloo world group, in step with the others: a value gathered from every rank,
    the first rank's error agreed on, CUDA-graph replays timed together (what :class:`Rank` and
    other rank-level benchmarks share)."""

    def __init__(self, rank: int, world: int, device: int) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = rank, world
        self.device = torch.device("cuda", device)

    def gather(self, value: object) -> list[Any]:
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, value)
        return out

    def agree(self, error: str | None) -> str | None:
        """The first rank's error (``rank r: ...``), the same on every rank; None when none failed."""
        errors = self.gather(error)
        failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
        return failed[0] if failed else None

    def attempt(self, fn: Callable[[], object]) -> str | None:
        """Run ``fn`` on every rank; the first error of any rank (see :meth:`agree`)."""
        try:
            fn()
            torch.cuda.synchronize(self.device)
            error = None
        except Exception as e:
            if result_files.stop_requested():
                raise KeyboardInterrupt from e
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return self.agree(error)

    def timed_replays(self, graph: torch.cuda.CUDAGraph, reps: int, calls: int) -> float:
        """The median over ``reps`` replays of ``graph`` (each between CUDA events, every rank
        starting after a barrier) of the time per call, in us, for a graph of ``calls`` calls."""
        self.dist.barrier()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(1e3 * s.elapsed_time(e) / calls for s, e in zip(starts, ends, strict=True))


class Rank(RankGroup):
    """One rank's state: the gloo world group, the communicator, the NCCL group where it runs, and
    the timing of one provider at a time, in step with the other ranks."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, device: int) -> None:
        from jit_kernel.distributed import CustomAllReduce

        super().__init__(rank, world, device)
        dist = self.dist
        self.args = args
        uuids = self.gather(str(torch.cuda.get_device_properties(self.device).uuid))
        self.gpus = len(set(uuids))
        self.shared = self.gpus < world
        self.calls, self.reps = timing_counts(args, self.shared)
        self.skip = unavailable(self.shared, dist.is_nccl_available())
        self.sizes, self.fused = all_reduce_sizes(), fused_sizes()
        self.comm = CustomAllReduce(
            dist.group.WORLD, device=self.device, max_bytes=max_bytes(self.sizes), timeout_s=args.peer_timeout
        )
        # The registered variant: its own regions and table (graph_inputs is a communicator's choice).
        self.comm_registered = CustomAllReduce(
            dist.group.WORLD,
            device=self.device,
            max_bytes=max_bytes(self.sizes),
            timeout_s=args.peer_timeout,
            graph_inputs="register",
        )
        self.nccl: Any = None
        self.symm: tuple[torch.Tensor, str] | None = None
        self.results: dict[tuple[str, int, str], Timing] = {}
        # This rank's verdict on a provider's eager call, gathered with its times by measure().
        self.checks: dict[tuple[str, int, str], str] = {}
        # A provider's check of its replays' output (made after the timed replays, into checks).
        self.replay_checks: dict[tuple[str, int, str], Callable[[], None]] = {}

    # -- set-up of the other providers ---------------------------------------------------------

    def setup_peers(self) -> None:
        if self.comm.disabled_reason is not None:
            why = f"CustomAllReduce falls back to torch.distributed ({self.comm.disabled_reason})"
            self.skip.update({"jit": why, "fused": why, "unfused": why})
        if self.comm_registered.disabled_reason is not None:
            self.skip["jit_registered"] = f"CustomAllReduce falls back ({self.comm_registered.disabled_reason})"
        if "nccl" not in self.skip:

            def nccl() -> None:
                self.nccl = self.dist.new_group(backend="nccl")
                self.dist.all_reduce(torch.ones(16, device=self.device), group=self.nccl)

            error = self.attempt(nccl)
            if error:
                self.skip.update({"nccl": error, "nccl_unfused": error, "symm_mem": f"no NCCL group ({error})"})
        if "symm_mem" not in self.skip:
            error = self.attempt(self._symm_mem_setup)
            if error:
                self.skip["symm_mem"] = error

    def _symm_mem_setup(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            raise RuntimeError("this torch has no torch.ops.symm_mem.one_shot_all_reduce_out")
        name = self.nccl.group_name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(name)
        buffer = symm_mem.empty(max(s.numel for s in self.sizes), dtype=DTYPE, device=self.device)
        symm_mem.rendezvous(buffer, name)
        self.symm = (buffer, name)

    # -- inputs --------------------------------------------------------------------------------

    def inputs(self, seed: int, numel: int, rank: int | None = None) -> torch.Tensor:
        """Rank ``rank``'s (default: this rank's) input of a case, drawn on the device from a seed."""
        g = torch.Generator(device=self.device).manual_seed(seed * 131 + (self.rank if rank is None else rank))
        return torch.randn(numel, generator=g, device=self.device).to(DTYPE)

    def expected_sum(self, seed: int, numel: int) -> torch.Tensor:
        acc = torch.zeros(numel, dtype=torch.float32, device=self.device)
        for r in range(self.world):
            acc += self.inputs(seed, numel, r).float()
        return acc.to(DTYPE)

    # -- timing --------------------------------------------------------------------------------

    def measure(self, table: str, numel: int, provider: str, make: Callable[[], Callable[[], object]]) -> None:
        """Time ``make()``'s step on every rank at once (CUDA graph of ``calls`` steps, replays
        between events after a barrier); rank 0 keeps its median and the largest over the ranks."""
        result_files.check_stop()
        key = (table, numel, provider)
        if provider in self.skip:
            self.results[key] = Timing.missing(self.skip[provider])
            return
        steps: list[Callable[[], object]] = []
        error = self.attempt(lambda: steps.append(make()))  # allocates, runs the eager check
        graph = torch.cuda.CUDAGraph()
        if error is None:

            def capture() -> None:
                # thread_local: the NCCL watchdog's event queries on its own thread stay legal during capture.
                comm = self.comm_registered if provider == "jit_registered" else self.comm
                with comm.capture(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    for _ in range(self.calls):
                        steps[0]()

            error = self.attempt(capture)
        if error is None:
            error = self.attempt(lambda: [graph.replay() for _ in range(self.args.warmup)])
        median = math.nan
        if error is None:
            try:
                median = self.timed_replays(graph, self.reps, self.calls)
            except Exception as e:
                if result_files.stop_requested():
                    raise KeyboardInterrupt from e
                error = f"{type(e).__name__}: {e}"
        replay_check = self.replay_checks.pop(key, None)
        if error is None and replay_check is not None:
            replay_check()  # the last replay's output (the timed replays synchronised)
        check = self.checks.pop(key, "")
        gathered = self.gather((median, error, check))
        first_error = next((f"rank {r}: {e}" for r, (_, e, _) in enumerate(gathered) if e), None)
        wrong = [f"rank {r}: {c}" for r, (_, _, c) in enumerate(gathered) if c.startswith("WRONG")]
        check = "; ".join(wrong) if wrong else check
        if first_error:
            self.results[key] = Timing(reason=first_error, check=check)
        else:
            self.results[key] = Timing(gathered[0][0], max(m for m, _, _ in gathered), check=check)

    # -- the cases -----------------------------------------------------------------------------

    def _compare_sum(self, key: tuple[str, int, str], actual: torch.Tensor, seed: int, numel: int, exact: bool) -> None:
        expected = self.expected_sum(seed, numel)
        if exact:
            wrong = int((actual.view(-1) != expected).sum())
        else:
            tolerance = 2e-2 * expected.float().abs() + 2e-2 * self.world
            wrong = int(((actual.view(-1).float() - expected.float()).abs() > tolerance).sum())
        self.checks[key] = f"WRONG: {wrong} of {numel} elements" if wrong else ("bits" if exact else "close")

    def all_reduce_case(self, size: Size, provider: str) -> Callable[[], Callable[[], object]]:
        numel, seed = size.numel, size.numel % 100_003
        key = ("all_reduce", numel, provider)

        def make() -> Callable[[], object]:
            x = self.inputs(seed, numel)
            out = torch.empty_like(x)
            if provider == "jit":
                self.comm.all_reduce(x, out=out)
                self._compare_sum(key, out, seed, numel, exact=True)
                return lambda: self.comm.all_reduce(x, out=out)
            if provider == "jit_registered":
                comm = self.comm_registered
                comm.all_reduce(x, out=out)  # eager: loads the kernel (copy-in)
                before = comm.registered_graph_calls

                def replayed() -> None:
                    self._compare_sum(key, out, seed, numel, exact=True)
                    if comm.registered_graph_calls - before < self.calls and self.checks[key] == "bits":
                        self.checks[key] = "bits (copied in: inputs not registered)"

                self.replay_checks[key] = replayed
                out.fill_(float("nan"))  # the replays must write it
                return lambda: comm.all_reduce(x, out=out)
            if provider == "nccl":
                out.copy_(x)
                self.dist.all_reduce(out, group=self.nccl)
                self._compare_sum(key, out, seed, numel, exact=False)
                return lambda: self.dist.all_reduce(x, group=self.nccl)  # in place, as a model calls it
            if provider == "symm_mem":
                assert self.symm is not None
                buffer, name = self.symm
                view = buffer[:numel]
                op = torch.ops.symm_mem.one_shot_all_reduce_out

                def step() -> None:
                    view.copy_(x)
                    op(view, "sum", name, out)

                step()
                self._compare_sum(key, out, seed, numel, exact=False)
                return step
            if provider == EMPTY:
                one = torch.zeros(1, device=self.device)
                return lambda: one.add_(1)
            raise ValueError(f"unknown provider {provider!r}")

        return make

    def fused_case(self, form: str, size: Size, provider: str) -> Callable[[], Callable[[], object]]:
        tokens, seed = size.tokens or 1, 7919 + size.numel % 100_003
        weight = self.inputs(seed + 1, HIDDEN, rank=0)
        scale = torch.tensor([FP8_SCALE], dtype=torch.float32, device=self.device)
        comm, nccl = self.comm, self.nccl

        def tensors() -> FusedTensors:
            x = self.inputs(seed, size.numel).view(tokens, HIDDEN)
            residual = self.inputs(seed + 2, size.numel, rank=0).view(tokens, HIDDEN)
            q = torch.empty(tokens, HIDDEN, dtype=torch.float8_e4m3fn, device=self.device)
            s = torch.empty(tokens, HIDDEN // GROUP_SIZE, dtype=torch.float32, device=self.device)
            return FusedTensors(x, residual, q, s)

        def ours(x: torch.Tensor) -> None:
            comm.all_reduce(x, out=x)

        def nccl_all_reduce(x: torch.Tensor) -> None:
            self.dist.all_reduce(x, group=nccl)

        def make() -> Callable[[], object]:
            t = tensors()
            if provider == "fused":  # checked bit for bit against the unfused form on the same inputs
                reference = tensors()
                unfused_step(form, ours, reference, weight, scale)
                fused_step(form, comm, t, weight, scale)
                same = same_outputs(form, t, reference)
                self.checks[(form, size.numel, provider)] = "bits = unfused" if same else "WRONG: differs from unfused"
                t = tensors()
                return lambda: fused_step(form, comm, t, weight, scale)
            all_reduce = ours if provider == "unfused" else nccl_all_reduce
            return lambda: unfused_step(form, all_reduce, t, weight, scale)

        return make

    def run(self) -> None:
        self.setup_peers()
        for size in self.sizes:
            for provider in (*ALL_REDUCE_PROVIDERS, *([EMPTY] if size.decode else [])):
                self.measure("all_reduce", size.numel, provider, self.all_reduce_case(size, provider))
        for form in FUSED_FORMS:
            for size in self.fused:
                for provider in FUSED_PROVIDERS:
                    self.measure(form, size.numel, provider, self.fused_case(form, size, provider))

    def info(self) -> RunInfo:
        path = "custom kernels" if self.comm.disabled_reason is None else self.comm.disabled_reason
        return RunInfo(self.world, self.gpus, self.shared, self.calls, self.reps, path)

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        self.dist.barrier()
        self.comm.close()
        self.comm_registered.close()
        self.dist.destroy_process_group()


def rank_main(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """One rank (under torchrun, or started by :func:`launch`): rank 0 prints and writes the tables."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (kept open until the process exits)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        print("bench_allreduce: no CUDA device; nothing measured")
        return
    if args.world is not None and args.world != world:
        raise SystemExit(f"bench_allreduce: --world {args.world}, but WORLD_SIZE is {world}")
    if world < 2:
        print("bench_allreduce: world size 1; an all-reduce needs 2 ranks or more (run it without torchrun)")
        return
    device = rank_device(local_rank, local_world, gpus, args.ranks_per_gpu)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    # A collective may wait for a rank compiling a kernel on first use: minutes, not the default 30.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    state = Rank(args, rank, world, device)
    complete, failure = True, None
    with result_files.stoppable():
        try:
            state.run()
        except KeyboardInterrupt:
            complete = False
        except Exception:  # e.g. another rank died: rank 0 still writes what it measured
            complete = False
            if not result_files.stop_requested():
                failure = traceback.format_exc()
    if rank == 0:
        write_output(args, argv, state.results, state.info(), state.sizes, state.fused, complete)
    if failure is not None:
        print(failure, file=sys.stderr)
        raise SystemExit(1)
    if not complete:
        raise SystemExit(130)
    state.close()


def write_output(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    results: Results,
    info: RunInfo,
    sizes: Sequence[Size],
    fused: Sequence[Size],
    complete: bool,
) -> None:
    """Print the tables and write them (``--save-path``: markdown; ``--json-dir``: JSON)."""
    markdown, tables, notes = output(results, info, sizes, fused)
    publish(args, argv, header_line(info), markdown, tables, notes, complete)


def publish(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    header: str,
    markdown: str,
    tables: Sequence[result_files.Json],
    notes: Sequence[str],
    complete: bool,
    *,
    name: str = NAME,
    result: str | None = None,
    description: str | None = __doc__,
) -> None:
    """Print a run's device line (then ``header``) and ``markdown``, and write them: ``--save-path``
    ``<result>.md``, ``--json-dir`` ``<result>.json`` (``result`` defaults to the script's ``name``;
    the command recorded reruns ``python -m jit_kernel.benchmark.<name>``; the summary is the first
    paragraph of ``description``)."""
    from jit_kernel.benchmark.utils import SAVE_PATH_ENV, write_summary

    result = result or name
    text = f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; {header}\n\n{markdown}"
    if not complete:
        text = "interrupted: the tables hold what was measured before the stop\n\n" + text
    print("\n" + text)
    write_summary(args.save_path or os.environ.get(SAVE_PATH_ENV) or None, f"{result}.md", text)
    json_dir = result_files.resolve_json_dir(args.json_dir)
    if json_dir:
        summary = result_files.first_paragraph(description)
        doc = result_files.document(
            result, summary, result_files.command_line(name, argv), tables, complete=complete, notes=notes
        )
        print(f"results: {result_files.write(json_dir, doc)}")


# ---------------------------------------------------------------------------------------------
# Starting the ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_environments(world: int, port: int, environ: Mapping[str, str]) -> list[dict[str, str]]:
    """The environment of each rank this script starts: torchrun's variables on 127.0.0.1."""
    base = {**environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), SPAWNED_ENV: "1"}
    base.setdefault("OMP_NUM_THREADS", "1")
    base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    base.setdefault("PYTHONUNBUFFERED", "1")
    return [
        {**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
        for r in range(world)
    ]


def _die_with_parent() -> None:
    """In a rank's process before exec: SIGKILL when the launcher dies (Linux), so that no rank is
    left waiting on a collective."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in processes:
        p.wait()


def launch(args: argparse.Namespace, argv: Sequence[str], name: str = NAME) -> int:
    """Start the ranks of script ``name`` (``python -m jit_kernel.benchmark.<name>``, each rank its
    own session, killed with the launcher) and wait: the exit status is rank 0's, or the first
    failure's; on SIGINT each rank gets one, and rank 0 writes what it measured."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print(f"{name}: no CUDA device; nothing measured")
        return 0
    world, _ = plan_world(args.world, args.ranks_per_gpu, torch.cuda.device_count())
    # The ranks get the same arguments and place themselves as planned here (rank_device).
    command = [sys.executable, "-m", f"jit_kernel.benchmark.{name}", *argv]
    environments = rank_environments(world, free_port(), os.environ)
    processes = [
        subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent) for env in environments
    ]
    deadline = time.monotonic() + args.time_limit
    try:
        while True:
            codes = [p.poll() for p in processes]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or codes[0] is not None:
                break
            if time.monotonic() > deadline:
                print(f"{name}: stopped after --time-limit {args.time_limit:.0f} s", file=sys.stderr)
                _kill(processes)
                return 1
            time.sleep(0.2)
        if failed:  # a rank failed: the others wait on it in a collective (rank 0 writes what it has)
            with contextlib.suppress(subprocess.TimeoutExpired):
                processes[0].wait(timeout=10)
            _kill(processes)
            return failed[0] if failed[0] > 0 else 1
        with contextlib.suppress(subprocess.TimeoutExpired):  # rank 0 is done: the others close theirs
            for p in processes:
                p.wait(timeout=30)
    except KeyboardInterrupt:
        for p in processes:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            processes[0].wait(timeout=15)
        _kill(processes)
        return 130
    _kill(processes)
    codes = [p.returncode for p in processes]
    return codes[0] if codes[0] != 0 else next((c for c in codes if c != 0), 0)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank_main(args, argv)
        return
    code = launch(args, argv)
    if code:
        raise SystemExit(code if code > 0 else 1)


if __name__ == "__main__":
    main()
