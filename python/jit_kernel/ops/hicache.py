"""hicache: gather/scatter of KV-cache rows between GPU memory and pinned host memory.

For every ``i``::

    k_dst[indices_dst[i]] = k_src[indices_src[i]]
    v_dst[indices_dst[i]] = v_src[indices_src[i]]

One row is one token's slice of one layer, ``element_size`` bytes; the kernel moves bytes, so
any dtype works. Caches may be CUDA tensors, or CPU tensors in pinned memory (accessed through
UVA). The register kernel is ``csrc/hicache.cuh``; its config is ``(element_size, unroll,
num_threads)`` and the block quota is a run-time argument.

``page_size=`` tells the transfer that its indices come in pages of that many consecutive rows.
Where the page size is a multiple of the bulk-copy kernel's rows per stage (``csrc/hicache_tma.cuh``,
``hicache_tma_stage_rows``: 32 rows of 1 KiB, 128 of 256 B), the GPU is sm_90+ and one side of a
one-layer transfer is host memory, the transfer runs on that kernel, which moves each page-aligned
run of rows with one bulk copy; otherwise on the register kernel. One-layer transfers between two
CUDA caches keep the register kernel. The all-layer forms take pointer tables that do not say where
the caches are, so they keep the register kernel whatever the page size. The measurements behind
both rules are in docs/design/hicache.md. Both kernels move exactly the same bytes for any indices:
the choice is only speed.

Out-of-range indices are not checked (that would cost a reduction and a host sync per call);
``JIT_KERNEL_CHECK_INDICES=1`` turns the check on and raises :class:`IndexError` naming the first
bad position. With the all-layer forms, which take raw pointers, only negative indices can be
detected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from jit_kernel.engine import target
from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import (
    HICACHE,
    HICACHE_NUM_THREADS,
    HICACHE_TMA,
    HICACHE_UNROLLS,
    hicache_tma_stage_rows,
)
from jit_kernel.engine.families import hicache_default_unroll as default_unroll
from jit_kernel.ops._common import KernelTable, Launch, kernel_op

_HICACHE = Dispatcher(HICACHE)
_HICACHE_TMA = Dispatcher(HICACHE_TMA)

#: Blocks of 1024 threads a transfer may occupy by default: enough in-flight bytes to keep PCIe
#: saturated, few enough SMs that a background copy leaves the model's compute alone (the quota
#: sweep of ``bench_hicache``; docs/design/hicache.md).
DEFAULT_BLOCK_QUOTA = 4
_VALID_UNROLLS = HICACHE_UNROLLS


def can_use_hicache_jit_kernel(
    *,
    element_size: int,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
) -> bool:
    """Whether rows of ``element_size`` bytes (a positive multiple of 16) can be moved by these
    transfers, with this ``unroll``, ``block_quota`` and ``page_size`` (None: the defaults; see
    :func:`uses_bulk_copy_kernel` for the kernel a page size picks)."""
    if not isinstance(element_size, int):
        return False
    try:
        _options("can_use_hicache_jit_kernel", element_size, unroll, block_quota, page_size)
    except ValueError:
        return False
    return True


def uses_bulk_copy_kernel(
    element_size: int, page_size: int | None, arch_major: int | None = None, *, device_to_device: bool = False
) -> bool:
    """Whether a one-layer transfer of ``element_size``-byte rows with this ``page_size`` runs on the
    bulk-copy (TMA) kernel: a page size given that is a multiple of the kernel's rows per stage, so
    that every stage is one page-aligned run, on an sm_90+ GPU (``arch_major``; default: the current
    target's), and not between two CUDA caches (``device_to_device``), which keep the register kernel
    (docs/design/hicache.md). Any other transfer runs on the register kernel, the all-layer forms
    always: their pointer tables do not say where the caches are."""
    if page_size is None or device_to_device:
        return False
    rows = hicache_tma_stage_rows(element_size)
    if rows == 0 or page_size % rows != 0:
        return False
    return (target.current().arch.major if arch_major is None else arch_major) >= 9


def _options(
    fn: str, element_size: int, unroll: int | None, block_quota: int | None, page_size: int | None = None
) -> tuple[int, int]:
    if element_size <= 0 or element_size % 16 != 0:
        raise ValueError(f"{fn}: the element size must be a positive multiple of 16 bytes, got {element_size}")
    if page_size is not None and (type(page_size) is not int or page_size < 1):
        raise ValueError(f"{fn}: page_size must be a positive int or None, got {page_size!r}")
    if unroll is None:
        unroll = default_unroll(element_size)
    elif type(unroll) is not int or unroll not in _VALID_UNROLLS:
        raise ValueError(f"{fn}: unroll must be one of {_VALID_UNROLLS}, got {unroll!r}")
    if block_quota is None:
        block_quota = DEFAULT_BLOCK_QUOTA
    elif type(block_quota) is not int or block_quota < 1:
        raise ValueError(f"{fn}: block_quota must be a positive int, got {block_quota!r}")
    return unroll, block_quota


def _rows(fn: str, name: str, t: torch.Tensor, element_dim: int) -> torch.Tensor:
    """``t`` viewed as ``[rows, element_dim]`` (C++ checks the unit last stride and the rest)."""
    if t.dim() == 2 and t.size(1) == element_dim:
        return t  # the common case
    else:
        trailing, matches = 1, False
        for size in reversed(t.shape):
            trailing *= size
            matches = matches or trailing == element_dim
        if not matches:
            raise ValueError(
                f"{fn}: element_dim={element_dim} does not match {name} of shape {tuple(t.shape)}: it must be "
                "the product of the cache's trailing dimensions"
            )
        try:
            return t.view(-1, element_dim)
        except RuntimeError as error:
            if t.layout != torch.strided:
                raise  # explain() names a sparse tensor
            raise ValueError(
                f"{fn}: {name} of shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as rows of "
                f"{element_dim} elements: {error}"
            ) from None


def _check_bounds(fn: str, name: str, indices: torch.Tensor, num_rows: int | None) -> None:
    """``JIT_KERNEL_CHECK_INDICES=1``: one reduction and one sync; on failure, find the first bad position."""
    if indices.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(indices)).tolist()
    if lo >= 0 and (num_rows is None or hi < num_rows):
        return
    bad = (indices < 0) if num_rows is None else (indices < 0) | (indices >= num_rows)
    position = int(bad.nonzero()[0, 0])
    value = int(indices[position])
    limit = "a non-negative row" if num_rows is None else f"in [0, {num_rows})"
    raise IndexError(f"{fn}: {name}[{position}] = {value} is out of range: it must be {limit}")


def _one_layer_config(fn: str) -> Callable[..., tuple[int, int, int]]:
    """(dtype, row width[, unroll]) -> the hicache config; a row width or unroll no kernel takes raises."""

    def config(dtype: torch.dtype, element_dim: int, unroll: int | None = None) -> tuple[int, int, int]:
        element_size = element_dim * dtype.itemsize
        unroll, _ = _options(fn, element_size, unroll, None)
        return (element_size, unroll, HICACHE_NUM_THREADS)

    return config


def _tma_config(element_size: int) -> tuple[int, int]:
    return (element_size, hicache_tma_stage_rows(element_size))


# Keys (dtype, row width) for the default unroll, else (dtype, row width, unroll); the block quota
# is a run-time argument.
_ONE_LAYER_KERNELS = KernelTable(_HICACHE, "run_one", _one_layer_config("transfer_hicache_one_layer"))
_ONE_LAYER_MLA_KERNELS = KernelTable(_HICACHE, "run_one_mla", _one_layer_config("transfer_hicache_one_layer_mla"))
_ALL_LAYER_KERNELS = KernelTable(_HICACHE, "run_all", lambda *config: config)
_ALL_LAYER_MLA_KERNELS = KernelTable(_HICACHE, "run_all_mla", lambda *config: config)
# The bulk-copy kernel, keyed by row bytes.
_ONE_LAYER_TMA_KERNELS = KernelTable(_HICACHE_TMA, "run_one", _tma_config)
_ONE_LAYER_MLA_TMA_KERNELS = KernelTable(_HICACHE_TMA, "run_one_mla", _tma_config)
_ONE_LAYER = (_ONE_LAYER_KERNELS, _ONE_LAYER_TMA_KERNELS)
_ONE_LAYER_MLA = (_ONE_LAYER_MLA_KERNELS, _ONE_LAYER_MLA_TMA_KERNELS)
_FORM = {id(_ONE_LAYER): "kv", id(_ONE_LAYER_MLA): "mla"}  # the forms' names in _ROUTES' keys

# The kernel a one-layer transfer of rows as they are (2-D caches, the default row width and unroll)
# with a page size takes, decided once per shape: (form, dtype, row width, page size, both caches on
# the GPU) -> (table, key). Filed only where every device has one arch (the choice depends on it).
_ROUTES: dict[tuple[Any, ...], tuple[KernelTable, Any]] = {}


def _route(
    kernels: tuple[KernelTable, KernelTable],
    dtype: torch.dtype,
    element_dim: int,
    unroll: int,
    default_unroll: bool,
    page_size: int | None,
    device_to_device: bool,
) -> tuple[KernelTable, Any]:
    """The register kernel's table and key, or the bulk-copy kernel's (:func:`uses_bulk_copy_kernel`)."""
    element_size = element_dim * dtype.itemsize
    if uses_bulk_copy_kernel(element_size, page_size, device_to_device=device_to_device):
        return kernels[1], element_size
    return kernels[0], (dtype, element_dim) if default_unroll else (dtype, element_dim, unroll)


def _one_layer(
    fn: str,
    kernels: tuple[KernelTable, KernelTable],
    caches_dst: tuple[tuple[str, torch.Tensor], ...],
    indices_dst: torch.Tensor,
    caches_src: tuple[tuple[str, torch.Tensor], ...],
    indices_src: torch.Tensor,
    element_dim: int | None,
    unroll: int | None,
    block_quota: int | None,
    page_size: int | None,
) -> Launch:
    """The launch of both one-layer forms (two caches a side, or one for MLA) for caches that are
    not rows as they are, or a shape seen for the first time; ``kernels``: the register kernel's
    table and the bulk-copy kernel's."""
    named = caches_dst + caches_src
    n_dst = len(caches_dst)
    first_name, first = named[0]
    as_rows = element_dim is None and unroll is None and all(t.ndim == 2 for _, t in named)
    if element_dim is None:
        if first.dim() == 0:
            raise ValueError(f"{fn}: {first_name} must have at least one dimension")
        element_dim = first.size(-1)
    elif type(element_dim) is not int or element_dim <= 0:
        raise ValueError(f"{fn}: element_dim must be a positive int, got {element_dim!r}")
    default = unroll is None
    unroll, block_quota = _options(fn, element_dim * first.element_size(), unroll, block_quota, page_size)
    rows = [_rows(fn, name, t, element_dim) for name, t in named]
    device_to_device = all(t.is_cuda for _, t in named)
    table, key = _route(kernels, first.dtype, element_dim, unroll, default, page_size, device_to_device)
    if as_rows and page_size is not None and target.one_arch_for_all_devices():
        shape = (_FORM[id(kernels)], first.dtype, element_dim, page_size, device_to_device)
        _ROUTES[shape] = (table, key)
    return table, key, (*rows[:n_dst], indices_dst, *rows[n_dst:], indices_src, block_quota), None


def _one_layer_check(fn: str, dst: tuple[str, ...], src: tuple[str, ...]) -> Any:
    """JIT_KERNEL_CHECK_INDICES=1: each side's indices against the rows of its smallest cache."""

    def check(values: Any) -> None:
        element_dim = values["element_dim"]
        rows = {
            name: _rows(fn, name, values[name], element_dim or values[dst[0]].size(-1)).size(0) for name in dst + src
        }
        _check_bounds(fn, "indices_dst", values["indices_dst"], min(rows[name] for name in dst))
        _check_bounds(fn, "indices_src", values["indices_src"], min(rows[name] for name in src))

    return check


_KV_DST, _KV_SRC = ("k_cache_dst", "v_cache_dst"), ("k_cache_src", "v_cache_src")


@kernel_op(
    "transfer_hicache_one_layer",
    mutates=_KV_DST,
    index_check=_one_layer_check("transfer_hicache_one_layer", _KV_DST, _KV_SRC),
)
def transfer_hicache_one_layer(
    k_cache_dst: torch.Tensor,
    v_cache_dst: torch.Tensor,
    indices_dst: torch.Tensor,
    k_cache_src: torch.Tensor,
    v_cache_src: torch.Tensor,
    indices_src: torch.Tensor,
    *,
    element_dim: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
) -> Launch:
    """``k_cache_dst[indices_dst[i]] = k_cache_src[indices_src[i]]`` (and for V) for one layer.

    Caches are viewed as ``[-1, element_dim]`` (``element_dim`` defaults to the last dimension)
    with any row stride and a unit last stride; they live on the indices' GPU or in pinned CPU
    memory. Indices are int32 or int64 CUDA tensors of equal length. ``unroll`` (rows per warp)
    and ``block_quota`` (most blocks the copy occupies) default to tuned values. ``page_size``
    (rows per page of the indices) lets page-aligned transfers take the bulk-copy kernel (module
    docstring); the register kernel's ``unroll`` does not apply there.
    """
    # Rows as they are (2-D caches: a side's V has its K's rank), the default row width and unroll:
    # without a page size the register kernel; with one that is an int (a float or bool equal to one
    # is refused below), the remembered route.
    if element_dim is None and unroll is None and k_cache_dst.ndim == 2 == k_cache_src.ndim:
        quota = DEFAULT_BLOCK_QUOTA if block_quota is None else block_quota
        if type(quota) is int and quota >= 1:
            args = (k_cache_dst, v_cache_dst, indices_dst, k_cache_src, v_cache_src, indices_src, quota)
            if page_size is None:
                return _ONE_LAYER_KERNELS, (k_cache_dst.dtype, k_cache_dst.shape[1]), args, None
            if type(page_size) is int:
                d2d = k_cache_dst.is_cuda and v_cache_dst.is_cuda and k_cache_src.is_cuda and v_cache_src.is_cuda
                route = _ROUTES.get(("kv", k_cache_dst.dtype, k_cache_dst.shape[1], page_size, d2d))
                if route is not None:
                    return route[0], route[1], args, None
    dst = (("k_cache_dst", k_cache_dst), ("v_cache_dst", v_cache_dst))
    src = (("k_cache_src", k_cache_src), ("v_cache_src", v_cache_src))
    fn = "transfer_hicache_one_layer"
    return _one_layer(fn, _ONE_LAYER, dst, indices_dst, src, indices_src, element_dim, unroll, block_quota, page_size)


@kernel_op(
    "transfer_hicache_one_layer_mla",
    mutates=("cache_dst",),
    index_check=_one_layer_check("transfer_hicache_one_layer_mla", ("cache_dst",), ("cache_src",)),
)
def transfer_hicache_one_layer_mla(
    cache_dst: torch.Tensor,
    indices_dst: torch.Tensor,
    cache_src: torch.Tensor,
    indices_src: torch.Tensor,
    *,
    element_dim: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
) -> Launch:
    """The MLA form of :func:`transfer_hicache_one_layer`: one cache (e.g. DeepSeek's 576-wide latent), no V."""
    # Rows as they are: the register kernel, or the remembered route (as in transfer_hicache_one_layer).
    if element_dim is None and unroll is None and cache_dst.ndim == 2 == cache_src.ndim:
        quota = DEFAULT_BLOCK_QUOTA if block_quota is None else block_quota
        if type(quota) is int and quota >= 1:
            args = (cache_dst, indices_dst, cache_src, indices_src, quota)
            if page_size is None:
                return _ONE_LAYER_MLA_KERNELS, (cache_dst.dtype, cache_dst.shape[1]), args, None
            if type(page_size) is int:
                d2d = cache_dst.is_cuda and cache_src.is_cuda
                route = _ROUTES.get(("mla", cache_dst.dtype, cache_dst.shape[1], page_size, d2d))
                if route is not None:
                    return route[0], route[1], args, None
    dst, src = (("cache_dst", cache_dst),), (("cache_src", cache_src),)
    fn = "transfer_hicache_one_layer_mla"
    return _one_layer(
        fn, _ONE_LAYER_MLA, dst, indices_dst, src, indices_src, element_dim, unroll, block_quota, page_size
    )


def _all_layer(
    fn: str,
    kernels: KernelTable,
    tables_dst: tuple[torch.Tensor, ...],
    indices_dst: torch.Tensor,
    tables_src: tuple[torch.Tensor, ...],
    indices_src: torch.Tensor,
    src_stride: int,
    dst_stride: int,
    element_size: int | None,
    unroll: int | None,
    block_quota: int | None,
    page_size: int | None,
) -> Launch:
    """The launch of both all-layer forms (pointer tables for two caches a side, or one for MLA) on
    the register kernel, whatever the page size (see :func:`uses_bulk_copy_kernel`)."""
    for name, value in (("kv_cache_src_stride_bytes", src_stride), ("kv_cache_dst_stride_bytes", dst_stride)):
        if type(value) is not int or value <= 0:
            raise ValueError(f"{fn}: {name} must be a positive int, got {value!r}")
    if element_size is None:
        if src_stride != dst_stride:
            raise ValueError(
                f"{fn}: element_size is required when the strides differ ({src_stride} and {dst_stride} bytes)"
            )
        element_size = src_stride
    elif type(element_size) is not int:
        raise TypeError(f"{fn}: element_size must be an int, got {type(element_size).__name__}")
    defaults = unroll is None and page_size is None and src_stride == dst_stride  # the key is the quota's too
    unroll, block_quota = _options(fn, element_size, unroll, block_quota, page_size)
    key = (element_size, unroll, HICACHE_NUM_THREADS)
    if defaults and element_size == src_stride:
        _ALL_LAYER_KEYS[element_size] = key
    args = (*tables_dst, indices_dst, *tables_src, indices_src, src_stride, dst_stride, block_quota)
    return kernels, key, args, None


# The all-layer config of rows as far apart as they are long, with the defaults: row bytes -> key.
_ALL_LAYER_KEYS: dict[int, tuple[int, int, int]] = {}


def _all_layer_defaults(
    element_size: int | None, unroll: int | None, block_quota: int | None, page_size: int | None, src: int, dst: int
) -> tuple[tuple[int, int, int], int] | None:
    """(key, block quota) of an all-layer call with the default row size and unroll and equal
    strides, once a call filed the key; None for any other call (the full plan checks it)."""
    if element_size is None and unroll is None and page_size is None and src == dst and type(src) is type(dst) is int:
        key = _ALL_LAYER_KEYS.get(src)
        quota = DEFAULT_BLOCK_QUOTA if block_quota is None else block_quota
        if key is not None and type(quota) is int and quota >= 1:
            return key, quota
    return None


def _all_layer_check(fn: str) -> Any:
    """JIT_KERNEL_CHECK_INDICES=1: indices must be non-negative (the tables hold no row counts)."""

    def check(values: Any) -> None:
        _check_bounds(fn, "indices_dst", values["indices_dst"], None)
        _check_bounds(fn, "indices_src", values["indices_src"], None)

    return check


@kernel_op("transfer_hicache_all_layer", register=False, index_check=_all_layer_check("transfer_hicache_all_layer"))
def transfer_hicache_all_layer(
    k_ptr_dst: torch.Tensor,
    v_ptr_dst: torch.Tensor,
    indices_dst: torch.Tensor,
    k_ptr_src: torch.Tensor,
    v_ptr_src: torch.Tensor,
    indices_src: torch.Tensor,
    *,
    kv_cache_src_stride_bytes: int,
    kv_cache_dst_stride_bytes: int,
    element_size: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
) -> Launch:
    """Every layer in one launch. ``*_ptr_*`` are uint64 CUDA tensors ``[num_layers]`` holding each
    layer's base address (a CUDA address, or a pinned host buffer's; ``tensor.data_ptr()`` of a
    pinned CPU tensor works under UVA). Row ``r`` of a layer starts ``r * stride_bytes`` after its
    base. ``element_size`` (bytes per row) defaults to the stride when both strides are equal.

    The addresses cannot be checked: they must be valid for every index, and host buffers pinned.
    Not a ``torch.ops`` op: what it writes lies behind raw addresses that torch.compile cannot see.
    ``page_size`` is checked as in the one-layer form but picks no kernel: the register kernel runs
    whatever it is, since the tables do not say where the caches are, and between two GPU caches
    the register kernel is the one kept (docs/design/hicache.md).
    """
    src, dst = kv_cache_src_stride_bytes, kv_cache_dst_stride_bytes
    remembered = _all_layer_defaults(element_size, unroll, block_quota, page_size, src, dst)
    if remembered is not None:
        key, quota = remembered
        args = (k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src, src, dst, quota)
        return _ALL_LAYER_KERNELS, key, args, None
    return _all_layer(
        "transfer_hicache_all_layer", _ALL_LAYER_KERNELS, (k_ptr_dst, v_ptr_dst),
        indices_dst, (k_ptr_src, v_ptr_src), indices_src, kv_cache_src_stride_bytes, kv_cache_dst_stride_bytes,
        element_size, unroll, block_quota, page_size,
    )  # fmt: skip


@kernel_op(
    "transfer_hicache_all_layer_mla",
    register=False,
    index_check=_all_layer_check("transfer_hicache_all_layer_mla"),
)
def transfer_hicache_all_layer_mla(
    ptr_dst: torch.Tensor,
    indices_dst: torch.Tensor,
    ptr_src: torch.Tensor,
    indices_src: torch.Tensor,
    *,
    kv_cache_src_stride_bytes: int,
    kv_cache_dst_stride_bytes: int,
    element_size: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
) -> Launch:
    """The MLA form of :func:`transfer_hicache_all_layer`: one cache per layer, no V."""
    src, dst = kv_cache_src_stride_bytes, kv_cache_dst_stride_bytes
    remembered = _all_layer_defaults(element_size, unroll, block_quota, page_size, src, dst)
    if remembered is not None:
        key, quota = remembered
        return _ALL_LAYER_MLA_KERNELS, key, (ptr_dst, indices_dst, ptr_src, indices_src, src, dst, quota), None
    return _all_layer(
        "transfer_hicache_all_layer_mla", _ALL_LAYER_MLA_KERNELS, (ptr_dst,),
        indices_dst, (ptr_src,), indices_src, kv_cache_src_stride_bytes, kv_cache_dst_stride_bytes, element_size,
        unroll, block_quota, page_size,
    )  # fmt: skip


__all__ = [
    "DEFAULT_BLOCK_QUOTA",
    "can_use_hicache_jit_kernel",
    "default_unroll",
    "transfer_hicache_all_layer",
    "transfer_hicache_all_layer_mla",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
    "uses_bulk_copy_kernel",
]
