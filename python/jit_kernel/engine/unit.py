"""One translation unit: everything needed to compile one configuration, as one value.

JIT (``builder``) and the prebuilt build (``aot`` -> the generated ``sources.cmake``) both render
the same :class:`TranslationUnit`; each adds only what belongs to the target (the gencode,
``-fPIC``, ``-ccbin``, tvm-ffi's include folders). The prebuilt manifest records each unit's
:meth:`~TranslationUnit.digest`, and the dispatcher uses a prebuilt symbol only when it equals the
digest of the unit JIT would compile now. Torch-free: CMake runs this at configure time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeGuard

from jit_kernel.engine import diskmemo, env
from jit_kernel.engine.spec import Config, KernelSpec, symbol_name

DEFAULT_CFLAGS = ("-std=c++20", "-O3")
DEFAULT_CUDA_CFLAGS = ("-std=c++20", "-O3", "--expt-relaxed-constexpr")

# What tvm-ffi's build_inline put ahead of every source: the export macro and the types wrappers use.
_PRELUDE_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
PRELUDE = tuple(f"#include <tvm/ffi/{header}>" for header in _PRELUDE_HEADERS)
# Every generated export goes through host::ffi_export, which raises a PanicError as the Python
# exception its kind names (ValueError, TypeError); a unit with exports includes this header first.
EXPORT_HEADER = "sgl_kernel/export.h"

Language = Literal["cuda", "host"]

# The prebuilt library (CMake's OUTPUT_NAME comes from here, through the generated sources.cmake).
LIBRARY_OUTPUT_NAME = "jit_kernel_prebuilt"
LIBRARY_NAME = f"lib{LIBRARY_OUTPUT_NAME}.so"
MANIFEST_NAME = "prebuilt_manifest.json"


@dataclasses.dataclass(frozen=True)
class TranslationUnit:
    """Sources (included by absolute path), exports ``(symbol, C++ expression)``, flags and include
    folders of one compile. ``exports`` empty: the sources export their own functions."""

    language: Language
    sources: tuple[Path, ...]
    exports: tuple[tuple[str, str], ...]
    flags: tuple[str, ...]
    include_dirs: tuple[Path, ...]

    @classmethod
    def make(
        cls,
        language: Language,
        sources: Iterable[Path],
        exports: Iterable[tuple[str, str]] = (),
        extra_flags: Sequence[str] = (),
        extra_include_dirs: Iterable[str | Path] = (),
    ) -> TranslationUnit:
        exports = check_wrappers(exports)
        first = (env.INCLUDE_DIR / EXPORT_HEADER,) if exports else ()
        sources = (*first, *(Path(s).resolve() for s in sources))
        for path in sources:
            if '"' in str(path) or "\n" in str(path):
                raise ValueError(f"jit_kernel: {str(path)!r} cannot be #included (a double quote or newline)")
        defaults = DEFAULT_CUDA_CFLAGS if language == "cuda" else DEFAULT_CFLAGS
        includes = (*(Path(p).resolve() for p in extra_include_dirs), env.INCLUDE_DIR, env.CSRC_DIR)
        return cls(language, sources, exports, (*defaults, *extra_flags), tuple(dict.fromkeys(includes)))

    @classmethod
    def for_config(cls, spec: KernelSpec, config: Config) -> TranslationUnit:
        """The unit of one config of a family: every export of the spec, under its symbol name."""
        exports = [(symbol_name(spec, e, config), spec.wrapper(e, config)) for e in spec.exports]
        sources = [env.CSRC_DIR / source for source in spec.sources]
        return cls.make(spec.target, sources, exports, spec.extra_cuda_cflags if spec.target == "cuda" else ())

    @classmethod
    def combine(cls, units: Sequence[TranslationUnit]) -> TranslationUnit:
        """One unit that compiles every export of ``units``, which must share their language, sources,
        flags and include folders (as the configs of one family do). The prebuilt build compiles one
        such unit per family: nvcc's fixed cost per unit (parsing tvm-ffi's and our headers, host code)
        is then paid once per family instead of once per config."""
        if not units:
            raise ValueError("jit_kernel: no translation unit to combine")
        first = units[0]
        for unit in units[1:]:
            if (unit.language, unit.sources, unit.flags, unit.include_dirs) != (
                first.language,
                first.sources,
                first.flags,
                first.include_dirs,
            ):
                raise ValueError("jit_kernel: only units with the same sources, flags and include folders combine")
        return dataclasses.replace(first, exports=tuple(export for unit in units for export in unit.exports))

    @classmethod
    def merge(cls, units: Sequence[TranslationUnit]) -> TranslationUnit:
        """One unit holding several families' units: every source of each (in order, once) and every
        export. They must share their language, flags and include folders. The prebuilt build merges
        families when it has fewer parallel jobs than families (:func:`jit_kernel.engine.aot.unit_groups`)."""
        if not units:
            raise ValueError("jit_kernel: no translation unit to merge")
        first = units[0]
        for unit in units[1:]:
            if (unit.language, unit.flags, unit.include_dirs) != (first.language, first.flags, first.include_dirs):
                raise ValueError("jit_kernel: only units with the same flags and include folders merge")
        sources = tuple(dict.fromkeys(source for unit in units for source in unit.sources))
        exports = tuple(export for unit in units for export in unit.exports)
        return dataclasses.replace(first, sources=sources, exports=exports)

    @property
    def suffix(self) -> str:
        return ".cu" if self.language == "cuda" else ".cpp"

    def export_at_line(self, line: int) -> tuple[str, str] | None:
        """The export whose lines of :meth:`text` hold ``line`` (1-based), or None for any other line."""
        first = len(PRELUDE) + len(self.sources) + 1
        for export in self.exports:
            last = first + export[1].count("\n")
            if first <= line <= last:
                return export
            first = last + 1
        return None

    def text(self) -> str:
        exports = (f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({s}, (::host::ffi_export({e})));" for s, e in self.exports)
        return "\n".join([*PRELUDE, *(f'#include "{path}"' for path in self.sources), *exports]) + "\n"

    def compile_args(self) -> tuple[str, ...]:
        """The unit's own compiler arguments: flags, then ``-I`` per include folder."""
        return (*self.flags, *(f"-I{folder}" for folder in self.include_dirs))

    def digest(self) -> str:
        """Hash of the unit's text, flags, include folders and included files, wherever it is installed."""
        description = json.dumps([self.language, self.text(), self.compile_args()])
        return relocatable_hash(description, _closure_digest(self.sources, self.include_dirs))


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CLOSING = {")": "(", "]": "[", "}": "{", ">": "<"}


def _shape_error(expression: str) -> str | None:
    """Why ``expression`` cannot be a wrapper's C++ expression (a function, a static member of a
    template instance, a lambda), or None. Only what is certain without a compiler: brackets that
    close in order, and no ``;`` outside a lambda's braces; a ``<`` or ``>`` inside parentheses or
    braces is taken as a comparison, ``->`` as an arrow."""
    if not expression.strip():
        return "it is empty"
    stack: list[str] = []
    for char in expression.replace("->", "  "):
        comparing = "(" in stack or "{" in stack
        if char in "([{" or (char == "<" and not comparing):
            stack.append(char)
        elif char in ")]}" or (char == ">" and not comparing):
            if not stack or stack[-1] != _CLOSING[char]:
                return f"an unmatched {char!r}"
            stack.pop()
        elif char == ";" and "{" not in stack:
            return "a ';' outside braces (a statement, not an expression)"
    return f"an unclosed {stack[-1]!r}" if stack else None


def check_wrappers(wrappers: Iterable[object]) -> tuple[tuple[str, str], ...]:
    """The wrappers as ``((export_name, expression), ...)``, checked before any compiler runs: each
    a pair of strings, the name a C identifier given once, the expression of a plausible shape
    (:func:`_shape_error`). What only the compiler knows (that the name exists) it reports after."""
    if isinstance(wrappers, tuple) and len(wrappers) == 2 and all(isinstance(w, str) for w in wrappers):
        raise ValueError(
            f"load_jit: wrappers are a list of (export_name, C++ expression) pairs; got one pair {wrappers!r}: "
            f"pass [{wrappers!r}]"
        )
    checked: list[tuple[str, str]] = []
    for wrapper in wrappers:
        if not (isinstance(wrapper, (tuple, list)) and len(wrapper) == 2 and all(isinstance(w, str) for w in wrapper)):
            raise ValueError(
                f"load_jit: a wrapper is an (export_name, C++ expression) pair of strings, got {wrapper!r}"
            )
        symbol, expression = wrapper
        if not _IDENTIFIER.fullmatch(symbol):
            raise ValueError(f"load_jit: export name {symbol!r} is not a C identifier")
        if any(symbol == seen for seen, _ in checked):
            raise ValueError(f"load_jit: export name {symbol!r} is given twice")
        why = _shape_error(expression)
        if why is not None:
            raise ValueError(
                f"load_jit: wrapper {(symbol, expression)!r}: {why}; the expression names a function, "
                "e.g. 'my_ns::add<128, bf16_t>' or 'my_ns::Kernel<4096>::run' (parenthesise a template "
                "argument that compares with < or >)"
            )
        checked.append((symbol, expression))
    return tuple(checked)


def relocatable_hash(*parts: str) -> str:
    """A short hash of ``parts`` that is the same wherever the package is installed (the unit digest,
    the JIT cache key): the package's folder is hashed as a placeholder."""
    joined = "\0".join(parts).replace(str(env.DATA_ROOT), "<jit_kernel>")
    return hashlib.sha256(joined.encode()).hexdigest()[:24]


_INCLUDE_LINE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"]+)[>"]', re.MULTILINE)


@functools.cache
def _closure_digest(sources: tuple[Path, ...], include_dirs: tuple[Path, ...]) -> str:
    """Hash of every file the sources reach through ``#include`` lines (those in ``#if`` blocks too)
    in our folders; the others (the standard library, CUDA, tvm-ffi) are left to the versions the
    manifest records. Memoised per process (every config of a family shares its sources) and on
    disk (the closure memo below)."""
    key = json.dumps([[str(p) for p in sources], [str(d) for d in include_dirs]])
    memo = _closure_memo()
    entry = memo.get(key)
    if _valid_entry(entry) and entry["stamps"] == _stamps(entry["paths"]):
        return entry["digest"]
    digest, paths, stamps = _walk_closure(sources, include_dirs)
    memo.pop(key, None)
    memo[key] = {"digest": digest, "paths": paths, "stamps": stamps}
    diskmemo.save(_CLOSURE_MEMO_NAME, memo, _CLOSURE_MEMO_ENTRIES)
    return digest


def _walk_closure(sources: tuple[Path, ...], include_dirs: tuple[Path, ...]) -> tuple[str, list[str], list[str]]:
    """(digest, paths, stamps): the closure's hash, every file read and every folder an include was
    looked up in, and their identities, taken before reading (a file edited meanwhile then fails
    the next check)."""
    found: dict[Path, bytes] = {}
    stamped: dict[str, str] = {}

    def stamp(path: Path) -> None:
        if str(path) not in stamped:
            stamped[str(path)] = diskmemo.stamp(path)

    pending = [path.resolve() for path in sources]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        stamp(path)
        found[path] = path.read_bytes()
        for quote, name in _INCLUDE_LINE.findall(found[path]):
            folders = [path.parent, *include_dirs] if quote == b'"' else include_dirs
            candidates = [folder / name.decode() for folder in folders]
            for candidate in candidates:
                stamp(candidate.parent)  # a header added there later could take this include
            header = next((c for c in candidates if c.is_file()), None)
            pending += [header.resolve()] if header else []
    digest = relocatable_hash(*(f"{path}\0{hashlib.sha256(text).hexdigest()}" for path, text in sorted(found.items())))
    paths = sorted(stamped)
    return digest, paths, [stamped[p] for p in paths]


# The on-disk memo of closure digests: a fresh process whose sources are unchanged reads one small
# file and stats each file of the closure instead of reading, scanning and hashing them all. An entry
# holds for as long as every file it read and every folder it searched keeps its identity (size,
# mtime, inode; a folder's mtime changes when a file is added to it, which could shadow a header).
_CLOSURE_MEMO_NAME = "closure-digests.json"
_CLOSURE_MEMO_ENTRIES = 256  # the least recently computed go first (user kernels in passing folders)


def _valid_entry(entry: object) -> TypeGuard[dict[str, Any]]:
    """An entry as _closure_digest writes them (a damaged memo only costs a walk)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
        return False
    paths, stamps = entry.get("paths"), entry.get("stamps")
    return (
        isinstance(paths, list)
        and isinstance(stamps, list)
        and len(paths) == len(stamps) > 0
        and all(isinstance(p, str) for p in paths)
    )


def _stamps(paths: Iterable[str]) -> list[str]:
    return [diskmemo.stamp(path) for path in paths]


@functools.cache
def _closure_memo() -> dict[str, Any]:
    return diskmemo.load(_CLOSURE_MEMO_NAME)
