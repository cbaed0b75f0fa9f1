"""Launch sites: an op's kernel lookup made in C++ from the launch's own arguments.

A plan launches ``table[key](*args)`` with a key read from the arguments (``(input.dtype,
weight.numel())``). In Python those reads cost more than the rest of an eager call's Python; in C++
they are a few loads from the tensors tvm-ffi converts for the launch anyway. Where a plan's key is
made only of such reads of the launch's arguments (``_eager`` decides, from the plan's source), its
eager call launches through a site (``csrc/launch_site.h``)::

    if site__(out, input, weight, eps, enable_pdl).__class__ is int:       # not remembered
        missed__(_KERNELS, (input.dtype, weight.numel()), out, input, weight, eps, enable_pdl)

The site calls the kernel it remembers for the arguments' key; for any other key it launches
nothing and returns an int, and :meth:`LaunchSite.missed` takes the plan's own path (the table, the
Python key) and teaches the site the kernel the table returned. The table stays the one source of
kernels: a site holds only what its table gave it, and forgets it when the table changes
(:meth:`~jit_kernel.ops._common.KernelTable.forget_sites`).

Where the site library cannot be loaded without a compile (a source checkout without a build, a
damaged install) or GPUs of several archs share the process (the table then resolves per device),
every call takes the table's path, as it would without sites.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any

import tvm_ffi

from jit_kernel.engine import families, prebuilt, target
from jit_kernel.engine.dispatch import jit_request
from jit_kernel.engine.jit import load_cached
from jit_kernel.engine.spec import symbol_name

#: The attributes a site reads, by the numbers ``csrc/launch_site.h`` gives them.
DTYPE, NUMEL, SIZE = 0, 1, 2
#: The most reads a key may make (``kMaxKeyParts``).
MAX_KEY_PARTS = 4


@functools.cache
def _factory() -> Callable[..., Any] | None:
    """``launch_site.make`` from the prebuilt library or the JIT cache; None where neither holds it
    (a compile would stall an op's first call) or where the kernels resolve per device."""
    try:
        if not target.one_arch_for_all_devices():
            return None
        spec = families.LAUNCH_SITE
        symbol = symbol_name(spec, "make", ())
        if prebuilt.unusable_reason(spec, (), None) is None:
            return prebuilt.library().get_function(symbol)
        module = load_cached(jit_request(spec, ()))
        return None if module is None else module.get_function(symbol)
    except Exception:  # any failure leaves the table's path, which works without sites
        return None


def _missed_always(*args: Any) -> int:
    return -1


class LaunchSite:
    """One launch of one plan through a C++ site. ``rule``: the key's reads of the launch's
    arguments, as flat ``(argument index, attribute, dimension)`` triples. ``cell``: the closure cell
    the op's compiled body calls; it holds :meth:`first_call` until the site is made."""

    def __init__(self, rule: tuple[int, ...]) -> None:
        self.rule = rule
        self.cell = types.CellType(self.first_call)
        self._table: Any = None
        self._remember: Callable[..., Any] | None = None
        self._forget: Callable[[], Any] | None = None
        self._lock = threading.Lock()

    def first_call(self, *args: Any) -> Any:
        with self._lock:
            if self.cell.cell_contents == self.first_call:
                make = _factory()
                if make is None:
                    self.cell.cell_contents = _missed_always
                else:
                    call, self._remember, self._forget = make(list(self.rule))
                    self.cell.cell_contents = call
        return self.cell.cell_contents(*args)

    def missed(self, table: Any, key: Any, *args: Any) -> Any:
        """The plan's own launch, ``table[key](*args)``; the site learns the kernel where the table
        keeps it for every device."""
        kernel = table[key]
        sites = getattr(table, "sites", None)  # a KernelTable's; any other mapping is only read
        # Only tvm-ffi functions: a Python callable (a test's fake, recorded_launches' recorder)
        # called through a site would get tvm-ffi's tensors instead of the caller's.
        if (
            self._remember is not None
            and sites is not None
            and isinstance(kernel, tvm_ffi.Function)
            and dict.get(table, key) is kernel
        ):
            if table is not self._table:  # the plan's table names one object; learnt once
                self.forget()
                self._table = table
                sites.append(self)
            self._remember(kernel, *args)
        return kernel(*args)

    def forget(self) -> None:
        if self._forget is not None:
            self._forget()
