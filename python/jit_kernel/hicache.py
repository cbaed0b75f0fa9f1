"""``jit_kernel.hicache``: KV-cache row transfers between GPU and pinned host memory (the seed's
``sglang.jit_kernel.hicache`` names and signatures, and those SGLang added up to 0.5.23: ``page_size=``
on the row transfers, the staged write-back to page-first and page-unified host layouts, and the
page-unified load-back), and the flag-based stream wait used to order them.

The row transfers are the functions of ``jit_kernel.ops.hicache`` (also exported at the top
level), and the staged write-back and page-unified load-back those of ``jit_kernel.ops.hicache_pages``,
except :func:`transfer_hicache_all_layer_mla`, which takes the seed's keywords
``cache_src_stride_bytes`` / ``cache_dst_stride_bytes`` (the top-level function spells them
``kv_cache_*``, like the non-MLA form; both spellings work here). Differences from the seed
(docs/coming-from-sglang.md): ``DEFAULT_BLOCK_QUOTA`` is 4 (docs/design/hicache.md says why), 0 for ``element_dim``,
``unroll`` or ``block_quota`` is refused rather than read as "default", and row sizes need only be
a multiple of 16 bytes (the seed: 128).
"""

from __future__ import annotations

import torch

from jit_kernel.ops import hicache as _hicache
from jit_kernel.ops.hicache import (
    DEFAULT_BLOCK_QUOTA,
    can_use_hicache_jit_kernel,
    default_unroll,
    transfer_hicache_all_layer,
    transfer_hicache_one_layer,
    transfer_hicache_one_layer_mla,
    uses_bulk_copy_kernel,
)
from jit_kernel.ops.hicache_pages import (
    can_use_page_unified_load_back_jit_kernel,
    can_use_write_back_jit_kernel,
    transfer_hicache_all_layer_mla_staged_lf_page_unified,
    transfer_hicache_all_layer_mla_staged_lf_pf,
    transfer_hicache_all_layer_staged_lf_page_unified,
    transfer_hicache_all_layer_staged_lf_pf,
    transfer_hicache_one_layer_mla_page_unified_lf,
    transfer_hicache_one_layer_page_unified_lf,
)
from jit_kernel.ops.stream_wait import Event, StreamWaitTimeout, stream_wait_value, stream_wait_value_bounded


def _stride(seed_name: str, seed_value: int | None, our_name: str, our_value: int | None) -> int:
    if seed_value is None and our_value is None:
        raise TypeError(f"transfer_hicache_all_layer_mla: missing required keyword argument {seed_name!r}")
    if seed_value is not None and our_value is not None:
        raise TypeError(f"transfer_hicache_all_layer_mla: give {seed_name} or {our_name}, not both")
    return seed_value if seed_value is not None else our_value  # type: ignore[return-value]


def transfer_hicache_all_layer_mla(
    ptr_dst: torch.Tensor,
    indices_dst: torch.Tensor,
    ptr_src: torch.Tensor,
    indices_src: torch.Tensor,
    *,
    cache_src_stride_bytes: int | None = None,
    cache_dst_stride_bytes: int | None = None,
    element_size: int | None = None,
    unroll: int | None = None,
    block_quota: int | None = None,
    page_size: int | None = None,
    kv_cache_src_stride_bytes: int | None = None,
    kv_cache_dst_stride_bytes: int | None = None,
) -> None:
    """Every layer of an MLA cache (one cache per layer, no V) in one launch. ``ptr_*`` are uint64
    CUDA tensors ``[num_layers]`` of per-layer base addresses; row ``r`` of a layer starts
    ``r * stride_bytes`` after its base. The strides are required, under either spelling;
    ``element_size`` (bytes per row) defaults to the stride when both strides are equal."""
    src_stride = _stride(
        "cache_src_stride_bytes", cache_src_stride_bytes, "kv_cache_src_stride_bytes", kv_cache_src_stride_bytes
    )
    dst_stride = _stride(
        "cache_dst_stride_bytes", cache_dst_stride_bytes, "kv_cache_dst_stride_bytes", kv_cache_dst_stride_bytes
    )
    _hicache.transfer_hicache_all_layer_mla(
        ptr_dst,
        indices_dst,
        ptr_src,
        indices_src,
        kv_cache_src_stride_bytes=src_stride,
        kv_cache_dst_stride_bytes=dst_stride,
        element_size=element_size,
        unroll=unroll,
        block_quota=block_quota,
        page_size=page_size,
    )


__all__ = [
    "DEFAULT_BLOCK_QUOTA",
    "Event",
    "StreamWaitTimeout",
    "can_use_hicache_jit_kernel",
    "can_use_page_unified_load_back_jit_kernel",
    "can_use_write_back_jit_kernel",
    "default_unroll",
    "stream_wait_value",
    "stream_wait_value_bounded",
    "transfer_hicache_all_layer",
    "transfer_hicache_all_layer_mla",
    "transfer_hicache_all_layer_mla_staged_lf_page_unified",
    "transfer_hicache_all_layer_mla_staged_lf_pf",
    "transfer_hicache_all_layer_staged_lf_page_unified",
    "transfer_hicache_all_layer_staged_lf_pf",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
    "transfer_hicache_one_layer_mla_page_unified_lf",
    "transfer_hicache_one_layer_page_unified_lf",
    "uses_bulk_copy_kernel",
]
