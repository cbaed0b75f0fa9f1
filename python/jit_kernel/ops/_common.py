"""What every op shares: the kernel tables of the eager path, error explanations, registration.

Division of labour (DESIGN.md, "one owner for every rule"): the C++ launcher checks every tensor
rule (shape, dtype, device, strides, alignment, scalar ranges) and raises ``ValueError`` /
``TypeError`` naming the argument (``host::ffi_export``). Python only picks the kernel
configuration from a call's dtype and sizes, allocates outputs and reshapes; it repeats no C++
check. When a call fails, :func:`explain` turns what C++ cannot see (a non-tensor, a sparse or
meta tensor, a value of the wrong Python type) into an error that names the argument.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch

from jit_kernel.engine import env
from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.jit import make_cpp_args
from jit_kernel.engine.spec import Config
from jit_kernel.ops._no_data import checks_only

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Config values name dtypes as C++ types; make_cpp_args owns that table.
CPP_DTYPE = {dtype: make_cpp_args(dtype)[0] for dtype in FLOAT_DTYPES}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def float_dtype(op: str, name: str, dtype: torch.dtype) -> str:
    """The C++ type of a float dtype, for a config; a ``TypeError`` naming ``name`` otherwise."""
    cpp = CPP_DTYPE.get(dtype)
    if cpp is None:
        names = ", ".join(map(_dtype_name, FLOAT_DTYPES))
        raise TypeError(f"{op}: {name} must be one of ({names}), got {_dtype_name(dtype)}")
    return cpp


# Read only: the ``by_dtype`` entry of a dtype no kernel was loaded for (``KernelTable``).
NO_KERNELS: dict[Any, Callable[..., Any]] = {}


class KernelTable(dict[Any, Callable[..., Any]]):
    """``table[key]`` -> the tvm-ffi function of one export for a call's ``key`` (its dtype and
    sizes). A hit is one dict lookup; a miss asks ``select`` for the config (which raises for a key
    no kernel serves) and the dispatcher for the function (prebuilt or JIT).

    Keys ``(dtype, size)`` are also filed in :attr:`by_dtype`, ``dtype -> {size -> function}``,
    for the eager fast paths: ``by_dtype.get(dtype, NO_KERNELS).get(size)`` is two plain lookups,
    with no key tuple to build, hash and compare (about half the cost). Fill the table through
    ``table[key]`` (or ``table[key] = function``) and empty it with ``clear()``, which keep both."""

    def __init__(self, dispatcher: Dispatcher, export: str, select: Callable[..., Config]) -> None:
        super().__init__()
        self._dispatcher = dispatcher
        self._export = export
        self._select = select
        self.by_dtype: dict[Any, dict[Any, Callable[..., Any]]] = {}

    def __setitem__(self, key: Any, function: Callable[..., Any]) -> None:
        super().__setitem__(key, function)
        if type(key) is tuple and len(key) == 2:
            self.by_dtype.setdefault(key[0], {})[key[1]] = function

    def clear(self) -> None:
        super().clear()
        self.by_dtype.clear()

    def config(self, key: Any) -> Config:
        """The config for ``key`` without loading its kernel (fake implementations, tracing)."""
        return self._select(*key) if isinstance(key, tuple) else self._select(key)

    def __missing__(self, key: Any) -> Callable[..., Any]:
        function = self._dispatcher.function(self._export, self.config(key))
        self[key] = function
        return function

    def get_kernel(self, key: Any, run: bool) -> Callable[..., Any] | None:
        """``self[key]`` for a call that launches; for ``run=CHECK_ONLY`` (a fake call), the kernel
        called on tensors without data (its launcher checks, launches nothing); for ``run=False``,
        only the config choice, which raises for a key no kernel serves."""
        if run is True:
            return self[key]
        if run is CHECK_ONLY:
            return checks_only(self[key])
        self.config(key)
        return None


# The eager fast path, written out in each public op (a helper's frame and star-args cost more
# than the lookup): outside tracing, ``kernel = TABLE.get(key)`` with ``key`` read from the call as
# cheaply as it can be, then, if an earlier call loaded that kernel, ``kernel(*launcher args)``,
# all inside ``try``. ``dict.get`` never loads (``KernelTable.__missing__`` runs only for
# ``TABLE[key]``): the first call of a key takes the op's full path, which loads the kernel and
# explains a failure. The launcher checks every tensor before it launches, so on any of these
# exceptions nothing ran, and the full path runs and explains the error (or serves a form, such as
# a 3-D input it views as rows, that the kernel takes only reshaped).
FAST_PATH_MISS = (TypeError, ValueError, AttributeError, IndexError)

# torch.compile's switch: under it the ops call ``torch.ops.jit_kernel.*`` instead of the kernels.
# ``torch.compiler.is_compiling()`` is ``torch.jit.is_scripting()`` (False outside TorchScript,
# which cannot script these ops) and then the flag ``torch.compiler._is_compiling_flag`` (set by
# torch.export and while torch.compile compiles), and TorchDynamo folds the call to True when it
# traces an op. The ops' eager paths read the same answer inline, for a third of the cost, as
# ``dynamo_compiling() or compile_state._is_compiling_flag``: TorchDynamo folds
# ``torch.compiler.is_dynamo_compiling()`` to True as it folds ``is_compiling()``, so a traced
# ``or`` stops there (the flag is never read, nothing is guarded); eagerly it returns False and the
# flag decides. A torch without these two names gets ``is_compiling`` itself and a flag never set.
if callable(getattr(torch.compiler, "is_dynamo_compiling", None)) and isinstance(
    getattr(torch.compiler, "_is_compiling_flag", None), bool
):
    dynamo_compiling: Callable[[], bool] = torch.compiler.is_dynamo_compiling
    compile_state: Any = torch.compiler
else:  # pragma: no cover (torch releases before the flag)
    dynamo_compiling = torch.compiler.is_compiling
    compile_state = types.SimpleNamespace(_is_compiling_flag=False)


def is_compiling() -> bool:
    """``torch.compiler.is_compiling()``, as the ops read it (above): for paths off the eager fast path."""
    return dynamo_compiling() or compile_state._is_compiling_flag


class _CheckOnly:
    """The ``run`` of a fake call whose launcher checks tensors without data: true, like a launch."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "CHECK_ONLY"


CHECK_ONLY: Any = _CheckOnly()


_MISMATCHED_ARGUMENT = re.compile(r"Mismatched type on argument #(\d+) when calling: `[^`]*`\. Expected `([^`]+)`")
# tvm-ffi's names for the kernels' scalar argument types, as a Python user reads them.
_PYTHON_TYPE = {"Optional<bool>": "a bool or None", "bool": "a bool", "int": "an int", "float": "a float"}


def explain(
    op: str, error: BaseException, kernel_args: Sequence[str], values: dict[str, object], tensors: Sequence[str]
) -> None:
    """Raise a clearer error than ``error`` for what C++ cannot report, naming the argument; return
    (and let the caller re-raise ``error``) when ``error`` already says it.

    ``values`` are the op's arguments by name; ``tensors`` names those that must be tensors (or
    None, for optional outputs); ``kernel_args`` names the kernel's arguments in its C++ order
    (tvm-ffi reports a conversion failure by position)."""
    for name in tensors:
        value = values[name]
        if isinstance(value, torch.Tensor):
            _dense(op, name, value)
        elif value is not None:
            not_a_tensor(op, name, value)
    match = _MISMATCHED_ARGUMENT.match(str(error)) if isinstance(error, TypeError) else None
    if match is not None:
        index, expected = int(match.group(1)), match.group(2)
        name = kernel_args[index] if index < len(kernel_args) else f"argument #{index}"
        value = values.get(name)
        wanted = "a torch.Tensor" if "Tensor" in expected else _PYTHON_TYPE.get(expected, f"a {expected}")
        raise TypeError(f"{op}: {name} must be {wanted}, got {type(value).__name__}") from None


def _dense(op: str, name: str, t: torch.Tensor) -> None:
    if t.layout != torch.strided:
        raise ValueError(
            f"{op}: {name} is a sparse tensor ({str(t.layout).removeprefix('torch.')}); "
            "jit_kernel ops take dense tensors (call .to_dense() first)"
        )
    if t.device.type == "meta":
        raise ValueError(
            f"{op}: {name} is on the meta device, which holds no data; pass a real tensor "
            "(torch.compile traces jit_kernel ops through their fake implementations, not meta tensors)"
        )


def not_a_tensor(op: str, name: str, value: object) -> NoReturn:
    raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")


def rows(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` -> ``[rows, D]`` without copying, for kernels that take rows (C++ checks them)."""
    if t.dim() == 2:
        return t
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least one dimension")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(
            f"{op}: the leading dimensions of {name} must collapse into rows with one stride, "
            f"got shape {tuple(t.shape)} strides {t.stride()}"
        ) from None


def rows_like(op: str, name: str, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t``, which must have ``like``'s shape, as the rows the kernel takes. A 2-D ``like`` is
    passed as is and C++ matches ``t`` against it; a reshaped one is checked here, because its
    rows could agree with ``like``'s while its shape does not."""
    if like.dim() == 2:
        return t
    if t.shape != like.shape:
        raise ValueError(f"{op}: {name} must have the shape of {tuple(like.shape)}, got {tuple(t.shape)}")
    return rows(op, name, t)


def _launchers_can_check(args: Sequence[object]) -> bool:
    """Whether a fake call can reach the C++ launcher: the tensors' sizes are concrete (symbolic
    ones have no DLPack form) and a kernel can be loaded (a GPU, or an arch override)."""
    for arg in args:
        if isinstance(arg, torch.SymInt) or (
            isinstance(arg, torch.Tensor) and not all(type(n) is int for n in (*arg.shape, *arg.stride()))
        ):
            return False
    return torch.cuda.is_available() or env.cuda_arch_override() is not None


def register(name: str, impl: Callable[..., Any], mutates: tuple[str, ...] = (), fake_checks: bool = False) -> Any:
    """Register ``impl`` as ``torch.ops.jit_kernel.<name>``, declared once: ``impl`` takes the op's
    arguments plus ``run: bool``; the op calls it with ``run=True``. The schema comes from
    ``impl``'s signature without ``run``.

    The fake implementation (torch.compile's tracing) calls ``impl`` too. With ``fake_checks`` it
    passes ``run=CHECK_ONLY``: the kernel's launcher gets tensors with the FakeTensors' metadata and
    no data (``_no_data``), runs its checks (the one copy of the tensor rules, so tracing rejects
    what the op rejects, with the same error) and returns without launching
    (``host::has_no_data``; only for launchers that return there before any CUDA call). Otherwise,
    or when the launcher cannot be reached (symbolic sizes, no GPU), ``run=False``: the config is
    picked and the outputs allocated, nothing is called."""
    signature = inspect.signature(impl)
    public = signature.replace(parameters=[p for p in signature.parameters.values() if p.name != "run"])

    def bound(run: bool) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not run and fake_checks:
                check = _launchers_can_check((*args, *kwargs.values()))
                return impl(*args, **kwargs, run=CHECK_ONLY if check else False)
            return impl(*args, **kwargs, run=run)

        call.__signature__ = public  # type: ignore[attr-defined]
        call.__annotations__ = {p.name: p.annotation for p in public.parameters.values()} | {
            "return": public.return_annotation
        }
        call.__name__ = name
        return call

    op = torch.library.custom_op(f"jit_kernel::{name}", bound(True), mutates_args=mutates)
    op.register_fake(bound(False))
    return op
