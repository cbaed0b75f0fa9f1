"""``jit_kernel.hicache``: KV-cache row transfers between GPU and pinned host memory, and the
flag-based stream wait used to order them (the public names of ``jit_kernel.ops.hicache`` and
``jit_kernel.ops.stream_wait``)."""

from __future__ import annotations

from jit_kernel.ops.hicache import (
    DEFAULT_BLOCK_QUOTA,
    can_use_hicache_jit_kernel,
    default_unroll,
    transfer_hicache_all_layer,
    transfer_hicache_all_layer_mla,
    transfer_hicache_one_layer,
    transfer_hicache_one_layer_mla,
)
from jit_kernel.ops.stream_wait import Event, StreamWaitTimeout, stream_wait_value, stream_wait_value_bounded

__all__ = [
    "DEFAULT_BLOCK_QUOTA",
    "Event",
    "StreamWaitTimeout",
    "can_use_hicache_jit_kernel",
    "default_unroll",
    "stream_wait_value",
    "stream_wait_value_bounded",
    "transfer_hicache_all_layer",
    "transfer_hicache_all_layer_mla",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
]
