"""The prebuilt library shipped in the wheel, and its manifest.

``lib/prebuilt_manifest.json`` records, per exported symbol: its family, export and config, the
archs with machine code and PTX, the CUDA version, the digest of the translation unit it was
compiled from (:mod:`jit_kernel.unit`: sources, headers, flags), and the tvm-ffi version; and for
the library, its size and SHA-256. The library is loaded lazily, the first time a prebuilt symbol
is chosen, and only after its size and hash match: a truncated library would crash the process with
SIGBUS when mapped. A damaged install (an unreadable manifest, a library that does not match it)
logs one warning naming the file and falls back to JIT; ``python -m jit_kernel doctor`` reports it.
A source checkout without a build has neither file: every config then takes the JIT path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jit_kernel import env
from jit_kernel.arch import Arch, runs_on
from jit_kernel.sources import sha256_file
from jit_kernel.spec import Config, KernelSpec, symbol_name
from jit_kernel.unit import MANIFEST_NAME, TranslationUnit

if TYPE_CHECKING:
    from jit_kernel.target import Target

LIBRARY_DIR = env.PACKAGE_DIR / "lib"
REPAIR_ADVICE = "reinstall jit-kernel (pip install --force-reinstall --no-deps jit-kernel)"

logger = logging.getLogger("jit_kernel")


@dataclasses.dataclass(frozen=True)
class PrebuiltSymbol:
    symbol: str
    family: str
    export: str
    config: Config
    target: str
    machine_code: tuple[Arch, ...]
    ptx: tuple[Arch, ...]
    unit_digest: str  # TranslationUnit.digest() of the unit this symbol was compiled from


@dataclasses.dataclass(frozen=True)
class Manifest:
    library: Path
    cuda_version: str | None
    tvm_ffi_version: str
    jit_kernel_version: str
    symbols: dict[str, PrebuiltSymbol]
    library_size: int | None = None  # None: a manifest written before the library was sealed
    library_sha256: str | None = None

    @classmethod
    def read(cls, path: Path) -> Manifest:
        data = json.loads(path.read_text())
        symbols = {
            name: PrebuiltSymbol(
                symbol=name,
                family=entry["family"],
                export=entry["export"],
                config=tuple(entry["config"]),
                target=entry["target"],
                machine_code=tuple(Arch.parse(a) for a in entry["machine_code"]),
                ptx=tuple(Arch.parse(a) for a in entry["ptx"]),
                unit_digest=entry["unit_digest"],
            )
            for name, entry in data["symbols"].items()
        }
        return cls(
            library=path.parent / data["library"],
            cuda_version=data["cuda_version"],
            tvm_ffi_version=data["tvm_ffi_version"],
            jit_kernel_version=data["jit_kernel_version"],
            symbols=symbols,
            library_size=data.get("library_size"),
            library_sha256=data.get("library_sha256"),
        )


class DamagedInstallError(RuntimeError):
    """The prebuilt manifest or library is unreadable or does not match; the message says which file."""


@functools.cache
def _read_manifest() -> tuple[Manifest | None, str | None]:
    """(manifest, problem): (None, None) when none is installed, (None, why) when it is unreadable."""
    path = LIBRARY_DIR / MANIFEST_NAME
    if not path.is_file():
        return None, None
    try:
        return Manifest.read(path), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        problem = f"prebuilt manifest {path} is unreadable ({type(error).__name__}: {error})"
        logger.warning("%s; every kernel is JIT-compiled instead. To repair: %s", problem, REPAIR_ADVICE)
        return None, problem


def manifest() -> Manifest | None:
    """The installed manifest, or None when there is none or it is unreadable (see :func:`problem`)."""
    return _read_manifest()[0]


def _verified_memo_path() -> Path:
    return env.cache_dir() / "prebuilt-verified.json"


def _library_mismatch(found: Manifest) -> str | None:
    """Why the library file does not match the manifest, or None. The size is checked every time;
    the hash once per identity of the file (path, size, mtime, inode), remembered in the cache
    folder, so a process start costs one ``stat`` once the file has been hashed."""
    path = found.library
    try:
        stat = path.stat()
    except OSError as error:
        return f"prebuilt library {path} is missing ({error.strerror})"
    if found.library_size is None or found.library_sha256 is None:
        return None  # an unsealed development build: nothing recorded to check against
    if stat.st_size != found.library_size:
        return f"prebuilt library {path} has {stat.st_size} bytes, the manifest says {found.library_size}"
    identity = f"{path}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}:{found.library_sha256}"
    memo_path = _verified_memo_path()
    try:
        if json.loads(memo_path.read_text()).get("verified") == identity:
            return None
    except (OSError, ValueError, AttributeError):
        pass
    try:
        digest = sha256_file(path)
    except OSError as error:
        return f"prebuilt library {path} is unreadable ({error.strerror})"
    if digest != found.library_sha256:
        return (
            f"prebuilt library {path} does not match its manifest "
            f"(SHA-256 {digest[:16]}..., expected {found.library_sha256[:16]}...)"
        )
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        staging = memo_path.with_name(f"{memo_path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps({"verified": identity}))
        os.replace(staging, memo_path)
    except OSError:
        pass  # a read-only cache folder: the next process hashes again
    return None


@functools.cache
def problem() -> str | None:
    """What is wrong with the installed prebuilt files, or None (also when none are installed).
    Checked once per process; a problem is logged once as a warning."""
    found, manifest_problem = _read_manifest()
    if manifest_problem is not None or found is None:
        return manifest_problem
    mismatch = _library_mismatch(found)
    if mismatch is not None:
        logger.warning("%s; kernels are JIT-compiled instead. To repair: %s", mismatch, REPAIR_ADVICE)
    return mismatch


@functools.cache
def library() -> Any:
    import tvm_ffi

    found = manifest()
    if found is None or problem() is not None:
        raise DamagedInstallError(problem() or "no prebuilt library is installed")
    return tvm_ffi.load_module(str(found.library))


@functools.cache
def current_digest(spec: KernelSpec, config: Config) -> str:
    """The digest of the unit JIT would compile for this config now."""
    return TranslationUnit.for_config(spec, config).digest()


def unusable_reason(spec: KernelSpec, config: Config, target: Target | None) -> str | None:
    """Why the prebuilt symbol of this config cannot serve a call on ``target``, or None when it can.

    ``target`` is None for host families. Every export of a config comes from one unit, so the
    first export's entry speaks for all of them.
    """
    if env.prebuilt_disabled():
        return "prebuilt disabled by JIT_KERNEL_DISABLE_PREBUILT=1"
    found = manifest()
    if found is None:
        return "no prebuilt library installed" if problem() is None else "prebuilt install damaged (see the warning)"
    entry = found.symbols.get(symbol_name(spec, next(iter(spec.exports)), config))
    if entry is None:
        return "config not in the prebuilt grid"
    if target is not None and not runs_on(list(entry.machine_code), list(entry.ptx), target.capability):
        built = ", ".join([a.sm for a in entry.machine_code] + [f"{a.compute} PTX" for a in entry.ptx])
        why = " (JIT_KERNEL_CUDA_ARCH)" if target.from_override else ""
        return f"no prebuilt for {target.arch.sm}{why} (built for {built or 'no GPU arch'})"
    digest = current_digest(spec, config)
    if entry.unit_digest != digest:
        return (
            f"prebuilt from another translation unit (digest {entry.unit_digest[:12]}, JIT would compile "
            f"{digest[:12]}): the sources, headers or flags changed since the library was built"
        )
    if problem() is not None:
        return "prebuilt library damaged (see the warning)"
    return None
