"""The header library compiles: every `.cuh` with nvcc for sm_90, the host headers with plain g++,
and the seeds' tutorial kernels unchanged. Compile only: nothing here needs a GPU.

All translation units are compiled once, in parallel, by a module fixture; each test then checks
one result. Warnings count as failures (`-Wall -Wextra`, and nvcc's own), except in the seed
fixtures, whose own code we do not police: there only warnings from `sgl_kernel/` fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@dataclass
class Unit:
    """One translation unit to compile and how to judge it."""

    name: str
    compiler: str  # "g++" or "nvcc"
    source: str
    strict: bool = True  # any warning fails; otherwise only warnings from sgl_kernel/ fail
    extra_flags: tuple[str, ...] = ()


def header_units() -> list[Unit]:
    """Host headers alone with g++, then one nvcc TU per .cuh header (tests/cpp/headers/<name>.cu)."""
    units = [
        Unit("host/utils.h", "g++", "#include <sgl_kernel/utils.h>\n"),
        Unit("host/tensor.h", "g++", "#include <sgl_kernel/tensor.h>\n"),
        Unit("host/source_location.h", "g++", "#include <sgl_kernel/source_location.h>\n"),
        Unit(
            "host/matcher_cases.cc",
            "g++",
            f'#include "{CPP / "matcher_cases.cc"}"\n#include <tvm/ffi/function.h>\n'
            + "".join(export(n, f"matcher_cases::{n}") for n in ("bind_shared", "unwrap_dtype", "panic_now")),
            extra_flags=("-O2",),
        ),
    ]
    for header in sorted(HEADERS.glob("*.cuh")):
        units.append(Unit(f"cuda/{header.name}", "nvcc", (CPP / "headers" / f"{header.stem}.cu").read_text()))
    # The PDL helpers and LaunchKernel also below sm_90, where griddepcontrol does not exist.
    units.append(
        Unit(
            "cuda/utils.cuh@sm_80",
            "nvcc",
            (CPP / "headers" / "utils.cu").read_text(),
            extra_flags=("-gencode=arch=compute_80,code=sm_80",),
        )
    )
    return units


def seed_units() -> list[Unit]:
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
    return [
        Unit(
            f"seed/{name}",
            "nvcc",
            TVM_FFI_INCLUDES + f'#include "{seeds / (name + ".cuh")}"\n' + "".join(export(*w) for w in exports),
            strict=False,
        )
        for name, exports in wrappers.items()
    ]


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float


def compile_unit(unit: Unit, workdir: Path, nvcc: str | None) -> Result:
    stem = unit.name.replace("/", "_").replace("@", "_")
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
        command = [nvcc, "-std=c++20", *arch, "-Xcompiler", "-fPIC,-Wall,-Wextra", *includes, "-x", "cu", "-c"]
        if unit.strict:
            command += ["-Werror", "all-warnings", "-Xcompiler", "-Werror"]
        command.append(str(source))
    command += [*unit.extra_flags, "-o", str(source.with_suffix(".o"))]
    start = time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True, cwd=workdir, check=False)
    output = " ".join(command) + "\n" + process.stdout + process.stderr
    return Result(process.returncode, output, time.perf_counter() - start)


UNITS = header_units() + seed_units()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    nvcc = find_nvcc()
    units = [u for u in UNITS if u.compiler == "g++" or nvcc is not None]
    if shutil.which("g++") is None:
        units = [u for u in units if u.compiler != "g++"]
    workdir = tmp_path_factory.mktemp("headers")
    # Slowest (nvcc) first, so the pool does not end on one long compile.
    units.sort(key=lambda u: u.compiler != "nvcc")
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {u.name: pool.submit(compile_unit, u, workdir, nvcc) for u in units}
        return {name: future.result() for name, future in futures.items()}


def check(results: dict[str, Result], unit: Unit) -> None:
    if unit.name not in results:
        pytest.skip("nvcc not found" if unit.compiler == "nvcc" else "g++ not found")
    result = results[unit.name]
    assert result.returncode == 0, f"{unit.name} failed to compile:\n{result.output}"
    if not unit.strict:
        ours = [
            line
            for line in result.output.splitlines()
            if "warning" in line.lower() and "sgl_kernel/" in line
        ]
        assert not ours, f"{unit.name}: warnings from the headers:\n" + "\n".join(ours)


@pytest.mark.parametrize("unit", header_units(), ids=lambda u: u.name)
def test_header_compiles(results, unit):
    check(results, unit)


@pytest.mark.parametrize("unit", seed_units(), ids=lambda u: u.name)
def test_seed_kernel_compiles_unchanged(results, unit):
    check(results, unit)


def test_every_header_has_a_compile_test():
    tested = {p.stem for p in (CPP / "headers").glob("*.cu")}
    missing = [h.name for h in HEADERS.glob("*.cuh") if h.stem not in tested]
    assert not missing, f"add a tests/cpp/headers/<name>.cu for: {missing}"

