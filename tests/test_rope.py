"""apply_rope_with_cos_sin_cache_inplace and fused_qknorm_rope against a plain float64 torch reference.

The ops work in place, so "poisoned outputs" are the inputs themselves: the cos/sin caches of the
main tests are random numbers rather than trigonometric tables, so that every rotated element of
every head changes by a lot (an unwritten element, or one written twice, fails); elements that must
stay untouched (v, the pass-through part of partial rotary, MLA's nope part) are compared bit for
bit. Inputs are fresh random tensors per test."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOL = {
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 2e-2},
    torch.float16: {"rtol": 2e-3, "atol": 4e-3},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
}
EPS = 1e-6
MAX_POS = 4096


# fused_qknorm_rope rounds its normalised intermediate to the dtype; where the fp32 kernel and the
# fp64 reference (or the two-launch path, whose sum of squares runs in another order) land on two
# sides of a rounding boundary (rare: about 1e-4 of the elements), that one-ulp step is multiplied
# by cos/sin (|c| + |s| <= 2 with the uniform caches of those tests). The share of elements that
# differ at all from the two-launch path is bounded separately in 16-bit dtypes (MAX_DIFFERENT).
FUSED_TOL = {
    torch.bfloat16: {"rtol": 1.6e-2, "atol": 7e-2},
    torch.float16: {"rtol": 2e-3, "atol": 1e-2},
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
}
MAX_DIFFERENT = 2e-3


def as_heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[n, H * D]`` or ``[n, H, D]`` as ``[n, H, D]`` (reshape's -1 is ambiguous when n = 0)."""
    heads = x.shape[1] if x.dim() == 3 else x.shape[1] // head_size
    return x.reshape(x.shape[0], heads, head_size)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, tol: dict | None = None) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), **(tol or TOL)[dtype])


# ---------------------------------------------------------------------------------------------
# Reference (float64, written plainly)


def ref_rope(
    positions: torch.Tensor, x: torch.Tensor, head_size: int, cache: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """x [n, H*D] or [n, H, D] -> rotated float64 [n, H, D]."""
    out = as_heads(x.double(), head_size).clone()
    rot = cache.shape[1]
    half = rot // 2
    rows = cache.double()[positions.long()]  # [n, rot]
    cos = rows[:, None, :half]
    sin = rows[:, None, half:]
    if is_neox:
        a, b = out[..., :half].clone(), out[..., half:rot].clone()
        out[..., :half] = a * cos - b * sin
        out[..., half:rot] = b * cos + a * sin
    else:
        a, b = out[..., 0:rot:2].clone(), out[..., 1:rot:2].clone()
        out[..., 0:rot:2] = a * cos - b * sin
        out[..., 1:rot:2] = b * cos + a * sin
    return out


def ref_norm(x: torch.Tensor, w: torch.Tensor, head_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Per-head RMSNorm in float64, rounded to dtype (the fused op's documented intermediate)."""
    xf = as_heads(x.double(), head_size)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.double()
    return y.to(dtype)


def random_cache(max_pos: int, rot: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(max_pos, rot, device="cuda", dtype=torch.float32).to(dtype)


def uniform_cache(max_pos: int, rot: int, dtype: torch.dtype) -> torch.Tensor:
    """Random cos/sin values in [-1, 1] (as real tables), far from identity rotations."""
    return (torch.rand(max_pos, rot, device="cuda", dtype=torch.float32) * 2 - 1).to(dtype)


def trig_cache(max_pos: int, rot: int, dtype: torch.dtype, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype).cuda()


def fused_qkv(n: int, hq: int, hk: int, d: int, dtype: torch.dtype, pad: int = 0):
    """q [n, hq*d], k [n, hk*d] and v: strided views of one [n, (hq + 2hk)*d + pad] tensor."""
    qkv = torch.randn(n, (hq + 2 * hk) * d + pad, device="cuda", dtype=torch.float32).to(dtype)
    q = qkv[:, : hq * d]
    k = qkv[:, hq * d : (hq + hk) * d]
    v = qkv[:, (hq + hk) * d :]
    return qkv, q, k, v


def rand_positions(n: int, dtype: torch.dtype = torch.int64, max_pos: int = MAX_POS) -> torch.Tensor:
    return torch.randint(0, max_pos, (n,), device="cuda", dtype=dtype)


def check_rope(positions, q, k, head_size, cache, is_neox, dtype, untouched=()):
    """Run the op and compare with the reference; `untouched` tensors must keep their bits."""
    saved = [t.clone() for t in untouched]
    exp_q = ref_rope(positions, q, head_size, cache, is_neox)
    exp_k = ref_rope(positions, k, head_size, cache, is_neox)
    jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, head_size, cache, is_neox)
    assert_close(as_heads(q, head_size), exp_q, dtype)
    assert_close(as_heads(k, head_size), exp_k, dtype)
    for before, after in zip(saved, untouched, strict=True):
        assert torch.equal(before, after)


# ---------------------------------------------------------------------------------------------
# GPU: apply_rope_with_cos_sin_cache_inplace

# (head_size, rotary_dim): the prebuilt sizes, partial rotary, sizes that are no whole 16-byte
# vector pairs (scalar path) and small odd-looking ones.
DIMS = [(64, 64), (128, 128), (256, 256), (128, 64), (128, 32), (80, 80), (96, 48), (72, 72), (6, 6), (10, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
@pytest.mark.parametrize(("d", "rot"), DIMS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_fused_qkv(n: int, d: int, rot: int, is_neox: bool, dtype: torch.dtype) -> None:
    hq, hk = 8, 2
    _, q, k, v = fused_qkv(n, hq, hk, d, dtype)
    cache = random_cache(MAX_POS, rot, torch.float32)
    positions = rand_positions(n)
    # The pass-through part of every head must keep its bits.
    q_pass = q.view(n, hq, d)[..., rot:]
    k_pass = k.view(n, hk, d)[..., rot:]
    check_rope(positions, q, k, d, cache, is_neox, dtype, untouched=(v, q_pass, k_pass))


@pytest.mark.gpu
@pytest.mark.parametrize("cache_dtype", ["fp32", "same"])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_cache_and_position_dtypes(cache_dtype: str, pos_dtype, is_neox: bool, dtype: torch.dtype) -> None:
    n, hq, hk, d = 37, 32, 8, 128
    _, q, k, v = fused_qkv(n, hq, hk, d, dtype)
    cache = random_cache(MAX_POS, d, torch.float32 if cache_dtype == "fp32" else dtype)
    check_rope(rand_positions(n, pos_dtype), q, k, d, cache, is_neox, dtype, untouched=(v,))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_trig_cache_real_model_shape(is_neox: bool, dtype: torch.dtype) -> None:
    """Llama-like: 32 q heads, 8 kv heads x 128, a real cos/sin table, 4096 tokens."""
    n, hq, hk, d = 4096, 32, 8, 128
    _, q, k, v = fused_qkv(n, hq, hk, d, dtype)
    cache = trig_cache(8192, d, torch.float32)
    check_rope(rand_positions(n, max_pos=8192), q, k, d, cache, is_neox, dtype, untouched=(v,))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 1000, 16384])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_separate_contiguous_3d(n: int, dtype: torch.dtype) -> None:
    d = 128
    q = torch.randn(n, 32, d, device="cuda", dtype=dtype)
    k = torch.randn(n, 8, d, device="cuda", dtype=dtype)
    cache = random_cache(MAX_POS, d, torch.float32)
    check_rope(rand_positions(n), q, k, d, cache, True, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_head_strides_and_misaligned(is_neox: bool, dtype: torch.dtype) -> None:
    n, d = 33, 128
    # 3-D views with a head stride (d + 8) and a token stride: the vector path.
    qbuf = torch.randn(n, 4, d + 8, device="cuda", dtype=dtype)
    kbuf = torch.randn(n, 2, d + 8, device="cuda", dtype=dtype)
    q, k = qbuf[..., :d], kbuf[..., :d]
    pad_q, pad_k = qbuf[..., d:], kbuf[..., d:]
    cache = random_cache(MAX_POS, d, torch.float32)
    check_rope(rand_positions(n), q, k, d, cache, is_neox, dtype, untouched=(pad_q, pad_k))
    # Shifted by one element (no 16-byte alignment) and an odd token stride: the scalar path.
    base = torch.randn(n * (6 * d + 3) + 1, device="cuda", dtype=dtype)
    rows = base[1:].view(n, 6 * d + 3)
    q, k, tail = rows[:, : 4 * d], rows[:, 4 * d : 6 * d], rows[:, 6 * d :]
    check_rope(rand_positions(n), q, k, d, cache, is_neox, dtype, untouched=(tail, base[:1]))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_rope_mla_rope_part(n: int, is_neox: bool, dtype: torch.dtype) -> None:
    """DeepSeek MLA: the 64-wide rope part of 576-wide heads, as strided views q[..., 512:]."""
    q_full = torch.randn(n, 16, 576, device="cuda", dtype=dtype)
    k_full = torch.randn(n, 1, 576, device="cuda", dtype=dtype)
    q, k = q_full[..., 512:], k_full[..., 512:]
    cache = random_cache(MAX_POS, 64, torch.float32)
    check_rope(rand_positions(n), q, k, 64, cache, is_neox, dtype, untouched=(q_full[..., :512], k_full[..., :512]))
    # k as a 2-D [n, 64] view of a [n, 576] latent cache row.
    latent = torch.randn(n, 576, device="cuda", dtype=dtype)
    q2 = torch.randn(n, 16, 576, device="cuda", dtype=dtype)[..., 512:]
    check_rope(rand_positions(n), q2, latent[:, 512:], 64, cache, is_neox, dtype, untouched=(latent[:, :512],))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_non_contiguous_positions_and_strided_cache(dtype: torch.dtype) -> None:
    n, d = 100, 128
    _, q, k, v = fused_qkv(n, 8, 2, d, dtype)
    positions = rand_positions(2 * n)[::2]
    assert not positions.is_contiguous()
    cache = random_cache(MAX_POS, 2 * d, torch.float32)[:, :d]  # rows strided by 2d
    check_rope(positions, q, k, d, cache, True, dtype, untouched=(v,))


@pytest.mark.gpu
def test_rope_out_of_range_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    n, d, dtype = 16, 128, torch.bfloat16
    _, q, k, _ = fused_qkv(n, 4, 2, d, dtype)
    cache = random_cache(100, d, torch.float32)
    positions = torch.randint(0, 100, (n,), device="cuda")
    positions[3] = 100
    positions[9] = -1
    monkeypatch.setenv("JIT_KERNEL_CHECK_INDICES", "1")
    before_q, before_k = q.clone(), k.clone()
    with pytest.raises(IndexError, match=r"positions\[3\] = 100 is out of range"):
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache)
    with pytest.raises(IndexError, match=r"positions\[3\] = 100"):
        jit_kernel.fused_qknorm_rope(
            q, k, torch.ones(d, device="cuda", dtype=dtype), torch.ones(d, device="cuda", dtype=dtype), positions, cache
        )
    assert torch.equal(q, before_q) and torch.equal(k, before_k)  # raised before any launch
    # Without the check: no fault; bad tokens are left as they were, the others rotated.
    monkeypatch.delenv("JIT_KERNEL_CHECK_INDICES")
    good = (positions >= 0) & (positions < 100)
    safe = torch.where(good, positions, torch.zeros_like(positions))
    exp_q = ref_rope(safe, q, d, cache, True)
    jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache)
    torch.cuda.synchronize()
    assert torch.equal(q[~good], before_q[~good]) and torch.equal(k[~good], before_k[~good])
    assert_close(q.view(n, 4, d)[good], exp_q[good], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rope_cuda_graph_replay(is_neox: bool) -> None:
    n, d, dtype = 64, 128, torch.bfloat16
    qkv, q, k, v = fused_qkv(n, 32, 8, d, dtype)
    cache = random_cache(MAX_POS, d, torch.float32)
    positions = rand_positions(n)
    jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache, is_neox)  # resolve outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache, is_neox)
    for _ in range(3):
        fresh = torch.randn_like(qkv, dtype=torch.float32).to(dtype)
        qkv.copy_(fresh)
        positions.copy_(rand_positions(n))
        exp_q = ref_rope(positions, q, d, cache, is_neox)
        exp_k = ref_rope(positions, k, d, cache, is_neox)
        v_before = v.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_close(as_heads(q, d), exp_q, dtype)
        assert_close(as_heads(k, d), exp_k, dtype)
        assert torch.equal(v, v_before)


@pytest.mark.gpu
def test_rope_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    n, d, dtype = 48, 128, torch.bfloat16

    def model(qkv, positions, cache, qw, kw):
        q = qkv[:, : 16 * d]
        k = qkv[:, 16 * d : 20 * d]
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache, True)
        q3 = qkv[:, : 16 * d].view(n, 16, d)
        k3 = qkv[:, 16 * d : 20 * d].view(n, 4, d)
        jit_kernel.fused_qknorm_rope(q3, k3, qw, kw, positions, cache)
        return qkv * 2

    qkv = torch.randn(n, 24 * d, device="cuda", dtype=dtype)
    positions, cache = rand_positions(n), random_cache(MAX_POS, d, torch.float32)
    qw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    kw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    eager_qkv, compiled_qkv = qkv.clone(), qkv.clone()
    expected = model(eager_qkv, positions, cache, qw, kw)
    got = torch.compile(model, fullgraph=True)(compiled_qkv, positions, cache, qw, kw)
    assert_close(got, expected, dtype)
    assert_close(compiled_qkv, eager_qkv, dtype)
    explanation = torch._dynamo.explain(model)(qkv.clone(), positions, cache, qw, kw)
    assert explanation.graph_break_count == 0, explanation.break_reasons


# ---------------------------------------------------------------------------------------------
# GPU: fused_qknorm_rope


def check_qknorm_rope(q, k, qw, kw, positions, cache, d, is_neox, dtype, untouched=()):
    """The fused op against (a) the float64 reference with the intermediate rounded to dtype and
    (b) fused_inplace_qknorm followed by the rope op, on copies: within FUSED_TOL, and equal to (b)
    bit for bit but for at most MAX_DIFFERENT of the elements (one-ulp steps of the intermediate)."""
    exp_q = ref_rope(positions, ref_norm(q, qw, d, dtype), d, cache, is_neox)
    exp_k = ref_rope(positions, ref_norm(k, kw, d, dtype), d, cache, is_neox)
    q2, k2 = as_heads(q.clone(), d), as_heads(k.clone(), d)
    saved = [t.clone() for t in untouched]
    jit_kernel.fused_qknorm_rope(q, k, qw, kw, positions, cache, EPS, is_neox)
    assert_close(as_heads(q, d), exp_q, dtype, FUSED_TOL)
    assert_close(as_heads(k, d), exp_k, dtype, FUSED_TOL)
    jit_kernel.fused_inplace_qknorm(q2, k2, qw, kw, EPS)
    jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, d, cache, is_neox)
    for fused, two in ((as_heads(q, d), q2), (as_heads(k, d), k2)):
        assert_close(fused, two, dtype, FUSED_TOL)
        if dtype != torch.float32:  # fp32 has no coarse rounding to absorb a last-bit change of rrms
            different = int((fused != two).sum())
            allowed = max(4, int(MAX_DIFFERENT * fused.numel()))
            assert different <= allowed, f"{different} of {fused.numel()} elements differ from the two-launch path"
    for before, after in zip(saved, untouched, strict=True):
        assert torch.equal(before, after)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 7, 1000])
@pytest.mark.parametrize(("d", "rot"), [(64, 64), (128, 128), (256, 256), (128, 64), (80, 80), (96, 32), (6, 6)])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qknorm_rope(n: int, d: int, rot: int, is_neox: bool, dtype: torch.dtype) -> None:
    hq, hk = 8, 2
    _, q, k, v = fused_qkv(n, hq, hk, d, dtype)
    q3, k3 = q.view(n, hq, d), k.view(n, hk, d)
    qw = torch.rand(d, device="cuda", dtype=torch.float32).add(0.5).to(dtype)
    kw = torch.rand(d, device="cuda", dtype=torch.float32).add(0.5).to(dtype)
    cache = uniform_cache(MAX_POS, rot, torch.float32)
    check_qknorm_rope(q3, k3, qw, kw, rand_positions(n), cache, d, is_neox, dtype, untouched=(v,))


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "hq", "hk"),
    # The fast kernel loads the weights with the head up to 65536 heads (kEarlyWeightMaxHeads) and
    # after the reduction above: both sides of the boundary, and a prefill-sized launch.
    [(4096, 8, 8), (4097, 8, 8), (2048, 32, 8)],
)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qknorm_rope_many_heads(n: int, hq: int, hk: int, d: int, is_neox: bool, dtype: torch.dtype) -> None:
    _, q, k, v = fused_qkv(n, hq, hk, d, dtype)
    qw = torch.rand(d, device="cuda", dtype=torch.float32).add(0.5).to(dtype)
    kw = torch.rand(d, device="cuda", dtype=torch.float32).add(0.5).to(dtype)
    cache = uniform_cache(MAX_POS, d, torch.float32)
    check_qknorm_rope(q.view(n, hq, d), k.view(n, hk, d), qw, kw, rand_positions(n), cache, d, is_neox, dtype, (v,))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_qknorm_rope_2d_misaligned_and_bf16_cache(is_neox: bool, dtype: torch.dtype) -> None:
    n, d = 45, 128
    base = torch.randn(n * (6 * d + 3) + 1, device="cuda", dtype=dtype)
    rows = base[1:].view(n, 6 * d + 3)  # misaligned: the generic kernel
    q, k, tail = rows[:, : 4 * d], rows[:, 4 * d : 6 * d], rows[:, 6 * d :]
    qw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    kw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    cache = uniform_cache(MAX_POS, d, dtype)
    check_qknorm_rope(q, k, qw, kw, rand_positions(n, torch.int32), cache, d, is_neox, dtype, untouched=(tail,))
    _, q, k, v = fused_qkv(n, 4, 2, d, dtype)  # aligned 2-D views: the fast kernel
    check_qknorm_rope(q, k, qw, kw, rand_positions(n, torch.int32), cache, d, is_neox, dtype, untouched=(v,))


@pytest.mark.gpu
def test_qknorm_rope_cuda_graph_replay() -> None:
    n, d, dtype = 16, 128, torch.bfloat16
    qkv, q, k, v = fused_qkv(n, 32, 8, d, dtype)
    q3, k3 = q.view(n, 32, d), k.view(n, 8, d)
    qw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    kw = torch.rand(d, device="cuda", dtype=dtype) + 0.5
    cache, positions = uniform_cache(MAX_POS, d, torch.float32), rand_positions(n)
    jit_kernel.fused_qknorm_rope(q3, k3, qw, kw, positions, cache)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        jit_kernel.fused_qknorm_rope(q3, k3, qw, kw, positions, cache)
    for _ in range(3):
        qkv.copy_(torch.randn_like(qkv, dtype=torch.float32).to(dtype))
        positions.copy_(rand_positions(n))
        exp_q = ref_rope(positions, ref_norm(q3, qw, d, dtype), d, cache, True)
        exp_k = ref_rope(positions, ref_norm(k3, kw, d, dtype), d, cache, True)
        v_before = v.clone()
        graph.replay()
        torch.cuda.synchronize()
        assert_close(q3, exp_q, dtype, FUSED_TOL)
        assert_close(k3, exp_k, dtype, FUSED_TOL)
        assert torch.equal(v, v_before)


# ---------------------------------------------------------------------------------------------
# CPU: bad inputs (the C++ launchers' checks run on fake CUDA tensors, before any launch)


def _t(*shape, dtype=torch.bfloat16, device="cuda"):
    return torch.empty(shape, dtype=dtype, device=device)


def _pos(n=4, dtype=torch.int64, device="cuda"):
    return torch.empty(n, dtype=dtype, device=device)


def _rope(positions=None, query=None, key=None, head_size=128, cache=None, **kw):
    positions = _pos() if positions is None else positions
    query = _t(4, 256) if query is None else query
    key = _t(4, 128) if key is None else key
    cache = _t(64, 128, dtype=torch.float32) if cache is None else cache
    return lambda: jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache, **kw)


def _qkr(query=None, key=None, qw=None, kw=None, positions=None, cache=None, **kwargs):
    query = _t(4, 2, 128) if query is None else query
    key = _t(4, 1, 128) if key is None else key
    qw = _t(128) if qw is None else qw
    kw = _t(128) if kw is None else kw
    positions = _pos() if positions is None else positions
    cache = _t(64, 128, dtype=torch.float32) if cache is None else cache
    return lambda: jit_kernel.fused_qknorm_rope(query, key, qw, kw, positions, cache, **kwargs)


ROPE_BAD = [
    (
        "odd-head-size",
        lambda: _rope(query=_t(4, 14), key=_t(4, 7), head_size=7, cache=_t(64, 6))(),
        ValueError,
        "head_size must be even",
    ),
    ("head-size-zero", lambda: _rope(head_size=0)(), ValueError, "head_size must be even and in"),
    (
        "head-size-too-big",
        lambda: _rope(query=_t(4, 2048), key=_t(4, 2048), head_size=2048)(),
        ValueError,
        r"head_size must be even and in \[2, 1024\], got 2048",
    ),
    (
        "rotary-gt-head",
        lambda: _rope(cache=_t(64, 256, dtype=torch.float32))(),
        ValueError,
        r"rotary_dim even and in \[2, head_size=128\], got rotary_dim=256",
    ),
    ("odd-rotary", lambda: _rope(cache=_t(64, 63, dtype=torch.float32))(), ValueError, "got rotary_dim=63"),
    (
        "tokens-key",
        lambda: _rope(key=_t(5, 128))(),
        ValueError,
        r"(?s)'key'.*Size mismatch for shape#0\('num_tokens'\)",
    ),
    (
        "tokens-positions",
        lambda: _rope(positions=_pos(5))(),
        ValueError,
        r"(?s)'positions'.*Size mismatch for shape#0\('num_tokens'\)",
    ),
    (
        "positions-dtype",
        lambda: _rope(positions=_pos(dtype=torch.float32))(),
        TypeError,
        r"(?s)'positions'.*Dtype mismatch",
    ),
    ("positions-2d", lambda: _rope(positions=_pos(8).view(4, 2))(), ValueError, r"(?s)'positions'.*Rank mismatch"),
    (
        "cache-dtype",
        lambda: _rope(cache=_t(64, 128, dtype=torch.float16))(),
        TypeError,
        r"(?s)'cos_sin_cache'.*Dtype mismatch",
    ),
    (
        "cache-1d",
        lambda: _rope(cache=_t(128, dtype=torch.float32))(),
        ValueError,
        r"(?s)'cos_sin_cache'.*Rank mismatch",
    ),
    (
        "cache-col-stride",
        lambda: _rope(cache=_t(128, 64, dtype=torch.float32).t())(),
        ValueError,
        r"(?s)'cos_sin_cache'.*Stride mismatch",
    ),
    ("key-dtype", lambda: _rope(key=_t(4, 128, dtype=torch.float16))(), TypeError, r"(?s)'key'.*Dtype mismatch"),
    (
        "query-dtype",
        lambda: _rope(query=_t(4, 256, dtype=torch.int8))(),
        TypeError,
        r"query must be one of \(float16, bfloat16, float32\), got int8",
    ),
    (
        "query-width",
        lambda: _rope(query=_t(4, 200))(),
        ValueError,
        "last dimension 200 is not a multiple of head_size=128",
    ),
    (
        "query-rank",
        lambda: _rope(query=_t(4, 2, 2, 128))(),
        ValueError,
        r"query must be \[num_tokens, num_heads \* head_size\] or",
    ),
    ("query-head-size-3d", lambda: _rope(query=_t(4, 2, 64))(), ValueError, r"(?s)'query'.*Size mismatch for shape#2"),
    ("query-last-stride", lambda: _rope(query=_t(256, 4).t())(), ValueError, r"(?s)'query'.*Stride mismatch"),
    ("query-not-tensor", lambda: _rope(query=[[1.0]])(), TypeError, "query must be a torch.Tensor, got list"),
    ("key-not-tensor", lambda: _rope(key=3)(), TypeError, "key must be a torch.Tensor, got int"),
    (
        "positions-not-tensor",
        lambda: _rope(positions=[1, 2, 3, 4])(),
        TypeError,
        "positions must be a torch.Tensor, got list",
    ),
    ("cache-not-tensor", lambda: _rope(cache="cache")(), TypeError, "cos_sin_cache must be a torch.Tensor, got str"),
    ("positions-cpu", lambda: _rope(positions=_pos(device="cpu"))(), ValueError, r"(?s)'positions'.*Device mismatch"),
    (
        "cache-cpu",
        lambda: _rope(cache=_t(64, 128, dtype=torch.float32, device="cpu"))(),
        ValueError,
        r"(?s)'cos_sin_cache'.*Device mismatch",
    ),
    ("query-cpu", lambda: _rope(query=_t(4, 256, device="cpu"))(), ValueError, r"(?s)'query'.*Device mismatch"),
    ("is-neox-int", lambda: _rope(is_neox=1)(), TypeError, "is_neox must be a bool, got int"),
    ("head-size-float", lambda: _rope(head_size=128.0)(), TypeError, "head_size must be an int, got float"),
    ("enable-pdl-str", lambda: _rope(enable_pdl="yes")(), TypeError, "enable_pdl must be a bool or None, got str"),
]

QKR_BAD = [
    ("q-weight-size", lambda: _qkr(qw=_t(64))(), ValueError, r"(?s)'k_weight'.*Size mismatch"),
    ("k-weight-size", lambda: _qkr(kw=_t(64))(), ValueError, r"(?s)'k_weight'.*Size mismatch"),
    ("weight-dtype", lambda: _qkr(kw=_t(128, dtype=torch.float32))(), TypeError, r"(?s)'k_weight'.*Dtype mismatch"),
    ("weight-not-tensor", lambda: _qkr(qw=1.0)(), TypeError, "q_weight must be a torch.Tensor, got float"),
    ("weight-0d", lambda: _qkr(qw=_t())(), ValueError, r"(?s)'q_weight'.*Rank mismatch"),
    ("eps-negative", lambda: _qkr(eps=-1.0)(), ValueError, "eps must be >= 0"),
    ("tokens", lambda: _qkr(key=_t(3, 1, 128))(), ValueError, r"(?s)'key'.*num_tokens"),
    ("head-size", lambda: _qkr(query=_t(4, 2, 64))(), ValueError, r"(?s)'query'.*Size mismatch for shape#2"),
    ("rotary-gt-head", lambda: _qkr(cache=_t(64, 256, dtype=torch.float32))(), ValueError, "got rotary_dim=256"),
    (
        "positions-dtype",
        lambda: _qkr(positions=_pos(dtype=torch.int16))(),
        TypeError,
        r"(?s)'positions'.*Dtype mismatch",
    ),
    (
        "cache-dtype",
        lambda: _qkr(cache=_t(64, 128, dtype=torch.float64))(),
        TypeError,
        r"(?s)'cos_sin_cache'.*Dtype mismatch",
    ),
    (
        "odd-head-size",
        lambda: _qkr(query=_t(4, 2, 7), key=_t(4, 1, 7), qw=_t(7), kw=_t(7), cache=_t(64, 6, dtype=torch.float32))(),
        ValueError,
        "head_size must be even",
    ),
    ("query-not-tensor", lambda: _qkr(query=[1])(), TypeError, "query must be a torch.Tensor, got list"),
    ("is-neox-none", lambda: _qkr(is_neox=None)(), TypeError, "is_neox must be a bool, got NoneType"),
    ("positions-cpu", lambda: _qkr(positions=_pos(device="cpu"))(), ValueError, r"(?s)'positions'.*Device mismatch"),
    ("eps-str", lambda: _qkr(eps="x")(), TypeError, "eps must be a float, got str"),
]


@pytest.mark.parametrize(("call", "error", "match"), [pytest.param(c, e, m, id=i) for i, c, e, m in ROPE_BAD + QKR_BAD])
def test_bad_inputs(call, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call()


def test_registered_ops_and_fakes() -> None:
    for name in ("apply_rope_with_cos_sin_cache_inplace", "fused_qknorm_rope"):
        schema = getattr(torch.ops.jit_kernel, name).default._schema
        mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutated == {"query", "key"}, schema
    # The fake implementations (torch.compile's tracing) pick the config and launch nothing. Separate
    # tensors: slicing a fake CUDA tensor needs a CUDA build of torch.
    with fake_cuda():
        cache = _t(64, 128, dtype=torch.float32)
        torch.ops.jit_kernel.apply_rope_with_cos_sin_cache_inplace(
            _pos(), _t(4, 512), _t(4, 128), 128, cache, True, None
        )
        torch.ops.jit_kernel.fused_qknorm_rope(
            _t(4, 4, 128), _t(4, 1, 128), _t(128), _t(128), _pos(), cache, 1e-6, False, None
        )


def test_check_indices_names_the_first_bad_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """JIT_KERNEL_CHECK_INDICES=1: after the launcher's checks (run on tensors without data) and
    before the launch, the op reads the positions and names the first bad one. The launcher's
    checks, which need CUDA tensors, are passed over here so that host tensors show the bounds
    check on any machine."""
    from jit_kernel.ops import _common

    monkeypatch.setattr(_common, "checks_only", lambda kernel: lambda *args: None)
    monkeypatch.setenv("JIT_KERNEL_CHECK_INDICES", "1")
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    positions = torch.tensor([0, 5, 64, -1])
    q, k = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(4, 128, dtype=torch.bfloat16)
    cache = torch.zeros(64, 128)
    match = r"positions\[2\] = 64 is out of range for cos_sin_cache with 64 rows"
    with pytest.raises(IndexError, match="apply_rope_with_cos_sin_cache_inplace: " + match):
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(positions, q, k, 128, cache)
    w = torch.ones(128, dtype=torch.bfloat16)
    with pytest.raises(IndexError, match="fused_qknorm_rope: " + match):
        jit_kernel.fused_qknorm_rope(q.view(4, 2, 128), k.view(4, 1, 128), w, w, positions, cache)
    with pytest.raises(IndexError, match=r"positions\[0\] = -3"):
        jit_kernel.apply_rope_with_cos_sin_cache_inplace(torch.tensor([-3, 0, 0, 0]), q, k, 128, cache)
