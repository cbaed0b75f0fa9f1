"""``jit_kernel.benchmark.utils.multigpu_bench_main``: the torchrun entry point of multi-GPU
benchmark scripts (SGLang 0.5.16's call form). On the CPU: which world sizes run, the torchrun
command and environment, ``--num-gpu``, failures and timeouts (torchrun replaced by a recorder or a
slow child), and the inner side (rank setup, stdout of other ranks, exit status). On two GPUs: a
script relaunched under the real torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from jit_kernel.benchmark import multigpu
from jit_kernel.benchmark.utils import multigpu_bench_main


class FakePopen:
    """Records each torchrun launch; ``codes`` are the exit statuses, in launch order."""

    launches: ClassVar[list[tuple[list[str], dict[str, str]]]] = []
    codes: ClassVar[list[int]] = []

    def __init__(self, command: list[str], env: dict[str, str], start_new_session: bool) -> None:
        assert start_new_session
        FakePopen.launches.append((command, env))
        self.pid = -1

    def wait(self, timeout: float | None = None) -> int:
        return FakePopen.codes.pop(0) if FakePopen.codes else 0


@pytest.fixture
def fake_torchrun(monkeypatch: pytest.MonkeyPatch) -> type[FakePopen]:
    FakePopen.launches, FakePopen.codes = [], []
    monkeypatch.setattr(multigpu.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv(multigpu.ENV_KEY, raising=False)
    monkeypatch.setattr(sys, "argv", ["bench.py"])
    return FakePopen


def test_runs_each_world_size_the_host_has(fake_torchrun: type[FakePopen], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[int]] = []
    monkeypatch.setattr(sys, "argv", ["bench.py", "--rows", "8"])
    multigpu_bench_main("__main__", "/x/bench.py", range(2, 9), lambda: None, pre_launch_fn=seen.append)
    assert seen == [[2, 3, 4]]
    commands = [command for command, _ in fake_torchrun.launches]
    assert commands == [multigpu.torchrun_command(n, "/x/bench.py", ["--rows", "8"]) for n in (2, 3, 4)]
    assert commands[0][:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert commands[0][3:8] == ["--nproc_per_node", "2", "--local-addr", "127.0.0.1", "/x/bench.py"]
    env = fake_torchrun.launches[0][1]
    assert env[multigpu.ENV_KEY] == str(os.getpid())
    assert env["PYTHONUNBUFFERED"] == "1" and "OMP_NUM_THREADS" in env and "GLOO_SOCKET_IFNAME" in env
    assert multigpu.ENV_KEY not in os.environ  # the outer process's own environment is left alone


def test_num_gpu_override(fake_torchrun: type[FakePopen], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.py", "--num-gpu", "4,2", "--x", "--num-gpus=2"])
    multigpu_bench_main("__main__", "b.py", [8], lambda: None)
    assert [c[3:5] for c, _ in fake_torchrun.launches] == [["--nproc_per_node", "2"], ["--nproc_per_node", "4"]]
    assert all(c[-1] == "--x" for c, _ in fake_torchrun.launches)
    for argv in (["b.py", "--num-gpu", "8"], ["b.py", "--num-gpu=1"]):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(ValueError, match=r"a world size must be in \[2, 4\]"):
            multigpu_bench_main("__main__", "b.py", [2], lambda: None)
    with pytest.raises(ValueError, match="needs a value"):
        multigpu.num_gpus_override(["--num-gpu"])
    with pytest.raises(ValueError, match="comma-separated GPU counts"):
        multigpu.num_gpus_override(["--num-gpu", "two"])
    assert multigpu.num_gpus_override(["a", "b"]) == (None, ["a", "b"])


def test_single_gpu_sizes_are_refused_and_none_runnable_is_a_no_op(fake_torchrun: type[FakePopen]) -> None:
    with pytest.raises(ValueError, match="world sizes of 2 or more"):
        multigpu_bench_main("__main__", "b.py", [1, 2], lambda: None)
    called: list[object] = []
    multigpu_bench_main("__main__", "b.py", [8], lambda: None, pre_launch_fn=called.append)
    assert fake_torchrun.launches == [] and called == []


def test_a_failed_world_size_ends_with_its_status(fake_torchrun: type[FakePopen]) -> None:
    fake_torchrun.codes = [0, 3]
    with pytest.raises(SystemExit) as exited:
        multigpu_bench_main("__main__", "b.py", [2, 3, 4], lambda: None)
    assert exited.value.code == 3
    assert len(fake_torchrun.launches) == 2  # the 4-GPU run never started


def test_imported_not_run_only_warns(fake_torchrun: type[FakePopen], caplog: pytest.LogCaptureFixture) -> None:
    multigpu_bench_main("bench", "b.py", [2], lambda: pytest.fail("must not run"))
    assert fake_torchrun.launches == []
    assert "run it with `python b.py`" in caplog.text


def test_inside_torchrun_runs_main_on_the_rank_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    devices: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    monkeypatch.setenv(multigpu.ENV_KEY, "123")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after the rank-1 call silences it
    ran: list[bool] = []
    with pytest.raises(SystemExit) as exited:
        multigpu_bench_main("__main__", "b.py", [2], lambda: ran.append(True))
    assert exited.value.code == 0 and ran == [True] and devices == [1]
    assert sys.stdout.name == os.devnull  # rank 1 prints nothing
    multigpu_bench_main("not_main", "b.py", [2], lambda: pytest.fail("an import inside torchrun runs nothing"))
    monkeypatch.setenv("LOCAL_RANK", "0")

    def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):  # an exception leaves the rank with a non-zero status
        multigpu_bench_main("__main__", "b.py", [2], fails)


def test_a_timed_out_world_size_is_stopped_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun replaced by a script that starts a grandchild in a session of its own (as torchrun
    starts its workers) and sleeps: both are gone after the timeout, and the exit status is 1."""
    pid_file = tmp_path / "grandchild.pid"
    script = tmp_path / "slow.py"
    script.write_text(
        textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(120)
        """)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv(multigpu.ENV_KEY, raising=False)
    monkeypatch.setattr(sys, "argv", ["bench.py"])
    monkeypatch.setattr(multigpu, "torchrun_command", lambda n, file, args: [sys.executable, str(script)])
    start = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        multigpu_bench_main("__main__", "b.py", [2], lambda: None, timeout=3)
    assert exited.value.code == 1 and time.monotonic() - start < 60
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{grandchild}").exists():
        state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # killed, not yet reaped by its (also killed) parent's init
            break
        time.sleep(0.1)
    else:
        assert not Path(f"/proc/{grandchild}").exists()


@pytest.mark.gpu
@pytest.mark.multigpu
def test_two_gpu_script_under_torchrun(tmp_path: Path) -> None:
    """A real script on two GPUs: each rank sees its own GPU and the world size; rank 1 prints nothing."""
    out = tmp_path / "ranks"
    out.mkdir()
    script = tmp_path / "bench_two.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, torch
        from jit_kernel.benchmark.utils import multigpu_bench_main

        def main():
            rank = int(os.environ["LOCAL_RANK"])
            print("rank", rank, "prints")
            open(os.path.join({str(out)!r}, str(rank)), "w").write(
                f"{{torch.cuda.current_device()}} {{os.environ['WORLD_SIZE']}}")

        multigpu_bench_main(name=__name__, file=__file__, num_gpus=[2], main_fn=main)
        """)
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(multigpu.__file__).parents[2]), *sys.path]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.read_text() for p in out.iterdir()) == ["0 2", "1 2"]
    assert "rank 0 prints" in done.stdout and "rank 1 prints" not in done.stdout
