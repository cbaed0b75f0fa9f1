"""RMSNorm ops: ``rmsnorm``, ``fused_add_rmsnorm``, ``fused_inplace_qknorm``, ``qknorm_across_heads``.

Semantics (all in fp32, one rounding at the end): ``out = T(x * rsqrt(mean(x^2) + eps) * weight)``.
``fused_add_rmsnorm`` first stores ``residual = T(input + residual)`` and normalises that stored
value, so that ``input`` ends up exactly ``rmsnorm(residual_new, weight)``. With
``cast_x_before_out_mul=True`` it rounds as SGLang's flag of that name (Hugging Face's
``weight * x.to(dtype)``): with ``s = float(input) + float(residual)`` unrounded, ``residual = T(s)``
and ``input = T(float(T(s * rsqrt(mean(s^2) + eps))) * weight)``, the normalised value rounded to the
dtype before the weight multiply (the ``fused_add_cast`` export; in fp32 both forms are the same).

Any D works: hidden sizes in :data:`~jit_kernel.engine.families.NORM_HIDDEN_SIZES` (head dims in
``QKNORM_HEAD_DIMS``) in fp16/bf16 use kernels specialised for that size; every other D, and fp32,
use generic kernels that take D at run time (one pass with the row in registers for rows of
aligned 16-byte vectors up to 2048 vectors, two passes beyond that or for unaligned rows).

Every op is also registered as ``torch.ops.jit_kernel.*`` (with fake implementations and the
mutated arguments declared); the functions here switch to those under ``torch.compile`` so a
compiled graph has no break, and call the kernels directly otherwise (lower overhead).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import NORM_HIDDEN_SIZES, QKNORM, QKNORM_HEAD_DIMS, RMSNORM
from jit_kernel.ops._common import (
    KernelTable,
    Launch,
    float_dtype,
    kernel_op,
    not_a_tensor,
    rows,
    rows_and_out,
    rows_like,
)

_RMSNORM = Dispatcher(RMSNORM)
_QKNORM = Dispatcher(QKNORM)
_FAST_HIDDEN = frozenset(NORM_HIDDEN_SIZES)
# The widest row the kernels take: C++ enforces it (kMaxDim, csrc/norm/common.cuh); the seed's
# capability queries (jit_kernel.norm.can_use_*) answer from it without a call.
MAX_HIDDEN = 1 << 20
_FAST_HEAD_DIM = frozenset(QKNORM_HEAD_DIMS)
# qknorm_across_heads with q and k of different widths: one generic launch up to this many tokens
# (latency-bound), two specialised launches above (docs/design/norm.md).
_ONE_LAUNCH_MAX_TOKENS = 256


def _selector(op: str, name: str, fast: frozenset[int]) -> Callable[[torch.dtype, int], tuple[int, str]]:
    """(dtype, D) -> config: the kernel specialised for D in fp16/bf16 where there is one, else the
    generic kernel (0), which takes D at run time. C++ checks D itself."""

    def select(dtype: torch.dtype, d: int) -> tuple[int, str]:
        cpp = float_dtype(op, name, dtype)
        return (d if d in fast and dtype != torch.float32 else 0, cpp)

    return select


# (dtype, D) -> kernel. The plans key 2-D calls on the weight's ``numel()`` rather than the input's
# ``shape[-1]`` (which builds a torch.Size, twice the cost): every launcher matches the weight,
# ``[D]``, against the input's last dimension, so a call it accepts has the same key either way.
_RMSNORM_KERNELS = KernelTable(_RMSNORM, "rmsnorm", _selector("rmsnorm", "input", _FAST_HIDDEN))
_FUSED_ADD_KERNELS = {
    False: KernelTable(_RMSNORM, "fused_add", _selector("fused_add_rmsnorm", "input", _FAST_HIDDEN)),
    True: KernelTable(_RMSNORM, "fused_add_cast", _selector("fused_add_rmsnorm", "input", _FAST_HIDDEN)),
}
_ACROSS_HEADS_KERNELS = KernelTable(_RMSNORM, "across_heads", _selector("qknorm_across_heads", "q", _FAST_HIDDEN))
_ACROSS_HEADS_ONE_BY_ONE = KernelTable(_RMSNORM, "rmsnorm", _selector("qknorm_across_heads", "q", _FAST_HIDDEN))
_QKNORM_KERNELS = KernelTable(_QKNORM, "run", _selector("fused_inplace_qknorm", "q", _FAST_HEAD_DIM))


def _key(op: str, name: str, t: object, d_dim: int = -1) -> tuple[torch.dtype, int]:
    try:
        return t.dtype, t.shape[d_dim]  # type: ignore[attr-defined]
    except AttributeError:
        not_a_tensor(op, name, t)
    except IndexError:
        raise ValueError(f"{op}: {name} must have at least {-d_dim} dimension(s), got shape {tuple(t.shape)}") from None  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# The ops, declared once (_common.kernel_op): pick the kernel, allocate, reshape. C++ checks every
# tensor rule. ``enable_pdl``: launch with programmatic dependent launch; ``None`` (the default)
# turns it on for sm_90+ devices (decided in C++ per device: ``host::runtime::resolve_pdl``).


@kernel_op("rmsnorm", out="out")
def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    """RMSNorm of the last dimension: ``out = input * rsqrt(mean(input^2) + eps) * weight``.

    ``input`` is ``[..., D]`` in fp16, bf16 or fp32 on a CUDA device, with a unit last stride (rows
    may be strided); ``weight`` is ``[D]`` of the same dtype. ``out`` may be ``input`` (in place).
    """
    if input.ndim == 2:  # the rows the kernel takes as they are
        if out is None:
            out = torch.empty_like(input)
        return _RMSNORM_KERNELS, (input.dtype, weight.numel()), (out, input, weight, eps, enable_pdl), out
    key = _key("rmsnorm", "input", input)
    in_rows, out, out_rows = rows_and_out("rmsnorm", input, out)
    return _RMSNORM_KERNELS, key, (out_rows, in_rows, weight, eps, enable_pdl), out


@kernel_op("fused_add_rmsnorm", mutates=("input", "residual"))
def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
    *,
    cast_x_before_out_mul: bool = False,
) -> Launch:
    """In place: ``residual = input + residual`` (added in fp32, stored in the dtype), then
    ``input = rmsnorm(residual) * weight``.

    ``cast_x_before_out_mul=True``: SGLang's flag of that name, for Hugging Face parity
    (``weight * x.to(dtype)``): the normalised value is rounded to the dtype before the weight
    multiply, and it is normalised from the unrounded fp32 sum (the stored residual is still
    rounded). The default rounds once, after the weight multiply."""
    # By identity: the flag must be a bool (1 or None would pick a rounding silently).
    if cast_x_before_out_mul is not False and cast_x_before_out_mul is not True:
        raise TypeError(
            f"fused_add_rmsnorm: cast_x_before_out_mul must be a bool, got {type(cast_x_before_out_mul).__name__}"
        )
    if input.ndim == 2:  # each launch names its table as a constant, so its lookup runs in C++ (ops/_site.py)
        args = (input, residual, weight, eps, enable_pdl)
        if cast_x_before_out_mul:
            return _FUSED_ADD_KERNELS[True], (input.dtype, weight.numel()), args, None
        return _FUSED_ADD_KERNELS[False], (input.dtype, weight.numel()), args, None
    kernels = _FUSED_ADD_KERNELS[cast_x_before_out_mul]
    op = "fused_add_rmsnorm"
    key = _key(op, "input", input)
    in_rows = rows(op, "input", input)
    res_rows = rows_like(op, "residual", residual, input)
    return kernels, key, (in_rows, res_rows, weight, eps, enable_pdl), None


@kernel_op("qknorm_across_heads", mutates=("q", "k"))
def qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> Launch | list[Launch]:
    """RMSNorm of whole rows in place, in one launch: q ``[N, Hq*D]`` with ``q_weight`` ``[Hq*D]``,
    k ``[N, Hk*D]`` with ``k_weight`` ``[Hk*D]``."""
    dq, dk = q_weight.numel(), k_weight.numel()
    # C++ checks that q and k are [N, H*D] (the same N) and that the weights match them.
    args = (q, k, q_weight, k_weight, eps, enable_pdl)
    if dq == dk:  # the key as reads of the launch's arguments: looked up in C++ (ops/_site.py)
        return _ACROSS_HEADS_KERNELS, (q.dtype, q_weight.numel()), args, None
    if q.numel() <= _ONE_LAUNCH_MAX_TOKENS * dq:  # q is [N, dq] (C++ checks): N tokens, without a torch.Size
        # Different widths share no specialised kernel: the generic one (0) takes both.
        return _ACROSS_HEADS_KERNELS, (q.dtype, 0), args, None
    # With many tokens, two specialised in-place launches, one for q and one for k (docs/design/norm.md).
    op = "qknorm_across_heads"
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same number of tokens, got {q.shape[0]} and {k.shape[0]}")
    return [
        (_ACROSS_HEADS_ONE_BY_ONE, _key(op, "q", q), (q, q, q_weight, eps, enable_pdl), None),
        (_ACROSS_HEADS_ONE_BY_ONE, _key(op, "k", k), (k, k, k_weight, eps, enable_pdl), None),
    ]


@kernel_op("fused_inplace_qknorm", mutates=("q", "k"))
def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> Launch:
    """Per-head RMSNorm in place, in one launch: q ``[N, Hq, D]``, k ``[N, Hk, D]`` (token and
    head strides allowed, unit last stride), weights ``[D]``."""
    return _QKNORM_KERNELS, (q.dtype, q_weight.numel()), (q, k, q_weight, k_weight, eps, enable_pdl), None


def resolve_qknorm_kernel(head_dim: int, dtype: torch.dtype) -> Callable[..., None]:
    """Load the kernel :func:`fused_inplace_qknorm` uses for ``head_dim`` and ``dtype`` (prebuilt or
    JIT-compiled); raises if it cannot be had. For ``jit_kernel.norm.can_use_fused_inplace_qknorm``."""
    return _QKNORM_KERNELS[dtype, head_dim]
