"""The content-keyed build cache: keying, concurrency, corruption, toolchain discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import jit_kernel
from jit_helpers import recorded_logs, write_host_kernel
from jit_kernel.engine import cache, target, toolchain
from jit_kernel.engine.jit import make_build_request

# Subprocesses import the same jit_kernel as this process (installed, or the source checkout).
PACKAGE_PARENT = Path(jit_kernel.__file__).resolve().parent.parent


def _request(folder: Path, **overrides: object) -> cache.BuildRequest:
    kwargs: dict[str, object] = {
        "cpp_files": [str(folder / "kernel.cc")],
        "cpp_wrappers": [("value", "user::value")],
        "extra_include_paths": [str(folder)],
    }
    kwargs.update(overrides)
    return make_build_request("cache_test", **kwargs)  # type: ignore[arg-type]


def _corrupt(library: Path, content: bytes) -> None:
    """Put bad bytes at the library's path as a new file. Rewriting it in place would also
    corrupt this process's own mapping of it (the test loaded it), and crash it with SIGBUS."""
    staged = library.with_suffix(".corrupt")
    staged.write_bytes(content)
    os.replace(staged, library)


def test_unchanged_sources_never_rebuild(tmp_path: Path) -> None:
    write_host_kernel(tmp_path / "src")
    root = tmp_path / "cache"
    with recorded_logs() as logs:
        assert cache.load_or_build(_request(tmp_path / "src"), root).value() == 101
        assert cache.load_or_build(_request(tmp_path / "src"), root).value() == 101
    assert len(logs.compiles()) == 1
    assert len(cache.list_entries(root)) == 1


@pytest.mark.parametrize("edited", ["value.h", "userlib/offset.h"])
def test_edited_header_rebuilds(tmp_path: Path, edited: str) -> None:
    """Both a quoted header next to the source and one reached through extra_include_paths."""
    folder = tmp_path / "src"
    write_host_kernel(folder)
    root = tmp_path / "cache"
    assert cache.load_or_build(_request(folder), root).value() == 101
    header = folder / edited
    header.write_text(header.read_text().replace("= 1;", "= 2;").replace("= 100;", "= 200;"))
    expected = 102 if edited == "value.h" else 201
    with recorded_logs() as logs:
        assert cache.load_or_build(_request(folder), root).value() == expected
    assert len(logs.compiles()) == 1
    assert len(cache.list_entries(root)) == 1  # rebuilt in place of the stale build


def test_package_headers_are_recorded_dependencies(tmp_path: Path) -> None:
    """The compiler's own depfile names every header it read: the package's and the user's."""
    folder = write_host_kernel(tmp_path / "src").parent
    request = _request(folder)
    cache.load_or_build(request, tmp_path / "cache")
    meta = json.loads((cache.entry_path(request, tmp_path / "cache") / "meta.json").read_text())
    recorded = [Path(p) for p in meta["dependencies"]]
    assert any(p.name == "utils.h" and p.parent.name == "sgl_kernel" for p in recorded)
    assert any(p.name == "offset.h" for p in recorded)
    assert not any(p.name == "vector" for p in recorded)  # the compiler's own headers: keyed by its version


def test_key_covers_flags_arch_and_wrappers(tmp_path: Path) -> None:
    folder = write_host_kernel(tmp_path).parent
    base = cache.cache_key(_request(folder))
    assert cache.cache_key(_request(folder)) == base
    assert cache.cache_key(_request(folder, extra_cflags=["-DX=1"])) != base
    assert cache.cache_key(_request(folder, extra_ldflags=["-lm"])) != base
    assert cache.cache_key(_request(folder, cpp_wrappers=[("v", "user::value")])) != base
    cuda = {"cuda_wrappers": [("f", "f")], "cpp_wrappers": None}
    key_90 = cache.cache_key(_request(folder, cuda_arch="9.0a", **cuda))
    key_80 = cache.cache_key(_request(folder, cuda_arch="8.0", **cuda))
    assert key_90 != key_80


def test_corrupt_library_is_detected_rebuilt_and_loaded(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write_host_kernel(folder)
    root = tmp_path / "cache"
    request = _request(folder)
    cache.load_or_build(request, root)
    (entry,) = cache.list_entries(root)
    library = next(entry.path.glob("*.so"))
    _corrupt(library, library.read_bytes()[: library.stat().st_size // 3])  # truncated
    assert not cache.list_entries(root)[0].valid
    # A new process, as dlopen would hand this process its already-loaded copy.
    script = f"""
import sys; sys.path.insert(0, {str(PACKAGE_PARENT)!r})
from jit_kernel.engine import cache
from jit_kernel.engine.jit import make_build_request
from pathlib import Path
request = make_build_request("cache_test", cpp_files=[{str(folder / "kernel.cc")!r}],
    cpp_wrappers=[("value", "user::value")], extra_include_paths=[{str(folder)!r}])
print("value", cache.load_or_build(request, Path({str(root)!r})).value())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "value 101" in result.stdout
    assert "corrupt" in result.stderr and "compiling" in result.stderr
    assert [e.valid for e in cache.list_entries(root)] == [True]


def test_garbage_library_of_the_right_size_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write_host_kernel(folder)
    root = tmp_path / "cache"
    request = _request(folder)
    cache.load_or_build(request, root)
    (entry,) = cache.list_entries(root)
    library = next(entry.path.glob("*.so"))
    _corrupt(library, b"\0" * library.stat().st_size)
    assert cache.verified_library(entry.path) is None


def test_eight_concurrent_processes_compile_once(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    write_host_kernel(folder)
    root = tmp_path / "cache"
    start_at = time.time() + 3.0  # every process waits for this instant, then asks at once
    script = textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(PACKAGE_PARENT)!r})
        from pathlib import Path
        from jit_kernel.engine import cache
        from jit_kernel.engine.jit import make_build_request
        request = make_build_request("concurrent", cpp_files=[{str(folder / "kernel.cc")!r}],
            cpp_wrappers=[("value", "user::value")], extra_include_paths=[{str(folder)!r}])
        time.sleep(max(0.0, {start_at} - time.time()))
        print("value", cache.load_or_build(request, Path({str(root)!r})).value())
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    assert all("value 101" in out for out, _ in outputs)
    compiles = sum(err.count("compiling jit_kernel_concurrent for the host") for _, err in outputs)
    assert compiles == 1
    assert [e.valid for e in cache.list_entries(root)] == [True]
    assert not any((root / ".staging").iterdir())


def test_cuda_home_resolves_through_a_wrapper_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = toolchain.cuda_home()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real / "bin" / "nvcc"} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    toolchain.cuda_home.cache_clear()
    try:
        assert toolchain.cuda_home() == real
        toolchain.cuda_home.cache_clear()  # a new process: the dry run's answer is memoised on disk
        monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("nvcc was asked again"))
        assert toolchain.cuda_home() == real
    finally:
        toolchain.cuda_home.cache_clear()


def test_missing_nvcc_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    toolchain.cuda_home.cache_clear()
    try:
        with pytest.raises(toolchain.ToolchainError, match="CUDA_HOME"):
            toolchain.cuda_home()
        monkeypatch.delenv("CUDA_HOME")
        monkeypatch.setenv("PATH", str(tmp_path))
        monkeypatch.setattr(toolchain, "DEFAULT_CUDA_HOME", tmp_path / "absent")
        with pytest.raises(toolchain.ToolchainError, match=r"nvcc not found.*Install.*CUDA_HOME"):
            toolchain.cuda_home()
    finally:
        toolchain.cuda_home.cache_clear()


def test_no_gpu_and_no_override_asks_for_the_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("JIT_KERNEL_CUDA_ARCH", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(toolchain.ToolchainError, match="JIT_KERNEL_CUDA_ARCH"):
        str(target.current().arch)
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0")
    assert str(target.current().arch) == "9.0"
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "sm90")
    with pytest.raises(ValueError, match="invalid CUDA arch"):
        str(target.current().arch)


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((8, 0), "8.0"), ((8, 9), "8.9"), ((9, 0), "9.0a"), ((10, 0), "10.0a"), ((10, 3), "10.3a"), ((12, 0), "12.0f")],
)
def test_arch_suffix_rules(capability: tuple[int, int], expected: str) -> None:
    assert str(target.arch_for_capability(*capability)) == expected  # nvcc 13 here: family targets exist


def test_host_compiler_honours_cxx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "g++")
    assert toolchain.host_compiler().name.startswith("g++") or "g++" in toolchain.host_compiler().name
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(toolchain.ToolchainError, match="CXX"):
        toolchain.host_compiler()
