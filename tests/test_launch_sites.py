"""Launch sites (ops/_site.py, csrc/launch_site.h): an eager call whose key is made of reads of the
launch's arguments looks its kernel up in C++. On any machine: the host self-test kernel
(add_constant, out = src + constant) stands for a CUDA kernel."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
import torch

from jit_kernel.engine import families, prebuilt
from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.ops import _common, _eager, _site
from jit_kernel.ops._common import KernelTable, kernel_op


@pytest.fixture(autouse=True)
def _fresh_factory() -> None:
    """Each test asks for the site module again: a test elsewhere in the process may have faked a
    machine on which sites are off (GPUs of several archs)."""
    _site._factory.cache_clear()


def _factory() -> Callable[..., Any]:
    make = _site._factory()
    if make is None:
        if prebuilt.manifest() is not None:
            pytest.fail("the installed prebuilt library holds no usable launch_site")
        pytest.skip("no build of the launch_site module (a source checkout without a build)")
    return make


class _CountingTable(KernelTable):
    """The host add_constant kernels keyed by ``(dtype, numel)``: constant = numel. ``lookups``
    counts the Python lookups, which a call served by its site never makes."""

    def __init__(self) -> None:
        super().__init__(Dispatcher(families.ADD_CONSTANT_HOST), "run", lambda dtype, n: (n,))
        self.lookups = 0

    def __getitem__(self, key: Any) -> Callable[..., Any]:
        self.lookups += 1
        return super().__getitem__(key)


_TABLE = _CountingTable()


def _plan(src: torch.Tensor, out: torch.Tensor | None = None) -> Any:
    if out is None:
        out = torch.empty_like(src)
    return _TABLE, (src.dtype, src.numel()), (out, src), out


def _op(sites: bool, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    monkeypatch.setenv("JIT_KERNEL_DISABLE_LAUNCH_SITES", "0" if sites else "1")
    return kernel_op("launch_site_test", out="out", register=False)(_plan)


def _src(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32)


def test_a_site_serves_each_key_after_one_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    _factory()
    op = _op(True, monkeypatch)
    assert any(name.startswith("site_") for name in op.__code__.co_freevars)
    _TABLE.clear()
    _TABLE.lookups = 0
    for _ in range(3):
        for n in (1, 2, 3):
            src = _src(n)
            out = torch.full_like(src, -7)  # poisoned: an unwritten element fails
            assert op(src, out=out) is out
            assert torch.equal(out, src + n)
    assert _TABLE.lookups == 3  # one per key: every later call was served in C++


def test_a_changed_table_is_seen_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _factory()
    op = _op(True, monkeypatch)
    src = _src(2)
    op(src)
    calls: list[tuple[object, ...]] = []
    _TABLE[(torch.int32, 2)] = lambda *args: calls.append(args)  # replaced: the site forgets
    out = torch.full_like(src, -7)
    op(src, out=out)
    assert len(calls) == 1 and calls[0][0] is out and torch.equal(out, torch.full_like(src, -7))
    _TABLE.clear()  # emptied: the next call loads the kernel again
    lookups = _TABLE.lookups
    assert torch.equal(op(src), src + 2)
    assert _TABLE.lookups == lookups + 1


def test_recorded_launches_sees_calls_served_by_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    _factory()
    op = _op(True, monkeypatch)
    src, out = _src(3), torch.empty(3, dtype=torch.int32)
    op(src, out=out)
    [(_, args)], result = _common.recorded_launches(lambda: op(src, out=out))
    assert result is out and args[0] is out and args[1] is src
    assert torch.equal(op(src), src + 3)  # after recording, the site serves the real kernel again


@pytest.mark.parametrize(
    "call",
    [
        lambda op: op([1, 2, 3]),
        lambda op: op(object()),
        lambda op: op(_src(2), out=torch.empty(2, dtype=torch.float32)),
        lambda op: op(_src(2), out="out"),
        lambda op: op(torch.zeros((), dtype=torch.float32)),
    ],
)
def test_bad_calls_raise_the_same_error_with_and_without_sites(
    monkeypatch: pytest.MonkeyPatch, call: Callable[[Callable[..., Any]], object]
) -> None:
    _factory()
    errors = []
    for sites in (False, True, True):  # with sites: cold, then after a good call of the key
        op = _op(sites, monkeypatch)
        if len(errors) == 2:
            op(_src(2))
        with pytest.raises(Exception) as info:
            call(op)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1] == errors[2]


def test_the_cpp_site_reads_each_attribute_and_misses_on_anything_else() -> None:
    call, remember, forget = _factory()([0, 0, 0, 1, 1, 0, 1, 2, -1])  # dtype of 0, numel and size(-1) of 1
    seen: list[int] = []
    x, w = torch.zeros(2, 8), torch.zeros(4, 5, dtype=torch.bfloat16)
    assert call(x, w) == -1  # nothing remembered: a miss launches nothing
    remember(lambda *args: seen.append(len(args)), x, w)
    assert call(x, w) is None and seen == [2]
    assert call(torch.zeros(3, 8), torch.zeros(4, 5)) is None and seen == [2, 2]  # the same key
    for other in [(x.half(), w), (x, torch.zeros(5, 4)), (x, torch.zeros(20)), (x, [1]), (x,)]:
        assert call(*other) == -1, other
    forget()
    assert call(x, w) == -1
    remember(lambda *args: 3, x, w)
    with pytest.raises(RuntimeError, match="returns None or a bool"):
        call(x, w)
    for rule in ([], [0, 0], [0, 3, 0], [-1, 0, 0], [0, 0, 0] * 5):
        with pytest.raises(Exception, match="launch_site: rule"):
            _factory()(rule)


def _sites_of(source: str) -> list[tuple[int, ...]]:
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    sites: list[_site.LaunchSite] = []
    launches = _eager._Launches(None, body, sites)
    for statement in body:
        launches.visit(statement)
    return [s.rule for s in sites]


@pytest.mark.parametrize(
    ("source", "rules"),
    [
        ("def f(x, w, out):\n return T, (x.dtype, w.numel()), (out, x, w), out", [(1, 0, 0, 2, 1, 0)]),
        ("def f(x, out):\n return T, (x.shape[-1], 4, x.size(0)), (out, x), out", [(1, 2, -1, 1, 2, 0)]),
        ("def f(x, out):\n args = (out, x)\n return T[False], x.dtype, args, out", [(1, 0, 0)]),
        # The arguments' tuple is bound again (or one of its names) before the launch: no site.
        ("def f(x, out):\n args = (out, x)\n args = g(args)\n return T, x.dtype, args, out", []),
        ("def f(x, out):\n args = (out, x)\n out = x\n return T, x.dtype, args, out", []),
        (
            "def f(x, out):\n args = (out, x)\n if x:\n  return T, x.dtype, args, out\n return T, 1, args, out",
            [(1, 0, 0)],
        ),
        # A table the plan picks, a key read from another name or computed, a constant key: no site.
        ("def f(x, out):\n t = T[0]\n return t, x.dtype, (out, x), out", []),
        ("def f(x, y, out):\n return T, y.dtype, (out, x), out", []),
        ("def f(x, out):\n n = x.numel()\n return T, (x.dtype, n), (out, x), out", []),
        ("def f(x, out):\n return T, (), (out, x), out", []),
        ("def f(x, out):\n return T, x.shape[n], (out, x), out", []),
    ],
)
def test_which_launches_go_through_a_site(source: str, rules: list[tuple[int, ...]]) -> None:
    assert _sites_of(source) == rules
