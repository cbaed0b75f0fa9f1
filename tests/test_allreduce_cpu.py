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
    comm.world_size, comm.rank, comm.max_bytes, comm.group = 2, 0, max_bytes, None
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
                _group_call(
                    comm, x, torch.empty_strided((8, 4096), (8192, 2), dtype=torch.float8_e4m3fn, device="cuda"), s
                )
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
