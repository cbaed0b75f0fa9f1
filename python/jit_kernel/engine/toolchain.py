"""Compilers: where they are and what version they are (the arch is :mod:`jit_kernel.engine.target`'s).

Versions enter the cache key. Asking a compiler runs it, too slow for a warm load (its cost:
docs/design/engine.md), so each answer about a file (a compiler's version, the prebuilt library's
hash) is remembered in the cache folder by :func:`memoised`, keyed by the file's identity: a new or
upgraded file is asked again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from jit_kernel.engine import diskmemo, env

_MEMO_NAME = "memo.json"  # the toolchain's answers, in the cache folder

DEFAULT_CUDA_HOME = Path("/usr/local/cuda")


class ToolchainError(RuntimeError):
    """A compiler or the CUDA arch could not be determined; the message says what to set."""


@functools.cache
def cuda_home() -> Path:
    """The CUDA toolkit root: ``$CUDA_HOME`` / ``$CUDA_PATH``, else the home of the real nvcc (the
    one on PATH may be a wrapper script, as on our dev machines: its dry run prints the real ``TOP``)."""
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

        def ask() -> str:
            dry_run = _output([nvcc_on_path, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull])
            match = re.search(r"^#\$ TOP=(.+)$", dry_run, re.MULTILINE)
            return match.group(1) if match else ""

        top = memoised(Path(nvcc_on_path), "TOP", ask)
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


def _output(command: list[str]) -> str:
    """What ``command`` prints (stdout, then stderr): an answer for :func:`memoised`."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return result.stdout + result.stderr


def memoised(path: Path, question: str, ask: Callable[[], str]) -> str:
    """``ask()`` about the file at ``path``, memoised on disk by its identity (path, size, mtime,
    inode): a warm load starts no subprocess and hashes nothing twice."""
    identity = f"{path}:{diskmemo.stamp(path)}:{question}"
    memo = diskmemo.load(_MEMO_NAME)
    if isinstance(answer := memo.get(identity), str):
        return answer
    memo[identity] = answer = ask()
    diskmemo.save(_MEMO_NAME, memo)
    return answer


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks (``hashlib.file_digest`` needs Python 3.11)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def tool_version(binary: Path) -> str:
    """The first meaningful lines of ``binary --version``."""

    def ask() -> str:
        output = _output([str(binary), "--version"])
        lines = [line for line in output.splitlines() if line.strip() and "Copyright" not in line]
        return " | ".join(lines[-2:] if "nvcc" in binary.name else lines[:1])

    return memoised(binary, "version", ask)


def system_include_dirs(compiler: Path) -> tuple[Path, ...]:
    """The folders ``compiler`` searches for ``#include <...>`` by default, as ``-E -v`` lists them."""

    def ask() -> str:
        lines = [line.strip() for line in _output([str(compiler), "-x", "c++", "-E", "-v", os.devnull]).splitlines()]
        if "#include <...> search starts here:" not in lines or "End of search list." not in lines:
            return ""
        start = lines.index("#include <...> search starts here:") + 1
        return "\n".join(lines[start : lines.index("End of search list.", start)])

    listed = (Path(line).resolve() for line in memoised(compiler, "include-dirs", ask).splitlines())
    # /usr/local/include holds what the machine's owner installed, not the compiler's or libc's.
    return tuple(folder for folder in listed if folder != Path("/usr/local/include"))


def nvcc_release() -> tuple[int, int]:
    match = re.search(r"release (\d+)\.(\d+)", tool_version(nvcc_path()))
    if match is None:
        raise ToolchainError(f"cannot parse the nvcc version from {tool_version(nvcc_path())!r}")
    return int(match.group(1)), int(match.group(2))
