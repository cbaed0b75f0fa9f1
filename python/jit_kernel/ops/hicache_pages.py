"""hicache write-back of whole pages to pinned host memory, and load-back from page-unified host pages.

Write-back moves whole pages from layer-first device pools (one ``[tokens, row]`` buffer per layer,
passed as uint64 tables of base addresses) to pinned host memory whose pages are contiguous. One
kernel reads each row of the pools and stores it straight into its host page through the pinned
memory's device alias, under a block quota (``block_quota``, default :data:`DEFAULT_BLOCK_QUOTA`
blocks of 1024 threads; the register kernel's stores saturate PCIe from 2), one launch for up to
256 pages, no copy-engine copies. The caller's staging buffer is validated, as upstream's call form
requires it, and left unused: its contents afterwards are unspecified.

The staging path (``staged_copies=True`` on the private ops, for comparison) gathers each chunk of
pages into the staging buffer in the host page's byte order and moves every run of consecutive host
pages with one ``cudaMemcpyAsync`` (no SM time during the copy; a transfer larger than the staging
buffer goes in chunks within the one call). The copy engine pays a fixed cost per copy, once per run
of consecutive host pages, which pages of a few hundred KiB in random host order do not hide.

- page-first (``_lf_pf``): host ``[tokens, layers, row]``; a page is ``page_size`` tokens of every
  layer. ``src_indices`` / ``dst_indices`` are token indices, ``page_size`` per page, and only the
  first of each page is read (its page is that token and the ``page_size - 1`` after it).
- page-unified (``_lf_page_unified``): host ``(page, head_group, layer, 2, page_size,
  head_in_group, dim)`` with K = 0 and V = 1; MLA ``(page, layer, page_size, dim)``.
  ``src_pages`` / ``dst_pages`` are page ids.

Both run on the current stream; a CUDA graph can capture them (the host page ids travel in the
kernel's parameters, so a replay writes the pages captured).

Load-back (``transfer_hicache_one_layer_page_unified_lf`` and its MLA form) reads one layer of
page-unified host pages straight into the device pool's rows, the SMs reading pinned memory through
its device alias under a block quota. An index out of range is skipped (no fault);
``JIT_KERNEL_CHECK_INDICES=1`` raises :class:`IndexError` naming it instead.

Row sizes are run-time values (``csrc/hicache_pages.cuh``): one prebuilt module serves every shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import HICACHE_PAGES
from jit_kernel.ops._common import KernelTable, Launch, kernel_op
from jit_kernel.ops.hicache import DEFAULT_BLOCK_QUOTA, _check_bounds, _options

_PAGES = Dispatcher(HICACHE_PAGES)
_KERNELS = {export: KernelTable(_PAGES, export, lambda: ()) for export in HICACHE_PAGES.exports}


def can_use_write_back_jit_kernel(
    *, element_size: int, unroll: int | None = None, block_quota: int | None = None
) -> bool:
    """Whether the staged write-back moves rows of ``element_size`` bytes (a positive multiple of 16)
    with these options. ``unroll`` is accepted for the register kernel's call form and not used."""
    if not isinstance(element_size, int):
        return False
    try:
        _options("can_use_write_back_jit_kernel", element_size, unroll, block_quota)
    except ValueError:
        return False
    return True


def can_use_page_unified_load_back_jit_kernel(*, group_bytes: int, block_quota: int | None = None) -> bool:
    """Whether page-unified load-back moves head-group rows of ``group_bytes`` bytes (a positive
    multiple of 16) with this ``block_quota``."""
    if not isinstance(group_bytes, int):
        return False
    try:
        _options("can_use_page_unified_load_back_jit_kernel", group_bytes, None, block_quota)
    except ValueError:
        return False
    return True


def _tokens_by_layer(fn: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``[tokens, layers, ...]`` viewed as ``[tokens, layers, row]`` (C++ checks the rest)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 3:
        return t
    if t.dim() < 2:
        raise ValueError(f"{fn}: {name} must be [tokens, layers, ...], got shape {tuple(t.shape)}")
    try:
        return t.view(t.shape[0], t.shape[1], -1)
    except RuntimeError:
        raise ValueError(
            f"{fn}: {name} of shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            "[tokens, layers, row]: its trailing dimensions must be contiguous"
        ) from None


def _token_rows(fn: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """A device pool layer ``[tokens, ...]`` viewed as ``[tokens, row]`` (C++ checks the rest)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 2:
        return t
    if t.dim() < 2:
        raise ValueError(f"{fn}: {name} must be [tokens, heads, dim] or [tokens, row], got shape {tuple(t.shape)}")
    try:
        return t.view(t.shape[0], -1)
    except RuntimeError:
        raise ValueError(
            f"{fn}: {name} of shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            "[tokens, row]: its trailing dimensions must be contiguous"
        ) from None


def _page_size(fn: str, page_size: int) -> int:
    if type(page_size) is not int or page_size < 1:
        raise ValueError(f"{fn}: page_size must be a positive int, got {page_size!r}")
    return page_size


def _staged_options(
    fn: str, element_size: int | None, unroll: int | None, block_quota: int | None, staged_copies: bool
) -> tuple[int, int]:
    """(element_size or 0 for "the staging rows'", the block quota): ``unroll`` is validated as the
    register kernel's and not used; a quota left out is :data:`DEFAULT_BLOCK_QUOTA` for the direct
    stores and 0 ("two blocks per SM") for the staging path's gather kernel."""
    if element_size is not None:
        if type(element_size) is not int:
            raise TypeError(f"{fn}: element_size must be an int, got {type(element_size).__name__}")
        _options(fn, element_size, unroll, block_quota)
    else:
        _options(fn, 16, unroll, block_quota)
    return (element_size or 0, _write_quota(block_quota, staged_copies))


def _write_quota(block_quota: int | None, staged_copies: bool) -> int:
    if block_quota is not None:
        return block_quota
    return 0 if staged_copies else DEFAULT_BLOCK_QUOTA


def _indices_check(fn: str, name: str) -> Any:
    """JIT_KERNEL_CHECK_INDICES=1: the device-side indices must be non-negative."""

    def check(values: Mapping[str, Any]) -> None:
        _check_bounds(fn, name, values[name], None)

    return check


@kernel_op(
    "transfer_hicache_all_layer_staged_lf_pf",
    register=False,
    index_check=_indices_check("transfer_hicache_all_layer_staged_lf_pf", "src_indices"),
)
def transfer_hicache_all_layer_staged_lf_pf(
    k_ptr_src: torch.Tensor,
    v_ptr_src: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    staging_k: torch.Tensor,
    staging_v: torch.Tensor,
    dst_k: torch.Tensor,
    dst_v: torch.Tensor,
    *,
    page_size: int,
    element_size: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    staged_copies: bool = False,
) -> Launch:
    """Write whole pages of every layer from layer-first device pools to page-first pinned host caches.

    ``k_ptr_src`` / ``v_ptr_src``: uint64 CUDA tensors ``[layers]`` of the device pools' per-layer
    base addresses (rows of ``element_size`` bytes, contiguous). ``src_indices``: int32/int64 CUDA
    token indices of the pages to write, ``page_size`` per page; ``dst_indices``: int64 CPU token
    indices of the host pages, the same length. The first index of each page names the page (the
    page is that token and the next ``page_size - 1``); a host page must lie inside ``dst_k``.
    ``staging_k`` / ``staging_v``: CUDA ``[tokens, layers, ...]`` with room for at least one page;
    ``dst_k`` / ``dst_v``: pinned host ``[tokens, layers, ...]``, same dtype and row. The rows are
    stored into the host pages by one kernel through the pinned memory's device alias (the staging
    buffers are checked and left unused; their contents afterwards are unspecified).
    ``element_size`` defaults to the staging rows' bytes (given, it must equal them);
    ``block_quota`` caps the kernel's blocks of 1024 threads (default :data:`DEFAULT_BLOCK_QUOTA`);
    ``unroll`` is accepted and not used. ``staged_copies=True`` takes the staging path instead
    (module docstring), for comparison.

    Runs on the current stream; keep every input alive, the staging buffers unused, and read the
    host caches only after that stream has reached this point.
    """
    fn = "transfer_hicache_all_layer_staged_lf_pf"
    size, quota = _staged_options(fn, element_size, unroll, block_quota, staged_copies)
    args = (
        k_ptr_src, v_ptr_src, src_indices, dst_indices,
        _tokens_by_layer(fn, "staging_k", staging_k), _tokens_by_layer(fn, "staging_v", staging_v),
        _tokens_by_layer(fn, "dst_k", dst_k), _tokens_by_layer(fn, "dst_v", dst_v),
        _page_size(fn, page_size), size, quota, int(staged_copies),
    )  # fmt: skip
    return _KERNELS["lf_pf"], (), args, None


@kernel_op(
    "transfer_hicache_all_layer_mla_staged_lf_pf",
    register=False,
    index_check=_indices_check("transfer_hicache_all_layer_mla_staged_lf_pf", "src_indices"),
)
def transfer_hicache_all_layer_mla_staged_lf_pf(
    ptr_src: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    staging: torch.Tensor,
    dst: torch.Tensor,
    *,
    page_size: int,
    element_size: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    staged_copies: bool = False,
) -> Launch:
    """The MLA form of :func:`transfer_hicache_all_layer_staged_lf_pf`: one cache per layer, no V."""
    fn = "transfer_hicache_all_layer_mla_staged_lf_pf"
    size, quota = _staged_options(fn, element_size, unroll, block_quota, staged_copies)
    args = (
        ptr_src, src_indices, dst_indices, _tokens_by_layer(fn, "staging", staging), _tokens_by_layer(fn, "dst", dst),
        _page_size(fn, page_size), size, quota, int(staged_copies),
    )  # fmt: skip
    return _KERNELS["lf_pf_mla"], (), args, None


@kernel_op(
    "transfer_hicache_all_layer_staged_lf_page_unified",
    register=False,
    index_check=_indices_check("transfer_hicache_all_layer_staged_lf_page_unified", "src_pages"),
)
def transfer_hicache_all_layer_staged_lf_page_unified(
    k_ptr_src: torch.Tensor,
    v_ptr_src: torch.Tensor,
    src_pages: torch.Tensor,
    dst_pages: torch.Tensor,
    staging: torch.Tensor,
    dst: torch.Tensor,
    *,
    staged_copies: bool = False,
) -> Launch:
    """Write whole pages of every layer to pinned host memory in the page-unified layout.

    ``staging`` (CUDA) and ``dst`` (pinned host) are contiguous ``(page, head_group, layer, 2,
    page_size, head_in_group, dim)``, K = 0 and V = 1, of one dtype; only their page counts may
    differ. Each source layer (``k_ptr_src`` / ``v_ptr_src``: uint64 CUDA tensors ``[layers]`` of
    base addresses) is a contiguous ``(token, head_group * head_in_group, dim)`` buffer of that
    dtype, 16-byte aligned. ``src_pages``: int32/int64 CUDA page ids (token = page * page_size + t);
    ``dst_pages``: int64 CPU page ids of ``dst``, in range and each once, in matching order. One head
    group's token row (``head_in_group * dim`` elements) must be a multiple of 16 bytes. One kernel
    of :data:`DEFAULT_BLOCK_QUOTA` blocks stores the rows into the host pages through the pinned
    memory's device alias, on the current stream; ``staging`` is checked and left unused (its contents
    afterwards are unspecified), and no GPU memory is allocated. ``staged_copies=True`` takes the
    staging path instead (module docstring), for comparison.
    """
    args = (k_ptr_src, v_ptr_src, src_pages, dst_pages, staging, dst)
    return _KERNELS["pu_write"], (), (*args, _write_quota(None, staged_copies), int(staged_copies)), None


@kernel_op(
    "transfer_hicache_all_layer_mla_staged_lf_page_unified",
    register=False,
    index_check=_indices_check("transfer_hicache_all_layer_mla_staged_lf_page_unified", "src_pages"),
)
def transfer_hicache_all_layer_mla_staged_lf_page_unified(
    ptr_src: torch.Tensor,
    src_pages: torch.Tensor,
    dst_pages: torch.Tensor,
    staging: torch.Tensor,
    dst: torch.Tensor,
    *,
    staged_copies: bool = False,
) -> Launch:
    """The MLA form of :func:`transfer_hicache_all_layer_staged_lf_page_unified`: pages ``(page,
    layer, page_size, dim)``, one latent cache per layer (``(token, dim)`` buffers), no head group or
    K/V axis. Each token row must be a multiple of 16 bytes."""
    args = (ptr_src, src_pages, dst_pages, staging, dst, _write_quota(None, staged_copies), int(staged_copies))
    return _KERNELS["pu_write_mla"], (), args, None


def _quota(fn: str, block_quota: int | None) -> int:
    return _options(fn, 16, None, block_quota)[1]


def _load_back_check(fn: str, page_axis: int, dst: tuple[str, ...]) -> Any:
    """JIT_KERNEL_CHECK_INDICES=1: host token indices against the pages of ``src``, device token
    indices against the rows of the smallest destination."""

    def check(values: Mapping[str, Any]) -> None:
        src = values["src"]
        rows = min(_token_rows(fn, name, values[name]).shape[0] for name in dst)
        _check_bounds(fn, "src_indices", values["src_indices"], src.shape[0] * src.shape[page_axis])
        _check_bounds(fn, "dst_indices", values["dst_indices"], rows)

    return check


@kernel_op(
    "transfer_hicache_one_layer_page_unified_lf",
    mutates=("k_cache_dst", "v_cache_dst"),
    index_check=_load_back_check("transfer_hicache_one_layer_page_unified_lf", 4, ("k_cache_dst", "v_cache_dst")),
)
def transfer_hicache_one_layer_page_unified_lf(
    k_cache_dst: torch.Tensor,
    v_cache_dst: torch.Tensor,
    src: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    *,
    block_quota: int | None = None,
) -> Launch:
    """Load layer ``layer_id`` of page-unified host pages into one layer of the device pool.

    ``src``: contiguous ``(page, head_group, layer, 2, page_size, head_in_group, dim)`` (K = 0,
    V = 1), pinned or registered host memory (or GPU memory), read in place. ``k_cache_dst`` /
    ``v_cache_dst``: the pool's layer, ``(token, head, dim)`` with ``head = head_group *
    head_in_group`` (or already ``(token, head * dim)``), same dtype. ``src_indices``: host-pool
    TOKEN indices (page = index // page_size); ``dst_indices``: device-pool token indices, in
    matching order; both int32 or int64 CUDA tensors on the caches' GPU. A head group's token row
    must be a multiple of 16 bytes. An index out of range is skipped. ``block_quota`` (default
    :data:`DEFAULT_BLOCK_QUOTA`) caps the blocks of 1024 threads the load occupies. Runs on the current
    stream; keep ``src`` alive and unwritten until it has run.
    """
    fn = "transfer_hicache_one_layer_page_unified_lf"
    k, v = _token_rows(fn, "k_cache_dst", k_cache_dst), _token_rows(fn, "v_cache_dst", v_cache_dst)
    return _KERNELS["pu_load"], (), (k, v, src, src_indices, dst_indices, layer_id, _quota(fn, block_quota)), None


@kernel_op(
    "transfer_hicache_one_layer_mla_page_unified_lf",
    mutates=("cache_dst",),
    index_check=_load_back_check("transfer_hicache_one_layer_mla_page_unified_lf", 2, ("cache_dst",)),
)
def transfer_hicache_one_layer_mla_page_unified_lf(
    cache_dst: torch.Tensor,
    src: torch.Tensor,
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    *,
    block_quota: int | None = None,
) -> Launch:
    """The MLA form of :func:`transfer_hicache_one_layer_page_unified_lf`: pages ``(page, layer,
    page_size, dim)``, ``cache_dst`` one layer of the latent pool ``(token, 1, dim)`` or ``(token,
    dim)``."""
    fn = "transfer_hicache_one_layer_mla_page_unified_lf"
    rows = _token_rows(fn, "cache_dst", cache_dst)
    return _KERNELS["pu_load_mla"], (), (rows, src, src_indices, dst_indices, layer_id, _quota(fn, block_quota)), None


__all__ = [
    "DEFAULT_BLOCK_QUOTA",
    "can_use_page_unified_load_back_jit_kernel",
    "can_use_write_back_jit_kernel",
    "transfer_hicache_all_layer_mla_staged_lf_page_unified",
    "transfer_hicache_all_layer_mla_staged_lf_pf",
    "transfer_hicache_all_layer_staged_lf_page_unified",
    "transfer_hicache_all_layer_staged_lf_pf",
    "transfer_hicache_one_layer_mla_page_unified_lf",
    "transfer_hicache_one_layer_page_unified_lf",
]
