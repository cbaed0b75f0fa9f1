"""store_kv_cache and set_mla_kv_buffer: against a torch reference on poisoned caches (whole buffers
compared, so a row outside ``loc`` that changes fails), fp8 within one fp8 ulp, strided and
misaligned inputs, caches as views of bigger buffers, int32/int64 and strided indices, edge token
counts, out-of-range and duplicate slots, CUDA graphs, torch.compile; on the CPU, every bad input
with its exact error (the C++ launcher's checks run on fake CUDA tensors)."""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
CHECK = "JIT_KERNEL_CHECK_INDICES"

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _quant(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    if cache_dtype == FP8:
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return x.to(cache_dtype)


def _put(cache: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> None:
    """``cache[rows] = values``; fp8 through uint8 views (as SGLang does: index_put need not support
    float8 in every torch version)."""
    if cache.dtype == FP8:
        cache.view(torch.uint8)[rows] = values.view(torch.uint8)
    else:
        cache[rows] = values


def _poison(buf: torch.Tensor) -> torch.Tensor:
    buf.view(torch.uint8).fill_(0xFF)  # NaN in bf16, fp16, fp32 and float8_e4m3fn
    return buf


def _fp8_ulp(x: torch.Tensor) -> torch.Tensor:
    a = x.abs().clamp_min(2.0**-6)  # subnormals: 2^-9 apart
    return torch.exp2(torch.floor(torch.log2(a)) - 3)


def assert_buffers(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-exact for plain caches; fp8: within one fp8 ulp, NaN (the poison) exactly where expected."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if got.dtype != FP8:
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), _first_diff(got, expected)
        return
    g, r = got.float(), expected.float()
    ok = (g.isnan() & r.isnan()) | ((g - r).abs() <= _fp8_ulp(r))
    assert bool(ok.all()), f"{int((~ok).sum())} fp8 elements differ, first at {tuple((~ok).nonzero()[0].tolist())}"


def _first_diff(got: torch.Tensor, expected: torch.Tensor) -> str:
    diff = got.view(torch.uint8) != expected.view(torch.uint8)
    if not bool(diff.any()):
        return ""
    return f"{int(diff.sum())} bytes differ, first at byte index {tuple(diff.nonzero()[0].tolist())}"


def _loc(slots: torch.Tensor, dtype: torch.dtype, strided: bool) -> torch.Tensor:
    slots = slots.to(dtype)
    if strided:  # every other element of a bigger tensor
        return torch.stack([slots, torch.full_like(slots, -7)], dim=1)[:, 0]
    return slots


def _cache(layout: str, slots: int, heads: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the whole poisoned buffer, the cache view [slots, heads, head_dim] into it)."""
    if layout == "plain":
        buf = _poison(torch.empty(slots, heads, head_dim, device="cuda", dtype=dtype))
        return buf, buf
    if layout == "layer_view":  # layer 1 of [3, slots, heads, head_dim]
        buf = _poison(torch.empty(3, slots, heads, head_dim, device="cuda", dtype=dtype))
        return buf, buf[1]
    if layout == "padded":  # rows padded by 32 elements: the slot stride is not heads * head_dim
        buf = _poison(torch.empty(slots, heads * head_dim + 32, device="cuda", dtype=dtype))
        return buf, buf[:, : heads * head_dim].view(slots, heads, head_dim)
    raise ValueError(layout)


def _fused_kv(tokens: int, heads: int, head_dim: int, dtype: torch.dtype, offset: int = 0):
    """k and v as views of one fused qkv tensor [tokens, (4 + 2) * heads * head_dim + offset]."""
    q = 4 * heads * head_dim + offset
    width = q + 2 * heads * head_dim
    qkv = torch.randn(tokens, width, device="cuda", dtype=torch.float32).mul_(3).to(dtype)
    k = qkv[:, q : q + heads * head_dim].view(tokens, heads, head_dim)
    v = qkv[:, q + heads * head_dim :].view(tokens, heads, head_dim)
    return k, v


def _ref_store(buf: torch.Tensor, cache_of, x: torch.Tensor, loc: torch.Tensor, scale: float) -> torch.Tensor:
    """A copy of ``buf`` with the rows of ``x`` stored (valid slots only, in token order)."""
    ref = buf.clone()
    cache = cache_of(ref)
    slots = cache.shape[0]
    valid = (loc >= 0) & (loc < slots)
    rows = loc[valid].long()
    _put(cache, rows, _quant(x[valid], cache.dtype, scale).reshape(rows.numel(), *cache.shape[1:]))
    return ref


def _view_fn(layout: str, heads: int, head_dim: int):
    if layout == "plain":
        return lambda b: b
    if layout == "layer_view":
        return lambda b: b[1]
    return lambda b: b[:, : heads * head_dim].view(b.shape[0], heads, head_dim)


# ---------------------------------------------------------------------------------------------
# GPU: store_kv_cache
# ---------------------------------------------------------------------------------------------

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [0, 1, 7, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("layout", ["plain", "layer_view", "padded"])
def test_store_matches_reference(tokens: int, dtype: torch.dtype, fp8: bool, layout: str) -> None:
    torch.manual_seed(tokens)
    heads, head_dim = 8, 128
    slots = 2 * tokens + 5
    cache_dtype = FP8 if fp8 else dtype
    k, v = _fused_kv(tokens, heads, head_dim, dtype)
    kbuf, kc = _cache(layout, slots, heads, head_dim, cache_dtype)
    vbuf, vc = _cache(layout, slots, heads, head_dim, cache_dtype)
    loc = torch.randperm(slots, device="cuda")[:tokens]
    ks, vs = (torch.tensor([0.05], device="cuda"), torch.tensor([0.02], device="cuda")) if fp8 else (None, None)
    view = _view_fn(layout, heads, head_dim)
    ref_k = _ref_store(kbuf, view, k, loc, 0.05)
    ref_v = _ref_store(vbuf, view, v, loc, 0.02)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, ks, vs)
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("rank2", [False, True])
def test_store_index_dtypes_and_layouts(index_dtype: torch.dtype, strided: bool, rank2: bool) -> None:
    tokens, heads, head_dim, slots = 33, 4, 64, 100
    k, v = _fused_kv(tokens, heads, head_dim, torch.bfloat16)
    kbuf, kc = _cache("plain", slots, heads, head_dim, torch.bfloat16)
    vbuf, vc = _cache("plain", slots, heads, head_dim, torch.bfloat16)
    loc = _loc(torch.randperm(slots, device="cuda")[:tokens], index_dtype, strided)
    assert loc.is_contiguous() is not strided
    ref_k = _ref_store(kbuf, lambda b: b, k, loc, 1.0)
    ref_v = _ref_store(vbuf, lambda b: b, v, loc, 1.0)
    if rank2:  # [tokens, heads * head_dim] activations and [slots, heads * head_dim] caches
        k, v = k.flatten(1), v.flatten(1)
        kc, vc = kc.flatten(1), vc.flatten(1)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc)
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize(
    ("heads", "head_dim", "offset"),
    [(5, 3, 0), (1, 7, 0), (8, 128, 1), (2, 96, 0), (3, 40, 2)],
    ids=["odd_head_dim", "tiny_row", "misaligned_view", "head_dim_96", "offset_4_bytes"],
)
def test_store_scalar_and_odd_rows(heads: int, head_dim: int, offset: int, fp8: bool) -> None:
    """Rows that are not whole 16-byte vectors (or start off a 16-byte boundary) take the scalar path."""
    tokens, slots = 19, 40
    cache_dtype = FP8 if fp8 else torch.float16
    k, v = _fused_kv(tokens, heads, head_dim, torch.float16, offset=offset)
    kbuf, kc = _cache("plain", slots, heads, head_dim, cache_dtype)
    vbuf, vc = _cache("plain", slots, heads, head_dim, cache_dtype)
    loc = torch.randperm(slots, device="cuda")[:tokens]
    ref_k = _ref_store(kbuf, lambda b: b, k, loc, 0.5)
    ref_v = _ref_store(vbuf, lambda b: b, v, loc, 2.0)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, 0.5, 2.0)  # Python-float scales
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
def test_store_fp8_scale_forms_and_saturation() -> None:
    """0-d and [1] scale tensors and floats give the same bytes; values beyond 448 * scale saturate."""
    tokens, heads, head_dim, slots = 16, 2, 128, 32
    k, v = _fused_kv(tokens, heads, head_dim, torch.bfloat16)
    special = [1e4, -1e4, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3e38]
    k[0, 0, :8] = torch.tensor(special, dtype=torch.bfloat16)
    loc = torch.arange(tokens, device="cuda") * 2
    results = []
    for scale in (torch.tensor(0.01, device="cuda"), torch.tensor([0.01], device="cuda"), 0.01):
        kc = _poison(torch.empty(slots, heads, head_dim, device="cuda", dtype=FP8))
        vc = _poison(torch.empty(slots, heads, head_dim, device="cuda", dtype=FP8))
        jit_kernel.store_kv_cache(k, v, kc, vc, loc, scale, scale)
        results.append((kc, vc))
    torch.cuda.synchronize()
    for kc, vc in results[1:]:
        assert torch.equal(kc.view(torch.uint8), results[0][0].view(torch.uint8))
        assert torch.equal(vc.view(torch.uint8), results[0][1].view(torch.uint8))
    kc = results[0][0]
    got = kc[0, 0, :8].float()
    assert got[:6].tolist() == [448.0, -448.0, 0.0, 0.0, 448.0, -448.0] and bool(got[6].isnan()) and got[7] == 448
    ref = _poison(torch.empty(slots, heads, head_dim, device="cuda", dtype=FP8))
    _put(ref, loc, _quant(k, FP8, 0.01))
    assert_buffers(kc, ref)


@pytest.mark.gpu
def test_store_plain_cache_ignores_scales() -> None:
    tokens, slots = 4, 8
    k, v = _fused_kv(tokens, 2, 64, torch.bfloat16)
    kc = _poison(torch.empty(slots, 2, 64, device="cuda", dtype=torch.bfloat16))
    vc = _poison(torch.empty(slots, 2, 64, device="cuda", dtype=torch.bfloat16))
    loc = torch.arange(tokens, device="cuda")
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, torch.tensor([2.0], device="cuda"), 3.0)
    torch.cuda.synchronize()
    assert torch.equal(kc[:tokens], k) and torch.equal(vc[:tokens], v)


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", [False, True])
def test_store_pdl_flag(enable_pdl: bool) -> None:
    k, v = _fused_kv(8, 8, 128, torch.bfloat16)
    kbuf, kc = _cache("plain", 16, 8, 128, torch.bfloat16)
    vbuf, vc = _cache("plain", 16, 8, 128, torch.bfloat16)
    loc = torch.arange(8, device="cuda", dtype=torch.int32) * 2
    ref_k, ref_v = _ref_store(kbuf, lambda b: b, k, loc, 1.0), _ref_store(vbuf, lambda b: b, v, loc, 1.0)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, enable_pdl=enable_pdl)
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


# ---------------------------------------------------------------------------------------------
# GPU: out-of-range and duplicate slots
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("fp8", [False, True])
def test_store_out_of_range_is_skipped(monkeypatch: pytest.MonkeyPatch, index_dtype: torch.dtype, fp8: bool) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    slots, heads, head_dim = 20, 4, 128
    cache_dtype = FP8 if fp8 else torch.bfloat16
    k, v = _fused_kv(6, heads, head_dim, torch.bfloat16)
    kbuf, kc = _cache("layer_view", slots, heads, head_dim, cache_dtype)
    vbuf, vc = _cache("layer_view", slots, heads, head_dim, cache_dtype)
    big = 2**31 - 1 if index_dtype == torch.int32 else 2**40
    loc = torch.tensor([3, -1, slots, 7, big, -(2**20)], device="cuda", dtype=index_dtype)
    view = _view_fn("layer_view", heads, head_dim)
    ref_k, ref_v = _ref_store(kbuf, view, k, loc, 0.1), _ref_store(vbuf, view, v, loc, 0.1)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, 0.1, 0.1)
    torch.cuda.synchronize()  # no fault
    assert_buffers(kbuf, ref_k)  # slots 3 and 7 written, nothing else (not layers 0 and 2 either)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["store", "mla"])
def test_fp8_inversion_orders_store_the_same_bytes(op: str) -> None:
    """fp8 caches of joint launches (MLA) invert the scale before the row loads below 2048 tokens and
    after them from 2048 on (csrc/kv_store.cuh, kInvertAfterLoadsTokens); split launches (the store)
    always after. 2100 tokens, once in one call and once in chunks of 700 (MLA: before): the same
    bytes, the reference within one fp8 ulp, out-of-range slots (every 7th: -1, past the end)
    skipped either way."""
    torch.manual_seed(5)
    tokens, slots, chunk = 2100, 4400, 700
    loc = torch.randperm(slots, device="cuda")[:tokens]
    loc[::7], loc[3::7] = -1, slots + 5
    scale = torch.tensor([0.07], device="cuda")
    if op == "store":
        k, v = _fused_kv(tokens, 8, 128, torch.bfloat16)
        caches = [_cache("layer_view", slots, 8, 128, FP8) for _ in range(4)]  # (k, v) in one call, then chunked
        view = _view_fn("layer_view", 8, 128)
        ref = [_ref_store(caches[0][0], view, x, loc, 0.07) for x in (k, v)]
        jit_kernel.store_kv_cache(k, v, caches[0][1], caches[1][1], loc, scale, scale)
        for i in range(0, tokens, chunk):
            part = slice(i, i + chunk)
            jit_kernel.store_kv_cache(k[part], v[part], caches[2][1], caches[3][1], loc[part], scale, scale)
        pairs = [(caches[0][0], caches[2][0], ref[0]), (caches[1][0], caches[3][0], ref[1])]
    else:
        nope, rope = _mla_inputs(tokens, torch.bfloat16, True)
        bufs = [_poison(torch.empty(slots, 1, 576, device="cuda", dtype=FP8)) for _ in range(2)]
        ref_buf = bufs[0].clone()
        valid = (loc >= 0) & (loc < slots)
        row = torch.cat([nope.reshape(tokens, 512), rope.reshape(tokens, 64)], dim=1)
        _put(ref_buf[:, 0], loc[valid], _quant(row[valid], FP8, 0.07))
        jit_kernel.set_mla_kv_buffer(bufs[0], loc, nope, rope, scale=scale)
        for i in range(0, tokens, chunk):
            part = slice(i, i + chunk)
            jit_kernel.set_mla_kv_buffer(bufs[1], loc[part], nope[part], rope[part], scale=scale)
        pairs = [(bufs[0], bufs[1], ref_buf)]
    torch.cuda.synchronize()
    for after, before, expected in pairs:
        assert torch.equal(after.view(torch.uint8), before.view(torch.uint8)), _first_diff(after, before)
        assert_buffers(after, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("op", "dtype", "cache_dtype", "tokens"),
    [
        ("mla", torch.bfloat16, FP8, 4099),
        ("mla", torch.float16, torch.float16, 16389),
        ("store", torch.float32, FP8, 4099),
        ("store", torch.float16, FP8, 4099),
        ("store", torch.float32, torch.float32, 16389),
    ],
)
def test_flat_kernel(
    monkeypatch: pytest.MonkeyPatch, index_dtype: torch.dtype, op: str, dtype: torch.dtype, cache_dtype, tokens: int
) -> None:
    """Joint launches (a token's two rows fit one warp round: MLA 512 + 64, k and v of 1 x 64) take the
    flat kernel from 4096 tokens (fp8 caches) or 16384 (csrc/kv_store.cuh, kFlatMinTokens): token
    counts that leave a part-filled last block, strided int32 / int64 slots, some out of range of every
    cache (-1, past the end) and some of the store's k cache only (it has half the slots of its v cache)."""
    monkeypatch.delenv(CHECK, raising=False)
    torch.manual_seed(tokens)
    slots = tokens + 50
    loc = torch.randperm(2 * slots, device="cuda")[:tokens]
    # Slots in [slots, 2 * slots): in range of the store's v cache only; -1 and 2 * slots + 3: of none.
    loc[::7], loc[3::7] = -1, 2 * slots + 3
    loc = _loc(loc, index_dtype, strided=True)
    scale = 0.05 if cache_dtype == FP8 else 1.0
    kwargs = {"scale": torch.tensor([scale], device="cuda")} if cache_dtype == FP8 else {}
    if op == "mla":
        nope, rope = _mla_inputs(tokens, dtype, True)
        buf = _poison(torch.empty(slots, 1, 576, device="cuda", dtype=cache_dtype))
        row = torch.cat([nope.reshape(tokens, 512), rope.reshape(tokens, 64)], dim=1).view(tokens, 1, 576)
        ref = _ref_store(buf, lambda b: b, row, loc, scale)
        jit_kernel.set_mla_kv_buffer(buf, loc, nope, rope, **kwargs)
        pairs = [(buf, ref)]
    else:
        k, v = _fused_kv(tokens, 1, 64, dtype)
        kbuf, kc = _cache("layer_view", slots, 1, 64, cache_dtype)
        vbuf, vc = _cache("plain", 2 * slots, 1, 64, cache_dtype)
        ref_k = _ref_store(kbuf, _view_fn("layer_view", 1, 64), k, loc, scale)
        ref_v = _ref_store(vbuf, lambda b: b, v, loc, scale)
        jit_kernel.store_kv_cache(k, v, kc, vc, loc, kwargs.get("scale"), kwargs.get("scale"))
        pairs = [(kbuf, ref_k), (vbuf, ref_v)]
    torch.cuda.synchronize()
    for got, expected in pairs:
        assert_buffers(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "head_dim"), [(1, 64), (8, 128)], ids=["one_warp_per_token", "warp_per_row"])
def test_store_caches_of_different_sizes(monkeypatch: pytest.MonkeyPatch, heads: int, head_dim: int) -> None:
    """k_cache with 10 slots, v_cache with 20: slot 15 is written in v_cache only (short rows take the
    one-warp-per-token path, long rows a warp per row: both must skip per cache)."""
    monkeypatch.delenv(CHECK, raising=False)
    k, v = _fused_kv(4, heads, head_dim, torch.bfloat16)
    kbuf, kc = _cache("plain", 10, heads, head_dim, torch.bfloat16)
    vbuf, vc = _cache("plain", 20, heads, head_dim, torch.bfloat16)
    loc = torch.tensor([15, 2, 19, 9], device="cuda", dtype=torch.int32)
    ref_k, ref_v = _ref_store(kbuf, lambda b: b, k, loc, 1.0), _ref_store(vbuf, lambda b: b, v, loc, 1.0)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc)
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [3, 3000])  # chunked rows (decode sizes) and whole-row warps
@pytest.mark.parametrize(("k_dim", "v_dim"), [(192, 128), (128, 192)])
@pytest.mark.parametrize("fp8", [False, True])
def test_store_k_and_v_of_different_widths(tokens: int, k_dim: int, v_dim: int, fp8: bool) -> None:
    """k and v rows of different head dims (a 192-wide k with a 128-wide v, as DeepSeek's MHA
    prefill): every vector of the wider row is written, whichever of the two it is."""
    heads, slots = 4, 2 * tokens + 3
    k = torch.randn(tokens, heads, k_dim, device="cuda").mul_(3).to(torch.bfloat16)
    v = torch.randn(tokens, heads, v_dim, device="cuda").mul_(3).to(torch.bfloat16)
    cache_dtype = FP8 if fp8 else torch.bfloat16
    kbuf, kc = _cache("plain", slots, heads, k_dim, cache_dtype)
    vbuf, vc = _cache("plain", slots, heads, v_dim, cache_dtype)
    loc = torch.randperm(slots, device="cuda")[:tokens]
    k_scale, v_scale = (0.05, 0.02) if fp8 else (1.0, 1.0)
    ref_k = _ref_store(kbuf, lambda b: b, k, loc, k_scale)
    ref_v = _ref_store(vbuf, lambda b: b, v, loc, v_scale)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc, k_scale, v_scale)
    torch.cuda.synchronize()
    assert_buffers(kbuf, ref_k)
    assert_buffers(vbuf, ref_v)


@pytest.mark.gpu
def test_store_out_of_range_with_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK, "1")
    k, v = _fused_kv(4, 2, 64, torch.bfloat16)
    kc = _poison(torch.empty(10, 2, 64, device="cuda", dtype=torch.bfloat16))
    vc = _poison(torch.empty(12, 2, 64, device="cuda", dtype=torch.bfloat16))
    before_k, before_v = kc.clone(), vc.clone()
    for loc, match in [
        ([0, 1, -1, 3], r"store_kv_cache: out_cache_loc\[2\] = -1 is out of range: it must be in \[0, 10\)"),
        ([0, 11, 10, 3], r"store_kv_cache: out_cache_loc\[1\] = 11 is out of range: it must be in \[0, 10\)"),
    ]:
        with pytest.raises(IndexError, match=match):
            jit_kernel.store_kv_cache(k, v, kc, vc, torch.tensor(loc, device="cuda"))
    # 10 is a slot of v_cache (12) but not of k_cache (10): still an error, naming k_cache
    with pytest.raises(IndexError, match=r"out_cache_loc\[3\] = 10 .*k_cache has 10 slots"):
        jit_kernel.store_kv_cache(k, v, kc, vc, torch.tensor([0, 1, 2, 10], device="cuda", dtype=torch.int32))
    torch.cuda.synchronize()
    assert_buffers(kc, before_k)
    assert_buffers(vc, before_v)
    jit_kernel.store_kv_cache(k, v, kc, vc, torch.tensor([0, 1, 2, 9], device="cuda"))  # in range: fine
    torch.cuda.synchronize()
    assert torch.equal(kc[9], k[3])


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [True, False])
def test_store_duplicate_slots(aligned: bool) -> None:
    """Which writer wins is undefined, but each 16-byte vector of the row (each element on the scalar
    path) comes whole from one writer; other rows are untouched."""
    tokens, slots = 256, 8
    heads, head_dim = (8, 128) if aligned else (7, 127)  # 889 elements: the scalar path
    k, v = _fused_kv(tokens, heads, head_dim, torch.bfloat16)
    kbuf, kc = _cache("plain", slots, heads, head_dim, torch.bfloat16)
    _, vc = _cache("plain", slots, heads, head_dim, torch.bfloat16)
    before = kbuf.clone()
    loc = torch.full((tokens,), 5, device="cuda", dtype=torch.int64)
    jit_kernel.store_kv_cache(k, v, kc, vc, loc)
    torch.cuda.synchronize()
    piece = 8 if aligned else 1
    for cache, src in ((kc, k), (vc, v)):
        got = cache[5].reshape(-1, piece).view(torch.int16)
        cand = src.reshape(tokens, -1, piece).view(torch.int16)
        assert bool((cand == got[None]).all(-1).any(0).all())
    keep = [i for i in range(slots) if i != 5]
    assert torch.equal(kbuf[keep].view(torch.uint8), before[keep].view(torch.uint8))


# ---------------------------------------------------------------------------------------------
# GPU: set_mla_kv_buffer
# ---------------------------------------------------------------------------------------------


def _mla_inputs(tokens: int, dtype: torch.dtype, rank3: bool, pad: int = 32):
    """cache_k_nope and cache_k_rope as strided views of one [tokens, 1, 576 + pad] tensor."""
    src = torch.randn(tokens, 1, 576 + pad, device="cuda", dtype=torch.float32).mul_(2).to(dtype)
    nope, rope = src[..., :512], src[..., 512:576]
    if not rank3:
        nope, rope = nope[:, 0], rope[:, 0]
    return nope, rope


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [0, 1, 7, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("rank3", [True, False])
def test_mla_matches_reference(tokens: int, dtype: torch.dtype, fp8: bool, rank3: bool) -> None:
    torch.manual_seed(tokens + 1)
    slots = 2 * tokens + 3
    cache_dtype = FP8 if fp8 else dtype
    nope, rope = _mla_inputs(tokens, dtype, rank3)
    buf = _poison(torch.empty(2, slots, 1, 576, device="cuda", dtype=cache_dtype))  # layer 1 of 2
    kv_buffer = buf[1] if rank3 else buf[1, :, 0]
    loc = torch.randperm(slots, device="cuda")[:tokens].to(torch.int32)
    scale = 0.03 if fp8 else 1.0
    ref = buf.clone()
    row = torch.cat([nope.reshape(tokens, 512), rope.reshape(tokens, 64)], dim=1)
    _put(ref[1, :, 0], loc.long(), _quant(row, cache_dtype, scale))
    kwargs = {"scale": torch.tensor([scale], device="cuda")} if fp8 else {}
    jit_kernel.set_mla_kv_buffer(kv_buffer, loc, nope, rope, **kwargs)
    torch.cuda.synchronize()
    assert_buffers(buf, ref)


@pytest.mark.gpu
def test_mla_fp8_default_scale_and_out_of_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    tokens, slots = 5, 9
    nope, rope = _mla_inputs(tokens, torch.bfloat16, True)
    buf = _poison(torch.empty(slots, 1, 576, device="cuda", dtype=FP8))
    loc = torch.tensor([0, 9, 4, -3, 8], device="cuda")
    ref = buf.clone()
    row = torch.cat([nope, rope], dim=-1)
    _put(ref, torch.tensor([0, 4, 8], device="cuda"), _quant(row[[0, 2, 4]], FP8, 1.0))
    jit_kernel.set_mla_kv_buffer(buf, loc, nope, rope)  # no scale: 1 (SGLang's unscaled cast)
    torch.cuda.synchronize()
    assert_buffers(buf, ref)
    monkeypatch.setenv(CHECK, "1")
    with pytest.raises(IndexError, match=r"set_mla_kv_buffer: loc\[1\] = 9 is out of range"):
        jit_kernel.set_mla_kv_buffer(buf, loc, nope, rope)


@pytest.mark.gpu
def test_mla_other_widths_scalar_path() -> None:
    """Any split works; widths that are not whole vectors take the scalar path."""
    tokens, slots = 9, 20
    src = torch.randn(tokens, 100, device="cuda", dtype=torch.bfloat16)
    nope, rope = src[:, 1:78], src[:, 80:99]  # 77 + 19 = 96
    buf = _poison(torch.empty(slots, 96, device="cuda", dtype=torch.bfloat16))
    loc = torch.randperm(slots, device="cuda")[:tokens]
    ref = buf.clone()
    ref[loc] = torch.cat([nope, rope], dim=1)
    jit_kernel.set_mla_kv_buffer(buf, loc, nope, rope)
    torch.cuda.synchronize()
    assert_buffers(buf, ref)


# ---------------------------------------------------------------------------------------------
# GPU: CUDA graphs and torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
def test_cuda_graph_replay(fp8: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)  # the index check syncs: not under capture
    tokens, heads, head_dim, slots = 16, 8, 128, 64
    cache_dtype = FP8 if fp8 else torch.bfloat16
    k = torch.empty(tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.empty_like(k)
    loc = torch.zeros(tokens, device="cuda", dtype=torch.int64)
    k_scale = torch.ones(1, device="cuda")
    v_scale = torch.ones(1, device="cuda")
    kc = torch.empty(slots, heads, head_dim, device="cuda", dtype=cache_dtype)
    vc = torch.empty_like(kc)
    nope = torch.empty(tokens, 1, 512, device="cuda", dtype=torch.bfloat16)
    rope = torch.empty(tokens, 1, 64, device="cuda", dtype=torch.bfloat16)
    mla = torch.empty(slots, 1, 576, device="cuda", dtype=cache_dtype)
    scales = (k_scale, v_scale) if fp8 else (None, None)

    def step() -> None:
        jit_kernel.store_kv_cache(k, v, kc, vc, loc, *scales)
        jit_kernel.set_mla_kv_buffer(mla, loc, nope, rope, scale=k_scale if fp8 else None)

    step()  # resolve the kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for round_ in range(3):
        k.copy_(torch.randn_like(k))
        v.copy_(torch.randn_like(v))
        nope.copy_(torch.randn_like(nope))
        rope.copy_(torch.randn_like(rope))
        loc.copy_(torch.randperm(slots, device="cuda")[:tokens])
        k_scale.fill_(0.01 * (round_ + 1))
        v_scale.fill_(0.02 * (round_ + 1))
        for t in (kc, vc, mla):
            _poison(t)
        ref_k, ref_v, ref_m = kc.clone(), vc.clone(), mla.clone()
        ks, vs = (0.01 * (round_ + 1), 0.02 * (round_ + 1)) if fp8 else (1.0, 1.0)
        _put(ref_k, loc, _quant(k, cache_dtype, ks))
        _put(ref_v, loc, _quant(v, cache_dtype, vs))
        _put(ref_m, loc, _quant(torch.cat([nope, rope], -1), cache_dtype, ks))
        graph.replay()
        torch.cuda.synchronize()
        assert_buffers(kc, ref_k)
        assert_buffers(vc, ref_v)
        assert_buffers(mla, ref_m)


@pytest.mark.gpu
def test_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()

    def model(qkv, kc, vc, loc, ks, vs, mla, nope, rope):
        k = qkv[:, 1024:2048].view(-1, 8, 128)
        v = qkv[:, 2048:].view(-1, 8, 128)
        jit_kernel.store_kv_cache(k, v, kc, vc, loc, ks, vs)
        jit_kernel.set_mla_kv_buffer(mla, loc, nope, rope, scale=ks)
        return nope.float().sum()

    def inputs():
        torch.manual_seed(0)
        qkv = torch.randn(32, 3072, device="cuda", dtype=torch.bfloat16)
        kc = torch.zeros(64, 8, 128, device="cuda", dtype=FP8)
        vc = torch.zeros_like(kc)
        loc = torch.randperm(64, device="cuda")[:32]
        ks, vs = torch.tensor([0.1], device="cuda"), torch.tensor([0.2], device="cuda")
        mla = torch.zeros(64, 1, 576, device="cuda", dtype=FP8)
        nope = torch.randn(32, 1, 512, device="cuda", dtype=torch.bfloat16)
        rope = torch.randn(32, 1, 64, device="cuda", dtype=torch.bfloat16)
        return qkv, kc, vc, loc, ks, vs, mla, nope, rope

    eager_args, compiled_args = inputs(), inputs()
    expected = model(*eager_args)
    got = torch.compile(model, fullgraph=True)(*compiled_args)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-2)  # summation order may differ
    for i in (1, 2, 6):  # the caches were written in place
        assert torch.equal(compiled_args[i].view(torch.uint8), eager_args[i].view(torch.uint8))
    explanation = torch._dynamo.explain(model)(*inputs())
    assert explanation.graph_break_count == 0, explanation.break_reasons


# ---------------------------------------------------------------------------------------------
# CPU: bad inputs (fake CUDA tensors; the C++ launcher's checks run, nothing launches)
# ---------------------------------------------------------------------------------------------


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


def _strided(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    return torch.empty_strided(shape, strides, device="cuda", dtype=torch.bfloat16)


def _store_args(**overrides):
    args = {
        "k": _e(4, 8, 128),
        "v": _e(4, 8, 128),
        "k_cache": _e(16, 8, 128),
        "v_cache": _e(16, 8, 128),
        "out_cache_loc": _e(4, dtype=torch.int64),
    }
    return args | {name: make() for name, make in overrides.items()}


def _fp8_cache():
    return _e(16, 8, 128, dtype=FP8)


STORE_BAD = [
    ({"k": lambda: [1, 2]}, TypeError, r"^store_kv_cache: k must be a torch\.Tensor, got list$"),
    ({"v": lambda: None}, TypeError, r"^store_kv_cache: v must be a torch\.Tensor, got NoneType$"),
    ({"k_cache": lambda: "cache"}, TypeError, r"^store_kv_cache: k_cache must be a torch\.Tensor, got str$"),
    ({"out_cache_loc": lambda: [0, 1]}, TypeError, r"^store_kv_cache: out_cache_loc must be a torch\.Tensor"),
    ({"k": lambda: _e(4, 8, 128, dtype=torch.int32)}, TypeError, r"store_kv_cache: k must be one of \(float16"),
    ({"v": lambda: _e(4, 8, 128, dtype=torch.float16)}, TypeError,
     r"(?s)'v'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"k_cache": lambda: _e(16, 8, 128, dtype=torch.float16)}, TypeError,
     r"(?s)'k_cache'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"v_cache": _fp8_cache}, TypeError, r"(?s)'v_cache'.*Dtype mismatch: expected bfloat16 but got float8_e4m3fn"),
    ({"k_cache": _fp8_cache, "v_cache": _fp8_cache}, ValueError,
     r"store_kv_cache: k_cache is float8_e4m3fn, so k_scale is required"),
    ({"v": lambda: _e(5, 8, 128)}, ValueError,
     r"(?s)'v'.*Size mismatch for shape#0\('num_tokens'\): expected 4 but got 5"),
    ({"out_cache_loc": lambda: _e(3, dtype=torch.int64)}, ValueError,
     r"(?s)'out_cache_loc'.*Size mismatch for shape#0\('num_tokens'\): expected 4 but got 3"),
    ({"out_cache_loc": lambda: _e(4, dtype=torch.float32)}, TypeError,
     r"(?s)'out_cache_loc'.*Dtype mismatch: expected one of \[int32, int64\] but got float32"),
    ({"out_cache_loc": lambda: _e(4, 1, dtype=torch.int64)}, ValueError, r"(?s)'out_cache_loc'.*Rank mismatch"),
    ({"k": lambda: _e(4 * 8 * 128)}, ValueError,
     r"store_kv_cache: k must have 2 dimensions \[rows, width\] or 3 \[rows, heads, head_dim\], got 1"),
    ({"k_cache": lambda: _e(2, 16, 8, 128)}, ValueError, r"store_kv_cache: k_cache must have 2 dimensions .* got 4"),
    ({"k": lambda: _e(4, 128, 8).transpose(1, 2)}, ValueError, r"(?s)'k'.*Stride mismatch"),
    ({"v_cache": lambda: _e(16, 128, 8).transpose(1, 2)}, ValueError, r"(?s)'v_cache'.*Stride mismatch"),
    ({"k": lambda: _strided((4, 1024), (1, 4))}, ValueError,
     r"(?s)'k'.*Stride mismatch"),
    ({"k_cache": lambda: _e(16, 4, 256)}, ValueError,
     r"store_kv_cache: rows of k \[8, 128\] do not match the rows of k_cache \[4, 256\]"),
    ({"v": lambda: _e(4, 1000)}, ValueError,
     r"store_kv_cache: rows of v \[1000\] do not match the rows of v_cache \[8, 128\]"),
    ({"k_cache": lambda: _e(16, 8, 128, device="cpu")}, ValueError,
     r"(?s)'k_cache'.*Device mismatch: expected cuda(:0)? but got cpu"),
    ({"out_cache_loc": lambda: _e(4, dtype=torch.int64, device="cpu")}, ValueError,
     r"(?s)'out_cache_loc'.*Device mismatch: expected cuda(:0)? but got cpu"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), STORE_BAD)
def test_store_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = _store_args(**overrides)
        with pytest.raises(error, match=match):
            jit_kernel.store_kv_cache(**args)


FP8_SCALE_BAD = [
    ({"k_scale": lambda: _e(1, dtype=torch.bfloat16), "v_scale": 1.0}, TypeError,
     r"(?s)'k_scale'.*Dtype mismatch: expected float32 but got bfloat16"),
    ({"k_scale": 1.0, "v_scale": lambda: _e(2, dtype=torch.float32)}, ValueError,
     r"(?s)'v_scale'.*Size mismatch for shape#0: expected 1 but got 2"),
    ({"k_scale": 1.0, "v_scale": None}, ValueError,
     r"store_kv_cache: v_cache is float8_e4m3fn, so v_scale is required"),
    ({"k_scale": "1.0", "v_scale": 1.0}, TypeError,
     r"^store_kv_cache: k_scale must be a float32 tensor of one element or a float, got str$"),
    ({"k_scale": True, "v_scale": 1.0}, TypeError, r"store_kv_cache: k_scale must be a float32 tensor .* got bool"),
    ({"k_scale": 0.0, "v_scale": 1.0}, ValueError,
     r"store_kv_cache: k_scale must be a finite float of at least 2\^-126, got 0"),
    ({"k_scale": 1.0, "v_scale": float("inf")}, ValueError,
     r"store_kv_cache: v_scale must be a finite float of at least 2\^-126"),
    ({"k_scale": 1e-39, "v_scale": 1.0}, ValueError, r"store_kv_cache: k_scale must be a finite float of at least"),
    ({"k_scale": lambda: _e(1, dtype=torch.float32, device="cpu"), "v_scale": 1.0}, ValueError,
     r"(?s)'k_scale'.*Device mismatch: expected cuda(:0)? but got cpu"),
    ({"k_scale": 1.0, "v_scale": 1.0, "enable_pdl": "yes"}, TypeError,
     r"^store_kv_cache: enable_pdl must be a bool or None, got str$"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "match"), FP8_SCALE_BAD)
def test_store_fp8_bad_scales(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = _store_args(k_cache=_fp8_cache, v_cache=_fp8_cache)
        kwargs = {name: (value() if callable(value) else value) for name, value in kwargs.items()}
        with pytest.raises(error, match=match):
            jit_kernel.store_kv_cache(**args, **kwargs)


def _mla_args(**overrides):
    args = {
        "kv_buffer": _e(32, 1, 576),
        "loc": _e(4, dtype=torch.int32),
        "cache_k_nope": _e(4, 1, 512),
        "cache_k_rope": _e(4, 1, 64),
    }
    return args | {name: make() for name, make in overrides.items()}


MLA_BAD = [
    ({"kv_buffer": lambda: 3}, TypeError, r"^set_mla_kv_buffer: kv_buffer must be a torch\.Tensor, got int$"),
    ({"cache_k_rope": lambda: (1,)}, TypeError,
     r"^set_mla_kv_buffer: cache_k_rope must be a torch\.Tensor, got tuple$"),
    ({"cache_k_nope": lambda: _e(4, 1, 512, dtype=torch.float64)}, TypeError,
     r"set_mla_kv_buffer: cache_k_nope must be one of \(float16, bfloat16, float32\), got float64"),
    ({"cache_k_rope": lambda: _e(4, 1, 64, dtype=torch.float16)}, TypeError,
     r"(?s)'cache_k_rope'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"kv_buffer": lambda: _e(32, 1, 576, dtype=torch.float16)}, TypeError,
     r"(?s)'kv_buffer'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"kv_buffer": lambda: _e(32, 1, 512)}, ValueError,
     r"set_mla_kv_buffer: the widths of cache_k_nope \(512\) and cache_k_rope \(64\) must add up to the width of "
     r"kv_buffer \(512\)"),
    ({"cache_k_rope": lambda: _e(5, 1, 64)}, ValueError,
     r"(?s)'cache_k_rope'.*Size mismatch for shape#0\('num_tokens'\)"),
    ({"loc": lambda: _e(5, dtype=torch.int32)}, ValueError, r"(?s)'loc'.*Size mismatch for shape#0\('num_tokens'\)"),
    ({"loc": lambda: _e(4, dtype=torch.int16)}, TypeError,
     r"(?s)'loc'.*Dtype mismatch: expected one of \[int32, int64\]"),
    ({"cache_k_nope": lambda: _strided((4, 1, 512), (1024, 512, 2))}, ValueError,
     r"(?s)'cache_k_nope'.*Stride mismatch"),
    ({"kv_buffer": lambda: _e(32, 576, device="cpu")}, ValueError, r"(?s)'kv_buffer'.*Device mismatch"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), MLA_BAD)
def test_mla_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = _mla_args(**overrides)
        with pytest.raises(error, match=match):
            jit_kernel.set_mla_kv_buffer(**args)


@pytest.mark.parametrize(
    ("scale", "error", "match"),
    [
        (lambda: _e(1, dtype=torch.float16), TypeError, r"(?s)'scale'.*Dtype mismatch: expected float32"),
        (lambda: -1.0, ValueError, r"set_mla_kv_buffer: scale must be a finite float of at least 2\^-126, got -1"),
        (lambda: object(), TypeError, r"set_mla_kv_buffer: scale must be a float32 tensor of one element"),
    ],
)
def test_mla_fp8_bad_scale(scale, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = _mla_args(kv_buffer=lambda: _e(32, 576, dtype=FP8))
        with pytest.raises(error, match=match):
            jit_kernel.set_mla_kv_buffer(**args, scale=scale())


def test_registered_ops_and_fakes() -> None:
    """The torch.library ops exist with the caches as mutated arguments; their fakes run the C++
    checks on FakeTensors (so tracing rejects what the op rejects) without launching."""
    store = torch.ops.jit_kernel.store_kv_cache.default._schema
    mla = torch.ops.jit_kernel.set_mla_kv_buffer.default._schema
    assert [a.name for a in store.arguments if a.alias_info and a.alias_info.is_write] == ["k_cache", "v_cache"]
    assert [a.name for a in mla.arguments if a.alias_info and a.alias_info.is_write] == ["kv_buffer"]
    with fake_cuda():
        args = _store_args()
        torch.ops.jit_kernel.store_kv_cache(*args.values())
        torch.ops.jit_kernel.set_mla_kv_buffer(*_mla_args().values())
        args["k"] = _e(4, 8, 128, dtype=torch.int8)
        with pytest.raises(TypeError, match="store_kv_cache: k must be one of"):
            torch.ops.jit_kernel.store_kv_cache(*args.values())
        args = _store_args(out_cache_loc=lambda: _e(5, dtype=torch.int32))
        with pytest.raises(ValueError, match=r"(?s)'out_cache_loc'.*num_tokens"):
            torch.ops.jit_kernel.store_kv_cache(*args.values())
        bad = _mla_args(cache_k_rope=lambda: _e(4, 1, 32))
        with pytest.raises(ValueError, match="must add up to the width of kv_buffer"):
            torch.ops.jit_kernel.set_mla_kv_buffer(*bad.values())


@pytest.mark.parametrize(
    "case",
    ["3d", "2d", "fused_views", "int32_strided_loc", "fp8_tensor_scales", "fp8_float_scales", "zero_tokens", "odd"],
)
def test_store_valid_fake_calls(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid calls pass every C++ check on FakeTensors and return before any CUDA call."""
    monkeypatch.setenv(CHECK, "1")  # the index check skips FakeTensors (no values)
    with fake_cuda():
        args = _store_args()
        kwargs: dict[str, object] = {}
        if case == "2d":
            args = _store_args(k=lambda: _e(4, 1024), k_cache=lambda: _e(16, 1024))
        elif case == "fused_views":
            # views of a fused [4, 6144] qkv tensor; k_cache slots padded to 1088 elements (fake slicing needs a GPU)
            args |= {
                "k": _strided((4, 1024), (6144, 1)),
                "v": _strided((4, 8, 128), (6144, 128, 1)),
                "k_cache": _strided((16, 8, 128), (1088, 128, 1)),
            }
        elif case == "int32_strided_loc":
            args["out_cache_loc"] = torch.empty_strided((4,), (2,), device="cuda", dtype=torch.int32)
        elif case == "fp8_tensor_scales":
            args |= {"k_cache": _fp8_cache(), "v_cache": _fp8_cache()}
            kwargs = {"k_scale": _e(1, dtype=torch.float32), "v_scale": torch.empty((), device="cuda")}
        elif case == "fp8_float_scales":
            args |= {"k_cache": _fp8_cache(), "v_cache": _fp8_cache()}
            kwargs = {"k_scale": 0.5, "v_scale": 2}
        elif case == "zero_tokens":
            args = _store_args(
                k=lambda: _e(0, 8, 128), v=lambda: _e(0, 8, 128), out_cache_loc=lambda: _e(0, dtype=torch.int64)
            )
        elif case == "odd":
            args = _store_args(
                k=lambda: _e(4, 5, 3), v=lambda: _e(4, 5, 3), k_cache=lambda: _e(9, 15), v_cache=lambda: _e(9, 5, 3)
            )
        assert jit_kernel.store_kv_cache(**args, **kwargs) is None


def test_mla_valid_fake_calls() -> None:
    with fake_cuda():
        nope, rope = _strided((4, 1, 512), (608, 608, 1)), _strided((4, 1, 64), (608, 608, 1))
        nope2, rope2 = _strided((4, 512), (608, 1)), _strided((4, 64), (608, 1))
        jit_kernel.set_mla_kv_buffer(_e(32, 1, 576), _e(4, dtype=torch.int32), nope, rope)
        jit_kernel.set_mla_kv_buffer(_strided((32, 576), (1152, 1)), _e(4, dtype=torch.int64), nope2, rope2)
        jit_kernel.set_mla_kv_buffer(_e(32, 576, dtype=FP8), _e(4, dtype=torch.int64), nope2, rope, scale=0.5)


def test_families_spec() -> None:
    from jit_kernel.engine.families import KV_STORE, family

    assert family("kv_store") is KV_STORE
    assert set(KV_STORE.exports) == {"store", "mla"}
    assert ("bf16_t", "bf16_t") in KV_STORE.prebuilt and ("bf16_t", "fp8_e4m3_t") in KV_STORE.prebuilt


def test_static_scale_forms() -> None:
    """The one rule of a static fp8 scale (the KV store's and the norm quantisers'): a float (a
    subclass too, as NumPy's float64 is) or an int as a float, a tensor of one element as ``[1]``,
    None as absent; anything else names the argument."""
    from jit_kernel.ops._common import split_scale

    class Float(float):
        pass

    assert split_scale("op", "k_scale", 0.5) == (None, 0.5)
    assert split_scale("op", "k_scale", Float(0.25)) == (None, 0.25)
    assert split_scale("op", "k_scale", 2) == (None, 2.0)
    assert split_scale("op", "k_scale", None) == (None, None)
    scale, value = split_scale("op", "k_scale", torch.ones(1, 1))
    assert scale is not None and scale.shape == (1,) and value is None
    with pytest.raises(TypeError, match=r"^op: k_scale must be a float32 tensor of one element or a float, got bool$"):
        split_scale("op", "k_scale", True)
