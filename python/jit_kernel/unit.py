"""One translation unit: everything needed to compile one configuration, as one value.

JIT (``builder``) and the prebuilt build (``aot`` -> the generated ``sources.cmake``) both render
the same :class:`TranslationUnit`: the same text, the same flags, the same include folders. Only
what belongs to the target (the gencode, ``-fPIC``, ``-ccbin``, tvm-ffi's own include folders)
is added by each build system. The prebuilt manifest records each entry's :meth:`digest`, and the
dispatcher uses a prebuilt symbol only when it equals the digest of the unit JIT would compile now.

Torch-free: CMake runs this at configure time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from jit_kernel import env
from jit_kernel.sources import included_files
from jit_kernel.spec import EXPORT_HEADER, Config, KernelSpec, export_line, symbol_name

DEFAULT_CFLAGS = ("-std=c++20", "-O3")
DEFAULT_CUDA_CFLAGS = ("-std=c++20", "-O3", "--expt-relaxed-constexpr")

# What tvm-ffi's build_inline put ahead of every source: the export macro and the types wrappers use.
PRELUDE = tuple(
    f"#include <tvm/ffi/{header}>"
    for header in ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
)

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
        extra_include_dirs: Iterable[Path] = (),
    ) -> TranslationUnit:
        exports = tuple(exports)
        for symbol, _ in exports:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", symbol):
                raise ValueError(f"load_jit: export name {symbol!r} is not a C identifier")
        # Wrappers export through host::ffi_export: its header goes first.
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

    @property
    def suffix(self) -> str:
        return ".cu" if self.language == "cuda" else ".cpp"

    def text(self) -> str:
        lines = [*PRELUDE, *(f'#include "{path}"' for path in self.sources)]
        lines += [export_line(symbol, expression) for symbol, expression in self.exports]
        return "\n".join(lines) + "\n"

    def compile_args(self) -> tuple[str, ...]:
        """The unit's own compiler arguments: flags, then ``-I`` per include folder."""
        return (*self.flags, *(f"-I{folder}" for folder in self.include_dirs))

    def digest(self) -> str:
        """Hash of the unit, wherever the package is installed: text, flags, include folders and the
        content of every file the sources reach through ``#include`` (by path under the package)."""
        description = json.dumps([self.language, self.text(), self.compile_args()])
        return _digest(_relocatable(description), _closure_digest(self.sources, self.include_dirs))


def _relocatable(text: str) -> str:
    return text.replace(str(env.DATA_ROOT), "<jit_kernel>")


@functools.cache
def _closure_digest(sources: tuple[Path, ...], include_dirs: tuple[Path, ...]) -> str:
    """Memoised per process: every config of a family shares its sources."""
    files = included_files(sources, include_dirs)
    hashes = (f"{_relocatable(str(path))}\0{hashlib.sha256(text).hexdigest()}" for path, text in sorted(files.items()))
    return _digest(*hashes)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]
