"""Multi-GPU benchmark scripts under torchrun: :func:`multigpu_bench_main` (the call form of
``sglang.jit_kernel.benchmark.utils.multigpu_bench_main``, SGLang 0.5.16).

A script ends with::

    multigpu_bench_main(name=__name__, file=__file__, num_gpus=range(2, 9), main_fn=benchmark.run)

Run with plain ``python script.py [--num-gpu 2,4] [args...]``, the call relaunches the script under
torchrun once per world size in ``num_gpus`` that the host has GPUs for (``--num-gpu`` picks the
sizes instead, and each must exist), one after the other. Inside torchrun the same call runs
``main_fn()`` on every rank, with rank ``LOCAL_RANK``'s GPU current and the stdout of every rank but
0 discarded, and exits with 0; an exception exits non-zero. A failed or timed-out world size ends
the outer process with its exit status (1 for a timeout).

Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

logger = logging.getLogger("jit_kernel")

#: Set (to the outer process's pid) in the environment of the torchrun children.
ENV_KEY = "_JIT_KERNEL_MULTIGPU_BENCH"


def num_gpus_override(argv: Sequence[str]) -> tuple[list[int] | None, list[str]]:
    """``--num-gpu N``, ``--num-gpus 2,4``, ``--num-gpu=2``, repeatable, taken out of ``argv``:
    (the world sizes, or None when none was given; the other arguments, forwarded to the script)."""
    sizes: list[int] = []
    rest: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--num-gpu", "--num-gpus"):
            if i + 1 >= len(args):
                raise ValueError(f"{arg} needs a value, e.g. `{arg} 2,4`")
            value, i = args[i + 1], i + 2
        elif arg.startswith(("--num-gpu=", "--num-gpus=")):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        try:
            sizes.extend(int(part) for part in value.split(","))
        except ValueError:
            raise ValueError(f"--num-gpu takes comma-separated GPU counts, got {value!r}") from None
    return (sizes or None), rest


def torchrun_command(nproc: int, file: str, args: Sequence[str]) -> list[str]:
    """torchrun, from this interpreter's torch, on one host (``--local-addr 127.0.0.1``)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--local-addr", "127.0.0.1",
        file, *args,
    ]  # fmt: skip


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere). torchrun starts each worker in a
    session of its own, so killing torchrun's process group does not reach them."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ends torchrun and its workers: SIGTERM (torchrun forwards it to its workers), then, after a
    grace period, SIGKILL to every process still below it and to its process group."""
    below = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in [*below, *_descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def multigpu_bench_main(
    name: str,
    file: str,
    num_gpus: Sequence[int],
    main_fn: Callable[[], None],
    *,
    pre_launch_fn: Callable[[list[int]], None] | None = None,
    timeout: int | None = None,
) -> None:
    """Run ``main_fn`` on every rank of torchrun, once per world size in ``num_gpus`` (module docstring).

    ``name`` / ``file``: the script's ``__name__`` and ``__file__`` (an import, not a run, only warns).
    ``pre_launch_fn(sizes)`` runs once in the outer process before the first torchrun, with the
    world sizes that will run (e.g. to compile kernels into the JIT cache for the children).
    ``timeout``: seconds each torchrun may take (None: no limit); on expiry torchrun and its workers
    are stopped and the process exits with 1."""
    import torch

    if os.environ.get(ENV_KEY):
        if name != "__main__":
            return
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        if rank != 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (kept open until the process exits)
        torch.cuda.set_device(rank)
        main_fn()
        sys.exit(0)
    if name != "__main__":
        logger.warning(
            "%s is a multi-GPU benchmark: run it with `python %s`, which relaunches it under torchrun", file, file
        )
        return
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    override, forwarded = num_gpus_override(sys.argv[1:])
    if override is not None:
        for size in override:
            if size <= 1 or size > available:
                raise ValueError(f"--num-gpu {size}: a world size must be in [2, {available}] on this host")
        sizes = sorted(set(override))
    else:
        sizes = []
        for size in sorted(set(num_gpus)):
            if size <= 1:
                raise ValueError(f"num_gpus holds {size}: a multi-GPU benchmark needs world sizes of 2 or more")
            if size > available:
                logger.warning("skipping the %d-GPU run: %d GPU(s) visible", size, available)
            else:
                sizes.append(size)
    if not sizes:
        return
    if pre_launch_fn is not None:
        pre_launch_fn(list(sizes))
    env = dict(os.environ)
    env[ENV_KEY] = str(os.getpid())
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host
    env.setdefault("PYTHONUNBUFFERED", "1")  # a killed run keeps the output it printed
    for size in sizes:
        logger.info("running %s on %d GPUs", file, size)
        proc = subprocess.Popen(torchrun_command(size, file, forwarded), env=env, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            logger.error("%s on %d GPUs timed out after %s s", file, size, timeout)
            sys.exit(1)
        except BaseException:  # an interrupt: take torchrun and its workers down too
            _stop(proc)
            raise
        if returncode != 0:
            logger.error("%s failed on %d GPUs (exit status %d)", file, size, returncode)
            sys.exit(returncode if returncode > 0 else 1)
    logger.info("%s passed on %s GPUs", file, ", ".join(map(str, sizes)))


__all__ = ["ENV_KEY", "multigpu_bench_main", "num_gpus_override", "torchrun_command"]
