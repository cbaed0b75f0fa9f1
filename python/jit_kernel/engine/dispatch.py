"""config -> callable: the prebuilt symbol when it fits the :class:`~jit_kernel.engine.target.Target` and its
translation unit is the one JIT would compile now (same digest), else JIT.

The first call of a config resolves it; every later call is one dict lookup. The decision is
logged at INFO only when it leads to a compile, else at DEBUG: a process that finds everything
prebuilt or cached says nothing. ``JIT_KERNEL_DISABLE_JIT=1`` forbids compiling, not loading:
a config that is neither prebuilt nor in the JIT cache raises :class:`JitDisabledError` (serving
deployments warm the cache at image build, then want a missing kernel to fail loudly, not to stall
a request on a compile). ``JIT_KERNEL_DISABLE_PREBUILT=1`` forces JIT.
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Callable
from typing import Any

from jit_kernel.engine import cache, env, families, prebuilt, target, toolchain
from jit_kernel.engine.builder import BuildRequest
from jit_kernel.engine.jit import load_cached, load_request, module_name
from jit_kernel.engine.spec import Config, KernelSpec, cpp_literal, symbol_name
from jit_kernel.engine.unit import TranslationUnit

logger = logging.getLogger("jit_kernel")


class JitDisabledError(RuntimeError):
    """A config is neither prebuilt nor in the JIT cache, and ``JIT_KERNEL_DISABLE_JIT=1`` forbids compiling it."""


class Dispatcher:
    """Resolves and remembers one family's configs, per target: on a host whose GPUs differ in arch,
    each device's target gets its own decision. Ops keep one per family at module level."""

    def __init__(self, spec: KernelSpec) -> None:
        self.spec = spec
        self._resolved: dict[tuple[str, Config, target.Arch | None], Callable[..., Any]] = {}
        self.decisions: dict[Config, str] = {}
        self._lock = threading.Lock()

    def function(self, export: str, config: Config) -> Callable[..., Any]:
        """The function of ``export`` for ``config`` on the current device's target."""
        try:
            device = target.current() if self.spec.target == "cuda" else None
        except toolchain.ToolchainError:
            self.spec.check_config(config)  # a config outside its domain says so first
            raise
        key = (export, config, device.arch if device is not None else None)
        found = self._resolved.get(key)
        if found is None:
            with self._lock:
                found = self._resolved.get(key) or self._resolve(export, config, device)
                self._resolved[key] = found
        return found

    def _resolve(self, export: str, config: Config, device: target.Target | None) -> Callable[..., Any]:
        spec = self.spec
        spec.check_config(config)
        symbol = symbol_name(spec, export, config)
        reason = prebuilt.unusable_reason(spec, config, device)
        if reason is None:
            function = prebuilt.library().get_function(symbol)
            decision = "prebuilt"
            logger.debug("%s: prebuilt", spec.describe(config))
        else:
            decision = f"jit ({reason})"
            function = self._jit_module(config, reason, device).get_function(symbol)
        self.decisions[config] = decision
        return function

    def _jit_module(self, config: Config, reason: str, device: target.Target | None) -> Any:
        """The config's module from the JIT cache, compiled on a miss unless JIT is disabled."""
        spec = self.spec
        try:
            request = jit_request(spec, config, str(device.arch) if device else None)
            module = load_cached(request)
        except toolchain.ToolchainError as error:
            if not env.jit_disabled():
                raise
            raise JitDisabledError(
                f"{spec.describe(config)} has no usable prebuilt kernel ({reason}) and JIT_KERNEL_DISABLE_JIT=1 "
                f"forbids compiling it; the JIT cache cannot be searched either: its key needs the compilers ({error})"
            ) from error
        if module is not None:
            logger.debug("%s: jit (%s), found in the JIT cache", spec.describe(config), reason)
            return module
        if env.jit_disabled():
            raise JitDisabledError(_not_cached_message(spec, config, reason, request))
        logger.info("%s: jit (%s)", spec.describe(config), reason)
        return load_request(request)


def _not_cached_message(spec: KernelSpec, config: Config, reason: str, request: BuildRequest) -> str:
    entry = cache.entry_path(request)
    warm = [
        f"JIT_KERNEL_CACHE_DIR={shlex.quote(str(entry.parent))}",
        "python -m jit_kernel warm",
        spec.family,
        shlex.quote(f"--config={','.join(cpp_literal(value) for value in config)}"),
    ]
    if request.arch is not None:
        warm.append(f"--arch {request.arch}")
    others = sorted(entry.parent.glob(f"{request.name}-*")) if entry.parent.is_dir() else []
    stale = (
        f" The cache holds {len(others)} other build(s) of this module, made from other sources, flags, "
        "compilers or package versions: warm with the same installation as this process."
        if others
        else ""
    )
    if spec not in families.ALL_FAMILIES:  # a kernel author's own spec: `warm` knows only the package's
        arch = f", cuda_arch={request.arch!r}" if request.arch else ""
        how = f"with `jit_kernel.engine.dispatch.jit_module(spec, {config!r}{arch})` in a process with JIT enabled"
        how += f" and JIT_KERNEL_CACHE_DIR={shlex.quote(str(entry.parent))}"
    elif config in spec.prebuilt:
        how = f"with `{' '.join(warm)}`, or install a build of the package whose prebuilt library holds it"
    else:
        how = (
            f"with `{' '.join(warm)}`, or add the config to the family's prebuilt grid in jit_kernel/engine/families.py"
        )
    return (
        f"{spec.describe(config)} has no usable prebuilt kernel ({reason}), the JIT cache has no build of it "
        f"(looked for {entry}), and JIT_KERNEL_DISABLE_JIT=1 forbids compiling it. Pre-compile it {how}.{stale}"
    )


def jit_request(spec: KernelSpec, config: Config, cuda_arch: str | None = None) -> BuildRequest:
    """The JIT build of one config. Its module holds every export of the config under its
    :func:`symbol_name`, so resolving a second export is a hit in the in-process memo.
    ``cuda_arch`` comes first in :func:`~jit_kernel.engine.target.compile_arch`'s rule (``warm --arch``)."""
    arch = str(target.compile_arch(cuda_arch)) if spec.target == "cuda" else None
    unit = TranslationUnit.for_config(spec, config)
    name = module_name([spec.family, *(cpp_literal(value) for value in config)])
    return BuildRequest(name, (unit,), arch=arch, description=spec.describe(config))


def jit_module(spec: KernelSpec, config: Config, cuda_arch: str | None = None) -> Any:
    """The JIT module for one config, compiled on a miss (see :func:`jit_request`)."""
    return load_request(jit_request(spec, config, cuda_arch))
