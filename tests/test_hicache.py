"""hicache transfers: exact round trips on every layout (GPU), and every bad input (CPU and GPU);
the register kernel, the bulk-copy (TMA) kernel that page_size picks, the staged write-back to
page-first and page-unified host layouts, and the page-unified load-back.

Every GPU case fills the source with fresh random bytes and poisons the destination first, then
compares the whole destination byte for byte with a torch reference (rows that were not targeted
must keep the poison).
"""

from __future__ import annotations

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel import hicache as seed_hicache
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
from jit_kernel.ops import hicache as ops_hicache
from jit_kernel.ops import hicache_pages as ops_pages

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


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` viewed as bytes (the last dimension in bytes): indexing and assignment on
    it work for every dtype, fp8 included."""
    return t.cpu().contiguous().view(torch.uint8)


def reference(dst: torch.Tensor, idx_dst: torch.Tensor, src: torch.Tensor, idx_src: torch.Tensor) -> torch.Tensor:
    """``dst`` after ``dst[idx_dst[i]] = src[idx_src[i]]``, as bytes."""
    expected = as_bytes(dst).clone()
    expected[idx_dst.cpu().long()] = as_bytes(src)[idx_src.cpu().long()]
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
    assert (torch.bfloat16, 128) in ops._ONE_LAYER_KERNELS
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
    with pytest.raises(ValueError, match=r"(?s)'v_cache_src'.*Size mismatch"):
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
        with pytest.raises(ValueError, match=r"(?s)'v_cache_src'.*Size mismatch"):
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


# =============================================================================================
# SGLang's later hicache API (0.5.16 / 0.5.23): page_size and the bulk-copy (TMA) kernel, the
# staged write-back to page-first and page-unified host layouts, the page-unified load-back.

# Upstream's signatures, as released (0.5.23; the staged lf_pf forms since 0.5.16): name, parameter
# list, and the parameters we add (each with a default).
UPSTREAM_API: list[tuple[str, str, set[str]]] = [
    ("can_use_hicache_jit_kernel", "*, element_size, unroll=None, block_quota=None, page_size=None", set()),
    (
        "transfer_hicache_one_layer",
        "k_cache_dst, v_cache_dst, indices_dst, k_cache_src, v_cache_src, indices_src, *, element_dim=None, "
        "unroll=None, block_quota=None, page_size=None",
        set(),
    ),
    (
        "transfer_hicache_all_layer",
        "k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src, *, kv_cache_src_stride_bytes, "
        "kv_cache_dst_stride_bytes, element_size=None, unroll=None, block_quota=None, page_size=None",
        set(),
    ),
    (
        "transfer_hicache_one_layer_mla",
        "cache_dst, indices_dst, cache_src, indices_src, *, element_dim=None, unroll=None, block_quota=None, "
        "page_size=None",
        set(),
    ),
    (
        "transfer_hicache_all_layer_mla",
        "ptr_dst, indices_dst, ptr_src, indices_src, *, cache_src_stride_bytes=None, cache_dst_stride_bytes=None, "
        "element_size=None, unroll=None, block_quota=None, page_size=None",
        {"kv_cache_src_stride_bytes", "kv_cache_dst_stride_bytes"},
    ),
    ("can_use_write_back_jit_kernel", "*, element_size, unroll=None, block_quota=None", set()),
    (
        "transfer_hicache_all_layer_staged_lf_pf",
        "k_ptr_src, v_ptr_src, src_indices, dst_indices, staging_k, staging_v, dst_k, dst_v, *, page_size, "
        "element_size=None, unroll=None, block_quota=None",
        {"staged_copies"},
    ),
    (
        "transfer_hicache_all_layer_mla_staged_lf_pf",
        "ptr_src, src_indices, dst_indices, staging, dst, *, page_size, element_size=None, unroll=None, "
        "block_quota=None",
        {"staged_copies"},
    ),
    ("can_use_page_unified_load_back_jit_kernel", "*, group_bytes, block_quota=None", set()),
    (
        "transfer_hicache_one_layer_page_unified_lf",
        "k_cache_dst, v_cache_dst, src, src_indices, dst_indices, layer_id, *, block_quota=None",
        set(),
    ),
    (
        "transfer_hicache_one_layer_mla_page_unified_lf",
        "cache_dst, src, src_indices, dst_indices, layer_id, *, block_quota=None",
        set(),
    ),
    (
        "transfer_hicache_all_layer_staged_lf_page_unified",
        "k_ptr_src, v_ptr_src, src_pages, dst_pages, staging, dst",
        {"staged_copies"},
    ),
    (
        "transfer_hicache_all_layer_mla_staged_lf_page_unified",
        "ptr_src, src_pages, dst_pages, staging, dst",
        {"staged_copies"},
    ),
]


@pytest.mark.parametrize(("name", "params", "extras"), UPSTREAM_API, ids=[n for n, *_ in UPSTREAM_API])
def test_upstream_signature(name: str, params: str, extras: set[str]) -> None:
    """Every call upstream's signature accepts binds to the same parameters in jit_kernel.hicache
    (upstream's required stride keywords of the MLA all-layer form are checked at call time here)."""
    import inspect

    namespace: dict[str, object] = {}
    exec(f"def upstream({params}): pass", namespace)
    theirs = inspect.signature(namespace["upstream"]).parameters  # type: ignore[arg-type]
    ours = inspect.signature(getattr(seed_hicache, name)).parameters
    P = inspect.Parameter
    assert name in seed_hicache.__all__
    positional = [(p.name, p.kind, p.default) for p in theirs.values() if p.kind == P.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.kind, p.default) for p in list(ours.values())[: len(positional)]] == positional
    for p in theirs.values():
        if p.kind == P.KEYWORD_ONLY:
            assert ours[p.name].kind == P.KEYWORD_ONLY and ours[p.name].default == p.default, p.name
    added = {n for n in ours if n not in theirs}
    assert added == extras and all(ours[n].default in (None, False) for n in added)  # optional: off by default


def test_bulk_copy_rows_per_stage_and_kernel_choice() -> None:
    """Rows per stage: the largest power of two up to 128 whose rows fit 32 KiB. The bulk-copy kernel
    is taken exactly when a page size is given that is a multiple of it, on sm_90+, unless both caches
    of a one-layer transfer are on the GPU (the register kernel is faster there)."""
    rows = {16: 128, 256: 128, 512: 64, 576: 32, 1024: 32, 1152: 16, 2048: 16, 4096: 8, 32768: 1}
    assert {s: families.hicache_tma_stage_rows(s) for s in rows} == rows
    assert [families.hicache_tma_stage_rows(s) for s in (0, 40, 32784, -16)] == [0, 0, 0, 0]
    assert families.HICACHE_TMA.prebuilt == tuple((s, rows[s]) for s in families.HICACHE_ROW_SIZES)
    uses = seed_hicache.uses_bulk_copy_kernel
    assert uses(1024, 32, 9) and uses(1024, 64, 9) and uses(1024, 96, 10) and uses(4096, 8, 12)
    assert not uses(1024, 16, 9)  # half a stage: the register kernel
    assert not uses(1024, 48, 9)  # a page and a half per stage
    assert not uses(1024, None, 9)  # no page size: the register kernel, as before
    assert not uses(1024, 64, 8)  # sm_80/89 have no bulk copies
    assert not uses(1 << 16, 1 << 10, 9)  # a row larger than a stage
    assert uses(576, 64, 9) and not uses(576, 16, 9) and uses(256, 128, 9) and not uses(256, 64, 9)
    assert not uses(1024, 64, 9, device_to_device=True) and uses(1024, 64, 9, device_to_device=False)


@pytest.mark.parametrize(("arch", "page_size", "bulk"), [("9.0a", 64, True), ("9.0a", 16, False), ("8.0", 64, False)])
def test_the_op_launches_the_kernel_the_page_size_picks(
    monkeypatch: pytest.MonkeyPatch, arch: str, page_size: int, bulk: bool
) -> None:
    """The one-layer plans hand their call to the bulk-copy table (config (row bytes, rows per stage))
    or to the register kernel's, by page size and the target's arch; a one-layer transfer between two
    CUDA caches keeps the register kernel, and so does every all-layer transfer."""
    from jit_kernel.engine import target

    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", arch)
    target.clear()
    ops_hicache._ROUTES.clear()  # the kernel each shape took, decided for the arch of the process
    one, mla_op = ops_hicache.transfer_hicache_one_layer.op, ops_hicache.transfer_hicache_one_layer_mla.op
    try:
        with fake_cuda():
            k, idx = _cuda(256, 512), _idx(64)  # rows of 1 KiB: 32 per stage
            h = torch.zeros(256, 512, dtype=torch.bfloat16)  # a host cache (pinning is checked at launch)
            for _ in range(2):  # the second plan reads the route the first one filed
                launch = one.plan(h, h, idx, k, k, idx, page_size=page_size)
                mla = mla_op.plan(k, idx, h, idx, page_size=page_size)
                on_gpu = one.plan(k, k, idx, k, k, idx, page_size=page_size)
                mla_on_gpu = mla_op.plan(k, idx, k, idx, page_size=page_size)
        table = torch.zeros(2, dtype=torch.uint64)
        every = ops_hicache.transfer_hicache_all_layer.op.plan(
            table, table, idx, table, table, idx, kv_cache_src_stride_bytes=1024, kv_cache_dst_stride_bytes=1024,
            page_size=page_size,
        )  # fmt: skip
    finally:
        target.clear()
        ops_hicache._ROUTES.clear()
    if bulk:
        assert launch[0] is ops_hicache._ONE_LAYER_TMA_KERNELS and launch[1] == 1024
        assert mla[0] is ops_hicache._ONE_LAYER_MLA_TMA_KERNELS
        assert launch[0].config(launch[1]) == (1024, 32)
    else:
        assert launch[0] is ops_hicache._ONE_LAYER_KERNELS and launch[1] == (torch.bfloat16, 512)
        assert mla[0] is ops_hicache._ONE_LAYER_MLA_KERNELS
    assert every[0] is ops_hicache._ALL_LAYER_KERNELS and every[1] == (1024, 2, ops_hicache.HICACHE_NUM_THREADS)
    assert on_gpu[0] is ops_hicache._ONE_LAYER_KERNELS and on_gpu[1] == (torch.bfloat16, 512)
    assert mla_on_gpu[0] is ops_hicache._ONE_LAYER_MLA_KERNELS
    assert launch[2] == (h, h, idx, k, k, idx, ops_hicache.DEFAULT_BLOCK_QUOTA)  # the same launcher arguments


def test_bad_page_sizes_are_refused() -> None:
    with fake_cuda():
        k, idx = _cuda(16, 512), _idx()
        for bad in (0, -64, 1.5, "64", True):
            with pytest.raises(ValueError, match=r"transfer_hicache_one_layer: page_size must be a positive int"):
                transfer_hicache_one_layer(k, k, idx, k, k, idx, page_size=bad)  # type: ignore[arg-type]
            assert not can_use_hicache_jit_kernel(element_size=1024, page_size=bad)  # type: ignore[arg-type]
    assert can_use_hicache_jit_kernel(element_size=1024, page_size=64)
    assert can_use_hicache_jit_kernel(element_size=1024, page_size=16)  # the register kernel serves it
    assert can_use_hicache_jit_kernel(element_size=208, page_size=64)


def test_bulk_copy_path_refuses_what_the_register_path_refuses() -> None:
    """The bulk-copy launchers share the register kernel's checks (one owner): the same errors."""
    with fake_cuda():
        k, idx = _cuda(64, 512), _idx()
        with pytest.raises(ValueError, match=r"(?s)'indices_src'.*expected 8 but got 7"):
            transfer_hicache_one_layer(k, k, idx, k, k, _idx(7), page_size=64)
        with pytest.raises(TypeError, match=r"(?s)'v_cache_dst'.*Dtype mismatch: expected bfloat16 but got float16"):
            transfer_hicache_one_layer(k, _cuda(64, 512, dtype=torch.float16), idx, k, k, idx, page_size=64)
        with pytest.raises(ValueError, match="block_quota must be a positive int"):
            transfer_hicache_one_layer_mla(k, idx, k, idx, page_size=64, block_quota=0)
        table = torch.zeros(2, dtype=torch.uint64, device="cuda")
        with pytest.raises(ValueError, match="kv_cache_src_stride_bytes must be a multiple of 16 and >= the element"):
            transfer_hicache_all_layer(
                table, table, idx, table, table, idx, kv_cache_src_stride_bytes=512, kv_cache_dst_stride_bytes=1024,
                element_size=1024, page_size=64,
            )  # fmt: skip
        transfer_hicache_one_layer(k, k, idx, k, k, idx, page_size=64)  # valid: checks pass, nothing launches
        transfer_hicache_all_layer_mla(
            table, idx, table, idx, kv_cache_src_stride_bytes=1024, kv_cache_dst_stride_bytes=2048,
            element_size=1024, page_size=64,
        )  # fmt: skip


def test_paged_calls_remember_the_kernel_their_page_size_picked() -> None:
    """After one call with a page size, later calls with it take the kernel it chose without deciding
    again (bulk-copy for pages of 64 rows of 1 KiB to or from the host, register for 16 or between
    two CUDA caches); a page size the plan refuses is still refused, a float or bool equal to one
    it took included."""
    ops_hicache._ROUTES.clear()
    with fake_cuda():
        k, idx = _cuda(64, 512), _idx()
        h = torch.zeros(64, 512, dtype=torch.bfloat16)  # a host cache
        for page_size in (64, 16):
            for _ in range(2):  # the second call reads the remembered route
                transfer_hicache_one_layer(k, k, idx, h, h, idx, page_size=page_size)
                transfer_hicache_one_layer(k, k, idx, k, k, idx, page_size=page_size)
        transfer_hicache_one_layer_mla(h, idx, k, idx, page_size=64)
        transfer_hicache_one_layer_mla(k, idx, k, idx, page_size=64)
        for bad in (64.0, True):
            with pytest.raises(ValueError, match="page_size must be a positive int"):
                transfer_hicache_one_layer(k, k, idx, k, k, idx, page_size=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"(?s)'indices_src'.*expected 8 but got 7"):
            transfer_hicache_one_layer(k, k, idx, k, k, _idx(7), page_size=64)  # a remembered route's launcher
    routes = ops_hicache._ROUTES
    register, mla_register = ops_hicache._ONE_LAYER_KERNELS, ops_hicache._ONE_LAYER_MLA_KERNELS
    assert routes[("kv", torch.bfloat16, 512, 64, False)] == (ops_hicache._ONE_LAYER_TMA_KERNELS, 1024)
    assert routes[("kv", torch.bfloat16, 512, 64, True)] == (register, (torch.bfloat16, 512))
    assert routes[("kv", torch.bfloat16, 512, 16, False)] == (register, (torch.bfloat16, 512))
    assert routes[("kv", torch.bfloat16, 512, 16, True)] == (register, (torch.bfloat16, 512))
    assert routes[("mla", torch.bfloat16, 512, 64, False)] == (ops_hicache._ONE_LAYER_MLA_TMA_KERNELS, 1024)
    assert routes[("mla", torch.bfloat16, 512, 64, True)] == (mla_register, (torch.bfloat16, 512))


def test_write_back_and_load_back_capability_queries() -> None:
    can_write = seed_hicache.can_use_write_back_jit_kernel
    can_load = seed_hicache.can_use_page_unified_load_back_jit_kernel
    assert can_write(element_size=1024) and can_write(element_size=576, unroll=2, block_quota=8)
    assert (
        not can_write(element_size=40) and not can_write(element_size=0) and not can_write(element_size=1024, unroll=3)
    )
    assert can_load(group_bytes=256) and can_load(group_bytes=16, block_quota=2)
    assert not can_load(group_bytes=24) and not can_load(group_bytes=256, block_quota=0)
    assert not can_load(group_bytes=256.0)  # type: ignore[arg-type]


def _host(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


def test_bad_staged_lf_pf_inputs() -> None:
    """Page-first write-back: every rule checked by the launcher, naming the argument, before any
    CUDA call (fake tensors)."""
    fn = seed_hicache.transfer_hicache_all_layer_staged_lf_pf
    mla = seed_hicache.transfer_hicache_all_layer_mla_staged_lf_pf
    with fake_cuda():
        table = torch.zeros(4, dtype=torch.uint64, device="cuda")
        src, dst = _idx(64), torch.zeros(64, dtype=torch.int64)
        staging = _cuda(32, 4, 8, 64)  # [tokens, layers, heads, dim]: rows of 1 KiB
        host = _host(256, 4, 8, 64)
        fn(table, table, src, dst, staging, staging, host, host, page_size=16)  # valid
        mla(table, src, dst, staging, host, page_size=16, element_size=1024)  # valid
        with pytest.raises(ValueError, match=r"(?s)'dst_indices'.*Device mismatch: expected cpu but got cuda"):
            fn(table, table, src, _idx(64), staging, staging, host, host, page_size=16)
        with pytest.raises(TypeError, match=r"(?s)'dst_indices'.*Dtype mismatch: expected int64 but got int32"):
            fn(table, table, src, dst.int(), staging, staging, host, host, page_size=16)
        with pytest.raises(ValueError, match=r"(?s)'dst_indices'.*expected 64 but got 48"):
            fn(table, table, src, dst[:48], staging, staging, host, host, page_size=16)
        with pytest.raises(TypeError, match=r"(?s)'staging_v'.*Dtype mismatch: expected bfloat16 but got float16"):
            fn(table, table, src, dst, staging, staging.half(), host, host, page_size=16)
        with pytest.raises(ValueError, match=r"(?s)'dst_v'.*expected 4 but got 2"):
            fn(table, table, src, dst, staging, staging, host, _host(256, 2, 8, 64), page_size=16)
        with pytest.raises(ValueError, match=r"(?s)'dst_k'.*Device mismatch"):
            fn(table, table, src, dst, staging, staging, staging, host, page_size=16)
        with pytest.raises(ValueError, match=r"(?s)'k_ptr_src'.*expected 4 but got 3"):
            fn(
                torch.zeros(3, dtype=torch.uint64, device="cuda"),
                table,
                src,
                dst,
                staging,
                staging,
                host,
                host,
                page_size=16,
            )
        with pytest.raises(ValueError, match=r"'src_indices' holds 64 tokens, not whole pages of page_size=24"):
            fn(table, table, src, dst, staging, staging, host, host, page_size=24)
        with pytest.raises(ValueError, match=r"'staging_k' holds 32 tokens, less than one page of page_size=64"):
            fn(table, table, src, dst, staging, staging, host, host, page_size=64)
        with pytest.raises(ValueError, match=r"element_size=512 does not match the rows of 'staging'"):
            mla(table, src, dst, staging, host, page_size=16, element_size=512)
        odd = _cuda(32, 4, 20)
        with pytest.raises(ValueError, match=r"rows of 'staging' must be a positive multiple of 16 bytes, got 40"):
            mla(table, src, dst, odd, _host(64, 4, 20), page_size=16)
        with pytest.raises(ValueError, match="page_size must be a positive int"):
            mla(table, src, dst, staging, host, page_size=0)
        with pytest.raises(ValueError, match="unroll must be one of"):
            mla(table, src, dst, staging, host, page_size=16, unroll=3)
        with pytest.raises(ValueError, match=r"staging must be \[tokens, layers, \.\.\.\]"):
            mla(table, src, dst, _cuda(64), host, page_size=16)
        with pytest.raises(TypeError, match=r"dst_k must be a torch\.Tensor, got list"):
            fn(table, table, src, dst, staging, staging, [1], host, page_size=16)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="page_size"):
        mla(table, src, dst, staging, host)  # type: ignore[call-arg]


def test_bad_page_unified_write_back_inputs() -> None:
    fn = seed_hicache.transfer_hicache_all_layer_staged_lf_page_unified
    mla = seed_hicache.transfer_hicache_all_layer_mla_staged_lf_page_unified
    with fake_cuda():
        table = torch.zeros(3, dtype=torch.uint64, device="cuda")
        src, dst = _idx(5), torch.zeros(5, dtype=torch.int64)
        staging = _cuda(2, 2, 3, 2, 16, 2, 64)  # (page, group, layer, kv, page_size, head, dim)
        host = _host(10, 2, 3, 2, 16, 2, 64)
        fn(table, table, src, dst, staging, host)  # valid
        mla(table, src, dst, _cuda(2, 3, 16, 576, dtype=torch.uint8), _host(10, 3, 16, 576, dtype=torch.uint8))
        with pytest.raises(ValueError, match=r"(?s)'staging'.*Rank mismatch: expected 7 but got 6"):
            fn(table, table, src, dst, _cuda(2, 2, 3, 2, 16, 128), host)
        with pytest.raises(ValueError, match=r"(?s)'dst'.*expected 2 but got 3"):
            fn(table, table, src, dst, staging, _host(10, 2, 3, 3, 16, 2, 64))
        with pytest.raises(ValueError, match=r"(?s)'dst'.*expected 16 but got 8"):
            fn(table, table, src, dst, staging, _host(10, 2, 3, 2, 8, 2, 64))
        with pytest.raises(TypeError, match=r"(?s)'dst'.*Dtype mismatch: expected bfloat16 but got float16"):
            fn(table, table, src, dst, staging, _host(10, 2, 3, 2, 16, 2, 64, dtype=torch.float16))
        with pytest.raises(ValueError, match=r"(?s)'dst'.*Device mismatch"):
            fn(table, table, src, dst, staging, staging)
        with pytest.raises(ValueError, match=r"(?s)'dst_pages'.*Device mismatch: expected cpu but got cuda"):
            fn(table, table, src, _idx(5), staging, host)
        with pytest.raises(ValueError, match=r"(?s)'dst_pages'.*expected 5 but got 4"):
            fn(table, table, src, dst[:4], staging, host)
        with pytest.raises(ValueError, match=r"(?s)'v_ptr_src'.*expected 3 but got 2"):
            fn(table, torch.zeros(2, dtype=torch.uint64, device="cuda"), src, dst, staging, host)
        with pytest.raises(
            ValueError, match=r"token row \(heads per group x dim\) must be a multiple of 16 bytes, got 12"
        ):
            fn(table, table, src, dst, _cuda(2, 2, 3, 2, 16, 2, 3), _host(10, 2, 3, 2, 16, 2, 3))
        with pytest.raises(ValueError, match="'staging' must hold at least one page"):
            fn(table, table, src, dst, _cuda(0, 2, 3, 2, 16, 2, 64), host)
        with pytest.raises(ValueError, match=r"(?s)'staging'.*Rank mismatch: expected 4 but got 7"):
            mla(table, src, dst, staging, host)


def test_bad_page_unified_load_back_inputs() -> None:
    fn = seed_hicache.transfer_hicache_one_layer_page_unified_lf
    mla = seed_hicache.transfer_hicache_one_layer_mla_page_unified_lf
    with fake_cuda():
        k = _cuda(100, 4, 64)  # (token, head, dim): 2 groups of 2 heads
        src = _host(10, 2, 3, 2, 16, 2, 64)
        idx = _idx(8)
        fn(k, k, src, idx, idx, 2)  # valid
        fn(k.view(100, 256), k.view(100, 256), src, idx, idx, 0, block_quota=1)  # (token, head * dim) too
        mla(_cuda(100, 1, 576, dtype=torch.uint8), _host(10, 3, 16, 576, dtype=torch.uint8), idx, idx, 1)
        with pytest.raises(ValueError, match=r"layer_id=3 is out of range: 'src' holds 3 layers"):
            fn(k, k, src, idx, idx, 3)
        with pytest.raises(ValueError, match=r"layer_id=-1 is out of range"):
            fn(k, k, src, idx, idx, -1)
        with pytest.raises(ValueError, match=r"rows of 'k_cache_dst' hold 256 bytes, but a token of 'src' holds 512"):
            fn(_cuda(100, 2, 64), _cuda(100, 2, 64), src, idx, idx, 0)
        with pytest.raises(ValueError, match=r"(?s)'src'.*Rank mismatch: expected 7 but got 4"):
            fn(k, k, _host(10, 3, 16, 256), idx, idx, 0)
        with pytest.raises(ValueError, match=r"(?s)'src'.*expected 2 but got 1"):
            fn(k, k, _host(10, 2, 3, 1, 16, 2, 64), idx, idx, 0)
        with pytest.raises(TypeError, match=r"(?s)'dst_indices'.*Dtype mismatch: expected int64 but got int32"):
            fn(k, k, src, idx, idx.int(), 0)
        with pytest.raises(ValueError, match=r"(?s)'dst_indices'.*expected 8 but got 7"):
            fn(k, k, src, idx, _idx(7), 0)
        with pytest.raises(ValueError, match=r"(?s)'src_indices'.*Device mismatch: expected cuda:0 but got cpu"):
            fn(k, k, src, torch.zeros(8, dtype=torch.int64), idx, 0)
        with pytest.raises(ValueError, match=r"(?s)'v_cache_dst'.*Device mismatch"):
            fn(k, _host(100, 4, 64), src, idx, idx, 0)
        with pytest.raises(ValueError, match="block_quota must be a positive int"):
            fn(k, k, src, idx, idx, 0, block_quota=0)
        with pytest.raises(ValueError, match=r"(?s)'src'.*Rank mismatch: expected 4 but got 7"):
            mla(k, src, idx, idx, 0)


def test_load_back_ops_are_registered_with_fakes() -> None:
    """torch.ops.jit_kernel.transfer_hicache_one_layer(_mla)_page_unified_lf declare the caches they
    write, and their fake implementations run the launcher's checks."""
    for name, written in (
        ("transfer_hicache_one_layer_page_unified_lf", ["k_cache_dst", "v_cache_dst"]),
        ("transfer_hicache_one_layer_mla_page_unified_lf", ["cache_dst"]),
    ):
        schema = getattr(torch.ops.jit_kernel, name).default._schema
        assert [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write] == written
    op = torch.ops.jit_kernel.transfer_hicache_one_layer_page_unified_lf
    with fake_cuda():
        k, v, src, idx = _cuda(100, 4, 64), _cuda(100, 4, 64), _host(10, 2, 3, 2, 16, 2, 64), _idx(8)
        op(k, v, src, idx, idx, 1)
        with pytest.raises(ValueError, match=r"layer_id=3 is out of range"):
            op(k, v, src, idx, idx, 3)


def test_bulk_copy_and_page_families_compile_without_a_gpu() -> None:
    """A bulk-copy config (all four exports, int32 and int64, one-layer and table forms) and the
    hicache_pages family build for sm_90a and expose every symbol (the prebuilt library is the proof where
    it holds them for sm_90a; see ``assert_builds_for_arch``)."""
    for spec, config in ((families.HICACHE_TMA, (1024, 32)), (families.HICACHE_PAGES, ())):
        assert_builds_for_arch(spec, config, "9.0a")


# -- GPU: the bulk-copy kernel -----------------------------------------------------------------


def page_indices(num_pages: int, total_pages: int, page_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Whole pages in random order: page p is rows p * page_size ... p * page_size + page_size - 1."""
    pages = torch.randperm(total_pages)[:num_pages]
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten().to(dtype=dtype, device="cuda")


def _tma_used(element_size: int) -> bool:
    return (element_size, families.hicache_tma_stage_rows(element_size)) in ops_hicache._HICACHE_TMA.decisions


def paged_case(
    direction: str,
    element_size: int,
    page_size: int,
    num_pages: int,
    index_dtype: torch.dtype,
    *,
    dtype: torch.dtype | None = None,
    paged_src: bool = True,
    paged_dst: bool = True,
    block_quota: int | None = None,
    mla: bool = False,
    broken_dst_pages: int = 0,
) -> None:
    """One layer moved with ``page_size`` given: whole pages (or random rows on one side), every
    destination row compared byte for byte."""
    src_where, dst_where = DIRECTIONS[direction]
    dtype = dtype or DTYPE_FOR_SIZE.get(element_size, torch.bfloat16)
    pages_src, pages_dst = num_pages + 5, num_pages + 9
    n = num_pages * page_size
    rows_src, rows_dst = pages_src * page_size, pages_dst * page_size
    caches = 1 if mla else 2
    src = [make_cache(rows_src, element_size, src_where, dtype) for _ in range(caches)]
    dst = [make_cache(rows_dst, element_size, dst_where, dtype, poison=True) for _ in range(caches)]
    idx_src = (
        page_indices(num_pages, pages_src, page_size, index_dtype)
        if paged_src
        else make_indices(n, rows_src, index_dtype, unique=False)
    )
    idx_dst = (
        page_indices(num_pages, pages_dst, page_size, index_dtype)
        if paged_dst
        else make_indices(n, rows_dst, index_dtype, unique=True)
    )
    if broken_dst_pages:  # every broken_dst_pages-th destination page written in reverse row order
        by_page = idx_dst.view(num_pages, page_size)
        by_page[::broken_dst_pages] = by_page[::broken_dst_pages].flip(1)
    expected = [reference(d, idx_dst, s, idx_src) for d, s in zip(dst, src, strict=True)]
    if mla:
        transfer_hicache_one_layer_mla(dst[0], idx_dst, src[0], idx_src, page_size=page_size, block_quota=block_quota)
    else:
        transfer_hicache_one_layer(
            dst[0], dst[1], idx_dst, src[0], src[1], idx_src, page_size=page_size, block_quota=block_quota
        )
    torch.cuda.synchronize()
    for actual, want in zip(dst, expected, strict=True):
        assert_same_bytes(actual, want)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("element_size", "page_size"), [(256, 128), (576, 32), (1024, 64), (1152, 16), (4096, 8)])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_bulk_copy_page_transfers(direction: str, element_size: int, page_size: int, index_dtype: torch.dtype) -> None:
    """Whole pages (an odd count, random order) through the bulk-copy kernel, every row size it is
    prebuilt for (576 B: fp8 MLA rows, as uint8), both index dtypes."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    paged_case(direction, element_size, page_size, 7, index_dtype)
    if direction != "d2d":  # between two CUDA caches the register kernel moves them
        assert _tma_used(element_size)


@pytest.mark.gpu
@pytest.mark.parametrize(("paged_src", "paged_dst"), [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_bulk_copy_kernel_is_exact_for_any_indices(direction: str, paged_src: bool, paged_dst: bool) -> None:
    """A page size that tiles the stages, with indices that are not whole pages on one side or both:
    the kernel copies row by row there, and every row still lands."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    paged_case(direction, 1024, 64, 9, torch.int64, paged_src=paged_src, paged_dst=paged_dst)


@pytest.mark.gpu
@pytest.mark.parametrize("broken_dst_pages", [2, 3, 7])
@pytest.mark.parametrize("block_quota", [1, 2])
@pytest.mark.parametrize("direction", ["d2h", "d2d"])
def test_bulk_copy_mixes_page_stores_and_row_stores(direction: str, block_quota: int, broken_dst_pages: int) -> None:
    """Whole destination pages between pages written in another row order: a block's bulk stores in
    flight are drained before it stores a chunk row by row, and every stage is released once."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    paged_case(direction, 1024, 32, 41, torch.int64, block_quota=block_quota, broken_dst_pages=broken_dst_pages)


@pytest.mark.gpu
@pytest.mark.parametrize("block_quota", [1, 3, 132])
@pytest.mark.parametrize("mla", [False, True])
def test_bulk_copy_quota_and_mla(block_quota: int, mla: bool) -> None:
    """One block walks every chunk (the ring wraps many times); many blocks split them."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    paged_case("d2d", 1152, 64, 33, torch.int32, mla=mla, block_quota=block_quota, dtype=torch.bfloat16)
    paged_case("h2d", 576, 32, 5, torch.int64, mla=mla, block_quota=block_quota, dtype=torch.float8_e4m3fn)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_bulk_copy_strided_caches(direction: str) -> None:
    """K and V interleaved ([rows, 2, heads, dim]: row stride twice the row): whole pages are runs of
    index positions but not of bytes, so each row is its own bulk copy and store."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    src_where, dst_where = DIRECTIONS[direction]
    heads, dim, page_size = 4, 128, 32
    src = make_cache(40 * page_size * 2 * heads, dim * 2, src_where).view(40 * page_size, 2, heads, dim)
    dst = make_cache(50 * page_size * 2 * heads, dim * 2, dst_where, poison=True).view(50 * page_size, 2, heads, dim)
    idx_src = page_indices(11, 40, page_size, torch.int32)
    idx_dst = page_indices(11, 50, page_size, torch.int32)
    expected = reference(dst, idx_dst, src, idx_src)
    transfer_hicache_one_layer(
        dst[:, 0], dst[:, 1], idx_dst, src[:, 0], src[:, 1], idx_src, element_dim=heads * dim, page_size=page_size
    )
    torch.cuda.synchronize()
    assert_same_bytes(dst, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("direction", ["d2h", "h2d", "d2d"])
def test_paged_all_layer(direction: str, mla: bool) -> None:
    """Every layer in one launch with a page size: contiguous rows on the source, a wider stride on
    the destination (a page-first host layout), whole pages of 32 rows; the register kernel runs."""
    ops_hicache._HICACHE_TMA.decisions.clear()
    src_where, dst_where = DIRECTIONS[direction]
    layers, element_size, page_size = 3, 1024, 32
    src_stride, dst_stride = 1024, 2048
    k_src, k_src_table = _layers(layers, 20 * page_size, element_size, src_where, stride=src_stride)
    k_dst, k_dst_table = _layers(layers, 30 * page_size, element_size, dst_where, stride=dst_stride, poison=True)
    idx_src = page_indices(9, 20, page_size, torch.int64)
    idx_dst = page_indices(9, 30, page_size, torch.int64)
    expected_k = [_all_layer_expected(d, idx_dst, s, idx_src, element_size) for d, s in zip(k_dst, k_src, strict=True)]
    if mla:
        seed_hicache.transfer_hicache_all_layer_mla(
            k_dst_table, idx_dst, k_src_table, idx_src, cache_src_stride_bytes=src_stride,
            cache_dst_stride_bytes=dst_stride, element_size=element_size, page_size=page_size,
        )  # fmt: skip
    else:
        v_src, v_src_table = _layers(layers, 20 * page_size, element_size, src_where, stride=src_stride)
        v_dst, v_dst_table = _layers(layers, 30 * page_size, element_size, dst_where, stride=dst_stride, poison=True)
        expected_v = [
            _all_layer_expected(d, idx_dst, s, idx_src, element_size) for d, s in zip(v_dst, v_src, strict=True)
        ]
        transfer_hicache_all_layer(
            k_dst_table, v_dst_table, idx_dst, k_src_table, v_src_table, idx_src, kv_cache_src_stride_bytes=src_stride,
            kv_cache_dst_stride_bytes=dst_stride, element_size=element_size, page_size=page_size,
        )  # fmt: skip
    torch.cuda.synchronize()
    for actual, want in zip(k_dst, expected_k, strict=True):
        assert_same_bytes(actual, want)
    if not mla:
        for actual, want in zip(v_dst, expected_v, strict=True):
            assert_same_bytes(actual, want)
    assert not _tma_used(1024)


@pytest.mark.gpu
def test_page_size_that_does_not_tile_a_stage_takes_the_register_kernel() -> None:
    """Pages of 16 rows of 1 KiB (a stage holds 32): the register kernel, with the same result."""
    ops_hicache._HICACHE_TMA.decisions.clear()
    paged_case("d2d", 1024, 16, 13, torch.int64)
    paged_case("h2d", 1024, 48, 3, torch.int64)
    assert not _tma_used(1024)


@pytest.mark.gpu
def test_bulk_copy_empty_and_on_the_current_stream() -> None:
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk-copy kernel needs sm_90")
    k = make_cache(64, 1024, "cuda", poison=True)
    before = k.clone()
    empty = torch.empty(0, dtype=torch.int64, device="cuda")
    transfer_hicache_one_layer(k, k.clone(), empty, k.clone(), k.clone(), empty, page_size=32)
    torch.cuda.synchronize()
    assert torch.equal(k, before)
    k_src, v_src = (make_cache(4096, 1024, "cuda", torch.float16) for _ in range(2))
    k_dst, v_dst = (make_cache(4096, 1024, "cpu", torch.float16, poison=True) for _ in range(2))
    idx = torch.arange(4096, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)
        k_src.fill_(3.0)
        transfer_hicache_one_layer(k_dst, v_dst, idx, k_src, v_src, idx, page_size=64)
    stream.synchronize()
    assert bool((k_dst == 3.0).all())
    assert_same_bytes(v_dst, v_src)


# -- GPU: staged write-back, page-first --------------------------------------------------------


def _pool(layers: int, tokens: int, row_shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    """Layer-first device pool: one [tokens, *row_shape] buffer of random bytes per layer."""
    row_bytes = int(torch.tensor(row_shape).prod()) * torch.empty((), dtype=dtype).element_size()
    return [make_cache(tokens, row_bytes, "cuda", dtype).view(tokens, *row_shape) for _ in range(layers)]


def _table(layers: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device="cuda")


def _host_poison(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A pinned host tensor of ``shape`` filled with the poison byte."""
    elements = int(torch.tensor(shape).prod())
    raw = torch.full((elements * torch.empty((), dtype=dtype).element_size(),), POISON, dtype=torch.uint8)
    return raw.pin_memory().view(dtype).view(shape)


def lf_pf_expected(host: torch.Tensor, pool: list[torch.Tensor], src_tok: torch.Tensor, dst_tok: torch.Tensor, ps: int):
    """host[dst page start + t, l] = pool[l][src page start + t], page by page (first index of each
    page), as bytes."""
    out = as_bytes(host).clone()
    src_starts, dst_starts = src_tok.cpu()[::ps].long(), dst_tok.cpu()[::ps].long()
    for s, d in zip(src_starts.tolist(), dst_starts.tolist(), strict=True):
        for layer, buf in enumerate(pool):
            out[d : d + ps, layer] = as_bytes(buf[s : s + ps])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("mla", "row_shape", "dtype"),
    [(False, (8, 64), torch.bfloat16), (False, (2, 128), torch.float8_e4m3fn), (True, (576,), torch.uint8),
     (True, (576,), torch.bfloat16)],
)  # fmt: skip
@pytest.mark.parametrize(
    ("page_size", "num_pages", "staging_pages"), [(16, 7, 3), (64, 5, 8), (1, 33, 4), (1, 300, 64)]
)
@pytest.mark.parametrize("staged_copies", [False, True], ids=["direct", "staged"])
def test_staged_lf_pf(
    page_size: int, num_pages: int, staging_pages: int, mla: bool, row_shape: tuple[int, ...], dtype: torch.dtype,
    index_dtype: torch.dtype, staged_copies: bool,
) -> None:  # fmt: skip
    """Whole pages of every layer from layer-first device pools to a page-first pinned host cache, by
    direct stores (the default) and through the staging buffer and the copy engine: an odd page
    count, more pages than one direct launch takes (256), transfers larger than the staging buffer
    (chunks), host pages in a random order with some runs of consecutive pages (one copy each)."""
    layers, pool_pages, host_pages = 3, num_pages + 6, 2 * num_pages + 4
    k_pool = _pool(layers, pool_pages * page_size, row_shape, dtype)
    v_pool = _pool(layers, pool_pages * page_size, row_shape, dtype)
    src_tok = page_indices(num_pages, pool_pages, page_size, index_dtype)
    run = num_pages // 2  # consecutive host pages at the end (one copy), then distinct random ones
    rest = torch.randperm(host_pages - run)[: num_pages - run]
    dst_pages = torch.cat([torch.arange(host_pages - run, host_pages), rest])
    dst_tok = (dst_pages[:, None] * page_size + torch.arange(page_size)).flatten()
    shape = (host_pages * page_size, layers, *row_shape)
    host_k, host_v = _host_poison(shape, dtype), _host_poison(shape, dtype)
    staging_k = torch.empty(staging_pages * page_size, layers, *row_shape, dtype=dtype, device="cuda")
    staging_v = torch.empty_like(staging_k)
    want_k = lf_pf_expected(host_k, k_pool, src_tok, dst_tok, page_size)
    want_v = lf_pf_expected(host_v, v_pool, src_tok, dst_tok, page_size)
    if staged_copies and mla:
        ops_pages.transfer_hicache_all_layer_mla_staged_lf_pf(
            _table(k_pool), src_tok, dst_tok, staging_k, host_k, page_size=page_size, staged_copies=True
        )
    elif staged_copies:
        ops_pages.transfer_hicache_all_layer_staged_lf_pf(
            _table(k_pool), _table(v_pool), src_tok, dst_tok, staging_k, staging_v, host_k, host_v,
            page_size=page_size, staged_copies=True,
        )  # fmt: skip
    elif mla:
        seed_hicache.transfer_hicache_all_layer_mla_staged_lf_pf(
            _table(k_pool), src_tok, dst_tok, staging_k, host_k, page_size=page_size
        )
    else:
        seed_hicache.transfer_hicache_all_layer_staged_lf_pf(
            _table(k_pool), _table(v_pool), src_tok, dst_tok, staging_k, staging_v, host_k, host_v,
            page_size=page_size,
        )  # fmt: skip
    torch.cuda.synchronize()
    assert_same_bytes(host_k.reshape(host_k.shape[0], -1), want_k.reshape(want_k.shape[0], -1))
    if not mla:
        assert_same_bytes(host_v.reshape(host_v.shape[0], -1), want_v.reshape(want_v.shape[0], -1))


@pytest.mark.gpu
def test_staged_lf_pf_refuses_host_pages_out_of_range_before_writing() -> None:
    layers, ps = 2, 16
    pool = _pool(layers, 8 * ps, (256,), torch.uint8)
    host = _host_poison((4 * ps, layers, 256), torch.uint8)
    staging = torch.empty(2 * ps, layers, 256, dtype=torch.uint8, device="cuda")
    src_tok = page_indices(2, 8, ps, torch.int64)
    for start in (-ps, 3 * ps + 1):
        dst_tok = torch.cat([torch.arange(ps), torch.arange(ps) + start])
        with pytest.raises(ValueError, match=rf"dst_indices\[16\] = {start} starts a page of 16 tokens outside 'dst'"):
            seed_hicache.transfer_hicache_all_layer_mla_staged_lf_pf(
                _table(pool), src_tok, dst_tok, staging, host, page_size=ps
            )
    torch.cuda.synchronize()
    assert bool((host.view(torch.uint8) == POISON).all())  # nothing was copied
    pageable = torch.zeros(4 * ps, layers, 256, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"'dst' is in pageable"):
        seed_hicache.transfer_hicache_all_layer_mla_staged_lf_pf(
            _table(pool), src_tok, torch.arange(2 * ps), staging, pageable, page_size=ps
        )


@pytest.mark.gpu
def test_staged_lf_pf_in_a_cuda_graph() -> None:
    """The direct write-back captured in a CUDA graph: each replay writes the captured pages from the
    pools' current contents."""
    layers, ps = 2, 16
    pool = _pool(layers, 8 * ps, (256,), torch.uint8)
    host = _host_poison((6 * ps, layers, 256), torch.uint8)
    staging = torch.empty(ps, layers, 256, dtype=torch.uint8, device="cuda")
    src_tok = page_indices(3, 8, ps, torch.int64)
    dst_tok = (torch.tensor([4, 0, 2])[:, None] * ps + torch.arange(ps)).flatten()
    table = _table(pool)
    write = seed_hicache.transfer_hicache_all_layer_mla_staged_lf_pf
    write(table, src_tok, dst_tok, staging, host, page_size=ps)  # loads the module outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        write(table, src_tok, dst_tok, staging, host, page_size=ps)
    for _ in range(2):
        for layer in pool:
            layer.random_(0, 255)
        want = lf_pf_expected(host, pool, src_tok, dst_tok, ps)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bytes(host.reshape(host.shape[0], -1), want.reshape(want.shape[0], -1))


# -- GPU: page-unified write-back and load-back ------------------------------------------------


def pu_expected_pages(k_pool, v_pool, src_pages, groups, heads, ps) -> torch.Tensor:
    """The page-unified pages of ``src_pages``, as bytes: (page, group, layer, kv, t, head, dim bytes)."""
    pages = []
    for p in src_pages.cpu().long().tolist():
        per_layer = []
        for k, v in zip(k_pool, v_pool, strict=True):
            kv = torch.stack([as_bytes(k[p * ps : (p + 1) * ps]), as_bytes(v[p * ps : (p + 1) * ps])])  # (2, t, H, D)
            kv = kv.view(2, ps, groups, heads, -1).permute(2, 0, 1, 3, 4)  # (g, 2, t, h, d)
            per_layer.append(kv)
        pages.append(torch.stack(per_layer, dim=1))  # (g, l, 2, t, h, d)
    return torch.stack(pages)


@pytest.mark.gpu
@pytest.mark.parametrize("staged_copies", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(("dtype", "dim"), [(torch.bfloat16, 64), (torch.float8_e4m3fn, 128)])
def test_page_unified_write_back_and_load_back(
    dtype: torch.dtype, dim: int, index_dtype: torch.dtype, staged_copies: bool
) -> None:
    """Write 7 pages (staging holds 3: three chunks on the staging path) to random host pages in the
    page-unified layout, by direct stores and through the staging buffer, compare with the reference
    permutation, then load each layer back into a poisoned device pool (tokens in random order,
    across pages) and compare rows."""
    groups, heads, layers, ps, pool_pages, host_pages = 2, 2, 3, 16, 12, 20
    H = groups * heads
    k_pool = _pool(layers, pool_pages * ps, (H, dim), dtype)
    v_pool = _pool(layers, pool_pages * ps, (H, dim), dtype)
    src_pages = torch.randperm(pool_pages)[:7].to(dtype=index_dtype, device="cuda")
    dst_pages = torch.randperm(host_pages)[:7]
    page_shape = (groups, layers, 2, ps, heads, dim)
    host = _host_poison((host_pages, *page_shape), dtype)
    staging = torch.empty(3, *page_shape, dtype=dtype, device="cuda")
    want = as_bytes(host).clone()
    want[dst_pages] = pu_expected_pages(k_pool, v_pool, src_pages, groups, heads, ps)
    if staged_copies:
        ops_pages.transfer_hicache_all_layer_staged_lf_page_unified(
            _table(k_pool), _table(v_pool), src_pages, dst_pages, staging, host, staged_copies=True
        )
    else:
        seed_hicache.transfer_hicache_all_layer_staged_lf_page_unified(
            _table(k_pool), _table(v_pool), src_pages, dst_pages, staging, host
        )
    torch.cuda.synchronize()
    assert_same_bytes(host.reshape(host_pages, -1), want.reshape(host_pages, -1))

    # load-back: host tokens of the written pages, in random order, into random device rows
    host_tok = (dst_pages[:, None] * ps + torch.arange(ps)).flatten()
    host_tok = host_tok[torch.randperm(host_tok.numel())][:61]
    dev_tok = torch.randperm(pool_pages * ps)[:61]
    written = dict(zip(dst_pages.tolist(), src_pages.cpu().long().tolist(), strict=True))  # host page -> pool page
    for layer in range(layers):
        k_dst = make_cache(pool_pages * ps, H * dim * k_pool[0].element_size(), "cuda", dtype, poison=True)
        v_dst = make_cache(pool_pages * ps, H * dim * k_pool[0].element_size(), "cuda", dtype, poison=True)
        k_dst, v_dst = k_dst.view(-1, H, dim), v_dst.view(-1, H, dim)
        want_k, want_v = as_bytes(k_dst).clone(), as_bytes(v_dst).clone()
        for s, d in zip(host_tok.tolist(), dev_tok.tolist(), strict=True):
            pool_token = written[s // ps] * ps + s % ps
            want_k[d], want_v[d] = as_bytes(k_pool[layer][pool_token]), as_bytes(v_pool[layer][pool_token])
        seed_hicache.transfer_hicache_one_layer_page_unified_lf(
            k_dst, v_dst, host, host_tok.to(dtype=index_dtype, device="cuda"),
            dev_tok.to(dtype=index_dtype, device="cuda"), layer,
        )  # fmt: skip
        torch.cuda.synchronize()
        assert_same_bytes(k_dst.reshape(k_dst.shape[0], -1), want_k.reshape(want_k.shape[0], -1))
        assert_same_bytes(v_dst.reshape(v_dst.shape[0], -1), want_v.reshape(want_v.shape[0], -1))


@pytest.mark.gpu
@pytest.mark.parametrize("staged_copies", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
def test_page_unified_mla_write_back_and_load_back(dtype: torch.dtype, staged_copies: bool) -> None:
    """MLA pages (page, layer, page_size, dim): 576 values a token (fp8 as uint8, or bf16), 5 pages
    (through a 2-page staging buffer on the staging path), then each layer back."""
    layers, ps, pool_pages, host_pages, dim = 4, 16, 9, 11, 576
    pool = _pool(layers, pool_pages * ps, (dim,), dtype)
    src_pages = torch.randperm(pool_pages)[:5].cuda()
    dst_pages = torch.randperm(host_pages)[:5]
    host = _host_poison((host_pages, layers, ps, dim), dtype)
    staging = torch.empty(2, layers, ps, dim, dtype=dtype, device="cuda")
    want = as_bytes(host).clone()
    for sp, dp in zip(src_pages.tolist(), dst_pages.tolist(), strict=True):
        want[dp] = torch.stack([as_bytes(buf[sp * ps : (sp + 1) * ps]) for buf in pool])
    if staged_copies:
        ops_pages.transfer_hicache_all_layer_mla_staged_lf_page_unified(
            _table(pool), src_pages, dst_pages, staging, host, staged_copies=True
        )
    else:
        seed_hicache.transfer_hicache_all_layer_mla_staged_lf_page_unified(
            _table(pool), src_pages, dst_pages, staging, host
        )
    torch.cuda.synchronize()
    assert_same_bytes(host.reshape(host_pages, -1), want.reshape(host_pages, -1))
    host_tok = (dst_pages[:, None] * ps + torch.arange(ps)).flatten()[:77]
    dev_tok = torch.randperm(pool_pages * ps)[:77]
    written = dict(zip(dst_pages.tolist(), src_pages.tolist(), strict=True))
    for layer in range(layers):
        dst = make_cache(pool_pages * ps, dim * pool[0].element_size(), "cuda", dtype, poison=True).view(-1, 1, dim)
        expected = as_bytes(dst).clone()
        for s, d in zip(host_tok.tolist(), dev_tok.tolist(), strict=True):
            expected[d, 0] = as_bytes(pool[layer][written[s // ps] * ps + s % ps])
        seed_hicache.transfer_hicache_one_layer_mla_page_unified_lf(
            dst, host, host_tok.cuda(), dev_tok.cuda(), layer, block_quota=1
        )
        torch.cuda.synchronize()
        assert_same_bytes(dst.reshape(dst.shape[0], -1), expected.reshape(expected.shape[0], -1))


@pytest.mark.gpu
def test_page_unified_mla_write_back_of_more_pages_than_one_launch_takes() -> None:
    """300 pages in random host order: the direct stores take them in two launches (256 + 44)."""
    layers, ps, dim, pool_pages, host_pages = 2, 2, 64, 320, 400
    pool = _pool(layers, pool_pages * ps, (dim,), torch.uint8)
    src_pages = torch.randperm(pool_pages)[:300].cuda()
    dst_pages = torch.randperm(host_pages)[:300]
    host = _host_poison((host_pages, layers, ps, dim), torch.uint8)
    staging = torch.empty(1, layers, ps, dim, dtype=torch.uint8, device="cuda")
    want = host.clone()
    want[dst_pages] = torch.stack([buf.view(pool_pages, ps, dim)[src_pages].cpu() for buf in pool], dim=1)
    seed_hicache.transfer_hicache_all_layer_mla_staged_lf_page_unified(
        _table(pool), src_pages, dst_pages, staging, host
    )
    torch.cuda.synchronize()
    assert_same_bytes(host.reshape(host_pages, -1), want.reshape(host_pages, -1))


@pytest.mark.gpu
def test_page_unified_write_back_refuses_bad_destination_pages() -> None:
    layers, ps = 2, 16
    pool = _pool(layers, 4 * ps, (576,), torch.uint8)
    host = _host_poison((6, layers, ps, 576), torch.uint8)
    staging = torch.empty(2, layers, ps, 576, dtype=torch.uint8, device="cuda")
    src = torch.tensor([0, 1, 2], device="cuda")
    fn = seed_hicache.transfer_hicache_all_layer_mla_staged_lf_page_unified
    with pytest.raises(ValueError, match=r"dst_pages\[2\] = 6 is out of range: it must be in \[0, 6\)"):
        fn(_table(pool), src, torch.tensor([0, 1, 6]), staging, host)
    with pytest.raises(ValueError, match=r"dst_pages\[0\] = -1 is out of range"):
        fn(_table(pool), src, torch.tensor([-1, 1, 2]), staging, host)
    with pytest.raises(ValueError, match=r"dst_pages holds page 4 twice"):
        fn(_table(pool), src, torch.tensor([4, 1, 4]), staging, host)
    with pytest.raises(ValueError, match=r"'dst' is in pageable"):
        fn(_table(pool), src, torch.tensor([0, 1, 2]), staging, torch.zeros(6, layers, ps, 576, dtype=torch.uint8))
    torch.cuda.synchronize()
    assert bool((host.view(torch.uint8) == POISON).all())


@pytest.mark.gpu
def test_page_unified_load_back_skips_or_names_bad_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out-of-range host or device tokens leave their rows alone (no fault); with
    JIT_KERNEL_CHECK_INDICES=1 the call raises IndexError naming the first and copies nothing."""
    layers, ps, dim = 2, 16, 576
    host = make_cache(3 * layers * ps, dim, "cpu", torch.uint8).view(3, layers, ps, dim)
    dst = make_cache(64, dim, "cuda", torch.uint8, poison=True).view(64, 1, dim)
    src_tok = torch.tensor([0, 5, 48, -1, 47, 3], device="cuda")  # 48 = 3 pages * 16: past the end
    dst_tok = torch.tensor([1, 2, 3, 4, 64, 6], device="cuda")  # 64: past the pool
    fn = seed_hicache.transfer_hicache_one_layer_mla_page_unified_lf
    fn(dst, host, src_tok, dst_tok, 1)
    torch.cuda.synchronize()
    expected = make_cache(64, dim, "cpu", torch.uint8, poison=True).view(64, 1, dim)
    for s, d in ((0, 1), (5, 2), (3, 6)):
        expected[d, 0] = host[s // ps, 1, s % ps]
    assert_same_bytes(dst.view(64, -1), expected.view(64, -1))
    monkeypatch.setenv("JIT_KERNEL_CHECK_INDICES", "1")
    dst.view(torch.uint8).fill_(POISON)
    with pytest.raises(IndexError, match=r"src_indices\[2\] = 48 is out of range.*\[0, 48\)"):
        fn(dst, host, src_tok, dst_tok, 1)
    with pytest.raises(IndexError, match=r"dst_indices\[4\] = 64 is out of range.*\[0, 64\)"):
        fn(dst, host, src_tok.clamp(0, 47), dst_tok, 1)
    assert bool((dst.view(torch.uint8) == POISON).all())


@pytest.mark.gpu
def test_page_unified_load_back_under_torch_compile() -> None:
    """The torch.ops form (fullgraph, declared mutation of the destination caches)."""
    torch._dynamo.reset()
    layers, ps, dim = 2, 16, 576
    host = make_cache(2 * layers * ps, dim, "cpu", torch.uint8).view(2, layers, ps, dim)
    dst = make_cache(40, dim, "cuda", torch.uint8, poison=True).view(40, 1, dim)
    src_tok, dst_tok = torch.arange(20, device="cuda"), torch.arange(20, device="cuda") + 10

    @torch.compile(fullgraph=True)
    def load() -> None:
        seed_hicache.transfer_hicache_one_layer_mla_page_unified_lf(dst, host, src_tok, dst_tok, 0)

    load()
    torch.cuda.synchronize()
    assert torch.equal(dst[10:30, 0].cpu(), host[:2, 0].reshape(32, dim)[:20])
