"""stream_wait: the current CUDA stream waits, on the GPU, until a flag in device memory holds a value.

Unlike ``torch.cuda.Event``, the signal is a plain int32 in memory: anything that can write it
(a kernel on another stream, ``Tensor.fill_``, another process through CUDA IPC) releases the
waiter, and the waiting stream stays busy (one thread of one SM) while it waits.

An unbounded wait whose signal never comes hangs the stream for good. :meth:`Event.wait` with a
``timeout`` (or :func:`stream_wait_value_bounded`) stops after that much GPU time and records
the outcome in a status word; :meth:`Event.check` reads it and raises
:class:`StreamWaitTimeout`. The kernel never traps: a trap would poison the CUDA context.
"""

from __future__ import annotations

import torch

from jit_kernel.dispatch import Dispatcher
from jit_kernel.families import STREAM_WAIT

_STREAM_WAIT = Dispatcher(STREAM_WAIT)

#: Values of the status word written by the bounded wait (csrc/stream_wait.cuh).
STATUS_PENDING, STATUS_DONE, STATUS_TIMED_OUT = 0, 1, 2
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class StreamWaitTimeout(RuntimeError):
    """A bounded stream wait gave up before its flag reached the value."""


def _check_flag(fn: str, flag: torch.Tensor, value: int) -> None:
    if not isinstance(flag, torch.Tensor):
        raise TypeError(f"{fn}: flag must be a torch.Tensor, got {type(flag).__name__}")
    if flag.dtype != torch.int32:
        raise TypeError(f"{fn}: flag must be int32, got {flag.dtype}")
    if not flag.is_cuda:
        raise ValueError(f"{fn}: flag must be on a CUDA device, got {flag.device}")
    if flag.numel() < 1:
        raise ValueError(f"{fn}: flag must have at least one element")
    if flag.dim() != 1 or not flag.is_contiguous():
        raise ValueError(f"{fn}: flag must be a contiguous 1-D tensor, got shape {tuple(flag.shape)}")
    if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{fn}: value must be an int32, got {value!r}")


def stream_wait_value(flag: torch.Tensor, value: int) -> None:
    """Make the current stream wait until ``flag[0] == value`` (no timeout)."""
    _check_flag("stream_wait_value", flag, value)
    _STREAM_WAIT.function("wait", ())(flag, value)


def stream_wait_value_bounded(flag: torch.Tensor, value: int, status: torch.Tensor, timeout_s: float) -> None:
    """Like :func:`stream_wait_value`, but stop after ``timeout_s`` seconds of waiting on the GPU.

    The kernel writes ``status[0]``: :data:`STATUS_DONE` when the flag arrived,
    :data:`STATUS_TIMED_OUT` when it gave up (the stream then goes on). Read it after the wait
    has run, e.g. with :func:`check_status`.
    """
    fn = "stream_wait_value_bounded"
    _check_flag(fn, flag, value)
    if not isinstance(status, torch.Tensor) or status.dtype != torch.int32 or status.numel() != 1:
        raise TypeError(f"{fn}: status must be an int32 tensor with one element")
    if status.device != flag.device:
        raise ValueError(f"{fn}: status must be on the flag's device {flag.device}, got {status.device}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s >= 0:
        raise ValueError(f"{fn}: timeout_s must be a non-negative number of seconds, got {timeout_s!r}")
    timeout_ns = min(int(timeout_s * 1e9), 2**63 - 1)
    _STREAM_WAIT.function("wait_bounded", ())(flag, value, status.view(1), timeout_ns)


def check_status(status: torch.Tensor, what: str = "stream wait") -> None:
    """Raise :class:`StreamWaitTimeout` if a bounded wait recorded a timeout in ``status``.

    Reads one int from the GPU (a sync of the current stream): call it once the wait has run.
    """
    if int(status.view(-1)[0].item()) == STATUS_TIMED_OUT:
        raise StreamWaitTimeout(f"{what} timed out: the flag never reached the awaited value")


class Event:
    """A flag-based event, as in the seeds: ``record(value)`` on one stream, ``wait(value)`` on another.

    ``record`` writes the flag in stream order (a one-element ``fill_``); ``wait`` queues a
    spinning kernel on the current stream. ``wait(value, timeout=seconds)`` is bounded: after
    it has run, :meth:`check` raises :class:`StreamWaitTimeout` if it gave up.
    """

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"Event: device must be a CUDA device, got {device}")
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self.status = torch.zeros(1, dtype=torch.int32, device=device)
        self._wait_stream: torch.cuda.Stream | None = None

    def record(self, value: int = 1) -> None:
        """Set the flag to ``value`` once the current stream's earlier work is done."""
        if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
            raise ValueError(f"Event.record: value must be an int32, got {value!r}")
        self.flag.fill_(value)

    def wait(self, value: int = 1, *, timeout: float | None = None) -> None:
        """The current stream waits until the flag is ``value`` (at most ``timeout`` seconds if given)."""
        if timeout is None:
            stream_wait_value(self.flag, value)
            return
        self._wait_stream = torch.cuda.current_stream(self.flag.device)
        stream_wait_value_bounded(self.flag, value, self.status, timeout)

    def timed_out(self) -> bool:
        """Whether the last bounded :meth:`wait` gave up. Waits for that wait to finish first."""
        if self._wait_stream is not None:
            self._wait_stream.synchronize()
        return int(self.status.item()) == STATUS_TIMED_OUT

    def check(self) -> None:
        """Raise :class:`StreamWaitTimeout` if the last bounded :meth:`wait` gave up."""
        if self.timed_out():
            raise StreamWaitTimeout("Event.wait timed out: the flag never reached the awaited value")

    def reset(self, value: int = 0) -> None:
        """Set the flag back (in stream order) and clear the status word."""
        self.flag.fill_(value)
        self.status.zero_()


__all__ = [
    "STATUS_DONE",
    "STATUS_PENDING",
    "STATUS_TIMED_OUT",
    "Event",
    "StreamWaitTimeout",
    "check_status",
    "stream_wait_value",
    "stream_wait_value_bounded",
]
