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
    from jit_kernel.ops.hicache import (
        can_use_hicache_jit_kernel,
        transfer_hicache_all_layer,
        transfer_hicache_all_layer_mla,
        transfer_hicache_one_layer,
        transfer_hicache_one_layer_mla,
    )
    from jit_kernel.ops.norm import fused_add_rmsnorm, fused_inplace_qknorm, qknorm_across_heads, rmsnorm
    from jit_kernel.ops.quant import per_tensor_quant_fp8
    from jit_kernel.ops.scale import scale
    from jit_kernel.ops.stream_wait import Event, StreamWaitTimeout, stream_wait_value, stream_wait_value_bounded

__all__ = [
    "CPPArgList",
    "Event",
    "StreamWaitTimeout",
    "__version__",
    "add_constant",
    "cache_once",
    "can_use_hicache_jit_kernel",
    "fused_add_rmsnorm",
    "fused_inplace_qknorm",
    "load_jit",
    "make_cpp_args",
    "per_tensor_quant_fp8",
    "qknorm_across_heads",
    "rmsnorm",
    "scale",
    "stream_wait_value",
    "stream_wait_value_bounded",
    "transfer_hicache_all_layer",
    "transfer_hicache_all_layer_mla",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
]
