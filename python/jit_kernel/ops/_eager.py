"""The eager call of an op, compiled from its plan's own source.

A plan returns the launch a call makes, ``(kernels, key, args, result)``. Run as written, every
eager call would also pay for the plan's frame, the launch tuple and its unpacking, which is most of
what an op adds to the raw kernel call. So the op's callable is the plan's body itself, compiled a
second time with each ``return`` of a launch written as the launch::

    return _KERNELS, key, (out, src), out     becomes     _KERNELS[key](out, src)
                                                          return out

inside a prologue (the switch to ``torch.ops.jit_kernel`` while torch.compile traces, the index
check under ``JIT_KERNEL_CHECK_INDICES=1``) and an ``except`` that explains a failed call. The plan
stays the one declaration: the fake implementation and the traced call run it as written, and the
compiled body keeps the plan's file and line numbers, so a traceback points at the plan's line.

An op declared with a fallback (``kernel_op(..., declined=...)``) has launchers that return False
where their kernel does not serve the arguments, and a plan that may ``return DECLINED`` for what
it knows before any launch; both become the fallback's call, with the arguments as the call passed
them::

    return DECLINED                           becomes     return declined__(input, weight, ...)
    return _KERNELS, key, (out, src), out     becomes     if _KERNELS[key](out, src) is False:
                                                              return declined__(input, weight, ...)
                                                          return out

The direct form applies where it cannot change what the plan means: the launch's arguments (a tuple
of them, or a name of one) and its result are names or constants (so they read the same after the
kernel lookup as before it), and a list of launches only when all of them are of that form. Any
other ``return`` (a launch built elsewhere, a helper's result) runs through :func:`launch`, as the
plan's result would be. A plan whose source cannot be read is called as it is, around the same
prologue and ``except``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

# The names the compiled function adds to the plan's own: each ends in "__", which no plan's name may.
_LAUNCH = "launch__"
_DECLINED_CALL = "declined__"
#: The name a plan returns to decline the call (``jit_kernel.ops._common.DECLINED``).
DECLINED_NAME = "DECLINED"


def launch(planned: Any) -> Any:
    """Launch what a plan returned (one launch or a list of them); the last launch's result."""
    if type(planned) is tuple:
        kernels, key, args, result = planned
        kernels[key](*args)
        return result
    result = None
    for kernels, key, args, result in planned:  # noqa: B007 (the last launch's result is the op's)
        kernels[key](*args)
    return result


def _plain(node: ast.expr) -> bool:
    return isinstance(node, (ast.Name, ast.Constant))


def _direct(node: ast.expr | None) -> tuple[ast.expr, ast.expr, list[ast.expr], ast.expr] | None:
    """``(kernels, key, call arguments, result)`` of a launch written as a 4-tuple whose arguments
    (a tuple of names or constants, or a name: passed as ``*args``) and result are names or
    constants; None for any other expression."""
    if not (isinstance(node, ast.Tuple) and len(node.elts) == 4):
        return None
    kernels, key, args, result = node.elts
    if isinstance(args, ast.Name):
        arguments: list[ast.expr] = [ast.Starred(args, ast.Load())]
    elif isinstance(args, ast.Tuple) and all(_plain(a) for a in args.elts):
        arguments = list(args.elts)
    else:
        return None
    return (kernels, key, arguments, result) if _plain(result) else None


class _Launches(ast.NodeTransformer):
    """Rewrites each ``return`` of the plan's body (not of functions nested in it) into its launch.
    ``declined``: the fallback's call (an op with one), for ``return DECLINED`` and for a launcher
    that returns False."""

    def __init__(self, declined: ast.expr | None) -> None:
        self._declined = declined

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> ast.stmt | list[ast.stmt]:
        value = node.value
        declined = self._declined
        if declined is not None and isinstance(value, ast.Name) and value.id == DECLINED_NAME:
            return ast.copy_location(ast.Return(copy.deepcopy(declined)), node)
        launches = value.elts if isinstance(value, ast.List) else [value] if value is not None else []
        direct = [_direct(one) for one in launches]
        if not launches or None in direct:
            if declined is not None:
                raise ValueError("kernel_op: a plan with a fallback returns DECLINED or launches written as 4-tuples")
            generic = ast.Call(ast.Name(_LAUNCH, ast.Load()), [value or ast.Constant(None)], [])
            return ast.copy_location(ast.Return(generic), node)
        statements: list[ast.stmt] = []
        for kernels, key, args, _ in direct:  # type: ignore[misc]
            call = ast.Call(ast.Subscript(kernels, key, ast.Load()), args, [])
            if declined is None:
                statements.append(ast.Expr(call))
            else:
                refused = ast.Compare(call, [ast.Is()], [ast.Constant(False)])
                statements.append(ast.If(refused, [ast.Return(copy.deepcopy(declined))], []))
        statements.append(ast.Return(direct[-1][3]))  # type: ignore[index]
        return [ast.copy_location(s, node) for s in statements]


def _plan_body(plan: Callable[..., Any]) -> tuple[list[ast.stmt], str] | None:
    """The statements of the plan's body (its docstring left out), their line numbers those of its
    file, and the file; None where the source cannot be read (a plan made by ``exec``, a build
    without sources)."""
    try:
        lines, first = inspect.getsourcelines(plan)
        filename = inspect.getsourcefile(plan)
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    definition = tree.body[0] if tree.body else None
    if filename is None or not isinstance(definition, ast.FunctionDef) or definition.name != plan.__code__.co_name:
        return None
    ast.increment_lineno(tree, first - 1)
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    clashes = sorted({n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and n.id.endswith("__")})
    if clashes:
        raise ValueError(f"kernel_op {plan.__name__}: names ending in '__' are reserved, got {clashes}")
    return body, filename


def _at(line: int, node: ast.AST) -> ast.AST:
    """``node`` and everything in it placed at ``line`` (code the plan's source does not hold)."""
    for child in ast.walk(node):
        if "lineno" in child._attributes:
            child.lineno = child.end_lineno = line  # type: ignore[attr-defined]
            child.col_offset = child.end_col_offset = 0  # type: ignore[attr-defined]
    return node


def compile_eager(
    plan: Callable[..., Any], prologue: list[str], helpers: dict[str, Any], declined: bool = False
) -> Callable[..., Any]:
    """The plan's body compiled as its op's eager call: the ``prologue`` (lines of source) first, then
    the body with its launches written out, in ``try``; ``except EXPLAINED__ as error__:`` calls
    ``fail__(error__, <the call's arguments by name>)`` and re-raises. ``helpers``: the values of the
    names these lines use (each ending in "__", ``fail__`` and ``EXPLAINED__`` among them, and
    ``declined__``, the fallback, with ``declined``). The function has the plan's parameters,
    defaults, globals and closure."""
    signature = inspect.signature(plan)
    header, call = [], []
    for p in signature.parameters.values():
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"kernel_op {plan.__name__}: plan parameters must be named, got {p}")
        if p.kind is p.KEYWORD_ONLY and "*" not in header:
            header.append("*")
        header.append(p.name if p.default is p.empty else f"{p.name}=None")  # the plan's defaults replace these
        call.append(p.name if p.kind is p.POSITIONAL_OR_KEYWORD else f"{p.name}={p.name}")
    source = _plan_body(plan)
    if source is None:
        body, filename = ast.parse(f"return {_LAUNCH}(plan__({', '.join(call)}))").body, f"<kernel_op {plan.__name__}>"
        helpers = helpers | {"plan__": plan}
    else:
        body, filename = source
    line = plan.__code__.co_firstlineno if source is not None else 1
    # The arguments as the call passed them, for the explanation of a failure: a parameter the body
    # rebinds (an allocated out) is saved first.
    rebound = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    names = list(signature.parameters)
    saved = [f"{n}_given__ = {n}" for n in names if n in rebound]
    given = ", ".join(f"{n!r}: {n}_given__" if n in rebound else f"{n!r}: {n}" for n in names)
    fallback = None
    if declined:
        if source is None:
            raise ValueError(f"kernel_op {plan.__name__}: a plan with a fallback needs its source")
        passed = {n: f"{n}_given__" if n in rebound else n for n in names}
        as_given = [
            passed[n] if p.kind is p.POSITIONAL_OR_KEYWORD else f"{n}={passed[n]}"
            for n, p in signature.parameters.items()
        ]
        fallback = _at(line, ast.parse(f"{_DECLINED_CALL}({', '.join(as_given)})", mode="eval").body)
    statements: list[ast.stmt] = []
    for statement in body if source is not None else ():
        rewritten = _Launches(fallback).visit(statement)
        statements.extend(rewritten if isinstance(rewritten, list) else [rewritten])
    statements = statements or body
    handler = f"try:\n    pass\nexcept EXPLAINED__ as error__:\n    fail__(error__, {{{given}}})\n    raise"
    guarded = ast.parse(handler).body[0]
    assert isinstance(guarded, ast.Try)
    _at(line, guarded).body = statements  # type: ignore[attr-defined]
    # The op's function, inside one whose parameters are the helpers and the plan's closure variables:
    # the op reads each as a closure cell, and the cells passed in below are the plan's own.
    free = (*helpers, *plan.__code__.co_freevars)
    definition = f"def {plan.__name__}({', '.join(header)}):\n        pass"
    module = ast.parse(f"def compile__({', '.join(free)}):\n    {definition}")
    outer = module.body[0]
    assert isinstance(outer, ast.FunctionDef) and isinstance(outer.body[0], ast.FunctionDef)
    _at(line, module)
    outer.body[0].body = [*(_at(line, s) for s in ast.parse("\n".join([*prologue, *saved])).body), guarded]  # type: ignore[misc]
    code = compile(ast.fix_missing_locations(module), filename, "exec")
    outer_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = next(c for c in outer_code.co_consts if isinstance(c, types.CodeType))
    cells = dict(zip(plan.__code__.co_freevars, plan.__closure__ or (), strict=True))
    cells |= {name: types.CellType(value) for name, value in helpers.items()}
    closure = tuple(cells[n] for n in inner.co_freevars)
    function = types.FunctionType(inner, plan.__globals__, plan.__name__, plan.__defaults__, closure)
    function.__kwdefaults__ = plan.__kwdefaults__
    return function
