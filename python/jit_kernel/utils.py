"""``jit_kernel.utils``: the seed's kernel-author utilities (``sglang.jit_kernel.utils``), same names and signatures.

A kernel wrapper written for the seed runs with only its import prefix changed::

    from jit_kernel.utils import cache_once, load_jit, make_cpp_args

Everything here is a thin layer over the package's own implementation (``jit_kernel.engine.jit``,
``jit_kernel.engine.deps``, ``jit_kernel.engine.toolchain``, ``jit_kernel.engine.env``). Where it differs from the seed,
docs/coming-from-sglang.md says so; in short:

* ``make_cpp_args`` here passes strings through as C++ text, as the seed's does (the top-level
  ``jit_kernel.make_cpp_args`` refuses them), and maps more dtypes (fp8 e5m2, int16, unsigned).
* ``load_jit`` builds through the content-keyed disk cache; ``header_only=False`` compiles the
  files as one translation unit per language rather than one per file.
* ``get_jit_cuda_arch`` / ``override_jit_cuda_arch`` read and set ``JIT_KERNEL_CUDA_ARCH``, the one
  setting that every build of the package honours.
* ``get_ci_test_range`` reads ``CI`` / ``JIT_KERNEL_BENCH_CI`` and ``JIT_KERNEL_RUN_FULL_TESTS``
  (the seed read ``SGLANG_IS_IN_CI`` and ``SGLANG_JIT_KERNEL_RUN_FULL_TESTS``).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import torch

from jit_kernel.engine import env, target
from jit_kernel.engine.deps import register_dependency
from jit_kernel.engine.jit import DEFAULT_CFLAGS as _DEFAULT_CFLAGS
from jit_kernel.engine.jit import CPPArgList, cache_once, cpp_dtype_names, load_jit
from jit_kernel.engine.jit import make_cpp_args as _make_cpp_args
from jit_kernel.engine.target import Arch

logger = logging.getLogger("jit_kernel")
T = TypeVar("T")

#: The folder holding ``include/`` and ``csrc/`` (relative ``load_jit`` files are looked up in ``csrc/``).
KERNEL_PATH = env.DATA_ROOT
DEFAULT_INCLUDE = [str(env.INCLUDE_DIR)]
DEFAULT_CFLAGS = list(_DEFAULT_CFLAGS)
DEFAULT_LDFLAGS: list[str] = []
CPP_TEMPLATE_TYPE: TypeAlias = int | float | str | bool | torch.dtype
#: torch dtype -> the C++ type name ``make_cpp_args`` writes for it.
CPP_DTYPE_MAP: dict[torch.dtype, str] = cpp_dtype_names()


def make_cpp_args(*args: CPP_TEMPLATE_TYPE) -> CPPArgList:
    """Python values to C++ template arguments: ``make_cpp_args(128, True, torch.bfloat16, "float")``
    gives ``["128", "true", "bf16_t", "float"]``. Strings are passed through as C++ text."""
    return CPPArgList(arg if isinstance(arg, str) else _make_cpp_args(arg)[0] for arg in args)


# ---------------------------------------------------------------------------------------------
# Test ranges


def should_run_full_tests() -> bool:
    """``JIT_KERNEL_RUN_FULL_TESTS=1``: full test ranges even in CI."""
    return env.run_full_tests()


def get_ci_test_range(full_range: list[Any], ci_range: list[Any]) -> list[Any]:
    """``ci_range`` in CI (``CI`` or ``JIT_KERNEL_BENCH_CI`` set) unless full tests are asked for,
    else ``full_range``; the list given is returned as is, not copied."""
    if should_run_full_tests():
        return full_range
    return ci_range if env.in_ci() else full_range


# ---------------------------------------------------------------------------------------------
# Runtime and arch


@cache_once
def is_hip_runtime() -> bool:
    """Whether torch was built for ROCm (the package's kernels are CUDA-only)."""
    return bool(torch.version.hip)


@cache_once
def is_musa_runtime() -> bool:
    """Whether torch was built for MUSA (the package's kernels are CUDA-only)."""
    return getattr(torch.version, "musa", None) is not None


@dataclass
class ArchInfo:
    """The CUDA arch JIT builds compile for: ``major.minor`` and a suffix (``""``, ``"a"`` or ``"f"``)."""

    major: int
    minor: int
    suffix: str

    @property
    def target_name(self) -> str:
        return str(Arch(self.major, self.minor, self.suffix))

    @property
    def jit_flag(self) -> str:
        return f"-DSGL_CUDA_ARCH={self.major * 100 + self.minor * 10}"


def get_jit_cuda_arch() -> ArchInfo:
    """The arch ``load_jit`` compiles for (:func:`jit_kernel.engine.target.compile_arch` owns the
    rule: ``$JIT_KERNEL_CUDA_ARCH`` if set, else the current GPU's, with ``a`` for Hopper and
    datacenter Blackwell); ``ArchInfo(0, 0, "")`` (``target_name`` "0.0"), with a warning, when
    neither is there, so that a seed-style wrapper can still be imported and asked, while any build
    for it raises (``load_jit`` takes the same rule).
    An invalid ``$JIT_KERNEL_CUDA_ARCH`` raises ``ValueError`` naming the variable."""
    try:
        arch = target.compile_arch()
    except target.NoCudaArchError as error:
        _warn_no_arch(str(error))
        return ArchInfo(0, 0, "")
    return ArchInfo(arch.major, arch.minor, arch.suffix)


@functools.cache
def _warn_no_arch(reason: str) -> None:
    logger.warning("cannot detect the CUDA arch (%s)", reason)


@contextmanager
def override_jit_cuda_arch(major: int, minor: int, suffix: str = "") -> Iterator[None]:
    """Compile for ``major.minor<suffix>`` inside the block (sets ``JIT_KERNEL_CUDA_ARCH``, which is
    process-wide: do not overlap it with builds on other threads)."""
    spelled = str(Arch.parse(f"{major}.{minor}{suffix}"))  # refuses a bad suffix before changing anything
    previous = os.environ.get("JIT_KERNEL_CUDA_ARCH")
    os.environ["JIT_KERNEL_CUDA_ARCH"] = spelled
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("JIT_KERNEL_CUDA_ARCH", None)
        else:
            os.environ["JIT_KERNEL_CUDA_ARCH"] = previous


def is_arch_support_pdl() -> bool:
    """Whether the JIT arch has programmatic dependent launch (sm_90+). The package's own ops decide
    per device at launch time (``enable_pdl=None``); this is for kernels that take it as a
    template argument, as the seed's did."""
    if is_hip_runtime() or is_musa_runtime():
        return False
    return get_jit_cuda_arch().major >= 9


# ---------------------------------------------------------------------------------------------
# tvm-ffi helpers


@functools.cache
def empty_sentinel(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One cached 0-element tensor per (device, dtype), for an optional tensor argument that a
    kernel reads as "absent" when it has no elements (never read, so sharing it is safe)."""
    return torch.empty(0, dtype=dtype, device=device)


_registered_classes: dict[type, type] = {}


def lazy_register_class(name: str, init_fn: Callable[[], None]) -> Callable[[type[T]], type[T]]:
    """Class decorator: register the class as the tvm-ffi object type ``name`` when it is first
    instantiated, after running ``init_fn`` once (typically: load the JIT module that defines the
    C++ type). Importing a module that declares such a class then compiles nothing."""

    def decorator(cls: type[T]) -> type[T]:
        original_new = cls.__new__

        def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
            registered = _registered_classes.get(klass)
            if registered is None:
                import tvm_ffi

                init_fn()
                registered = _registered_classes[klass] = tvm_ffi.register_object(name)(klass)
            if original_new is object.__new__:
                return object.__new__(registered)
            return original_new(registered, *args, **kwargs)

        cls.__new__ = __new__  # type: ignore[method-assign, assignment]
        return cls

    return decorator


__all__ = [
    "CPP_DTYPE_MAP",
    "CPP_TEMPLATE_TYPE",
    "DEFAULT_CFLAGS",
    "DEFAULT_INCLUDE",
    "DEFAULT_LDFLAGS",
    "KERNEL_PATH",
    "ArchInfo",
    "CPPArgList",
    "cache_once",
    "empty_sentinel",
    "get_ci_test_range",
    "get_jit_cuda_arch",
    "is_arch_support_pdl",
    "is_hip_runtime",
    "is_musa_runtime",
    "lazy_register_class",
    "load_jit",
    "make_cpp_args",
    "override_jit_cuda_arch",
    "register_dependency",
    "should_run_full_tests",
]
