"""config -> callable: the prebuilt symbol when it fits this GPU and these sources, else JIT.

The first call of a config resolves it and logs the decision once; every later call is one dict
lookup. ``JIT_KERNEL_DISABLE_JIT=1`` turns a miss into :class:`JitDisabledError` (serving
deployments want a missing prebuilt to fail loudly, not to stall a request on a compile).
``JIT_KERNEL_DISABLE_PREBUILT=1`` forces JIT.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from jit_kernel import env, prebuilt
from jit_kernel.jit import load_request, make_build_request
from jit_kernel.spec import Config, KernelSpec, cpp_literal, symbol_name

logger = logging.getLogger("jit_kernel")


class JitDisabledError(RuntimeError):
    """A config had no usable prebuilt symbol and ``JIT_KERNEL_DISABLE_JIT=1`` forbids compiling it."""


def device_capability() -> tuple[int, int]:
    """Compute capability of the current CUDA device (a seam for tests on GPU-less machines)."""
    import torch

    return torch.cuda.get_device_capability()


class Dispatcher:
    """Resolves and remembers one family's configs. Ops keep one per family at module level."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self._resolved: dict[tuple[str, Config], Callable[..., Any]] = {}
        self.decisions: dict[Config, str] = {}
        self._lock = threading.Lock()

    def function(self, export: str, config: Config) -> Callable[..., Any]:
        found = self._resolved.get((export, config))
        if found is None:
            with self._lock:
                found = self._resolved.get((export, config)) or self._resolve(export, config)
        return found

    def _resolve(self, export: str, config: Config) -> Callable[..., Any]:
        spec = self.spec
        spec.check_config(config)
        symbol = symbol_name(spec, export, config)
        capability = device_capability() if spec.target == "cuda" else None
        reason = prebuilt.unusable_reason(spec, symbol, capability)
        if reason is None:
            function = prebuilt.library().get_function(symbol)
            decision = "prebuilt"
            logger.debug("%s: prebuilt", spec.describe(config))
        else:
            if env.jit_disabled():
                raise JitDisabledError(
                    f"{spec.describe(config)} has no usable prebuilt kernel ({reason}) and JIT compilation is "
                    "disabled by JIT_KERNEL_DISABLE_JIT=1; add the config to the family's prebuilt grid in "
                    "jit_kernel/families.py, or pre-compile it with `python -m jit_kernel warm`"
                )
            decision = f"jit ({reason})"
            logger.info("%s: %s", spec.describe(config), decision)
            function = jit_module(spec, config).get_function(symbol)
        self.decisions[config] = decision
        self._resolved[(export, config)] = function
        return function


def jit_module(spec: KernelSpec, config: Config, cuda_arch: str | None = None) -> Any:
    """The JIT module for one config. It holds every export of the config under its
    :func:`symbol_name`, so resolving a second export is a hit in the in-process memo.
    ``cuda_arch`` overrides the current GPU's arch (``warm --arch``)."""
    wrappers = [(symbol_name(spec, export, config), spec.wrapper(export, config)) for export in spec.exports]
    on_gpu = spec.target == "cuda"
    request = make_build_request(
        spec.family,
        *(cpp_literal(value) for value in config),
        cpp_files=None if on_gpu else spec.sources,
        cuda_files=spec.sources if on_gpu else None,
        cpp_wrappers=None if on_gpu else wrappers,
        cuda_wrappers=wrappers if on_gpu else None,
        extra_cuda_cflags=spec.extra_cuda_cflags,
        cuda_arch=cuda_arch,
        description=spec.describe(config),
    )
    return load_request(request)
