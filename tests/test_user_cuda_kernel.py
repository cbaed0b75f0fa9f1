"""Issue "done means": a user's own .cu kernel, in their own folder, written to the seeds' guide
against the sgl_kernel headers, builds with load_jit and runs on the GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from jit_kernel import load_jit, make_cpp_args
from jit_kernel.engine import cache
from jit_kernel.engine.jit import make_build_request

SEEDS = Path(__file__).resolve().parent / "cpp" / "seeds"


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    """The seeds' tutorial kernels, copied into a folder outside the package."""
    folder = tmp_path / "my_kernels"
    folder.mkdir()
    for name in ("add_constant.cuh", "scale.cuh"):
        shutil.copy(SEEDS / name, folder / name.replace(".cuh", ".cu"))
    return folder


def _add_constant_build(folder: Path, constant: int) -> dict[str, object]:
    args = make_cpp_args(constant)
    return {
        "cuda_files": [str(folder / "add_constant.cu")],
        "cuda_wrappers": [("add_constant", f"add_constant<{args}>")],
    }


def test_user_kernel_compiles_and_loads_without_a_gpu(user_folder: Path) -> None:
    """On any machine: nvcc builds the user's kernel for sm_90a and the module dlopens."""
    request = make_build_request("user_add_constant", 3, cuda_arch="9.0a", **_add_constant_build(user_folder, 3))  # type: ignore[arg-type]
    module = cache.load_or_build(request)
    assert module.implements_function("add_constant")


@pytest.mark.gpu
def test_user_add_constant_runs_on_the_gpu(user_folder: Path) -> None:
    module = load_jit("user_add_constant", "5", **_add_constant_build(user_folder, 5))  # type: ignore[arg-type]
    src = torch.randint(-(2**20), 2**20, (100_003,), dtype=torch.int32, device="cuda")
    dst = torch.full_like(src, -7)
    module.add_constant(dst, src)
    torch.cuda.synchronize()
    assert torch.equal(dst, src + 5)
    with pytest.raises(TypeError, match=r"(?s)Tensor match failed.*add_constant\.cu:\d+.*Dtype mismatch"):
        module.add_constant(dst.float(), src)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("size", [1, 7, 8, 4097, 1 << 20])
def test_user_scale_kernel_runs_on_the_gpu(user_folder: Path, dtype: torch.dtype, size: int) -> None:
    args = make_cpp_args(dtype, 2500, 1000)
    module = load_jit(
        "user_scale", *args, cuda_files=[str(user_folder / "scale.cu")], cuda_wrappers=[("scale", f"scale<{args}>")]
    )
    src = torch.randn(size, dtype=dtype, device="cuda")
    out = torch.full_like(src, float("nan"))
    module.scale(out, src)
    torch.cuda.synchronize()
    expected = (src.double() * 2.5).to(dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


_PER_DEVICE_PROBE = """\
#include <sgl_kernel/runtime.cuh>

#include <cstdint>

namespace probe {
// The first answer recorded for device 0 by this module's copy of a per-device cache.
inline int64_t first_answer(int64_t answer) {
  struct Tag;
  return host::runtime::detail::per_device<Tag>(0, {}, [&](int) { return static_cast<int>(answer); });
}
}  // namespace probe
"""


@pytest.mark.parametrize("visibility", [(), ("-Xcompiler", "-fvisibility=default")], ids=["ours", "default"])
def test_modules_built_from_the_same_header_keep_their_own_per_device_caches(
    tmp_path: Path, visibility: tuple[str, ...]
) -> None:
    """Two modules (or a module and the prebuilt library) that instantiate the same header code each
    keep their own copy of its per-device caches. With default visibility a function-local static
    is an STB_GNU_UNIQUE symbol, one copy in the process, and a per-device cache that guards a
    kernel attribute set on one module's copy of a kernel would skip setting it on the other's. Our
    builds hide everything but the exports, and runtime.cuh hides its caches itself, so a module
    built with default visibility (a kernel author's own build) keeps its own too."""
    source = tmp_path / "probe.cuh"
    source.write_text(_PER_DEVICE_PROBE)
    build = {
        "cuda_files": [str(source)],
        "cuda_wrappers": [("first_answer", "probe::first_answer")],
        "extra_cuda_cflags": list(visibility),
    }
    first, second = (
        cache.load_or_build(make_build_request(f"{name}_{len(visibility)}", cuda_arch="9.0a", **build))  # type: ignore[arg-type]
        for name in ("probe_first", "probe_second")
    )
    assert first.first_answer(1) == 1
    assert second.first_answer(2) == 2
    assert first.first_answer(3) == 1
