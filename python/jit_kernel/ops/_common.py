"""What every op shares: the kernel tables, the one declaration of an op (:func:`kernel_op`), the
explanation of a failed call, and the eager fast paths' conventions.

Division of labour (DESIGN.md, "one owner for every rule"): the C++ launcher checks every tensor
rule (shape, dtype, device, strides, alignment, scalar ranges) and raises ``ValueError`` /
``TypeError`` naming the argument (``host::ffi_export``). Python only picks the kernel
configuration from a call's dtype and sizes, allocates outputs and reshapes; it repeats no C++
check. When a call fails, :func:`explain` turns what C++ cannot see (a non-tensor, a sparse or
meta tensor, a value of the wrong Python type) into an error that names the argument.

An op is declared once, by a *plan* decorated with :func:`kernel_op`::

    @kernel_op("scale", out="out")
    def _scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> Launch:
        if out is None:
            out = src.new_empty(src.shape)
        return Launch(_KERNELS, src.dtype, (out, src, factor), result=out)

and its public function calls it (``_scale(src, factor, out)``), after an eager fast path where
one is measured to matter.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

import torch

from jit_kernel.engine import env, target
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
        # A function serves every device only where all have one arch; elsewhere each call asks the
        # dispatcher, which resolves per target (and the fast paths, never armed, stay off).
        if self._dispatcher.spec.target != "cuda" or target.one_arch_for_all_devices():
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
    op: str, error: BaseException, values: Mapping[str, object], tensors: Sequence[str], launch_args: Sequence[object]
) -> None:
    """Raise a clearer error than ``error`` for what C++ cannot report, naming the argument; return
    (and let the caller re-raise ``error``) when ``error`` already says it.

    ``values`` are the op's arguments by name; ``tensors`` names those that must be tensors (or
    None, for optional ones); ``launch_args`` are the failed launch's arguments in the launcher's
    order (tvm-ffi reports a conversion failure by position: the argument is the one passed as is)."""
    for name in tensors:
        value = values.get(name)
        if isinstance(value, torch.Tensor):
            _dense(op, name, value)
        elif value is not None:
            not_a_tensor(op, name, value)
    match = _MISMATCHED_ARGUMENT.match(str(error)) if isinstance(error, TypeError) else None
    if match is not None:
        index, expected = int(match.group(1)), match.group(2)
        passed = launch_args[index] if index < len(launch_args) else None
        name = next((n for n, v in values.items() if v is passed), f"argument #{index}")
        wanted = "a torch.Tensor" if "Tensor" in expected else _PYTHON_TYPE.get(expected, f"a {expected}")
        raise TypeError(f"{op}: {name} must be {wanted}, got {type(passed).__name__}") from None


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


# ---------------------------------------------------------------------------------------------
# One declaration per op


class Launch(NamedTuple):
    """One kernel launch of an op: ``kernels[key](*args)``, ``args`` in the launcher's C++ order.

    ``result`` is what the op returns when this is its last launch. ``bounds``, when given, reads
    index tensors and raises ``IndexError`` naming the first bad one: it runs only under
    ``JIT_KERNEL_CHECK_INDICES=1``, after the launcher has checked the tensors (without their data)
    and before the launch, so that it reads only indices the kernel would accept."""

    kernels: KernelTable
    key: Any
    args: tuple[Any, ...]
    result: Any = None
    bounds: Callable[[], None] | None = None


Plan = Callable[..., "Launch | tuple[Launch, ...]"]


def _launchers_can_check(args: Sequence[object]) -> bool:
    """Whether a fake call can reach the C++ launcher: the tensors' sizes are concrete (symbolic
    ones have no DLPack form) and a kernel can be loaded (a GPU, or an arch override)."""
    for arg in args:
        if isinstance(arg, torch.SymInt) or (
            isinstance(arg, torch.Tensor) and not all(type(n) is int for n in (*arg.shape, *arg.stride()))
        ):
            return False
    return torch.cuda.is_available() or env.cuda_arch_override() is not None


class Op:
    """An op declared once, by its *plan*: a function whose signature is the op's (the names,
    types and defaults of ``torch.ops.jit_kernel.<name>``) and which returns the :class:`Launch`
    (or launches) a call makes: the kernel table and key that pick the kernel, and its arguments.

    From that one declaration come the ``torch.library`` registration (schema from the signature;
    with ``out="out"`` a functional ``<name>`` without ``out`` and a ``<name>_out`` that mutates it),
    the fake implementation (the same plan, with the launcher's checks run on tensors without data:
    the one copy of the tensor rules, so tracing rejects what the op rejects, with the same error),
    the explanation of a failed call (:func:`explain`, naming the argument), and the call itself,
    eager or traced. Public functions call the op; where an eager fast path is measured to matter,
    they try it first (``FAST_PATH_MISS``)."""

    def __init__(self, name: str, plan: Plan, mutates: tuple[str, ...], out: str | None, register: bool) -> None:
        self.name = name
        self.plan = plan
        self.signature = inspect.signature(plan)
        parameters = self.signature.parameters
        self._tensors = tuple(n for n, p in parameters.items() if "Tensor" in str(p.annotation))
        self._out = out
        self._out_index = list(parameters).index(out) if out is not None else -1
        self._names = tuple(parameters)
        # An op mutating a tensor that defaults to None is registered without defaults (see
        # _custom_op): traced calls then pass these.
        self._defaults = (
            {n: p.default for n, p in parameters.items() if p.default is not inspect.Parameter.empty}
            if any(parameters[n].default is None for n in mutates)
            else {}
        )
        self._registered = register
        if register:
            self._register(mutates)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The op: through ``torch.ops.jit_kernel`` while torch.compile traces, else launched here."""
        if self._registered and (dynamo_compiling() or compile_state._is_compiling_flag):  # is_compiling(), inlined
            return self.traced(*args, **kwargs)
        return self.run(True, args, kwargs)

    def run(self, mode: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Plan the call and launch it: ``mode`` True launches; ``CHECK_ONLY`` runs the launchers'
        checks on tensors without data (a fake call); False only picks the configs (a fake call
        that cannot reach a launcher). A failure is explained, naming the argument."""
        launch = None
        try:
            planned = self.plan(*args, **kwargs)
            if mode is True and type(planned) is Launch and planned.bounds is None:  # the common case
                launch = planned
                launch.kernels[launch.key](*launch.args)
                return launch.result
            launches = planned if type(planned) is tuple else (planned,)
            for launch in launches:
                kernel = launch.kernels.get_kernel(launch.key, mode)
                if kernel is None:
                    continue
                if launch.bounds is not None and mode is True and env.check_indices():
                    checks_only(kernel)(*launch.args)
                    launch.bounds()
                kernel(*launch.args)
        except (TypeError, RuntimeError, AttributeError) as error:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError:
                raise error from None  # a wrong argument list: Python's own message says it
            bound.apply_defaults()
            explain(self.name, error, bound.arguments, self._tensors, launch.args if launch is not None else ())
            raise
        return launches[-1].result

    def traced(self, *args: Any, **kwargs: Any) -> Any:
        """The call through ``torch.ops.jit_kernel`` (what torch.compile sees)."""
        if self._defaults:
            args, kwargs = (), self._defaults | dict(zip(self._names, args, strict=False)) | kwargs
        if self._out is None:
            return self._torch_op(*args, **kwargs)
        index = self._out_index
        if len(args) > index:
            out, args = args[index], (*args[:index], *args[index + 1 :])
        else:
            out = kwargs.pop(self._out, None)
        if out is None:
            return self._torch_op(*args, **kwargs)
        self._torch_out_op(out, *args, **kwargs)
        return out

    def _register(self, mutates: tuple[str, ...]) -> None:
        parameters = list(self.signature.parameters.values())
        if self._out is None:
            self._torch_op = self._custom_op(self.name, parameters, None, mutates)
            return
        rest = [p for p in parameters if p.name != self._out]
        out = parameters[self._out_index].replace(annotation="torch.Tensor", default=inspect.Parameter.empty)
        self._torch_op = self._custom_op(self.name, rest, "torch.Tensor", mutates)
        self._torch_out_op = self._custom_op(f"{self.name}_out", [out, *rest], None, (*mutates, self._out))

    def _custom_op(
        self, name: str, parameters: list[inspect.Parameter], returns: str | None, mutates: tuple[str, ...]
    ) -> Any:
        """``torch.ops.jit_kernel.<name>`` taking ``parameters``: its real and fake implementations
        run the plan with the arguments by name (``out``, when left out, as None).

        An op that mutates a tensor defaulting to None is registered with no defaults at all
        (``traced`` passes every argument): torch before 2.13 bumps the version of each mutated
        argument by its position among the arguments passed, and fails (IndexError) on one left at
        its default, which the dispatcher drops."""
        if any(p.name in mutates and p.default is None for p in parameters):
            parameters = [p.replace(default=inspect.Parameter.empty) for p in parameters]
        names = [p.name for p in parameters]
        missing = {self._out: None} if self._out is not None and self._out not in names else {}

        def implementation(mode: Any) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                values = dict(zip(names, args, strict=False)) | kwargs | missing
                checked = CHECK_ONLY if mode is False and _launchers_can_check(tuple(values.values())) else mode
                result = self.run(checked, (), values)
                return result if returns is not None else None

            call.__name__ = name
            call.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
            call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
            return call

        op = torch.library.custom_op(f"jit_kernel::{name}", implementation(True), mutates_args=mutates)
        op.register_fake(implementation(False))
        return getattr(torch.ops.jit_kernel, name)


def kernel_op(
    name: str, *, mutates: tuple[str, ...] = (), out: str | None = None, register: bool = True
) -> Callable[[Plan], Op]:
    """Declare the op ``name`` by its plan (see :class:`Op`). ``mutates``: the tensors it writes in
    place; ``out``: the parameter of an optional output the op allocates when it is None (registered
    as a functional op and an ``_out`` op); ``register=False`` for ops torch.compile cannot see
    through (raw addresses), which get everything but the ``torch.library`` registration."""

    def declare(plan: Plan) -> Op:
        return Op(name, plan, mutates, out, register)

    return declare
