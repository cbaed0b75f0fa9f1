"""Programmatic dependent launch (``enable_pdl``): a kernel launched with it may start before the
kernel ahead of it in the stream has finished, so it must wait before its first memory access.

These tests chain ops that each read what the previous launch wrote, with PDL on, eagerly and in a
CUDA graph, and compare bit for bit with the same chain with PDL off (same kernels: any missing
wait shows up as a different result). Bad ``enable_pdl`` values are rejected naming the argument.
"""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import assert_close, fake_cuda

EPS = 1e-6
STEPS = 16


def _norm_chain(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, qkv: torch.Tensor, qk_w: torch.Tensor, pdl: bool | None
) -> None:
    """Every launch reads tensors the launch before it wrote."""
    n = x.shape[0]
    q = qkv[:, : 8 * 128]
    k = qkv[:, 8 * 128 : 10 * 128]
    for _ in range(STEPS):
        jit_kernel.fused_add_rmsnorm(x, r, w, EPS, enable_pdl=pdl)
        jit_kernel.rmsnorm(x, w, EPS, out=x, enable_pdl=pdl)
        qkv[:, : x.shape[1]].copy_(x[:, : qkv.shape[1]])  # a torch kernel in between
        jit_kernel.fused_inplace_qknorm(
            q.view(n, 8, 128), k.view(n, 2, 128), qk_w[:128], qk_w[128:256], EPS, enable_pdl=pdl
        )
        jit_kernel.qknorm_across_heads(q, k, qk_w[: 8 * 128], qk_w[8 * 128 :], EPS, enable_pdl=pdl)
        x[:, : qkv.shape[1]].add_(qkv[:, : x.shape[1]])


def _norm_inputs(n: int, d: int) -> tuple[torch.Tensor, ...]:
    return (
        torch.randn(n, d, device="cuda", dtype=torch.bfloat16),
        torch.randn(n, d, device="cuda", dtype=torch.bfloat16),
        torch.rand(d, device="cuda", dtype=torch.bfloat16) + 0.5,
        torch.randn(n, 12 * 128, device="cuda", dtype=torch.bfloat16),
        torch.rand(10 * 128, device="cuda", dtype=torch.bfloat16) + 0.5,
    )


def _chain_without_pdl(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The chain's results with PDL off, on copies of ``inputs``."""
    outputs = tuple(t.clone() for t in inputs)
    _norm_chain(*outputs, pdl=False)
    return outputs


def _assert_bitwise_equal(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    torch.cuda.synchronize()
    for a, b in zip(actual, expected, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "d"), [(1, 4096), (16, 2048), (300, 1000), (2048, 4096)])
def test_norm_chain_with_pdl_matches_without(n: int, d: int) -> None:
    inputs = _norm_inputs(n, d)
    expected = _chain_without_pdl(inputs)
    for pdl in (True, None):
        with_pdl = tuple(t.clone() for t in inputs)
        _norm_chain(*with_pdl, pdl=pdl)
        _assert_bitwise_equal(with_pdl, expected)


@pytest.mark.gpu
def test_norm_chain_with_pdl_in_a_cuda_graph() -> None:
    inputs = _norm_inputs(64, 4096)
    working = tuple(t.clone() for t in inputs)
    _norm_chain(*tuple(t.clone() for t in inputs), pdl=True)  # resolve kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _norm_chain(*working, pdl=True)
    for _ in range(2):
        fresh = _norm_inputs(64, 4096)
        for dst, src in zip(working, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        _assert_bitwise_equal(working, _chain_without_pdl(fresh))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [4096, 65536, 1 << 20])
def test_quant_chain_with_pdl(n: int, dtype: torch.dtype) -> None:
    """Each quantisation reads the input a torch kernel has just rescaled, and the static one reads
    the scale the dynamic one has just written."""
    x = torch.randn(n, device="cuda", dtype=dtype)
    results = {}
    for pdl in (False, True):
        y = x.clone()
        scales, quants = [], []
        for step in range(STEPS):
            y.mul_(1.5 if step % 2 else 0.5)
            q, s = jit_kernel.per_tensor_quant_fp8(y, enable_pdl=pdl)
            qs, _ = jit_kernel.per_tensor_quant_fp8(y, output_s=s, is_static=True, enable_pdl=pdl)
            scales.append(s.clone())
            quants.append(torch.stack([q.float(), qs.float()]))
        results[pdl] = (torch.cat(scales), torch.stack(quants))
    torch.cuda.synchronize()
    assert torch.equal(results[True][0], results[False][0])
    assert torch.equal(results[True][1], results[False][1])
    y = x.clone()
    for step in range(STEPS):
        y.mul_(1.5 if step % 2 else 0.5)
    expected = (y.float().abs().max().double() / 448.0).float()
    torch.testing.assert_close(results[True][0][-1], expected, rtol=0, atol=0)


@pytest.mark.gpu
def test_rmsnorm_pdl_values_match_reference() -> None:
    x = torch.randn(7, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    xf = x.double()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    for pdl in (True, False, None):
        out = torch.full_like(x, float("nan"))
        jit_kernel.rmsnorm(x, w, EPS, out=out, enable_pdl=pdl)
        assert_close(out, expected, torch.bfloat16)


def _always_pdl_chain(kx, vx, ky, vy, fx, fy, perm, ident) -> None:
    """scale, add_constant and the hicache transfer take no ``enable_pdl`` (the seed's signatures):
    on sm_90+ they always launch with PDL. Every launch reads what the launch before it wrote, and
    every step is exact (integer adds, row copies, doublings of fp32), so one stale read shows."""
    for _ in range(STEPS):
        jit_kernel.add_constant(kx, 1, out=ky)
        jit_kernel.add_constant(vx, 2, out=vy)
        jit_kernel.transfer_hicache_one_layer(kx, vx, perm, ky, vy, ident)  # rows of y back into x, permuted
        jit_kernel.scale(fx, 2.0, out=fy)
        jit_kernel.scale(fy, 2.0, out=fx)


def _always_pdl_reference(kx, vx, fx, perm) -> tuple[torch.Tensor, ...]:
    kx, vx, fx = kx.clone(), vx.clone(), fx.clone()
    for _ in range(STEPS):
        ky, vy = kx + 1, vx + 2
        kx[perm], vx[perm] = ky, vy
        fx = fx * 4.0
    return kx, vx, fx


def _always_pdl_inputs(rows: int) -> tuple[torch.Tensor, ...]:
    """int32 K/V rows of 2 KiB (a prebuilt hicache row size), their outputs, fp32 data in [1, 2)."""
    kx = torch.randint(-1000, 1000, (rows, 512), device="cuda", dtype=torch.int32)
    vx = torch.randint(-1000, 1000, (rows, 512), device="cuda", dtype=torch.int32)
    fx = torch.rand(rows, 4096, device="cuda") + 1.0
    perm = torch.randperm(rows, device="cuda")
    ident = torch.arange(rows, device="cuda")
    return kx, vx, torch.full_like(kx, -1), torch.full_like(vx, -1), fx, torch.full_like(fx, float("nan")), perm, ident


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 4096])
def test_ops_that_always_launch_with_pdl_chain_exactly(rows: int) -> None:
    kx, vx, ky, vy, fx, fy, perm, ident = _always_pdl_inputs(rows)
    expected = _always_pdl_reference(kx, vx, fx, perm)
    _always_pdl_chain(kx, vx, ky, vy, fx, fy, perm, ident)
    _assert_bitwise_equal((kx, vx, fx), expected)


@pytest.mark.gpu
def test_ops_that_always_launch_with_pdl_chain_exactly_in_a_cuda_graph() -> None:
    inputs = _always_pdl_inputs(64)
    kx, vx, ky, vy, fx, fy, perm, ident = (t.clone() for t in inputs)
    _always_pdl_chain(*(t.clone() for t in inputs))  # resolve kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _always_pdl_chain(kx, vx, ky, vy, fx, fy, perm, ident)
    expected = _always_pdl_reference(inputs[0], inputs[1], inputs[4], inputs[6])
    graph.replay()
    _assert_bitwise_equal((kx, vx, fx), expected)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "call",
    [
        lambda: jit_kernel.rmsnorm(_bf16(4, 8), _bf16(8), enable_pdl="yes"),
        lambda: jit_kernel.fused_add_rmsnorm(_bf16(4, 8), _bf16(4, 8), _bf16(8), enable_pdl=[True]),
        lambda: jit_kernel.fused_inplace_qknorm(_bf16(4, 2, 8), _bf16(4, 2, 8), _bf16(8), _bf16(8), enable_pdl=1.0),
        lambda: jit_kernel.qknorm_across_heads(_bf16(4, 8), _bf16(4, 8), _bf16(8), _bf16(8), enable_pdl="on"),
        lambda: jit_kernel.per_tensor_quant_fp8(_bf16(8), enable_pdl=object()),
    ],
)
def test_bad_enable_pdl_is_rejected(call) -> None:
    # An int converts to bool (tvm-ffi's rule, as in Python), so 0 and 1 are not bad values.
    with fake_cuda(), pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        call()
