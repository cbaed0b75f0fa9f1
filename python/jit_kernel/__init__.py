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

__all__ = ["CPPArgList", "__version__", "cache_once", "load_jit", "make_cpp_args"]
