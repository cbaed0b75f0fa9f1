"""``jit_kernel.engine.env``: the run-time switches follow ``os.environ``."""

from __future__ import annotations

import os

import pytest

from jit_kernel.engine import env


def test_check_indices_follows_every_write_through_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-lookup test of ``ENVIRON_DATA`` (CPython's own copy of the environment) must see each
    write through ``os.environ``, or toggling the switch at run time would be missed."""
    monkeypatch.delenv("JIT_KERNEL_CHECK_INDICES", raising=False)
    assert (env.CHECK_INDICES_KEY in env.ENVIRON_DATA) is ("JIT_KERNEL_CHECK_INDICES" in os.environ)
    assert env.check_indices() is False
    for value, expected in (("1", True), ("0", False), ("yes", True), ("", False)):
        monkeypatch.setenv("JIT_KERNEL_CHECK_INDICES", value)
        assert env.CHECK_INDICES_KEY in env.ENVIRON_DATA
        assert env.check_indices() is expected
    monkeypatch.delenv("JIT_KERNEL_CHECK_INDICES")
    if env.ENVIRON_DATA is getattr(os.environ, "_data", None):  # CPython: the one-lookup path is in use
        assert env.CHECK_INDICES_KEY not in env.ENVIRON_DATA
    assert env.check_indices() is False
