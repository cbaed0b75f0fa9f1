"""Kernels written for sglang.jit_kernel's headers build unchanged against ours.

The fixtures under tests/cpp/compat/ are our own kernels written the way sglang's kernels spell the
library: its aliases (`device::kMaxVecBytes`, `kDLGPU`, `warp::kFullMask`, width-first
`warp::reduce_sum<16>`, `SGL_ARCH_*`, `host::Error` / `SGL_PANIC` / `CHECK_HOST`, ...), the
`namespace sglang` layout of 0.5.23, and the two real capabilities `impl/norm.cuh` and `ffi.h`.
Every unit is compiled once, in parallel, by a module fixture (as in test_headers.py, whose `Group`
proves the sm_90 units by each one's device pass alone and one full compile of them all); the `gpu`
tests run the norm and ffi fixtures. tools/check_seed_headers.py does the same for whole releases.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import jit_kernel
from test_headers import TVM_FFI_INCLUDES, Group, Result, Unit, check_group, compile_all, export, once_per_session

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

CAPS_FUNCS = [
    ("warp_scan_f32", "compat_caps::warp_scan<fp32_t>"),
    ("warp_scan_i32", "compat_caps::warp_scan<int32_t>"),
    ("fast_div", "compat_caps::fast_div"),
    ("activations", "compat_caps::activations"),
    ("reduce_rows", "compat_caps::reduce_rows"),
    ("copy_rows_576", "compat_caps::copy_rows<576>"),
    ("copy_rows_1024", "compat_caps::copy_rows<1024>"),
    ("check_aligned", "compat_caps::check_aligned"),
    ("smem_copy", "compat_caps::smem_copy"),
]

# The sm_90 units as load_jit builds them, proven together (see test_headers.Group).
GROUP = Group(
    "sm_90 units",
    (
        # Every alias, as our load_jit builds it (no -DSGL_CUDA_ARCH: the headers derive it).
        Unit("aliases", "nvcc", ALIASES),
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
        # The capabilities of 0.5.23 beyond renames (warp scans, fast_mod_div_u32_t, ensure_alignment, ...).
        Unit("capabilities", "nvcc", include("capabilities.cuh") + "".join(export(n, f) for n, f in CAPS_FUNCS)),
        Unit("ffi.h", "nvcc", include("ffi.cuh") + "".join(export(f, f"compat_ffi::{f}") for f in FFI_FUNCS)),
    ),
)

UNITS = [
    *GROUP.units,
    # ... and as sglang's load_jit builds it: it passes -DSGL_CUDA_ARCH itself. The device pass (whose
    # front end reads the host code too): the host pass is the text of "aliases", SGL_CUDA_ARCH 900 in both.
    Unit("aliases@SGL_CUDA_ARCH", "nvcc", ALIASES, extra_flags=("-DSGL_CUDA_ARCH=900",), device_only=True),
    # Two archs: SGL_CUDA_ARCH is the lowest in both passes, so host and device agree on kMaxVecBytes.
    Unit(
        "aliases@sm_80+sm_90",
        "nvcc",
        ALIASES + "static_assert(SGL_CUDA_ARCH == 800 && !SGL_ARCH_HOPPER_OR_GREATER);\n",
        extra_flags=("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"),
    ),
    # ffi.h is host-only: plain g++ too (test_headers.py covers it alone; here with its users).
    Unit("ffi.h@g++", "g++", include("ffi.cuh") + "".join(export(f, f"compat_ffi::{f}") for f in FFI_FUNCS)),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    return once_per_session(
        tmp_path_factory,
        "test_seed_header_compat",
        lambda: compile_all(UNITS, [GROUP], tmp_path_factory.mktemp("compat")),
    )


@pytest.mark.slow
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_compat_unit_compiles(results, unit):
    if unit.name not in results:
        pytest.skip(f"{unit.compiler} not found")
    result = results[unit.name]
    assert result.returncode == 0, f"{unit.name} failed to compile:\n{result.output}"


@pytest.mark.slow
def test_sm90_units_compile_together(results):
    check_group(results, GROUP)


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


@pytest.fixture(scope="module")
def caps():
    return _load("capabilities", "capabilities.cuh", CAPS_FUNCS)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_gpu_warp_scans(caps, dtype):
    x = torch.randint(-50, 50, (512,), device="cuda").to(dtype)  # small integers: every sum is exact
    out = torch.full((512, 8), -12345, device="cuda", dtype=dtype)
    (caps.warp_scan_f32 if dtype == torch.float32 else caps.warp_scan_i32)(x, out)
    xl = x.long()
    lane = torch.arange(512, device="cuda") % 32
    warps = xl.view(-1, 32)
    expected = torch.stack(
        [
            warps.cumsum(1).view(-1),
            xl.view(-1, 8).cumsum(1).view(-1),
            warps.cummax(1).values.view(-1),
            xl.view(-1, 16).cummin(1).values.view(-1),
            warps.flip(1).cumsum(1).flip(1).view(-1),
            xl.view(-1, 8)[:, 3:4].expand(-1, 8).reshape(-1),
            lane % 8,
        ],
        dim=1,
    )
    assert torch.equal(out[:, :7].long(), expected)
    elected = out[:, 7].long().view(-1, 32)
    assert torch.equal(elected.sum(1), torch.ones(16, dtype=torch.long, device="cuda"))
    assert ((elected == 0) | (elected == 1)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("divisor", [1, 2, 3, 7, 100, 641, 1000003, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 1])
def test_gpu_fast_mod_div(caps, divisor):
    edges = [0, 1, divisor - 1, divisor, divisor + 1, 2 * divisor - 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
    n = torch.cat(
        [
            torch.tensor([e for e in edges if 0 <= e < 2**32], dtype=torch.int64),
            torch.randint(0, 2**32, (1 << 16,), dtype=torch.int64),
        ]
    ).cuda()
    out = torch.full((n.numel(), 2), -7, device="cuda", dtype=torch.int64)
    caps.fast_div(n, out, divisor)
    assert torch.equal(out[:, 0], n // divisor)
    assert torch.equal(out[:, 1], n % divisor)


@pytest.mark.gpu
def test_gpu_fast_activations(caps):
    x = torch.cat([torch.linspace(-90, 90, 4001), torch.randn(4000) * 4, torch.tensor([-1e4, 0.0, 19.9, 20.1, 1e4])])
    x = x.cuda()
    out = torch.full((x.numel(), 3), float("nan"), device="cuda")
    caps.activations(x, out)
    xd = x.double()
    sigmoid = torch.sigmoid(xd)
    expected = torch.stack([sigmoid, xd * sigmoid, torch.nn.functional.softplus(xd)], dim=1)
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=2e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_packed_reductions(caps):
    x = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    caps.reduce_rows(x, out)
    xf = x.float()
    torch.testing.assert_close(out[0].float(), xf.sum(0), rtol=8e-3, atol=1e-6)  # fp32 sum, one rounding
    torch.testing.assert_close(out[1].float(), xf.sum(0), rtol=2e-2, atol=2e-2)  # bf16 adds
    assert torch.equal(out[2], x.amax(0))


@pytest.mark.gpu
@pytest.mark.parametrize("row_bytes", [576, 1024])
def test_gpu_warp_row_copy(caps, row_bytes):
    stride = row_bytes + 64
    src = torch.randint(0, 256, (64, stride), device="cuda", dtype=torch.uint8)
    dst = torch.full_like(src, 0xEE)
    getattr(caps, f"copy_rows_{row_bytes}")(src, dst)
    assert torch.equal(dst[:, :row_bytes], src[:, :row_bytes])
    assert (dst[:, row_bytes:] == 0xEE).all()  # nothing past the row written
    # A misaligned view is refused before any launch, naming the argument.
    with pytest.raises(ValueError, match="src"):
        getattr(caps, f"copy_rows_{row_bytes}")(src[:, 1:], dst[:, 1:])


@pytest.mark.gpu
def test_gpu_ensure_alignment(caps):
    x = torch.zeros(4, 64, dtype=torch.uint8)
    caps.check_aligned(x, 16)
    with pytest.raises(ValueError, match=r"Misaligned data pointer"):
        caps.check_aligned(x[:, 1:], 16)
    with pytest.raises(ValueError, match=r"Misaligned stride for dim#0"):
        caps.check_aligned(torch.zeros(4, 72, dtype=torch.uint8)[:, :64], 16)
    caps.check_aligned(torch.zeros(1, 72, dtype=torch.uint8)[:, :64], 16)  # a size-1 dim's stride is unused
    with pytest.raises(ValueError, match="not a power of two"):
        caps.check_aligned(x, 12)


@pytest.mark.gpu
def test_gpu_dynamic_smem_per_device(caps):
    for size in (100 * 1024, 64 * 1024, 200 * 1024):  # above the 48 KiB default; the limit only grows
        src = torch.randint(0, 256, (size,), device="cuda", dtype=torch.uint8)
        dst = torch.zeros_like(src)
        limit = caps.smem_copy(src, dst)
        assert limit >= 200 * 1024
        torch.cuda.synchronize()
        assert torch.equal(dst, src.flip(0))
