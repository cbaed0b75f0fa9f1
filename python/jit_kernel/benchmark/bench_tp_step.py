"""A tensor-parallel decode step: ``--layers`` Llama-3-70B-shaped decoder layers (hidden 8192, 64
query heads, 8 KV heads of 128, intermediate 28672; bf16, random weights) sharded over the ranks,
timed with NCCL all-reduces and unfused norms (``torch.distributed.all_reduce`` then
``jit_kernel.fused_add_rmsnorm``) against jit_kernel.distributed.CustomAllReduce's
``all_reduce_fused_add_rmsnorm`` (one launch), and against our all-reduce unfused; whole steps
captured in CUDA graphs, medians in microseconds per step, measured by every rank at once.

    python -m jit_kernel.benchmark.bench_tp_step                        # one rank per GPU (2 ranks on a 1-GPU host)
    python -m jit_kernel.benchmark.bench_tp_step --world 4              # 4 ranks (4 GPUs of a larger host)
    torchrun --nproc_per_node 8 -m jit_kernel.benchmark.bench_tp_step   # under torchrun: rank r on GPU LOCAL_RANK
    python -m jit_kernel.benchmark.bench_tp_step --layers 4 --context 4096 --batches 1,8,32 --json-dir bench-json

The ranks are started and placed as bench_allreduce does (its launcher, placement and timing are
imported from it): run alone, the script starts one process per rank on 127.0.0.1, in blocks of
``--ranks-per-gpu`` per GPU; under torchrun each process is one rank. Where ranks share a GPU, NCCL
cannot run and the baseline reads n/a; the two forms of ours are timed alone, and those times show
that the step runs, not its speed on separate GPUs.

Sharding over W ranks, Megatron-style: q/k/v column-parallel as one fused weight (64 / W query
heads and max(1, 8 / W) KV heads per rank; where W exceeds 8, each KV head is replicated on W / 8
ranks), o row-parallel, gate and up column-parallel as one fused weight (28672 / W rows each), down
row-parallel. Weights are drawn from N(0, 1 / K), norm weights (the same on every rank) near 1.

A step, at batch B (``--batches``, default 1, 8, 32), one token per sequence: the input (the same
on every rank) is copied into the residual and RMS-normed; then per layer: the qkv GEMM
(``jit_kernel.decode_linear``, which runs its kernel for up to 16 rows and weights up to 128 MiB and
cuBLAS otherwise: the table names the layers its kernel serves), RoPE in place
(``jit_kernel.apply_rope_with_cos_sin_cache_inplace``, NeoX style, theta 500000, at position
``context - 1``), the new K and V written into the rank's cache ``[B, kv_heads, context, 128]``
(torch ``copy_``), ``jit_kernel.decode_attention`` over ``--context`` keys (default 1024), the o
GEMM, all-reduce + residual add + RMSNorm, the gate/up GEMM, ``jit_kernel.silu_and_mul``, the down
GEMM, all-reduce + residual add + RMSNorm (the next layer's input norm, or the final norm). No
embedding and no LM head. The three variants differ only in the all-reduce + norm:

- baseline: ``torch.distributed.all_reduce(x)`` on an NCCL group, then ``fused_add_rmsnorm``;
- ours: ``comm.all_reduce_fused_add_rmsnorm(x, residual, weight, eps)``, one launch;
- ours unfused: ``comm.all_reduce(x, out=x)``, then ``fused_add_rmsnorm``.

Checks, before the timings, on each rank's eager steps from the same inputs: ours gives the same
bits as ours unfused, and the same output on every rank; the baseline is within bf16 rounding of
ours (NCCL sums in another order; the relative L2 error of the output and the residual is shown);
where NCCL cannot run, ours is compared in the same way with ``torch.distributed.all_reduce`` of
float32 copies on the gloo group, eagerly. After its timed replays, each variant's last replayed
step is compared with its eager step. Timing: ``--calls`` steps captured in one CUDA graph (default
20; 5 where ranks share a GPU), replayed for a warm-up and ``--reps`` times between CUDA events
after a barrier of all ranks; a cell shows rank 0's median per step and, in parentheses, the
largest median over the ranks. The results are written as ``bench_tp_step_tp<W>.md`` / ``.json``
(one file per world size).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from jit_kernel.benchmark import bench_allreduce
from jit_kernel.benchmark import results as result_files
from jit_kernel.benchmark._tables import format_table, ratio_cell
from jit_kernel.benchmark.bench_allreduce import RankGroup, Timing, rank_device, time_cell, timing_counts

NAME = "bench_tp_step"
DTYPE = torch.bfloat16
# Llama-3-70B
HIDDEN = 8192
HEADS = 64
KV_HEADS = 8
HEAD_DIM = 128
INTERMEDIATE = 28672
ROPE_THETA = 500000.0
EPS = 1e-5
BATCHES = [1, 8, 32]
MAX_RANKS = bench_allreduce.MAX_RANKS
#: The relative L2 error (of the output and of the residual) within which the baseline counts as
#: agreeing with ours: NCCL rounds its partial sums in another order, and the differences travel
#: through the following layers.
TOLERANCE = 3e-2

# provider -> column label
PROVIDERS = {"nccl": "baseline", "fused": "ours", "unfused": "ours unfused"}
#: The reference the baseline's check uses where NCCL cannot run (eager only, never timed).
GLOO = "gloo"
LINEARS = ("qkv", "o", "gate_up", "down")


# ---------------------------------------------------------------------------------------------
# Sharding (pure)


@dataclasses.dataclass(frozen=True)
class Shard:
    """What one rank of ``world`` holds of a Llama-3-70B decoder layer."""

    world: int
    heads: int  # query heads
    kv_heads: int
    kv_replicas: int  # ranks holding each of this rank's KV heads (1 unless world > KV_HEADS)
    intermediate: int  # rows of gate and of up; columns of down

    @property
    def q_size(self) -> int:
        return self.heads * HEAD_DIM

    @property
    def kv_size(self) -> int:
        return self.kv_heads * HEAD_DIM

    def weight_shapes(self) -> dict[str, tuple[int, int]]:
        """``[N, K]`` (``nn.Linear``'s layout) of each linear layer's shard."""
        return {
            "qkv": (self.q_size + 2 * self.kv_size, HIDDEN),
            "o": (HIDDEN, self.q_size),
            "gate_up": (2 * self.intermediate, HIDDEN),
            "down": (HIDDEN, self.intermediate),
        }

    def kv_cache_shape(self, batch: int, context: int) -> tuple[int, int, int, int]:
        return (batch, self.kv_heads, context, HEAD_DIM)

    def weight_bytes(self) -> int:
        """The bytes of one layer's linear weights on this rank (what a step reads per layer)."""
        return sum(n * k for n, k in self.weight_shapes().values()) * DTYPE.itemsize


def shard(world: int) -> Shard:
    """The shard of each rank at tensor-parallel size ``world``; ValueError where the heads or the
    intermediate size do not split evenly."""
    if type(world) is not int or world < 1:
        raise ValueError(f"world size must be a positive int, got {world!r}")
    if HEADS % world or INTERMEDIATE % world:
        raise ValueError(
            f"world size {world}: {HEADS} query heads and {INTERMEDIATE} intermediate rows must split evenly"
        )
    if world <= KV_HEADS:
        if KV_HEADS % world:
            raise ValueError(f"world size {world}: {KV_HEADS} KV heads must split evenly")
        return Shard(world, HEADS // world, KV_HEADS // world, 1, INTERMEDIATE // world)
    if world % KV_HEADS:
        raise ValueError(
            f"world size {world}: above {KV_HEADS} it must be a multiple of {KV_HEADS} (KV heads replicated)"
        )
    return Shard(world, HEADS // world, 1, world // KV_HEADS, INTERMEDIATE // world)


def kernel_linears(s: Shard, batch: int) -> list[str]:
    """The linear layers that ``decode_linear`` runs its kernel for at ``batch`` rows (the others go
    to cuBLAS): its own rule, asked of fake CUDA tensors (contiguous, so aligned)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jit_kernel.ops.gemm import decode_linear_serves

    served = []
    with FakeTensorMode():
        for name, (n, k) in s.weight_shapes().items():
            x = torch.empty(batch, k, dtype=DTYPE, device="cuda")
            if decode_linear_serves(x, torch.empty(n, k, dtype=DTYPE, device="cuda")):
                served.append(name)
    return served


def linears_cell(served: Sequence[str]) -> str:
    return ", ".join(served) if served else "none (cuBLAS)"


def max_bytes(batches: Sequence[int]) -> int:
    """The communicator's buffer: the largest all-reduce, ``[max batch, HIDDEN]`` bf16, in 16 bytes."""
    return -(-max(batches) * HIDDEN * DTYPE.itemsize // 16) * 16


# ---------------------------------------------------------------------------------------------
# Arguments (pure)


def batch_list(value: str) -> list[int]:
    try:
        batches = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"comma-separated batch sizes, e.g. 1,8,32; got {value!r}") from None
    if not batches or any(b < 1 for b in batches):
        raise argparse.ArgumentTypeError(f"batch sizes must be at least 1, got {value!r}")
    return batches


def arg_parser() -> argparse.ArgumentParser:
    """bench_allreduce's arguments (ranks, placement, timing; ``--calls``: steps per graph), and the
    model's."""
    parser = bench_allreduce.arg_parser()
    parser.description = __doc__
    parser.add_argument("--layers", type=int, default=2, help="decoder layers in a step (default 2)")
    parser.add_argument("--context", type=int, default=1024, help="keys each sequence attends to (default 1024)")
    parser.add_argument(
        "--batches", type=batch_list, default=list(BATCHES), help="batch sizes, comma-separated (default 1,8,32)"
    )
    return parser


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = arg_parser()
    args = bench_allreduce.parse_args(argv, parser)
    if args.layers < 1 or args.context < 1:
        parser.error(f"--layers and --context must be at least 1, got {args.layers} and {args.context}")
    if args.world is not None:
        try:
            shard(args.world)
        except ValueError as e:
            parser.error(f"--world: {e}")
    return args


# ---------------------------------------------------------------------------------------------
# Checks and tables (pure)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` in float32 (inf where the output is not finite)."""
    a, e = actual.float(), expected.float()
    if not bool(torch.isfinite(a).all()):
        return math.inf
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def bits_check(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str) -> str:
    """ "bits = <what>", or WRONG with the number of elements that differ."""
    wrong = sum(int((a.view(torch.int16) != e.view(torch.int16)).sum()) for a, e in zip(actual, expected, strict=True))
    total = sum(a.numel() for a in actual)
    return f"bits = {what}" if wrong == 0 else f"WRONG: {wrong} of {total} elements differ from {what}"


def close_check(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], what: str) -> str:
    """ "close to <what> (rel ...)": the largest relative L2 error over the tensors, WRONG above
    :data:`TOLERANCE`."""
    error = max(relative_error(a, e) for a, e in zip(actual, expected, strict=True))
    verdict = "close to" if error <= TOLERANCE else "WRONG: not close to"
    return f"{verdict} {what} (rel {error:.1e})"


def merge_checks(gathered: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """provider -> its check: every rank's WRONG verdicts (``rank r: ...``) where any rank has one,
    else rank 0's."""
    merged: dict[str, str] = {}
    for provider in gathered[0]:
        wrong = [f"rank {r}: {c[provider]}" for r, c in enumerate(gathered) if "WRONG" in c.get(provider, "")]
        merged[provider] = "; ".join(wrong) if wrong else gathered[0][provider]
    return merged


Results = Mapping[tuple[int, str], Timing]  # (batch, provider) -> Timing

HEADER = [
    "batch",
    "baseline us",
    "ours us",
    "ours-unfused us",
    "baseline / ours",
    "unfused / fused",
    "decode_linear kernel for",
    "checks",
]


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """What the device line and the table's title say about a run."""

    world: int
    gpus: int
    shared: bool
    steps: int  # per CUDA graph
    reps: int
    layers: int
    context: int
    custom_path: str  # "custom kernels" or why every call falls back


def result_name(world: int) -> str:
    """The results' name (``<name>.md``, ``<name>.json``): one per world size."""
    return f"{NAME}_tp{world}"


def header_line(info: StepInfo) -> str:
    line = (
        f"{info.world} ranks on {info.gpus} GPU(s); {info.steps} steps per CUDA graph, median of {info.reps} "
        "replays; a cell: rank 0's median us per step (the largest median over the ranks)"
    )
    if info.custom_path != "custom kernels":
        line += f"; CustomAllReduce falls back to torch.distributed ({info.custom_path})"
    return line


def title(info: StepInfo) -> str:
    s = shard(info.world)
    return (
        f"TP={info.world} decode step, {info.layers} Llama-3-70B layers (per rank: {s.heads} query heads, "
        f"{s.kv_heads} KV heads, {s.intermediate} intermediate; context {info.context}, bf16): "
        "NCCL + fused_add_rmsnorm against all_reduce_fused_add_rmsnorm"
    )


def step_rows(results: Results, batches: Sequence[int], info: StepInfo) -> list[list[object]]:
    """One row per batch measured (or tried)."""
    rows: list[list[object]] = []
    s = shard(info.world)
    for batch in batches:
        cells = {p: results.get((batch, p)) for p in PROVIDERS}
        if not any(cells.values()):
            continue
        nccl, fused, unfused = (cells[p] or Timing() for p in PROVIDERS)
        checks = "; ".join(f"{PROVIDERS[p]}: {t.check}" for p, t in cells.items() if t and t.check)
        rows.append(
            [
                batch,
                time_cell(nccl),
                time_cell(fused),
                time_cell(unfused),
                ratio_cell(nccl.us, fused.us),
                ratio_cell(unfused.us, fused.us),
                linears_cell(kernel_linears(s, batch)),
                checks,
            ]
        )
    return rows


SHARED_NOTE = (
    "ranks share a GPU: NCCL cannot run, and the times include the GPU's time-slicing between the "
    "ranks' processes; they show that the step runs, not its speed on separate GPUs"
)
RATIO_NOTE = "baseline / ours and unfused / fused: above 1.00x, ours (one launch) is faster"
STEP_NOTE = (
    "a step per layer: qkv GEMM, RoPE, K/V written into the cache (torch copy_), decode_attention, "
    "o GEMM, all-reduce + add + RMSNorm, gate/up GEMM, silu_and_mul, down GEMM, all-reduce + add + "
    "RMSNorm; before the first layer, the input copied into the residual and RMS-normed"
)


def reasons(results: Results) -> list[str]:
    """Each provider's reason for a missing time, once per (provider, reason)."""
    seen: dict[tuple[str, str], None] = {}
    for (_, provider), timing in results.items():
        if timing.reason:
            seen[(PROVIDERS.get(provider, provider), timing.reason)] = None
    return [f"{label}: not measured: {reason}" for label, reason in seen]


def output(results: Results, info: StepInfo, batches: Sequence[int]) -> tuple[str, list[result_files.Json], list[str]]:
    """(markdown, JSON tables, notes) of a run's measurements."""
    rows = step_rows(results, batches, info)
    notes = [RATIO_NOTE, STEP_NOTE, *([SHARED_NOTE] if info.shared else []), *reasons(results)]
    markdown = format_table(title(info), HEADER, rows)
    markdown += "\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    table = result_files.cells_table(f"tp{info.world}", title(info), HEADER, rows)
    return markdown, [table], notes


# ---------------------------------------------------------------------------------------------
# The model on one rank


@dataclasses.dataclass
class Layer:
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    k_cache: torch.Tensor  # [max batch, kv_heads, context, HEAD_DIM]
    v_cache: torch.Tensor


@dataclasses.dataclass
class Inputs:
    """One variant's tensors at one batch: the step's input (the same on every rank) and residual,
    the RoPE positions and the attention's lengths."""

    embed: torch.Tensor
    residual: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor


ReduceNorm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (x, residual, weight), in place


def cos_sin_cache(context: int, device: torch.device) -> torch.Tensor:
    """``[context, HEAD_DIM]`` float32: cos of each position's angles, then their sin (NeoX RoPE)."""
    inv_freq = ROPE_THETA ** -(torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    angles = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float().to(device)


class Model:
    """``layers`` decoder layers of this rank's shard, random weights, and its KV caches."""

    def __init__(self, s: Shard, layers: int, context: int, max_batch: int, rank: int, device: torch.device) -> None:
        self.shard, self.context, self.device = s, context, device
        generator = torch.Generator(device=device)

        def normal(shape: Sequence[int], seed: int, std: float) -> torch.Tensor:
            generator.manual_seed(seed)
            return torch.randn(*shape, generator=generator, device=device, dtype=DTYPE).mul_(std)

        def norm_weight(seed: int) -> torch.Tensor:  # the same on every rank: the hidden state is replicated
            generator.manual_seed(seed)
            return (1 + 0.1 * torch.randn(HIDDEN, generator=generator, device=device)).to(DTYPE)

        shapes = s.weight_shapes()
        self.layers = []
        for index in range(layers):
            seed = 1_000_003 * (index + 1) + 1009 * rank  # this rank's shard
            weights = {name: normal((n, k), seed + j, k**-0.5) for j, (name, (n, k)) in enumerate(shapes.items())}
            cache = s.kv_cache_shape(max_batch, context)
            self.layers.append(
                Layer(
                    **weights,
                    input_norm=norm_weight(7 * index + 1),
                    post_attention_norm=norm_weight(7 * index + 2),
                    k_cache=normal(cache, seed + 11, 1.0),
                    v_cache=normal(cache, seed + 12, 1.0),
                )
            )
        self.final_norm = norm_weight(7 * layers + 3)
        self.cos_sin = cos_sin_cache(context, device)

    def inputs(self, batch: int) -> Inputs:
        generator = torch.Generator(device=self.device).manual_seed(31 * batch)  # the same on every rank
        embed = torch.randn(batch, HIDDEN, generator=generator, device=self.device).to(DTYPE)
        positions = torch.full((batch,), self.context - 1, dtype=torch.int64, device=self.device)
        seq_lens = torch.full((batch,), self.context, dtype=torch.int32, device=self.device)
        return Inputs(embed, torch.empty_like(embed), positions, seq_lens)

    def step(self, inputs: Inputs, reduce_norm: ReduceNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: ``(hidden, residual)`` after the final norm."""
        import jit_kernel

        s, position = self.shard, self.context - 1
        batch = inputs.embed.shape[0]
        residual = inputs.residual
        residual.copy_(inputs.embed)
        hidden = jit_kernel.rmsnorm(residual, self.layers[0].input_norm, EPS)
        for index, layer in enumerate(self.layers):
            qkv = jit_kernel.decode_linear(hidden, layer.qkv)
            q = qkv[:, : s.q_size]
            k = qkv[:, s.q_size : s.q_size + s.kv_size]
            v = qkv[:, s.q_size + s.kv_size :]
            jit_kernel.apply_rope_with_cos_sin_cache_inplace(inputs.positions, q, k, HEAD_DIM, self.cos_sin)
            k_cache, v_cache = layer.k_cache[:batch], layer.v_cache[:batch]
            k_cache[:, :, position].copy_(k.view(batch, s.kv_heads, HEAD_DIM))
            v_cache[:, :, position].copy_(v.view(batch, s.kv_heads, HEAD_DIM))
            attention = jit_kernel.decode_attention(q.view(batch, s.heads, HEAD_DIM), k_cache, v_cache, inputs.seq_lens)
            x = jit_kernel.decode_linear(attention.view(batch, s.q_size), layer.o)
            reduce_norm(x, residual, layer.post_attention_norm)
            x = jit_kernel.silu_and_mul(jit_kernel.decode_linear(x, layer.gate_up))
            x = jit_kernel.decode_linear(x, layer.down)
            last = index + 1 == len(self.layers)
            reduce_norm(x, residual, self.final_norm if last else self.layers[index + 1].input_norm)
            hidden = x
        return hidden, residual


# ---------------------------------------------------------------------------------------------
# A rank


class TPRank(RankGroup):
    """One rank: its shard of the model, the communicator, the NCCL group where it runs, and the
    checks and timings of the variants, in step with the other ranks."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int, device: int) -> None:
        from jit_kernel.distributed import CustomAllReduce

        super().__init__(rank, world, device)
        self.args = args
        uuids = self.gather(str(torch.cuda.get_device_properties(self.device).uuid))
        self.gpus = len(set(uuids))
        self.shared = self.gpus < world
        self.calls, self.reps = timing_counts(args, self.shared)
        self.batches: list[int] = list(args.batches)
        self.shard = shard(world)
        self.skip: dict[str, str] = {}
        why = bench_allreduce.unavailable(self.shared, self.dist.is_nccl_available()).get("nccl")
        if why:
            self.skip["nccl"] = why
        self.comm = CustomAllReduce(
            self.dist.group.WORLD, device=self.device, max_bytes=max_bytes(self.batches), timeout_s=args.peer_timeout
        )
        self.nccl: Any = None
        self.model = Model(self.shard, args.layers, args.context, max(self.batches), rank, self.device)
        self.results: dict[tuple[int, str], Timing] = {}

    # -- the variants --------------------------------------------------------------------------

    def reduce_norm(self, provider: str) -> ReduceNorm:
        import jit_kernel

        comm = self.comm
        if provider == "fused":
            return lambda x, residual, weight: comm.all_reduce_fused_add_rmsnorm(x, residual, weight, EPS)
        if provider == "unfused":

            def unfused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
                comm.all_reduce(x, out=x)
                jit_kernel.fused_add_rmsnorm(x, residual, weight, EPS)

            return unfused
        if provider == GLOO:  # the world group, eager only: a float32 sum, rounded once

            def gloo(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
                total = x.float()
                self.dist.all_reduce(total)
                x.copy_(total)
                jit_kernel.fused_add_rmsnorm(x, residual, weight, EPS)

            return gloo
        if provider != "nccl":
            raise ValueError(f"unknown provider {provider!r}")

        def nccl(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
            self.dist.all_reduce(x, group=self.nccl)
            jit_kernel.fused_add_rmsnorm(x, residual, weight, EPS)

        return nccl

    def setup(self) -> None:
        import jit_kernel

        # Every kernel but the collectives, loaded (or compiled) by a step without all-reduces at each
        # batch, then a barrier: no rank waits inside a custom all-reduce for a peer still compiling.
        def local(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
            jit_kernel.fused_add_rmsnorm(x, residual, weight, EPS)

        for batch in self.batches:
            self.model.step(self.model.inputs(batch), local)
        torch.cuda.synchronize(self.device)
        self.dist.barrier()
        if self.comm.disabled_reason is not None:
            why = f"CustomAllReduce falls back to torch.distributed ({self.comm.disabled_reason})"
            self.skip.update({"fused": why, "unfused": why})
        if "nccl" not in self.skip:

            def nccl() -> None:
                self.nccl = self.dist.new_group(backend="nccl")
                self.dist.all_reduce(torch.ones(16, device=self.device), group=self.nccl)

            error = self.attempt(nccl)
            if error:
                self.skip["nccl"] = error

    # -- checks --------------------------------------------------------------------------------

    def eager(self, batch: int, provider: str) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = self.model.step(self.model.inputs(batch), self.reduce_norm(provider))
        return hidden.clone(), residual.clone()

    def check(self, batch: int) -> tuple[dict[str, str], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """Every measurable variant's eager step, checked (see the module's text): (provider -> its
        check, merged over the ranks; provider -> its eager (hidden, residual))."""
        outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        tried = [p for p in PROVIDERS if p not in self.skip] + ([GLOO] if "nccl" in self.skip else [])
        checks: dict[str, str] = {}
        for provider in tried:
            error = self.attempt(lambda p=provider: outputs.__setitem__(p, self.eager(batch, p)))
            if error:
                outputs.pop(provider, None)
                checks[provider] = f"eager step failed: {error}"
        fused, unfused, reference = outputs.get("fused"), outputs.get("unfused"), outputs.get("nccl")
        if fused is not None:
            found = []
            if unfused is not None:
                found.append(bits_check(fused, unfused, "unfused"))
            digests = self.gather([int(t.view(torch.int16).long().sum()) for t in fused])
            found.append("same on every rank" if all(d == digests[0] for d in digests) else "WRONG: ranks differ")
            if GLOO in outputs:
                found.append(close_check(outputs[GLOO], fused, "torch.distributed (gloo)"))
            elif GLOO in checks:
                found.append(f"not compared with torch.distributed (gloo): {checks[GLOO]}")
            checks["fused"] = ", ".join(found)
        if reference is not None and fused is not None:
            checks["nccl"] = close_check(reference, fused, "ours")
        checks.pop(GLOO, None)
        merged = merge_checks(self.gather(checks))
        return merged, outputs

    # -- timing --------------------------------------------------------------------------------

    def measure(self, batch: int, provider: str, check: str, eager: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Time the variant's step at ``batch`` on every rank at once (CUDA graph of ``calls`` steps,
        replays between events after a barrier); rank 0 keeps its median and the largest over the
        ranks."""
        result_files.check_stop()
        key = (batch, provider)
        if provider in self.skip:
            self.results[key] = Timing(reason=self.skip[provider], check=check)
            return
        if eager is None:
            self.results[key] = Timing(reason="its eager step failed", check=check)
            return
        inputs = self.model.inputs(batch)
        reduce_norm = self.reduce_norm(provider)
        graph = torch.cuda.CUDAGraph()
        last: list[tuple[torch.Tensor, torch.Tensor]] = []

        def capture() -> None:
            # One eager step on the capture stream first (cuBLAS' workspace for that stream, lazy set-ups).
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.model.step(inputs, reduce_norm)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            # thread_local: the NCCL watchdog's event queries on its own thread stay legal during capture.
            graphed = torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local")
            with self.comm.capture(), graphed:
                for _ in range(self.calls):
                    last[:] = [self.model.step(inputs, reduce_norm)]

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
        if error is None:  # the last replayed step against the eager one
            replayed = last[0]
            if provider == "nccl":
                found = close_check(replayed, eager, "eager")
            else:
                found = bits_check(replayed, eager, "eager")
            check = ", ".join(filter(None, [check, "replay: " + found]))
        gathered = self.gather((median, error, check))
        first_error = next((f"rank {r}: {e}" for r, (_, e, _) in enumerate(gathered) if e), None)
        wrong = [f"rank {r}: {c}" for r, (_, _, c) in enumerate(gathered) if "WRONG" in c]
        check = "; ".join(wrong) if wrong else check
        if first_error:
            self.results[key] = Timing(reason=first_error, check=check)
        else:
            self.results[key] = Timing(gathered[0][0], max(m for m, _, _ in gathered), check=check)

    def run(self) -> None:
        self.setup()
        for batch in self.batches:
            checks, outputs = self.check(batch)
            print(f"checks, batch {batch}: " + "; ".join(f"{PROVIDERS[p]}: {c}" for p, c in checks.items()), flush=True)
            for provider in PROVIDERS:
                self.measure(batch, provider, checks.get(provider, ""), outputs.get(provider))
            torch.cuda.empty_cache()

    def info(self) -> StepInfo:
        path = "custom kernels" if self.comm.disabled_reason is None else self.comm.disabled_reason
        return StepInfo(
            self.world, self.gpus, self.shared, self.calls, self.reps, self.args.layers, self.args.context, path
        )

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        self.dist.barrier()
        self.comm.close()
        self.dist.destroy_process_group()


def rank_main(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """One rank (under torchrun, or started by the launcher): rank 0 prints and writes the table."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if rank != 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (kept open until the process exits)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        print(f"{NAME}: no CUDA device; nothing measured")
        return
    if args.world is not None and args.world != world:
        raise SystemExit(f"{NAME}: --world {args.world}, but WORLD_SIZE is {world}")
    if world < 2:
        print(f"{NAME}: world size 1; a tensor-parallel step needs 2 ranks or more (run it without torchrun)")
        return
    try:
        shard(world)
    except ValueError as e:
        raise SystemExit(f"{NAME}: {e}") from None
    device = rank_device(local_rank, local_world, gpus, args.ranks_per_gpu)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    # A collective may wait for a rank compiling a kernel on first use: minutes, not the default 30.
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    state = TPRank(args, rank, world, device)
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
        write_output(args, argv, state.results, state.info(), complete)
    if failure is not None:
        print(failure, file=sys.stderr)
        raise SystemExit(1)
    if not complete:
        raise SystemExit(130)
    state.close()


def write_output(
    args: argparse.Namespace, argv: Sequence[str] | None, results: Results, info: StepInfo, complete: bool
) -> None:
    """Print the table and write it (``--save-path``: markdown; ``--json-dir``: JSON), as
    ``bench_tp_step_tp<W>``."""
    markdown, tables, notes = output(results, info, args.batches)
    bench_allreduce.publish(
        args,
        argv,
        header_line(info),
        markdown,
        tables,
        notes,
        complete,
        name=NAME,
        result=result_name(info.world),
        description=__doc__,
    )


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank_main(args, argv)
        return
    if torch.cuda.is_available() and torch.cuda.device_count() > 0 and args.world is None:
        world, _ = bench_allreduce.plan_world(None, args.ranks_per_gpu, torch.cuda.device_count())
        try:
            shard(world)
        except ValueError as e:
            raise SystemExit(f"{NAME}: {e}; pass --world 2, 4 or 8") from None
    code = bench_allreduce.launch(args, argv, name=NAME)
    if code:
        raise SystemExit(code if code > 0 else 1)


if __name__ == "__main__":
    main()
