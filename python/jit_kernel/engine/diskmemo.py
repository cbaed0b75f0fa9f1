"""Small JSON memos in the cache folder: answers a fresh process would otherwise recompute (a
compiler's reply, the hash of a unit's sources), each valid while the files it came from keep their
identity (:func:`stamp`). Best effort both ways: a damaged memo reads as empty, and a memo that
cannot be written (a read-only cache folder) only costs the next process the same work again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jit_kernel.engine import env


def stamp(path: Path | str) -> str:
    """A file's or folder's identity, ``size:mtime_ns:inode`` (``"missing"`` if it does not exist):
    an edit, a replacement or (for a folder) an added entry changes it."""
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def load(name: str) -> dict[str, Any]:
    """The memo ``name`` in the cache folder; empty if missing, unreadable or not a JSON object."""
    try:
        memo = json.loads((env.cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def save(name: str, memo: dict[str, Any], max_entries: int | None = None) -> None:
    """Write the memo ``name`` atomically (a reader sees the old file or the new one), first dropping
    its oldest entries beyond ``max_entries``."""
    while max_entries is not None and len(memo) > max_entries:
        memo.pop(next(iter(memo)))
    path = env.cache_dir() / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        staging.write_text(json.dumps(memo))
        os.replace(staging, path)
    except OSError:
        pass
