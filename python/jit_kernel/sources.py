"""Which files a build reads: the closure of a source's ``#include`` lines over known folders.

Torch-free and dependency-free, because CMake runs it at configure time (for the prebuilt
manifest's source hashes) as well as the JIT cache at run time (for its keys).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

_INCLUDE_LINE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)


def included_files(roots: Sequence[Path], search_path: Sequence[Path]) -> dict[Path, bytes]:
    """Every file reachable from ``roots`` through ``#include``, with its content.

    Quoted includes are looked up next to the including file first. Headers found in none of
    the folders (the standard library, CUDA, tvm-ffi) are keyed by the compiler and tvm-ffi
    versions instead. Includes inside ``#if`` blocks are followed too: that can only add files.
    """
    found: dict[Path, bytes] = {}
    pending = [root.resolve() for root in roots]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        text = path.read_bytes()
        found[path] = text
        for quote, name in _INCLUDE_LINE.findall(text):
            relative = name.decode()
            candidates = [path.parent, *search_path] if quote == b'"' else list(search_path)
            for folder in candidates:
                candidate = folder / relative
                if candidate.is_file():
                    pending.append(candidate.resolve())
                    break
    return found


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks (``hashlib.file_digest`` needs Python 3.11)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
