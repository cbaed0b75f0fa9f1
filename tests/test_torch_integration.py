"""torch.library registration of the norm / quant / scale ops: fake implementations,
torch.compile(fullgraph=True) with no graph break, and CUDA-graph capture and replay."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import assert_close, fake_cuda

OPS = [
    "rmsnorm",
    "rmsnorm_out",
    "fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "qknorm_across_heads",
    "per_tensor_quant_fp8",
    "scale",
    "scale_out",
]


@pytest.mark.parametrize("name", OPS)
def test_registered_under_jit_kernel_namespace(name: str) -> None:
    op = getattr(torch.ops.jit_kernel, name)
    schema = op.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    expected = {
        "rmsnorm_out": {"out"},
        "fused_add_rmsnorm": {"input", "residual"},
        "fused_inplace_qknorm": {"q", "k"},
        "qknorm_across_heads": {"q", "k"},
        "per_tensor_quant_fp8": {"output_q", "output_s"},
        "scale_out": {"out"},
    }.get(name, set())
    assert mutated == expected, schema


def test_fake_implementations() -> None:
    with fake_cuda():
        x = torch.empty(4, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
        y = torch.ops.jit_kernel.rmsnorm(x, w, 1e-6)
        assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
        assert torch.ops.jit_kernel.scale(x, 2.0).shape == x.shape
        torch.ops.jit_kernel.fused_add_rmsnorm(x, torch.empty_like(x), w, 1e-6)
        q = torch.empty(4, 8, 128, device="cuda", dtype=torch.bfloat16)
        qw = torch.empty(128, device="cuda", dtype=torch.bfloat16)
        torch.ops.jit_kernel.fused_inplace_qknorm(
            q, torch.empty(4, 2, 128, device="cuda", dtype=torch.bfloat16), qw, qw, 1e-6
        )
        torch.ops.jit_kernel.per_tensor_quant_fp8(
            x, torch.empty(4, 4096, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, device="cuda"), False
        )


def _model(x, residual, w, qkv, qw, kw, hq: int, hk: int, d: int):
    """A decoder-layer-like function calling every op."""
    n = x.shape[0]
    h = jit_kernel.rmsnorm(x, w)
    jit_kernel.fused_add_rmsnorm(h, residual, w)
    q = qkv[:, : hq * d].view(n, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(n, hk, d)
    jit_kernel.fused_inplace_qknorm(q, k, qw, kw)
    q2 = qkv[:, : hq * d]
    k2 = qkv[:, hq * d : (hq + hk) * d]
    jit_kernel.qknorm_across_heads(q2, k2, w[: hq * d], w[: hk * d])
    s = jit_kernel.scale(h, 0.5)
    out = torch.empty_like(s)
    jit_kernel.rmsnorm(s, w, out=out)
    fq, fs = jit_kernel.per_tensor_quant_fp8(out)
    return out, fq.float() * fs, h


def _inputs(n: int = 48, d_model: int = 4096, hq: int = 16, hk: int = 4, d: int = 128):
    dt = torch.bfloat16
    return (
        torch.randn(n, d_model, device="cuda", dtype=dt),
        torch.randn(n, d_model, device="cuda", dtype=dt),
        torch.rand(d_model, device="cuda", dtype=dt) + 0.5,
        torch.randn(n, (hq + 2 * hk) * d, device="cuda", dtype=dt),
        torch.rand(d, device="cuda", dtype=dt) + 0.5,
        torch.rand(d, device="cuda", dtype=dt) + 0.5,
    )


def _clone(args):
    return tuple(a.clone() for a in args)


@pytest.mark.gpu
def test_torch_compile_fullgraph_no_graph_break() -> None:
    torch._dynamo.reset()
    args = _inputs()
    eager_args, compiled_args = _clone(args), _clone(args)
    expected = _model(*eager_args, 16, 4, 128)
    compiled = torch.compile(_model, fullgraph=True)
    got = compiled(*compiled_args, 16, 4, 128)
    for a, b in zip(got, expected, strict=True):
        assert_close(a, b, torch.bfloat16)
    for a, b in zip(compiled_args, eager_args, strict=True):  # the in-place updates happened
        assert_close(a, b, torch.bfloat16)
    explanation = torch._dynamo.explain(_model)(*_clone(args), 16, 4, 128)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay() -> None:
    static = _inputs()
    jit_kernel.rmsnorm(static[0], static[2])  # resolve kernels outside capture
    _model(*_clone(static), 16, 4, 128)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    working = _clone(static)
    with torch.cuda.graph(graph):
        outputs = _model(*working, 16, 4, 128)
    for _ in range(2):
        fresh = _inputs()
        for dst, src in zip(working, fresh, strict=True):
            dst.copy_(src)
        graph.replay()
        expected = _model(*_clone(fresh), 16, 4, 128)
        torch.cuda.synchronize()
        for a, b in zip(outputs, expected, strict=True):
            assert_close(a, b, torch.bfloat16)


@pytest.mark.gpu
def test_direct_ops_are_torch_ops_equivalent() -> None:
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(torch.ops.jit_kernel.rmsnorm(x, w, 1e-6), jit_kernel.rmsnorm(x, w))
    out = torch.empty_like(x)
    torch.ops.jit_kernel.rmsnorm_out(out, x, w, 1e-6)
    torch.testing.assert_close(out, jit_kernel.rmsnorm(x, w))
    torch.testing.assert_close(torch.ops.jit_kernel.scale(x, 3.0), jit_kernel.scale(x, 3.0))
