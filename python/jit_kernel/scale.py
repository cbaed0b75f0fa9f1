"""``jit_kernel.scale``: the tutorial's ``scale`` op (``sglang.jit_kernel.scale``).

``scale(src, factor, out=None)`` returns ``src * factor`` (fp16, bf16 or fp32 CUDA tensors), into
``out`` when given, as in the tutorial. It is the top-level ``jit_kernel.scale`` itself. Unlike the
tutorial's version, ``factor`` is exact (the tutorial rounded it to 3 decimals) and bad inputs raise
TypeError/ValueError (the tutorial asserted). (The package attribute ``jit_kernel.scale`` is both
this module and that function: see the package ``__init__``.)
"""

from __future__ import annotations

from jit_kernel.ops.scale import scale

__all__ = ["scale"]
