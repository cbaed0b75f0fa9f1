"""RMSNorm fused with fp8 quantisation of its output, in one launch (csrc/norm/norm_quant.cuh).

Three quantisations, each with and without the residual add before the norm:

- ``rmsnorm_quant_fp8`` / ``fused_add_rmsnorm_quant_fp8``: a static per-tensor scale (a float32
  tensor of one element, read on the device so CUDA graphs see its current value, or a float):
  ``q = fp8(clamp(y * (1 / scale), -max, max))``, max 448 for ``float8_e4m3fn`` (the default) or
  57344 for a ``float8_e5m2`` ``out``; a scale <= 0 gives q 0 (``per_tensor_quant_fp8``'s rule).
- ``rmsnorm_per_token_quant_fp8`` / ``fused_add_rmsnorm_per_token_quant_fp8``: dynamic, one float32
  scale per token, ``s = absmax(y) / 448``, ``q = fp8(y * (1 / s))``; returns ``(q, s [..., 1])``.
- ``rmsnorm_per_token_group_quant_fp8`` / ``fused_add_rmsnorm_per_token_group_quant_fp8``: dynamic,
  one scale per group of 64 or 128 elements of a token, ``s = max(absmax, quant_eps) / 448``
  (rounded up to a power of two with ``scale_ue8m0``), row- or column-major float32 scales, or
  with ``packed_ue8m0=True`` DeepGEMM's packed UE8M0 layout for sm_100 (below).

Here ``y = T(x * rsqrt(mean(x^2) + eps) * weight)`` is the normalised row rounded to the activation
dtype ``T``, exactly as :func:`jit_kernel.rmsnorm` stores it; the fused forms first store
``residual = T(input + residual)`` (in place) and normalise that, as
:func:`jit_kernel.fused_add_rmsnorm` does, but leave ``input`` unchanged (it is only read; the
quantised ``q`` is the output). ``normed_out``, when given, also receives ``y``. Each result is bit
for bit the two-launch composition (``rmsnorm`` or ``fused_add_rmsnorm``, then
``per_tensor_quant_fp8(is_static=True)``, ``per_token_quant_fp8`` or ``per_token_group_quant_fp8``):
the kernels reduce each row as the rmsnorm launch of that shape does and quantise with the
quantisers' own device code. Non-finite values follow those ops (a NaN in a row makes its whole
row NaN; the static quantiser clamps NaN to -448, the dynamic ones keep it).

Packed UE8M0 scales (``packed_ue8m0=True``, or an int32 ``output_s``; needs power-of-two scales,
so ``scale_ue8m0`` is implied): ``output_s`` is int32 ``[..., ceil(groups / 4)]``, column-major
over a ``[ceil(groups / 4), round_up(tokens, 4)]`` buffer (tokens padded to 4 for TMA); group ``g``
of token ``t`` is byte ``g % 4`` (little-endian) of element ``[t, g // 4]``, the biased exponent
``e`` of its scale ``2^(e - 127)``; bytes after a token's last group are 0, padding tokens are not
written. That is the layout SGLang's ``per_token_group_quant_8bit`` and vLLM's
``per_token_group_quant_fp8_packed_for_deepgemm`` produce for DeepGEMM on sm_100.

Inputs: ``input`` (and ``residual``, ``normed_out``) ``[..., D]`` fp16, bf16 or fp32 with a unit
last stride (rows may be strided); ``weight [D]``; fp8 outputs contiguous. Every op is also
``torch.ops.jit_kernel.<name>`` (fake implementations, mutated tensors declared); the functions
switch to those under ``torch.compile``. ``enable_pdl``: programmatic dependent launch (``None``:
on for sm_90+).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import (
    NORM_QUANT_HIDDEN_SIZES,
    RMSNORM_PER_TOKEN_GROUP_QUANT_FP8,
    RMSNORM_PER_TOKEN_QUANT_FP8,
    RMSNORM_QUANT_FP8,
)
from jit_kernel.engine.spec import KernelSpec
from jit_kernel.ops._common import (
    KernelTable,
    Launch,
    float_dtype,
    kernel_op,
    not_a_tensor,
    rows,
    rows_like,
    split_scale,
)
from jit_kernel.ops.token_quant import group_scales

FP8 = torch.float8_e4m3fn
_FAST_HIDDEN = frozenset(NORM_QUANT_HIDDEN_SIZES)

_STATIC = "rmsnorm_quant_fp8"
_STATIC_ADD = "fused_add_rmsnorm_quant_fp8"
_TOKEN = "rmsnorm_per_token_quant_fp8"
_TOKEN_ADD = "fused_add_rmsnorm_per_token_quant_fp8"
_GROUP = "rmsnorm_per_token_group_quant_fp8"
_GROUP_ADD = "fused_add_rmsnorm_per_token_group_quant_fp8"


def _table(spec: KernelSpec, op: str, export: str) -> KernelTable:
    """(dtype, D) -> the family's ``export`` (``run``, or ``fused_add`` with the residual):
    specialised for D in bf16 where the grid has one, else the kernel that takes D at run time (the
    same results either way). C++ checks D itself. The plans key 2-D calls on the weight's
    ``numel()``: every launcher matches the weight ``[D]`` against the input's last dimension."""

    def select(dtype: torch.dtype, d: int) -> tuple[int, str]:
        cpp = float_dtype(op, "input", dtype)
        return (d if d in _FAST_HIDDEN and dtype == torch.bfloat16 else 0, cpp)

    return KernelTable(_DISPATCHERS[spec.family], export, select)


_DISPATCHERS = {
    spec.family: Dispatcher(spec)
    for spec in (RMSNORM_QUANT_FP8, RMSNORM_PER_TOKEN_QUANT_FP8, RMSNORM_PER_TOKEN_GROUP_QUANT_FP8)
}
_KERNELS = {
    _STATIC: _table(RMSNORM_QUANT_FP8, _STATIC, "run"),
    _STATIC_ADD: _table(RMSNORM_QUANT_FP8, _STATIC_ADD, "fused_add"),
    _TOKEN: _table(RMSNORM_PER_TOKEN_QUANT_FP8, _TOKEN, "run"),
    _TOKEN_ADD: _table(RMSNORM_PER_TOKEN_QUANT_FP8, _TOKEN_ADD, "fused_add"),
    _GROUP: _table(RMSNORM_PER_TOKEN_GROUP_QUANT_FP8, _GROUP, "run"),
    _GROUP_ADD: _table(RMSNORM_PER_TOKEN_GROUP_QUANT_FP8, _GROUP_ADD, "fused_add"),
}


def _key(op: str, input: object) -> tuple[torch.dtype, int]:
    if not isinstance(input, torch.Tensor):
        not_a_tensor(op, "input", input)
    if input.dim() == 0:
        raise ValueError(f"{op}: input must have at least one dimension")
    return input.dtype, input.shape[-1]


def _rows_in(
    op: str, input: torch.Tensor, normed_out: torch.Tensor | None, *residual: object
) -> tuple[tuple[torch.Tensor, int], tuple[torch.Tensor, ...], torch.Tensor | None]:
    """The kernel table key, the launcher's input rows (``input``, then ``residual`` for the fused
    launchers, which pass it) and ``normed_out``'s rows (or None)."""
    key = _key(op, input)
    inputs = [rows(op, "input", input)]
    for res in residual:
        if not isinstance(res, torch.Tensor):
            not_a_tensor(op, "residual", res)
        inputs.append(rows_like(op, "residual", res, input))
    normed = None if normed_out is None else rows_like(op, "normed_out", normed_out, input)
    return key, tuple(inputs), normed


def _scale_rows(op: str, output_s: torch.Tensor, input: torch.Tensor, width: int) -> torch.Tensor:
    """``output_s [..., width]`` as rows: Python views it as rows, so it checks the shape itself."""
    expected = (*input.shape[:-1], width)
    if output_s.shape != expected:
        raise ValueError(f"{op}: output_s must have shape {expected}, got {tuple(output_s.shape)}")
    return rows(op, "output_s", output_s)


# ---------------------------------------------------------------------------------------------
# Static per-tensor scale


def _static_out(op: str, input: torch.Tensor, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` (allocated, e4m3, when None) and its rows."""
    if out is None:
        out = input.new_empty(input.shape, dtype=FP8)
    return out, rows_like(op, "out", out, input)


_STATIC_KERNELS, _STATIC_ADD_KERNELS = _KERNELS[_STATIC], _KERNELS[_STATIC_ADD]


@kernel_op(_STATIC, out="out", mutates=("normed_out",))
def _rmsnorm_quant(
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    scale_value: float | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2:  # the rows the kernel takes as they are
        if out is None:
            out = torch.empty_like(input, dtype=FP8)
        args = (out, normed_out, input, weight, scale, scale_value, eps, enable_pdl)
        return _STATIC_KERNELS, (input.dtype, weight.numel()), args, out
    key, inputs, normed = _rows_in(_STATIC, input, normed_out)
    out, out_rows = _static_out(_STATIC, input, out)
    return _STATIC_KERNELS, key, (out_rows, normed, *inputs, weight, scale, scale_value, eps, enable_pdl), out


@kernel_op(_STATIC_ADD, out="out", mutates=("residual", "normed_out"))
def _fused_add_rmsnorm_quant(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
    scale_value: float | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2:  # the rows the kernel takes as they are
        if out is None:
            out = torch.empty_like(input, dtype=FP8)
        args = (out, normed_out, input, residual, weight, scale, scale_value, eps, enable_pdl)
        return _STATIC_ADD_KERNELS, (input.dtype, weight.numel()), args, out
    key, inputs, normed = _rows_in(_STATIC_ADD, input, normed_out, residual)
    out, out_rows = _static_out(_STATIC_ADD, input, out)
    return _STATIC_ADD_KERNELS, key, (out_rows, normed, *inputs, weight, scale, scale_value, eps, enable_pdl), out


def rmsnorm_quant_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | float,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``out = fp8(clamp(rmsnorm(input, weight, eps) * (1 / scale), -max, max))`` in one launch: bit
    for bit :func:`jit_kernel.rmsnorm` then ``per_tensor_quant_fp8(..., is_static=True)``.

    ``scale``: a float32 CUDA tensor of one element (read on the device) or a float. ``out``:
    ``float8_e4m3fn`` (allocated when None) or ``float8_e5m2``, ``input``'s shape. ``normed_out``:
    also receives the normalised row in ``input``'s dtype. Returns ``out``."""
    s, value = split_scale(_STATIC, "scale", scale)
    return _rmsnorm_quant(input, weight, s, value, eps, out, normed_out, enable_pdl)


def fused_add_rmsnorm_quant_fp8(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | float,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``residual = input + residual`` (in place, rounded to the dtype), then ``out =
    fp8(clamp(rmsnorm(residual, weight, eps) * (1 / scale), -max, max))``, in one launch: bit for
    bit :func:`jit_kernel.fused_add_rmsnorm` then ``per_tensor_quant_fp8(..., is_static=True)``.
    ``input`` is left unchanged (``fused_add_rmsnorm`` overwrites it with the normalised row; pass
    ``normed_out=input`` for that). Arguments as :func:`rmsnorm_quant_fp8`. Returns ``out``."""
    s, value = split_scale(_STATIC_ADD, "scale", scale)
    return _fused_add_rmsnorm_quant(input, residual, weight, s, value, eps, out, normed_out, enable_pdl)


# ---------------------------------------------------------------------------------------------
# Dynamic per-token scales

_TOKEN_KERNELS, _TOKEN_ADD_KERNELS = _KERNELS[_TOKEN], _KERNELS[_TOKEN_ADD]


@kernel_op(_TOKEN, mutates=("output_q", "output_s", "normed_out"))
def _rmsnorm_per_token(
    input: torch.Tensor,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    eps: float = 1e-6,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2:  # the rows the kernel takes as they are
        args = (output_q, output_s, normed_out, input, weight, eps, enable_pdl)
        return _TOKEN_KERNELS, (input.dtype, weight.numel()), args, None
    key, inputs, normed = _rows_in(_TOKEN, input, normed_out)
    q_rows = rows_like(_TOKEN, "output_q", output_q, input)
    s_rows = _scale_rows(_TOKEN, output_s, input, 1)
    return _TOKEN_KERNELS, key, (q_rows, s_rows, normed, *inputs, weight, eps, enable_pdl), None


@kernel_op(_TOKEN_ADD, mutates=("residual", "output_q", "output_s", "normed_out"))
def _fused_add_rmsnorm_per_token(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    eps: float = 1e-6,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2:  # the rows the kernel takes as they are
        args = (output_q, output_s, normed_out, input, residual, weight, eps, enable_pdl)
        return _TOKEN_ADD_KERNELS, (input.dtype, weight.numel()), args, None
    key, inputs, normed = _rows_in(_TOKEN_ADD, input, normed_out, residual)
    q_rows = rows_like(_TOKEN_ADD, "output_q", output_q, input)
    s_rows = _scale_rows(_TOKEN_ADD, output_s, input, 1)
    return _TOKEN_ADD_KERNELS, key, (q_rows, s_rows, normed, *inputs, weight, eps, enable_pdl), None


def _token_outputs(
    op: str, input: torch.Tensor, output_q: torch.Tensor | None, output_s: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs a per-token op allocates where they are None: q of ``input``'s shape, s ``[..., 1]``."""
    if type(input) is torch.Tensor and input.ndim == 2:  # rows as they are
        if output_q is None:
            output_q = torch.empty_like(input, dtype=FP8)
        if output_s is None:
            output_s = input.new_empty((input.shape[0], 1), dtype=torch.float32)
        return output_q, output_s
    _key(op, input)
    if output_q is None:
        output_q = input.new_empty(input.shape, dtype=FP8)
    if output_s is None:
        output_s = input.new_empty((*input.shape[:-1], 1), dtype=torch.float32)
    return output_q, output_s


def rmsnorm_per_token_quant_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
    *,
    normed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`jit_kernel.rmsnorm` then :func:`jit_kernel.per_token_quant_fp8`, bit for bit, in one
    launch: ``s = absmax(y) / 448`` per token (0 for an all-zero row, whose q is 0), ``q = fp8(y *
    (1 / s))``. Returns ``(output_q, output_s)``: ``float8_e4m3fn`` of ``input``'s shape and float32
    ``[..., 1]`` (allocated when None). ``normed_out``: also receives ``y``."""
    if output_q is None or output_s is None:
        output_q, output_s = _token_outputs(_TOKEN, input, output_q, output_s)
    _rmsnorm_per_token(input, weight, output_q, output_s, eps, normed_out, enable_pdl)
    return output_q, output_s


def fused_add_rmsnorm_per_token_quant_fp8(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
    *,
    normed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = input + residual`` (in place), then :func:`rmsnorm_per_token_quant_fp8` of it:
    bit for bit :func:`jit_kernel.fused_add_rmsnorm` then :func:`jit_kernel.per_token_quant_fp8`,
    in one launch. ``input`` is left unchanged. Returns ``(output_q, output_s)``."""
    if output_q is None or output_s is None:
        output_q, output_s = _token_outputs(_TOKEN_ADD, input, output_q, output_s)
    _fused_add_rmsnorm_per_token(input, residual, weight, output_q, output_s, eps, normed_out, enable_pdl)
    return output_q, output_s


# ---------------------------------------------------------------------------------------------
# Dynamic per-token-group scales


def _groups(op: str, input: object, group_size: object) -> int:
    """Groups per row, which size the outputs: Python allocates them, so it needs this rule; C++
    checks it again (and owns the rest: group_size 64 or 128)."""
    width = _key(op, input)[1]
    if type(group_size) is not int:
        raise TypeError(f"{op}: group_size must be an int, got {type(group_size).__name__}")
    if group_size <= 0 or width % group_size:
        raise ValueError(f"{op}: the last dimension of input ({width}) must be a multiple of group_size ({group_size})")
    return width // group_size


def _group_scale_rows(op: str, output_s: torch.Tensor, input: torch.Tensor, groups: int) -> torch.Tensor:
    """``output_s`` as rows: ``[..., groups]`` float32, or int32 packed four groups to a word."""
    return _scale_rows(op, output_s, input, (groups + 3) // 4 if output_s.dtype == torch.int32 else groups)


_GROUP_KERNELS, _GROUP_ADD_KERNELS = _KERNELS[_GROUP], _KERNELS[_GROUP_ADD]


@kernel_op(_GROUP, mutates=("output_q", "output_s", "normed_out"))
def _rmsnorm_group(
    input: torch.Tensor,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    quant_eps: float = 1e-10,
    scale_ue8m0: bool = False,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2 and type(group_size) is int:  # the rows the kernel takes as they are
        args = (output_q, output_s, normed_out, input, weight, group_size, eps, quant_eps, scale_ue8m0, enable_pdl)
        return _GROUP_KERNELS, (input.dtype, weight.numel()), args, None
    groups = _groups(_GROUP, input, group_size)
    key, inputs, normed = _rows_in(_GROUP, input, normed_out)
    q_rows = rows_like(_GROUP, "output_q", output_q, input)
    s_rows = _group_scale_rows(_GROUP, output_s, input, groups)
    args = (q_rows, s_rows, normed, *inputs, weight, group_size, eps, quant_eps, scale_ue8m0, enable_pdl)
    return _GROUP_KERNELS, key, args, None


@kernel_op(_GROUP_ADD, mutates=("residual", "output_q", "output_s", "normed_out"))
def _fused_add_rmsnorm_group(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    quant_eps: float = 1e-10,
    scale_ue8m0: bool = False,
    normed_out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    if input.ndim == 2 and type(group_size) is int:  # the rows the kernel takes as they are
        args = (
            output_q, output_s, normed_out, input, residual, weight, group_size, eps, quant_eps, scale_ue8m0, enable_pdl
        )  # fmt: skip
        return _GROUP_ADD_KERNELS, (input.dtype, weight.numel()), args, None
    groups = _groups(_GROUP_ADD, input, group_size)
    key, inputs, normed = _rows_in(_GROUP_ADD, input, normed_out, residual)
    q_rows = rows_like(_GROUP_ADD, "output_q", output_q, input)
    s_rows = _group_scale_rows(_GROUP_ADD, output_s, input, groups)
    args = (q_rows, s_rows, normed, *inputs, weight, group_size, eps, quant_eps, scale_ue8m0, enable_pdl)
    return _GROUP_ADD_KERNELS, key, args, None


def _group_outputs(
    op: str,
    input: torch.Tensor,
    group_size: int,
    column_major_scales: bool,
    packed_ue8m0: bool,
    output_q: torch.Tensor | None,
    output_s: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs a group op allocates where they are None: q of ``input``'s shape; scales
    ``[..., groups]`` row-major, the transpose of a ``[groups, tokens]`` buffer, or packed UE8M0."""
    if type(input) is torch.Tensor and input.ndim == 2 and not (packed_ue8m0 or column_major_scales):
        # Rows as they are, row-major scales; C++ checks that group_size divides the rows it is given.
        shape = input.shape
        if type(group_size) is int and group_size > 0:
            if output_q is None:
                output_q = torch.empty_like(input, dtype=FP8)
            if output_s is None:
                output_s = input.new_empty((shape[0], shape[1] // group_size), dtype=torch.float32)
            return output_q, output_s
    groups = _groups(op, input, group_size)
    if output_q is None:
        output_q = input.new_empty(input.shape, dtype=FP8)
    if output_s is None:
        output_s = group_scales(tuple(input.shape[:-1]), groups, input.device, column_major_scales, packed_ue8m0)
    return output_q, output_s


def rmsnorm_per_token_group_quant_fp8(
    input: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    quant_eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
    *,
    packed_ue8m0: bool = False,
    normed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`jit_kernel.rmsnorm` then :func:`jit_kernel.per_token_group_quant_fp8`, bit for bit, in
    one launch: per group of ``group_size`` (64 or 128) elements of a token, ``s = max(absmax(y),
    quant_eps) / 448`` (``scale_ue8m0``: rounded up to a power of two), ``q = fp8(y * (1 / s))``.

    Returns ``(output_q, output_s)``: ``float8_e4m3fn`` of ``input``'s shape, and float32 scales
    ``[..., D // group_size]``, row-major or (``column_major_scales``) the transpose of a contiguous
    ``[D // group_size, tokens]`` buffer; with ``packed_ue8m0=True`` the int32 packed UE8M0 layout
    (module docstring). A given ``output_s`` may have any row- or column-major strides (TMA-padded
    too); its strides and dtype (int32: packed, which needs ``scale_ue8m0`` or ``packed_ue8m0``),
    not the flags, decide the layout. ``eps`` is the norm's; ``quant_eps`` the scale's floor
    (``per_token_group_quant_fp8``'s ``eps``). ``normed_out``: also receives ``y``."""
    if output_q is None or output_s is None:
        output_q, output_s = _group_outputs(
            _GROUP, input, group_size, column_major_scales, packed_ue8m0, output_q, output_s
        )
    ue8m0 = scale_ue8m0 or packed_ue8m0
    _rmsnorm_group(input, weight, output_q, output_s, group_size, eps, quant_eps, ue8m0, normed_out, enable_pdl)
    return output_q, output_s


def fused_add_rmsnorm_per_token_group_quant_fp8(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    quant_eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
    *,
    packed_ue8m0: bool = False,
    normed_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = input + residual`` (in place), then :func:`rmsnorm_per_token_group_quant_fp8` of
    it: bit for bit :func:`jit_kernel.fused_add_rmsnorm` then
    :func:`jit_kernel.per_token_group_quant_fp8`, in one launch. ``input`` is left unchanged.
    FlashInfer's ``fused_add_rmsnorm_fp8_block_quant`` is this with ``group_size=128``,
    ``column_major_scales=True`` (TMA-padded ``output_s``) and ``normed_out``."""
    if output_q is None or output_s is None:
        output_q, output_s = _group_outputs(
            _GROUP_ADD, input, group_size, column_major_scales, packed_ue8m0, output_q, output_s
        )
    ue8m0 = scale_ue8m0 or packed_ue8m0
    _fused_add_rmsnorm_group(
        input, residual, weight, output_q, output_s, group_size, eps, quant_eps, ue8m0, normed_out, enable_pdl
    )
    return output_q, output_s
