"""Kernels written for sglang.jit_kernel's headers build unchanged against ours (issue 14, part 3).

The fixtures under tests/cpp/compat/ are our own kernels written the way sglang's kernels spell the
library: its aliases (`device::kMaxVecBytes`, `kDLGPU`, `warp::kFullMask`, width-first
`warp::reduce_sum<16>`, `SGL_ARCH_*`, `host::Error` / `SGL_PANIC` / `CHECK_HOST`, ...), the
`namespace sglang` layout of 0.5.23, and the two real capabilities `impl/norm.cuh` and `ffi.h`.
Every unit is compiled once, in parallel, by a module fixture (as in test_headers.py); the `gpu`
tests run the norm and ffi fixtures. tools/check_seed_headers.py does the same for whole releases.
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import jit_kernel
from test_headers import TVM_FFI_INCLUDES, Result, Unit, compile_unit, export, find_nvcc

COMPAT = Path(__file__).resolve().parent / "cpp" / "compat"


def include(name: str) -> str:
    return TVM_FFI_INCLUDES + f'#include "{COMPAT / name}"\n'


def in_sglang(exports: str) -> str:
    """sglang 0.5.23's loader puts the exports inside `namespace sglang`."""
    return f"namespace sglang {{\n{exports}}}  // namespace sglang\n"


NORM_CONFIGS = [("fp16_t", 64), ("bf16_t", 128), ("fp16_t", 256), ("bf16_t", 1024), ("fp16_t", 8192)]
FFI_FUNCS = [
    "empty_2x3",
    "empty_like_filled",
    "empty_typed",
    "workspace",
    "blob_view",
    "blob_like",
    "blob_owned",
    "deleted_count",
    "counter_twice",
]

ALIASES = include("aliases.cuh") + "".join(
    [
        export("group_sums_f32", "compat_aliases::group_sums<fp32_t>"),
        export("group_sums_f16", "compat_aliases::group_sums<fp16_t>"),
        export("check_sizes", "compat_aliases::check_sizes"),
    ]
)

UNITS = [
    # Every alias, as our load_jit builds it (no -DSGL_CUDA_ARCH: the headers derive it).
    Unit("aliases", "nvcc", ALIASES),
    # ... and as sglang's load_jit builds it: it passes -DSGL_CUDA_ARCH itself.
    Unit("aliases@SGL_CUDA_ARCH", "nvcc", ALIASES, extra_flags=("-DSGL_CUDA_ARCH=900",)),
    # Two archs: SGL_CUDA_ARCH is the lowest in both passes, so host and device agree on kMaxVecBytes.
    Unit(
        "aliases@sm_80+sm_90",
        "nvcc",
        ALIASES + "static_assert(SGL_CUDA_ARCH == 800 && !SGL_ARCH_HOPPER_OR_GREATER);\n",
        extra_flags=("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"),
    ),
    Unit(
        "sglang_namespace",
        "nvcc",
        include("sglang_namespace.cuh")
        + in_sglang(export("scale_f16", "ScaleRows<fp16_t>::run") + export("scale_bf16", "ScaleRows<bf16_t>::run")),
    ),
    Unit(
        "impl/norm.cuh",
        "nvcc",
        include("norm.cuh")
        + "".join(export(f"rmsnorm_{t}_{d}", f"compat_norm::rmsnorm<{t}, {d}>") for t, d in NORM_CONFIGS),
    ),
    Unit("ffi.h", "nvcc", include("ffi.cuh") + "".join(export(f, f"compat_ffi::{f}") for f in FFI_FUNCS)),
    # ffi.h is host-only: plain g++ too (test_headers.py covers it alone; here with its users).
    Unit("ffi.h@g++", "g++", include("ffi.cuh") + "".join(export(f, f"compat_ffi::{f}") for f in FFI_FUNCS)),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    nvcc = find_nvcc()
    units = [u for u in UNITS if (u.compiler == "nvcc" and nvcc) or (u.compiler == "g++" and shutil.which("g++"))]
    workdir = tmp_path_factory.mktemp("compat")
    units.sort(key=lambda u: u.compiler != "nvcc")
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {u.name: pool.submit(compile_unit, u, workdir, nvcc) for u in units}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_compat_unit_compiles(results, unit):
    if unit.name not in results:
        pytest.skip(f"{unit.compiler} not found")
    result = results[unit.name]
    assert result.returncode == 0, f"{unit.name} failed to compile:\n{result.output}"


def test_every_fixture_is_compiled():
    used = {name for u in UNITS for name in re.findall(r"compat/([\w.]+)\"", u.source)}
    missing = sorted({p.name for p in COMPAT.glob("*.cuh")} - used)
    assert not missing, f"fixtures not compiled by any unit: {missing}"


# ---- on a GPU ------------------------------------------------------------------------------------


def _load(name: str, fixture: str, wrappers: list[tuple[str, str]]):
    return jit_kernel.load_jit(f"compat_{name}", cuda_files=[str(COMPAT / fixture)], cuda_wrappers=wrappers)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_aliases(dtype):
    mod = _load(
        "aliases",
        "aliases.cuh",
        [
            ("group_sums_f32", "compat_aliases::group_sums<fp32_t>"),
            ("group_sums_f16", "compat_aliases::group_sums<fp16_t>"),
            ("check_sizes", "compat_aliases::check_sizes"),
        ],
    )
    x = torch.randn(4096, device="cuda").to(dtype)
    out = torch.empty(4096, 4, device="cuda")
    (mod.group_sums_f32 if dtype == torch.float32 else mod.group_sums_f16)(x, out)
    xf = x.float()
    torch.testing.assert_close(out[:, 0], xf.view(-1, 16).sum(1).repeat_interleave(16), rtol=1e-5, atol=1e-4)
    assert torch.equal(out[:, 1], xf.view(-1, 32).amax(1).repeat_interleave(32))
    torch.testing.assert_close(out[:, 2], xf.view(-1, 32).sum(1).repeat_interleave(32), rtol=1e-5, atol=1e-4)
    across = xf.view(-1, 4, 8).sum(1, keepdim=True).expand(-1, 4, 8).reshape(-1)  # same lane mod 8, per warp
    torch.testing.assert_close(out[:, 3], across, rtol=1e-5, atol=1e-4)
    pinned = torch.zeros(8).pin_memory()
    assert mod.check_sizes(pinned, 8) == 8
    line = next(i for i, t in enumerate((COMPAT / "aliases.cuh").read_text().splitlines(), 1) if "@line:check" in t)
    with pytest.raises(RuntimeError, match=rf"^Panic at aliases\.cuh:{line}: too small: 8$"):
        mod.check_sizes(pinned, 9)


@pytest.mark.gpu
def test_gpu_sglang_namespace_layout():
    mod = jit_kernel.load_jit(
        "compat_sglang_namespace",
        cuda_files=[str(COMPAT / "sglang_namespace.cuh")],
        cuda_wrappers=[("scale_f16", "sglang::ScaleRows<fp16_t>::run")],
    )
    x = torch.randn(1000, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    mod.scale_f16(x, y)
    assert torch.equal(y, x * 2)


@pytest.mark.gpu
@pytest.mark.parametrize(("ctype", "dim"), NORM_CONFIGS, ids=lambda v: str(v))
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_gpu_impl_norm(ctype, dim, rows):
    mod = _load("norm", "norm.cuh", [(f"rmsnorm_{t}_{d}", f"compat_norm::rmsnorm<{t}, {d}>") for t, d in NORM_CONFIGS])
    dtype = torch.float16 if ctype == "fp16_t" else torch.bfloat16
    x = torch.randn(rows, dim, device="cuda", dtype=dtype) * 3
    w = torch.randn(dim, device="cuda", dtype=dtype)
    y = torch.empty_like(x)
    getattr(mod, f"rmsnorm_{ctype}_{dim}")(x, w, y, 1e-6)
    xf = x.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_gpu_ffi_helpers(device):
    mod = _load("ffi", "ffi.cuh", [(f, f"compat_ffi::{f}") for f in FFI_FUNCS])
    like = torch.zeros(3, dtype=torch.int32, device=device)
    t = mod.empty_2x3(like)
    assert (t.shape, t.dtype, t.device.type) == ((2, 3), torch.float32, device)
    filled = mod.empty_like_filled(like)
    assert filled.shape == like.shape and filled.dtype == like.dtype and filled.device == like.device
    if device == "cpu":
        assert filled.tolist() == [7, 7, 7]
    assert mod.empty_typed(like, 5).dtype == torch.int64
    ws = mod.workspace(like, 100)
    assert (ws.shape, ws.dtype, ws.device.type) == ((100,), torch.uint8, device)
    assert mod.workspace(like, 0) is None
    x = torch.arange(12, dtype=torch.float32, device=device)
    view = mod.blob_view(x, 3, 4)
    assert view.data_ptr() == x.data_ptr() and view.stride() == (1, 3)
    assert torch.equal(view, x.view(4, 3).t())
    tail = mod.blob_like(x)
    assert tail.data_ptr() == x.data_ptr() + 4 and tail.shape == x.shape
    assert torch.equal(tail[:-1], x[1:])
    before = mod.deleted_count()
    # No torch argument: tvm-ffi returns its own Tensor; torch takes it over through DLPack.
    owned = torch.from_dlpack(mod.blob_owned(6))
    assert owned.tolist() == list(range(6))
    del owned
    assert mod.deleted_count() == before + 1
    assert mod.counter_twice(40) == 42
