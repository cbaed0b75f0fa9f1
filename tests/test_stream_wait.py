"""stream_wait: two streams that really depend on each other, under a watchdog, and the bounded
wait's timeout reported to the host as an error (the process and its CUDA context survive it)."""

from __future__ import annotations

import time

import pytest
import torch

from jit_kernel import families
from jit_kernel.dispatch import jit_module
from jit_kernel.hicache import Event, StreamWaitTimeout, stream_wait_value, stream_wait_value_bounded
from jit_kernel.ops.stream_wait import STATUS_DONE, STATUS_TIMED_OUT, check_status
from jit_kernel.spec import symbol_name

SLEEP_CYCLES = 200_000_000  # ~0.1 s at H100 clocks: the consumer is queued long before the producer is done
WATCHDOG_S = 60.0


def _wait_with_watchdog(done: torch.cuda.Event, release: Event, value: int) -> None:
    """Poll ``done``; if it has not completed within WATCHDOG_S (a deadlock), release the waiter
    from a third stream so the test fails instead of hanging CI."""
    deadline = time.monotonic() + WATCHDOG_S
    while not done.query():
        if time.monotonic() > deadline:
            with torch.cuda.stream(torch.cuda.Stream()):
                release.record(value)
            done.synchronize()
            pytest.fail(f"stream wait deadlocked: released by the watchdog after {WATCHDOG_S} s")
        time.sleep(0.001)


@pytest.mark.gpu
@pytest.mark.parametrize("bounded", [False, True])
def test_consumer_waits_for_a_slow_producer(bounded: bool) -> None:
    data = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    result = torch.zeros_like(data)
    consumed = torch.full_like(data, -1.0)
    event = Event()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (producer, consumer):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SLEEP_CYCLES)
        result.copy_(data * 2)
        event.record(7)
    with torch.cuda.stream(consumer):
        event.wait(7, timeout=WATCHDOG_S if bounded else None)
        consumed.copy_(result + 1)
        done = torch.cuda.Event()
        done.record()
    _wait_with_watchdog(done, event, 7)
    torch.cuda.synchronize()
    if bounded:
        event.check()
        assert int(event.status.item()) == STATUS_DONE
    torch.testing.assert_close(consumed, data * 2 + 1, rtol=0, atol=0)


@pytest.mark.gpu
def test_ping_pong_between_two_streams() -> None:
    """Each stream waits for the other in turn: a then b then a then b."""
    counter = torch.zeros(1, dtype=torch.float32, device="cuda")
    ping, pong = Event(), Event()
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for stream in (a, b):
        stream.wait_stream(torch.cuda.current_stream())
    rounds = 4
    for r in range(1, rounds + 1):
        with torch.cuda.stream(a):
            if r > 1:
                pong.wait(r - 1)
            torch.cuda._sleep(SLEEP_CYCLES // 8)
            counter.mul_(2)
            ping.record(r)
        with torch.cuda.stream(b):
            ping.wait(r)
            counter.add_(1)
            pong.record(r)
    with torch.cuda.stream(b):
        done = torch.cuda.Event()
        done.record()
    _wait_with_watchdog(done, pong, rounds)
    torch.cuda.synchronize()
    expected = 0.0
    for _ in range(rounds):
        expected = expected * 2 + 1
    assert counter.item() == expected


@pytest.mark.gpu
def test_bounded_wait_times_out_and_reports_it() -> None:
    event = Event()
    start = time.monotonic()
    event.wait(1, timeout=0.05)  # nobody records: gives up after 50 ms of GPU time
    with pytest.raises(StreamWaitTimeout, match="timed out"):
        event.check()
    assert time.monotonic() - start < 30
    assert int(event.status.item()) == STATUS_TIMED_OUT
    # The context is healthy: later work runs, and a satisfied bounded wait reports success.
    x = torch.ones(1000, device="cuda")
    assert float((x * 3).sum()) == 3000.0
    event.record(1)
    event.wait(1, timeout=5.0)
    event.check()
    assert not event.timed_out()
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    stream_wait_value_bounded(event.flag, 2, status, 0.0)
    with pytest.raises(StreamWaitTimeout):
        check_status(status)


@pytest.mark.gpu
def test_stream_wait_value_on_a_flag_set_earlier() -> None:
    flag = torch.full((4,), 5, dtype=torch.int32, device="cuda")
    stream_wait_value(flag, 5)  # already satisfied: returns at once
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_bad_gpu_inputs() -> None:
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="status must be an int32 tensor"):
        stream_wait_value_bounded(flag, 1, torch.zeros(2, dtype=torch.int32, device="cuda"), 1.0)
    with pytest.raises(ValueError, match="timeout_s must be a non-negative"):
        stream_wait_value_bounded(flag, 1, flag.clone(), -1.0)
    with pytest.raises(ValueError, match="flag must be a contiguous 1-D"):
        stream_wait_value(torch.zeros(2, 2, dtype=torch.int32, device="cuda"), 1)


def test_bad_inputs() -> None:
    with pytest.raises(TypeError, match=r"flag must be int32, got torch.float32"):
        stream_wait_value(torch.zeros(1), 1)
    with pytest.raises(ValueError, match="flag must be on a CUDA device, got cpu"):
        stream_wait_value(torch.zeros(1, dtype=torch.int32), 1)
    with pytest.raises(TypeError, match=r"flag must be a torch.Tensor"):
        stream_wait_value([0], 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Event: device must be a CUDA device"):
        Event("cpu")


def test_stream_wait_compiles_without_a_gpu() -> None:
    module = jit_module(families.STREAM_WAIT, (), cuda_arch="9.0a")
    for export in families.STREAM_WAIT.exports:
        assert module.implements_function(symbol_name(families.STREAM_WAIT, export, ()))
