"""Helpers for tests that build modules: a log recorder, small user-folder kernels, and the check
that a kernel family's config builds for an arch."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from jit_kernel.engine.spec import Config, KernelSpec


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def compiles(self) -> list[str]:
        return [m for m in self.messages if m.startswith("compiling ")]


@contextlib.contextmanager
def recorded_logs() -> Iterator[_Recorder]:
    """The package logger does not propagate to the root, so pytest's caplog misses it."""
    logger = logging.getLogger("jit_kernel")
    recorder = _Recorder()
    previous = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.DEBUG)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(previous)


def write_host_kernel(folder: Path, value: int = 1) -> Path:
    """A host kernel in a user's own folder: a quoted local header and one found through an
    extra include path (``<userlib/offset.h>``)."""
    (folder / "userlib").mkdir(parents=True, exist_ok=True)
    (folder / "userlib" / "offset.h").write_text("#pragma once\nconstexpr int kOffset = 100;\n")
    (folder / "value.h").write_text(f"#pragma once\n#include <userlib/offset.h>\nconstexpr int kValue = {value};\n")
    source = folder / "kernel.cc"
    source.write_text(
        '#include "value.h"\n'
        "#include <sgl_kernel/utils.h>\n"
        "namespace user {\n"
        "inline int value() { return kValue + kOffset; }\n"
        "template <int kAdd> int add(int x) { "  # one C++ line: tests expect the check on line 5
        'host::RuntimeCheck(x >= 0, "x must be >= 0, got ", x); return x + kAdd; }\n'
        "}  // namespace user\n"
    )
    return source


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[tuple[int, int]], None]]:
    """``fake_gpu((9, 0))`` makes :func:`jit_kernel.engine.target.current` see one GPU of that compute
    capability; the memoised targets are forgotten before and after."""
    from jit_kernel.engine import target

    def install(capability: tuple[int, int]) -> None:
        monkeypatch.setattr(target, "_current_device", lambda: 0)
        monkeypatch.setattr(target, "device_properties", lambda index: (capability, 132, "Fake GPU"))
        target.clear()

    yield install
    target.clear()


def assert_builds_for_arch(spec: KernelSpec, config: Config, arch: str) -> str:
    """Every export of ``spec``'s ``config`` is built for ``arch`` (``"9.0a"``) and found by its symbol.

    The installed prebuilt library is the proof where it holds every export of the config as machine
    code for ``arch``, compiled from the translation unit JIT would compile now (equal unit digest):
    the package build compiled exactly that unit for that arch, and the library exports the symbols.
    Otherwise (a source checkout, another arch, a config outside the prebuilt grid, sources changed
    since the build, a damaged install, or ``JIT_KERNEL_DISABLE_PREBUILT=1``) the config is
    JIT-compiled for ``arch``. Returns which of the two proved it: ``"prebuilt"`` or ``"jit"``."""
    from jit_kernel.engine import env, prebuilt
    from jit_kernel.engine.dispatch import jit_module
    from jit_kernel.engine.spec import symbol_name
    from jit_kernel.engine.target import Arch

    symbols = [symbol_name(spec, export, config) for export in spec.exports]
    wanted = Arch.parse(arch)
    manifest = None if env.prebuilt_disabled() else prebuilt.manifest()
    if manifest is not None and prebuilt.problem() is None:
        entries = [manifest.symbols.get(symbol) for symbol in symbols]
        digest = prebuilt.current_digest(spec, config)
        if all(e is not None and wanted in e.machine_code and e.unit_digest == digest for e in entries):
            library = prebuilt.library()
            for symbol in symbols:
                assert library.implements_function(symbol), symbol
            return "prebuilt"
    module = jit_module(spec, config, cuda_arch=arch)
    for symbol in symbols:
        assert module.implements_function(symbol), symbol
    return "jit"


def source_pythonpath() -> str:
    """``PYTHONPATH`` for a subprocess that imports this checkout's package: its ``python/`` first,
    then the caller's own entries (where tvm-ffi may be found when it is not installed)."""
    import os

    own = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(Path(__file__).resolve().parent.parent / "python"), *([own] if own else [])])
