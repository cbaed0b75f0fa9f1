"""Shared test setup: a private JIT cache per session, and GPU tests skipped without a GPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Tests run against the installed package; a bare source checkout works too.
if importlib.util.find_spec("jit_kernel") is None:
    sys.path.insert(0, str(REPO_ROOT / "python"))


_session_cache: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    # A fresh cache per session, unless the developer points the tests at one to reuse builds.
    global _session_cache
    if "JIT_KERNEL_CACHE_DIR" not in os.environ:
        _session_cache = tempfile.mkdtemp(prefix="jit-kernel-test-cache-")
        os.environ["JIT_KERNEL_CACHE_DIR"] = _session_cache


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_cache is not None:
        shutil.rmtree(_session_cache, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif "multigpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason="needs at least 2 CUDA GPUs"))
