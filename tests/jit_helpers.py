"""Helpers for tests that build modules: a log recorder and small user-folder kernels."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


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
