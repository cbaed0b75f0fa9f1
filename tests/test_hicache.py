"""hicache transfers: exact round trips on every layout (GPU), and every bad input (CPU and GPU).

Every GPU case fills the source with fresh random bytes and poisons the destination first, then
compares the whole destination byte for byte with a torch reference (rows that were not targeted
must keep the poison).
"""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_kernel.engine import cache, families
from jit_kernel.engine.dispatch import jit_module
from jit_kernel.hicache import (
    can_use_hicache_jit_kernel,
    default_unroll,
    transfer_hicache_all_layer,
    transfer_hicache_all_layer_mla,
    transfer_hicache_one_layer,
    transfer_hicache_one_layer_mla,
)

POISON = 0xA5
DTYPE_FOR_SIZE = {16: torch.float32, 128: torch.bfloat16, 256: torch.bfloat16, 576: torch.uint8, 1024: torch.float16}


def _place(where: str) -> dict[str, object]:
    return {"device": "cuda"} if where == "cuda" else {"device": "cpu", "pin_memory": True}


def make_cache(rows: int, element_size: int, where: str, dtype: torch.dtype = torch.bfloat16, *, poison: bool = False):
    """A ``[rows, element_size / itemsize]`` cache of random bytes (or poison) on CUDA or pinned host."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(rows, element_size, dtype=torch.uint8, **_place(where))  # type: ignore[arg-type]
    if poison:
        raw.fill_(POISON)
    else:
        raw.copy_(torch.randint(0, 256, (rows, element_size), dtype=torch.uint8))
    return raw.view(dtype).view(rows, element_size // itemsize)


def make_indices(n: int, rows: int, dtype: torch.dtype, *, unique: bool) -> torch.Tensor:
    """Sorted random rows (unique for destinations: two writes to one row would race)."""
    idx = torch.randperm(rows)[:n] if unique else torch.randint(0, rows, (n,))
    return idx.sort().values.to(dtype=dtype, device="cuda")


def reference(dst: torch.Tensor, idx_dst: torch.Tensor, src: torch.Tensor, idx_src: torch.Tensor) -> torch.Tensor:
    expected = dst.cpu().clone()
    expected[idx_dst.cpu().long()] = src.cpu()[idx_src.cpu().long()]
    return expected


def assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor) -> None:
    a = actual.cpu().contiguous().view(torch.uint8)
    e = expected.cpu().contiguous().view(torch.uint8)
    assert a.shape == e.shape
    if not torch.equal(a, e):
        bad = (a != e).any(dim=-1).nonzero().flatten()
        raise AssertionError(f"{bad.numel()} rows differ, first {bad[:8].tolist()}")


DIRECTIONS = {"d2h": ("cuda", "cpu"), "h2d": ("cpu", "cuda"), "d2d": ("cuda", "cuda")}


def one_layer_case(
    direction: str,
    element_size: int,
    n: int,
    index_dtype: torch.dtype,
    *,
    block_quota: int | None = None,
    dtype: torch.dtype | None = None,
    rows_src: int | None = None,
    rows_dst: int | None = None,
) -> None:
    src_where, dst_where = DIRECTIONS[direction]
    dtype = dtype or DTYPE_FOR_SIZE.get(element_size, torch.bfloat16)
    rows_src = rows_src or n + 13
    rows_dst = rows_dst or n + 29
    k_src, v_src = (make_cache(rows_src, element_size, src_where, dtype) for _ in range(2))
    k_dst, v_dst = (make_cache(rows_dst, element_size, dst_where, dtype, poison=True) for _ in range(2))
    idx_src = make_indices(n, rows_src, index_dtype, unique=False)
    idx_dst = make_indices(n, rows_dst, index_dtype, unique=True)
    expected_k = reference(k_dst, idx_dst, k_src, idx_src)
    expected_v = reference(v_dst, idx_dst, v_src, idx_src)
    transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src, block_quota=block_quota)
    torch.cuda.synchronize()
    assert_same_bytes(k_dst, expected_k)
    assert_same_bytes(v_dst, expected_v)


# -- GPU: exact round trips ------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("element_size", [16, 128, 256, 1024, 1152, 4096])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_one_layer_element_sizes(direction: str, element_size: int, index_dtype: torch.dtype) -> None:
    one_layer_case(direction, element_size, 4096, index_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 4096, 100003])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_one_layer_batch_sizes(direction: str, n: int) -> None:
    one_layer_case(direction, 256, n, torch.int64)


@pytest.mark.gpu
@pytest.mark.parametrize("block_quota", [1, 2, 64])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_one_layer_block_quota(direction: str, block_quota: int) -> None:
    one_layer_case(direction, 1152, 4099, torch.int32, block_quota=block_quota)


@pytest.mark.gpu
@pytest.mark.parametrize("block_quota", [1, 3, 4, 132])
@pytest.mark.parametrize("n", [1, 2, 5, 16, 31, 33, 127, 129])
def test_short_transfers_spread_over_the_quota(n: int, block_quota: int) -> None:
    """Fewer rows than the quota's full blocks hold run in up to block_quota smaller blocks (rows per
    block rounded up to whole warps): every row is copied once and nothing else is written."""
    one_layer_case("d2d", 1024, n, torch.int64, block_quota=block_quota)
    one_layer_case("h2d", 2048, n, torch.int32, block_quota=block_quota)


@pytest.mark.gpu
@pytest.mark.parametrize("unroll", [1, 8])
def test_one_layer_unroll_and_non_multiple_of_128(unroll: int) -> None:
    """Rows that are not a multiple of 128 bytes (and unrolls that leave lanes idle) still copy exactly."""
    src_where, dst_where = DIRECTIONS["h2d"]
    k_src, v_src = (make_cache(300, 208, src_where, torch.uint8) for _ in range(2))
    k_dst, v_dst = (make_cache(500, 208, dst_where, torch.uint8, poison=True) for _ in range(2))
    idx_src = make_indices(257, 300, torch.int64, unique=False)
    idx_dst = make_indices(257, 500, torch.int64, unique=True)
    expected = reference(k_dst, idx_dst, k_src, idx_src), reference(v_dst, idx_dst, v_src, idx_src)
    transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src, unroll=unroll, block_quota=3)
    torch.cuda.synchronize()
    assert_same_bytes(k_dst, expected[0])
    assert_same_bytes(v_dst, expected[1])


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_one_layer_strided_caches(direction: str) -> None:
    """K and V interleaved in one buffer ([rows, 2, heads, dim]: row stride 2x the row), and a
    3-D cache viewed through element_dim = heads * dim."""
    src_where, dst_where = DIRECTIONS[direction]
    heads, dim = 4, 128  # 1024-byte rows in bf16
    src = make_cache(700 * 2 * heads, dim * 2, src_where).view(700, 2, heads, dim)
    dst = make_cache(900 * 2 * heads, dim * 2, dst_where, poison=True).view(900, 2, heads, dim)
    k_src, v_src, k_dst, v_dst = src[:, 0], src[:, 1], dst[:, 0], dst[:, 1]
    assert k_src.stride(0) == 2 * heads * dim
    idx_src = make_indices(600, 700, torch.int32, unique=False)
    idx_dst = make_indices(600, 900, torch.int32, unique=True)
    expected = reference(dst, idx_dst, src, idx_src)
    transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src, element_dim=heads * dim)
    torch.cuda.synchronize()
    assert_same_bytes(dst, expected)


@pytest.mark.gpu
@pytest.mark.parametrize(("element_size", "dtype"), [(1152, torch.bfloat16), (576, torch.uint8)])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_one_layer_mla(direction: str, element_size: int, dtype: torch.dtype) -> None:
    """DeepSeek's latent cache: 576 values in bf16 (1152 B) or fp8 (576 B, not a multiple of 128)."""
    src_where, dst_where = DIRECTIONS[direction]
    src = make_cache(3000, element_size, src_where, dtype)
    dst = make_cache(5000, element_size, dst_where, dtype, poison=True)
    idx_src = make_indices(2049, 3000, torch.int64, unique=False)
    idx_dst = make_indices(2049, 5000, torch.int64, unique=True)
    expected = reference(dst, idx_dst, src, idx_src)
    transfer_hicache_one_layer_mla(dst, idx_dst, src, idx_src)
    torch.cuda.synchronize()
    assert_same_bytes(dst, expected)


def _layers(num_layers: int, rows: int, element_size: int, where: str, *, stride: int, poison: bool = False):
    """Per-layer caches whose rows are ``stride`` bytes apart (``element_size`` of them used), and
    the uint64 table of their base addresses (device addresses; pinned host ones under UVA)."""
    caches = [make_cache(rows, stride, where, torch.uint8, poison=poison) for _ in range(num_layers)]
    table = torch.tensor([c.data_ptr() for c in caches], dtype=torch.uint64, device="cuda")
    return caches, table


def _all_layer_expected(dst, idx_dst, src, idx_src, element_size):
    expected = dst.cpu().clone()
    expected[idx_dst.cpu().long(), :element_size] = src.cpu()[idx_src.cpu().long(), :element_size]
    return expected


@pytest.mark.gpu
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
@pytest.mark.parametrize("n", [3, 777])  # 3 rows x 4 layers: fewer than one full block, spread over the quota
def test_all_layer(direction: str, index_dtype: torch.dtype, mla: bool, n: int) -> None:
    """4 layers in one launch; source and destination strides differ (a page-interleaved host layout)."""
    src_where, dst_where = DIRECTIONS[direction]
    layers, element_size, src_stride, dst_stride = 4, 1024, 1024, 1536
    k_src, k_src_table = _layers(layers, 800, element_size, src_where, stride=src_stride)
    k_dst, k_dst_table = _layers(layers, 1000, element_size, dst_where, stride=dst_stride, poison=True)
    idx_src = make_indices(n, 800, index_dtype, unique=False)
    idx_dst = make_indices(n, 1000, index_dtype, unique=True)
    strides = {"kv_cache_src_stride_bytes": src_stride, "kv_cache_dst_stride_bytes": dst_stride}
    expected_k = [_all_layer_expected(d, idx_dst, s, idx_src, element_size) for d, s in zip(k_dst, k_src, strict=True)]
    if mla:
        transfer_hicache_all_layer_mla(k_dst_table, idx_dst, k_src_table, idx_src, element_size=element_size, **strides)
    else:
        v_src, v_src_table = _layers(layers, 800, element_size, src_where, stride=src_stride)
        v_dst, v_dst_table = _layers(layers, 1000, element_size, dst_where, stride=dst_stride, poison=True)
        expected_v = [
            _all_layer_expected(d, idx_dst, s, idx_src, element_size) for d, s in zip(v_dst, v_src, strict=True)
        ]
        transfer_hicache_all_layer(
            k_dst_table, v_dst_table, idx_dst, k_src_table, v_src_table, idx_src, element_size=element_size, **strides
        )
    torch.cuda.synchronize()
    for actual, expected in zip(k_dst, expected_k, strict=True):
        assert_same_bytes(actual, expected)
    if not mla:
        for actual, expected in zip(v_dst, expected_v, strict=True):
            assert_same_bytes(actual, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("mla", [False, True])
def test_one_layer_under_torch_compile(mla: bool) -> None:
    """The torch.ops form (fullgraph, declared mutations): the same bytes as the reference."""
    torch._dynamo.reset()
    k_src, v_src = (make_cache(300, 1024, "cuda") for _ in range(2))
    k_dst, v_dst = (make_cache(400, 1024, "cpu", poison=True) for _ in range(2))
    idx_src = make_indices(250, 300, torch.int64, unique=False)
    idx_dst = make_indices(250, 400, torch.int64, unique=True)
    expected_k, expected_v = reference(k_dst, idx_dst, k_src, idx_src), reference(v_dst, idx_dst, v_src, idx_src)

    @torch.compile(fullgraph=True)
    def move() -> None:
        if mla:
            transfer_hicache_one_layer_mla(k_dst, idx_dst, k_src, idx_src)
        else:
            transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src)

    move()
    torch.cuda.synchronize()
    assert_same_bytes(k_dst, expected_k)
    if not mla:
        assert_same_bytes(v_dst, expected_v)


@pytest.mark.gpu
def test_empty_transfer_is_a_no_op() -> None:
    k = make_cache(16, 256, "cuda", poison=True)
    before = k.clone()
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    transfer_hicache_one_layer(k, k.clone(), empty, k.clone(), k.clone(), empty)
    transfer_hicache_one_layer_mla(k, empty, k.clone(), empty)
    table = torch.tensor([k.data_ptr()], dtype=torch.uint64, device="cuda")
    transfer_hicache_all_layer(
        table, table, empty, table, table, empty, kv_cache_src_stride_bytes=256, kv_cache_dst_stride_bytes=256
    )
    torch.cuda.synchronize()
    assert torch.equal(k, before)


@pytest.mark.gpu
def test_runs_on_the_current_stream() -> None:
    """The copy is ordered on torch's current stream: a slow producer on that stream comes first."""
    k_src, v_src = (make_cache(4096, 1024, "cuda", torch.float16) for _ in range(2))
    k_dst, v_dst = (make_cache(4096, 1024, "cpu", torch.float16, poison=True) for _ in range(2))
    idx = torch.arange(4096, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)
        k_src.fill_(3.0)
        transfer_hicache_one_layer(k_dst, v_dst, idx, k_src, v_src, idx)
    stream.synchronize()
    assert bool((k_dst == 3.0).all())
    assert_same_bytes(v_dst, v_src)


# -- GPU: bad inputs that need CUDA tensors ----------------------------------------------------


@pytest.mark.gpu
def test_pageable_cache_is_refused() -> None:
    k = make_cache(64, 256, "cuda")
    host = torch.zeros(64, 128, dtype=torch.bfloat16)  # pageable
    idx = torch.arange(8, device="cuda")
    pinned = make_cache(64, 256, "cpu")  # k and v of one side share a placement (C++ checks it)
    with pytest.raises(ValueError, match=r"v_cache_dst.*pageable.*pin_memory"):
        transfer_hicache_one_layer(pinned, host, idx, k, k.clone(), idx)
    with pytest.raises(ValueError, match=r"(?s)'v_cache_dst'.*Device mismatch: expected cuda:0 but got cpu"):
        transfer_hicache_one_layer(k.clone(), host, idx, k, k.clone(), idx)
    with pytest.raises(ValueError, match=r"cache_src.*pin_memory"):
        transfer_hicache_one_layer_mla(k, idx, host, idx)


@pytest.mark.gpu
def test_kernel_refuses_pageable_memory_itself() -> None:
    """The C++ launcher is the second line of defence: called directly, it refuses pageable memory too."""
    from jit_kernel.ops.hicache import _HICACHE

    k = make_cache(64, 256, "cuda")
    host = torch.zeros(64, 128, dtype=torch.bfloat16)
    idx = torch.arange(8, device="cuda")
    run = _HICACHE.function("run_one_mla", (256, 4, families.HICACHE_NUM_THREADS))
    with pytest.raises(ValueError, match=r"cache_dst.*pageable"):
        run(host, idx, k, idx, 2)
    with pytest.raises(ValueError, match=r"built for 256"):
        run(make_cache(64, 512, "cuda"), idx, make_cache(64, 512, "cuda"), idx, 2)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_check_indices_names_the_first_bad_position(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIT_KERNEL_CHECK_INDICES", "1")
    k_src, v_src = (make_cache(100, 256, "cuda") for _ in range(2))
    k_dst, v_dst = (make_cache(50, 256, "cpu", poison=True) for _ in range(2))
    good = torch.arange(10, device="cuda")
    bad_dst = torch.tensor([0, 1, 2, 50, 3, 77, 4, 5, 6, 7], device="cuda")
    with pytest.raises(IndexError, match=r"indices_dst\[3\] = 50 is out of range.*\[0, 50\)"):
        transfer_hicache_one_layer(k_dst, v_dst, bad_dst, k_src, v_src, good)
    bad_src = torch.tensor([0, 1, -1, 2, 3, 4, 5, 6, 7, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(IndexError, match=r"indices_src\[2\] = -1"):
        transfer_hicache_one_layer(k_dst, v_dst, good.int(), k_src, v_src, bad_src)
    assert bool((k_dst.view(torch.uint8) == POISON).all())  # nothing was copied
    table = torch.tensor([k_src.data_ptr()], dtype=torch.uint64, device="cuda")
    with pytest.raises(IndexError, match=r"indices_src\[2\] = -1"):
        transfer_hicache_all_layer_mla(
            table, good, table, bad_src.long(), kv_cache_src_stride_bytes=256, kv_cache_dst_stride_bytes=256
        )
    transfer_hicache_one_layer(k_dst, v_dst, good, k_src, v_src, good)  # in range: copies
    torch.cuda.synchronize()
    assert_same_bytes(k_dst[:10], k_src[:10])


@pytest.mark.gpu
def test_fast_path_serves_every_form_the_full_path_does() -> None:
    """A call with the default options remembers its kernel; later ones launch it directly, and what
    its launcher refuses goes through the full path: 3-D caches are still viewed as rows, and bad
    inputs still get the full path's errors."""
    from jit_kernel.ops import hicache as ops

    rows, idx = 64, torch.arange(16, device="cuda")
    k_src, v_src = (make_cache(rows, 256, "cuda") for _ in range(2))
    k_dst, v_dst = (make_cache(rows, 256, "cuda", poison=True) for _ in range(2))
    transfer_hicache_one_layer(k_dst, v_dst, idx, k_src, v_src, idx)
    assert 128 in ops._ONE_LAYER_KERNELS.by_dtype[torch.bfloat16]
    k_dst.view(torch.uint8).fill_(POISON)
    transfer_hicache_one_layer(k_dst, v_dst, idx, k_src, v_src, idx)  # the fast path
    torch.cuda.synchronize()
    assert_same_bytes(k_dst[:16], k_src[:16])
    # [rows, 2, 128]: the remembered 256-byte kernel refuses rank 3; the full path copies rows of 128
    k3_src, v3_src = (make_cache(rows, 512, "cuda").view(rows, 2, 128) for _ in range(2))
    k3_dst, v3_dst = (make_cache(rows, 512, "cuda", poison=True).view(rows, 2, 128) for _ in range(2))
    transfer_hicache_one_layer(k3_dst, v3_dst, idx, k3_src, v3_src, idx)
    torch.cuda.synchronize()
    assert_same_bytes(k3_dst.reshape(-1, 128)[:16], k3_src.reshape(-1, 128)[:16])
    assert_same_bytes(v3_dst.reshape(-1, 128)[16:], make_cache(2 * rows - 16, 256, "cuda", poison=True))
    with pytest.raises(TypeError, match=r"(?s)'indices_dst'.*Dtype mismatch"):
        transfer_hicache_one_layer(k_dst, v_dst, idx.float(), k_src, v_src, idx)
    with pytest.raises(TypeError, match=r"k_cache_src must be a torch\.Tensor, got list"):
        transfer_hicache_one_layer(k_dst, v_dst, idx, [1], v_src, idx)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"element_dim=128 does not match v_cache_src"):
        transfer_hicache_one_layer(k_dst, v_dst, idx, k_src, make_cache(rows, 512, "cuda"), idx)


@pytest.mark.gpu
def test_misaligned_view_is_refused() -> None:
    base = make_cache(65, 256, "cuda", torch.uint8)
    shifted = base.view(-1)[8 : 8 + 64 * 256].view(64, 256)  # 8 bytes off a 16-byte boundary
    idx = torch.arange(4, device="cuda")
    with pytest.raises(ValueError, match=r"cache_src.*16-byte aligned"):
        transfer_hicache_one_layer_mla(base, idx, shifted, idx)


@pytest.mark.gpu
@pytest.mark.multigpu
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_caches_on_the_second_gpu(direction: str) -> None:
    """Caches and indices on cuda:1 while cuda:0 is current: the kernel runs on cuda:1, on its
    current stream (a side stream that first sleeps, so running on another stream would race)."""
    src_where, dst_where = DIRECTIONS[direction]
    torch.cuda.set_device(0)
    with torch.cuda.device(1):  # "cuda" is cuda:1 in here
        k_src, v_src = (make_cache(300, 1024, src_where) for _ in range(2))
        k_dst, v_dst = (make_cache(400, 1024, dst_where, poison=True) for _ in range(2))
    idx_src = torch.randint(0, 300, (250,), device="cuda:1")
    idx_dst = torch.randperm(400, device="cuda:1")[:250]
    expected = reference(k_dst, idx_dst, k_src, idx_src), reference(v_dst, idx_dst, v_src, idx_src)
    stream = torch.cuda.Stream(device=1)
    stream.wait_stream(torch.cuda.current_stream(1))
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)
        transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k_src, v_src, idx_src)
        if src_where == "cuda":  # a write after the copy on the same stream must not leak into it
            k_src.fill_(0)
    stream.synchronize()
    assert torch.cuda.current_device() == 0
    assert_same_bytes(k_dst, expected[0])
    assert_same_bytes(v_dst, expected[1])
    k0 = torch.zeros(300, 512, dtype=torch.bfloat16, device="cuda:0")
    with pytest.raises(ValueError, match=r"k_cache_src'? is on cuda:0 but the indices are on cuda:1"):
        transfer_hicache_one_layer(k_dst, v_dst, idx_dst, k0, k0.clone(), idx_src)


# -- CPU: bad inputs refused before any launch ---------------------------------------------------
# The C++ launcher owns the tensor rules (dtype, rank, length, device, strides); on a machine without a
# GPU its checks run on fake CUDA tensors (tests/_norm_helpers.py). Python keeps only what picks the
# kernel (element_dim, unroll, block_quota) and the views it makes.


def _cuda(*shape: int, dtype: torch.dtype = torch.bfloat16, strides: tuple[int, ...] | None = None) -> torch.Tensor:
    if strides is None:
        return torch.zeros(*shape, dtype=dtype, device="cuda")
    return torch.empty_strided(shape, strides, dtype=dtype, device="cuda")


def _idx(n: int = 8, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, device="cuda")


def test_bad_indices_are_refused() -> None:
    with fake_cuda():
        k, idx = _cuda(16, 128), _idx()
        with pytest.raises(ValueError, match=r"(?s)'indices_src'.*expected 8 but got 7"):
            transfer_hicache_one_layer(k, k, idx, k, k, _idx(7))
        with pytest.raises(TypeError, match=r"(?s)'indices_src'.*Dtype mismatch: expected int64 but got float32"):
            transfer_hicache_one_layer(k, k, idx, k, k, _idx(dtype=torch.float32))
        with pytest.raises(TypeError, match=r"(?s)'indices_src'.*Dtype mismatch: expected int64 but got int32"):
            transfer_hicache_one_layer(k, k, idx, k, k, _idx(dtype=torch.int32))
        with pytest.raises(TypeError, match=r"(?s)'indices_dst'.*expected one of \[int32, int64\] but got int16"):
            transfer_hicache_one_layer_mla(k, _idx(dtype=torch.int16), k, idx)
        with pytest.raises(ValueError, match=r"(?s)'indices_src'.*Rank mismatch: expected 1 but got 2"):
            transfer_hicache_one_layer(k, k, idx, k, k, torch.zeros(2, 4, dtype=torch.int64, device="cuda"))
        host_idx = torch.zeros(8, dtype=torch.int64, device="cpu")
        with pytest.raises(ValueError, match=r"(?s)'indices_dst'.*Device mismatch: expected cuda but got cpu"):
            transfer_hicache_one_layer(k, k, host_idx, k, k, host_idx)


def test_mismatched_caches_are_refused() -> None:
    with fake_cuda():
        k, idx = _cuda(16, 128), _idx()
        with pytest.raises(TypeError, match=r"(?s)'v_cache_dst'.*Dtype mismatch: expected bfloat16 but got float16"):
            transfer_hicache_one_layer(k, _cuda(16, 128, dtype=torch.float16), idx, k, k, idx)
        narrow = _cuda(16, 64, strides=(128, 1))
        with pytest.raises(ValueError, match=r"element_dim=128 does not match v_cache_src of shape \(16, 64\)"):
            transfer_hicache_one_layer(k, k, idx, k, narrow, idx)
        with pytest.raises(ValueError, match="element_dim=96 does not match k_cache_dst"):
            transfer_hicache_one_layer(k, k, idx, k, k, idx, element_dim=96)
        with pytest.raises(ValueError, match="element_dim=64 does not match"):
            transfer_hicache_one_layer_mla(k, idx, k, idx, element_dim=64)
        odd = _cuda(16, 20)
        with pytest.raises(ValueError, match="multiple of 16 bytes, got 40"):
            transfer_hicache_one_layer_mla(odd, idx, odd, idx)
        with pytest.raises(ValueError, match=r"(?s)'cache_src'.*Stride mismatch"):
            transfer_hicache_one_layer_mla(k, idx, _cuda(16, 128, strides=(1, 16)), idx)
        with pytest.raises(TypeError, match=r"cache_dst must be a torch.Tensor"):
            transfer_hicache_one_layer_mla([1, 2], idx, k, idx)  # type: ignore[arg-type]


def test_bad_options_are_refused() -> None:
    with fake_cuda():
        k, idx = _cuda(16, 128), _idx()
        with pytest.raises(ValueError, match="unroll must be one of"):
            transfer_hicache_one_layer(k, k, idx, k, k, idx, unroll=3)
        with pytest.raises(ValueError, match="block_quota must be a positive int"):
            transfer_hicache_one_layer(k, k, idx, k, k, idx, block_quota=0)
        with pytest.raises(ValueError, match="element_dim must be a positive int"):
            transfer_hicache_one_layer(k, k, idx, k, k, idx, element_dim=0)
        transfer_hicache_one_layer(k, k, idx, k, k, idx)  # valid: the checks pass and nothing launches


def test_bad_all_layer_inputs() -> None:
    with fake_cuda():
        idx = _idx(4)
        table = torch.zeros(2, dtype=torch.uint64, device="cuda")
        strides = {"kv_cache_src_stride_bytes": 256, "kv_cache_dst_stride_bytes": 256}
        with pytest.raises(TypeError, match=r"(?s)'k_ptr_src'.*Dtype mismatch: expected uint64 but got int64"):
            transfer_hicache_all_layer(table, table, idx, _idx(2), table, idx, **strides)
        with pytest.raises(ValueError, match=r"(?s)'v_ptr_dst'.*expected 2 but got 3"):
            transfer_hicache_all_layer(
                table, torch.zeros(3, dtype=torch.uint64, device="cuda"), idx, table, table, idx, **strides
            )
        with pytest.raises(ValueError, match=r"(?s)'ptr_dst'.*Device mismatch: expected cuda:0 but got cpu"):
            transfer_hicache_all_layer_mla(torch.zeros(2, dtype=torch.uint64), idx, table, idx, **strides)
        with pytest.raises(ValueError, match="element_size is required"):
            transfer_hicache_all_layer_mla(
                table, idx, table, idx, kv_cache_src_stride_bytes=256, kv_cache_dst_stride_bytes=512
            )
        with pytest.raises(
            ValueError, match="kv_cache_dst_stride_bytes must be a multiple of 16 and >= the element size 512, got 256"
        ):
            transfer_hicache_all_layer_mla(
                table, idx, table, idx, kv_cache_src_stride_bytes=512, kv_cache_dst_stride_bytes=256, element_size=512
            )
        with pytest.raises(ValueError, match="multiple of 16"):
            transfer_hicache_all_layer_mla(
                table, idx, table, idx, kv_cache_src_stride_bytes=40, kv_cache_dst_stride_bytes=40
            )
        transfer_hicache_all_layer(table, table, idx, table, table, idx, **strides)  # valid: nothing launches


def test_can_use_and_defaults() -> None:
    assert can_use_hicache_jit_kernel(element_size=1152)
    assert can_use_hicache_jit_kernel(element_size=16)
    assert not can_use_hicache_jit_kernel(element_size=40)
    assert not can_use_hicache_jit_kernel(element_size=0)
    assert jit_kernel.can_use_hicache_jit_kernel is can_use_hicache_jit_kernel
    expected = {16: 4, 256: 4, 512: 4, 576: 2, 1024: 2, 1152: 1, 2048: 1, 4096: 1}
    assert {size: default_unroll(size) for size in expected} == expected
    assert [(s, u) for s, u, _ in families.HICACHE.prebuilt] == [
        (s, default_unroll(s)) for s in families.HICACHE_ROW_SIZES
    ]
    assert len(families.HICACHE.prebuilt) <= 12


def test_hicache_compiles_without_a_gpu() -> None:
    """One config (all four exports, int32 and int64) builds for sm_90a and exposes every symbol."""
    config = (128, 4, families.HICACHE_NUM_THREADS)
    module = jit_module(families.HICACHE, config, cuda_arch="9.0a")
    from jit_kernel.engine.spec import symbol_name

    for export in families.HICACHE.exports:
        assert module.implements_function(symbol_name(families.HICACHE, export, config))
    assert cache is not None
