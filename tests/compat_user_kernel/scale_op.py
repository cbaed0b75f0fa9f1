"""A user's own kernel package, as SGLang's add-jit-kernel tutorial (``scale``) has one write it, ported
to jit_kernel by changing the import prefix only. It lives outside the package: the kernel source
sits next to this file (tests/test_seed_compat.py copies the tutorial's ``scale.cuh`` here into a
temporary folder together with this module), so ``load_jit`` gets its absolute path.

The factor is a template argument, as in the tutorial: ``numerator / 1000``, one module per value.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from jit_kernel.utils import cache_once, load_jit, make_cpp_args

if TYPE_CHECKING:
    from tvm_ffi.module import Module

KERNEL_SOURCE = Path(__file__).resolve().with_name("scale.cuh")
FACTOR_DENOMINATOR = 1000
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


@cache_once
def _jit_scale_module(dtype: torch.dtype, numerator: int, denominator: int) -> Module:
    args = make_cpp_args(dtype, numerator, denominator)
    return load_jit(
        "user_scale",
        *args,
        cuda_files=[str(KERNEL_SOURCE)],
        cuda_wrappers=[("scale", f"scale<{args}>")],
    )


def scale(src: torch.Tensor, factor: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``src * factor`` into ``out`` (allocated when None), for fp16 / bf16 / fp32 CUDA tensors."""
    assert src.is_cuda, "src must be a CUDA tensor"
    assert src.dtype in SUPPORTED, f"Unsupported dtype {src.dtype}. Supported: float16, bfloat16, float32"
    if out is None:
        out = torch.empty_like(src)
    else:
        assert out.shape == src.shape, "out must have the shape of src"
        assert out.dtype == src.dtype, "out must have the dtype of src"
    module = _jit_scale_module(src.dtype, round(factor * FACTOR_DENOMINATOR), FACTOR_DENOMINATOR)
    module.scale(out, src)
    return out
