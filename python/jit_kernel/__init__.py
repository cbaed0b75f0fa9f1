"""jit-kernel: CUDA kernels for LLM serving, prebuilt where common and JIT-compiled otherwise."""

from __future__ import annotations

import importlib.util
import logging

# Imported here rather than at the first kernel call: process start-up pays it, a request does not.
import tvm_ffi  # noqa: F401

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

# torch is a runtime dependency; only CMake's configure step (`python -m jit_kernel.aot`, in a
# build environment) imports the package without it, and it needs no ops.
if importlib.util.find_spec("torch") is not None:
    from jit_kernel.ops.add_constant import add_constant

__all__ = ["CPPArgList", "__version__", "add_constant", "cache_once", "load_jit", "make_cpp_args"]
