"""The prebuilt library shipped in the wheel, and its manifest.

``lib/prebuilt_manifest.json`` records, per exported symbol, its family, export and config, the
archs with machine code and PTX, and the digest of the translation unit it was compiled from
(:mod:`jit_kernel.engine.unit`); and the CUDA and tvm-ffi versions and the library's size and SHA-256.
The library is loaded the first time a prebuilt symbol is chosen, and only after its size and hash
match: a truncated library would crash the process with SIGBUS when mapped. A damaged install logs
one warning naming the file and falls back to JIT (``doctor`` reports it). A source checkout
without a build has neither file: every config then takes the JIT path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any

from jit_kernel.engine import env, toolchain
from jit_kernel.engine.spec import Config, KernelSpec, symbol_name
from jit_kernel.engine.target import Arch, Target, runs_on
from jit_kernel.engine.unit import MANIFEST_NAME, TranslationUnit

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

    @functools.cached_property
    def families(self) -> frozenset[str]:
        """The families with at least one symbol in the library."""
        return frozenset(entry.family for entry in self.symbols.values())

    @classmethod
    def read(cls, path: Path) -> Manifest:
        data = json.loads(path.read_text())
        symbols = {}
        archs: dict[tuple[str, ...], tuple[Arch, ...]] = {}  # the few distinct arch lists, parsed once

        def parsed(texts: list[str]) -> tuple[Arch, ...]:
            key = tuple(texts)
            if key not in archs:
                archs[key] = tuple(map(Arch.parse, key))
            return archs[key]

        for name, e in data["symbols"].items():
            machine_code, ptx = parsed(e["machine_code"]), parsed(e["ptx"])
            symbols[name] = PrebuiltSymbol(
                name, e["family"], e["export"], tuple(e["config"]), e["target"], machine_code, ptx, e["unit_digest"]
            )
        versions = (data["cuda_version"], data["tvm_ffi_version"], data["jit_kernel_version"])
        sealed = (data.get("library_size"), data.get("library_sha256"))
        return cls(path.parent / data["library"], *versions, symbols, *sealed)


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


def _library_mismatch(found: Manifest) -> str | None:
    """Why the library file does not match the manifest, or None. The size is checked every time,
    the hash once per identity of the file (:func:`toolchain.memoised`). An unsealed development
    build's manifest records neither."""
    path, size, sha256 = found.library, found.library_size, found.library_sha256
    try:
        actual = path.stat().st_size
        if size is not None and actual != size:
            return f"prebuilt library {path} has {actual} bytes, the manifest says {size}"
        digest = toolchain.memoised(path, "sha256", lambda: toolchain.sha256_file(path)) if sha256 else None
    except OSError as error:
        return f"prebuilt library {path} is missing or unreadable ({error.strerror})"
    if digest != sha256:
        return f"prebuilt library {path} does not match its manifest (SHA-256 {digest}, expected {sha256})"
    return None


@functools.cache
def problem() -> str | None:
    """What is wrong with the installed prebuilt files (logged once as a warning), or None."""
    found, manifest_problem = _read_manifest()
    if found is None:
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


def missing_reason(spec: KernelSpec, config: Config, found: Manifest) -> str:
    """Why the installed library has no symbol for this config. The grid (``spec.prebuilt``) is what
    a build of the package compiles, the library what the installed build did compile: a config can
    be in the one and not the other (a host-only build, a user's own spec, a library built from
    other sources), and "prebuilt" means only what is in the library."""
    if spec.target == "cuda" and found.cuda_version is None:
        return "not in the installed prebuilt library (built without CUDA: host code only)"
    if spec.family not in found.families:
        return f"not in the installed prebuilt library (it has no {spec.family} kernels)"
    if config in spec.prebuilt:
        return "not in the installed prebuilt library (its grid, when it was built, lacked this config)"
    return "config not in the prebuilt grid"


def unusable_reason(spec: KernelSpec, config: Config, target: Target | None) -> str | None:
    """Why the prebuilt symbol of this config cannot serve a call on ``target`` (None for host
    families), or None when it can. Every export of a config comes from one unit, so the first
    export's entry speaks for all of them."""
    if env.prebuilt_disabled():
        return "prebuilt disabled by JIT_KERNEL_DISABLE_PREBUILT=1"
    found = manifest()
    if found is None:
        return "no prebuilt library installed" if problem() is None else "prebuilt install damaged (see the warning)"
    entry = found.symbols.get(symbol_name(spec, next(iter(spec.exports)), config))
    if entry is None:
        return missing_reason(spec, config, found)
    if target is not None and not runs_on(entry.machine_code, entry.ptx, target.capability):
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
