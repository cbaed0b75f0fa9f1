"""``jit_kernel.add_constant``: the dev guide's example kernel (``sglang.jit_kernel.add_constant``).

``add_constant(src, constant)`` returns ``src + constant`` for an int32 tensor, as in the seed. It is
the top-level ``jit_kernel.add_constant`` itself, which also takes ``out=`` and CPU tensors. (The
package attribute ``jit_kernel.add_constant`` is both this module and that function: see the
package ``__init__``.)
"""

from __future__ import annotations

from jit_kernel.ops.add_constant import add_constant

__all__ = ["add_constant"]
