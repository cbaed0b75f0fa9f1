"""``load_jit``, ``cache_once`` and ``make_cpp_args``: the kernel author's Python API, as in SGLang's JIT kernels."""

from __future__ import annotations

import functools
import hashlib
import math
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from jit_kernel.engine import cache, deps, env, target
from jit_kernel.engine.builder import BuildError, BuildRequest
from jit_kernel.engine.spec import name_part
from jit_kernel.engine.unit import DEFAULT_CFLAGS, DEFAULT_CUDA_CFLAGS, TranslationUnit

if TYPE_CHECKING:
    import torch
    from tvm_ffi import Module

__all__ = ["DEFAULT_CFLAGS", "DEFAULT_CUDA_CFLAGS", "cache_once", "load_jit", "make_build_request", "make_cpp_args"]

P = ParamSpec("P")
R = TypeVar("R")


def cache_once(fn: Callable[P, R]) -> Callable[P, R]:
    """Cache ``fn``'s result per (hashable) argument tuple, like ``functools.lru_cache(maxsize=None)``,
    but as plain Python (a dict lookup), which TorchDynamo traces without a graph break: cached
    lookups work inside ``torch.compile(fullgraph=True)``."""
    results: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        if key not in results:
            # No lock: Dynamo cannot trace one, and a racing duplicate call is harmless
            # (load_jit serialises builds itself).
            results[key] = fn(*args, **kwargs)
        return results[key]

    wrapper.cache_clear = results.clear  # type: ignore[attr-defined]
    return wrapper


class CPPArgList(list[str]):
    """Template arguments as C++ text; ``str()`` gives the comma-separated list."""

    def __str__(self) -> str:
        return ", ".join(self)


def cpp_dtype_names() -> dict[torch.dtype, str]:
    """torch dtype -> the C++ type name ``make_cpp_args`` gives it (the seeds' ``CPP_DTYPE_MAP``)."""
    import torch

    return {
        torch.float16: "fp16_t",
        torch.bfloat16: "bf16_t",
        torch.float32: "fp32_t",
        torch.float8_e4m3fn: "fp8_e4m3_t",
        torch.float8_e5m2: "fp8_e5m2_t",
        torch.int8: "int8_t",
        torch.int16: "int16_t",
        torch.int32: "int32_t",
        torch.int64: "int64_t",
        torch.uint8: "uint8_t",
        torch.uint16: "uint16_t",
        torch.uint32: "uint32_t",
        torch.uint64: "uint64_t",
    }


def make_cpp_args(*values: bool | int | float | torch.dtype) -> CPPArgList:
    """Python values to C++ template arguments: ``make_cpp_args(128, True, torch.bfloat16)``
    gives ``["128", "true", "bf16_t"]``."""
    import torch

    def convert(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"make_cpp_args: {value} has no C++ literal")
            return repr(value)
        if isinstance(value, torch.dtype):
            names = cpp_dtype_names()
            if value not in names:
                raise TypeError(f"make_cpp_args: unsupported torch dtype {value}; supported: {list(names)}")
            return names[value]
        raise TypeError(f"make_cpp_args: unsupported argument type {type(value).__name__} ({value!r})")

    return CPPArgList(convert(value) for value in values)


def _resolve_source(name: str) -> Path:
    path = Path(name)
    if not path.is_absolute():
        path = env.CSRC_DIR / path
    if not path.is_file():
        raise FileNotFoundError(
            f"load_jit: source {name!r} not found at {path} (a relative name is looked up under the package's "
            "csrc/ folder; pass an absolute path for a kernel in your own folder)"
        )
    return path.resolve()


def module_name(args: Sequence[object]) -> str:
    name = "_".join(["jit_kernel", *(name_part(str(arg)) for arg in args)])
    if len(name) > 96:  # file names have limits; the cache key still distinguishes modules
        name = f"{name[:80]}_{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name


def make_build_request(
    *args: object,
    cpp_files: Sequence[str] | None = None,
    cuda_files: Sequence[str] | None = None,
    cpp_wrappers: Sequence[tuple[str, str]] | None = None,
    cuda_wrappers: Sequence[tuple[str, str]] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    cuda_arch: str | None = None,
) -> BuildRequest:
    """Describe a module build; ``load_jit`` is this plus the cache. The arch of CUDA code follows
    :func:`~jit_kernel.engine.target.compile_arch`, with ``cuda_arch`` first."""
    includes = extra_include_paths or ()
    languages = (
        ("host", cpp_files, cpp_wrappers, extra_cflags),
        ("cuda", cuda_files, cuda_wrappers, extra_cuda_cflags),
    )
    units = [
        TranslationUnit.make(language, map(_resolve_source, files or ()), wrappers or (), flags or (), includes)
        for language, files, wrappers, flags in languages
        if files or wrappers
    ]
    if not units:
        raise ValueError("load_jit: give at least one of cpp_files, cuda_files, cpp_wrappers, cuda_wrappers")
    has_cuda = units[-1].language == "cuda"
    arch = str(target.compile_arch(cuda_arch)) if has_cuda else None
    return BuildRequest(module_name(args), tuple(units), tuple(extra_ldflags or ()), arch)


_loaded: dict[tuple[BuildRequest, Path | None], Module] = {}
_loaded_lock = threading.Lock()


def load_jit(
    *args: object,
    cpp_files: Sequence[str] | None = None,
    cuda_files: Sequence[str] | None = None,
    cpp_wrappers: Sequence[tuple[str, str]] | None = None,
    cuda_wrappers: Sequence[tuple[str, str]] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str] | None = None,
    extra_dependencies: Sequence[str] | None = None,
    build_directory: str | None = None,
    header_only: bool = True,
) -> Module:
    """Compile (or fetch from the disk cache) a tvm-ffi module and load it.

    ``args`` name the module (usually the family and its template arguments). Files are looked up
    under the package's ``csrc/`` unless absolute. Each wrapper ``(export_name, expression)``
    exports ``expression`` as ``module.export_name``. ``extra_dependencies`` names header-only
    libraries whose include directories are added (``jit_kernel.engine.deps``: ``"cutlass"``,
    ``"flashinfer"``, or any registered with ``register_dependency``). ``header_only=False`` means
    the files export their own functions (``TVM_FFI_DLL_EXPORT_TYPED_FUNC``) and no wrappers may be
    given; the files are still compiled as one translation unit per language. ``build_directory``
    replaces the cache root for this module. Modules are cached in-process as well as on disk.

    Mistakes it reports before compiling, as ``ValueError``: files without wrappers under
    ``header_only=True`` (a module that would export nothing), a wrapper that is not an
    ``(identifier, expression)`` pair or whose expression cannot name a function (unclosed brackets,
    a ``;``), an export name given twice. A wrapper the compiler rejects raises
    :class:`~jit_kernel.engine.builder.BuildError` (a ``RuntimeError``) naming the wrapper, the
    compiler's error on its line and the line that called ``load_jit``; ``compiler_output`` holds
    the whole output. CUDA code is compiled for the arch
    :func:`~jit_kernel.engine.target.compile_arch` gives (``JIT_KERNEL_CUDA_ARCH``, else the GPU's).
    """
    if not header_only and (cpp_wrappers or cuda_wrappers):
        raise ValueError(
            "load_jit: header_only=False means the files export their own functions; pass no cpp_wrappers/cuda_wrappers"
        )
    if header_only and not (cpp_wrappers or cuda_wrappers) and (cpp_files or cuda_files):
        raise ValueError(
            "load_jit: no cpp_wrappers or cuda_wrappers, so the module would export nothing; give the functions "
            "to export as (export_name, C++ expression) pairs, e.g. cuda_wrappers=[('run', 'my_ns::run<128>')], "
            "or header_only=False if the files export their own (TVM_FFI_DLL_EXPORT_TYPED_FUNC)"
        )
    includes = [*(extra_include_paths or ()), *deps.include_paths(extra_dependencies or ())]
    request = make_build_request(
        *args,
        cpp_files=cpp_files,
        cuda_files=cuda_files,
        cpp_wrappers=cpp_wrappers,
        cuda_wrappers=cuda_wrappers,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=includes,
    )
    try:
        return load_request(request, Path(build_directory).resolve() if build_directory else None)
    except BuildError as error:
        raise BuildError(f"{error}\nload_jit was called at {_caller()}", error.compiler_output) from None


def _caller() -> str:
    """``file:line`` of the innermost frame outside this package: the user's call of ``load_jit``."""
    for frame in reversed(traceback.extract_stack()):
        if not Path(frame.filename).resolve().is_relative_to(env.PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno}"
    return "an unknown place"


def load_request(request: BuildRequest, root: Path | None = None) -> Module:
    """Load a described build through the in-process memo and the disk cache."""
    if (request, root) not in _loaded:
        with _loaded_lock:
            if (request, root) not in _loaded:
                _loaded[(request, root)] = cache.load_or_build(request, root)
    return _loaded[(request, root)]


def load_cached(request: BuildRequest, root: Path | None = None) -> Module | None:
    """The module if it is already built, in this process or in the disk cache; never compiles."""
    if (request, root) not in _loaded:
        module = cache.load_cached(request, root)
        if module is None:
            return None
        with _loaded_lock:
            _loaded.setdefault((request, root), module)
    return _loaded[(request, root)]
