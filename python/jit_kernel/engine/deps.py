"""Header-only dependencies a JIT module asks for by name: ``load_jit(..., extra_dependencies=["cutlass"])``.

A name maps to a function returning include directories, called only when a module that names it
is built (a missing package matters only to the modules that need it). ``flashinfer`` and
``cutlass`` are registered here, as in the seed; add others with :func:`register_dependency`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path

IncludePaths = Callable[[], list[str]]
REGISTERED_DEPENDENCIES: dict[str, IncludePaths] = {}


def register_dependency(name: str) -> Callable[[IncludePaths], IncludePaths]:
    """Decorator: ``@register_dependency("mylib")`` on a function returning include directories."""

    def decorator(fn: IncludePaths) -> IncludePaths:
        if name in REGISTERED_DEPENDENCIES:
            raise ValueError(f"register_dependency: {name!r} is already registered")
        REGISTERED_DEPENDENCIES[name] = fn
        return fn

    return decorator


def include_paths(names: Sequence[str]) -> list[str]:
    """The include directories of ``names`` (each name once, in order)."""
    paths: list[str] = []
    for name in dict.fromkeys(names):
        provider = REGISTERED_DEPENDENCIES.get(name)
        if provider is None:
            raise ValueError(
                f"load_jit: dependency {name!r} is not registered; registered: {sorted(REGISTERED_DEPENDENCIES)} "
                "(see jit_kernel.utils.register_dependency)"
            )
        paths.extend(str(p) for p in provider())
    return paths


def _package_dir(package: str) -> Path | None:
    """The directory of an installed top-level package, without importing it."""
    spec = importlib.util.find_spec(package)
    return Path(spec.origin).resolve().parent if spec is not None and spec.origin is not None else None


def _bundled_cutlass(data: Path) -> list[Path]:
    return [data / "cutlass" / "include", data / "cutlass" / "tools" / "util" / "include"]


@register_dependency("flashinfer")
def flashinfer_include_paths() -> list[str]:
    """FlashInfer's headers and the third-party headers its wheel bundles (CUTLASS, spdlog)."""
    root = _package_dir("flashinfer")
    if root is None:
        raise RuntimeError(
            "load_jit: dependency 'flashinfer' needs the flashinfer package (pip install flashinfer-python)"
        )
    data = root / "data"
    wanted = [data / "include", data / "csrc", *_bundled_cutlass(data), data / "spdlog" / "include"]
    missing = [str(p) for p in wanted if not p.is_dir()]
    if missing:
        raise RuntimeError(f"load_jit: the flashinfer installation at {root} lacks the header folders {missing}")
    return [str(p) for p in wanted]


@register_dependency("cutlass")
def cutlass_include_paths() -> list[str]:
    """CUTLASS headers, from the copy bundled with flashinfer or deep_gemm (whichever are installed)."""
    flashinfer, deep_gemm = _package_dir("flashinfer"), _package_dir("deep_gemm")
    found = _bundled_cutlass(flashinfer / "data") if flashinfer else []
    found += [deep_gemm / "include"] if deep_gemm else []
    paths = [str(p) for p in found if p.is_dir()]
    if not paths:
        raise RuntimeError(
            "load_jit: dependency 'cutlass' found no CUTLASS headers; install flashinfer or deep_gemm (both ship them)"
        )
    return paths
