"""The content-keyed disk cache of JIT-built modules.

Layout under the cache root (``$JIT_KERNEL_CACHE_DIR``, default ``~/.cache/jit_kernel``)::

    <name>-<key>/                      one published entry: <name>.so, meta.json, the generated sources
    .staging/<entry>.<pid>.<rand>/     private build folders, renamed into place when complete
    .locks/<entry>.lock                one file lock per entry, taken only on a miss

The key hashes the recipe: the translation units' text, flags and include folders, the arch, the
compiler versions, tvm-ffi's and this package's versions. The headers are covered the way ninja
covers them: each compile writes a depfile (``-MD``), and ``meta.json`` records the content hash
of every file the compiler read, however it was reached (an ``-I`` in the flags, ``#include
MACRO``). A hit reads ``meta.json``, checks the library's hash and that every recorded file still
has its content, and loads it: no subprocess, no lock, no write, so a read-only (baked) cache
serves what it holds. An entry whose files changed is rebuilt in its place. A miss builds in a staging
folder under the lock and publishes with one ``rename``, which is atomic on local filesystems and
on NFS, so no process ever sees a half-written library.

A staging folder exists only while its builder holds the entry's lock. A folder whose lock can be
taken is therefore left by a builder that died (kill -9, OOM, a lost node), and the next build in
the cache removes it. The lock, not the pid in the name, decides: pids are reused and say nothing
about processes on other hosts sharing the cache.
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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jit_kernel import builder, env, toolchain
from jit_kernel.arch import Arch
from jit_kernel.sources import sha256_file
from jit_kernel.unit import TranslationUnit
from jit_kernel.version import __version__

logger = logging.getLogger("jit_kernel")

KEY_FORMAT = 3  # bump when the build recipe (builder.render) changes what a key's binary is

# Entries this process is building now. Another thread's staging folder must survive the sweep even
# where its flock does not exclude us (NFS turns flock into per-process POSIX locks).
_building: set[str] = set()


class CacheDirError(RuntimeError):
    """The cache folder cannot be written, so a module that is not cached cannot be built."""


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    """Everything that defines one module build: one unit per language. ``arch`` is None for a
    host-only module."""

    name: str
    units: tuple[TranslationUnit, ...]
    extra_ldflags: tuple[str, ...] = ()
    arch: str | None = None
    # Human-readable origin, e.g. "add_constant<5>"; recorded in meta.json, not part of the key.
    description: str = dataclasses.field(default="", compare=False)

    @property
    def has_cuda(self) -> bool:
        return any(unit.language == "cuda" for unit in self.units)


def cache_key(request: BuildRequest) -> str:
    """The entry's name: the recipe, not the headers' contents. Those are the entry's recorded
    dependencies, checked on every load (:func:`stale_dependency`)."""
    material: dict[str, Any] = {
        "format": KEY_FORMAT,
        "jit_kernel": __version__,
        "tvm_ffi": _tvm_ffi_version(),
        "name": request.name,
        "units": [[unit.language, unit.text(), unit.compile_args()] for unit in request.units],
        "extra_ldflags": request.extra_ldflags,
        "cxx": [toolchain.tool_version(toolchain.host_compiler()), env.cxx()],
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


def _dependencies(request: BuildRequest, files: list[Path]) -> dict[str, list[Any]]:
    """``path -> [size, sha256]`` for every file the compilers read, except the system's, the CUDA
    toolkit's and tvm-ffi's own headers: the key holds their versions, and checking ~300 of them on
    every load would cost more than the whole warm load (the entry's ``depends.txt`` lists them).
    Files under the package, the sources' folders or an include folder we were given always count."""
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


def stale_dependency(meta: dict[str, Any]) -> str | None:
    """The first recorded dependency whose content changed (or that is gone), else None."""
    for name, (size, digest) in meta["dependencies"].items():
        try:
            if os.stat(name).st_size != size or sha256_file(Path(name)) != digest:
                return name
        except OSError:
            return name
    return None


def _check_entry(entry: Path) -> tuple[Path | None, str | None]:
    """(library, None) when the entry is complete, matches its recorded hash and was built from the
    current content of every file its compilers read; else (None, the file that changed), or
    (None, None) when it is missing, incomplete or corrupt."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        library = entry / meta["library"]
        if library.stat().st_size != meta["size"] or sha256_file(library) != meta["sha256"]:
            return None, None
        changed = stale_dependency(meta)
        return (None, changed) if changed is not None else (library, None)
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


def _discard(entry: Path, root: Path) -> None:
    """Move a bad entry out of the way atomically, then delete it. The trash folder is named after
    the entry, so that the sweep removes it if this process dies before the delete ends."""
    trash = root / ".staging" / f"{entry.name}.discarded.{secrets.token_hex(4)}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _lock(root: Path, entry: str, wait: bool = True) -> Iterator[bool]:
    """Hold ``entry``'s file lock. With ``wait=False``, yields False at once if another holds it."""
    import filelock  # only a miss needs it; importing it costs ~8 ms of every process start

    path = root / ".locks" / f"{entry}.lock"
    lock = filelock.FileLock(str(path))
    held = True
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            lock.acquire(timeout=1 if wait else 0)
        except filelock.Timeout:
            held = False
        if not held and wait:
            logger.info("waiting for another process to finish building %s", entry)
            lock.acquire()
            held = True
    except OSError as error:  # filelock.Timeout (an OSError) never gets here
        raise _unusable(root, error) from error
    if not held:
        yield False
        return
    try:
        yield True
    finally:
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
        if entry == held:
            _remove(stale)
        elif entry not in _building:
            with _lock(root, entry, wait=False) as free:
                if free:
                    _remove(stale)


def _remove(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _publish(request: BuildRequest, key: str, root: Path) -> Path:
    """Build into a private folder and rename it into place. The caller holds the entry's lock."""
    entry = root / entry_name(request, key)
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
            "key": key,
            "library": library.name,
            "size": library.stat().st_size,
            "sha256": digest,
            "arch": request.arch,
            "jit_kernel": __version__,
            "created": time.time(),
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


def entry_path(request: BuildRequest, root: Path | None = None) -> Path:
    """Where ``request``'s build lives (or would live) in the cache."""
    root = root if root is not None else env.cache_dir()
    return root / entry_name(request, cache_key(request))


def load_cached(request: BuildRequest, root: Path | None = None) -> Any | None:
    """The module if the cache holds a good build of ``request``, else None. It only reads: no
    lock, no subprocess, no write."""
    return _load_entry(entry_path(request, root))


def load_or_build(request: BuildRequest, root: Path | None = None) -> Any:
    """Return the loaded tvm-ffi Module for ``request``, building it on a miss."""
    root = root if root is not None else env.cache_dir()
    key = cache_key(request)
    entry = root / entry_name(request, key)
    module = _load_entry(entry)
    if module is not None:
        return module
    with _lock(root, entry.name):
        module = _load_entry(entry, warn=False)  # another process may have built it meanwhile
        if module is not None:
            return module
        _building.add(entry.name)
        try:
            sweep_staging(root, held=entry.name)
            if entry.exists():
                changed = _check_entry(entry)[1]
                if changed is not None:
                    logger.info("%s changed since %s was built; rebuilding it", changed, entry.name)
                _discard(entry, root)
            library = _publish(request, key, root)
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
    created: float
    valid: bool
    changed: str | None = None  # a file the build read that has changed since (the entry is stale)

    @property
    def state(self) -> str:
        if self.valid:
            return "ok"
        return f"STALE ({self.changed} changed)" if self.changed else "CORRUPT"


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
        library, changed = _check_entry(entry)
        entries.append(
            CacheEntry(
                path=entry,
                name=str(meta.get("name", entry.name)),
                description=str(meta.get("description", "")),
                arch=meta.get("arch"),
                size_bytes=size,
                created=float(meta.get("created", 0.0)),
                valid=library is not None,
                changed=changed,
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
    sweep_staging(root)  # leaves the folders of builds still running
    return removed
