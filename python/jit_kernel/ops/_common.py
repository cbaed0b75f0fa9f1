"""What every op shares: the kernel tables, the one declaration of an op (:func:`kernel_op`) and
the explanation of a failed call.

Division of labour (the design's "one owner for every rule"): the C++ launcher checks every tensor
rule (shape, dtype, device, strides, alignment, scalar ranges) and raises ``ValueError`` /
``TypeError`` naming the argument (``host::ffi_export``). Python only picks the kernel
configuration from a call's dtype and sizes, allocates outputs and reshapes; it repeats no C++
check. When a call fails, :func:`explain` turns what C++ cannot see (a non-tensor, a sparse or
meta tensor, a value of the wrong Python type) into an error that names the argument.

An op is declared once, by a *plan* decorated with :func:`kernel_op`::

    @kernel_op("scale", out="out")
    def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> Launch:
        # (the public docstring)
        if out is None:
            out = torch.empty_like(src)
        return _KERNELS, src.dtype, (out, src, factor), out

The decorated name is the op itself: a function with the plan's signature and docstring whose body
is the plan's, each returned launch made directly (``_eager``: eagerly, the plan is the whole call,
written for the common case first), or that calls ``torch.ops.jit_kernel.<name>`` while
torch.compile traces.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jit_kernel.engine import env, target
from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.jit import make_cpp_args
from jit_kernel.engine.spec import Config
from jit_kernel.ops import _eager, _site
from jit_kernel.ops._no_data import checks_only, without_data

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


class KernelTable(dict[Any, Callable[..., Any]]):
    """``table[key]`` -> the tvm-ffi function of one export for a call's ``key`` (its dtype and
    sizes). A hit is one dict lookup; a miss asks ``select`` for the config (which raises for a key
    no kernel serves) and the dispatcher for the function (prebuilt or JIT)."""

    def __init__(self, dispatcher: Dispatcher, export: str, select: Callable[..., Config]) -> None:
        super().__init__()
        self._dispatcher = dispatcher
        self._export = export
        self._select = select
        #: The launch sites that hold this table's kernels (``_site``): told whenever an entry
        #: changes or goes, so that they never serve a kernel the table no longer holds.
        self.sites: list[_site.LaunchSite] = []
        TABLES.append(self)

    def forget_sites(self) -> None:
        for site in self.sites:
            site.forget()

    def __setitem__(self, key: Any, kernel: Callable[..., Any]) -> None:
        super().__setitem__(key, kernel)
        self.forget_sites()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self.forget_sites()

    def clear(self) -> None:
        super().clear()
        self.forget_sites()

    def pop(self, *args: Any) -> Any:
        try:
            return super().pop(*args)
        finally:
            self.forget_sites()

    def popitem(self) -> tuple[Any, Callable[..., Any]]:
        try:
            return super().popitem()
        finally:
            self.forget_sites()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self.forget_sites()

    def config(self, key: Any) -> Config:
        """The config for ``key`` without loading its kernel (fake implementations, tracing)."""
        return self._select(*key) if isinstance(key, tuple) else self._select(key)

    def __missing__(self, key: Any) -> Callable[..., Any]:
        function = self._dispatcher.function(self._export, self.config(key))
        # A function serves every device only where all have one arch; elsewhere each call asks the
        # dispatcher, which resolves per target.
        if self._dispatcher.spec.target != "cuda" or target.one_arch_for_all_devices():
            dict.__setitem__(self, key, function)  # a new key: what the sites hold stays true
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


# Every kernel table, in the order the op modules made them (for recorded_launches).
TABLES: list[KernelTable] = []


def recorded_launches(call: Callable[[], object]) -> tuple[list[tuple[Callable[..., Any], tuple[Any, ...]]], Any]:
    """The kernel launches ``call`` makes, as ``(tvm-ffi function, its arguments)``, after running
    it once: the launcher's exact arguments, read from the ops' own plans (benchmarks time these as
    the raw call), and what the recorded call returned. ``call`` runs twice: once to load its
    kernels, once with every loaded kernel wrapped to record its arguments."""
    call()
    launches: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
    saved = [(table, dict(table)) for table in TABLES]

    def recording(kernel: Callable[..., Any]) -> Callable[..., Any]:
        def record(*args: Any) -> Any:
            launches.append((kernel, args))
            return kernel(*args)

        return record

    try:
        for table, kernels in saved:
            table.update({key: recording(kernel) for key, kernel in kernels.items()})
        result = call()
    finally:
        for table, kernels in saved:
            dict.clear(table)
            table.update(kernels)
    return launches, result


# torch.compile's switch: under it the ops call ``torch.ops.jit_kernel.*`` instead of the kernels.
# ``torch.compiler.is_compiling()`` is ``torch.jit.is_scripting()`` (False outside TorchScript,
# which cannot script these ops) and then the flag ``torch.compiler._is_compiling_flag`` (set by
# torch.export and while torch.compile compiles), and TorchDynamo folds the call to True when it
# traces an op. The ops read the same answer as ``dynamo_compiling() or
# compile_state._is_compiling_flag``, at a third of the cost: TorchDynamo folds
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
    """``torch.compiler.is_compiling()``, as the ops read it (above)."""
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


def split_scale(op: str, name: str, scale: object) -> tuple[torch.Tensor | None, float | None]:
    """A static fp8 scale as the launchers take it: ``(tensor, None)`` for a tensor (one of one
    element but another shape viewed as ``[1]``; C++ checks the rest: float32, ``[1]``, the device),
    ``(None, float)`` for a float (a subclass too, e.g. NumPy's float64) or an int, ``(None, None)``
    for None."""
    if type(scale) is float:
        return None, scale
    if isinstance(scale, torch.Tensor):
        return (scale.reshape(1) if scale.ndim != 1 and scale.numel() == 1 else scale), None
    if scale is None:
        return None, None
    if isinstance(scale, (float, int)) and not isinstance(scale, bool):
        return None, float(scale)
    raise TypeError(f"{op}: {name} must be a float32 tensor of one element or a float, got {type(scale).__name__}")


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


def rows_and_out(
    op: str, input: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input's rows, out, out's rows)`` for a row kernel called on ``[..., D]``: ``out`` (of
    ``input``'s shape, allocated in ``dtype`` or ``input``'s when None) and ``input`` viewed as the
    rows the kernel takes (the plans' path for inputs that are not already rows)."""
    in_rows = rows(op, "input", input)
    if out is None:
        out = input.new_empty(input.shape, dtype=dtype)
    return in_rows, out, rows_like(op, "out", out, input)


# ---------------------------------------------------------------------------------------------
# One declaration per op

#: One kernel launch of an op: ``(kernels, key, args, result)``, launched as ``kernels[key](*args)``
#: with ``args`` in the launcher's C++ order; ``result`` is what the op returns when this is its last
#: launch. A plain tuple: a plan runs on every eager call, and a named tuple costs a Python-level
#: constructor. A plan of several launches returns a list of them.
Launch = tuple[Any, Any, tuple[Any, ...], Any]
Plan = Callable[..., "Launch | list[Launch]"]
# An index check: the op's arguments by name -> None, or IndexError naming the first bad index.
IndexCheck = Callable[[Mapping[str, Any]], None]


class _Declined:
    """What a plan returns for a call its kernels do not serve (an op with a fallback)."""

    def __repr__(self) -> str:
        return _eager.DECLINED_NAME


#: ``return DECLINED`` in the plan of an op declared with ``declined=``: the op calls its fallback.
DECLINED: Any = _Declined()

# What a failed launch may raise that explain() can make clearer (ValueError and IndexError from
# the plan or the launcher already name the argument).
_EXPLAINED = (TypeError, RuntimeError, AttributeError)


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
    types and defaults of ``torch.ops.jit_kernel.<name>``) and which returns the launch (or list of
    launches) a call makes: the kernel table and key that pick the kernel, its arguments, the result.

    From that one declaration come the op's callable (:attr:`function`: the plan's body compiled
    with its launches written out, inside the tracing switch and the explanation of a failure; see
    ``_eager``), the ``torch.library`` registration (schema from the signature;
    with ``out="out"`` a functional ``<name>`` without ``out`` and a ``<name>_out`` that mutates
    it), the fake implementation (the same plan, with the launcher's checks run on tensors without
    data: the one copy of the tensor rules, so tracing rejects what the op rejects, with the same
    error) and, with ``index_check``, the check of index tensors under
    ``JIT_KERNEL_CHECK_INDICES=1`` (after the launcher has checked the tensors without their data,
    before the launch, so that it reads only indices the kernel would accept).

    An op with a fallback (``declined``) serves only what its kernels serve and hands the rest to
    ``declined``, a function of the op's parameters: its plan may ``return DECLINED``, and its
    launchers return False (having launched nothing) for arguments they do not serve, True
    otherwise; either way the op returns ``declined(<the call's arguments as given>)``. The rule of
    what is served lives where its facts are read, mostly in C++, and nowhere else;
    :meth:`serves` asks it."""

    def __init__(
        self,
        name: str,
        plan: Plan,
        mutates: tuple[str, ...],
        out: str | None,
        register: bool,
        index_check: IndexCheck | None,
        declined: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.plan = plan
        self._declined = declined
        self.signature = inspect.signature(plan)
        parameters = self.signature.parameters
        self._tensors = tuple(n for n, p in parameters.items() if "Tensor" in str(p.annotation))
        self._out = out
        self._out_index = list(parameters).index(out) if out is not None else -1
        self._names = tuple(parameters)
        self._index_check = index_check
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
        self.function = self._function()

    def _function(self) -> Callable[..., Any]:
        """The op's callable: the plan's body compiled as the eager call (``_eager.compile_eager``),
        after the switch to ``torch.ops.jit_kernel`` while torch.compile traces and, for ops with
        an index check, the check under ``JIT_KERNEL_CHECK_INDICES=1``; a failure explained."""
        parameters = self.signature.parameters.values()
        call = ", ".join(p.name if p.kind is p.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}" for p in parameters)
        by_name = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in parameters) + "}"
        prologue = []
        if self._registered:
            prologue += [
                "if dynamo_compiling__() or compile_state__._is_compiling_flag:",
                f"    return traced__({call})",
            ]
        if self._index_check is not None:  # env.check_indices, its common answer (unset) inlined
            prologue += [
                "if CHECK_INDICES_KEY__ in ENVIRON_DATA__ and check_indices__():",
                f"    return run__(True, {by_name})",
            ]
        helpers = {
            "dynamo_compiling__": dynamo_compiling,
            "compile_state__": compile_state,
            "check_indices__": env.check_indices,
            "CHECK_INDICES_KEY__": env.CHECK_INDICES_KEY,
            "ENVIRON_DATA__": env.ENVIRON_DATA,
            "traced__": self.traced,
            "run__": self.run,
            "fail__": self.fail,
            "launch__": _eager.launch,
            "EXPLAINED__": _EXPLAINED,
        }
        if self._declined is not None:
            helpers["declined__"] = self._declined
        function = _eager.compile_eager(
            self.plan, prologue, helpers, declined=self._declined is not None, sites=not env.launch_sites_disabled()
        )
        function.__doc__ = self.plan.__doc__
        function.__module__ = self.plan.__module__
        function.__qualname__ = self.plan.__qualname__
        function.__signature__ = self.signature.replace(return_annotation=inspect.Signature.empty)
        function.op = self
        return function

    def fail(
        self, error: BaseException, values: Mapping[str, Any], launch_args: Sequence[object] | None = None
    ) -> None:
        """Raise a clearer error than ``error`` where :func:`explain` has one; else return, and the
        caller re-raises ``error``. ``values``: the call's arguments by name; ``launch_args``: the
        failed launch's arguments (tvm-ffi names a rejected type by its position there). Without
        them (the eager call keeps none), the plan runs again, on this failed call only, for its
        first launch's."""
        if launch_args is None:
            try:
                planned = self.plan(**values)
                launch_args = (planned if type(planned) is tuple else planned[0])[2]
            except Exception:
                launch_args = ()
        explain(self.name, error, values, self._tensors, launch_args)

    def run(self, mode: Any, values: Mapping[str, Any]) -> Any:
        """Plan the call and launch it: ``mode`` True launches, checking indices where asked;
        ``CHECK_ONLY`` runs the launchers' checks on tensors without data (a fake call); False only
        picks the configs (a fake call that cannot reach a launcher). A failure is explained,
        naming the argument."""
        args = None
        if mode is False and self._declined is not None:
            # A fake call of unknown sizes: the fallback's result has the kernels' shape and dtype,
            # and the rule is not asked (which would guard on the sizes).
            return self._declined(**values)
        try:
            planned = self.plan(**values)
            if planned is DECLINED:
                return self._declined(**values)  # type: ignore[misc]
            launches = (planned,) if type(planned) is tuple else planned
            result = None
            for kernels, key, args, result in launches:  # noqa: B007 (the last launch's result is the op's)
                kernel = kernels.get_kernel(key, mode)
                if kernel is None:
                    continue
                if self._index_check is not None and mode is True and env.check_indices():
                    checks_only(kernel)(*args)
                    self._index_check(values)
                if kernel(*args) is False and self._declined is not None:
                    return self._declined(**values)
        except _EXPLAINED as error:
            self.fail(error, values, args or ())
            raise
        return result

    def serves(self, *args: Any, **kwargs: Any) -> bool:
        """Whether a call with these arguments runs the op's kernels rather than its fallback (an op
        with one): the plan, then each launcher's checks and rule with the call's result as a
        tensor without data (the launchers return after their checks on an output without data),
        so nothing launches. Real tensors are read as they are, their data pointers included;
        FakeTensors (CUDA ones: no GPU is needed) as tensors without data, taken as aligned."""
        values = self.signature.bind(*args, **kwargs).arguments
        planned = self.plan(**values)
        if planned is DECLINED:
            return False
        for kernels, key, launch_args, result in (planned,) if type(planned) is tuple else planned:
            passed = [without_data(a) if a is result or isinstance(a, FakeTensor) else a for a in launch_args]
            if kernels[key](*passed) is False:
                return False
        return True

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
        # The torch.library schema takes every argument positionally too (keyword-only ones included).
        parameters = [p.replace(kind=p.POSITIONAL_OR_KEYWORD) for p in self.signature.parameters.values()]
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
                result = self.run(checked, values)
                return result if returns is not None else None

            call.__name__ = name
            call.__signature__ = inspect.Signature(parameters, return_annotation=returns)  # type: ignore[attr-defined]
            call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
            return call

        op = torch.library.custom_op(f"jit_kernel::{name}", implementation(True), mutates_args=mutates)
        op.register_fake(implementation(False))
        return getattr(torch.ops.jit_kernel, name)


def kernel_op(
    name: str,
    *,
    mutates: tuple[str, ...] = (),
    out: str | None = None,
    register: bool = True,
    index_check: IndexCheck | None = None,
    declined: Callable[..., Any] | None = None,
) -> Callable[[Plan], Callable[..., Any]]:
    """Declare the op ``name`` by its plan (see :class:`Op`) and return its callable (the plan's
    signature and docstring; ``.op`` is the :class:`Op`). ``mutates``: the tensors it writes in
    place; ``out``: the parameter of an optional output the op allocates when it is None
    (registered as a functional op and an ``_out`` op); ``register=False`` for ops torch.compile
    cannot see through (raw addresses), which get everything but the ``torch.library``
    registration; ``index_check``: the check of the op's index tensors under
    ``JIT_KERNEL_CHECK_INDICES=1``, given the op's arguments by name; ``declined``: the fallback of
    an op that serves only some calls (see :class:`Op`)."""

    def declare(plan: Plan) -> Callable[..., Any]:
        return Op(name, plan, mutates, out, register, index_check, declined).function

    return declare
