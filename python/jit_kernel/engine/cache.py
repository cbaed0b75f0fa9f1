"""The content-keyed disk cache of JIT-built modules.

Layout under the cache root (``$JIT_KERNEL_CACHE_DIR``, default ``~/.cache/jit_kernel``)::

    <name>-<key>/                      one published entry: the library, meta.json, the generated sources
    .staging/<entry>.<pid>.<rand>/     private build folders, renamed into place when complete
    .locks/<entry>.lock                one file lock per entry, taken only on a miss

The key hashes the recipe (:func:`cache_key`). Headers are covered the way ninja covers them: each
compile writes a depfile, and ``meta.json`` records the content hash of every file the compiler
read, however it was reached (an ``-I`` in the flags, ``#include MACRO``). A hit checks the
library's hash and that every recorded file still has its content, then loads it: no subprocess,
no lock, no write, so a read-only (baked) cache serves what it holds. An entry whose files changed
is rebuilt in its place. A miss builds in a staging folder under the lock and publishes with one
``rename`` (atomic on local filesystems and on NFS): no process ever sees a half-written library.
A staging folder exists only while its builder holds the entry's lock, so one whose lock can be
taken was left by a builder that died (kill -9, OOM, a lost node); the next build removes it. The
lock decides, not the pid in the name: pids are reused and say nothing about other hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jit_kernel.engine import builder, env, toolchain
from jit_kernel.engine.builder import BuildRequest
from jit_kernel.engine.target import Arch
from jit_kernel.engine.toolchain import sha256_file
from jit_kernel.engine.unit import relocatable_hash
from jit_kernel.version import __version__

logger = logging.getLogger("jit_kernel")

KEY_FORMAT = 4  # bump when the build recipe (builder.render) changes what a key's binary is

# Entries this process is building now. Another thread's staging folder must survive the sweep even
# where its flock does not exclude us (NFS turns flock into per-process POSIX locks).
_building: set[str] = set()


class CacheDirError(RuntimeError):
    """The cache folder cannot be written, so a module that is not cached cannot be built."""


def cache_key(request: BuildRequest) -> str:
    """The entry's name: the units' text, flags and include folders, the arch, the compilers' and
    tvm-ffi's and this package's versions. Not the headers' contents: those are the entry's recorded
    dependencies, checked on every load (:func:`verified_library`)."""
    import tvm_ffi

    material: dict[str, Any] = {
        "format": KEY_FORMAT,
        "jit_kernel": __version__,
        "tvm_ffi": str(tvm_ffi.__version__),
        "name": request.name,
        "units": [[unit.language, unit.text(), unit.compile_args()] for unit in request.units],
        "extra_ldflags": request.extra_ldflags,
        "cxx": [toolchain.tool_version(toolchain.host_compiler()), env.cxx()],
    }
    if request.has_cuda:
        material["nvcc"] = toolchain.tool_version(toolchain.nvcc_path())
        material["arch"] = request.arch
    return relocatable_hash(json.dumps(material, sort_keys=True))


def entry_path(request: BuildRequest, root: Path | None = None) -> Path:
    """Where ``request``'s build lives (or would live) in the cache."""
    return (root or env.cache_dir()) / f"{request.name}-{cache_key(request)}"


def _dependencies(request: BuildRequest, files: list[Path]) -> dict[str, list[Any]]:
    """``path -> [size, sha256]`` for every file the compilers read, except the system's, CUDA's and
    tvm-ffi's headers (the key holds their versions; checking ~300 of them would cost more than the
    whole warm load). Files under the package, the sources' folders or a given include folder count."""
    import tvm_ffi.libinfo

    compiler = toolchain.host_compiler()
    versioned = [compiler.parent.parent / "include", compiler.parent.parent / "lib"]
    versioned += [*toolchain.system_include_dirs(compiler), Path(tvm_ffi.libinfo.find_include_path()).parent]
    versioned += [toolchain.cuda_home()] if request.has_cuda else []
    ours = [
        env.DATA_ROOT,
        *(d for u in request.units for d in u.include_dirs),
        *(p.parent for u in request.units for p in u.sources),
    ]
    return {
        str(path): [path.stat().st_size, sha256_file(path)]
        for path in files
        if any(path.is_relative_to(root) for root in ours) or not any(path.is_relative_to(root) for root in versioned)
    }


def _has_content(path: Path, size: int, digest: str) -> bool:
    try:
        return path.stat().st_size == size and sha256_file(path) == digest
    except OSError:
        return False


def _check_entry(entry: Path) -> tuple[Path | None, str | None]:
    """(library, None) when the entry is complete and every file it records (the library, what its
    compilers read) has its content; (None, the file that changed); (None, None) when it is corrupt."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        library = entry / meta["library"]
        if not _has_content(library, meta["size"], meta["sha256"]):
            return None, None
        for name, (size, digest) in meta["dependencies"].items():
            if not _has_content(Path(name), size, digest):
                return None, name
        return library, None
    except (OSError, ValueError, KeyError, TypeError):
        return None, None


def verified_library(entry: Path) -> Path | None:
    """The entry's library if it is complete, uncorrupted and up to date, else None."""
    return _check_entry(entry)[0]


def _unusable(root: Path, error: OSError) -> CacheDirError:
    where = f"{error.strerror}: {error.filename}" if error.strerror else str(error)
    return CacheDirError(
        f"cannot write to the JIT cache at {root} ({where}); set JIT_KERNEL_CACHE_DIR to a writable folder "
        "(modules already in a read-only cache still load from it)"
    )


def _discard(entry: Path) -> None:
    """Move a bad entry out of the way atomically, then delete it. The trash folder is named after
    the entry, so that the sweep removes it if this process dies before the delete ends."""
    trash = entry.parent / ".staging" / f"{entry.name}.discarded.{secrets.token_hex(4)}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _lock(entry: Path, wait: bool = True) -> Iterator[bool]:
    """Hold ``entry``'s file lock. With ``wait=False``, yields False at once if another holds it."""
    import filelock  # only a miss needs it; at import time every process would pay (docs/design/engine.md)

    path = entry.parent / ".locks" / f"{entry.name}.lock"
    lock = filelock.FileLock(str(path))
    held = True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=1 if wait else 0)
        except filelock.Timeout:
            held = wait
            if wait:
                logger.info("waiting for another process to finish building %s", entry.name)
                lock.acquire()
    except OSError as error:  # filelock.Timeout (an OSError) never gets here
        raise _unusable(entry.parent, error) from error
    try:
        yield held
    finally:
        if held:
            lock.release()


def sweep_staging(root: Path, held: str | None = None) -> None:
    """Remove the staging folders (and trash) of builds that died: those whose entry lock is free.
    ``held`` is an entry whose lock the caller holds and whose staging folders are all stale."""
    try:
        folders = list((root / ".staging").iterdir())
    except OSError:
        return
    by_entry: dict[str, list[Path]] = {}
    for folder in folders:
        by_entry.setdefault(folder.name.split(".", 1)[0], []).append(folder)
    for entry, stale in by_entry.items():
        if entry in _building and entry != held:
            continue
        with contextlib.nullcontext(True) if entry == held else _lock(root / entry, wait=False) as free:
            for folder in stale if free else []:
                shutil.rmtree(folder, ignore_errors=True)


def _publish(request: BuildRequest, entry: Path) -> Path:
    """Build into a private folder and rename it into place. The caller holds the entry's lock."""
    root = entry.parent
    staging = root / ".staging" / f"{entry.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        staging.mkdir(parents=True)
    except OSError as error:
        raise _unusable(root, error) from error
    target = f"for {Arch.parse(request.arch).sm}" if request.arch else "for the host"
    logger.info("compiling %s %s (first use; cached afterwards)", request.name, target)
    start = time.perf_counter()
    try:
        built, read = builder.build(request, staging)
        for leftover in [*staging.glob("*.o"), *staging.glob("*.o.d")]:
            leftover.unlink()
        # A rebuild (a header changed) lands at the same entry: a new file name keeps dlopen from
        # handing back the old build, which it still holds under the old name.
        digest = sha256_file(built)
        library = built.rename(built.with_name(f"{request.name}.{digest[:12]}.so"))
        meta = {
            "name": request.name,
            "description": request.description,
            "library": library.name,
            "size": library.stat().st_size,
            "sha256": digest,
            "arch": request.arch,
            "dependencies": _dependencies(request, read),
        }
        (staging / "depends.txt").write_text("".join(f"{path}\n" for path in read))
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


def _load_entry(entry: Path, warn: bool = True) -> Any | None:
    """The entry's module, or None when it is missing, incomplete, corrupt or fails to load."""
    library, changed = _check_entry(entry)
    if library is None:
        if changed is not None:  # not a fault: load_or_build says so once when it rebuilds
            logger.debug("%s changed since %s was built; not using that build", changed, entry.name)
        elif warn and entry.exists():
            logger.warning("cached entry %s is incomplete or corrupt; not using it", entry)
        return None
    try:
        return _load(library)
    except Exception as error:
        if warn:
            logger.warning("cached %s failed to load (%s); not using it", library, error)
        return None


def load_cached(request: BuildRequest, root: Path | None = None) -> Any | None:
    """The module if the cache holds a good build of ``request``, else None; only reads."""
    return _load_entry(entry_path(request, root))


def load_or_build(request: BuildRequest, root: Path | None = None) -> Any:
    """Return the loaded tvm-ffi Module for ``request``, building it on a miss."""
    entry = entry_path(request, root)
    module = _load_entry(entry)
    if module is not None:
        return module
    with _lock(entry):
        module = _load_entry(entry, warn=False)  # another process may have built it meanwhile
        if module is not None:
            return module
        _building.add(entry.name)
        try:
            sweep_staging(entry.parent, held=entry.name)
            if entry.exists():
                changed = _check_entry(entry)[1]
                if changed is not None:
                    logger.info("%s changed since %s was built; rebuilding it", changed, entry.name)
                _discard(entry)
            library = _publish(request, entry)
        finally:
            _building.discard(entry.name)
    return _load(library)


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    path: Path
    name: str
    description: str
    arch: str | None
    size_bytes: int
    valid: bool
    changed: str | None = None  # a file the build read that has changed since (the entry is stale)

    @property
    def state(self) -> str:
        if self.valid:
            return "ok"
        return f"STALE ({self.changed} changed)" if self.changed else "CORRUPT"


def list_entries(root: Path | None = None) -> list[CacheEntry]:
    root = root or env.cache_dir()
    entries = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            meta = json.loads((entry / "meta.json").read_text())
        except (OSError, ValueError):
            meta = {}
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        library, changed = _check_entry(entry)
        entries.append(
            CacheEntry(
                path=entry,
                name=str(meta.get("name", entry.name)),
                description=str(meta.get("description", "")),
                arch=meta.get("arch"),
                size_bytes=size,
                valid=library is not None,
                changed=changed,
            )
        )
    return entries


def total_size(root: Path | None = None) -> int:
    return sum(f.stat().st_size for f in (root or env.cache_dir()).rglob("*") if f.is_file())


def clear(root: Path | None = None) -> int:
    """Remove every entry (and leftover staging folders); returns how many entries went."""
    root = root or env.cache_dir()
    entries = list_entries(root)
    for entry in entries:
        _discard(entry.path)
    sweep_staging(root)  # leaves the folders of builds still running
    return len(entries)
