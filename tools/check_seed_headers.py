#!/usr/bin/env python3
"""Compile every kernel entry file of an sglang release against OUR include/sgl_kernel/.

    python tools/check_seed_headers.py --sglang DIR [--jobs N] [--only SUBSTR] [--sgl-cuda-arch]

DIR is an sglang checkout (DIR/python/sglang/...) or an unpacked wheel (DIR/sglang/...); the kernel
package is sglang/jit_kernel (up to 0.5.16) or sglang/kernels/jit (0.5.23 on). Nothing of it is
copied into this repository: the script reads the release where it lies and builds in a temp folder.

What is compiled. An *entry file* is a .cu/.cuh that a Python wrapper passes to ``load_jit``. For
each one the script builds the translation unit that the release's ``load_jit`` would generate: the
file included by absolute path, then one ``TVM_FFI_DLL_EXPORT_TYPED_FUNC`` per wrapper, so the
kernel templates are instantiated. The instantiations are the release's own: a child process
imports the release's Python wrappers (with stubs for what a CPU-only machine lacks), replaces
``load_jit`` by a recorder and calls each ``@cache_once`` module builder with representative
arguments (see ``ARG_CANDIDATES`` / ``OVERRIDES``). The first call that reaches ``load_jit`` is the
representative instantiation of its entry file. An entry file that no builder reached is compiled
without exports (marked ``file-only`` in the table).

Flags: nvcc -std=c++20 -O3 --expt-relaxed-constexpr for sm_90a (``--arch``), plus the wrapper's own
extra_cuda_cflags; include path: our include/ first, then tvm-ffi's. Upstream's load_jit also
passes -DSGL_CUDA_ARCH; ours does not, so by default neither does this check (the headers derive
the arch themselves); ``--sgl-cuda-arch`` adds it.

Family headers. Upstream's include/sgl_kernel/ also holds kernel-family code (deepseek_v4/,
distributed/, scalar_type.hpp, ...): it travels with the kernels that use it, like csrc/. Those
files are made visible from a temp overlay searched *after* ours; the seed's header library (the
files in ``CORE``) always comes from ours. The table names the family headers each entry used.

Results: ``pass``; ``FAIL`` (with the first error); ``third-party`` when the entry needs a header
from outside sglang and CUDA (CUTLASS, FlashInfer, ...) that no ``--third-party`` folder holds.
``--arch 10.0a`` drives the wrappers that refuse an older GPU (NVFP4, MXFP8).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUR_INCLUDE = REPO / "include"

# The seed's header library: upstream's copies of these are never used, ours must serve.
CORE = {
    "atomic.cuh",
    "cta.cuh",
    "ffi.h",
    "impl/norm.cuh",
    "math.cuh",
    "runtime.cuh",
    "source_location.h",
    "tensor.h",
    "tile.cuh",
    "type.cuh",
    "utils.cuh",
    "utils.h",
    "vec.cuh",
    "warp.cuh",
}

# Includes from outside sglang, tvm-ffi and the CUDA toolkit.
THIRD_PARTY = re.compile(
    r"^((cutlass|cute|flashinfer|flash|deep_gemm|kerutils|mscclpp|nvshmem|hip|tensorrt_llm)/|cublasdx|commondx)"
)

FFI_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
BASE_FLAGS = ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC"]
# The GPU the release's wrappers are told they run on (--arch): "9.0a" (H100) by default; "10.0a"
# (B200) drives the wrappers that refuse anything older, such as the NVFP4 / MXFP8 kernels.
ARCH_ENV = "CHECK_SEED_HEADERS_ARCH"


def find_nvcc() -> str:
    for candidate in (
        Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc",
        Path("/usr/local/cuda/bin/nvcc"),
    ):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("nvcc")
    if not found:
        sys.exit("nvcc not found (set CUDA_HOME)")
    return found


def tvm_ffi_includes() -> list[str]:
    import tvm_ffi.libinfo as libinfo

    return sorted({libinfo.find_include_path(), libinfo.find_dlpack_include_path()})


def locate(sglang: Path) -> tuple[Path, Path]:
    """(directory holding the `sglang` package, the kernel package with include/ and csrc/)."""
    for pkg_root in (sglang / "python", sglang):
        for kernel in ("sglang/jit_kernel", "sglang/kernels/jit"):
            root = pkg_root / kernel
            if (root / "include" / "sgl_kernel").is_dir() and (root / "csrc").is_dir():
                return pkg_root, root
    sys.exit(f"{sglang}: no sglang/jit_kernel or sglang/kernels/jit with include/ and csrc/")


# ---- discovery: which entry files, with which instantiations (runs the release's Python) ---------

# Values tried for a builder parameter, by (a substring of) its name, then by its annotation. The
# first value is tried first; on an exception each parameter in turn walks its list.
ARG_CANDIDATES: list[tuple[str, list]] = [
    ("index_dtype", ["i32", "i64"]),
    ("idx_dtype", ["i32", "i64"]),
    ("indices_dtype", ["i32", "i64"]),
    ("ids_dtype", ["i32", "i64"]),
    ("dtype", ["bf16", "fp16", "fp32"]),
    ("head_dim", [128, 64, 256]),
    ("hidden", [4096, 2048, 1024, 128]),
    ("rope_dim", [64, 128]),
    ("num_experts", [256, 128, 64]),
    ("topk", [8, 2, 1024]),
    ("group", [128, 64, 8]),
    ("block", [128, 256, 64]),
    ("world", [8, 2]),
    ("ratio", [4, 128]),
    ("rank", [0]),
    ("size", [128, 256, 64, 4096]),
    ("dim", [128, 64, 256]),
    ("num", [8, 1, 4, 128]),
    ("bits", [4, 8]),
    ("name", ["silu", "gelu", "gelu_tanh"]),
    ("mode", [0, 1]),
]
BY_ANNOTATION: list[tuple[str, list]] = [
    ("dtype", ["bf16", "fp16", "fp32"]),
    ("bool", [False, True]),
    ("int", [128, 64, 256, 8, 1, 4096, 32, 16, 512, 1024]),
    ("float", [1.0]),
    ("str", ["silu", "default"]),
]
# Builder-specific arguments (by function name) where the generic guesses pick a config the kernel
# rejects at compile time without the Python side saying so.
OVERRIDES: dict[str, dict] = {
    "_jit_rmsnorm_head_module": {"head_dim": 512},  # DeepSeek V4 q heads; a multiple of 256
    "_jit_clamp_position_module": {"dtype": "i64"},  # positions
    "_jit_resolve_future_token_ids_module": {"dtype": "i64"},  # token ids
    "_jit_moe_align_module": {"dtype": "i32"},  # topk ids (moe_align and moe_lora_align)
    "_jit_fused_parallel_qknorm_module": {"q_dim": 4096, "k_dim": 1024},  # whole warps per rank
    "get_fused_parallel_qknorm_module": {"q_dim": 4096, "k_dim": 1024},  # (its 0.5.16 name)
    "_jit_online_c128_mtp_module": {"head_dim": 512},  # the only size it supports
    "_jit_dsv3_fused_a_gemm_module": {"hd_in": 7168, "hd_out": 2112},  # DeepSeek V3's q_a/kv_a shapes
    "per_token_group_quant_8bit_v2.py:_jit_module": {"out_dtype": "fp8"},  # int8 or fp8 out
    "minimax_qknorm_rope.py:_jit_module": {"pos_dtype": "i64", "head_dim": 128, "rope_dim": 64},  # its only call
    "_prep_module": {"nc": 16, "num_red_log": 8, "num_gpus": 8},  # nc == num_red_log + num_gpus
    "_jit_hicache_module": {"element_size": 256, "unroll": 4, "block_quota": 2},  # unroll divides 32
    "_jit_spec_module": {
        "num_steps": 2,
        "num_top_k": 2048,
        "hot_buffer_size": 4096,
    },  # HiSparse swap: 2-4 steps, top_k >= 1024
}


def _discover_child(pkg_root: str, kernel_root: str) -> None:
    """Child process: import the release's wrappers with a recording load_jit; print JSON."""
    import ast
    import contextlib
    import importlib
    import importlib.abc
    import importlib.machinery
    import inspect
    import itertools
    import types
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, pkg_root)
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "i32": torch.int32}
    dtypes.update(i64=torch.int64, i8=torch.int8, fp8=torch.float8_e4m3fn)

    class StubMeta(type):
        """Anything a wrapper imports that this machine lacks. Each name is a fresh class, so it also
        works as a base class and in isinstance(); calling it returns another stub, or the function
        itself when used as a bare decorator."""

        def __getattr__(cls, item):
            if item.startswith("__") and item.endswith("__"):
                raise AttributeError(item)
            return stub(item)

        def __call__(cls, *args, **kwargs):
            if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
                return args[0]
            return stub(cls.__name__ + "()")

        def __getitem__(cls, item):
            return cls

        def __iter__(cls):
            return iter(())

        def __bool__(cls):
            return False

        def __or__(cls, other):
            return cls

        __ror__ = __or__

    def stub(name: str) -> type:
        return StubMeta(name, (), {"__init_subclass__": classmethod(lambda c, **k: None)})

    class StubModule(types.ModuleType):
        def __getattr__(self, item):
            if item.startswith("__") and item.endswith("__"):
                raise AttributeError(item)
            return stub(item)

    release = str(Path(pkg_root).resolve() / "sglang")

    class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """Stubs a module nothing else can import, when the release's own code asks for it (other
        libraries probe optional modules and must see them missing)."""

        def find_spec(self, fullname, path, target=None):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            caller = frame.f_code.co_filename if frame is not None else ""
            parent = sys.modules.get(fullname.rpartition(".")[0])
            stubbed_parent = parent is not None and type(parent).__name__ == "StubModule"
            if not (fullname.split(".")[0] == "sglang" or caller.startswith(release) or stubbed_parent):
                return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

        def create_module(self, spec):
            module = StubModule(spec.name)
            module.__path__ = []
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.append(StubFinder())  # last: only what nothing else can import

    calls: list[dict] = []

    class Recorded(Exception):
        pass

    def recorder(*args, **kwargs):
        calls.append(
            {
                "cuda_files": [str(f) for f in kwargs.get("cuda_files") or []],
                "cuda_wrappers": [list(map(str, w)) for w in kwargs.get("cuda_wrappers") or []],
                "extra_cuda_cflags": [str(f) for f in kwargs.get("extra_cuda_cflags") or []],
                "extra_include_paths": [str(f) for f in kwargs.get("extra_include_paths") or []],
                "extra_dependencies": [str(f) for f in kwargs.get("extra_dependencies") or []],
                "header_only": bool(kwargs.get("header_only", True)),
            }
        )
        raise Recorded

    patches = {
        "load_jit": recorder,
        "is_arch_support_pdl": lambda *a, **k: True,
        "is_hip_runtime": lambda *a, **k: False,
        "is_musa_runtime": lambda *a, **k: False,
    }
    major, minor = (int(part) for part in os.environ.get(ARCH_ENV, "9.0a").rstrip("af").split("."))
    torch.cuda.get_device_capability = lambda *a, **k: (major, minor)
    torch.cuda.current_device = lambda *a, **k: 0
    torch.cuda.is_available = lambda *a, **k: True
    torch.cuda.device_count = lambda *a, **k: 1
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H100 80GB HBM3"
    h100 = types.SimpleNamespace(
        major=major, minor=minor, name="NVIDIA H100 80GB HBM3", multi_processor_count=132, total_memory=80 << 30,
        gcnArchName="", warp_size=32, max_threads_per_multi_processor=2048, shared_memory_per_block_optin=232448,
    )  # fmt: skip
    torch.cuda.get_device_properties = lambda *a, **k: h100

    def patch_all():
        for name, module in list(sys.modules.items()):
            if not name.startswith("sglang") or isinstance(module, StubModule):
                continue
            for attr, value in patches.items():
                if attr in getattr(module, "__dict__", {}):
                    setattr(module, attr, value)

    package = Path(kernel_root).relative_to(pkg_root).as_posix().replace("/", ".")
    for utils_name in (f"{package}.utils", f"{package}.utils.compile", f"{package}.utils.arch"):
        with contextlib.suppress(Exception):
            importlib.import_module(utils_name)
    patch_all()

    def candidates(param: inspect.Parameter) -> list:
        values = []
        if param.default is not inspect.Parameter.empty:
            values.append(param.default)
        annotation = str(param.annotation)
        name = param.name.lower()
        for key, options in ARG_CANDIDATES:
            if key in name and ("dtype" in key) == ("dtype" in annotation or "dtype" in name):
                values += options
                break
        for key, options in BY_ANNOTATION:
            if key in annotation.lower():
                values += options
                break
        if not values:
            values = [128, "bf16", True, None]
        seen, unique = set(), []
        for value in values:
            value = dtypes.get(value, value) if isinstance(value, str) and "dtype" in (annotation + name) else value
            key = repr(value)
            if key not in seen:
                seen.add(key)
                unique.append(value)
        return unique

    def drive(fn, qualname: str) -> dict | None:
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        options = [candidates(p) for p in params]
        override = next((v for k, v in OVERRIDES.items() if qualname.endswith(("/" + k, ":" + k))), {})
        for i, p in enumerate(params):
            if p.name in override:
                value = override[p.name]
                options[i] = [dtypes.get(value, value) if isinstance(value, str) else value]
        # First all defaults, then each parameter through its list, then pairs (bounded).
        trials = [[o[0] for o in options]]
        for i, o in enumerate(options):
            for value in o[1:]:
                trial = [x[0] for x in options]
                trial[i] = value
                trials.append(trial)
        trials += [list(t) for t in itertools.islice(itertools.product(*options), 200)]
        error = ""
        for trial in trials[:400]:
            before = len(calls)
            positional = [v for p, v in zip(params, trial, strict=True) if p.kind != p.KEYWORD_ONLY]
            keywords = {p.name: v for p, v in zip(params, trial, strict=True) if p.kind == p.KEYWORD_ONLY}
            try:
                fn(*positional, **keywords)
            except Recorded:
                pass
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:200]
            if len(calls) > before:
                call = calls[-1]
                call["builder"] = qualname
                call["args"] = [repr(t) for t in trial]
                return call
        return {"builder": qualname, "error": error or "no load_jit call"}

    results: list[dict] = []
    static: list[dict] = []
    root = Path(pkg_root) / "sglang"
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(pkg_root).as_posix()
        if "/tests/" in rel or "/test/" in rel or "/benchmark/" in rel:
            continue
        text = path.read_text(errors="replace")
        if "load_jit(" not in text or "def load_jit" in text:
            continue
        # Static view: string literals naming .cu/.cuh files in load_jit calls (fallback).
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        builders = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_jit":
                for kw in node.keywords:
                    if kw.arg == "cuda_files":
                        for s in ast.walk(kw.value):
                            if isinstance(s, ast.Constant) and isinstance(s.value, str):
                                static.append({"wrapper": rel, "file": s.value})
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "load_jit(" in ast.unparse(node):
                builders.append(node.name)
        module_name = rel[:-3].replace("/", ".")
        try:
            module = importlib.import_module(module_name)
        except BaseException as exc:  # a wrapper that does not import here: static view only
            results.append({"builder": f"{rel}:*", "error": f"import: {type(exc).__name__}: {exc}"[:200]})
            continue
        patch_all()
        for name in builders:
            fn = getattr(module, name, None)
            if fn is None:
                continue
            record = drive(fn, f"{rel}:{name}")
            if record is not None:
                results.append(record)
    print(json.dumps({"calls": results, "static": static}))


def discover(pkg_root: Path, kernel_root: Path, arch: str) -> dict:
    process = subprocess.run(
        [sys.executable, __file__, "--_discover", str(pkg_root), str(kernel_root)],
        env={**os.environ, ARCH_ENV: arch},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    lines = [line for line in process.stdout.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        sys.exit(f"discovery failed:\n{process.stderr[-4000:]}")
    return json.loads(lines[-1])


# ---- compile ----------------------------------------------------------------------------------


@dataclass
class Entry:
    path: str  # relative to csrc/
    wrappers: list[list[str]] = field(default_factory=list)
    builder: str = ""
    files: list[str] = field(default_factory=list)  # every cuda file of the call, in order
    cflags: list[str] = field(default_factory=list)
    include_paths: list[str] = field(default_factory=list)
    dependencies: list[str] = field(default_factory=list)
    instantiated: bool = False
    status: str = ""
    detail: str = ""
    borrowed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def resolve(kernel_root: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() else kernel_root / "csrc" / name


def relname(kernel_root: Path, path: Path) -> str:
    try:
        return path.resolve().relative_to((kernel_root / "csrc").resolve()).as_posix()
    except ValueError:
        return str(path)


def collect(kernel_root: Path, found: dict) -> list[Entry]:
    entries: dict[str, Entry] = {}
    for call in found["calls"]:
        if "cuda_files" not in call or not call["cuda_files"]:
            continue
        files = [resolve(kernel_root, f) for f in call["cuda_files"]]
        for path in files:
            if not path.name.endswith((".cu", ".cuh")):
                continue
            key = relname(kernel_root, path)
            if key in entries:
                continue
            entries[key] = Entry(
                path=key,
                wrappers=call["cuda_wrappers"] if call["header_only"] else [],
                builder=call["builder"],
                files=[str(f) for f in files],
                cflags=call["extra_cuda_cflags"],
                include_paths=call["extra_include_paths"],
                dependencies=call["extra_dependencies"],
                instantiated=bool(call["cuda_wrappers"]) or not call["header_only"],
            )
    refusals = {}  # wrapper file -> why the release itself will not build it for sm_90a
    for call in found["calls"]:
        if re.search(r"compute capability >= 1\d|sm_?1\d\d|blackwell", call.get("error", ""), re.IGNORECASE):
            refusals[call["builder"].split(":")[0]] = call["error"]
    for item in found["static"]:
        name = item["file"]
        if not name.endswith((".cu", ".cuh")) or "{" in name:
            continue
        path = resolve(kernel_root, name)
        key = relname(kernel_root, path)
        if key not in entries and path.is_file():
            entry = Entry(path=key, builder=item["wrapper"] + " (static)", files=[str(path)])
            if item["wrapper"] in refusals:
                entry.status, entry.detail = "not-sm90", refusals[item["wrapper"]]
            entries[key] = entry
    return sorted(entries.values(), key=lambda e: e.path)


def make_overlay(kernel_root: Path, workdir: Path) -> Path:
    """Upstream's family headers (everything under include/sgl_kernel but CORE), searched after ours."""
    overlay = workdir / "family-include"
    upstream = kernel_root / "include" / "sgl_kernel"
    for path in upstream.rglob("*"):
        rel = path.relative_to(upstream).as_posix()
        if path.is_file() and rel not in CORE:
            target = overlay / "sgl_kernel" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return overlay


def compile_entry(entry: Entry, args, kernel_root: Path, overlay: Path, workdir: Path, nvcc: str) -> None:
    stem = re.sub(r"[^A-Za-z0-9_]", "_", entry.path)
    source = workdir / f"{stem}.cu"
    # What tvm-ffi's load_inline puts first, then the files, then the exports: inside
    # `namespace sglang` where the release's loader puts them there (0.5.23 on).
    text = "".join(f"#include <tvm/ffi/{h}>\n" for h in FFI_HEADERS)
    text += "".join(f'#include "{f}"\n' for f in entry.files)
    exports = "".join(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({n}, ({e}));\n" for n, e in entry.wrappers)
    text += f"namespace sglang {{\n{exports}}}  // namespace sglang\n" if args.sglang_namespace else exports
    source.write_text(text)
    includes = ["-I", str(args.include), "-I", str(overlay)]  # ours first: the overlay lacks CORE anyway
    for directory in entry.include_paths:
        if Path(directory).is_dir():
            includes += ["-I", directory]
    for directory in [*tvm_ffi_includes(), *map(str, args.third_party)]:
        includes += ["-isystem", directory]
    cflags = [f for f in entry.cflags if not f.startswith(("-gencode", "-arch", "--generate-code"))]
    defines = ["-DSGL_CUDA_ARCH=900"] if args.sgl_cuda_arch else []
    depfile = source.with_suffix(".d")
    # --frontend: PTX only (no ptxas) and no host compile: every name, type and instantiation error
    # still shows (cudafe++ and cicc run), in a fraction of the time for the big kernels.
    digits = args.arch.replace(".", "")
    arch = [f"-gencode=arch=compute_{digits},code={'compute' if args.frontend else 'sm'}_{digits}"]
    command = [nvcc, *BASE_FLAGS, *arch, *defines, *includes, *cflags, "-MD", "-MF", str(depfile)]
    if args.frontend:  # parse and instantiate (both sides), no code generation
        command += ["-x", "cu", "-cuda", str(source), "-o", str(source.with_suffix(".ii"))]
    else:
        command += ["-x", "cu", "-c", str(source), "-o", str(source.with_suffix(".o"))]
    start = time.perf_counter()
    try:
        process = subprocess.run(
            command, capture_output=True, text=True, cwd=workdir, check=False, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        entry.seconds = time.perf_counter() - start
        entry.status, entry.detail = "timeout", f"not finished in {args.timeout} s"
        return
    entry.seconds = time.perf_counter() - start
    output = process.stdout + process.stderr
    (workdir / f"{stem}.log").write_text(" ".join(command) + "\n" + output)
    if depfile.exists():
        deps = depfile.read_text()
        entry.borrowed = sorted(set(re.findall(re.escape(str(overlay)) + r"/sgl_kernel/(\S+)", deps)))
    if process.returncode == 0:
        entry.status = "pass"
        return
    missing = re.findall(r"fatal error: (\S+?): No such file", output) or re.findall(
        r'cannot open source file "([^"]+)"', output
    )
    if missing and THIRD_PARTY.match(missing[0]):
        entry.status = "third-party"
        entry.detail = f"needs {missing[0]}"
        return
    entry.status = "FAIL"
    errors = [line.strip() for line in output.splitlines() if "error" in line]
    entry.detail = errors[0][:300] if errors else output.strip()[-300:]


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--_discover":
        _discover_child(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang", type=Path, required=True, help="sglang checkout or unpacked wheel")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", action="append", default=[], help="entry paths containing this (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="skip entry paths containing this")
    parser.add_argument("--timeout", type=float, help="seconds per compile (slower ones are reported as timeout)")
    parser.add_argument("--sgl-cuda-arch", action="store_true", help="pass -DSGL_CUDA_ARCH=900 as upstream does")
    parser.add_argument(
        "--frontend",
        action="store_true",
        help="nvcc -cuda to PTX: every name, type and instantiation error, but no ptxas and no host compile",
    )
    parser.add_argument("--include", type=Path, default=OUR_INCLUDE, help="the include dir to test (default: ours)")
    parser.add_argument("--keep", type=Path, help="build here and keep the logs (default: a temp dir)")
    parser.add_argument("--list", action="store_true", help="only print the entries and instantiations")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--arch", default="9.0a", help="the GPU the wrappers see and nvcc targets (default 9.0a)")
    parser.add_argument(
        "--third-party",
        type=Path,
        action="append",
        default=[],
        help="a third-party include folder to search last, e.g. FlashInfer's data/cutlass/include (repeatable)",
    )
    args = parser.parse_args()

    pkg_root, kernel_root = locate(args.sglang.resolve())
    # The release's headers live in `namespace sglang` exactly when its loader wraps the exports in it.
    utils_h = (kernel_root / "include" / "sgl_kernel" / "utils.h").read_text()
    args.sglang_namespace = "namespace sglang" in utils_h
    found = discover(pkg_root, kernel_root, args.arch)
    entries = collect(kernel_root, found)
    if args.only:
        entries = [e for e in entries if any(s in e.path for s in args.only)]
    entries = [e for e in entries if not any(s in e.path for s in args.exclude)]
    if args.list:
        for e in entries:
            print(f"{e.path}: {e.builder}: {e.wrappers}")
        for call in found["calls"]:
            if "error" in call:
                print(f"  not driven: {call['builder']}: {call['error']}")
        return 0

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="check-seed-headers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    overlay = make_overlay(kernel_root, workdir)
    nvcc = find_nvcc()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        todo = [e for e in entries if not e.status]
        list(pool.map(lambda e: compile_entry(e, args, kernel_root, overlay, workdir, nvcc), todo))

    width = max((len(e.path) for e in entries), default=10)
    print(f"{'entry file':<{width}}  {'result':<11}  inst  family headers / first error")
    for e in entries:
        inst = "yes" if e.instantiated else "file"
        extra = e.detail if e.status != "pass" else ", ".join(e.borrowed)
        print(f"{e.path:<{width}}  {e.status:<11}  {inst:<4}  {extra}")
    counts = {s: sum(e.status == s for e in entries) for s in ("pass", "FAIL", "third-party", "not-sm90", "timeout")}
    print(
        f"\n{kernel_root}: {counts['pass']}/{len(entries)} entry files pass, {counts['FAIL']} fail, "
        f"{counts['third-party']} need third-party headers, {counts['not-sm90']} are not built for {args.arch} "
        f"by the release itself, {counts['timeout']} timed out (logs: {workdir})"
    )
    if args.json:
        args.json.write_text(json.dumps([e.__dict__ for e in entries], indent=1))
    if not args.keep and counts["FAIL"] == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
