"""jit_kernel.distributed without a GPU: the algorithm choice, the fallbacks (world size 1; CPU
tensors on a gloo group of two processes really run torch.distributed.all_reduce, on the
fallback group; the set-up's decisions on mocked hosts and GPUs), debug mode on two gloo ranks, bad
input, the staging of layouts one rank's tensors alone have, the fake implementations, and the
CUDA sources compiled for sm_90a."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
import torch.distributed as dist

from _norm_helpers import fake_cuda
from jit_kernel import distributed
from jit_kernel.distributed import CustomAllReduce, PeerTimeoutError
from jit_kernel.engine import families
from jit_kernel.engine.dispatch import jit_module
from jit_kernel.engine.spec import symbol_name
from jit_kernel.ops import allreduce as ops

TESTS = Path(__file__).resolve().parent


def test_algorithm_by_size_and_world() -> None:
    limit = ops.ONE_SHOT_MAX_BYTES
    for world in (2, 3, 4, 8):
        assert ops.choose_algorithm(16, world) == ops.ONE_SHOT
        assert ops.choose_algorithm(limit, world) == ops.ONE_SHOT
    assert ops.choose_algorithm(limit + 16, 2) == ops.ONE_SHOT  # two ranks: always one-shot
    for world in (3, 4, 8):
        assert ops.choose_algorithm(limit + 16, world) == ops.TWO_SHOT
        assert ops.choose_algorithm(8 << 20, world) == ops.TWO_SHOT


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _specialised_vectors_per_thread(hidden: int, dtype: torch.dtype) -> int:
    """RowShape<T, kHidden, kFused=true, 1>::kPer (csrc/norm/rmsnorm.cuh): the kernels that
    fused_add_rmsnorm runs for a specialised hidden size, restated."""
    vectors = hidden // (16 // dtype.itemsize)
    return _ceil(vectors, 512)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_form_holds_rows_as_fused_add_rmsnorm_does(dtype: torch.dtype) -> None:
    """The fused kernel reduces a row with the lanes and vectors per thread of the norm's own row
    kernel: for every specialised hidden size, the bounded kernel's rule (ours) is the specialised
    kernel's, and so is the block size derived from it."""
    for hidden in families.NORM_HIDDEN_SIZES:
        kper = ops.fused_vectors_per_thread(hidden, dtype)
        assert kper == _specialised_vectors_per_thread(hidden, dtype), hidden
        vectors = hidden // (16 // dtype.itemsize)
        specialised_group = (_ceil(vectors, kper) + 31) // 32 * 32  # RowShape::kGroup
        bounded_threads = _ceil(_ceil(vectors, kper), 32) * 32  # launch_bounded's block size
        assert specialised_group == bounded_threads


def test_fused_form_row_limits() -> None:
    assert ops.fused_vectors_per_thread(8, torch.bfloat16) == 1
    assert ops.fused_vectors_per_thread(4096, torch.bfloat16) == 1
    assert ops.fused_vectors_per_thread(8192, torch.bfloat16) == 2
    assert ops.fused_vectors_per_thread(16384, torch.bfloat16) == 4
    assert ops.fused_vectors_per_thread(8192, torch.float32) == 4
    assert ops.fused_vectors_per_thread(16384, torch.float32) == 0  # too wide: all_reduce + norm
    assert ops.fused_vectors_per_thread(1001, torch.bfloat16) == 0  # not whole vectors
    assert ops.fused_vectors_per_thread(0, torch.bfloat16) == 0


@pytest.fixture
def single_rank_group() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_world_size_one_is_a_no_op(single_rank_group: None) -> None:
    comm = CustomAllReduce(dist.group.WORLD)
    x = torch.arange(10, dtype=torch.float32)
    assert comm.all_reduce(x) is x
    out = torch.zeros_like(x)
    assert comm.all_reduce(x, out=out) is out
    assert torch.equal(out, x)
    assert comm.fallback_reason(x) == "world size 1"
    comm.check()  # nothing to check
    with comm.capture():
        pass
    comm.close()


def test_bad_constructor_arguments(single_rank_group: None) -> None:
    for bad in (0, 15, -16, 1.5):
        with pytest.raises(ValueError, match="max_bytes"):
            CustomAllReduce(dist.group.WORLD, max_bytes=bad)  # type: ignore[arg-type]
    for bad in (0, -1, True, "1"):
        with pytest.raises(ValueError, match="timeout_s"):
            CustomAllReduce(dist.group.WORLD, timeout_s=bad)  # type: ignore[arg-type]


def test_unknown_handle_is_refused() -> None:
    with pytest.raises(ValueError, match="no communicator has handle 987654"):
        ops.custom_all_reduce(torch.zeros(4), 987654)


def _two_rank_stub(max_bytes: int = 1 << 20) -> CustomAllReduce:
    """Rank 0 of a would-be two-rank communicator whose kernels serve (no process group, no
    regions): for the per-call decisions and the fake implementations, which touch neither."""
    comm = object.__new__(CustomAllReduce)
    comm.world_size, comm.rank, comm.max_bytes, comm.group, comm.fallback_group = 2, 0, max_bytes, None, None
    comm.disabled_reason, comm.debug, comm.device = None, False, None
    comm.timeout_s, comm.timeout_ns = 1.0, 10**9
    comm.peers = torch.zeros(2, 2, dtype=torch.int64)
    comm.error_address, comm._error, comm._failed, comm._capturing = 0, None, None, False
    comm._regions = []
    comm.graph_inputs, comm.max_graph_calls = "copy", 32768
    comm._graph_table, comm._graph_table_address, comm._graph_slots, comm._graph_calls = None, 0, 0, []
    comm._opened, comm.registered_graph_calls, comm.copied_graph_calls = {}, 0, 0
    comm.handle = 10**6 + id(comm) % 1000
    ops.COMMUNICATORS[comm.handle] = comm
    return comm


def test_fallback_reasons_per_call() -> None:
    comm = _two_rank_stub(max_bytes=1024)
    try:
        with fake_cuda():
            assert comm.fallback_reason(torch.empty(512, dtype=torch.bfloat16, device="cuda")) is None
            assert "max_bytes=1024" in str(comm.fallback_reason(torch.empty(513, dtype=torch.bfloat16, device="cuda")))
            assert "int32" in str(comm.fallback_reason(torch.empty(4, dtype=torch.int32, device="cuda")))
        assert comm.fallback_reason(torch.empty(4)) == "cpu tensors"
        comm.disabled_reason = "the group spans hosts (a, b)"
        assert comm.fallback_reason(torch.empty(4)) == "the group spans hosts (a, b)"
    finally:
        comm.close()


def test_recorded_timeout_raises_naming_the_ranks() -> None:
    comm = _two_rank_stub()
    try:
        comm._error = numpy.zeros(8, dtype=numpy.int32)
        comm._error[1] = 1  # what a kernel writes when rank 1 did not arrive
        with pytest.raises(PeerTimeoutError, match=r"rank\(s\) \[1\] did not arrive within timeout_s=1.0"):
            comm.before_call()
        comm._error[1] = 0
        with pytest.raises(PeerTimeoutError):  # sticky: the communicator stays refused
            comm.before_call()
    finally:
        comm.close()


def test_fakes_allocate_and_check() -> None:
    comm = _two_rank_stub()
    try:
        with fake_cuda():
            x = torch.empty(64, 4096, dtype=torch.bfloat16, device="cuda")
            out = torch.ops.jit_kernel.custom_all_reduce(x, comm.handle)
            assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
            residual, weight = torch.empty_like(x), torch.empty(4096, dtype=torch.bfloat16, device="cuda")
            torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm(x, residual, weight, 1e-6, comm.handle)
            # The launcher's checks run on the fakes: a weight of the wrong width is refused.
            with pytest.raises(ValueError, match="weight"):
                torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm(
                    x, residual, torch.empty(2048, dtype=torch.bfloat16, device="cuda"), 1e-6, comm.handle
                )
            scale = torch.empty(1, dtype=torch.float32, device="cuda")
            q = torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm_quant_fp8(
                x, residual, weight, scale, 1e-6, comm.handle
            )
            assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
            with pytest.raises(ValueError, match="scale"):
                torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm_quant_fp8(
                    x, residual, weight, torch.empty(2, dtype=torch.float32, device="cuda"), 1e-6, comm.handle
                )
            with pytest.raises(TypeError, match="x"):
                torch.ops.jit_kernel.custom_all_reduce_out(torch.empty_like(x, dtype=torch.float16), x, comm.handle)
    finally:
        comm.close()


def test_fake_under_torch_compile() -> None:
    comm = _two_rank_stub()
    try:
        with fake_cuda():
            x = torch.empty(8, 4096, dtype=torch.bfloat16, device="cuda")

            def step(t: torch.Tensor) -> torch.Tensor:
                return comm.all_reduce(t) * 2

            from torch._dynamo.testing import EagerAndRecordGraphs

            backend = EagerAndRecordGraphs()
            torch._dynamo.reset()
            torch.compile(step, backend=backend, fullgraph=True)(x)
            code = backend.graphs[0].code
            assert "custom_all_reduce" in code
    finally:
        torch._dynamo.reset()
        comm.close()


@pytest.mark.parametrize("dtype", ["bf16_t", "fp16_t", "fp32_t"])
def test_compiles_for_sm90a_without_a_gpu(dtype: str) -> None:
    spec = families.CUSTOM_ALL_REDUCE
    module = jit_module(spec, (dtype,), cuda_arch="9.0a")
    for export in spec.exports:
        assert module.implements_function(symbol_name(spec, export, (dtype,)))


# Two gloo ranks, CPU tensors: the fallback runs torch.distributed.all_reduce for real. The ranks
# are spawned by a subprocess under a hard timeout, so that a hang fails the test instead of CI.

_SPAWN = """
import sys
sys.path.insert(0, {tests!r})
import torch.multiprocessing as mp
import test_allreduce_cpu as m
mp.spawn(m.{entry}, args=({world}, {init!r}), nprocs={world}, join=True)
"""


def _spawn_gloo(entry: str, world: int) -> None:
    """Run ``entry(rank, world, init)`` on ``world`` gloo ranks without a GPU, under a hard timeout."""
    with tempfile.TemporaryDirectory() as tmp:
        code = _SPAWN.format(tests=str(TESTS), entry=entry, world=world, init=f"{tmp}/init")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
        assert result.returncode == 0, result.stdout + result.stderr


def gloo_cpu_rank(rank: int, world: int, init: str) -> None:
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("jit_kernel.distributed").addHandler(Keep())
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    comm = CustomAllReduce(dist.group.WORLD)
    x = torch.arange(6, dtype=torch.float32) + rank
    expected = sum(torch.arange(6, dtype=torch.float32) + r for r in range(world))
    for _ in range(3):
        assert torch.equal(comm.all_reduce(x), expected)
    out = torch.empty_like(x)
    assert comm.all_reduce(x, out=out) is out and torch.equal(out, expected)
    y = x.clone()
    comm.all_reduce(y, out=y)
    assert torch.equal(y, expected)
    # One log line per reason, however many calls take it.
    assert len(records) == len(set(records)) >= 1, records
    assert all("falls back to torch.distributed.all_reduce" in r for r in records)
    if not torch.cuda.is_available():
        assert comm.disabled_reason is not None and "no CUDA device" in comm.disabled_reason
    comm.close()
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2])
def test_cpu_tensors_on_gloo_run_torch_all_reduce(world: int) -> None:
    _spawn_gloo("gloo_cpu_rank", world)


def _raises_on_this_rank(call: Any, *expected: str) -> None:
    try:
        call()
    except ValueError as error:
        assert all(text in str(error) for text in expected), (str(error), expected)
    else:
        raise AssertionError(f"no ValueError ({expected})")


def gloo_debug_rank(rank: int, world: int, init: str) -> None:
    """debug=True: shapes or dtypes that differ between the ranks raise ValueError on every rank,
    naming each rank's, before any rank reduces; the ranks stay in step and the next call serves."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    # Debug mode makes collectives of its own: the ranks must agree on it.
    _raises_on_this_rank(
        lambda: CustomAllReduce(dist.group.WORLD, debug=rank == 0),
        "the ranks pass different (max_bytes, graph_inputs, max_graph_calls, debug)",
    )
    # The refused communicator keeps nothing (a registered one would outlive the group).
    assert not distributed._ops.COMMUNICATORS
    comm = CustomAllReduce(dist.group.WORLD, debug=True)
    x = torch.arange(6, dtype=torch.float32) + rank
    expected = sum(torch.arange(6, dtype=torch.float32) + r for r in range(world))
    assert torch.equal(comm.all_reduce(x), expected)  # the same shape and dtype: the check passes
    mismatch = "the ranks pass different shapes or dtypes"
    _raises_on_this_rank(lambda: comm.all_reduce(torch.zeros(6 + rank)), mismatch, "(6,)", "(7,)")
    other = torch.zeros(6, dtype=torch.float64 if rank == 1 else torch.float32)
    _raises_on_this_rank(lambda: comm.all_reduce(other), mismatch, "torch.float32", "torch.float64")
    # The fused forms check x, residual and weight (before the norm, which takes no CPU tensors).
    rows, width = torch.zeros(2, 128), torch.zeros(2, 128 + 128 * rank)
    weight, scale = torch.ones(128), torch.ones(1)
    _raises_on_this_rank(lambda: comm.all_reduce_fused_add_rmsnorm(rows, width, weight), mismatch, "(2, 256)")
    _raises_on_this_rank(
        lambda: comm.all_reduce_fused_add_rmsnorm_quant_fp8(rows, width, weight, scale), mismatch, "(2, 256)"
    )
    _raises_on_this_rank(
        lambda: comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(rows, width, weight), mismatch
    )
    assert torch.equal(comm.all_reduce(x), expected)  # still in step
    comm.close()
    dist.destroy_process_group()


def test_debug_mode_refuses_shapes_and_dtypes_that_differ_between_ranks() -> None:
    _spawn_gloo("gloo_debug_rank", 2)


def gloo_fallback_group_rank(rank: int, world: int, init: str) -> None:
    """The fallback all-reduces on fallback_group (default: the exchange group); a fallback_group of
    other ranks is refused on every rank; a non-contiguous out still gets the sum."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    fallback = dist.new_group(backend="gloo")
    groups: list[Any] = []
    real = dist.all_reduce

    def recording(tensor: torch.Tensor, *args: Any, group: Any = None, **kwargs: Any) -> Any:
        groups.append(group)
        return real(tensor, *args, group=group, **kwargs)

    dist.all_reduce = recording  # this rank's process only
    x = torch.arange(6, dtype=torch.float32) + rank
    expected = sum(torch.arange(6, dtype=torch.float32) + r for r in range(world))
    comm = CustomAllReduce(dist.group.WORLD, fallback_group=fallback)
    assert comm.group is dist.group.WORLD and comm.fallback_group is fallback
    assert torch.equal(comm.all_reduce(x), expected) and groups == [fallback]
    # A non-contiguous out (gloo would reduce its storage as if it were contiguous) and in place.
    out = torch.zeros(6, 2)[:, 0]
    assert comm.all_reduce(x, out=out) is out and torch.equal(out, expected)
    strided = torch.zeros(6, 2)
    strided[:, 0] = x
    comm.all_reduce(strided[:, 0], out=strided[:, 0])
    assert torch.equal(strided[:, 0], expected) and not strided[:, 1].any()
    default = CustomAllReduce(dist.group.WORLD)
    groups.clear()
    assert torch.equal(default.all_reduce(x), expected) and groups == [default.group]
    only_rank_0 = dist.new_group([0])  # collective: every rank makes it
    _raises_on_this_rank(lambda: CustomAllReduce(dist.group.WORLD, fallback_group=only_rank_0), "fallback_group")
    for c in (comm, default):
        c.close()
    dist.destroy_process_group()


def test_fallback_runs_on_the_fallback_group() -> None:
    _spawn_gloo("gloo_fallback_group_rank", 2)


def test_fallback_group_arguments(single_rank_group: None) -> None:
    with pytest.raises(ValueError, match="fallback_group must be a process group"):
        CustomAllReduce(dist.group.WORLD, fallback_group="nccl")
    same_ranks = dist.new_group([0])
    comm = CustomAllReduce(dist.group.WORLD, fallback_group=same_ranks)
    assert comm.fallback_group is same_ranks
    comm.close()
    assert CustomAllReduce(dist.group.WORLD).fallback_group is dist.group.WORLD  # default: the group


def test_fallback_all_reduces_on_the_fallback_group(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _two_rank_stub()
    comm.group, comm.fallback_group = "exchange group", "device group"
    seen: list[tuple[torch.Tensor, Any]] = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: seen.append((t, group)))
    try:
        x, out = torch.arange(4.0), torch.zeros(4)
        comm.torch_all_reduce(x, out)
        assert seen == [(out, "device group")] and torch.equal(out, x)  # reduced in out itself
        strided = torch.zeros(4, 2)[:, 0]
        comm.torch_all_reduce(x, strided)
        assert seen[1][0] is not strided and seen[1][0].is_contiguous()  # a contiguous temporary
        assert torch.equal(strided, x)  # copied back
    finally:
        comm.close()


# ---------------------------------------------------------------------------------------------
# The set-up's decisions: what each rank gathers mocked (hostnames, GPUs, peer access, the peers'
# answers), each rank's construction run on its own, as its own process would


@dataclasses.dataclass
class _Ranks:
    """A scripted group: per rank its hostname, its GPU's uuid (None: no CUDA device), the uuids
    of the GPUs it sees (by index), and its answer to the peer-access exchange (the ranks whose GPU
    its GPU cannot reach: checked against what it computes when it is the rank set up); the GPU
    pairs (from, to) with peer access."""

    hosts: list[str]
    gpus: list[str | None]
    visible: list[list[str]]
    verdicts: list[list[int]]
    peer: set[tuple[str, str]]


def _set_up(
    ranks: _Ranks,
    rank: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    new_process: bool = True,
) -> tuple[str | None, list[str], list[Any], list[int]]:
    """Construct rank ``rank``'s communicator on the scripted group (in a process of its own, or in
    the process of the previous call): its ``disabled_reason``, the lines it logged, what it passed
    to each ``all_gather_object``, and the ranks that mapped regions."""
    world = len(ranks.hosts)
    sent: list[Any] = []
    mapped: list[int] = []

    def gather(out: list[Any], obj: Any, group: Any = None) -> None:
        if len(sent) == 0:
            answers = [(ranks.hosts[r], ranks.gpus[r], obj[2]) for r in range(world)]
        elif len(sent) == 1:
            answers = list(ranks.verdicts)
        else:
            raise AssertionError("the set-up gathers twice at most")
        sent.append(obj)
        answers[rank] = obj
        out[:] = answers

    visible = ranks.visible[rank]
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(distributed.socket, "gethostname", lambda: ranks.hosts[rank])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: ranks.gpus[rank] is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(distributed, "_device_uuid", lambda device: visible[device.index])
    monkeypatch.setattr(
        torch.cuda, "can_device_access_peer", lambda device, peer: (visible[device.index], visible[peer]) in ranks.peer
    )
    monkeypatch.setattr(CustomAllReduce, "_map_regions", lambda self, dist: mapped.append(self.rank))
    if new_process:
        monkeypatch.setattr(distributed, "_LOGGED", set())
    caplog.clear()
    gpu = ranks.gpus[rank]
    with caplog.at_level(logging.WARNING, logger="jit_kernel.distributed"):
        comm = CustomAllReduce("group", device=None if gpu is None else visible.index(gpu))
    reason = comm.disabled_reason
    comm.device = None  # nothing was mapped: close() frees nothing
    comm.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "jit_kernel.distributed"]
    return reason, lines, sent, mapped


GPUS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc"]
BOTH_WAYS = {(a, b) for a in GPUS for b in GPUS if a != b}


@pytest.mark.parametrize(
    ("ranks", "reason"),
    [
        pytest.param(
            _Ranks(["node-b", "node-a"], GPUS[:2], [GPUS[:2]] * 2, [[], []], BOTH_WAYS),
            "the group spans hosts (node-a, node-b)",
            id="spans-hosts",
        ),
        pytest.param(
            _Ranks(["node"] * 2, GPUS[:2], [GPUS[:2]] * 2, [[], [0]], {(GPUS[0], GPUS[1])}),
            "no peer access (P2P) from rank 1's GPU to rank(s) [0]",
            id="one-way-peer-access",
        ),
        pytest.param(
            _Ranks(["node"] * 2, GPUS[:2], [[GPUS[0]], [GPUS[1]]], [[1], [0]], BOTH_WAYS),
            "no peer access (P2P) from rank 0's GPU to rank(s) [1]",
            id="peer-gpu-not-visible",
        ),
        pytest.param(
            _Ranks(["node"] * 3, [GPUS[0], None, GPUS[1]], [GPUS[:2], [], GPUS[:2]], [[], [], []], BOTH_WAYS),
            "rank(s) [1] have no CUDA device",
            id="a-rank-without-gpu",
        ),
    ],
)
def test_set_up_falls_back_on_every_rank_with_one_line_each(
    ranks: _Ranks, reason: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for rank in range(len(ranks.hosts)):
        got, lines, sent, mapped = _set_up(ranks, rank, monkeypatch, caplog)
        assert got == reason, (rank, got)
        assert lines == [f"custom all-reduce falls back to torch.distributed.all_reduce: {reason}"], (rank, lines)
        assert sent[0][:2] == (ranks.hosts[rank], ranks.gpus[rank]), rank
        if reason.startswith("no peer access"):
            assert sent[1] == ranks.verdicts[rank], (rank, sent)  # the scripted answers are what ranks compute
        else:
            assert len(sent) == 1, rank  # decided on the first exchange
        assert mapped == [], rank  # nothing shared


def test_set_up_serves_where_every_pair_has_peer_access(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three ranks, two sharing a GPU (always reachable: peer access of a GPU to itself is never
    asked, and the script grants none)."""
    ranks = _Ranks(["node"] * 3, [GPUS[0], GPUS[0], GPUS[1]], [GPUS[:2]] * 3, [[], [], []], BOTH_WAYS)
    for rank in range(3):
        got, lines, sent, mapped = _set_up(ranks, rank, monkeypatch, caplog)
        assert got is None and lines == [] and mapped == [rank], (rank, got, lines)
        assert sent[1] == [], rank


def test_a_reason_is_logged_once_per_process(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    ranks = _Ranks(["node-b", "node-a"], GPUS[:2], [GPUS[:2]] * 2, [[], []], BOTH_WAYS)
    reason, lines, _, _ = _set_up(ranks, 0, monkeypatch, caplog)
    assert reason is not None and len(lines) == 1
    again, lines, _, _ = _set_up(ranks, 0, monkeypatch, caplog, new_process=False)  # a second communicator
    assert again == reason and lines == []


# ---------------------------------------------------------------------------------------------
# Layouts one rank's tensors alone have (strides, addresses): staged, never refused by the launcher
# on that rank alone while its peers wait in the kernel. The plans run on CPU tensors (real
# addresses) of a communicator whose kernels serve them.


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch) -> Iterator[CustomAllReduce]:
    comm = _two_rank_stub()
    monkeypatch.setattr(comm, "fallback_reason", lambda x: None)
    try:
        yield comm
    finally:
        comm.close()


def _misaligned(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A contiguous tensor whose data starts one element past a 16-byte boundary."""
    numel = int(numpy.prod(shape))
    base = torch.zeros(numel + 16, dtype=dtype)
    offset = next(i for i in range(1, 16) if (base.data_ptr() + i * base.element_size()) % 16)
    t = base[offset : offset + numel].view(shape)
    assert t.is_contiguous() and t.data_ptr() % 16
    return t


def _strided(shape: tuple[int, ...], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A tensor of ``shape`` whose last dimension has stride 2."""
    t = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]
    assert not t.is_contiguous()
    return t


def _is_aligned_contiguous(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.data_ptr() % 16 == 0


def test_needs_staging() -> None:
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert not ops.needs_staging(x)
    assert ops.needs_staging(_misaligned((64,)))
    assert ops.needs_staging(_strided((8, 64)))
    with fake_cuda():  # a fake has no address: its strides only
        assert not ops.needs_staging(torch.empty(8, 64, device="cuda"))
        assert ops.needs_staging(torch.empty_strided((8, 64), (128, 2), device="cuda"))


def _launches(planned: Any) -> list[Any]:
    """A plan's launches as a list (one launch is a tuple)."""
    return [planned] if type(planned) is tuple else planned


def _run_copies(launches: list[Any]) -> None:
    for kernels, key, args, _ in launches:
        assert kernels is ops._COPY
        kernels[key](*args)


@pytest.mark.parametrize("layout", ["misaligned", "strided"])
def test_all_reduce_stages_an_out_it_cannot_take(serving: CustomAllReduce, layout: str) -> None:
    plan = ops.custom_all_reduce.op.plan
    x = torch.randn(8, 64).to(torch.bfloat16)
    out = torch.zeros(8, 64, dtype=torch.bfloat16)
    launch = plan(x, serving.handle, out)
    assert type(launch) is tuple and launch[0] is ops._ALL_REDUCE and launch[2][0] is out and launch[3] is out
    out = _misaligned((8, 64)) if layout == "misaligned" else _strided((8, 64))
    (kernels, key, args, _), *copies = _launches(plan(x, serving.handle, out))
    assert kernels is ops._ALL_REDUCE and key == torch.bfloat16 and args[1] is x  # the same kernel
    target = args[0]
    assert target is not out and _is_aligned_contiguous(target) and target.shape == out.shape
    assert [(c[2][0], c[2][1], c[3]) for c in copies] == [(out, target, out)]  # copied back; the op returns out
    target.copy_(x)  # what the kernel would write
    _run_copies(copies)
    assert torch.equal(out, x)


@pytest.mark.parametrize("layout", ["misaligned", "strided"])
def test_all_reduce_in_place_on_a_tensor_it_cannot_take(serving: CustomAllReduce, layout: str) -> None:
    x = _misaligned((8, 64)) if layout == "misaligned" else _strided((8, 64))
    x.copy_(torch.randn(8, 64))
    before = x.clone()
    (_, _, args, _), *copies = _launches(ops.custom_all_reduce.op.plan(x, serving.handle, x))
    target, source = args[0], args[1]
    assert _is_aligned_contiguous(source) and torch.equal(source, before)  # the input, staged
    assert _is_aligned_contiguous(target) and target is not source
    target.fill_(3)
    _run_copies(copies)
    assert torch.equal(x, torch.full_like(x, 3))


def _fused_tensors(rows: int = 4, dim: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, dim).to(torch.bfloat16)
    return x, torch.randn_like(x), torch.randn(dim).to(torch.bfloat16)


def _placed(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t``'s values in a tensor of ``layout`` ("as is", "misaligned", "strided")."""
    if layout == "as is":
        return t
    placed = _misaligned(tuple(t.shape), t.dtype) if layout == "misaligned" else _strided(tuple(t.shape), t.dtype)
    return placed.copy_(t)


@pytest.mark.parametrize(
    ("x_layout", "residual_layout", "weight_layout"),
    [
        ("misaligned", "as is", "as is"),
        ("as is", "misaligned", "as is"),
        ("as is", "as is", "misaligned"),
        ("strided", "strided", "strided"),
    ],
)
def test_fused_form_stages_what_it_cannot_take_and_keeps_its_one_launch(
    serving: CustomAllReduce, x_layout: str, residual_layout: str, weight_layout: str
) -> None:
    """The one launch is chosen as for aligned contiguous tensors (every rank must make the same
    launch); x and residual, which it writes, are copied back; the weight is only read."""
    plan = ops.custom_all_reduce_fused_add_rmsnorm.op.plan
    x0, r0, w0 = _fused_tensors()
    launch = plan(x0.clone(), r0.clone(), w0, 1e-6, serving.handle)
    assert type(launch) is tuple and launch[0] is ops._FUSED
    x, residual, weight = (
        _placed(x0.clone(), x_layout),
        _placed(r0.clone(), residual_layout),
        _placed(w0, weight_layout),
    )
    (kernels, key, args, _), *copies = _launches(plan(x, residual, weight, 1e-6, serving.handle))
    assert kernels is ops._FUSED and key == torch.bfloat16 and args[6] == launch[2][6]  # the same launch, kper
    given = {"x": x, "residual": residual, "weight": weight}
    staged = dict(zip(given, args[:3], strict=True))
    for name, t in given.items():
        assert _is_aligned_contiguous(staged[name]), name
        assert (staged[name] is t) == (not ops.needs_staging(t)), name
        assert torch.equal(staged[name], t), name  # read: staged with its values
    written = [name for name in ("x", "residual") if staged[name] is not given[name]]
    assert [c[2] for c in copies] == [(given[name], staged[name]) for name in written]
    for name in written:
        staged[name].fill_(5)
    _run_copies(copies)
    for name in written:
        assert torch.equal(given[name], torch.full_like(given[name], 5)), name


def test_static_fp8_form_stages_a_misaligned_out(serving: CustomAllReduce) -> None:
    plan = ops.custom_all_reduce_fused_add_rmsnorm_quant_fp8.op.plan
    x, residual, weight = _fused_tensors()
    scale = torch.ones(1)
    out = _misaligned((4, 512), torch.float8_e4m3fn)
    (kernels, _, args, result), *copies = _launches(plan(x, residual, weight, scale, 1e-6, serving.handle, out))
    assert kernels is ops._FUSED_QUANT and result is out
    q = args[0]
    assert q is not out and _is_aligned_contiguous(q) and q.dtype == torch.float8_e4m3fn
    assert [(c[2], c[3]) for c in copies] == [((out, q), out)]  # the op still returns out
    q.view(torch.uint8).fill_(0x38)  # 1.0
    _run_copies(copies)
    assert torch.equal(out.float(), torch.ones(4, 512))


def test_group_form_stages_a_strided_output_q(serving: CustomAllReduce) -> None:
    plan = ops.custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8.op.plan
    x, residual, weight = _fused_tensors()
    q, s = _strided((4, 512), torch.float8_e4m3fn), torch.zeros(4, 4)
    (kernels, _, args, _), *copies = _launches(plan(x, residual, weight, q, s, 128, 1e-6, 1e-10, False, serving.handle))
    assert kernels is ops._FUSED_GROUP and args[1] is s  # scales: any layout, where they lie
    assert args[0] is not q and _is_aligned_contiguous(args[0])
    assert [c[2] for c in copies] == [(q, args[0])]


def test_static_fp8_form_at_world_size_one_is_the_norm_ops(
    single_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """World size 1: jit_kernel.fused_add_rmsnorm, then per_tensor_quant_fp8 of the normalised x
    with the static scale into out; the quantised tensor is returned."""
    from jit_kernel.ops import norm, quant

    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    q = torch.zeros(3, 512, dtype=torch.float8_e4m3fn)
    monkeypatch.setattr(norm, "fused_add_rmsnorm", lambda *a, **k: calls.append(("norm", a, k)))

    def quantise(*args: object, **kwargs: object) -> tuple[torch.Tensor, object]:
        calls.append(("quant", args, kwargs))
        return q, args[2]

    monkeypatch.setattr(quant, "per_tensor_quant_fp8", quantise)
    comm = CustomAllReduce(dist.group.WORLD)
    x, residual, weight, scale = torch.zeros(3, 512), torch.zeros(3, 512), torch.ones(512), torch.ones(1)
    assert comm.all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, 1e-5) is q
    assert calls == [("norm", (x, residual, weight, 1e-5), {}), ("quant", (x, None, scale), {"is_static": True})]
    calls.clear()
    assert comm.all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, out=q) is q
    assert calls[1] == ("quant", (x, q, scale), {"is_static": True}) and calls[0][1][3] == 1e-6
    comm.close()


@pytest.mark.parametrize("form", ["rmsnorm", "rmsnorm_fp8"])
def test_fused_forms_under_torch_compile(form: str) -> None:
    """The compiled graph keeps the fused collective as its one node (the fake runs the plan and the
    launcher's checks), a strided residual included (staged in the fake plan too)."""
    comm = _two_rank_stub()
    name = "custom_all_reduce_fused_add_rmsnorm" + ("_quant_fp8" if form == "rmsnorm_fp8" else "")
    try:
        with fake_cuda():
            x = torch.empty(8, 4096, dtype=torch.bfloat16, device="cuda")
            weight = torch.empty(4096, dtype=torch.bfloat16, device="cuda")
            scale = torch.empty(1, dtype=torch.float32, device="cuda")

            def step(t: torch.Tensor, r: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
                if form == "rmsnorm":
                    comm.all_reduce_fused_add_rmsnorm(t, r, w, 1e-6)
                    return t * 2
                return comm.all_reduce_fused_add_rmsnorm_quant_fp8(t, r, w, s, 1e-6)

            from torch._dynamo.testing import EagerAndRecordGraphs

            for residual in (
                torch.empty_like(x),
                torch.empty_strided((8, 4096), (8192, 2), dtype=torch.bfloat16, device="cuda"),
            ):
                backend = EagerAndRecordGraphs()
                torch._dynamo.reset()
                result = torch.compile(step, backend=backend, fullgraph=True)(x, residual, weight, scale)
                code = backend.graphs[0].code
                assert f"torch.ops.jit_kernel.{name}(" in code, code
                assert code.count("jit_kernel.custom_all_reduce") == 1, code
                expected = torch.bfloat16 if form == "rmsnorm" else torch.float8_e4m3fn
                assert result.shape == x.shape and result.dtype == expected
    finally:
        torch._dynamo.reset()
        comm.close()


# ---------------------------------------------------------------------------------------------
# The per-token-group fp8 form

GROUP_OP = "custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8"


def _group_call(comm: CustomAllReduce, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, **kw: object) -> None:
    """The registered op on fake tensors: the plan, then the launcher's checks."""
    residual = kw.pop("residual", torch.empty_like(x))
    weight = kw.pop("weight", torch.empty(x.shape[-1], dtype=x.dtype, device="cuda"))
    group_size, quant_eps, ue8m0 = kw.pop("group_size", 128), kw.pop("quant_eps", 1e-10), kw.pop("ue8m0", False)
    assert not kw
    torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
        x, residual, weight, q, s, group_size, 1e-6, quant_eps, ue8m0, comm.handle
    )


def test_group_form_fakes_take_every_scale_layout() -> None:
    """Row-major, column-major (TMA-padded too) and packed UE8M0 scales, groups of 64 and 128,
    rows of any leading shape: the launcher's checks pass on fakes of each."""
    comm = _two_rank_stub()
    try:
        with fake_cuda():
            for n, d, group in ((64, 4096, 128), (1, 7168, 128), (7, 4096, 64), (3, 4160, 64)):
                x = torch.empty(n, d, dtype=torch.bfloat16, device="cuda")
                q = torch.empty(n, d, dtype=torch.float8_e4m3fn, device="cuda")
                g, padded = d // group, (n + 3) // 4 * 4
                _group_call(comm, x, q, torch.empty(n, g, device="cuda"), group_size=group)
                _group_call(comm, x, q, torch.empty(g, n, device="cuda").t(), group_size=group)
                _group_call(comm, x, q, torch.empty(g, padded, device="cuda").t().narrow(0, 0, n), group_size=group)
                _group_call(
                    comm, x, q, torch.empty(g, padded, device="cuda").t().narrow(0, 0, n), group_size=group, ue8m0=True
                )
                words = torch.empty((g + 3) // 4, padded, dtype=torch.int32, device="cuda").t().narrow(0, 0, n)
                _group_call(comm, x, q, words, group_size=group, ue8m0=True)
            x3 = torch.empty(2, 3, 4096, dtype=torch.bfloat16, device="cuda")
            q3 = torch.empty(2, 3, 4096, dtype=torch.float8_e4m3fn, device="cuda")
            _group_call(comm, x3, q3, torch.empty(32, 6, device="cuda").t().view(2, 3, 32))
    finally:
        comm.close()


def test_group_form_bad_inputs_name_the_argument() -> None:
    comm = _two_rank_stub()
    try:
        with fake_cuda():
            x = torch.empty(8, 4096, dtype=torch.bfloat16, device="cuda")
            q = torch.empty(8, 4096, dtype=torch.float8_e4m3fn, device="cuda")
            s = torch.empty(8, 32, device="cuda")
            with pytest.raises(ValueError, match="group_size must be 64 or 128, got 256"):
                _group_call(comm, x, q, torch.empty(8, 16, device="cuda"), group_size=256)
            x_odd = torch.empty(8, 4000, dtype=torch.bfloat16, device="cuda")  # whole vectors, not groups
            with pytest.raises(ValueError, match=r"last dimension of x \(4000\) must be a multiple of group_size"):
                _group_call(comm, x_odd, torch.empty(8, 4000, dtype=torch.float8_e4m3fn, device="cuda"), s)
            with pytest.raises(TypeError, match="output_q"):
                _group_call(comm, x, torch.empty(8, 4096, dtype=torch.float8_e5m2, device="cuda"), s)
            with pytest.raises(ValueError, match="output_q"):
                _group_call(comm, x, torch.empty(8, 2048, dtype=torch.float8_e4m3fn, device="cuda"), s)
            # A strided output_q is a layout, not an error: it is staged (see the staging tests).
            _group_call(comm, x, torch.empty_strided((8, 4096), (8192, 2), dtype=torch.float8_e4m3fn, device="cuda"), s)
            with pytest.raises(TypeError, match="output_s"):
                _group_call(comm, x, q, torch.empty(8, 32, dtype=torch.float16, device="cuda"))
            with pytest.raises(ValueError, match="output_s"):
                _group_call(comm, x, q, torch.empty(8, 16, device="cuda"))
            with pytest.raises(ValueError, match="output_s must be row-major"):
                _group_call(comm, x, q, torch.empty_strided((8, 32), (64, 2), device="cuda"))
            words = torch.empty(8, 8, dtype=torch.int32, device="cuda").t()
            with pytest.raises(ValueError, match="needs scale_ue8m0=True"):
                _group_call(comm, x, q, words)
            with pytest.raises(ValueError, match=r"packed .* must be column-major"):
                _group_call(comm, x, q, torch.empty(8, 8, dtype=torch.int32, device="cuda"), ue8m0=True)
            with pytest.raises(ValueError, match="quant_eps"):
                _group_call(comm, x, q, s, quant_eps=-1.0)
            with pytest.raises(TypeError, match="residual"):
                _group_call(comm, x, q, s, residual=torch.empty_like(x, dtype=torch.float16))
            with pytest.raises(ValueError, match="weight"):
                _group_call(comm, x, q, s, weight=torch.empty(2048, dtype=torch.bfloat16, device="cuda"))
            x3 = torch.empty(2, 4, 4096, dtype=torch.bfloat16, device="cuda")
            q3 = torch.empty(2, 4, 4096, dtype=torch.float8_e4m3fn, device="cuda")
            with pytest.raises(ValueError, match=r"output_s must have shape \(2, 4, 32\)"):
                _group_call(comm, x3, q3, torch.empty(8, 32, device="cuda"))
    finally:
        comm.close()


def test_group_form_plans_one_launch_or_the_two_calls() -> None:
    """One launch where the fused kernel takes the rows; otherwise all_reduce (the kernels', or
    torch.distributed's where the communicator falls back), then the norm op, with x as its
    normed output."""
    from jit_kernel.ops import norm_quant

    plan = ops.custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8.op.plan
    comm = _two_rank_stub(max_bytes=8 << 20)
    try:
        with fake_cuda():
            for dtype, d, fused in (
                (torch.bfloat16, 4096, True),
                (torch.float32, 8192, True),
                (torch.float32, 16384, False),
            ):
                x = torch.empty(4, d, dtype=dtype, device="cuda")
                q = torch.empty(4, d, dtype=torch.float8_e4m3fn, device="cuda")
                s = torch.empty(4, d // 128, device="cuda")
                launch = plan(
                    x,
                    torch.empty_like(x),
                    torch.empty(d, dtype=dtype, device="cuda"),
                    q,
                    s,
                    128,
                    1e-6,
                    1e-10,
                    False,
                    comm.handle,
                )
                if fused:
                    assert type(launch) is tuple and launch[0] is ops._FUSED_GROUP and launch[1] == dtype
                    continue
                assert isinstance(launch, list) and len(launch) == 2
                assert launch[0][0] is ops._ALL_REDUCE
                assert launch[1][0] is norm_quant._GROUP_ADD_KERNELS
                normed_out = launch[1][2][2]  # the launcher takes (output_q, output_s, normed_out, input, ...)
                assert normed_out is x
            comm.disabled_reason = "the group spans hosts (a, b)"
            x = torch.empty(4, 4096, dtype=torch.bfloat16, device="cuda")
            q = torch.empty(4, 4096, dtype=torch.float8_e4m3fn, device="cuda")
            launch = plan(
                x,
                torch.empty_like(x),
                torch.empty(4096, dtype=torch.bfloat16, device="cuda"),
                q,
                torch.empty(4, 32, device="cuda"),
                128,
                1e-6,
                1e-10,
                False,
                comm.handle,
            )
            assert isinstance(launch, list) and launch[0][0] is ops._TORCH
    finally:
        comm.close()


def test_group_outputs_take_the_norm_ops_layouts() -> None:
    x = torch.empty(6, 1024, dtype=torch.bfloat16)
    q, s = ops.group_outputs(x, 128, False, False, None, None)
    assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
    assert s.shape == (6, 8) and s.dtype == torch.float32 and s.stride() == (8, 1)
    _, s = ops.group_outputs(x, 128, True, False, None, None)
    assert s.shape == (6, 8) and s.stride() == (1, 6)
    _, s = ops.group_outputs(x, 64, False, True, None, None)  # 16 groups: 4 words, tokens padded to 8
    assert s.shape == (6, 4) and s.dtype == torch.int32 and s.stride() == (1, 8)
    _, s = ops.group_outputs(torch.empty(2, 3, 1024, dtype=torch.bfloat16), 128, True, False, None, None)
    assert s.shape == (2, 3, 8) and s.view(6, 8).stride() == (1, 6)
    given = torch.empty(6, 8)
    assert ops.group_outputs(x, 128, True, False, None, given)[1] is given
    with pytest.raises(ValueError, match=r"last dimension of x \(1000\)"):
        ops.group_outputs(torch.empty(6, 1000), 128, False, False, None, None)
    with pytest.raises(TypeError, match="group_size must be an int"):
        ops.group_outputs(x, "128", False, False, None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        ops.group_outputs([1.0], 128, False, False, None, None)  # type: ignore[arg-type]


def test_group_form_at_world_size_one_is_the_norm_op(single_rank_group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """World size 1 calls jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8 with x as its
    normed output (x left normalised, as the fused form leaves it), the outputs already allocated."""
    from jit_kernel.ops import norm_quant

    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def record(*args: object, **kwargs: object) -> tuple[object, object]:
        calls.append((args, kwargs))
        return kwargs["output_q"], kwargs["output_s"]

    monkeypatch.setattr(norm_quant, "fused_add_rmsnorm_per_token_group_quant_fp8", record)
    comm = CustomAllReduce(dist.group.WORLD)
    x, residual, weight = torch.zeros(3, 512), torch.zeros(3, 512), torch.ones(512)
    q, s = comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
        x, residual, weight, 128, 1e-5, 1e-8, column_major_scales=True, packed_ue8m0=False
    )
    ((args, kwargs),) = calls
    assert args[:6] == (x, residual, weight, 128, 1e-5, 1e-8)
    assert kwargs["normed_out"] is x and kwargs["scale_ue8m0"] is False
    assert kwargs["output_q"] is q and kwargs["output_s"] is s and s.stride() == (1, 3)
    calls.clear()
    comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, packed_ue8m0=True)
    assert calls[0][1]["scale_ue8m0"] is True and calls[0][1]["output_s"].dtype == torch.int32
    comm.close()


def test_group_form_under_torch_compile() -> None:
    comm = _two_rank_stub()
    try:
        with fake_cuda():
            x = torch.empty(8, 4096, dtype=torch.bfloat16, device="cuda")
            residual, weight = torch.empty_like(x), torch.empty(4096, dtype=torch.bfloat16, device="cuda")

            def step(t: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(t, r, w, column_major_scales=True)

            from torch._dynamo.testing import EagerAndRecordGraphs

            backend = EagerAndRecordGraphs()
            torch._dynamo.reset()
            q, s = torch.compile(step, backend=backend, fullgraph=True)(x, residual, weight)
            assert GROUP_OP in backend.graphs[0].code
            assert q.shape == x.shape and q.dtype == torch.float8_e4m3fn
            assert s.shape == (8, 32) and s.dtype == torch.float32 and s.stride() == (1, 8)
    finally:
        torch._dynamo.reset()
        comm.close()


# ---------------------------------------------------------------------------------------------
# CUDA graphs: graph_inputs="register" (the bookkeeping; the GPU tests run the kernels)


def test_graph_inputs_arguments_are_checked(single_rank_group: None) -> None:
    for bad in ("copy-in", "", None, 1):
        with pytest.raises(ValueError, match="graph_inputs must be 'copy' or 'register'"):
            CustomAllReduce(dist.group.WORLD, graph_inputs=bad)  # type: ignore[arg-type]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_graph_calls must be a positive int"):
            CustomAllReduce(dist.group.WORLD, graph_inputs="register", max_graph_calls=bad)  # type: ignore[arg-type]
    comm = CustomAllReduce(dist.group.WORLD, graph_inputs="register", max_graph_calls=4)
    assert comm.graph_inputs == "register" and comm.max_graph_calls == 4
    with comm.capture():  # world size 1: no table, nothing exchanged
        assert comm.graph_input_slot(torch.zeros(4), torch.zeros(4), ops.ONE_SHOT) == 0
    comm.close()


def test_which_captured_calls_read_their_input_in_place() -> None:
    one, two = ops.ONE_SHOT, ops.TWO_SHOT
    assert ops.reads_input_in_place(one, 0x1000, 0x2000, 0x1000)  # adjacent: no overlap
    assert ops.reads_input_in_place(one, 0x2000, 0x1000, 0x1000)
    assert not ops.reads_input_in_place(one, 0x1000, 0x1000, 64)  # one-shot in place: copies in
    assert ops.reads_input_in_place(two, 0x1000, 0x1000, 64)  # two-shot in place: each rank its own slice
    assert not ops.reads_input_in_place(two, 0x1000, 0x1010, 64)  # a partial overlap: copies in
    assert not ops.reads_input_in_place(one, 0x1010, 0x1000, 64)


def _register_stub(slots: int = 3) -> CustomAllReduce:
    comm = _two_rank_stub()
    comm.graph_inputs, comm.max_graph_calls = "register", slots
    comm._graph_table = torch.zeros(slots, ops.MAX_RANKS, dtype=torch.int64)  # stands in for the device table
    comm._graph_table_address = 1 << 32
    return comm


def test_captured_calls_take_slots_in_order_until_the_table_is_full(caplog: pytest.LogCaptureFixture) -> None:
    comm = _register_stub(slots=3)
    try:
        base, row = comm._graph_table_address, ops.GRAPH_SLOT_BYTES
        record = comm._record_captured
        assert record((8,), torch.bfloat16, ops.ONE_SHOT, 0x1000, 16, True) == base
        assert record((8,), torch.bfloat16, ops.ONE_SHOT, 0x2000, 16, False) == 0  # copies in, takes no slot
        assert record((4, 8), torch.float32, ops.TWO_SHOT, 0x3000, 128, True) == base + row
        assert record((8,), torch.float16, ops.ONE_SHOT, 0x4000, 16, True) == base + 2 * row
        with caplog.at_level(logging.WARNING, logger="jit_kernel.distributed"):
            assert record((8,), torch.float16, ops.ONE_SHOT, 0x5000, 16, True) == 0  # full: copies in
        assert "more than max_graph_calls=3 calls captured" in caplog.text
        assert [c.slot for c in comm._graph_calls] == [0, -1, 1, 2, -1]
        assert comm._graph_calls[2].key() == ((4, 8), "float32", ops.TWO_SHOT, 1)
        assert comm._graph_calls[2].address == 0x3000 and comm._graph_calls[2].nbytes == 128
    finally:
        comm.close()


def test_only_calls_captured_inside_capture_take_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _register_stub()
    try:
        x, out = torch.zeros(8), torch.zeros(8)
        assert comm.graph_input_slot(x, out, ops.ONE_SHOT) == 0  # not inside capture()
        comm._capturing = True
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        assert comm.graph_input_slot(x, out, ops.ONE_SHOT) == 0  # an eager call inside capture()
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        assert comm.graph_input_slot(x, out, ops.ONE_SHOT) == comm._graph_table_address
        assert comm.graph_input_slot(x, x, ops.ONE_SHOT) == 0  # one-shot in place
        assert comm.graph_input_slot(x, x, ops.TWO_SHOT) == comm._graph_table_address + ops.GRAPH_SLOT_BYTES
        with fake_cuda():
            fake = torch.empty(8, device="cuda")
            assert comm.graph_input_slot(fake, fake, ops.TWO_SHOT) == 0  # a fake call records nothing
        assert [c.slot for c in comm._graph_calls] == [0, -1, 1]
        comm._graph_table, comm._graph_table_address = None, 0
        assert comm.graph_input_slot(x, out, ops.ONE_SHOT) == 0  # copy mode: no table
    finally:
        comm._capturing = False
        comm.close()


def _contribution(keys: list[object], handles: list[bytes], where: list[object], next_slot: int = 0) -> tuple:
    return False, keys, handles, where, next_slot


def test_captures_are_compared_across_ranks() -> None:
    a = ((8,), "bfloat16", 0, 0)
    b = ((8,), "float16", 0, 1)
    same = _contribution([a, b], [], [None, None])
    assert distributed.compare_captures([same, same]) is None
    raised = (True, [], [], [], 0)
    assert distributed.compare_captures([same, raised]) == "rank(s) [1] raised inside capture()"
    shorter = _contribution([a], [], [None])
    assert distributed.compare_captures([same, shorter]) == "rank 0 captured 2 all_reduce calls, rank 1 captured 1"
    other = _contribution([a, ((8,), "float16", 0, -1)], [], [None, None])
    problem = distributed.compare_captures([same, same, other])
    assert problem is not None and "rank 2" in problem
    assert problem.startswith("the captured all_reduce at index 1 differs")


def test_a_call_is_shared_only_where_every_rank_shares_its_input() -> None:
    h0, h1 = b"a" * 64, b"b" * 64
    r0 = _contribution([], [h0], [(0, 256), (0, 512)])
    r1 = _contribution([], [h1], [(0, 0), None])
    assert distributed.shared_inputs([r0, r1], 0) == [(h0, 256), (h1, 0)]
    assert distributed.shared_inputs([r0, r1], 1) is None


class _FakeRanks:
    """Rank 0 of two: all_gather_object answers with this rank's object and rank 1's next answer
    (``peer`` maps this rank's object to rank 1's); ipc_input_handle and ipc_open are fakes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, peers: list[Any]) -> None:
        self.peers = list(peers)
        self.opened: list[bytes] = []
        monkeypatch.setattr(dist, "all_gather_object", self.gather)
        monkeypatch.setattr(distributed, "_function", self.function)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def gather(self, out: list[Any], obj: Any, group: Any = None) -> None:
        out[0], out[1] = obj, self.peers.pop(0)(obj)

    def function(self, name: str) -> Any:
        def input_handle(device: int, address: int, nbytes: int, handle: torch.Tensor) -> int:
            if address >= 0x9000:
                return -1  # memory CUDA IPC cannot share
            handle.fill_(address >> 12)  # one allocation per 4 KiB
            return address & 0xFFF

        def open_handle(device: int, handle: torch.Tensor) -> int:
            self.opened.append(bytes(handle.tolist()))
            return 0x7000_0000 + int(handle[0]) * 0x10000

        return {"ipc_input_handle": input_handle, "ipc_open": open_handle}.get(name, lambda *a: None)


def _peer_of(contribution: Any) -> Any:
    """Rank 1's contribution: the same calls, its own allocations (handles of 0xFF + rank 0's)."""
    raised, keys, handles, where, next_slot = contribution
    return raised, keys, [bytes([255 - h[0]]) * 64 for h in handles], where, next_slot


def test_end_of_capture_fills_the_slots_every_rank_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _register_stub(slots=8)
    comm.device = torch.device("cuda", 0)
    written: list[tuple[list[int], torch.Tensor]] = []
    monkeypatch.setattr(comm, "_write_slots", lambda slots, rows: written.append((slots, rows)))
    ranks = _FakeRanks(monkeypatch, [_peer_of, lambda opened: opened])
    try:
        with comm.capture():
            comm._record_captured((8,), torch.bfloat16, 0, 0x1100, 16, True)  # allocation 1, offset 0x100
            comm._record_captured((8,), torch.bfloat16, 0, 0x1200, 16, True)  # the same allocation
            comm._record_captured((8,), torch.bfloat16, 0, 0x2000, 16, False)  # copies in
            comm._record_captured((8,), torch.bfloat16, 0, 0x9000, 16, True)  # not shareable: copies in
        ((slots, rows),) = written
        assert slots == [0, 1]
        peer_base = 0x7000_0000 + (255 - 1) * 0x10000  # rank 1's allocation, as mapped here
        assert rows[0, :2].tolist() == [0x1100, peer_base + 0x100]
        assert rows[1, :2].tolist() == [0x1200, peer_base + 0x200]
        assert rows[:, 2:].eq(0).all()
        assert ranks.opened == [bytes([254]) * 64]  # each peer allocation opened once
        assert (comm.registered_graph_calls, comm.copied_graph_calls) == (2, 2)
        assert comm._graph_calls == [] and comm._graph_slots == 3
    finally:
        comm._opened.clear()
        comm.device = None
        comm.close()


def test_end_of_capture_refuses_different_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _register_stub(slots=8)
    comm.device = torch.device("cuda", 0)
    monkeypatch.setattr(comm, "_write_slots", lambda slots, rows: pytest.fail("no slot may be filled"))

    def one_more_call(mine: Any) -> Any:
        raised, keys, handles, where, next_slot = _peer_of(mine)
        return raised, [*keys, ((8,), "bfloat16", 0, next_slot)], handles, [*where, None], next_slot + 1

    _FakeRanks(monkeypatch, [one_more_call])
    try:
        with pytest.raises(ValueError, match="rank 0 captured 1 all_reduce calls, rank 1 captured 2"), comm.capture():
            comm._record_captured((8,), torch.bfloat16, 0, 0x1100, 16, True)
        assert comm._graph_slots == 2  # realigned with rank 1's next slot
        assert (comm.registered_graph_calls, comm.copied_graph_calls) == (0, 1)
        assert not comm._capturing
    finally:
        comm.device = None
        comm.close()


def test_an_exception_inside_capture_is_kept_and_registers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _register_stub()
    comm.device = torch.device("cuda", 0)
    monkeypatch.setattr(comm, "_write_slots", lambda slots, rows: pytest.fail("no slot may be filled"))
    _FakeRanks(monkeypatch, [lambda mine: (False, *mine[1:])])  # rank 1 captured without error
    try:
        with pytest.raises(KeyError, match="inside"), comm.capture():
            comm._record_captured((8,), torch.bfloat16, 0, 0x1100, 16, True)
            raise KeyError("inside")
        assert comm.copied_graph_calls == 1 and comm.registered_graph_calls == 0
    finally:
        comm.device = None
        comm.close()


def test_capture_must_enclose_the_graph_and_does_not_nest(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = _register_stub()
    comm.device = torch.device("cuda", 0)
    _FakeRanks(monkeypatch, [lambda mine: mine])  # the outer context still takes part in the exchange
    try:
        with pytest.raises(RuntimeError, match="do not nest"), comm.capture(), comm.capture():
            pass
        assert not comm._capturing
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        with pytest.raises(RuntimeError, match=r"capture\(\) must enclose the graph's capture"), comm.capture():
            comm._record_captured((8,), torch.bfloat16, 0, 0x1100, 16, True)
        assert comm.copied_graph_calls == 1
    finally:
        comm.device = None
        comm.close()


def test_the_plan_launches_with_the_calls_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """custom_all_reduce passes graph_input_slot's answer (the slot's address, 0 for copy-in) as the
    launcher's last argument, asked about the tensors the kernel reads and writes."""
    comm = _two_rank_stub()
    seen: list[tuple[int, int]] = []

    def slot(x: torch.Tensor, out: torch.Tensor, algo: int) -> int:
        seen.append((algo, int(x.is_contiguous())))
        return 4096

    monkeypatch.setattr(comm, "graph_input_slot", slot)
    try:
        with fake_cuda():
            x = torch.empty(64, 4096, dtype=torch.bfloat16, device="cuda")
            kernels, _, args, out = ops.custom_all_reduce.op.plan(x, comm.handle, None)
            assert kernels is ops._ALL_REDUCE and args[-1] == 4096 and args[0] is out and args[1] is x
            big = torch.empty(1024, 4096, dtype=torch.float32, device="cuda")  # 16 MiB, over max_bytes
            assert ops.custom_all_reduce.op.plan(big, comm.handle, None)[0] is ops._TORCH  # no slot asked
        assert seen == [(ops.ONE_SHOT, 1)]
    finally:
        comm.close()
