"""``python -m jit_kernel <command>``: doctor, list, warm, clangd, cache.

With no command it writes ``./.clangd``, as the seed's ``python -m sglang.jit_kernel`` does.
A mistake in the arguments (an unknown family, a bad config or ``--arch``) exits with status 2 and
one line, like argparse's own errors; an environment problem (no GPU to take the arch from, a bad
``JIT_KERNEL_CUDA_ARCH``, an unusable cache folder) exits with status 1 and one line. Every command
that needs a CUDA arch takes it as :func:`jit_kernel.engine.target.compile_arch` says: ``--arch``,
else ``JIT_KERNEL_CUDA_ARCH``, else the GPU's; with none of them it asks for one rather than guess.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
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
from jit_kernel.engine.target import Arch, InvalidArchError, NoCudaArchError, compile_arch
from jit_kernel.engine.unit import TranslationUnit
from jit_kernel.version import __version__

ARCH_OPTION = "--arch"


class UsageError(Exception):
    """A mistake in the command's arguments: reported like argparse's errors (exit status 2)."""


@functools.cache
def op_families() -> dict[str, tuple[KernelSpec, ...]]:
    """Each public op of ``jit_kernel`` (``silu_and_mul``) -> the families whose kernels it launches
    (``activation``), in :data:`~jit_kernel.engine.families.ALL_FAMILIES` order.

    Read from the ops, not written down a second time: an op's module names its family once, where
    it builds the family's dispatcher (``Dispatcher(ACTIVATION)``) and kernel tables. This follows
    what an op's code refers to (the op's plan, its helpers, closures, defaults and tables, within
    the package) to those dispatchers; of a table keyed by op names, only the op's own entry. An op
    that picks between families at run time (hicache's register and bulk-copy kernels) maps to each
    of them."""
    import types

    import jit_kernel
    from jit_kernel.engine.dispatch import Dispatcher
    from jit_kernel.ops._common import KernelTable, Op

    def specs_of(op: str, root: object) -> set[KernelSpec]:
        found: set[KernelSpec] = set()
        seen: set[int] = set()
        pending = [root]
        while pending:
            item = pending.pop()
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, KernelSpec):
                found.add(item)
            elif isinstance(item, Dispatcher):
                pending.append(item.spec)
            elif isinstance(item, KernelTable):
                pending.append(item._dispatcher)
            elif isinstance(item, Op):
                pending.append(item.plan)
            elif isinstance(item, dict):
                pending += [item[op]] if op in item else list(item.values())
            elif isinstance(item, (list, tuple)):
                pending += list(item)
            elif isinstance(item, type) and item.__module__.startswith("jit_kernel."):
                pending += [getattr(member, "__func__", member) for member in vars(item).values()]
            elif isinstance(item, types.FunctionType) and (item.__module__ or "").startswith("jit_kernel"):
                pending += [
                    getattr(item, "op", None),
                    *(item.__defaults__ or ()),
                    *(item.__kwdefaults__ or {}).values(),
                ]
                pending += [cell.cell_contents for cell in item.__closure__ or () if cell_is_set(cell)]
                codes = [item.__code__]
                while codes:
                    code = codes.pop()
                    pending += [item.__globals__[name] for name in code.co_names if name in item.__globals__]
                    codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
        return found

    def cell_is_set(cell: types.CellType) -> bool:
        try:
            cell.cell_contents  # noqa: B018 (an empty cell raises)
        except ValueError:
            return False
        return True

    order = {spec: index for index, spec in enumerate(families.ALL_FAMILIES)}
    mapping: dict[str, tuple[KernelSpec, ...]] = {}
    for name in jit_kernel.__all__:
        specs = specs_of(name, getattr(jit_kernel, name, None))
        if specs:
            mapping[name] = tuple(sorted(specs, key=lambda spec: order.get(spec, len(order))))
    return mapping


def _specs(name: str) -> tuple[KernelSpec, ...]:
    """The family of that name, or the families an op of that name launches (``warm silu_and_mul``)."""
    try:
        return (families.family(name),)
    except KeyError:
        pass
    found = op_families().get(name)
    if found is None:
        known = ", ".join(spec.family for spec in families.ALL_FAMILIES)
        raise UsageError(
            f"unknown kernel family or op {name!r}; families: {known}; ops: the names in jit_kernel.__all__ "
            "that launch kernels (e.g. silu_and_mul)"
        )
    return found


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
    output = Path(args.output)
    if output.exists() and not args.overwrite:
        print(f"{output} already exists; pass --overwrite to replace it", file=sys.stderr)
        return 1
    arch = compile_arch(args.arch, ARCH_OPTION)
    output.write_text(clangd_config(str(arch)))
    print(f"wrote {output} for {arch.sm}; restart clangd to pick it up")
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
    except NoCudaArchError:
        return None


def _gpu_description() -> tuple[str, bool]:
    here = _target()
    if here is None:
        return "none visible, and no JIT_KERNEL_CUDA_ARCH (CUDA kernels compile once an arch is set)", False
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


def _self_test_cuda(gpu: bool, requested_arch: str | None) -> str:
    """On a GPU (and no ``--arch``): run through the dispatcher. Else compile and load for the arch
    :func:`compile_arch` gives, which raises :class:`NoCudaArchError` (the check is then skipped)."""
    if gpu and not requested_arch:
        prebuilt_decision = _check_add_constant("cuda", 1)
        jit_decision = _check_add_constant("cuda", 7)
        return f"add_constant<1>: {prebuilt_decision}; add_constant<7>: {jit_decision}; results correct on the GPU"
    arch = compile_arch(requested_arch, ARCH_OPTION)
    jit_module(families.ADD_CONSTANT_CUDA, (7,), cuda_arch=str(arch))
    why = f"{ARCH_OPTION} given" if gpu else "no GPU"
    return f"add_constant<7> compiled and loaded for {arch.sm} (not run: {why})"


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
    arch_ok = True
    try:
        gpu_text, gpu = _gpu_description()
    except InvalidArchError as error:
        problems.append(str(error))
        gpu_text, gpu, arch_ok = f"unavailable ({error})", False, False
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
    elif arch_ok or args.arch:
        checks.append(("CUDA self-test", lambda: _self_test_cuda(gpu, args.arch)))
    for label, check in checks:
        start = time.perf_counter()
        try:
            outcome = check()
            print(f"[ok]   {label}: {outcome} ({time.perf_counter() - start:.2f} s)")
        except NoCudaArchError as error:  # a machine without a GPU is healthy; it compiles once told the arch
            print(f"[skip] {label}: {error}")
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


LIST_LEGEND = (
    "grid: in the family's prebuilt grid (jit_kernel/engine/families.py); prebuilt: compiled into the installed "
    "library, for the archs named; jit-cache: compiled on first use and cached; -> how a call is served here"
)


def _in_library(spec: KernelSpec, config: Config, manifest: prebuilt.Manifest | None) -> str:
    """``prebuilt sm_80 sm_90a`` when the installed library holds the config, else why not."""
    entry = manifest.symbols.get(symbol_name(spec, next(iter(spec.exports)), config)) if manifest else None
    if entry is None:
        return "not in the installed library"
    if spec.target == "host":
        return "prebuilt (host)"
    return " ".join(["prebuilt", *(a.sm for a in entry.machine_code), *(f"{a.compute}(PTX)" for a in entry.ptx)])


def cmd_list(args: argparse.Namespace) -> int:
    wanted = [spec for name in args.family for spec in _specs(name)]
    if args.config and len(set(wanted)) != 1:
        raise UsageError("--config needs exactly one family (an op that launches several: name the family)")
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
    print(LIST_LEGEND)
    cached = cache.list_entries()
    ops_of: dict[KernelSpec, list[str]] = {}
    for op, specs in op_families().items():
        for spec in specs:
            ops_of.setdefault(spec, []).append(op)
    for spec in families.ALL_FAMILIES:
        if wanted and spec not in wanted:
            continue
        ops = f"; ops {', '.join(ops_of[spec])}" if spec in ops_of else ""
        params = f"params {', '.join(spec.params)}" if spec.params else "no params"
        print(f"\n{spec.family} ({spec.target}; {', '.join(spec.sources)}; {params}{ops})")
        for note in spec.value_notes():
            print(f"  {note}")
        configs = [_parse_config(spec, text) for text in args.config] or spec.prebuilt
        label = "config   " if args.config else "grid     "
        for config in configs:
            built = _in_library(spec, config, manifest)
            print(f"  {label} {spec.describe(config):<40} {built:<36} -> {_decision(spec, config, here)}")
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
    specs = _specs(args.family)
    if args.config and len(specs) > 1:
        raise UsageError(
            f"{args.family} launches kernels of {len(specs)} families ({', '.join(s.family for s in specs)}); "
            "with --config, name one of them"
        )
    jobs: list[tuple[str, Config, str | None]] = []
    for spec in specs:
        configs = [_parse_config(spec, text) for text in args.config] or list(spec.prebuilt)
        if spec.target == "host":
            archs: list[str | None] = [None]
        else:
            archs = [str(compile_arch(a, ARCH_OPTION)) for a in args.arch] or [str(compile_arch(None, ARCH_OPTION))]
        jobs += [(spec.family, config, arch) for config in configs for arch in archs]
    names = ", ".join(spec.family for spec in specs)
    if names != args.family:
        names += f" (what {args.family} launches)"
    print(f"warming {len(jobs)} module(s) of {names} into {env.cache_dir()} with {args.jobs} worker(s)")
    failures = 0
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(_warm_one, *job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            try:
                print(f"  ready  {future.result()}")
            except Exception as error:
                failures += 1
                family, config, arch = futures[future]
                print(
                    f"  FAILED {families.family(family).describe(config)} for {arch or 'host'}: {error}",
                    file=sys.stderr,
                )
    return 1 if failures else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m jit_kernel", description=__doc__)
    parser.set_defaults(handler=cmd_clangd, arch=None, output=".clangd", overwrite=False)
    from_env = "default: $JIT_KERNEL_CUDA_ARCH, else this GPU's"
    # Without a command the package writes .clangd, as the seed's does: it takes clangd's arch option too.
    parser.add_argument(ARCH_OPTION, dest="arch", help=f"with no command: the .clangd's CUDA arch ({from_env})")
    commands = parser.add_subparsers(dest="command")

    clangd = commands.add_parser("clangd", help="write a .clangd file for editing kernels")
    clangd.add_argument(ARCH_OPTION, "--cuda-arch", dest="arch", help=f"CUDA arch to configure, e.g. 9.0a ({from_env})")
    clangd.add_argument("--output", default=".clangd", help="where to write (default: ./.clangd)")
    clangd.add_argument("--overwrite", action="store_true", help="replace an existing file")
    clangd.set_defaults(handler=cmd_clangd)

    doctor = commands.add_parser("doctor", help="check the setup and run a self-test")
    doctor.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failures")
    doctor.add_argument(
        ARCH_OPTION,
        help="compile the CUDA self-test for this arch, e.g. 9.0a, without running it (default: run it on this "
        "GPU; with none, compile it for $JIT_KERNEL_CUDA_ARCH, else skip it)",
    )
    doctor.set_defaults(handler=cmd_doctor)

    listing = commands.add_parser("list", help="grid, prebuilt and cached configs per family, and the decision here")
    listing.add_argument("family", nargs="*", help="only these families, or the families of these ops (silu_and_mul)")
    listing.add_argument(
        "--explain", action="store_true", help="per config: its sources, flags, include folders and unit digest"
    )
    listing.add_argument("--config", action="append", default=[], help="list this config instead of the grid")
    listing.set_defaults(handler=cmd_list)

    warm = commands.add_parser("warm", help="compile configs into the JIT cache ahead of time")
    warm.add_argument("family", help="kernel family (e.g. activation) or op (e.g. silu_and_mul)")
    warm.add_argument(
        "--config",
        action="append",
        default=[],
        help="e.g. 4096,bf16_t or hidden=4096,dtype=bf16_t (repeatable; default: the prebuilt grid)",
    )
    warm.add_argument(
        ARCH_OPTION,
        action="append",
        default=[],
        help=f"CUDA arch, e.g. 9.0a (repeatable; {from_env})",
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
    except InvalidArchError as error:  # an option's value is a usage error; the variable's, the environment's
        if error.source == ARCH_OPTION:
            parser.exit(2, f"{parser.prog}: error: {error}\n")
        parser.exit(1, f"{parser.prog}: {error}\n")
    except (toolchain.ToolchainError, cache.CacheDirError, OSError) as error:
        parser.exit(1, f"{parser.prog}: {error}\n")
