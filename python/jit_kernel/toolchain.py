"""Compilers: where they are and what version they are (the arch is :mod:`jit_kernel.target`'s).

Versions enter the cache key. Asking a compiler for its version costs 5-50 ms, too much for a
warm load, so each answer is remembered in the cache folder, keyed by the binary's path, size
and mtime: a new or upgraded compiler is asked again.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from jit_kernel import env

DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


class ToolchainError(RuntimeError):
    """A compiler or the CUDA arch could not be determined; the message says what to set."""


@functools.cache
def cuda_home() -> Path:
    """The CUDA toolkit root: ``$CUDA_HOME`` / ``$CUDA_PATH``, else the home of the real nvcc.

    The ``nvcc`` on PATH may be a wrapper script (as ``/usr/local/bin/nvcc`` is on our dev
    machines), so its parent is not the toolkit. nvcc's dry run prints the real ``TOP``.
    """
    configured = env.cuda_home()
    if configured is not None:
        var, home = configured
        if not (home / "bin" / "nvcc").is_file():
            raise ToolchainError(f"${var}={home} has no bin/nvcc; point it at a CUDA toolkit")
        return home.resolve()
    nvcc_on_path = shutil.which("nvcc")
    if nvcc_on_path is not None:
        real = Path(nvcc_on_path).resolve()
        if (real.parent.parent / "include" / "cuda_runtime.h").is_file():
            return real.parent.parent
        top = _memoised(Path(nvcc_on_path), "TOP", lambda: _toolkit_of_wrapper(nvcc_on_path))
        if top and (Path(top) / "bin" / "nvcc").is_file():
            return Path(top).resolve()
    if (DEFAULT_CUDA_HOME / "bin" / "nvcc").is_file():
        return DEFAULT_CUDA_HOME.resolve()
    raise ToolchainError(
        "nvcc not found: CUDA kernels are compiled on first use and need the CUDA toolkit. "
        "Install it (for example the `cuda-nvcc` package, or the NVIDIA CUDA toolkit) and set "
        "CUDA_HOME=/path/to/cuda, or put its bin/ on PATH."
    )


def nvcc_path() -> Path:
    return cuda_home() / "bin" / "nvcc"


def host_compiler() -> Path:
    """The host C++ compiler: ``$CXX`` (as tvm-ffi's build honours it), else ``c++``."""
    name = env.cxx() or "c++"
    found = shutil.which(name)
    if found is None:
        raise ToolchainError(f"host C++ compiler {name!r} not found: install g++ (or clang++) or set CXX")
    return Path(found).resolve()


def _version_memo_path() -> Path:
    return env.cache_dir() / "toolchain-versions.json"


def _toolkit_of_wrapper(nvcc: str) -> str:
    """The toolkit root behind an nvcc wrapper script: nvcc's dry run prints it as ``TOP``."""
    dry_run = subprocess.run(
        [nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], capture_output=True, text=True, check=False
    )
    match = re.search(r"^#\$ TOP=(.+)$", dry_run.stdout + dry_run.stderr, re.MULTILINE)
    return match.group(1) if match else ""


def _memoised(binary: Path, question: str, ask: Callable[[], str]) -> str:
    """``ask()`` about ``binary``, memoised on disk by the binary's identity (path, size, mtime):
    a warm load starts no subprocess, and a new or upgraded binary is asked again."""
    stat = binary.stat()
    identity = f"{binary}:{stat.st_size}:{stat.st_mtime_ns}" + (f":{question}" if question else "")
    memo_path = _version_memo_path()
    try:
        memo: dict[str, str] = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if identity in memo:
        return memo[identity]
    memo[identity] = answer = ask()
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        staging = memo_path.with_name(f"{memo_path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(memo, indent=1, sort_keys=True))
        os.replace(staging, memo_path)
    except OSError:
        pass  # A read-only cache folder only costs the next process one more probe.
    return answer


def tool_version(binary: Path) -> str:
    """The first meaningful lines of ``binary --version``, memoised on disk by binary identity."""

    def ask() -> str:
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
        lines = [line for line in result.stdout.splitlines() if line.strip() and "Copyright" not in line]
        return " | ".join(lines[-2:] if "nvcc" in binary.name else lines[:1])

    return _memoised(binary, "", ask)


def system_include_dirs(compiler: Path) -> tuple[Path, ...]:
    """The folders ``compiler`` searches for ``#include <...>`` by default (its own headers, the C
    library's), as ``compiler -E -v`` lists them; memoised on disk by the compiler's identity."""

    def ask() -> str:
        result = subprocess.run(
            [str(compiler), "-x", "c++", "-E", "-v", os.devnull], capture_output=True, text=True, check=False
        )
        lines = [line.strip() for line in result.stderr.splitlines()]
        if "#include <...> search starts here:" not in lines or "End of search list." not in lines:
            return ""
        start = lines.index("#include <...> search starts here:") + 1
        return "\n".join(lines[start : lines.index("End of search list.", start)])

    listed = (Path(line).resolve() for line in _memoised(compiler, "include-dirs", ask).splitlines())
    # /usr/local/include holds what the machine's owner installed, not the compiler's or libc's.
    return tuple(folder for folder in listed if folder != Path("/usr/local/include"))


def nvcc_release() -> tuple[int, int]:
    match = re.search(r"release (\d+)\.(\d+)", tool_version(nvcc_path()))
    if match is None:
        raise ToolchainError(f"cannot parse the nvcc version from {tool_version(nvcc_path())!r}")
    return int(match.group(1)), int(match.group(2))


def current_cuda_arch() -> str:
    """The arch JIT compiles for here (seed API; :func:`jit_kernel.target.current` owns the rule)."""
    from jit_kernel import target

    return str(target.current().arch)
