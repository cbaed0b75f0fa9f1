"""jit_kernel.distributed without a GPU: the algorithm choice, the fallbacks (world size 1; CPU
tensors on a gloo group of two processes really run torch.distributed.all_reduce), bad input, the
fake implementations, and the CUDA sources compiled for sm_90a."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import torch
import torch.distributed as dist

from _norm_helpers import fake_cuda
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
    comm.world_size, comm.rank, comm.max_bytes = 2, 0, max_bytes
    comm.disabled_reason, comm.debug, comm.device = None, False, None
    comm.timeout_s, comm.timeout_ns = 1.0, 10**9
    comm.peers = torch.zeros(2, 2, dtype=torch.int64)
    comm.error_address, comm._error, comm._failed, comm._capturing = 0, None, None, False
    comm._regions = []
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
mp.spawn(m.gloo_cpu_rank, args=({world}, {init!r}), nprocs={world}, join=True)
"""


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
    with tempfile.TemporaryDirectory() as tmp:
        code = _SPAWN.format(tests=str(TESTS), world=world, init=f"{tmp}/init")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
