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

A direct launch whose table is a constant name and whose key is made of reads of its own arguments
(``x.dtype``, ``w.numel()``, ``x.shape[-1]``) goes through a launch site instead, which makes that
lookup in C++ and leaves the plan's lookup to the keys it has not met (``_site``)::

    return _KERNELS, (x.dtype, w.numel()), (out, x, w), out

becomes::

    launched__ = site_0__(out, x, w)
    if launched__.__class__ is int:  # a key the site has not met
        launched__ = missed_0__(_KERNELS, (x.dtype, w.numel()), out, x, w)
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

from jit_kernel.ops import _site

# The names the compiled function adds to the plan's own: each ends in "__", which no plan's name may.
_LAUNCH = "launch__"
_DECLINED_CALL = "declined__"
_SITE_RESULT = "launched__"
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


def _tuple_bindings(body: list[ast.stmt]) -> dict[int, dict[str, list[ast.expr]]]:
    """For each ``return`` of the plan's body (by ``id``), the names bound there to a tuple of names
    and constants by an earlier ``name = (...)`` of the same or an enclosing block, none of whose
    names has been bound again since: the launch's arguments a ``return ..., args, ...`` passes."""
    found: dict[int, dict[str, list[ast.expr]]] = {}

    def walk(statements: list[ast.stmt], bound: dict[str, list[ast.expr]]) -> None:
        for statement in statements:
            if isinstance(statement, ast.Return):
                found[id(statement)] = dict(bound)
                continue
            if not isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for _, value in ast.iter_fields(statement):  # the blocks inside: if, for, with, try
                    for item in value if isinstance(value, list) else ():
                        block = item.body if isinstance(item, (ast.excepthandler, ast.match_case)) else None
                        if block is not None:
                            walk(block, dict(bound))
                    if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                        walk(value, dict(bound))
            stored = {n.id for n in ast.walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stored.add(statement.name)
            for name in list(bound):
                if name in stored or any(isinstance(e, ast.Name) and e.id in stored for e in bound[name]):
                    del bound[name]
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and isinstance(statement.value, ast.Tuple)
                and all(_plain(e) for e in statement.value.elts)
            ):
                bound[statement.targets[0].id] = list(statement.value.elts)

    walk(body, {})
    return found


def _int_constant(node: ast.expr) -> int | None:
    """The value of an int literal (``-1`` included); None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _int_constant(node.operand)
        return None if value is None else -value
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _key_reads(key: ast.expr, positions: dict[str, int]) -> tuple[int, ...] | None:
    """A launch site's rule (``_site``) for a key made of reads of the launch's arguments (``a.dtype``,
    ``a.numel()``, ``a.shape[d]``, ``a.size(d)``) and constants; None for any other key."""
    rule: list[int] = []
    for part in key.elts if isinstance(key, ast.Tuple) else [key]:
        if isinstance(part, ast.Constant):
            continue
        name: ast.expr | None = None
        read = (0, 0)
        if isinstance(part, ast.Attribute) and part.attr == "dtype":
            name, read = part.value, (_site.DTYPE, 0)
        elif isinstance(part, ast.Call) and isinstance(part.func, ast.Attribute) and not part.keywords:
            method, args = part.func.attr, part.args
            if method == "numel" and not args:
                name, read = part.func.value, (_site.NUMEL, 0)
            elif method == "size" and len(args) == 1 and _int_constant(args[0]) is not None:
                name, read = part.func.value, (_site.SIZE, _int_constant(args[0]))
        elif (
            isinstance(part, ast.Subscript)
            and isinstance(part.value, ast.Attribute)
            and part.value.attr == "shape"
            and _int_constant(part.slice) is not None
        ):
            name, read = part.value.value, (_site.SIZE, _int_constant(part.slice))
        if not isinstance(name, ast.Name) or name.id not in positions:
            return None
        rule += [positions[name.id], *read]
    return tuple(rule) if 0 < len(rule) <= 3 * _site.MAX_KEY_PARTS else None


class _Launches(ast.NodeTransformer):
    """Rewrites each ``return`` of the plan's body (not of functions nested in it) into its launch.
    ``declined``: the fallback's call (an op with one), for ``return DECLINED`` and for a launcher
    that returns False. ``sites``: where a launch goes through a launch site, its :class:`_site.LaunchSite`
    is appended (``site_<i>__`` and ``missed_<i>__`` name it in the body); None: no sites."""

    def __init__(self, declined: ast.expr | None, body: list[ast.stmt], sites: list[_site.LaunchSite] | None) -> None:
        self._declined = declined
        self._sites = sites
        self._bindings = _tuple_bindings(body)
        self._stored = {
            n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }

    def visit_FunctionDef(self, node: ast.AST) -> ast.AST:
        return node

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def _table(self, kernels: ast.expr) -> bool:
        """Whether ``kernels`` names the same table on every call: a name the plan never binds (a
        module's or the plan's closure's), or such a name subscripted by a constant."""
        if isinstance(kernels, ast.Subscript) and isinstance(kernels.slice, ast.Constant):
            kernels = kernels.value
        return isinstance(kernels, ast.Name) and kernels.id not in self._stored

    def _site_launch(self, node: ast.Return, launch: ast.expr) -> tuple[ast.expr, ast.expr] | None:
        """``(the site's call, the call of its miss)`` for a launch through a site; None where the
        launch looks its kernel up in Python."""
        if self._sites is None or not isinstance(launch, ast.Tuple) or len(launch.elts) != 4:
            return None
        kernels, key, args, _ = launch.elts
        if isinstance(args, ast.Name):
            elements = self._bindings.get(id(node), {}).get(args.id)
        elif isinstance(args, ast.Tuple) and all(_plain(a) for a in args.elts):
            elements = list(args.elts)
        else:
            elements = None
        if elements is None or not self._table(kernels):
            return None
        positions: dict[str, int] = {}
        for index, element in enumerate(elements):
            if isinstance(element, ast.Name):
                positions.setdefault(element.id, index)
        rule = _key_reads(key, positions)
        if rule is None:
            return None
        index = len(self._sites)
        self._sites.append(_site.LaunchSite(rule))
        call = ast.Call(ast.Name(f"site_{index}__", ast.Load()), copy.deepcopy(elements), [])
        looked_up = [copy.deepcopy(kernels), copy.deepcopy(key), *copy.deepcopy(elements)]
        return call, ast.Call(ast.Name(f"missed_{index}__", ast.Load()), looked_up, [])

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
        for launch, (kernels, key, args, _) in zip(launches, direct, strict=True):  # type: ignore[misc]
            through_site = self._site_launch(node, launch)
            if through_site is None:
                call: ast.expr = ast.Call(ast.Subscript(kernels, key, ast.Load()), args, [])
                if declined is None:
                    statements.append(ast.Expr(call))
                else:
                    refused = ast.Compare(call, [ast.Is()], [ast.Constant(False)])
                    statements.append(ast.If(refused, [ast.Return(copy.deepcopy(declined))], []))
                continue
            site_call, missed = through_site
            result = ast.Name(_SITE_RESULT, ast.Store())
            statements.append(ast.Assign([result], site_call))
            was_missed = ast.Compare(
                ast.Attribute(ast.Name(_SITE_RESULT, ast.Load()), "__class__", ast.Load()),
                [ast.Is()],
                [ast.Name("int", ast.Load())],
            )
            statements.append(ast.If(was_missed, [ast.Assign([ast.Name(_SITE_RESULT, ast.Store())], missed)], []))
            if declined is not None:
                refused = ast.Compare(ast.Name(_SITE_RESULT, ast.Load()), [ast.Is()], [ast.Constant(False)])
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
    plan: Callable[..., Any],
    prologue: list[str],
    helpers: dict[str, Any],
    declined: bool = False,
    sites: bool = False,
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
    launch_sites: list[_site.LaunchSite] | None = [] if sites else None
    launches = _Launches(fallback, body if source is not None else [], launch_sites)
    for statement in body if source is not None else ():
        rewritten = launches.visit(statement)
        statements.extend(rewritten if isinstance(rewritten, list) else [rewritten])
    statements = statements or body
    handler = f"try:\n    pass\nexcept EXPLAINED__ as error__:\n    fail__(error__, {{{given}}})\n    raise"
    guarded = ast.parse(handler).body[0]
    assert isinstance(guarded, ast.Try)
    _at(line, guarded).body = statements  # type: ignore[attr-defined]
    # The op's function, inside one whose parameters are the helpers and the plan's closure variables:
    # the op reads each as a closure cell, and the cells passed in below are the plan's own.
    site_cells = {}
    for index, site in enumerate(launch_sites or ()):
        site_cells[f"site_{index}__"] = site.cell
        site_cells[f"missed_{index}__"] = types.CellType(site.missed)
    free = (*helpers, *site_cells, *plan.__code__.co_freevars)
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
    cells |= {name: types.CellType(value) for name, value in helpers.items()} | site_cells
    closure = tuple(cells[n] for n in inner.co_freevars)
    function = types.FunctionType(inner, plan.__globals__, plan.__name__, plan.__defaults__, closure)
    function.__kwdefaults__ = plan.__kwdefaults__
    return function
