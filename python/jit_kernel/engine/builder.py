"""Write one module's ``build.ninja`` and run ninja on it: the only place a JIT build meets a shell.

Not ``tvm_ffi.cpp.build_inline``: it writes flags and paths into the file unquoted, so a space or
a ``$`` in the cache, venv or source path broke every build. Here each argument is one shell word
with ``$`` doubled for ninja, and build statements name only files inside the build folder.

ninja runs in its own session and gets SIGTERM when the thread that started it dies (Linux's
parent-death signal), and signals each compiler's process group in turn (nvcc with its cicc,
ptxas and cc1plus): a killed Python process leaves no orphaned compiles behind.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from jit_kernel.engine import env, toolchain
from jit_kernel.engine.target import Arch, ArchTarget
from jit_kernel.engine.unit import TranslationUnit

logger = logging.getLogger("jit_kernel")


@dataclasses.dataclass(frozen=True)
class BuildRequest:
    """Everything that defines one module build: one unit per language; ``arch`` None for host code."""

    name: str
    units: tuple[TranslationUnit, ...]
    extra_ldflags: tuple[str, ...] = ()
    arch: str | None = None
    # Human-readable origin, e.g. "add_constant<5>"; recorded in meta.json, not part of the key.
    description: str = dataclasses.field(default="", compare=False)

    @property
    def has_cuda(self) -> bool:
        return any(unit.language == "cuda" for unit in self.units)


class BuildError(RuntimeError):
    """A compile or link failed. ``compiler_output`` holds ninja's whole output; the message is
    short where the first error is on the generated line of one of the unit's wrappers (it names
    the wrapper and the compiler's errors there), else the whole output."""

    def __init__(self, message: str, compiler_output: str) -> None:
        super().__init__(message)
        self.compiler_output = compiler_output


# An error line of nvcc (``cuda.cu(8): error: ...``) or of g++/clang (``main.cpp:8:12: error: ...``).
_ERROR_LINE = re.compile(
    r"^(?P<file>[^\s():]+)(?:\((?P<nvcc_line>\d+)\)|:(?P<gnu_line>\d+)(?::\d+)?):\s*(?:fatal |catastrophic )?"
    r"error:\s*(?P<message>.*)$",
    re.MULTILINE,
)
_SHOWN_WRAPPERS = 3

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _words(*args: str | Path) -> str:
    """Arguments as text for a ninja command: shell-quoted, with ninja's ``$`` escaped."""
    for arg in args:
        if "\n" in str(arg):
            raise ValueError(f"jit_kernel: cannot pass an argument with a newline to a compiler: {str(arg)!r}")
    return " ".join(shlex.quote(str(arg)) for arg in args).replace("$", "$$")


def _source_name(unit: TranslationUnit) -> str:
    """The file a unit is written to in the build folder."""
    return f"{'cuda' if unit.language == 'cuda' else 'main'}{unit.suffix}"


def wrapper_failure(request: BuildRequest, output: str) -> str | None:
    """A short account of a failed build whose first error is on a wrapper's generated line: each
    failing wrapper (up to a few) with the compiler's first error on its line, the cascade of
    template notes left out. None when the first error is elsewhere (in a source or header, whose
    own lines say it best)."""
    units = {_source_name(unit): unit for unit in request.units}
    first_error: dict[tuple[str, str], str] = {}
    for match in _ERROR_LINE.finditer(output):
        unit = units.get(Path(match["file"]).name)
        export = unit.export_at_line(int(match["nvcc_line"] or match["gnu_line"])) if unit else None
        if export is None and not first_error:
            return None
        if export is not None:
            first_error.setdefault(export, match["message"].strip())
    if not first_error:
        return None
    failing = list(first_error.items())
    lines = [f"{request.name}: {len(failing)} wrapper(s) do not compile:"]
    lines += [f"  {wrapper!r}: {message}" for wrapper, message in failing[:_SHOWN_WRAPPERS]]
    if len(failing) > _SHOWN_WRAPPERS:
        lines.append(f"  and {len(failing) - _SHOWN_WRAPPERS} more")
    lines.append("(the compiler's full output: JIT_KERNEL_LOG_LEVEL=DEBUG, or this error's compiler_output)")
    return "\n".join(lines)


def render(request: BuildRequest) -> dict[str, str]:
    """The files (name -> text) that build ``request``'s library: ``build.ninja`` and one source per
    unit. Each compile writes a depfile (``-MD -MF``): the cache records every file the compiler read."""
    import tvm_ffi.libinfo

    if not request.name.isidentifier():  # it names files in build statements, unescaped
        raise ValueError(f"jit_kernel: module name {request.name!r} is not an identifier")
    tvm_ffi_includes = [f"-I{tvm_ffi.libinfo.find_include_path()}", f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}"]
    ldflags: list[str | Path] = ["-shared", f"-L{Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent}", "-ltvm_ffi"]
    cxx = _words(toolchain.host_compiler())
    lines = ["ninja_required_version = 1.3"]
    files: dict[str, str] = {}
    objects: list[str] = []
    for unit in request.units:
        source = _source_name(unit)
        stem = source.split(".")[0]
        # Hidden by default, only the exports (TVM_FFI_DLL_EXPORT) visible: otherwise the static
        # locals of the headers' inline functions (the per-device caches of runtime.cuh) are
        # STB_GNU_UNIQUE symbols, one copy in the process for every module and the prebuilt library
        # that instantiate them, and a cache that guards a kernel attribute set on one module's copy
        # of a kernel would skip setting it on another's.
        compiler, target_args = cxx, ["-fPIC", "-fvisibility=hidden"]
        if unit.language == "cuda":
            assert request.arch is not None
            cuda_lib = toolchain.cuda_home() / "lib64"
            # The rpath lets the module load without LD_LIBRARY_PATH, also on a machine with no GPU.
            ldflags += [f"-L{cuda_lib}", "-lcudart", f"-Wl,-rpath,{cuda_lib}"]
            compiler = _words(toolchain.nvcc_path())
            target_args = ["-Xcompiler", "-fPIC,-fvisibility=hidden", ArchTarget(Arch.parse(request.arch)).gencode()]
            target_args += ["-ccbin", str(toolchain.host_compiler())] if env.cxx() else []  # one host compiler
        flags = _words(*target_args, *unit.compile_args(), *tvm_ffi_includes)
        lines += [f"rule compile_{stem}\n  command = {compiler} {flags} -MD -MF $out.d -c $in -o $out"]
        lines += [f"build {stem}.o: compile_{stem} {source}"]
        files[source] = unit.text()
        objects.append(f"{stem}.o")
    library = f"{request.name}.so"
    lines += [f"rule link\n  command = {cxx} $in {_words(*ldflags, *request.extra_ldflags)} -o $out"]
    lines += [f"build {library}: link {' '.join(objects)}", f"default {library}"]
    return {**files, "build.ninja": "\n".join(lines) + "\n"}


def build(request: BuildRequest, folder: Path) -> tuple[Path, list[Path]]:
    """Compile ``request`` in ``folder`` (an empty, private folder): the library, and every file the
    compilers read outside ``folder`` (from their depfiles)."""
    for name, text in render(request).items():
        (folder / name).write_text(text)
    try:
        run_ninja(folder)
    except BuildError as error:
        short = wrapper_failure(request, error.compiler_output)
        if short is None:
            raise
        logger.debug("ninja in %s:\n%s", folder, error.compiler_output)
        raise BuildError(short, error.compiler_output) from None
    read = {path for depfile in folder.glob("*.o.d") for path in depfile_inputs(depfile)}
    return folder / f"{request.name}.so", sorted(p for p in read if not p.is_relative_to(folder))


def depfile_inputs(depfile: Path) -> list[Path]:
    """The prerequisites a Make-style depfile lists, as absolute paths. g++ writes a ``$`` as ``$$``,
    nvcc as is: a name is taken as written unless only its unescaped form exists."""
    text = depfile.read_text().replace("\\\n", " ")
    _, _, prerequisites = text.partition(": ")
    paths = []
    for word in re.findall(r"(?:\\.|[^\s\\])+", prerequisites):
        written = (depfile.parent / re.sub(r"\\(.)", r"\1", word)).resolve()
        unescaped = Path(str(written).replace("$$", "$"))
        paths.append(unescaped if not written.exists() and unescaped.exists() else written)
    return paths


def _die_with_this_thread() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent SIGTERM when the thread starting it dies (Linux)."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the forked child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def run_ninja(folder: Path) -> None:
    """Run ninja in ``folder``; stop it (and so its compilers) if this thread is interrupted."""
    # The ninja wheel puts it next to the interpreter, which is on PATH only in an activated venv.
    ninja = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    if ninja is None:
        raise toolchain.ToolchainError("ninja not found: `pip install ninja` (JIT builds run through it)")
    command = [ninja, "-v"]
    jobs = env.max_jobs()
    if jobs is not None:
        command += ["-j", str(jobs)]
    process = subprocess.Popen(
        command,
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,  # a Ctrl-C to our process group reaches us alone; we stop ninja below
        preexec_fn=_die_with_this_thread(),  # calls C only (no import, no lock): safe in a threaded parent
    )
    try:
        output, _ = process.communicate()
    except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: stop the compilers too
        process.terminate()
        process.wait()
        raise
    if process.returncode != 0:
        raise BuildError(f"ninja exited with status {process.returncode}\n{output}", output)
    logger.debug("ninja in %s:\n%s", folder, output)
