"""``python -m jit_kernel <command>``: clangd, doctor, cache."""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from jit_kernel import cache, env, toolchain
from jit_kernel.version import __version__

DEFAULT_CLANGD_ARCH = "8.0"


def _clangd_arch(requested: str | None) -> str:
    if requested:
        toolchain.parse_arch(requested)
        return requested
    try:
        return toolchain.current_cuda_arch()
    except toolchain.ToolchainError:
        return DEFAULT_CLANGD_ARCH


def clangd_config(arch: str) -> str:
    import tvm_ffi.libinfo

    flags = [
        "-xcuda",
        f"--cuda-gpu-arch={toolchain.sm_name(arch)}",
        "-std=c++20",
        "-Wall",
        "-Wextra",
    ]
    include_roots = [tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path(), env.INCLUDE_DIR]
    flags += [f"-isystem{root}" for root in dict.fromkeys(str(r) for r in include_roots)]
    with contextlib.suppress(toolchain.ToolchainError):  # clangd then looks in its default places
        flags.append(f"--cuda-path={toolchain.cuda_home()}")
    lines = ["CompileFlags:", "  Add:"] + [f"    - {flag}" for flag in flags]
    return "\n".join(lines) + "\n"


def cmd_clangd(args: argparse.Namespace) -> int:
    target = Path(args.output)
    if target.exists() and not args.overwrite:
        print(f"{target} already exists; pass --overwrite to replace it", file=sys.stderr)
        return 1
    arch = _clangd_arch(args.cuda_arch)
    target.write_text(clangd_config(arch))
    print(f"wrote {target} for {toolchain.sm_name(arch)}; restart clangd to pick it up")
    return 0


def _format_size(num_bytes: int) -> str:
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def _probe(describe: Callable[[], str]) -> str:
    try:
        return describe()
    except Exception as error:
        return f"unavailable ({error})"


def _gpu_description() -> tuple[str, bool]:
    import torch

    if not torch.cuda.is_available():
        return "none visible (CUDA kernels can be compiled but not run)", False
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    arch = toolchain.arch_for_capability(major, minor)
    return f"{name} (cuda:{index}, compute capability {major}.{minor}, builds for {toolchain.sm_name(arch)})", True


def _self_test_host() -> str:
    import torch

    from jit_kernel.jit import load_jit, make_cpp_args

    args = make_cpp_args(7)
    module = load_jit(
        "doctor_host", *args, cpp_files=["add_constant.h"],
        cpp_wrappers=[("run", f"jit_kernel::add_constant::run_host<{args}>")],
    )  # fmt: skip
    src = torch.arange(1000, dtype=torch.int32)
    out = torch.full_like(src, -1)
    module.run(out, src)
    if not torch.equal(out, src + 7):
        raise RuntimeError("host self-test module computed a wrong result")
    return "host module compiled, loaded and ran correctly"


def _self_test_cuda(gpu: bool) -> str:
    import torch

    from jit_kernel.jit import make_build_request, make_cpp_args

    args = make_cpp_args(7)
    build = {
        "cuda_files": ["add_constant.cuh"],
        "cuda_wrappers": [("run", f"jit_kernel::add_constant::run_cuda<{args}>")],
    }
    if not gpu:
        arch = env.cuda_arch_override() or "9.0a"
        request = make_build_request("doctor_cuda", *args, cuda_arch=arch, **build)  # type: ignore[arg-type]
        cache.load_or_build(request)
        return f"CUDA module compiled and loaded for {toolchain.sm_name(arch)} (not run: no GPU)"
    from jit_kernel.jit import load_jit

    module = load_jit("doctor_cuda", *args, **build)  # type: ignore[arg-type]
    src = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    out = torch.full_like(src, -1)
    module.run(out, src)
    torch.cuda.synchronize()
    if not torch.equal(out, src + 7):
        raise RuntimeError("CUDA self-test kernel computed a wrong result")
    return "CUDA module compiled, loaded and ran correctly on the GPU"


def cmd_doctor(args: argparse.Namespace) -> int:
    import torch
    import tvm_ffi

    problems: list[str] = []
    print(f"jit-kernel     {__version__} ({env.PACKAGE_DIR})")
    print(f"python         {platform.python_version()}")
    print(f"torch          {torch.__version__} (CUDA {torch.version.cuda})")
    print(f"apache-tvm-ffi {tvm_ffi.__version__}")
    print(f"host compiler  {_probe(lambda: f'{toolchain.tool_version(toolchain.host_compiler())}')}")
    nvcc = _probe(lambda: f"{toolchain.tool_version(toolchain.nvcc_path())} ({toolchain.nvcc_path()})")
    print(f"nvcc           {nvcc}")
    gpu_text, gpu = _gpu_description()
    print(f"GPU            {gpu_text}")
    print(f"headers        {env.INCLUDE_DIR}")
    root = env.cache_dir()
    print(f"cache          {root} ({len(cache.list_entries(root))} modules, {_format_size(cache.total_size(root))})")

    checks: list[tuple[str, Callable[[], str]]] = [("host JIT self-test", _self_test_host)]
    if nvcc.startswith("unavailable"):
        if gpu:
            problems.append("a GPU is visible but nvcc is missing, so kernels cannot be JIT-compiled")
    else:
        checks.append(("CUDA JIT self-test", lambda: _self_test_cuda(gpu)))
    for label, check in checks:
        start = time.perf_counter()
        try:
            outcome = check()
            print(f"[ok]   {label}: {outcome} ({time.perf_counter() - start:.2f} s)")
        except Exception as error:
            problems.append(f"{label} failed: {error}")
            print(f"[FAIL] {label}", file=sys.stderr)
            if args.verbose:
                traceback.print_exc()
    if problems:
        print("\nunhealthy:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print("\nhealthy")
    return 0


def cmd_cache_list(args: argparse.Namespace) -> int:
    root = env.cache_dir()
    entries = cache.list_entries(root)
    print(f"{root}: {len(entries)} modules, {_format_size(cache.total_size(root))}")
    for entry in entries:
        arch = toolchain.sm_name(entry.arch) if entry.arch else "host"
        state = "ok" if entry.valid else "CORRUPT (rebuilt on next use)"
        print(f"  {entry.name:<48} {arch:<8} {_format_size(entry.size_bytes):>10}  {state}  {entry.path.name}")
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    root = env.cache_dir()
    removed = cache.clear(root)
    print(f"removed {removed} modules from {root}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jit_kernel", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    clangd = commands.add_parser("clangd", help="write a .clangd file for editing kernels")
    clangd.add_argument("--cuda-arch", help="arch to configure, e.g. 9.0a (default: this GPU's, else 8.0)")
    clangd.add_argument("--output", default=".clangd", help="where to write (default: ./.clangd)")
    clangd.add_argument("--overwrite", action="store_true", help="replace an existing file")
    clangd.set_defaults(handler=cmd_clangd)

    doctor = commands.add_parser("doctor", help="check the setup and run a self-test")
    doctor.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    doctor.set_defaults(handler=cmd_doctor)

    cache_cmd = commands.add_parser("cache", help="inspect or clear the JIT cache")
    cache_actions = cache_cmd.add_subparsers(dest="action", required=True)
    cache_actions.add_parser("list", help="list cached modules").set_defaults(handler=cmd_cache_list)
    cache_actions.add_parser("clear", help="delete cached modules").set_defaults(handler=cmd_cache_clear)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))
