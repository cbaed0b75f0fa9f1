"""The content-keyed disk cache of JIT-built modules.

Layout under the cache root (``$JIT_KERNEL_CACHE_DIR``, default ``~/.cache/jit_kernel``)::

    <name>-<key>/            one published entry: <name>.so, meta.json, the generated sources
    .staging/<entry>.<pid>.<rand>/   private build folders, renamed into place when complete
    .locks/<entry>.lock      one file lock per entry, taken only on a miss

The key hashes everything that can change the binary: the text of every source and header the
build includes (found by following ``#include`` lines through the package's and the user's
include folders), the flags, the arch, the compiler versions, tvm-ffi's and this package's
versions. A hit reads ``meta.json``, checks the library's size and hash, and loads it: no ninja,
no lock. A miss builds in a staging folder under the lock and publishes with one ``rename``,
which is atomic on local filesystems and on NFS, so no process ever sees a half-written library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jit_kernel import env, toolchain
from jit_kernel.arch import Arch
from jit_kernel.sources import included_files
from jit_kernel.version import __version__

logger = logging.getLogger("jit_kernel")

KEY_FORMAT = 1
_ENV_LOCK = threading.Lock()  # tvm-ffi reads the arch and CUDA home from os.environ


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    """Everything that defines one module build. ``arch`` is None for a host-only module."""

    name: str
    cpp_source: str
    cuda_source: str
    source_files: tuple[Path, ...]
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    extra_include_paths: tuple[Path, ...] = ()
    arch: str | None = None
    # Human-readable origin, e.g. "add_constant<5>"; recorded in meta.json, not part of the key.
    description: str = dataclasses.field(default="", compare=False)

    @property
    def has_cuda(self) -> bool:
        return bool(self.cuda_source)

    @property
    def include_search_path(self) -> tuple[Path, ...]:
        return (*self.extra_include_paths, env.INCLUDE_DIR, env.CSRC_DIR)


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_key(request: BuildRequest) -> str:
    files = included_files(request.source_files, request.include_search_path)
    material: dict[str, Any] = {
        "format": KEY_FORMAT,
        "jit_kernel": __version__,
        "tvm_ffi": _tvm_ffi_version(),
        "name": request.name,
        "cpp_source": request.cpp_source,
        "cuda_source": request.cuda_source,
        "extra_cflags": request.extra_cflags,
        "extra_cuda_cflags": request.extra_cuda_cflags,
        "extra_ldflags": request.extra_ldflags,
        "extra_include_paths": [str(p) for p in request.extra_include_paths],
        "files": {str(p): hashlib.sha256(text).hexdigest() for p, text in sorted(files.items())},
        "cxx": toolchain.tool_version(toolchain.host_compiler()),
    }
    if request.has_cuda:
        material["nvcc"] = toolchain.tool_version(toolchain.nvcc_path())
        material["arch"] = request.arch
    # The same package installed elsewhere gives the same key: only contents count.
    serialized = json.dumps(material, sort_keys=True).replace(str(env.DATA_ROOT), "<jit_kernel>")
    return hashlib.sha256(serialized.encode()).hexdigest()[:24]


def _tvm_ffi_version() -> str:
    import tvm_ffi

    return str(tvm_ffi.__version__)


def entry_name(request: BuildRequest, key: str) -> str:
    return f"{request.name}-{key}"


def verified_library(entry: Path) -> Path | None:
    """The entry's library if it is complete and matches its recorded hash, else None."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        library = entry / meta["library"]
        if library.stat().st_size != meta["size"] or _sha256_file(library) != meta["sha256"]:
            return None
        return library
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _discard(entry: Path, root: Path) -> None:
    """Move a bad entry out of the way atomically, then delete it."""
    trash = root / ".staging" / f"discarded.{entry.name}.{secrets.token_hex(4)}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _lock(root: Path, entry: str) -> Iterator[None]:
    import filelock  # only a miss needs it; importing it costs ~8 ms of every process start

    path = root / ".locks" / f"{entry}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(path))
    try:
        lock.acquire(timeout=1)
    except filelock.Timeout:
        logger.info("waiting for another process to finish building %s", entry)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


@contextlib.contextmanager
def _build_environment(request: BuildRequest) -> Iterator[None]:
    """tvm-ffi takes the CUDA home and arch from the environment; set them for this build only."""
    if not request.has_cuda:
        yield
        return
    assert request.arch is not None
    wanted = {"CUDA_HOME": str(toolchain.cuda_home()), "TVM_FFI_CUDA_ARCH_LIST": request.arch}
    with _ENV_LOCK:
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def _compile(request: BuildRequest, folder: Path) -> Path:
    import tvm_ffi.cpp

    ldflags = list(request.extra_ldflags)
    if request.has_cuda:
        # Lets the module load (dlopen) without LD_LIBRARY_PATH, also on a machine with no GPU.
        ldflags.append(f"-Wl,-rpath,{toolchain.cuda_home() / 'lib64'}")
    with _build_environment(request):
        built = tvm_ffi.cpp.build_inline(
            request.name,
            cpp_sources=request.cpp_source or None,
            cuda_sources=request.cuda_source or None,
            extra_cflags=list(request.extra_cflags),
            extra_cuda_cflags=list(request.extra_cuda_cflags),
            extra_ldflags=ldflags,
            extra_include_paths=[str(p) for p in request.include_search_path],
            build_directory=str(folder),
        )
    return Path(built)


def _publish(request: BuildRequest, key: str, root: Path) -> Path:
    """Build into a private folder and rename it into place. The caller holds the entry's lock."""
    entry = root / entry_name(request, key)
    staging = root / ".staging" / f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    target = f"for {Arch.parse(request.arch).sm}" if request.arch else "for the host"
    logger.info("compiling %s %s (first use; cached afterwards)", request.name, target)
    start = time.perf_counter()
    try:
        library = _compile(request, staging)
        for leftover in staging.glob("*.o"):
            leftover.unlink()
        meta = {
            "name": request.name,
            "description": request.description,
            "key": key,
            "library": library.name,
            "size": library.stat().st_size,
            "sha256": _sha256_file(library),
            "arch": request.arch,
            "jit_kernel": __version__,
            "created": time.time(),
            "sources": [str(p) for p in request.source_files],
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=1))
        os.rename(staging, entry)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("compiled %s in %.2f s", request.name, time.perf_counter() - start)
    return entry / library.name


def _load(library: Path) -> Any:
    import tvm_ffi

    return tvm_ffi.load_module(str(library))


def load_or_build(request: BuildRequest, root: Path | None = None) -> Any:
    """Return the loaded tvm-ffi Module for ``request``, building it on a miss."""
    root = root if root is not None else env.cache_dir()
    key = cache_key(request)
    entry = root / entry_name(request, key)
    library = verified_library(entry)
    if library is not None:
        try:
            return _load(library)
        except Exception as error:
            logger.warning("cached %s failed to load (%s); rebuilding it", library, error)
    elif entry.exists():
        logger.warning("cached entry %s is incomplete or corrupt; rebuilding it", entry)
    with _lock(root, entry.name):
        library = verified_library(entry)
        if library is not None:
            with contextlib.suppress(Exception):
                return _load(library)
        if entry.exists():
            _discard(entry, root)
        library = _publish(request, key, root)
    return _load(library)


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    path: Path
    name: str
    description: str
    arch: str | None
    size_bytes: int
    created: float
    valid: bool


def list_entries(root: Path | None = None) -> list[CacheEntry]:
    root = root if root is not None else env.cache_dir()
    entries = []
    if not root.is_dir():
        return entries
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            meta = json.loads((entry / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        entries.append(
            CacheEntry(
                path=entry,
                name=str(meta.get("name", entry.name)),
                description=str(meta.get("description", "")),
                arch=meta.get("arch"),
                size_bytes=size,
                created=float(meta.get("created", 0.0)),
                valid=verified_library(entry) is not None,
            )
        )
    return entries


def total_size(root: Path | None = None) -> int:
    root = root if root is not None else env.cache_dir()
    if not root.is_dir():
        return 0
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def clear(root: Path | None = None) -> int:
    """Remove every entry (and leftover staging folders); returns how many entries went."""
    root = root if root is not None else env.cache_dir()
    removed = 0
    for entry in list_entries(root):
        _discard(entry.path, root)
        removed += 1
    shutil.rmtree(root / ".staging", ignore_errors=True)
    return removed
