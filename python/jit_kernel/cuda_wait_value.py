"""``jit_kernel.cuda_wait_value``: the seed's flag-based stream wait (``sglang.jit_kernel.cuda_wait_value``).

``Event()`` holds an int32 flag on the current CUDA device; ``record(value=1)`` sets it in the
current stream's order, ``wait(value=1)`` holds the current stream until it equals ``value``;
``stream_wait_value(flag, value)`` waits on any int32 CUDA flag tensor. These are the names of
``jit_kernel.ops.stream_wait``, which waits with the driver's stream memory operations instead of
the seed's spinning kernel (so the wait may be enqueued before or after the record) and adds
``Event(device)``, ``wait(value, timeout=...)`` and ``reset()``.
"""

from __future__ import annotations

from jit_kernel.ops.stream_wait import Event, stream_wait_value

__all__ = ["Event", "stream_wait_value"]
