"""RMSNorm ops: ``rmsnorm``, ``fused_add_rmsnorm``, ``fused_inplace_qknorm``, ``qknorm_across_heads``.

Semantics (all in fp32, one rounding at the end): ``out = T(x * rsqrt(mean(x^2) + eps) * weight)``.
``fused_add_rmsnorm`` first stores ``residual = T(input + residual)`` and normalises that stored
value, so that ``input`` ends up exactly ``rmsnorm(residual_new, weight)``. With
``cast_x_before_out_mul=True`` it rounds as SGLang's flag of that name (Hugging Face's
``weight * x.to(dtype)``): with ``s = float(input) + float(residual)`` unrounded, ``residual = T(s)``
and ``input = T(float(T(s * rsqrt(mean(s^2) + eps))) * weight)``, the normalised value rounded to the
dtype before the weight multiply (the ``fused_add_cast`` export; in fp32 both forms are the same).

Any D works: hidden sizes in :data:`~jit_kernel.families.NORM_HIDDEN_SIZES` (head dims in
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

from jit_kernel.dispatch import Dispatcher
from jit_kernel.families import NORM_HIDDEN_SIZES, QKNORM, QKNORM_HEAD_DIMS, RMSNORM
from jit_kernel.ops._common import CPP_DTYPE, check_cuda, check_last_stride, check_like, check_pdl, resolve_pdl

_RMSNORM = Dispatcher(RMSNORM)
_QKNORM = Dispatcher(QKNORM)
MAX_HIDDEN = 1 << 20
_FAST_HIDDEN = frozenset(NORM_HIDDEN_SIZES)
# qknorm_across_heads with q and k of different widths: one generic launch up to this many tokens
# (latency-bound), two specialised launches above (H100, (4096, 1024) bf16: the same time at 256
# tokens; at 1024 / 4096 / 16384 tokens one launch takes 7.4 / 36.0 / 144.1 us, two 7.1 / 30.6 /
# 121.6 us).
_ONE_LAUNCH_MAX_TOKENS = 256
_FAST_HEAD_DIM = frozenset(QKNORM_HEAD_DIMS)


def _eps(op: str, eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, int | float):
        raise TypeError(f"{op}: eps must be a float, got {type(eps).__name__}")
    if not eps >= 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")
    return float(eps)


def _rows(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` -> ``[rows, D]`` without copying (rows may be strided)."""
    check_last_stride(op, name, t)
    if t.dim() == 2:
        return t
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least one dimension")
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(
            f"{op}: the leading dimensions of {name} must collapse into rows with one stride, "
            f"got shape {tuple(t.shape)} strides {t.stride()}"
        ) from None


def _hidden(op: str, name: str, d: int) -> int:
    if not 1 <= d <= MAX_HIDDEN:
        raise ValueError(f"{op}: the last dimension of {name} must be in [1, {MAX_HIDDEN}], got {d}")
    return d


def _weight(op: str, name: str, weight: object, ref: torch.Tensor, d: int, ref_name: str) -> None:
    check_like(op, name, weight, ref, ref_name)
    if weight.shape != (d,):
        raise ValueError(f"{op}: {name} must have shape ({d},) to match {ref_name}, got {tuple(weight.shape)}")
    # A [D] tensor with a non-unit stride: the kernels read it as contiguous.
    if d > 1 and weight.stride(0) != 1:
        raise ValueError(f"{op}: {name} must be contiguous, got stride {weight.stride()}")


def _config(d: int, dtype: torch.dtype, fast: frozenset[int]) -> tuple[int, str]:
    return (d if d in fast and dtype != torch.float32 else 0, CPP_DTYPE[dtype])


# ---------------------------------------------------------------------------------------------
# Direct implementations (validate, then call the kernel).


def _rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None,
    enable_pdl: bool | None,
    run: bool = True,
) -> torch.Tensor:
    op = "rmsnorm"
    check_pdl(op, enable_pdl)
    check_cuda(op, "input", input)
    eps = _eps(op, eps)
    rows = _rows(op, "input", input)
    d = _hidden(op, "input", input.shape[-1])
    _weight(op, "weight", weight, input, d, "input")
    if out is None:
        out = torch.empty(input.shape, dtype=input.dtype, device=input.device)
        out_rows = out.view(rows.shape)
    else:
        check_like(op, "out", out, input, "input")
        if out.shape != input.shape:
            raise ValueError(f"{op}: out must have the shape of input {tuple(input.shape)}, got {tuple(out.shape)}")
        out_rows = _rows(op, "out", out)
    if run:
        pdl = resolve_pdl(enable_pdl, input.device)
        _RMSNORM.function("rmsnorm", _config(d, input.dtype, _FAST_HIDDEN))(out_rows, rows, weight, eps, pdl)
    return out


def _fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    enable_pdl: bool | None,
    cast_x_before_out_mul: bool = False,
    run: bool = True,
) -> None:
    op = "fused_add_rmsnorm"
    check_pdl(op, enable_pdl)
    # Identity tests: the default costs one comparison; anything but a bool is refused.
    if cast_x_before_out_mul is False:
        export = "fused_add"
    elif cast_x_before_out_mul is True:
        export = "fused_add_cast"
    else:
        raise TypeError(f"{op}: cast_x_before_out_mul must be a bool, got {type(cast_x_before_out_mul).__name__}")
    check_cuda(op, "input", input)
    eps = _eps(op, eps)
    check_like(op, "residual", residual, input, "input")
    if residual.shape != input.shape:
        raise ValueError(
            f"{op}: residual must have the shape of input {tuple(input.shape)}, got {tuple(residual.shape)}"
        )
    rows = _rows(op, "input", input)
    res_rows = _rows(op, "residual", residual)
    d = _hidden(op, "input", input.shape[-1])
    _weight(op, "weight", weight, input, d, "input")
    if run:
        pdl = resolve_pdl(enable_pdl, input.device)
        _RMSNORM.function(export, _config(d, input.dtype, _FAST_HIDDEN))(rows, res_rows, weight, eps, pdl)


def _qknorm_across_heads(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    enable_pdl: bool | None,
    run: bool = True,
) -> None:
    op = "qknorm_across_heads"
    check_pdl(op, enable_pdl)
    check_cuda(op, "q", q)
    eps = _eps(op, eps)
    check_like(op, "k", k, q, "q")
    if q.dim() != 2 or k.dim() != 2:
        raise ValueError(f"{op}: q and k must be [N, H*D], got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same number of tokens, got {q.shape[0]} and {k.shape[0]}")
    check_last_stride(op, "q", q)
    check_last_stride(op, "k", k)
    dq = _hidden(op, "q", q.shape[1])
    dk = _hidden(op, "k", k.shape[1])
    _weight(op, "q_weight", q_weight, q, dq, "q")
    _weight(op, "k_weight", k_weight, q, dk, "k")
    if not run:
        return
    pdl = resolve_pdl(enable_pdl, q.device)
    if dq == dk or q.shape[0] <= _ONE_LAUNCH_MAX_TOKENS:
        config = _config(dq, q.dtype, _FAST_HIDDEN) if dq == dk else (0, CPP_DTYPE[q.dtype])
        _RMSNORM.function("across_heads", config)(q, k, q_weight, k_weight, eps, pdl)
    else:
        # Different widths (e.g. GQA's q and k) share no specialised kernel; with many tokens, two
        # specialised in-place launches beat one generic launch (H100, 1024 x (4096, 1024): 9.6 us
        # generic, against 4.9 + 2.4 us for the two rmsnorm launches).
        _RMSNORM.function("rmsnorm", _config(dq, q.dtype, _FAST_HIDDEN))(q, q, q_weight, eps, pdl)
        _RMSNORM.function("rmsnorm", _config(dk, k.dtype, _FAST_HIDDEN))(k, k, k_weight, eps, pdl)


def _fused_inplace_qknorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    enable_pdl: bool | None,
    run: bool = True,
) -> None:
    op = "fused_inplace_qknorm"
    check_pdl(op, enable_pdl)
    check_cuda(op, "q", q)
    eps = _eps(op, eps)
    check_like(op, "k", k, q, "q")
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"{op}: q and k must be [N, H, D], got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{op}: q and k must have the same number of tokens, got {q.shape[0]} and {k.shape[0]}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{op}: q and k must have the same head_dim, got {q.shape[2]} and {k.shape[2]}")
    check_last_stride(op, "q", q)
    check_last_stride(op, "k", k)
    d = _hidden(op, "q", q.shape[2])
    _weight(op, "q_weight", q_weight, q, d, "q")
    _weight(op, "k_weight", k_weight, q, d, "q")
    if not run:
        return
    pdl = resolve_pdl(enable_pdl, q.device)
    _QKNORM.function("run", _config(d, q.dtype, _FAST_HEAD_DIM))(q, k, q_weight, k_weight, eps, pdl)


# ---------------------------------------------------------------------------------------------
# torch.library registration: torch.ops.jit_kernel.*


@torch.library.custom_op("jit_kernel::rmsnorm", mutates_args=())
def _rmsnorm_op(input: torch.Tensor, weight: torch.Tensor, eps: float, enable_pdl: bool | None = None) -> torch.Tensor:
    return _rmsnorm(input, weight, eps, None, enable_pdl)


# The fake implementations run the real op's checks (run=False: no kernel), so torch.compile
# rejects at trace time what the eager op rejects, with the same message.
@_rmsnorm_op.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, eps: float, enable_pdl: bool | None = None) -> torch.Tensor:
    return _rmsnorm(input, weight, eps, None, enable_pdl, run=False)


@torch.library.custom_op("jit_kernel::rmsnorm_out", mutates_args=("out",))
def _rmsnorm_out_op(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float, enable_pdl: bool | None = None
) -> None:
    _rmsnorm(input, weight, eps, out, enable_pdl)


@_rmsnorm_out_op.register_fake
def _(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float, enable_pdl: bool | None = None) -> None:
    _rmsnorm(input, weight, eps, out, enable_pdl, run=False)


@torch.library.custom_op("jit_kernel::fused_add_rmsnorm", mutates_args=("input", "residual"))
def _fused_add_rmsnorm_op(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    enable_pdl: bool | None = None,
    cast_x_before_out_mul: bool = False,
) -> None:
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, cast_x_before_out_mul)


@_fused_add_rmsnorm_op.register_fake
def _(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    enable_pdl: bool | None = None,
    cast_x_before_out_mul: bool = False,
) -> None:
    _fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, cast_x_before_out_mul, run=False)


def _qk_op(name: str, impl: Callable[..., None]) -> torch.library.CustomOpDef:
    """Register an in-place q/k norm (both take the same arguments and mutate q and k)."""

    def bound(run: bool) -> Callable[..., None]:
        # One signature for both: torch.library reads the schema from it. The fake runs the checks only.
        def call(
            q: torch.Tensor,
            k: torch.Tensor,
            q_weight: torch.Tensor,
            k_weight: torch.Tensor,
            eps: float,
            enable_pdl: bool | None = None,
        ) -> None:
            impl(q, k, q_weight, k_weight, eps, enable_pdl, run=run)

        return call

    op, fake = bound(True), bound(False)
    registered = torch.library.custom_op(f"jit_kernel::{name}", op, mutates_args=("q", "k"))
    registered.register_fake(fake)
    return registered


_qk_op("fused_inplace_qknorm", _fused_inplace_qknorm)
_qk_op("qknorm_across_heads", _qknorm_across_heads)


# ---------------------------------------------------------------------------------------------
# Public API. ``enable_pdl``: launch with programmatic dependent launch; ``None`` (the default)
# turns it on for sm_90+ devices (see ``jit_kernel.ops._common.resolve_pdl``).


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
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.jit_kernel.rmsnorm(input, weight, eps, enable_pdl)
        torch.ops.jit_kernel.rmsnorm_out(out, input, weight, eps, enable_pdl)
        return out
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
    if torch.compiler.is_compiling():
        torch.ops.jit_kernel.fused_add_rmsnorm(input, residual, weight, eps, enable_pdl, cast_x_before_out_mul)
        return
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
    if torch.compiler.is_compiling():
        torch.ops.jit_kernel.fused_inplace_qknorm(q, k, q_weight, k_weight, eps, enable_pdl)
        return
    _fused_inplace_qknorm(q, k, q_weight, k_weight, eps, enable_pdl)


def resolve_qknorm_kernel(head_dim: int, dtype: torch.dtype) -> Callable[..., None]:
    """Load the kernel :func:`fused_inplace_qknorm` uses for ``head_dim`` and ``dtype`` (prebuilt or
    JIT-compiled); raises if it cannot be had. For ``jit_kernel.norm.can_use_fused_inplace_qknorm``."""
    return _QKNORM.function("run", _config(head_dim, dtype, _FAST_HEAD_DIM))


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
    if torch.compiler.is_compiling():
        torch.ops.jit_kernel.qknorm_across_heads(q, k, q_weight, k_weight, eps, enable_pdl)
        return
    _qknorm_across_heads(q, k, q_weight, k_weight, eps, enable_pdl)
