"""``python -m jit_kernel <command>``: doctor, list, warm, clangd, cache.

With no command it writes ``./.clangd``, as the seed's ``python -m sglang.jit_kernel`` does.
A mistake in the arguments (an unknown family, a bad config) exits with status 2 and one line,
like argparse's own errors; an environment problem (no GPU to take the arch from, an unusable
cache folder) exits with status 1 and one line.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import platform
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from jit_kernel.engine import cache, env, families, prebuilt, target, toolchain
from jit_kernel.engine.dispatch import jit_module
from jit_kernel.engine.spec import Config, ConfigValue, KernelSpec, symbol_name
from jit_kernel.engine.target import Arch
from jit_kernel.engine.unit import TranslationUnit
from jit_kernel.version import __version__

DEFAULT_CLANGD_ARCH = "8.0"


class UsageError(Exception):
    """A mistake in the command's arguments: reported like argparse's errors (exit status 2)."""


def _family(name: str) -> KernelSpec:
    try:
        return families.family(name)
    except KeyError as error:
        raise UsageError(error.args[0]) from None


def _clangd_arch(requested: str | None) -> str:
    if requested:
        try:
            return str(Arch.parse(requested))
        except ValueError as error:
            raise UsageError(f"--cuda-arch: {error}") from None
    try:
        return str(target.current().arch)
    except toolchain.ToolchainError:
        return DEFAULT_CLANGD_ARCH


def clangd_config(arch: str) -> str:
    import tvm_ffi.libinfo

    flags = [
        "-xcuda",
        f"--cuda-gpu-arch={Arch.parse(arch).sm}",
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
    print(f"wrote {target} for {Arch.parse(arch).sm}; restart clangd to pick it up")
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


def _target() -> target.Target | None:
    """This machine's target, or None when there is no GPU and no JIT_KERNEL_CUDA_ARCH."""
    try:
        return target.current()
    except toolchain.ToolchainError:
        return None


def _gpu_description() -> tuple[str, bool]:
    here = _target()
    if here is None:
        return "none visible (CUDA kernels can be compiled but not run)", False
    return here.describe(), here.device is not None


def _check_add_constant(device: str, constant: int) -> str:
    """Run add_constant through the public op and the dispatcher; return the dispatcher's decision."""
    import torch

    from jit_kernel.ops import add_constant as op

    src = torch.arange(-500, 1 << 16, dtype=torch.int32, device=device)
    out = op.add_constant(src, constant)
    if device == "cuda":
        torch.cuda.synchronize()
    if not torch.equal(out, src + constant):
        raise RuntimeError(f"add_constant<{constant}> on {device} computed a wrong result")
    dispatcher = op._CUDA if device == "cuda" else op._HOST
    return dispatcher.decisions[(constant,)]


def _self_test_host() -> str:
    prebuilt_decision = _check_add_constant("cpu", 1)
    jit_decision = _check_add_constant("cpu", 7)
    return f"add_constant<1>: {prebuilt_decision}; add_constant<7>: {jit_decision}; results correct"


def _self_test_cuda(gpu: bool) -> str:
    if gpu:
        prebuilt_decision = _check_add_constant("cuda", 1)
        jit_decision = _check_add_constant("cuda", 7)
        return f"add_constant<1>: {prebuilt_decision}; add_constant<7>: {jit_decision}; results correct on the GPU"
    here = _target()
    arch = str(here.arch) if here else "9.0a"
    jit_module(families.ADD_CONSTANT_CUDA, (7,), cuda_arch=arch)
    return f"add_constant<7> compiled and loaded for {Arch.parse(arch).sm} (not run: no GPU)"


def _prebuilt_description() -> str:
    manifest = prebuilt.manifest()
    if manifest is None:
        return "none installed (every config is JIT-compiled on first use)"
    cuda = [s for s in manifest.symbols.values() if s.target == "cuda"]
    archs = sorted({a.sm for s in cuda for a in s.machine_code} | {f"{a.compute}(PTX)" for s in cuda for a in s.ptx})
    families_built = sorted({s.family for s in manifest.symbols.values()})
    return (
        f"{len(manifest.symbols)} symbols of {len(families_built)} families ({', '.join(families_built)}); "
        f"CUDA {manifest.cuda_version or 'none (host-only build)'}; archs {' '.join(archs) or '-'}; "
        f"tvm-ffi {manifest.tvm_ffi_version}; `python -m jit_kernel list` for details"
    )


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
    print(f"GPU / target   {gpu_text}")
    print(f"headers        {env.INCLUDE_DIR}")
    root = env.cache_dir()
    damaged = prebuilt.problem()
    if damaged is not None:
        problems.append(f"{damaged}; to repair: {prebuilt.REPAIR_ADVICE} (until then every kernel is JIT-compiled)")
        print(f"prebuilt       DAMAGED: {damaged}")
    else:
        print(f"prebuilt       {_probe(_prebuilt_description)}")
    print(f"cache          {root} ({len(cache.list_entries(root))} modules, {_format_size(cache.total_size(root))})")
    print(f"decisions      {_probe(_decision_summary)}")

    checks: list[tuple[str, Callable[[], str]]] = [("host self-test", _self_test_host)]
    if nvcc.startswith("unavailable"):
        if gpu:
            problems.append("a GPU is visible but nvcc is missing, so kernels cannot be JIT-compiled")
    else:
        checks.append(("CUDA self-test", lambda: _self_test_cuda(gpu)))
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
        arch = Arch.parse(entry.arch).sm if entry.arch else "host"
        state = entry.state if entry.valid else f"{entry.state}, rebuilt on next use"
        print(f"  {entry.name:<48} {arch:<8} {_format_size(entry.size_bytes):>10}  {state}  {entry.path.name}")
    return 0


def cmd_cache_clear(args: argparse.Namespace) -> int:
    root = env.cache_dir()
    removed = cache.clear(root)
    print(f"removed {removed} modules from {root}")
    return 0


def _decision(spec: KernelSpec, config: Config, here: target.Target | None) -> str:
    if spec.target == "cuda" and here is None:
        return "no GPU visible and no JIT_KERNEL_CUDA_ARCH"
    reason = prebuilt.unusable_reason(spec, config, here if spec.target == "cuda" else None)
    return "prebuilt" if reason is None else f"jit ({reason})"


def _decision_summary() -> str:
    """How every config of every prebuilt grid is served on this target, grouped by reason."""
    here = _target()
    decisions = Counter(_decision(spec, config, here) for spec in families.ALL_FAMILIES for config in spec.prebuilt)
    grouped = "; ".join(f"{count} {decision}" for decision, count in decisions.most_common())
    return f"{sum(decisions.values())} grid configs: {grouped} (`python -m jit_kernel list --explain` per config)"


def _explain(spec: KernelSpec, config: Config, manifest: prebuilt.Manifest | None) -> list[str]:
    """The unit that compiles this config (flags, include folders, digest), and the manifest's digest."""
    unit = TranslationUnit.for_config(spec, config)
    entry = manifest.symbols.get(symbol_name(spec, next(iter(spec.exports)), config)) if manifest else None
    recorded = entry.unit_digest if entry else "-"
    return [
        f"      sources  {' '.join(str(p) for p in unit.sources)}",
        f"      exports  {' '.join(symbol for symbol, _ in unit.exports)}",
        f"      flags    {' '.join(unit.flags)}",
        f"      includes {' '.join(str(p) for p in unit.include_dirs)}",
        f"      digest   now {unit.digest()}, prebuilt {recorded}",
    ]


def cmd_list(args: argparse.Namespace) -> int:
    for name in args.family:
        _family(name)
    if args.config and len(args.family) != 1:
        raise UsageError("--config needs exactly one family")
    here = _target()
    manifest = prebuilt.manifest()
    running = f"target {here.describe()}" if here else "no GPU, no JIT_KERNEL_CUDA_ARCH"
    if manifest is None and prebuilt.problem() is not None:
        print(f"prebuilt library: DAMAGED, {prebuilt.problem()}; {running}")
    elif manifest is None:
        print(f"prebuilt library: none installed (every config is JIT-compiled); {running}")
    else:
        print(f"prebuilt library: {manifest.library} (CUDA {manifest.cuda_version}, tvm-ffi "
              f"{manifest.tvm_ffi_version}, {len(manifest.symbols)} symbols); {running}")  # fmt: skip
    cached = cache.list_entries()
    for spec in families.ALL_FAMILIES:
        if args.family and spec.family not in args.family:
            continue
        print(f"\n{spec.family} ({spec.target}; {', '.join(spec.sources)}; params {', '.join(spec.params)})")
        configs = [_parse_config(spec, text) for text in args.config] or spec.prebuilt
        for config in configs:
            symbol = symbol_name(spec, next(iter(spec.exports)), config)
            entry = manifest.symbols.get(symbol) if manifest else None
            if entry is None:
                built = "not in this build"
            elif spec.target == "host":
                built = "host"
            else:
                built = " ".join([a.sm for a in entry.machine_code] + [f"{a.compute}(PTX)" for a in entry.ptx])
            label = "config  " if args.config else "prebuilt"
            print(f"  {label}  {spec.describe(config):<40} {built:<36} -> {_decision(spec, config, here)}")
            if args.explain:
                print("\n".join(_explain(spec, config, manifest)))
        for entry in cached:
            if entry.description.startswith(f"{spec.family}<"):
                arch = Arch.parse(entry.arch).sm if entry.arch else "host"
                print(f"  jit-cache {entry.description:<40} {arch:<36} {entry.state}")
    return 0


def _parse_config(spec: KernelSpec, text: str) -> Config:
    """``4096,bf16_t`` (in parameter order) or ``hidden=4096,dtype=bf16_t``."""

    def value(item: str) -> ConfigValue:
        item = item.strip()
        if item in ("true", "false"):
            return item == "true"
        try:
            return int(item)
        except ValueError:
            return item

    items = [item for item in text.split(",") if item.strip()]
    try:
        if items and all("=" in item for item in items):
            pairs = (item.split("=", 1) for item in items)
            config = spec.config_from_mapping({k.strip(): value(v) for k, v in pairs})
        else:
            config = tuple(value(item) for item in items)
        spec.check_config(config)
    except ValueError as error:
        raise UsageError(f"--config {text!r}: {error}") from None
    return config


def _warm_one(family_name: str, config: Config, arch: str | None) -> str:
    spec = families.family(family_name)
    start = time.perf_counter()
    jit_module(spec, config, cuda_arch=arch)
    target = Arch.parse(arch).sm if arch else "host"
    return f"{spec.describe(config)} for {target} ({time.perf_counter() - start:.1f} s)"


def cmd_warm(args: argparse.Namespace) -> int:
    spec = _family(args.family)
    configs = [_parse_config(spec, text) for text in args.config] or list(spec.prebuilt)
    if spec.target == "host":
        archs: list[str | None] = [None]
    else:
        try:
            archs = [str(Arch.parse(a)) for a in args.arch]
        except ValueError as error:
            raise UsageError(f"--arch: {error}") from None
        archs = archs or [str(target.current().arch)]
    jobs = [(spec.family, config, arch) for config in configs for arch in archs]
    print(f"warming {len(jobs)} {spec.family} module(s) into {env.cache_dir()} with {args.jobs} worker(s)")
    failures = 0
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(_warm_one, *job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            try:
                print(f"  ready  {future.result()}")
            except Exception as error:
                failures += 1
                _, config, arch = futures[future]
                print(f"  FAILED {spec.describe(config)} for {arch or 'host'}: {error}", file=sys.stderr)
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jit_kernel", description=__doc__)
    parser.set_defaults(handler=cmd_clangd, cuda_arch=None, output=".clangd", overwrite=False)
    commands = parser.add_subparsers(dest="command")

    clangd = commands.add_parser("clangd", help="write a .clangd file for editing kernels")
    clangd.add_argument("--cuda-arch", help="arch to configure, e.g. 9.0a (default: this GPU's, else 8.0)")
    clangd.add_argument("--output", default=".clangd", help="where to write (default: ./.clangd)")
    clangd.add_argument("--overwrite", action="store_true", help="replace an existing file")
    clangd.set_defaults(handler=cmd_clangd)

    doctor = commands.add_parser("doctor", help="check the setup and run a self-test")
    doctor.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    doctor.set_defaults(handler=cmd_doctor)

    listing = commands.add_parser("list", help="prebuilt and cached configs per family, and the decision here")
    listing.add_argument("family", nargs="*", help="only these families")
    listing.add_argument(
        "--explain", action="store_true", help="per config: its sources, flags, include folders and unit digest"
    )
    listing.add_argument("--config", action="append", default=[], help="list this config instead of the grid")
    listing.set_defaults(handler=cmd_list)

    warm = commands.add_parser("warm", help="compile configs into the JIT cache ahead of time")
    warm.add_argument("family", help="kernel family, e.g. add_constant")
    warm.add_argument(
        "--config",
        action="append",
        default=[],
        help="e.g. 4096,bf16_t or hidden=4096,dtype=bf16_t (repeatable; default: the prebuilt grid)",
    )
    warm.add_argument(
        "--arch",
        action="append",
        default=[],
        help="CUDA arch, e.g. 9.0a (repeatable; default: this GPU's or $JIT_KERNEL_CUDA_ARCH)",
    )
    warm.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    warm.set_defaults(handler=cmd_warm)

    cache_cmd = commands.add_parser("cache", help="inspect or clear the JIT cache")
    cache_actions = cache_cmd.add_subparsers(dest="action", required=True)
    cache_actions.add_parser("list", help="list cached modules").set_defaults(handler=cmd_cache_list)
    cache_actions.add_parser("clear", help="delete cached modules").set_defaults(handler=cmd_cache_clear)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except UsageError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except (toolchain.ToolchainError, cache.CacheDirError, OSError) as error:
        parser.exit(1, f"{parser.prog}: {error}\n")
