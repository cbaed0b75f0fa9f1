"""jit-kernel: CUDA kernels for LLM serving, prebuilt where common and JIT-compiled otherwise."""

from __future__ import annotations

import logging

from jit_kernel import env
from jit_kernel.jit import CPPArgList, cache_once, load_jit, make_cpp_args
from jit_kernel.version import __version__


def _configure_logging() -> None:
    logger = logging.getLogger("jit_kernel")
    if not env.configure_logging() or logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[jit_kernel %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(env.log_level())
    logger.propagate = False


_configure_logging()

# Ops import torch; load them on first use so that `python -m jit_kernel.aot` (run by CMake in a
# build environment without torch) and the CLI start fast.
_OPS = {"add_constant": "jit_kernel.ops.add_constant"}


def __getattr__(name: str) -> object:
    if name in _OPS:
        import importlib

        value = getattr(importlib.import_module(_OPS[name]), name)
        globals()[name] = value  # later lookups are plain attribute hits
        return value
    raise AttributeError(f"module 'jit_kernel' has no attribute {name!r}")


__all__ = ["CPPArgList", "__version__", "add_constant", "cache_once", "load_jit", "make_cpp_args"]
