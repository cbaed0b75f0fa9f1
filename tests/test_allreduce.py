"""jit_kernel.distributed.CustomAllReduce on one GPU: 2 and 4 ranks, each a process on cuda:0
(CUDA IPC handles open in another process on the same device; a gloo group carries the handle
exchange, as NCCL refuses two ranks on one device).

Every rank draws every rank's input from seeded generators, so it computes the reference itself:
the sum in rank order 0 .. W-1 in float32, rounded once to the dtype. The kernels sum in exactly
that order in fp32 (both algorithms, every rank), so the results are compared bit for bit. The fused
forms are compared bit for bit with ``all_reduce`` followed by the norm op they equal
(``jit_kernel.fused_add_rmsnorm``, ``fused_add_rmsnorm_quant_fp8``,
``fused_add_rmsnorm_per_token_group_quant_fp8``). CUDA graphs are replayed in both variants of
``graph_inputs``: ``"copy"`` (every call copies in) and ``"register"`` (replays read the ranks'
captured inputs in place). One rank passing tensors the kernels cannot take where they lie
(misaligned or strided ``out``, ``x``, ``residual``, ``weight``, fp8 outputs) still gets the right bits,
and so do its peers, with no timeout.

Each test runs its ranks (``torch.multiprocessing.spawn``) in a subprocess under a hard timeout,
killed with its whole process group when it runs out: a hang fails the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
MAX_BYTES = 2 << 20
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_SPAWN = """
import sys
sys.path.insert(0, {tests!r})
import torch.multiprocessing as mp
import test_allreduce as m
mp.spawn(m.rank_main, args=({world}, {init!r}, {case!r}, {timeout_s!r}), nprocs={world}, join=True)
"""


def _run(case: str, world: int, *, timeout_s: float = 30.0, limit_s: float = 300.0) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        code = _SPAWN.format(tests=str(TESTS), world=world, init=f"{tmp}/init", case=case, timeout_s=timeout_s)
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{case} with {world} ranks did not finish within {limit_s} s:\n{output}")
        assert process.returncode == 0, output
        return output


# ---------------------------------------------------------------------------------------------
# The ranks


def _inputs(seed: int, world: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Every rank's input of one call (CPU), the same on every rank."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 131 + r)
        out.append(torch.randn(shape, generator=g).to(dtype))
    return out


def _rank_order_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    acc = inputs[0].float()
    for t in inputs[1:]:
        acc = acc + t.float()
    return acc.to(inputs[0].dtype)


def _equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    actual = actual.cpu()
    if not torch.equal(actual, expected):
        diff = (actual.double() - expected.double()).abs()
        raise AssertionError(f"{what}: {int((diff != 0).sum())} elements differ, max {diff.max().item()}")


def _case_sizes(comm, rank: int, world: int) -> None:
    from jit_kernel.ops import allreduce as ops

    seed = 0
    for dtype in DTYPES:
        item = dtype.itemsize
        numels = sorted(
            {16 // item, 1, 7, 8, 33, 1000, 1001, 4096, 65_537, ops.ONE_SHOT_MAX_BYTES // item}
            | {ops.ONE_SHOT_MAX_BYTES // item + 8, 300_001, MAX_BYTES // item - 1, MAX_BYTES // item}
        )
        for n in numels:
            seed += 1
            inputs = _inputs(seed, world, (n,), dtype)
            expected = _rank_order_sum(inputs)
            x = inputs[rank].cuda()
            x_before = x.clone()
            _equal(comm.all_reduce(x), expected, f"{dtype} n={n}")
            assert torch.equal(x, x_before), "the input is left as it was"
            out = torch.full_like(x, float("nan"))
            assert comm.all_reduce(x, out=out) is out
            _equal(out, expected, f"{dtype} n={n} out=")
            comm.all_reduce(x, out=x)  # in place
            _equal(x, expected, f"{dtype} n={n} in place")
    # A 2-D input, and a non-contiguous one (copied on the way in).
    inputs = _inputs(999, world, (64, 96), torch.bfloat16)
    _equal(comm.all_reduce(inputs[rank].cuda()), _rank_order_sum(inputs), "2-D")
    wide = torch.stack([t for t in inputs]).transpose(0, 1)  # [64, W, 96]
    _equal(comm.all_reduce(wide[:, rank].cuda().t().contiguous().t()), _rank_order_sum(inputs), "strided")
    # Over max_bytes: torch.distributed.all_reduce (gloo on CUDA tensors), any summation order.
    big = _inputs(1000, world, (MAX_BYTES // 4 + 4,), torch.float32)
    result = comm.all_reduce(big[rank].cuda()).cpu()
    torch.testing.assert_close(result, sum(t.double() for t in big).float(), rtol=1e-5, atol=1e-5)
    comm.check()


def _case_fused(comm, rank: int, world: int) -> None:
    import jit_kernel

    seed = 5000
    for dtype in DTYPES:
        # Hidden sizes the norm specialises, and 3072 and 512, which it does not (its bounded row
        # kernel); more rows than the kernel's 128 blocks (each block loops over several rows).
        shapes = ((1, 4096), (7, 4096), (3, 2048), (200, 1024), (5, 5120), (2, 7168), (4, 8192), (1, 16384))
        shapes += ((7, 3072), (33, 3072), (300, 1024), (1000, 512))
        for rows, dim in shapes:
            assert rows * dim * dtype.itemsize <= MAX_BYTES
            for dim_ in (dim, 1000, 1001) if (rows, dim) == (7, 4096) else (dim,):
                seed += 1
                xs = _inputs(seed, world, (rows, dim_), dtype)
                residual0 = _inputs(seed + 100_000, 1, (rows, dim_), dtype)[0].cuda()
                weight = _inputs(seed + 200_000, 1, (dim_,), dtype)[0].cuda()
                # The reference: all_reduce, then fused_add_rmsnorm (on every rank: its collectives
                # are made in the same order everywhere).
                ref_x = comm.all_reduce(xs[rank].cuda())
                _equal(ref_x, _rank_order_sum(xs), f"{dtype} {rows}x{dim_} reduce")
                ref_res = residual0.clone()
                jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight, 1e-6)
                x, residual = xs[rank].cuda(), residual0.clone()
                comm.all_reduce_fused_add_rmsnorm(x, residual, weight, 1e-6)
                _equal(residual, ref_res.cpu(), f"{dtype} {rows}x{dim_} residual")
                _equal(x, ref_x.cpu(), f"{dtype} {rows}x{dim_} x")
    comm.check()


def _case_fused_fp8(comm, rank: int, world: int) -> None:
    """The static fp8 form against all_reduce then jit_kernel.fused_add_rmsnorm_quant_fp8."""
    import jit_kernel

    seed = 9000
    scale = torch.tensor([0.05], dtype=torch.float32, device="cuda")
    for dtype in DTYPES:
        for rows, dim in ((1, 4096), (7, 4096), (200, 1024), (2, 7168), (3, 1000), (3, 1001)):
            seed += 1
            xs = _inputs(seed, world, (rows, dim), dtype)
            residual0 = _inputs(seed + 100_000, 1, (rows, dim), dtype)[0].cuda()
            weight = _inputs(seed + 200_000, 1, (dim,), dtype)[0].cuda()
            ref_x = comm.all_reduce(xs[rank].cuda())
            ref_res = residual0.clone()
            ref_q = jit_kernel.fused_add_rmsnorm_quant_fp8(ref_x, ref_res, weight, scale, 1e-6)
            x, residual = xs[rank].cuda(), residual0.clone()
            q = comm.all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, 1e-6)
            _equal(residual, ref_res.cpu(), f"{dtype} {rows}x{dim} residual")
            _equal(q.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"{dtype} {rows}x{dim} q")
            # x is left normalised, as the fused form leaves it.
            jit_kernel.fused_add_rmsnorm(ref_x, residual0, weight, 1e-6)
            _equal(x, ref_x.cpu(), f"{dtype} {rows}x{dim} x")
    comm.check()


# The scale layouts of fused_add_rmsnorm_per_token_group_quant_fp8: (ue8m0, how output_s is made).
GROUP_LAYOUTS = ("row", "col", "col_tma", "col_tma_ue8m0", "row_ue8m0", "packed")


def _group_scales(layout: str, rows: int, groups: int) -> torch.Tensor:
    """A poisoned output_s of ``layout`` (float32 NaN, int32 -1): a scale left unwritten shows."""
    padded = (rows + 3) // 4 * 4
    if layout == "packed":
        words = torch.full(((groups + 3) // 4, padded), -1, dtype=torch.int32, device="cuda")
        return words.t().narrow(0, 0, rows)
    nan = float("nan")
    if layout.startswith("row"):
        return torch.full((rows, groups), nan, device="cuda")
    if layout == "col":
        return torch.full((groups, rows), nan, device="cuda").t()
    return torch.full((groups, padded), nan, device="cuda").t().narrow(0, 0, rows)  # TMA-padded tokens


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float32 or int32 tensor, as int32 on the CPU (NaN compares by its bits)."""
    return t.contiguous().view(torch.int32).cpu()


def _case_fused_group_fp8(comm, rank: int, world: int) -> None:
    """The per-token-group fp8 form against all_reduce then
    jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8 (its normed output is what x is left
    holding), for every scale layout of that op, groups of 128 and 64; hidden sizes the one-launch
    kernel takes (4096 and 7168 specialised by the norm in 16-bit types, 1280 and 2048 not, 16384 with
    four vectors a thread) and one it does not (16384 in fp32: the two calls). Row 1 of each input
    is zero on every rank, so its groups take the quant_eps floor."""
    import jit_kernel

    seed = 13000
    shapes = (
        (1, 4096, 128),
        (7, 4096, 128),
        (64, 4096, 128),
        (1, 7168, 128),
        (5, 7168, 128),
        (33, 7168, 128),
        (3, 2048, 128),
        (3, 1280, 128),
        (2, 16384, 128),
        (7, 4096, 64),
        (3, 4160, 64),  # 65 groups: the packed words' last bytes are zero
    )
    for dtype in DTYPES:
        for rows, dim, group in shapes:
            assert rows * dim * dtype.itemsize <= MAX_BYTES
            for layout in GROUP_LAYOUTS:
                seed += 1
                ue8m0 = layout in ("col_tma_ue8m0", "row_ue8m0", "packed")
                what = f"{dtype} {rows}x{dim} group {group} {layout}"
                xs = _inputs(seed, world, (rows, dim), dtype)
                residual0 = _inputs(seed + 100_000, 1, (rows, dim), dtype)[0]
                if rows > 1:
                    residual0[1] = 0
                    for t in xs:
                        t[1] = 0
                residual0 = residual0.cuda()
                weight = _inputs(seed + 200_000, 1, (dim,), dtype)[0].cuda()
                ref_x = comm.all_reduce(xs[rank].cuda())
                ref_res, ref_y = residual0.clone(), torch.empty_like(ref_x)
                ref_q, ref_s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
                    ref_x,
                    ref_res,
                    weight,
                    group,
                    1e-6,
                    1e-10,
                    scale_ue8m0=ue8m0,
                    output_s=_group_scales(layout, rows, dim // group),
                    normed_out=ref_y,
                )
                x, residual = xs[rank].cuda(), residual0.clone()
                q_given = torch.full((rows, dim), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
                s_given = _group_scales(layout, rows, dim // group)
                q, s = comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
                    x, residual, weight, group, 1e-6, 1e-10, scale_ue8m0=ue8m0, output_q=q_given, output_s=s_given
                )
                assert q is q_given and s is s_given
                _equal(residual, ref_res.cpu(), f"{what} residual")
                _equal(x, ref_y.cpu(), f"{what} x")
                _equal(q.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"{what} q")
                _equal(_bits(s), _bits(ref_s), f"{what} scales")
    # The outputs allocated in the op's layouts, and rows of a 3-D input.
    for dtype in DTYPES:
        for kwargs in ({}, {"column_major_scales": True}, {"packed_ue8m0": True}):
            seed += 1
            shape = (2, 3, 4096)
            xs = _inputs(seed, world, shape, dtype)
            residual0 = _inputs(seed + 100_000, 1, shape, dtype)[0].cuda()
            weight = _inputs(seed + 200_000, 1, (4096,), dtype)[0].cuda()
            ref_x = comm.all_reduce(xs[rank].cuda())
            ref_res, ref_y = residual0.clone(), torch.empty_like(ref_x)
            ref_q, ref_s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
                ref_x, ref_res, weight, 128, normed_out=ref_y, **kwargs
            )
            x, residual = xs[rank].cuda(), residual0.clone()
            q, s = comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, **kwargs)
            what = f"{dtype} {shape} allocated {kwargs}"
            assert s.shape == ref_s.shape and s.stride() == ref_s.stride() and s.dtype == ref_s.dtype, what
            _equal(residual, ref_res.cpu(), f"{what} residual")
            _equal(x, ref_y.cpu(), f"{what} x")
            _equal(q.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"{what} q")
            _equal(_bits(s), _bits(ref_s), f"{what} scales")
    # Captured in a CUDA graph, with TMA-padded column-major scales: replays read the current inputs.
    rows, dim = 4, 7168
    x = torch.zeros(rows, dim, dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros_like(x)
    weight = _inputs(8, 1, (dim,), torch.bfloat16)[0].cuda()
    q = torch.empty(rows, dim, dtype=torch.float8_e4m3fn, device="cuda")
    s = _group_scales("col_tma", rows, dim // 128)
    comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, output_q=q, output_s=s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, output_q=q, output_s=s)
    for replay in range(3):
        xs = _inputs(500 + replay, world, (rows, dim), torch.bfloat16)
        res0 = _inputs(600 + replay, 1, (rows, dim), torch.bfloat16)[0]
        x.copy_(xs[rank])
        residual.copy_(res0)
        graph.replay()
        torch.cuda.synchronize()
        ref_x, ref_res = _rank_order_sum(xs).cuda(), res0.cuda()
        ref_y = torch.empty_like(ref_x)
        ref_q, ref_s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
            ref_x, ref_res, weight, 128, output_s=_group_scales("col_tma", rows, dim // 128), normed_out=ref_y
        )
        _equal(residual, ref_res.cpu(), f"replay {replay} residual")
        _equal(x, ref_y.cpu(), f"replay {replay} x")
        _equal(q.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"replay {replay} q")
        _equal(_bits(s), _bits(ref_s), f"replay {replay} scales")
    comm.check()


def _misaligned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CUDA tensor whose data starts one element past a 16-byte boundary (NaN-filled
    where the dtype has NaN)."""
    numel = 1
    for n in shape:
        numel *= n
    base = torch.empty(numel + 16, dtype=dtype, device="cuda")
    if dtype.is_floating_point and dtype.itemsize > 1:
        base.fill_(float("nan"))
    t = base[1 : 1 + numel].view(shape)
    assert t.data_ptr() % 16 != 0
    return t


def _strided(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CUDA tensor of ``shape`` whose last dimension has stride 2 (not contiguous)."""
    t = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype, device="cuda")[..., ::2]
    assert not t.is_contiguous()
    return t


def _case_local_layout(comm, rank: int, world: int) -> None:
    """The last rank passes tensors the kernels cannot take where they lie (each call a different
    one: a misaligned or strided ``out``, ``x`` in place, ``residual``, ``weight``, fp8 ``out`` or
    ``output_q``); the other ranks pass ordinary ones. Every rank makes the same calls and gets
    the right bits, and no rank waits for a peer (the harness's short timeout_s would report it)."""
    import jit_kernel
    from jit_kernel.ops import allreduce as ops

    odd = rank == world - 1
    seed = 20000

    def mine(t: torch.Tensor, layout: str | None) -> torch.Tensor:
        """This rank's tensor holding ``t``'s values: laid out as ``layout`` on the last rank."""
        if not odd or layout is None:
            return t.clone()
        placed = _misaligned(tuple(t.shape), t.dtype) if layout == "misaligned" else _strided(tuple(t.shape), t.dtype)
        return placed.copy_(t)

    # all_reduce: a separate out, and in place, in both units (16-byte vectors and elements) and
    # (at 4 ranks) both algorithms.
    for dtype, n in (
        (torch.bfloat16, 4096),
        (torch.float16, 1001),
        (torch.float32, ops.ONE_SHOT_MAX_BYTES // 4 + 1024),
    ):
        for layout in ("misaligned", "strided"):
            seed += 1
            xs = _inputs(seed, world, (n,), dtype)
            expected = _rank_order_sum(xs)
            x = xs[rank].cuda()
            out = mine(torch.full((n,), float("nan"), dtype=dtype, device="cuda"), layout)
            assert comm.all_reduce(x, out=out) is out
            _equal(out, expected, f"{dtype} n={n} {layout} out")
            y = mine(x, layout)
            assert comm.all_reduce(y, out=y) is y
            _equal(y, expected, f"{dtype} n={n} {layout} in place")
    # The fused forms: the last rank's x, residual and weight each misaligned or strided in turn.
    cases = (
        ("misaligned", None, None),
        (None, "misaligned", None),
        (None, None, "misaligned"),
        ("strided", "strided", "strided"),
    )
    for rows, dim in ((7, 4096), (300, 1024)):
        for x_layout, residual_layout, weight_layout in cases:
            seed += 1
            what = f"{rows}x{dim} x {x_layout}, residual {residual_layout}, weight {weight_layout}"
            xs = _inputs(seed, world, (rows, dim), torch.bfloat16)
            residual0 = _inputs(seed + 100_000, 1, (rows, dim), torch.bfloat16)[0].cuda()
            weight0 = _inputs(seed + 200_000, 1, (dim,), torch.bfloat16)[0].cuda()
            ref_x = _rank_order_sum(xs).cuda()
            ref_res = residual0.clone()
            jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight0, 1e-6)
            x, residual = mine(xs[rank].cuda(), x_layout), mine(residual0, residual_layout)
            weight = mine(weight0, weight_layout)
            comm.all_reduce_fused_add_rmsnorm(x, residual, weight, 1e-6)
            _equal(residual, ref_res.cpu(), f"{what}: residual")
            _equal(x, ref_x.cpu(), f"{what}: x")
            # The static fp8 form: the same inputs, its fp8 out misaligned or strided too.
            scale = torch.tensor([0.05], dtype=torch.float32, device="cuda")
            ref_res = residual0.clone()
            ref_q = jit_kernel.fused_add_rmsnorm_quant_fp8(_rank_order_sum(xs).cuda(), ref_res, weight0, scale, 1e-6)
            x, residual = mine(xs[rank].cuda(), x_layout), mine(residual0, residual_layout)
            q_layout = "strided" if x_layout == "strided" else "misaligned"
            out = mine(torch.zeros(rows, dim, dtype=torch.float8_e4m3fn, device="cuda"), q_layout)
            assert comm.all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, 1e-6, out=out) is out
            _equal(residual, ref_res.cpu(), f"{what}: fp8 residual")
            _equal(out.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"{what}: fp8 out {q_layout}")
            # The per-token-group form, its output_q strided on the last rank.
            ref_x, ref_res = _rank_order_sum(xs).cuda(), residual0.clone()
            ref_y = torch.empty_like(ref_x)
            ref_q, ref_s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
                ref_x, ref_res, weight0, 128, 1e-6, 1e-10, normed_out=ref_y
            )
            x, residual = mine(xs[rank].cuda(), x_layout), mine(residual0, residual_layout)
            q = mine(torch.zeros(rows, dim, dtype=torch.float8_e4m3fn, device="cuda"), "strided")
            s = torch.full((rows, dim // 128), float("nan"), device="cuda")
            comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, output_q=q, output_s=s)
            _equal(residual, ref_res.cpu(), f"{what}: group residual")
            _equal(x, ref_y.cpu(), f"{what}: group x")
            _equal(q.view(torch.uint8), ref_q.view(torch.uint8).cpu(), f"{what}: group q")
            _equal(_bits(s), _bits(ref_s), f"{what}: group scales")
    comm.check()  # no rank gave up waiting


def _case_graph(comm, rank: int, world: int) -> None:
    import jit_kernel

    n, rows, dim = 3000, 4, 4096
    x = torch.zeros(n, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros_like(x)
    fx = torch.zeros(rows, dim, dtype=torch.bfloat16, device="cuda")
    fres = torch.zeros_like(fx)
    weight = _inputs(7, 1, (dim,), torch.bfloat16)[0].cuda()
    comm.all_reduce(x, out=out)  # load the kernels before capture
    comm.all_reduce_fused_add_rmsnorm(fx, fres, weight, 1e-6)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        comm.all_reduce(x, out=out)
        comm.all_reduce_fused_add_rmsnorm(fx, fres, weight, 1e-6)
    for replay in range(3):
        inputs = _inputs(100 + replay, world, (n,), torch.bfloat16)
        fxs = _inputs(200 + replay, world, (rows, dim), torch.bfloat16)
        res0 = _inputs(300 + replay, 1, (rows, dim), torch.bfloat16)[0]
        x.copy_(inputs[rank])
        fx.copy_(fxs[rank])
        fres.copy_(res0)
        graph.replay()
        torch.cuda.synchronize()
        _equal(out, _rank_order_sum(inputs), f"replay {replay}")
        ref_x, ref_res = _rank_order_sum(fxs).cuda(), res0.cuda()
        jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight, 1e-6)
        _equal(fres, ref_res.cpu(), f"replay {replay} residual")
        _equal(fx, ref_x.cpu(), f"replay {replay} x")
    comm.check()
    # Eager calls after the replays keep their epochs in step.
    inputs = _inputs(400, world, (n,), torch.bfloat16)
    _equal(comm.all_reduce(inputs[rank].cuda()), _rank_order_sum(inputs), "eager after replays")


def _case_graph_registered(comm, rank: int, world: int) -> None:
    """graph_inputs="register": calls of several sizes, dtypes and both algorithms captured in two
    graphs (two capture() contexts), their inputs static tensors, a temporary made inside the graph
    and a contiguous copy of a strided view; replayed many times with new inputs (outputs poisoned
    first), bit for bit against the rank-order sum; eager calls on both communicators in between.
    A one-shot call in place and the fused form copy in; a two-shot call in place (4 ranks) reads in
    place. Then the ranks capture different calls: every rank gets the ValueError, and eager calls
    still work. close() last."""
    import torch.distributed as dist

    import jit_kernel
    from jit_kernel.distributed import CustomAllReduce
    from jit_kernel.ops import allreduce as ops

    reg = CustomAllReduce(
        dist.group.WORLD, device=0, max_bytes=MAX_BYTES, timeout_s=comm.timeout_s, graph_inputs="register"
    )
    assert reg.disabled_reason is None, reg.disabled_reason
    two_shot_numel = ops.ONE_SHOT_MAX_BYTES // 4 + 4096  # fp32: two-shot from 3 ranks
    # (numel, dtype, how): "out" a separate output, "in_place" out=x, "temp" the input made in the
    # graph (x * 1), "strided" a strided view (copied to a contiguous temporary by the op).
    calls = [
        (3000, torch.bfloat16, "out"),
        (1001, torch.float16, "out"),  # not whole 16-byte vectors: element units
        (4096, torch.float32, "in_place"),  # one-shot in place: copies in
        (two_shot_numel, torch.float32, "out"),
        (two_shot_numel, torch.float32, "in_place"),  # two-shot in place at 4 ranks: reads in place
        (8192, torch.bfloat16, "temp"),
        (64 * 96, torch.bfloat16, "strided"),
        (16, torch.float16, "out"),
    ]
    statics = [torch.zeros(n, dtype=dtype, device="cuda") for n, dtype, _ in calls]
    strided_base = torch.zeros(96, 2, 64, dtype=torch.bfloat16, device="cuda")  # [:, 0, :].t(): [64, 96] strided
    outs: list[torch.Tensor | None] = [
        torch.zeros_like(t) if how == "out" else None for t, (_, _, how) in zip(statics, calls, strict=True)
    ]
    rows, dim = 4, 4096
    fx = torch.zeros(rows, dim, dtype=torch.bfloat16, device="cuda")
    fres = torch.zeros_like(fx)
    weight = _inputs(7, 1, (dim,), torch.bfloat16)[0].cuda()

    def step(first: int, last: int) -> list[torch.Tensor]:
        results = []
        for i in range(first, last):
            _, _, how = calls[i]
            if how == "out":
                results.append(reg.all_reduce(statics[i], out=outs[i]))
            elif how == "in_place":
                results.append(reg.all_reduce(statics[i], out=statics[i]))
            elif how == "temp":
                results.append(reg.all_reduce(statics[i] * 1))
            else:
                results.append(reg.all_reduce(strided_base[:, 0, :].t()))
        return results

    # Load every kernel before capture (eager calls: the copy-in).
    step(0, len(calls))
    reg.all_reduce_fused_add_rmsnorm(fx, fres, weight, 1e-6)
    torch.cuda.synchronize()
    half = 5
    graphs = [torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()]
    with reg.capture(), torch.cuda.graph(graphs[0]):
        results = step(0, half)
        reg.all_reduce_fused_add_rmsnorm(fx, fres, weight, 1e-6)
    in_place_two_shot = ops.choose_algorithm(two_shot_numel * 4, world) == ops.TWO_SHOT
    assert reg.registered_graph_calls == (4 if in_place_two_shot else 3), reg.registered_graph_calls
    assert reg.copied_graph_calls == (1 if in_place_two_shot else 2), reg.copied_graph_calls
    with reg.capture(), torch.cuda.graph(graphs[1]):
        results += step(half, len(calls))
    assert reg.registered_graph_calls == (7 if in_place_two_shot else 6)  # the rest are registered

    def fill(seed: int) -> list[list[torch.Tensor]]:
        everyone = []
        for i, (n, dtype, how) in enumerate(calls):
            xs = _inputs(seed * 100 + i, world, (n,), dtype)
            everyone.append(xs)
            if how == "strided":
                strided_base[:, 0, :].t().copy_(xs[rank].view(64, 96))
                strided_base[:, 1, :] = float("nan")  # the other half of the base: not part of the input
            else:
                statics[i].copy_(xs[rank])
            if outs[i] is not None:
                outs[i].fill_(float("nan"))
        return everyone

    for replay in range(20):
        everyone = fill(1000 + replay)
        fxs = _inputs(5000 + replay, world, (rows, dim), torch.bfloat16)
        res0 = _inputs(6000 + replay, 1, (rows, dim), torch.bfloat16)[0]
        fx.copy_(fxs[rank])
        fres.copy_(res0)
        graphs[replay % 2].replay()
        graphs[1 - replay % 2].replay()
        torch.cuda.synchronize()
        for i, (n, dtype, how) in enumerate(calls):
            expected = _rank_order_sum(everyone[i])
            if how == "strided":
                expected = expected.view(64, 96)
            _equal(results[i], expected, f"replay {replay} call {i} ({n} {dtype} {how})")
        ref_x, ref_res = _rank_order_sum(fxs).cuda(), res0.cuda()
        jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight, 1e-6)
        _equal(fres, ref_res.cpu(), f"replay {replay} fused residual")
        _equal(fx, ref_x.cpu(), f"replay {replay} fused x")
        if replay % 5 == 4:  # eager calls on both communicators between replays
            for c in (reg, comm):
                xs = _inputs(7000 + replay, world, (3000,), torch.bfloat16)
                _equal(c.all_reduce(xs[rank].cuda()), _rank_order_sum(xs), f"eager after replay {replay}")
    reg.check()
    # The ranks capture different calls: no input is registered, every rank raises, nothing replays.
    x = torch.zeros(1024, dtype=torch.bfloat16, device="cuda")
    y = torch.zeros_like(x)
    before = reg.registered_graph_calls
    graph = torch.cuda.CUDAGraph()
    try:
        with reg.capture(), torch.cuda.graph(graph):
            for _ in range(1 + (rank == world - 1)):
                reg.all_reduce(x, out=y)
    except ValueError as error:
        assert "rank 0 captured 1 all_reduce calls" in str(error), str(error)
    else:
        raise AssertionError("different captures were registered")
    assert reg.registered_graph_calls == before
    xs = _inputs(8000, world, (1024,), torch.bfloat16)
    _equal(reg.all_reduce(xs[rank].cuda()), _rank_order_sum(xs), "eager after a refused capture")
    # The ranks' next slots agree again: a later capture registers.
    graph = torch.cuda.CUDAGraph()
    with reg.capture(), torch.cuda.graph(graph):
        reg.all_reduce(x, out=y)
    assert reg.registered_graph_calls == before + 1
    for replay in range(3):
        xs = _inputs(8100 + replay, world, (1024,), torch.bfloat16)
        x.copy_(xs[rank])
        graph.replay()
        torch.cuda.synchronize()
        _equal(y, _rank_order_sum(xs), f"capture after a refused one, replay {replay}")
    reg.check()
    torch.cuda.synchronize()
    dist.barrier()
    reg.close()


def _case_rank_exits(comm, rank: int, world: int) -> None:
    """The last rank leaves after the set-up; the others get PeerTimeoutError naming it."""
    from jit_kernel.distributed import PeerTimeoutError

    if rank == world - 1:
        os._exit(0)
    time.sleep(1.0)
    start = time.monotonic()
    comm.all_reduce(torch.ones(1024, device="cuda"))
    try:
        comm.check()
    except PeerTimeoutError as error:
        elapsed = time.monotonic() - start
        assert f"rank(s) [{world - 1}] did not arrive" in str(error), str(error)
        assert elapsed < comm.timeout_s + 30, elapsed
    else:
        raise AssertionError("no PeerTimeoutError")
    try:  # refused from now on, at once
        comm.all_reduce(torch.ones(16, device="cuda"))
    except PeerTimeoutError:
        pass
    else:
        raise AssertionError("a failed communicator was used again")
    os._exit(0)  # the group has a dead rank: leave without its collectives


def _case_rank_stalls(comm, rank: int, world: int) -> None:
    """Rank 0 never calls (it sleeps past the timeout); the others name it, then everyone leaves."""
    from jit_kernel.distributed import PeerTimeoutError

    if rank == 0:
        time.sleep(comm.timeout_s + 10)
        os._exit(0)
    comm.all_reduce(torch.ones(4096, dtype=torch.bfloat16, device="cuda"))
    try:
        comm.check()
    except PeerTimeoutError as error:
        assert "rank(s) [0] did not arrive" in str(error), str(error)
    else:
        raise AssertionError("no PeerTimeoutError")
    os._exit(0)


CASES = {
    "sizes": _case_sizes,
    "fused": _case_fused,
    "fused_fp8": _case_fused_fp8,
    "fused_group_fp8": _case_fused_group_fp8,
    "local_layout": _case_local_layout,
    "graph": _case_graph,
    "graph_registered": _case_graph_registered,
    "rank_exits": _case_rank_exits,
    "rank_stalls": _case_rank_stalls,
}


def rank_main(rank: int, world: int, init: str, case: str, timeout_s: float) -> None:
    import torch.distributed as dist

    from jit_kernel.distributed import CustomAllReduce

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    comm = CustomAllReduce(dist.group.WORLD, device=0, max_bytes=MAX_BYTES, timeout_s=timeout_s)
    assert comm.disabled_reason is None, comm.disabled_reason
    CASES[case](comm, rank, world)
    torch.cuda.synchronize()
    dist.barrier()
    comm.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_all_reduce_every_dtype_and_size(world: int) -> None:
    _run("sizes", world, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_fused_add_rmsnorm_bit_for_bit(world: int) -> None:
    _run("fused", world, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_fused_add_rmsnorm_quant_fp8_bit_for_bit(world: int) -> None:
    _run("fused_fp8", world, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_fused_add_rmsnorm_per_token_group_quant_fp8_bit_for_bit(world: int) -> None:
    _run("fused_group_fp8", world, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_one_ranks_layouts_stall_no_peer(world: int) -> None:
    _run("local_layout", world, timeout_s=10.0, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_graph_capture_and_replay(world: int) -> None:
    _run("graph", world)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_cuda_graph_registered_inputs(world: int) -> None:
    _run("graph_registered", world, limit_s=600)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_rank_that_exits_gives_a_clear_error(world: int) -> None:
    _run("rank_exits", world, timeout_s=3.0, limit_s=120)


@pytest.mark.gpu
def test_rank_that_stalls_gives_a_clear_error() -> None:
    _run("rank_stalls", 2, timeout_s=3.0, limit_s=120)


@pytest.mark.gpu
def test_world_size_one() -> None:
    import torch.distributed as dist

    import jit_kernel
    from jit_kernel.distributed import CustomAllReduce

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
        try:
            comm = CustomAllReduce(dist.group.WORLD)
            x = torch.randn(4, 4096, dtype=torch.bfloat16, device="cuda")
            assert comm.all_reduce(x) is x
            residual, weight = torch.randn_like(x), torch.randn(4096, dtype=torch.bfloat16, device="cuda")
            ref_x, ref_res = x.clone(), residual.clone()
            jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight, 1e-6)
            comm.all_reduce_fused_add_rmsnorm(x, residual, weight, 1e-6)
            assert torch.equal(x, ref_x) and torch.equal(residual, ref_res)
            # The static fp8 form is fused_add_rmsnorm then per_tensor_quant_fp8 (x left normalised).
            scale = torch.tensor([0.05], dtype=torch.float32, device="cuda")
            ref_x, ref_res = x.clone(), residual.clone()
            jit_kernel.fused_add_rmsnorm(ref_x, ref_res, weight, 1e-6)
            ref_q, _ = jit_kernel.per_tensor_quant_fp8(ref_x, None, scale, is_static=True)
            out = torch.empty(4, 4096, dtype=torch.float8_e4m3fn, device="cuda")
            assert comm.all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, 1e-6, out=out) is out
            assert torch.equal(out.view(torch.uint8), ref_q.view(torch.uint8))
            assert torch.equal(x, ref_x) and torch.equal(residual, ref_res)
            # The per-token-group form is the norm op, x its normed output.
            ref_y = torch.empty_like(x)
            ref_q, ref_s = jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(
                x.clone(), ref_res, weight, 128, column_major_scales=True, normed_out=ref_y
            )
            q, s = comm.all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
                x, residual, weight, column_major_scales=True
            )
            assert torch.equal(residual, ref_res) and torch.equal(x, ref_y)
            assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)
            assert s.stride() == ref_s.stride()
            comm.close()
        finally:
            dist.destroy_process_group()
