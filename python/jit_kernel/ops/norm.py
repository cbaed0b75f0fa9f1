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
    FAST_PATH_MISS,
    NO_KERNELS,
    KernelTable,
    Launch,
    compile_state,
    dynamo_compiling,
    float_dtype,
    kernel_op,
    not_a_tensor,
    rows,
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
# (latency-bound), two specialised launches above, where they are faster (docs/benchmarks.md).
_ONE_LAUNCH_MAX_TOKENS = 256


def _selector(op: str, name: str, fast: frozenset[int]) -> Callable[[torch.dtype, int], tuple[int, str]]:
    """(dtype, D) -> config: the kernel specialised for D in fp16/bf16 where there is one, else the
    generic kernel (0), which takes D at run time. C++ checks D itself."""

    def select(dtype: torch.dtype, d: int) -> tuple[int, str]:
        cpp = float_dtype(op, name, dtype)
        return (d if d in fast and dtype != torch.float32 else 0, cpp)

    return select


# The eager path: (dtype, D) -> kernel, one dict lookup per call.
_RMSNORM_KERNELS = KernelTable(_RMSNORM, "rmsnorm", _selector("rmsnorm", "input", _FAST_HIDDEN))
_FUSED_ADD_KERNELS = {
    False: KernelTable(_RMSNORM, "fused_add", _selector("fused_add_rmsnorm", "input", _FAST_HIDDEN)),
    True: KernelTable(_RMSNORM, "fused_add_cast", _selector("fused_add_rmsnorm", "input", _FAST_HIDDEN)),
}
_FUSED_ADD_ROUND_ONCE = _FUSED_ADD_KERNELS[False]
_ACROSS_HEADS_KERNELS = KernelTable(_RMSNORM, "across_heads", _selector("qknorm_across_heads", "q", _FAST_HIDDEN))
_ACROSS_HEADS_ONE_BY_ONE = KernelTable(_RMSNORM, "rmsnorm", _selector("qknorm_across_heads", "q", _FAST_HIDDEN))
_QKNORM_KERNELS = KernelTable(_QKNORM, "run", _selector("fused_inplace_qknorm", "q", _FAST_HEAD_DIM))
# The eager fast paths (_common.FAST_PATH_MISS) read the tables as dtype -> {D -> kernel}
# (KernelTable.by_dtype), and D as the weight's ``numel()`` rather than the input's ``shape[-1]``
# (which builds a torch.Size, twice the cost): every launcher matches the weight, ``[D]``, against
# the input's last dimension, so a call it accepts has the same key either way, and one it refuses
# goes through the full path, which keys on the input.
_RMSNORM_BY_DTYPE = _RMSNORM_KERNELS.by_dtype
_FUSED_ADD_BY_DTYPE = _FUSED_ADD_ROUND_ONCE.by_dtype
_ACROSS_HEADS_BY_DTYPE = _ACROSS_HEADS_KERNELS.by_dtype
_QKNORM_BY_DTYPE = _QKNORM_KERNELS.by_dtype


def _key(op: str, name: str, t: object, d_dim: int = -1) -> tuple[torch.dtype, int]:
    try:
        return t.dtype, t.shape[d_dim]  # type: ignore[attr-defined]
    except AttributeError:
        not_a_tensor(op, name, t)
    except IndexError:
        raise ValueError(f"{op}: {name} must have at least {-d_dim} dimension(s), got shape {tuple(t.shape)}") from None  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# The ops, declared once (_common.kernel_op): pick the kernel, allocate, reshape. C++ checks every
# tensor rule.


@kernel_op("rmsnorm", out="out")
def _rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    key = _key("rmsnorm", "input", input)
    in_rows = rows("rmsnorm", "input", input)
    if out is None:
        out = input.new_empty(input.shape)
    out_rows = rows_like("rmsnorm", "out", out, input)
    return Launch(_RMSNORM_KERNELS, key, (out_rows, in_rows, weight, eps, enable_pdl), out)


@kernel_op("fused_add_rmsnorm", mutates=("input", "residual"))
def _fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
    cast_x_before_out_mul: bool = False,
) -> Launch:
    op = "fused_add_rmsnorm"
    # Identity lookup: the flag must be a bool (1 or None would pick a rounding silently).
    kernels = _FUSED_ADD_KERNELS.get(cast_x_before_out_mul) if type(cast_x_before_out_mul) is bool else None
    if kernels is None:
        raise TypeError(f"{op}: cast_x_before_out_mul must be a bool, got {type(cast_x_before_out_mul).__name__}")
    key = _key(op, "input", input)
    in_rows = rows(op, "input", input)
    res_rows = rows_like(op, "residual", residual, input)
    return Launch(kernels, key, (in_rows, res_rows, weight, eps, enable_pdl))


@kernel_op("qknorm_across_heads", mutates=("q", "k"))
def _qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> Launch | tuple[Launch, ...]:
    op = "qknorm_across_heads"
    key = _key(op, "q", q)
    dk = _key(op, "k", k)[1]
    # C++ checks that q and k are [N, H*D] (the same N), whichever launch runs.
    if key[1] == dk or q.shape[0] <= _ONE_LAUNCH_MAX_TOKENS:
        # Different widths share no specialised kernel: the generic one (0) takes both.
        return Launch(
            _ACROSS_HEADS_KERNELS, key if key[1] == dk else (key[0], 0), (q, k, q_weight, k_weight, eps, enable_pdl)
        )
    # With many tokens, two specialised in-place launches beat one generic launch (docs/benchmarks.md).
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same number of tokens, got {q.shape[0]} and {k.shape[0]}")
    return (
        Launch(_ACROSS_HEADS_ONE_BY_ONE, key, (q, q, q_weight, eps, enable_pdl)),
        Launch(_ACROSS_HEADS_ONE_BY_ONE, (k.dtype, dk), (k, k, k_weight, eps, enable_pdl)),
    )


@kernel_op("fused_inplace_qknorm", mutates=("q", "k"))
def _fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> Launch:
    return Launch(_QKNORM_KERNELS, _key("fused_inplace_qknorm", "q", q), (q, k, q_weight, k_weight, eps, enable_pdl))


# ---------------------------------------------------------------------------------------------
# Public API. ``enable_pdl``: launch with programmatic dependent launch; ``None`` (the default)
# turns it on for sm_90+ devices (decided in C++ per device: ``host::runtime::resolve_pdl``).


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """RMSNorm of the last dimension: ``out = input * rsqrt(mean(input^2) + eps) * weight``.

    ``input`` is ``[..., D]`` in fp16, bf16 or fp32 on a CUDA device, with a unit last stride (rows
    may be strided); ``weight`` is ``[D]`` of the same dtype. ``out`` may be ``input`` (in place).
    """
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        return _rmsnorm.traced(input, weight, eps, out, enable_pdl)
    try:  # the fast path (_common.FAST_PATH_MISS), for the rows the kernel takes as they are
        kernel = _RMSNORM_BY_DTYPE.get(input.dtype, NO_KERNELS).get(weight.numel()) if input.ndim == 2 else None
        if kernel is not None:
            if out is None:
                out = torch.empty_like(input)
            kernel(out, input, weight, eps, enable_pdl)
            return out
    except FAST_PATH_MISS:
        pass
    return _rmsnorm(input, weight, eps, out, enable_pdl)


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
    *,
    cast_x_before_out_mul: bool = False,
) -> None:
    """In place: ``residual = input + residual`` (added in fp32, stored in the dtype), then
    ``input = rmsnorm(residual) * weight``.

    ``cast_x_before_out_mul=True``: SGLang's flag of that name, for Hugging Face parity
    (``weight * x.to(dtype)``): the normalised value is rounded to the dtype before the weight
    multiply, and it is normalised from the unrounded fp32 sum (the stored residual is still
    rounded). The default rounds once, after the weight multiply."""
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        _fused_add_rmsnorm.traced(input, residual, weight, eps, enable_pdl, cast_x_before_out_mul)
        return
    if cast_x_before_out_mul is False:
        try:  # the fast path (_common.FAST_PATH_MISS), for the rows the kernel takes as they are
            kernel = _FUSED_ADD_BY_DTYPE.get(input.dtype, NO_KERNELS).get(weight.numel()) if input.ndim == 2 else None
            if kernel is not None:
                kernel(input, residual, weight, eps, enable_pdl)
                return
        except FAST_PATH_MISS:
            pass
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, cast_x_before_out_mul)


def fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """Per-head RMSNorm in place, in one launch: q ``[N, Hq, D]``, k ``[N, Hk, D]`` (token and
    head strides allowed, unit last stride), weights ``[D]``."""
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        _fused_inplace_qknorm.traced(q, k, q_weight, k_weight, eps, enable_pdl)
        return
    try:  # the fast path (_common.FAST_PATH_MISS)
        kernel = _QKNORM_BY_DTYPE.get(q.dtype, NO_KERNELS).get(q_weight.numel())
        if kernel is not None:
            kernel(q, k, q_weight, k_weight, eps, enable_pdl)
            return
    except FAST_PATH_MISS:
        pass
    _fused_inplace_qknorm(q, k, q_weight, k_weight, eps, enable_pdl)


def resolve_qknorm_kernel(head_dim: int, dtype: torch.dtype) -> Callable[..., None]:
    """Load the kernel :func:`fused_inplace_qknorm` uses for ``head_dim`` and ``dtype`` (prebuilt or
    JIT-compiled); raises if it cannot be had. For ``jit_kernel.norm.can_use_fused_inplace_qknorm``."""
    return _QKNORM_KERNELS[dtype, head_dim]


def qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    enable_pdl: bool | None = None,
) -> None:
    """RMSNorm of whole rows in place, in one launch: q ``[N, Hq*D]`` with ``q_weight`` ``[Hq*D]``,
    k ``[N, Hk*D]`` with ``k_weight`` ``[Hk*D]``."""
    if dynamo_compiling() or compile_state._is_compiling_flag:  # is_compiling(), inlined (_common)
        _qknorm_across_heads.traced(q, k, q_weight, k_weight, eps, enable_pdl)
        return
    try:  # the fast path (_common.FAST_PATH_MISS) of the one launch: equal widths, or few tokens
        shape, dk = q.shape, k.shape[-1]
        one_launch = shape[0] <= _ONE_LAUNCH_MAX_TOKENS or shape[-1] == dk
        by_d = _ACROSS_HEADS_BY_DTYPE.get(q.dtype, NO_KERNELS)
        kernel = by_d.get(shape[-1] if shape[-1] == dk else 0) if one_launch else None
        if kernel is not None:
            kernel(q, k, q_weight, k_weight, eps, enable_pdl)
            return
    except FAST_PATH_MISS:
        pass
    _qknorm_across_heads(q, k, q_weight, k_weight, eps, enable_pdl)
