"""Write one module's ``build.ninja`` and run ninja on it: the only place a JIT build meets a shell.

We render the build file ourselves rather than call ``tvm_ffi.cpp.build_inline``, which joins
flags and include paths into the file unquoted and unescaped: a space or a ``$`` in the cache,
venv or source path broke every build. Here each argument is one shell word (``shlex.quote``) with
``$`` doubled for ninja, and build statements name only files inside the build folder, so any path
works. A flag given as one list item is one argument, as in ``subprocess``.

ninja runs in its own session and receives SIGTERM when the thread that started it dies (Linux's
parent-death signal), so a killed Python process leaves no orphaned compiles behind: ninja answers
SIGTERM by signalling each compiler's process group (nvcc with its cicc, ptxas and cc1plus).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from jit_kernel import env, toolchain
from jit_kernel.arch import Arch, ArchTarget

if TYPE_CHECKING:
    from jit_kernel.cache import BuildRequest

logger = logging.getLogger("jit_kernel")

# What tvm-ffi's build_inline put ahead of every source: the export macro and the types wrappers use.
_PRELUDE = "\n".join(
    f"#include <tvm/ffi/{header}>"
    for header in ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _words(*args: str | Path) -> str:
    """Arguments as one ninja variable value: shell-quoted, with ninja's ``$`` escaped."""
    for arg in args:
        if "\n" in str(arg):
            raise ValueError(f"jit_kernel: cannot pass an argument with a newline to a compiler: {str(arg)!r}")
    return " ".join(shlex.quote(str(arg)) for arg in args).replace("$", "$$")


def render(request: BuildRequest) -> tuple[str, dict[str, str]]:
    """The build file and the sources (file name -> text) that build ``request``'s library."""
    import tvm_ffi.libinfo

    for path in request.source_files:  # the sources are included by path: #include "<path>"
        if '"' in str(path) or "\n" in str(path):
            raise ValueError(f"jit_kernel: {str(path)!r} cannot be #included (a double quote or newline); rename it")

    roots = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path()]
    includes = [f"-I{folder}" for folder in dict.fromkeys(map(str, [*roots, *request.include_search_path]))]
    tvm_ffi_library = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    ldflags: list[str | Path] = ["-shared", f"-L{tvm_ffi_library.parent}", "-ltvm_ffi"]
    variables = {
        "cxx": _words(toolchain.host_compiler()),
        "cxxflags": _words("-fPIC", *request.extra_cflags, *includes),
    }
    rules = {"compile": "$cxx $cxxflags -c $in -o $out", "link": "$cxx $in $ldflags -o $out"}
    sources: dict[str, str] = {}
    objects: dict[str, tuple[str, str]] = {}  # object file -> (rule, source file)
    if request.cpp_source:
        sources["main.cpp"] = f"{_PRELUDE}\n{request.cpp_source}\n"
        objects["main.o"] = ("compile", "main.cpp")
    if request.has_cuda:
        assert request.arch is not None
        cuda_lib = toolchain.cuda_home() / "lib64"
        # The rpath lets the module load without LD_LIBRARY_PATH, also on a machine with no GPU.
        ldflags += [f"-L{cuda_lib}", "-lcudart", f"-Wl,-rpath,{cuda_lib}"]
        gencode = ArchTarget(Arch.parse(request.arch)).gencode()
        variables["nvcc"] = _words(toolchain.nvcc_path())
        variables["cuda_cflags"] = _words("-Xcompiler", "-fPIC", gencode, *request.extra_cuda_cflags, *includes)
        rules["compile_cuda"] = "$nvcc $cuda_cflags -c $in -o $out"
        sources["cuda.cu"] = f"{_PRELUDE}\n{request.cuda_source}\n"
        objects["cuda.o"] = ("compile_cuda", "cuda.cu")
    variables["ldflags"] = _words(*ldflags, *request.extra_ldflags)
    library = library_name(request)
    lines = ["ninja_required_version = 1.3", *(f"{name} = {value}" for name, value in variables.items())]
    lines += [f"rule {name}\n  command = {command}" for name, command in rules.items()]
    lines += [f"build {obj}: {rule} {source}" for obj, (rule, source) in objects.items()]
    lines += [f"build {library}: link {' '.join(objects)}", f"default {library}"]
    return "\n".join(lines) + "\n", sources


def library_name(request: BuildRequest) -> str:
    if not request.name.isidentifier():  # it names files in build statements, unescaped
        raise ValueError(f"jit_kernel: module name {request.name!r} is not an identifier")
    return f"{request.name}.so"


def build(request: BuildRequest, folder: Path) -> Path:
    """Compile ``request`` in ``folder`` (an empty, private folder) and return the library."""
    build_file, sources = render(request)
    for name, text in sources.items():
        (folder / name).write_text(text)
    (folder / "build.ninja").write_text(build_file)
    run_ninja(folder)
    return folder / library_name(request)


def _ninja() -> str:
    # The ninja wheel puts it next to the interpreter, which is on PATH only in an activated venv.
    found = shutil.which("ninja") or shutil.which("ninja", path=str(Path(sys.executable).parent))
    if found is None:
        raise toolchain.ToolchainError("ninja not found: `pip install ninja` (JIT builds run through it)")
    return found


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
    command = [_ninja(), "-v"]
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
        raise RuntimeError(f"ninja exited with status {process.returncode}\n{output}")
    logger.debug("ninja in %s:\n%s", folder, output)
