"""The prebuilt library: manifest vs generated sources, exports, machine code, host-only builds."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_ffi

from jit_kernel.engine import aot, env, families, prebuilt, toolchain
from jit_kernel.engine.unit import TranslationUnit

REPO_ROOT = Path(__file__).resolve().parent.parent
installed = pytest.mark.skipif(
    env.DATA_ROOT != env.PACKAGE_DIR, reason="needs the installed wheel (a source checkout has no prebuilt library)"
)


def _manifest() -> prebuilt.Manifest:
    manifest = prebuilt.manifest()
    assert manifest is not None, "the installed wheel carries no prebuilt manifest"
    return manifest


@installed
def test_manifest_matches_freshly_generated_sources(tmp_path: Path) -> None:
    manifest = _manifest()
    cuda_entries = [s for s in manifest.symbols.values() if s.target == "cuda"]
    archs = ";".join(str(a) for a in cuda_entries[0].machine_code) if cuda_entries else "none"
    generated = aot.generate(tmp_path, archs, manifest.cuda_version, manifest.tvm_ffi_version)
    installed_manifest = json.loads((prebuilt.LIBRARY_DIR / prebuilt.MANIFEST_NAME).read_text())
    assert generated["symbols"] == installed_manifest["symbols"]
    units = "\n".join(p.read_text() for p in tmp_path.rglob("*") if p.suffix in (".cpp", ".cu"))
    exported = set(re.findall(r"TVM_FFI_DLL_EXPORT_TYPED_FUNC\((\w+),", units))
    assert exported == set(manifest.symbols)


@installed
def test_manifest_covers_every_family_grid_with_current_unit_digests() -> None:
    manifest = _manifest()
    for spec in families.ALL_FAMILIES:
        if spec.target == "cuda" and manifest.cuda_version is None:
            continue
        for config in spec.prebuilt:
            unit = TranslationUnit.for_config(spec, config)
            for export, (symbol, _) in zip(spec.exports, unit.exports, strict=True):
                entry = manifest.symbols[symbol]
                assert (entry.family, entry.export, entry.config) == (spec.family, export, config)
                assert entry.unit_digest == unit.digest()
                if spec.target == "cuda":
                    assert entry.machine_code, f"{symbol} has no machine code"


@installed
def test_library_needs_no_cuda_runtime_library() -> None:
    """cudart is linked statically, so the library loads where no CUDA libraries are installed."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not installed")
    headers = subprocess.run([objdump, "-p", str(_manifest().library)], capture_output=True, text=True, check=True)
    needed = re.findall(r"NEEDED\s+(\S+)", headers.stdout)
    assert needed, headers.stdout
    assert not [lib for lib in needed if lib.startswith(("libcudart", "libcuda.", "libnvrtc"))], needed


@installed
def test_library_loads_without_a_gpu_and_exports_every_symbol() -> None:
    library = prebuilt.library()
    for symbol in _manifest().symbols:
        assert library.implements_function(symbol), symbol


def fatbin_entries(library: Path) -> list[tuple[str, int]]:
    """(kind, sm) of every image embedded in a CUDA library's fat binaries (no cuobjdump needed).

    A fat binary is a 16-byte header (magic 0xBA55ED50, version, header size, payload size)
    followed by entries, each with its own header: kind (1 PTX, 2 ELF) at byte 0, header size
    at byte 4, padded payload size at byte 8, and the SM version at byte 28.
    """
    data = library.read_bytes()
    magic = struct.pack("<I", 0xBA55ED50)
    found: list[tuple[str, int]] = []
    start = data.find(magic)
    while start >= 0:
        _, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, start)
        entry, end = start + header_size, start + header_size + fat_size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (sm,) = struct.unpack_from("<I", data, entry + 28)
            found.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), sm))
            entry += entry_header + payload
        start = data.find(magic, end)
    return found


@installed
def test_cuda_instantiations_are_machine_code_for_the_manifest_archs() -> None:
    manifest = _manifest()
    if manifest.cuda_version is None:
        pytest.skip("host-only prebuilt library (built without a CUDA toolkit)")
    entries = fatbin_entries(manifest.library)
    # One image per CUDA unit and arch: one unit per family, or fewer where the build merged families
    # (aot.unit_groups, by the build's job count); every unit holds every manifest arch.
    families_with_grid = sum(1 for spec in families.ALL_FAMILIES if spec.target == "cuda" and spec.prebuilt)
    units = entries.count(
        ("elf", min(a.major * 10 + a.minor for s in manifest.symbols.values() for a in s.machine_code))
    )
    assert 1 <= units <= families_with_grid, entries
    archs = {a for s in manifest.symbols.values() for a in s.machine_code}
    ptx = {a for s in manifest.symbols.values() for a in s.ptx}
    for arch in archs:
        assert entries.count(("elf", arch.major * 10 + arch.minor)) == units, entries
    for arch in ptx:
        assert entries.count(("ptx", arch.major * 10 + arch.minor)) == units, entries


def test_host_only_generation_has_no_cuda_symbols(tmp_path: Path) -> None:
    generated = aot.generate(tmp_path, "none", None, tvm_ffi.__version__)
    symbols = generated["symbols"]
    assert isinstance(symbols, dict) and symbols
    assert {s["target"] for s in symbols.values()} == {"host"}
    assert not list(tmp_path.glob("cuda/*.cu"))
    assert 'set(JIT_KERNEL_AOT_CUDA_SOURCES "")' in (tmp_path / "sources.cmake").read_text()


def _cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake not installed")
    version = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout
    major, minor = map(int, re.search(r"(\d+)\.(\d+)", version).groups())  # type: ignore[union-attr]
    if (major, minor) < (3, 26):
        pytest.skip(f"cmake {major}.{minor} is older than the 3.26 the build needs")
    return cmake


def _configure(source_env: dict[str, str], build: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_cmake(), "-S", str(REPO_ROOT), "-B", str(build), f"-DPython_EXECUTABLE={sys.executable}",
         "-DCMAKE_BUILD_TYPE=Release"],
        capture_output=True, text=True, env=source_env, check=False,
    )  # fmt: skip


def _with_gpus(bin_dir: Path, nvidia_smi: str) -> dict[str, str]:
    """The environment with an ``nvidia-smi`` that runs ``nvidia_smi`` first on PATH, and no arch list."""
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{nvidia_smi}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    environment = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    environment.pop("JIT_KERNEL_AOT_ARCHS", None)
    return environment


def test_configure_without_gpu_builds_host_only_and_says_how_to_change_it(tmp_path: Path) -> None:
    """The default of a source build on a machine without a GPU: no CUDA at all, said in one line."""
    environment = _with_gpus(tmp_path / "bin", 'echo "No devices were found"; exit 6')
    configure = _configure(environment, tmp_path / "build")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    (line,) = [line for line in configure.stdout.splitlines() if "jit_kernel: no GPU found" in line]
    assert "host-only" in line and "JIT_KERNEL_AOT_ARCHS" in line
    assert "CMAKE_CUDA_COMPILER" not in (tmp_path / "build" / "CMakeCache.txt").read_text()
    assert 'set(JIT_KERNEL_AOT_CUDA_SOURCES "")' in (tmp_path / "build" / "generated" / "sources.cmake").read_text()


def test_configure_with_a_gpu_prebuilds_its_arch(tmp_path: Path) -> None:
    """A (fake) H100 and the CUDA toolkit: the build compiles for 9.0a, compressed, and says why."""
    try:
        nvcc = toolchain.nvcc_path()
    except toolchain.ToolchainError:
        pytest.skip("no CUDA toolkit")
    environment = _with_gpus(tmp_path / "bin", 'printf "9.0\\n9.0\\n"')
    environment["CUDACXX"] = str(nvcc)
    configure = _configure(environment, tmp_path / "build")
    assert configure.returncode == 0, configure.stdout + configure.stderr
    assert "-- jit_kernel: prebuilding CUDA kernels for 9.0a, the GPUs found (compute capability 2 x 9.0)" in (
        configure.stdout
    )
    sources = (tmp_path / "build" / "generated" / "sources.cmake").read_text()
    assert 'set(JIT_KERNEL_AOT_CUDA_FLAGS "-gencode=arch=compute_90a,code=sm_90a;-Xfatbin=-compress-all")' in sources
    manifest = json.loads((tmp_path / "build" / "generated" / "prebuilt_manifest.json").read_text())
    assert {tuple(s["machine_code"]) for s in manifest["symbols"].values() if s["target"] == "cuda"} == {("9.0a",)}
    # The build type adds no flag of its own (Release: -O3 -DNDEBUG), so the code is what JIT compiles.
    build_rules = [p for p in (tmp_path / "build").rglob("*") if p.name in ("build.ninja", "flags.make")]
    assert build_rules and not [p for p in build_rules if "NDEBUG" in p.read_text()]


def test_build_without_cuda_toolkit_is_host_only_and_says_so(tmp_path: Path) -> None:
    cmake = _cmake()
    environment = {**os.environ, "CUDACXX": "/nonexistent/nvcc", "JIT_KERNEL_AOT_ARCHS": "9.0"}
    environment.pop("CUDA_HOME", None)
    configure = subprocess.run(
        [cmake, "-S", str(REPO_ROOT), "-B", str(tmp_path), f"-DPython_EXECUTABLE={sys.executable}"],
        capture_output=True, text=True, env=environment, check=False,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stderr
    assert "no CUDA toolkit found" in configure.stderr
    assert "host-only" in configure.stderr
    build = subprocess.run([cmake, "--build", str(tmp_path), "-j2"], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    manifest = json.loads((tmp_path / "generated" / "prebuilt_manifest.json").read_text())
    assert manifest["cuda_version"] is None
    assert {s["target"] for s in manifest["symbols"].values()} == {"host"}
    library = tvm_ffi.load_module(str(tmp_path / "libjit_kernel_prebuilt.so"))
    assert all(library.implements_function(symbol) for symbol in manifest["symbols"])
    # The manifest that gets installed is sealed with the linked library's size and hash.
    sealed = json.loads((tmp_path / "prebuilt_manifest.json").read_text())
    built = tmp_path / "libjit_kernel_prebuilt.so"
    assert sealed["symbols"] == manifest["symbols"]
    assert sealed["library_size"] == built.stat().st_size
    assert sealed["library_sha256"] == hashlib.sha256(built.read_bytes()).hexdigest()
