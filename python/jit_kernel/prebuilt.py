"""The prebuilt library shipped in the wheel, and its manifest.

``lib/prebuilt_manifest.json`` records, per exported symbol: its family, export and config, the
archs with machine code and PTX, the CUDA version, the hash of the sources it was built from,
and the tvm-ffi version. The library itself is loaded lazily, the first time a prebuilt symbol
is chosen. A source checkout without a build has neither: every config then takes the JIT path.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from jit_kernel import env
from jit_kernel.arch import Arch, runs_on
from jit_kernel.spec import Config, KernelSpec, source_hash

LIBRARY_DIR = env.PACKAGE_DIR / "lib"
LIBRARY_NAME = "libjit_kernel_prebuilt.so"
MANIFEST_NAME = "prebuilt_manifest.json"


@dataclasses.dataclass(frozen=True)
class PrebuiltSymbol:
    symbol: str
    family: str
    export: str
    config: Config
    target: str
    machine_code: tuple[Arch, ...]
    ptx: tuple[Arch, ...]
    source_hash: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    library: Path
    cuda_version: str | None
    tvm_ffi_version: str
    jit_kernel_version: str
    symbols: dict[str, PrebuiltSymbol]

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
                source_hash=entry["source_hash"],
            )
            for name, entry in data["symbols"].items()
        }
        return cls(
            library=path.parent / data["library"],
            cuda_version=data["cuda_version"],
            tvm_ffi_version=data["tvm_ffi_version"],
            jit_kernel_version=data["jit_kernel_version"],
            symbols=symbols,
        )


@functools.cache
def manifest() -> Manifest | None:
    path = LIBRARY_DIR / MANIFEST_NAME
    return Manifest.read(path) if path.is_file() else None


@functools.cache
def library() -> Any:
    import tvm_ffi

    found = manifest()
    assert found is not None, "prebuilt.library() called without a manifest"
    return tvm_ffi.load_module(str(found.library))


@functools.cache
def installed_source_hash(spec: KernelSpec) -> str:
    return source_hash(spec)


def unusable_reason(spec: KernelSpec, symbol: str, capability: tuple[int, int] | None) -> str | None:
    """Why the prebuilt ``symbol`` cannot serve this call, or None when it can.

    ``capability`` is the running GPU's compute capability (None for host families).
    """
    if env.prebuilt_disabled():
        return "prebuilt disabled by JIT_KERNEL_DISABLE_PREBUILT=1"
    found = manifest()
    if found is None:
        return "no prebuilt library installed"
    entry = found.symbols.get(symbol)
    if entry is None:
        return "config not in the prebuilt grid"
    if entry.target == "cuda":
        assert capability is not None
        if not runs_on(list(entry.machine_code), list(entry.ptx), capability):
            running = Arch(*capability)
            built = ", ".join([a.sm for a in entry.machine_code] + [f"{a.compute} PTX" for a in entry.ptx])
            return f"no prebuilt for sm_{running.major}{running.minor} (built for {built or 'no GPU arch'})"
    if entry.source_hash != installed_source_hash(spec):
        return "installed kernel sources differ from the ones the prebuilt library was built from"
    return None
