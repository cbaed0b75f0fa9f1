"""Which archs a source build prebuilds: JIT_KERNEL_AOT_ARCHS, else the GPUs present, else host only;
and release builds name the release list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from jit_kernel.engine import aot
from jit_kernel.engine.target import Arch, parse_arch_list

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("variable", [None, "", "  "])
def test_no_gpu_and_no_variable_builds_host_only(variable: str | None) -> None:
    choice = aot.choose_archs(variable, [])
    assert choice.archs == "none"
    assert "no GPU found" in choice.message
    assert "JIT_KERNEL_AOT_ARCHS (an arch list such as 9.0a, none, or release: 8.0;" in choice.message


def test_gpus_found_give_their_archs_once_each_with_the_release_suffixes() -> None:
    choice = aot.choose_archs(None, ["9.0", "9.0", "8.0", "12.0", "10.0", "8.9", "9.0"])
    assert choice.archs == "8.0;8.9;9.0a;10.0a;12.0"  # no +PTX: the GPUs run the machine code
    assert "compute capability 1 x 8.0, 1 x 8.9, 3 x 9.0, 1 x 10.0, 1 x 12.0" in choice.message
    assert "JIT_KERNEL_AOT_ARCHS" in choice.message


def test_gpu_archs_outside_the_release_list_are_plain() -> None:
    assert aot.choose_archs(None, ["7.5", "8.6"]).archs == "7.5;8.6"
    assert aot.arch_for_gpu("10.3") == Arch(10, 3)
    assert aot.arch_for_gpu("9.0") == Arch(9, 0, "a")


def test_the_variable_wins_over_the_gpus() -> None:
    assert aot.choose_archs("8.0;12.0+PTX", ["9.0"]).archs == "8.0;12.0+PTX"
    host = aot.choose_archs("none", ["9.0"])
    assert host.archs == "none" and "host-only" in host.message and "JIT_KERNEL_AOT_ARCHS=none" in host.message


@pytest.mark.parametrize("name", ["release", "RELEASE", " release "])
def test_release_names_the_release_list(name: str) -> None:
    choice = aot.choose_archs(name, [])
    assert choice.archs == aot.RELEASE_AOT_ARCHS
    assert aot.RELEASE_AOT_ARCHS in choice.message


def test_a_bad_variable_fails_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"'9\.0x'"):
        aot.choose_archs("8.0;9.0x", ["9.0"])


def _fake_nvidia_smi(folder: Path, script: str) -> None:
    folder.mkdir(exist_ok=True)
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize(("script", "expected"), [
    ('printf "9.0\\n9.0\\n8.9\\n"', ["9.0", "9.0", "8.9"]),
    ('echo "No devices were found"; exit 6', []),  # a driver without devices
    ("echo NVIDIA-SMI has failed; exit 9", []),
    ('printf "9.0\\n[N/A]\\n"', ["9.0"]),
])  # fmt: skip
def test_gpu_capabilities_come_from_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, expected: list[str]
) -> None:
    _fake_nvidia_smi(tmp_path, script)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert aot.gpu_compute_capabilities() == expected


def test_no_nvidia_smi_means_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert aot.gpu_compute_capabilities() == []


def _archs_command(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jit_kernel.engine.aot", "archs"],
        capture_output=True, text=True, env=environment, check=False,
    )  # fmt: skip


def test_archs_command_prints_the_list_then_the_reason(tmp_path: Path) -> None:
    """What CMake reads: line 1 the list, line 2 the message it shows at the start of the build."""
    _fake_nvidia_smi(tmp_path, 'printf "10.0\\n"')
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "python")}
    found = _archs_command(base)
    assert found.returncode == 0, found.stderr
    archs, message = found.stdout.rstrip("\n").split("\n")
    assert archs == "10.0a" and message.startswith("jit_kernel: prebuilding CUDA kernels for 10.0a")
    told = _archs_command({**base, "JIT_KERNEL_AOT_ARCHS": "release"})
    assert told.stdout.splitlines()[0] == aot.RELEASE_AOT_ARCHS
    bad = _archs_command({**base, "JIT_KERNEL_AOT_ARCHS": "sm_90"})
    assert bad.returncode == 2 and "JIT_KERNEL_AOT_ARCHS" in bad.stderr and "'sm_90'" in bad.stderr


def test_cuda_build_flags() -> None:
    one = parse_arch_list("9.0a")
    assert aot.cuda_build_flags(one, compress=False) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert aot.cuda_build_flags(one, compress=True)[-1] == "-Xfatbin=-compress-all"
    several = aot.cuda_build_flags(parse_arch_list(aot.RELEASE_AOT_ARCHS), compress=False)
    assert "--threads=0" in several
    assert several[-2] == "-gencode=arch=compute_120,code=[sm_120,compute_120]"
    assert aot.cuda_build_flags([], compress=True) == []  # host only: no nvcc flags at all


# --- Release builds name the release list -------------------------------------------------------


def test_cibuildwheel_builds_the_release_list() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    environment = pyproject["tool"]["cibuildwheel"]["environment"]
    assert aot.choose_archs(environment["JIT_KERNEL_AOT_ARCHS"], ["9.0"]).archs == aot.RELEASE_AOT_ARCHS


def test_build_wheel_script_defaults_to_the_release_list() -> None:
    script = (REPO / "ci" / "build-wheel.sh").read_text()
    (default,) = re.findall(r"^export JIT_KERNEL_AOT_ARCHS=\$\{JIT_KERNEL_AOT_ARCHS:-([^}]*)\}$", script, re.MULTILINE)
    assert aot.choose_archs(default, ["9.0"]).archs == aot.RELEASE_AOT_ARCHS


def test_the_release_list_is_written_in_one_place() -> None:
    """Other files name it (release); none spells it out, so it cannot drift."""
    spelled = re.compile(r"8\.0;8\.9;9\.0a")
    for path in [REPO / "pyproject.toml", REPO / "CMakeLists.txt", *sorted((REPO / "ci").iterdir())]:
        if path.is_file():
            assert not spelled.search(path.read_text()), f"{path} spells out the release arch list"


def test_the_build_guide_counts_the_prebuilt_grid() -> None:
    """docs/build.md's build times were measured at the grid it counts: a grid that grows or shrinks
    makes this fail until the guide says so (and its times are measured again)."""
    from jit_kernel.engine.families import ALL_FAMILIES

    def symbols(target: str) -> tuple[int, int]:
        specs = [spec for spec in ALL_FAMILIES if spec.target == target and spec.prebuilt]
        return sum(len(spec.prebuilt) * len(spec.exports) for spec in specs), len(specs)

    (cuda, families), (host, _) = symbols("cuda"), symbols("host")
    guide = " ".join((REPO / "docs" / "build.md").read_text().split())
    sentence = (
        f"The grid of `families.py` has {cuda + host} prebuilt symbols: {cuda} CUDA, of {families} families, "
        f"and {host} host."
    )
    assert sentence in guide
