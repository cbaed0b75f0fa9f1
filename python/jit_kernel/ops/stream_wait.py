"""stream_wait: the current CUDA stream waits, on the GPU, until a flag in device memory holds a value.

Unlike ``torch.cuda.Event``, the signal is a plain int32 in memory: anything that can write it
(:meth:`Event.record` on another stream, ``Tensor.fill_``, another process through CUDA IPC)
releases the waiter.

The wait and the write are the driver's stream memory operations (``cuStreamWaitValue32`` /
``cuStreamWriteValue32``): they hold or signal a stream without running a kernel, so a wait takes
no SM and a record never needs a kernel loaded.

One hazard remains that no stream-holding wait avoids. Under CUDA's default lazy module loading,
the first launch of a kernel never launched before in the process synchronises the context; if
a wait is then holding a stream whose producer has not been enqueued yet, that launch blocks the
host for ever (with this wait and with a spinning kernel alike; docs/troubleshooting.md). Launch each
kernel once before relying on wait-first order (the warm-up a serving engine does before CUDA
graph capture), or start the process with ``CUDA_MODULE_LOADING=EAGER``.

Timeouts:

- :meth:`Event.wait` with ``timeout`` holds the stream until the flag arrives, like the unbounded
  wait, so work queued behind it never runs on stale data. :meth:`Event.timed_out` /
  :meth:`Event.check` tell the host when the flag has not arrived within ``timeout`` seconds of
  the ``wait`` call. Release a stream whose producer is gone with :meth:`Event.record` from
  another stream.
- :func:`stream_wait_value_bounded` stops waiting on the GPU after ``timeout_s`` and lets the
  stream go on, recording the outcome in a status word (for CUDA graphs, where no host is around
  to decide). The caller asks for that by choosing it, and must read the status
  (:func:`check_status`). It is a spinning kernel: under lazy loading it may hold back a
  producer's first kernel launch for up to ``timeout_s``, then report a timeout.
"""

from __future__ import annotations

import time

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import STREAM_WAIT
from jit_kernel.ops._common import KernelTable, Launch, kernel_op

_STREAM_WAIT = Dispatcher(STREAM_WAIT)

#: Values of the status word written by the bounded wait (csrc/stream_wait.cuh).
STATUS_PENDING, STATUS_DONE, STATUS_TIMED_OUT = 0, 1, 2
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class StreamWaitTimeout(RuntimeError):
    """A bounded stream wait gave up before its flag reached the value."""


def _check_value(fn: str, value: object) -> int:
    """C++ takes an int32 already converted, so a value out of range is Python's to refuse."""
    if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(f"{fn}: value must be an int32, got {value!r}")
    return value


def _check_timeout(fn: str, timeout_s: object) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s >= 0:
        raise ValueError(f"{fn}: timeout_s must be a non-negative number of seconds, got {timeout_s!r}")
    return float(timeout_s)


# No config: the key () picks the family's one translation unit.
_KERNELS = {export: KernelTable(_STREAM_WAIT, export, lambda: ()) for export in ("wait", "write", "wait_bounded")}

# The launchers own the tensor rules (csrc/stream_wait.cuh: ``flag`` one-dimensional int32 on a GPU,
# ``status`` one int32 on that GPU or pinned); Python converts the scalars C++ takes already converted.


@kernel_op("stream_wait_value", register=False)
def stream_wait_value(flag: torch.Tensor, value: int) -> Launch:
    """Make the current stream wait until ``flag[0] == value`` (no timeout)."""
    return _KERNELS["wait"], (), (flag, _check_value("stream_wait_value", value)), None


@kernel_op("stream_write_value", register=False)
def stream_write_value(flag: torch.Tensor, value: int) -> Launch:
    """Set ``flag[0] = value`` on the current stream once its earlier work is done (no kernel)."""
    return _KERNELS["write"], (), (flag, _check_value("stream_write_value", value)), None


@kernel_op("stream_wait_value_bounded", register=False)
def stream_wait_value_bounded(flag: torch.Tensor, value: int, status: torch.Tensor, timeout_s: float) -> Launch:
    """Wait until ``flag[0] == value`` for at most ``timeout_s`` seconds of GPU time, then go on.

    The wait writes ``status[0]``: :data:`STATUS_DONE` when the flag arrived,
    :data:`STATUS_TIMED_OUT` when it gave up (the stream then goes on: work queued behind it
    runs whether or not the producer has finished). ``status`` is one int32, in device memory on
    the flag's device or in pinned host memory (which the host can read while the stream is
    busy). Read it once the wait has run, e.g. with :func:`check_status`.
    """
    fn = "stream_wait_value_bounded"
    value = _check_value(fn, value)
    timeout_ns = min(int(_check_timeout(fn, timeout_s) * 1e9), 2**63 - 1)
    if isinstance(status, torch.Tensor) and status.dim() != 1 and status.numel() == 1:
        status = status.view(1)  # one element of any shape; C++ checks the rest
    return _KERNELS["wait_bounded"], (), (flag, value, status, timeout_ns), None


def check_status(status: torch.Tensor, what: str = "stream wait") -> None:
    """Raise :class:`StreamWaitTimeout` if a bounded wait recorded a timeout in ``status``.

    A device ``status`` is read with a sync of the current stream: call it once the wait has run.
    """
    if int(status.view(-1)[0].item()) == STATUS_TIMED_OUT:
        raise StreamWaitTimeout(f"{what} timed out: the flag never reached the awaited value")


def _cuda_device(device: torch.device | str | int | None) -> torch.device:
    resolved = None
    if device is not None:
        resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if resolved.type != "cuda":
            raise ValueError(f"Event: device must be a CUDA device, got {resolved}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "jit_kernel.Event needs a CUDA GPU, and torch sees none "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none'}); "
            "flag events synchronise CUDA streams and have no CPU form"
        )
    if resolved is None or resolved.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return resolved


class Event:
    """A flag-based event, as in the seeds: ``record(value)`` on one stream, ``wait(value)`` on another.

    ``record`` writes the flag in stream order and ``wait`` holds the current stream until the
    flag equals the value; neither runs a kernel, so the order in which they are enqueued does not
    matter. ``wait(value, timeout=seconds)`` also starts a host-side deadline: :meth:`timed_out`
    and :meth:`check` report a flag that has not arrived within ``timeout`` seconds of the call.
    The stream stays held until the flag arrives, so nothing queued behind the wait runs on stale
    data; ``record`` from another stream releases it.
    """

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        device = _cuda_device(device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)
        self._arrived: torch.cuda.Event | None = None
        self._deadline = 0.0

    @property
    def device(self) -> torch.device:
        return self.flag.device

    def record(self, value: int = 1) -> None:
        """Set the flag to ``value`` once the current stream's earlier work is done."""
        _check_value("Event.record", value)
        _KERNELS["write"][()](self.flag, value)

    def wait(self, value: int = 1, *, timeout: float | None = None) -> None:
        """The current stream waits until the flag is ``value``. With ``timeout`` (seconds),
        :meth:`timed_out` reports a flag that did not arrive within that time of this call."""
        _check_value("Event.wait", value)
        if timeout is not None:
            timeout = _check_timeout("Event.wait", timeout)
        _KERNELS["wait"][()](self.flag, value)
        if timeout is None:
            self._arrived = None
            return
        arrived = torch.cuda.Event()
        arrived.record(torch.cuda.current_stream(self.flag.device))
        self._arrived, self._deadline = arrived, time.monotonic() + timeout

    def timed_out(self) -> bool:
        """Whether the last :meth:`wait` with a timeout is still unsatisfied at its deadline.

        Returns as soon as the wait is satisfied, or at the deadline: it never blocks for ever.
        """
        arrived = self._arrived
        if arrived is None:
            return False
        pause = 1e-5
        while not arrived.query():
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return True
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, 1e-3)
        return False

    def check(self) -> None:
        """Raise :class:`StreamWaitTimeout` if the last :meth:`wait` with a timeout is unsatisfied
        at its deadline."""
        if self.timed_out():
            raise StreamWaitTimeout(
                "Event.wait timed out: the flag never reached the awaited value; the waiting stream is still "
                "held (record the value from another stream to release it)"
            )

    def reset(self, value: int = 0) -> None:
        """Set the flag back (in stream order) and forget the last deadline."""
        self.record(value)
        self._arrived = None


def uses_driver_stream_ops() -> bool:
    """Whether this driver has the stream memory operations that waits and writes use."""
    return bool(_STREAM_WAIT.function("uses_driver_ops", ())())


__all__ = [
    "STATUS_DONE",
    "STATUS_PENDING",
    "STATUS_TIMED_OUT",
    "Event",
    "StreamWaitTimeout",
    "check_status",
    "stream_wait_value",
    "stream_wait_value_bounded",
    "stream_write_value",
    "uses_driver_stream_ops",
]
