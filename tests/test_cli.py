"""``python -m jit_kernel``: clangd, doctor, list, warm, cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_ffi.libinfo

import jit_kernel
from jit_kernel import cli
from jit_kernel.engine import cache, env

# The CLI subprocess imports the same jit_kernel as this process (installed, or the source checkout).
PACKAGE_PARENT = str(Path(jit_kernel.__file__).resolve().parent.parent)


def run_cli(*args: str, cwd: Path | None = None, **environment: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "jit_kernel", *args],
        capture_output=True, text=True, cwd=cwd, env={**os.environ, "PYTHONPATH": path, **environment}, check=False,
    )  # fmt: skip


def test_clangd_writes_config_and_never_overwrites(tmp_path: Path) -> None:
    result = run_cli("clangd", "--cuda-arch", "9.0a", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / ".clangd").read_text()
    assert text.startswith("CompileFlags:\n  Add:\n")
    for flag in ("-xcuda", "--cuda-gpu-arch=sm_90a", "-std=c++20"):
        assert f"    - {flag}\n" in text
    assert f"-isystem{env.INCLUDE_DIR}\n" in text
    assert f"-isystem{tvm_ffi.libinfo.find_include_path()}\n" in text

    (tmp_path / ".clangd").write_text("mine\n")
    refused = run_cli("clangd", cwd=tmp_path)
    assert refused.returncode != 0
    assert "--overwrite" in refused.stderr
    assert (tmp_path / ".clangd").read_text() == "mine\n"

    replaced = run_cli("clangd", "--overwrite", "--cuda-arch", "8.0", cwd=tmp_path)
    assert replaced.returncode == 0
    assert "--cuda-gpu-arch=sm_80" in (tmp_path / ".clangd").read_text()


def test_clangd_rejects_a_bad_arch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error (status 2, the option and the reason on stderr), not a traceback; nothing written."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["clangd", "--cuda-arch", "sm90", "--output", str(tmp_path / ".clangd")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--arch='sm90'" in err and "invalid CUDA arch" in err and "Traceback" not in err
    assert not (tmp_path / ".clangd").exists()


def test_doctor_reports_and_passes(tmp_path: Path) -> None:
    result = run_cli("doctor", JIT_KERNEL_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    for line in (
        "jit-kernel ",
        "torch ",
        "apache-tvm-ffi ",
        "nvcc ",
        "host compiler ",
        "GPU ",
        "prebuilt ",
        "cache ",
        "decisions ",
    ):
        assert line in result.stdout
    assert "[ok]   host self-test" in result.stdout
    assert "healthy" in result.stdout
    if "none visible, and no JIT_KERNEL_CUDA_ARCH" in result.stdout:  # no arch: the self-test says how to set one
        assert "[skip] CUDA self-test: no CUDA GPU is visible" in result.stdout
        assert "JIT_KERNEL_CUDA_ARCH" in result.stdout and "or pass --arch 9.0a" in result.stdout


def test_doctor_fails_with_the_reason_when_the_host_compiler_is_missing(tmp_path: Path) -> None:
    result = run_cli("doctor", JIT_KERNEL_CACHE_DIR=str(tmp_path), CXX="no-such-compiler-xyz")
    assert result.returncode != 0
    assert "unhealthy" in result.stderr
    assert "host self-test failed" in result.stderr
    assert "no-such-compiler-xyz" in result.stderr


def test_warm_then_list_then_clear(tmp_path: Path) -> None:
    warmed = run_cli(
        "warm", "add_constant_host", "--config", "41", "--config", "constant=42", "-j", "2",
        JIT_KERNEL_CACHE_DIR=str(tmp_path),
    )  # fmt: skip
    assert warmed.returncode == 0, warmed.stderr
    assert warmed.stdout.count("  ready  add_constant_host<") == 2
    listed = run_cli("list", "add_constant_host", JIT_KERNEL_CACHE_DIR=str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    assert "add_constant_host (host" in listed.stdout
    assert "grid      add_constant_host<1>" in listed.stdout
    assert "jit-cache add_constant_host<41>" in listed.stdout
    assert "jit-cache add_constant_host<42>" in listed.stdout
    assert "add_constant (cuda" not in listed.stdout
    cache_listed = run_cli("cache", "list", JIT_KERNEL_CACHE_DIR=str(tmp_path))
    assert "2 modules" in cache_listed.stdout
    cleared = run_cli("cache", "clear", JIT_KERNEL_CACHE_DIR=str(tmp_path))
    assert "removed 2 modules" in cleared.stdout
    assert cache.list_entries(tmp_path) == []


def test_list_explain_names_the_flags_and_the_reason(tmp_path: Path) -> None:
    """One command answers "which flags compile this kernel, and why is it (not) prebuilt?"."""
    listed = run_cli(
        "list", "add_constant", "--config", "5", "--explain",
        JIT_KERNEL_CACHE_DIR=str(tmp_path), JIT_KERNEL_CUDA_ARCH="9.0a",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "target sm_90a from JIT_KERNEL_CUDA_ARCH" in listed.stdout
    assert "add_constant<5>" in listed.stdout and "-> jit (" in listed.stdout
    assert "flags    -std=c++20 -O3 --expt-relaxed-constexpr" in listed.stdout
    assert "exports  add_constant__run__5" in listed.stdout
    assert "digest   now " in listed.stdout
    assert run_cli("list", "add_constant", "add_constant_host", "--config", "5").returncode == 2


def test_warm_a_cuda_config_for_a_named_arch_without_a_gpu(tmp_path: Path) -> None:
    warmed = run_cli("warm", "add_constant", "--config", "43", "--arch", "9.0a", JIT_KERNEL_CACHE_DIR=str(tmp_path))
    assert warmed.returncode == 0, warmed.stderr
    assert "add_constant<43> for sm_90a" in warmed.stdout
    (entry,) = cache.list_entries(tmp_path)
    assert entry.arch == "9.0a" and entry.valid and entry.description == "add_constant<43>"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("warm", "no_such_family"), "unknown kernel family"),
        (("warm", "add_constant_host", "--config", "1,2"), "add_constant_host takes 1 parameter(s) (constant), got 2"),
        (("warm", "add_constant_host", "--config", "width=3"), "missing ['constant']"),
    ],
)
def test_warm_rejects_bad_requests(args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's status for a usage error, with the reason on stderr. Run in this process: ``python -m
    jit_kernel`` is ``cli.main`` (the tests above run it as a command), and any exception other than
    the usage error's SystemExit fails the test with its traceback."""
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
