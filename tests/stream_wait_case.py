"""One stream-wait scenario in a fresh process, so that no kernel it uses has been loaded yet.

    python tests/stream_wait_case.py <order> <mode> <device_index> <warm|cold> [watchdog_s]

order: ``wait_first`` (the consumer's wait is enqueued before the producer has ever launched a
kernel in this process) or ``producer_first``. mode: ``event`` (``Event.wait``), ``event_timeout``
(``Event.wait(timeout=...)``), ``bounded`` (``stream_wait_value_bounded``, which may time out but
must say so), ``timeout`` (nobody records: the timeout is reported and the consumer stays held
until released). The current device stays cuda:0, whatever device the tensors are on. ``warm``
launches every kernel of the scenario once first, as a serving engine's warm-up does; ``cold``
leaves them unloaded. On a timeout of the watchdog, the stack of the stuck thread is printed.

Prints one JSON line; tests/test_stream_wait.py runs this under a watchdog (CUDA_MODULE_LOADING
as the test chooses) and checks it.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import time

import torch

from jit_kernel.ops.stream_wait import (
    STATUS_DONE,
    STATUS_TIMED_OUT,
    Event,
    stream_wait_value_bounded,
    uses_driver_stream_ops,
)

SLEEP_CYCLES = 200_000_000  # ~0.1 s: the consumer is queued long before the producer is done


def main(order: str, mode: str, index: int, warm: bool) -> dict[str, object]:
    device = torch.device("cuda", index)
    # torch.empty runs no kernel: cold, the producer's fill_ and the consumer's add are first launched below.
    x = torch.empty(1 << 20, dtype=torch.float32, device=device)
    event = Event(device)
    status = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    producer, consumer = torch.cuda.Stream(device), torch.cuda.Stream(device)
    if warm:
        with torch.cuda.device(device):
            torch.cuda._sleep(1)
        x.fill_(0)
        _ = x + 1
        stream_wait_value_bounded(event.flag, 0, status, 0.0)
    torch.cuda.synchronize(device)
    result: dict[str, object] = {"driver_ops": uses_driver_stream_ops()}

    def produce() -> None:
        with torch.cuda.stream(producer):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.fill_(41)
            event.record(1)

    def consume() -> tuple[torch.Tensor, torch.cuda.Event]:
        with torch.cuda.stream(consumer):
            if mode == "bounded":
                stream_wait_value_bounded(event.flag, 1, status, 5.0)
            else:
                event.wait(1, timeout=0.3 if mode == "timeout" else (30.0 if mode == "event_timeout" else None))
            y = x + 1
            done = torch.cuda.Event()
            done.record()
        return y, done

    if mode == "timeout":
        with torch.cuda.stream(producer):
            x.fill_(41)
        producer.synchronize()
        y, done = consume()
        start = time.monotonic()
        result["timed_out"] = event.timed_out()
        result["reported_after_s"] = round(time.monotonic() - start, 3)
        time.sleep(0.2)
        result["consumer_held"] = not done.query()
        with torch.cuda.stream(producer):
            event.record(1)  # release the held stream
    elif order == "wait_first":
        y, done = consume()
        produce()
    else:
        produce()
        y, done = consume()
    done.synchronize()
    torch.cuda.synchronize(device)
    values = y.unique().tolist()
    result["values"] = values
    if mode == "event_timeout":
        result["timed_out"] = event.timed_out()
    if mode == "bounded":
        result["status"] = {STATUS_DONE: "done", STATUS_TIMED_OUT: "timed_out"}.get(int(status.item()), "pending")
    return result


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(sys.argv[5]) if len(sys.argv) > 5 else 50.0, exit=True)
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "warm")), flush=True)
