"""The header library compiles: every `.cuh` with nvcc for sm_90, the host headers with plain g++,
and the seeds' tutorial kernels unchanged. Compile only: nothing here needs a GPU.

All translation units are compiled once, in parallel, by a module fixture; each test then checks
one result. Warnings count as failures (`-Wall -Wextra`, and nvcc's own), except in the seed
fixtures, whose own code we do not police: there only warnings from `sgl_kernel/` fail.

Most of a unit's time is parsing what every header pulls in (tvm-ffi's tensor.h, the CUDA headers),
so the nvcc units of a `Group` are proven together: each one's device pass alone (`nvcc -cubin`:
the front end parses and instantiates its host and device code, so a header that uses what it does
not include still fails, named; then ptxas), and one full compile of all of them in one translation
unit (the host pass: cudafe++ and g++ with their warnings). A unit whose proof fails is compiled
alone, exactly as listed, and its test reports that result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import jit_kernel

REPO = Path(__file__).resolve().parent.parent
INCLUDE = REPO / "include"
HEADERS = INCLUDE / "sgl_kernel"
CPP = Path(__file__).resolve().parent / "cpp"

TVM_FFI_INCLUDES = (
    "#include <tvm/ffi/container/tensor.h>\n"
    "#include <tvm/ffi/dtype.h>\n"
    "#include <tvm/ffi/error.h>\n"
    "#include <tvm/ffi/extra/c_env_api.h>\n"
    "#include <tvm/ffi/function.h>\n"
)


def find_nvcc() -> str | None:
    """$CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc, else the nvcc on PATH."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path).resolve())
    return next((str(c) for c in candidates if c.is_file()), None)


def tvm_ffi_include_dirs() -> list[str]:
    import tvm_ffi.libinfo as libinfo

    return sorted({libinfo.find_include_path(), libinfo.find_dlpack_include_path()})


def export(name: str, expression: str) -> str:
    """What load_jit appends for each wrapper: it instantiates the template."""
    return f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, ({expression}));\n"


@dataclass(frozen=True)
class Unit:
    """One translation unit to compile and how to judge it."""

    name: str
    compiler: str  # "g++" or "nvcc"
    source: str
    strict: bool = True  # any warning fails; otherwise only warnings from sgl_kernel/ fail
    extra_flags: tuple[str, ...] = ()
    device_only: bool = False  # nvcc -cubin: preprocessing, the front end (host and device code), ptxas


@dataclass(frozen=True)
class Group:
    """nvcc units of the same flags, proven by their device passes alone and one full compile of all."""

    name: str
    units: tuple[Unit, ...]

    def together(self) -> Unit:
        """One translation unit holding every unit's source in turn (their names must not clash)."""
        first = self.units[0]
        flags = {(u.compiler, u.strict, u.extra_flags, u.device_only) for u in self.units}
        assert len(flags) == 1, f"{self.name}: its units are compiled with different flags"
        return replace(first, name=self.name, source="".join(u.source for u in self.units))


def header_source(stem: str) -> str:
    """The compile test of one header (tests/cpp/headers/<stem>.cu), which includes that header first."""
    return f'#include "{CPP / "headers" / f"{stem}.cu"}"\n'


def header_units() -> list[Unit]:
    """Host headers alone with g++, then one nvcc TU per .cuh header (tests/cpp/headers/<name>.cu)."""
    units = [
        Unit("host/utils.h", "g++", "#include <sgl_kernel/utils.h>\n"),
        Unit("host/dtype.h", "g++", "#include <sgl_kernel/dtype.h>\n"),
        Unit("host/tensor.h", "g++", "#include <sgl_kernel/tensor.h>\n"),
        Unit("host/source_location.h", "g++", "#include <sgl_kernel/source_location.h>\n"),
        Unit("host/ffi.h", "g++", "#include <sgl_kernel/ffi.h>\n"),
        Unit(
            "host/matcher_cases.cc",
            "g++",
            f'#include "{CPP / "matcher_cases.cc"}"\n#include <tvm/ffi/function.h>\n'
            + "".join(export(n, f"matcher_cases::{n}") for n in ("bind_shared", "unwrap_dtype", "panic_now")),
            extra_flags=("-O2",),
        ),
    ]
    units += header_group().units
    # The PDL helpers and LaunchKernel also below sm_90, where griddepcontrol does not exist. Device code
    # only: the host pass is the same text for every arch (SGL_CUDA_ARCH 800 and 900 agree on the host).
    units.append(
        Unit(
            "cuda/utils.cuh@sm_80",
            "nvcc",
            header_source("utils"),
            extra_flags=("-gencode=arch=compute_80,code=sm_80",),
            device_only=True,
        )
    )
    # A kernel that guards its mbarrier / bulk-copy code builds below sm_90, where they are deleted.
    units.append(
        Unit(
            "cuda/mbarrier.cuh@sm_80",
            "nvcc",
            header_source("mbarrier"),
            extra_flags=("-gencode=arch=compute_80,code=sm_80",),
            device_only=True,
        )
    )
    return units


def header_group() -> Group:
    """One nvcc unit per .cuh header: its compile test, which includes it first."""
    units = tuple(Unit(f"cuda/{h.name}", "nvcc", header_source(h.stem)) for h in sorted(HEADERS.glob("*.cuh")))
    return Group("cuda/*.cuh", units)


def seed_units() -> list[Unit]:
    return list(seed_group().units)


def seed_group() -> Group:
    """The seeds' kernels as load_jit would build them: the file, then export wrappers."""
    seeds = CPP / "seeds"
    wrappers = {
        "add_constant": [("add_constant", "add_constant<3>"), ("add_constant_neg", "add_constant<-7>")],
        "scale": [
            ("scale_fp16", "scale<fp16_t, 2000, 1000>"),
            ("scale_bf16", "scale<bf16_t, 1, 2>"),
            ("scale_fp32", "scale<fp32_t, 3, 1>"),
        ],
        "hicache": [
            ("launch_one", "HiCacheKernel<256, 4, 2, 1024, 1>::run_one"),
            ("launch_one_large", "HiCacheKernel<1024, 4, 8, 512, 2>::run_one"),
        ],
        "dev_guide": [
            ("stream_wait_value", "wait_value::stream_wait_value"),
            ("my_kernel", "my_kernel::MyKernel<256>::run"),
            ("guide_tensor", "guide_tensor::test"),
        ],
    }
    units = tuple(
        Unit(
            f"seed/{name}",
            "nvcc",
            TVM_FFI_INCLUDES + f'#include "{seeds / (name + ".cuh")}"\n' + "".join(export(*w) for w in exports),
            strict=False,
        )
        for name, exports in wrappers.items()
    )
    return Group("seed/*", units)


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


def compile_unit(unit: Unit, workdir: Path, nvcc: str | None) -> Result:
    stem = re.sub(r"[^\w.]", "_", unit.name) + ("_device" if unit.device_only else "")
    suffix = ".cc" if unit.compiler == "g++" else ".cu"
    source = workdir / f"{stem}{suffix}"
    source.write_text(unit.source)
    includes = ["-I", str(INCLUDE)]
    for directory in tvm_ffi_include_dirs():
        includes += ["-isystem", directory]
    if unit.compiler == "g++":
        command = ["g++", "-std=c++20", "-Wall", "-Wextra", "-Werror", "-fPIC", *includes, "-c", str(source)]
    else:
        assert nvcc is not None
        arch = [] if any(f.startswith("-gencode") for f in unit.extra_flags) else ["-arch=sm_90"]
        mode = "-cubin" if unit.device_only else "-c"
        command = [nvcc, "-std=c++20", *arch, "-Xcompiler", "-fPIC,-Wall,-Wextra", *includes, "-x", "cu", mode]
        if unit.strict:
            command += ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]
        command.append(str(source))
    output = source.with_suffix(".cubin" if unit.device_only else ".o")
    command += [*unit.extra_flags, "-o", str(output)]
    start = time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True, cwd=workdir, check=False)
    output = " ".join(command) + "\n" + process.stdout + process.stderr
    return Result(process.returncode, output, time.perf_counter() - start)


UNITS = header_units() + seed_units()
GROUPS = [header_group(), seed_group()]


def header_warnings(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if "warning" in line.lower() and "sgl_kernel/" in line]


def passed(unit: Unit, result: Result) -> bool:
    return result.returncode == 0 and (unit.strict or not header_warnings(result))


def compile_all(units: Iterable[Unit], groups: Iterable[Group], workdir: Path) -> dict[str, Result]:
    """Every unit's result by name, and each group's own (the units compiled as one), in parallel.

    A unit of a group is proven by its device pass alone and the group's full compile; where either
    fails it is compiled alone as listed, so its result is its own. Units of a missing compiler are left out.
    """
    nvcc = find_nvcc()
    have = {"nvcc": nvcc is not None, "g++": shutil.which("g++") is not None}
    groups = [g for g in groups if have["nvcc"]]
    grouped = {u.name for g in groups for u in g.units}
    single = [u for u in units if u.name not in grouped and have[u.compiler]]
    jobs = {u.name: u for u in single} | {g.name: g.together() for g in groups}
    jobs |= {f"{u.name}#device": replace(u, device_only=True) for g in groups for u in g.units}
    done = _compile_jobs(jobs, workdir, nvcc)
    results = {name: done[name] for name in [*(u.name for u in single), *(g.name for g in groups)]}
    alone = {}
    for group in groups:
        together = done[group.name]
        for unit in group.units:
            device = done[f"{unit.name}#device"]
            if passed(unit, device) and passed(unit, together):
                output = f"{device.output}\n(host pass: compiled in '{group.name}')\n{together.output}"
                results[unit.name] = Result(0, output, device.seconds)
            else:
                alone[unit.name] = unit
    return results | _compile_jobs(alone, workdir, nvcc)


def _compile_jobs(jobs: dict[str, Unit], workdir: Path, nvcc: str | None) -> dict[str, Result]:
    # Slowest first (full nvcc compiles, then device passes, then g++), so the pool does not end on a long one.
    order = sorted(jobs, key=lambda n: (jobs[n].compiler != "nvcc", jobs[n].device_only, -len(jobs[n].source)))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(compile_unit, jobs[name], workdir, nvcc) for name in order}
        return {name: future.result() for name, future in futures.items()}


def once_per_session(
    tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], dict[str, Result]]
) -> dict[str, Result]:
    """compute()'s results, computed once per test session: pytest-xdist may hand a module's tests to
    both workers, and the second then waits for the first one's results instead of compiling again."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return compute()
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / f"{name}.json"  # the session's folder, above the workers'
    with FileLock(f"{shared}.lock"):
        if shared.is_file():
            return {key: Result(**value) for key, value in json.loads(shared.read_text()).items()}
        computed = compute()
        shared.write_text(json.dumps({key: dataclasses.asdict(value) for key, value in computed.items()}))
        return computed


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    return once_per_session(
        tmp_path_factory, "test_headers", lambda: compile_all(UNITS, GROUPS, tmp_path_factory.mktemp("headers"))
    )


def check(results: dict[str, Result], unit: Unit) -> None:
    if unit.name not in results:
        pytest.skip("nvcc not found" if unit.compiler == "nvcc" else "g++ not found")
    result = results[unit.name]
    assert result.returncode == 0, f"{unit.name} failed to compile:\n{result.output}"
    if not unit.strict:
        ours = header_warnings(result)
        assert not ours, f"{unit.name}: warnings from the headers:\n" + "\n".join(ours)


def check_group(results: dict[str, Result], group: Group) -> None:
    """The group's units compile as one translation unit: what keeps their proof to one host compile."""
    if group.name not in results:
        pytest.skip("nvcc not found")
    unit, result = group.together(), results[group.name]
    assert passed(unit, result), (
        f"{group.name}: {', '.join(u.name for u in group.units)} compiled as one translation unit failed "
        f"(each unit's own test says whether it compiles alone; names must not clash between them):\n{result.output}"
    )


@pytest.mark.parametrize("unit", header_units(), ids=lambda u: u.name)
def test_header_compiles(results, unit):
    check(results, unit)


@pytest.mark.parametrize("unit", seed_units(), ids=lambda u: u.name)
def test_seed_kernel_compiles_unchanged(results, unit):
    check(results, unit)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.name)
def test_units_compile_together(results, group):
    check_group(results, group)


def test_every_header_has_a_compile_test():
    tested = {p.stem for p in (CPP / "headers").glob("*.cu")}
    missing = [h.name for h in HEADERS.glob("*.cuh") if h.stem not in tested]
    assert not missing, f"add a tests/cpp/headers/<name>.cu for: {missing}"


# ---- on a GPU: the helpers compute the right thing, the seed kernels run ------------------------

GPU_CASES = CPP / "gpu_cases.cuh"


def _exports(path: Path, namespace: str) -> list[tuple[str, str]]:
    block = re.search(r"// Functions \(namespace \w+\):\n((?://.*\n)+?)\n", path.read_text())
    assert block, f"{path.name} lost its function list"
    names = [n.strip() for n in block.group(1).replace("//", " ").split(",") if n.strip()]
    return [(name, f"{namespace}::{name}") for name in names]


@pytest.fixture(scope="module")
def gpu_mod():
    return jit_kernel.load_jit(
        "header_gpu_cases", cuda_files=[str(GPU_CASES)], cuda_wrappers=_exports(GPU_CASES, "gpu_cases")
    )


@pytest.mark.gpu
def test_gpu_block_and_warp_reductions(gpu_mod):
    x = torch.randn(64, 256, device="cuda")
    out = torch.empty(64, 6, device="cuda")
    gpu_mod.block_reduce(x, out)
    expected = torch.stack(
        [x.sum(1), x.amax(1), x.amin(1), x.abs().amax(1), x[:, 32:64].sum(1), x[:, 8:16].sum(1)], dim=1
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_gpu_max_of_absolute_values_by_redux(gpu_mod):
    x = torch.randn(64, 256, device="cuda") * torch.logspace(-45, 38, 64, device="cuda")[:, None]
    x[1] = 0.0
    x[2] = -0.0  # |x| is +0: the bits order holds
    x[3, 7] = float("inf")
    x[4, 200] = -float("inf")
    x[5] = torch.tensor(1e-40)  # subnormals only
    x[6, 40] = 3e38  # the largest finite values, in warp 1
    out = torch.full((64, 3), float("nan"), device="cuda")
    gpu_mod.absmax_nonneg(x, out)
    expected = x.abs().amax(1)
    assert torch.equal(out[:, 0], expected) and torch.equal(out[:, 1], expected)
    assert torch.equal(out[:, 2], x[:, 32:64].abs().amax(1))


@pytest.mark.gpu
def test_gpu_predicated_store(gpu_mod):
    x = torch.randn(8, 256, device="cuda")
    out = torch.full((8, 768), float("nan"), device="cuda")
    gpu_mod.store_if(x, out)
    for part, elems in enumerate((4, 2, 1)):
        got = out[:, 256 * part : 256 * (part + 1)].view(8, -1, elems)
        stored = torch.arange(got.shape[1], device="cuda") % 3 != 0
        assert torch.equal(got[:, stored], x.view(8, -1, elems)[:, stored])
        assert got[:, ~stored].isnan().all()


@pytest.mark.gpu
def test_gpu_block_all_reduce_and_cluster_reduce(gpu_mod):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90")
    x = torch.randn(64, 256, device="cuda")
    out = torch.full((64, 4), float("nan"), device="cuda")
    gpu_mod.cluster_reduce(x, out)
    clusters = x.view(16, 4 * 256)
    torch.testing.assert_close(out[:, 0], clusters.sum(1).repeat_interleave(4), rtol=1e-5, atol=1e-3)
    assert torch.equal(out[:, 1], clusters.amax(1).repeat_interleave(4))
    torch.testing.assert_close(out[:, 2], x.sum(1), rtol=1e-5, atol=1e-4)
    assert torch.equal(out[:, 3], torch.arange(4, device="cuda", dtype=torch.float32).repeat(16))
    assert torch.equal(out[0::4, 0], out[1::4, 0])  # every block of a cluster gets the same total


@pytest.mark.gpu
def test_gpu_warp_exchange_sums_as_one_block(gpu_mod):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90")
    x = torch.randn(24, 512, device="cuda") * torch.logspace(-3, 3, 512, device="cuda")
    out = torch.full((24, 3), float("nan"), device="cuda")
    gpu_mod.warp_exchange(x, out)
    assert torch.equal(out[:, 0], out[:, 2])  # the bits of one 512-thread block's all_reduce_sum
    torch.testing.assert_close(out[:, 0], x.double().sum(1).float(), rtol=1e-5, atol=1e-2)
    assert torch.equal(out[:, 1], x.abs().amax(1))


@pytest.mark.gpu
@pytest.mark.parametrize("sign", [1.0, -1.0, 0.0])
def test_gpu_atomic_extrema(gpu_mod, sign):
    x = torch.randn(100_000, device="cuda") if sign == 0.0 else torch.rand(100_000, device="cuda") * sign
    out = torch.tensor([-float("inf"), float("inf")], device="cuda")
    gpu_mod.atomic_extrema(x, out)
    assert out.tolist() == [x.max().item(), x.min().item()]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_vector_tile_cast(gpu_mod, dtype):
    src = torch.randn(8 * 1000, device="cuda").to(getattr(torch, dtype))
    dst = torch.empty_like(src)
    gpu_mod.vec_scale(dst, src)
    assert torch.equal(dst, src * 2)


@pytest.mark.gpu
def test_gpu_casts_round_like_torch(gpu_mod):
    src = torch.randn(4096, device="cuda") * 100
    # Beyond e4m3's largest finite value (448) the cast saturates; torch's gives NaN from 464 on.
    src[:4] = torch.tensor([460.0, -500.0, 1e6, -1e30])
    h, b = torch.empty_like(src, dtype=torch.float16), torch.empty_like(src, dtype=torch.bfloat16)
    q = torch.empty_like(src, dtype=torch.float8_e4m3fn)
    gpu_mod.cast_from_float(src, h, b, q)
    assert torch.equal(h, src.half()) and torch.equal(b, src.bfloat16())
    finite = src.abs() <= 448
    assert torch.equal(q.float()[finite], src[finite].to(torch.float8_e4m3fn).float())
    assert torch.equal(q.float()[~finite], src[~finite].sign() * 448)
    back = torch.empty(3, 4096, device="cuda")
    gpu_mod.cast_to_float(h, b, q, back)
    assert torch.equal(back, torch.stack([h.float(), b.float(), q.float()]))


@pytest.mark.gpu
def test_gpu_math(gpu_mod):
    x = torch.randn(4096, device="cuda") * 3
    out = torch.empty(8, 4096, device="cuda")
    gpu_mod.math_ops(x, out)
    expected = torch.stack(
        [x.abs(), x.abs().sqrt(), (x.abs() + 1).rsqrt(), x.exp(), x.sin(), x.cos(), x.clamp(min=0),
         x.half().clamp(max=0).float()]
    )  # fmt: skip
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("group_threads", [32, 8])
def test_gpu_streaming_copy(gpu_mod, group_threads):
    src = torch.randint(0, 256, (1000, 512), dtype=torch.uint8, device="cuda")
    dst = torch.zeros_like(src)
    gpu_mod.stream_copy(dst, src, group_threads)
    assert torch.equal(dst, src)


@pytest.mark.gpu
def test_gpu_launch_pdl_and_large_smem(gpu_mod):
    x = torch.zeros(10_000, dtype=torch.int32, device="cuda")
    assert gpu_mod.fill_index(x) == torch.cuda.current_device()
    assert torch.equal(x, torch.arange(10_000, dtype=torch.int32, device="cuda"))
    gpu_mod.pdl_chain(x)
    assert torch.equal(x, torch.arange(1, 10_001, dtype=torch.int32, device="cuda"))
    y = torch.randn(1024, device="cuda")
    expected = y.flip(0)
    gpu_mod.big_smem(y)
    assert torch.equal(y, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("direction", ["d2d", "h2d", "d2h", "h2h"])
def test_gpu_bulk_copy_ring(gpu_mod, direction):
    """mbarrier.cuh: a 3-stage ring of bulk loads and stores copies every byte (20 stages and a
    short tail), between GPU and pinned host memory through get_device_accessible_ptr."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk copies need sm_90")
    size = 20 * 8192 + 48
    place = {"d": {"device": "cuda"}, "h": {"pin_memory": True}}
    src = torch.empty(size, dtype=torch.uint8, **place[direction[0]])
    src.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))
    dst = torch.full((size + 16,), 0xA5, dtype=torch.uint8, **place[direction[2]])
    gpu_mod.bulk_ring(dst[16:], src, torch.cuda.current_device())  # dst at a 16-byte offset
    torch.cuda.synchronize()
    assert torch.equal(dst[16:].cpu(), src.cpu())
    assert bool((dst[:16].cpu() == 0xA5).all())


@pytest.mark.gpu
def test_gpu_device_accessible_ptr(gpu_mod):
    """GPU memory is its own address; pinned host memory (a slice too) has a device alias; pageable
    host memory is refused with an error that names the argument."""
    x = torch.empty(64, device="cuda")
    assert gpu_mod.device_address(x) == x.data_ptr()
    pinned = torch.empty(4096, dtype=torch.uint8, pin_memory=True)
    base = gpu_mod.device_address(pinned)
    assert base != 0 and gpu_mod.device_address(pinned[256:]) == base + 256
    with pytest.raises(ValueError, match=r"'t' is in pageable \(unpinned\) host memory.*pin_memory=True"):
        gpu_mod.device_address(torch.empty(64))


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_gpu_launch_on_the_tensors_device(gpu_mod):
    """The caller's current device is cuda:0; the kernel must run on cuda:1 and leave cuda:0 current."""
    torch.cuda.set_device(0)
    x = torch.zeros(10_000, dtype=torch.int32, device="cuda:1")
    assert gpu_mod.fill_index(x) == 0
    torch.cuda.synchronize(1)
    assert torch.equal(x.cpu(), torch.arange(10_000, dtype=torch.int32))
    assert torch.cuda.current_device() == 0


@pytest.mark.gpu
def test_gpu_runtime_queries(gpu_mod):
    props = torch.cuda.get_device_properties(0)
    sm_count, cc_major, version, blocks, smem = gpu_mod.runtime_info(0)
    assert (sm_count, cc_major) == (props.multi_processor_count, props.major)
    assert version >= 12000 and blocks >= 1 and smem > 0


@pytest.mark.gpu
def test_gpu_launch_error_names_the_call_site(gpu_mod):
    line = next(i for i, t in enumerate(GPU_CASES.read_text().splitlines(), 1) if "@line:bad_launch" in t)
    with pytest.raises(RuntimeError) as info:
        gpu_mod.bad_launch(torch.zeros(4, dtype=torch.int32, device="cuda"))
    assert re.fullmatch(rf"CUDA error at gpu_cases\.cuh:{line}: cudaErrorInvalidValue \(.+\)", str(info.value))


@pytest.mark.gpu
def test_gpu_seed_kernels_run():
    """The seeds' kernels, built unchanged, compute what their tutorials say."""
    seeds = CPP / "seeds"
    mod = jit_kernel.load_jit(
        "header_seed_kernels",
        cuda_files=[str(seeds / "add_constant.cuh")],
        cuda_wrappers=[("add_constant", "add_constant<3>")],
    )
    src = torch.arange(1000, dtype=torch.int32, device="cuda")
    dst = torch.empty_like(src)
    mod.add_constant(dst, src)
    assert torch.equal(dst, src + 3)

    mod = jit_kernel.load_jit(
        "header_seed_scale",
        cuda_files=[str(seeds / "scale.cuh")],
        cuda_wrappers=[("scale_fp16", "scale<fp16_t, 2000, 1000>"), ("scale_fp32", "scale<fp32_t, 1, 2>")],
    )
    for size in (1, 127, 4097):
        x = torch.randn(size, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        mod.scale_fp16(y, x)
        torch.testing.assert_close(y, x * 2)
        x32 = torch.randn(size, device="cuda")
        y32 = torch.empty_like(x32)
        mod.scale_fp32(y32, x32)
        torch.testing.assert_close(y32, x32 * 0.5)

    mod = jit_kernel.load_jit(
        "header_seed_hicache",
        cuda_files=[str(seeds / "hicache.cuh")],
        cuda_wrappers=[("launch_one", "HiCacheKernel<256, 4, 2, 1024, 1>::run_one")],
    )
    k_src, v_src = torch.randn(2, 64, 128, dtype=torch.float16, device="cuda").unbind(0)
    k_dst, v_dst = torch.zeros(2, 32, 128, dtype=torch.float16, device="cuda").unbind(0)
    idx_src = torch.tensor([5, 60, 7], device="cuda")
    idx_dst = torch.tensor([0, 31, 2], device="cuda")
    mod.launch_one(k_dst, v_dst, idx_dst, k_src, v_src, idx_src)
    assert torch.equal(k_dst[idx_dst], k_src[idx_src]) and torch.equal(v_dst[idx_dst], v_src[idx_src])

    mod = jit_kernel.load_jit(
        "header_seed_guides",
        cuda_files=[str(seeds / "dev_guide.cuh")],
        cuda_wrappers=[("my_kernel", "my_kernel::MyKernel<256>::run"), ("wait", "wait_value::stream_wait_value")],
    )
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    mod.my_kernel(y, x)
    assert torch.equal(y, x * 2)
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    mod.wait(flag, 1)  # already set: returns at once
    torch.cuda.synchronize()
