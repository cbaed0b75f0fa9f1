"""Per-token and per-token-group fp8 quantisation, and silu_and_mul fused with the group quant.

- ``per_token_quant_fp8``: one float32 scale per row (token). Dynamic (the default):
  ``s[r] = absmax(x[r]) / 448`` and ``q = fp8(x * (1 / s[r]))``; an all-zero row gets scale 0 and q 0
  (no guarded minimum: the scale dequantises the row to exactly 0, and q stays finite). Static
  (``is_static=True``): ``output_s`` holds one per-tensor scale (shape ``(1,)``), as in
  :func:`jit_kernel.per_tensor_quant_fp8`; a zero scale gives q 0.
- ``per_token_group_quant_fp8``: one float32 scale per group of ``group_size`` (64 or 128)
  consecutive elements of a row, ``s = max(absmax(group), eps) / 448`` (SGLang's
  ``sglang_per_token_group_quant_fp8`` / sgl-kernel ``per_token_group_quant_8bit``), rounded up to a
  power of two with ``scale_ue8m0=True`` (the scales stay float32, each a power of two; sgl-kernel
  packs them as uint8 exponents in an int32 TMA layout, which we do not). Scales are row-major
  ``[..., hidden // group_size]``, or with ``column_major_scales=True`` a ``[hidden // group_size,
  tokens]`` buffer returned transposed (what DeepGEMM-style GEMMs read). A given ``output_s`` may
  have any row- or column-major strides (a TMA-aligned, padded buffer too); its strides, not
  ``column_major_scales``, decide where the scales go.
- ``silu_and_mul_per_token_group_quant_fp8``: ``input [..., 2 * d]`` (gate, then up);
  ``a = T(silu(gate) * up)`` computed in fp32 with :func:`jit_kernel.silu_and_mul`'s expression
  (``g / (1 + e^-g)`` through the fast ``__expf`` / ``__fdividef``, within a few fp32 ulps of torch's
  ``F.silu``) and rounded to the input dtype ``T``, then group-quantised: bit for bit what
  ``silu_and_mul`` followed by ``per_token_group_quant_fp8`` computes, in one launch (one read of the
  input, one write of q and the scales).

Non-finite inputs, in every op: NaN is ignored by the absmax (fmaxf) and quantises to NaN; an inf
makes its row's (group's) scale inf, its finite elements quantise to 0 and the infinite ones to NaN.
Finite values never quantise beyond +-448.

Every op is also ``torch.ops.jit_kernel.<name>`` (fake implementations, mutated outputs declared);
the functions switch to those under ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import PER_TOKEN_GROUP_QUANT_FP8, PER_TOKEN_QUANT_FP8
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor, rows
from jit_kernel.ops.quant import one_scale, same_shape_q, table_for

FP8_E4M3_MAX = 448.0
_TOKEN_OP = "per_token_quant_fp8"
_GROUP_OP = "per_token_group_quant_fp8"
_FUSED_OP = "silu_and_mul_per_token_group_quant_fp8"

_TOKEN = Dispatcher(PER_TOKEN_QUANT_FP8)
_GROUP = Dispatcher(PER_TOKEN_GROUP_QUANT_FP8)
_TOKEN_KERNELS = {
    False: KernelTable(_TOKEN, "dynamic", lambda dtype: (float_dtype(_TOKEN_OP, "input", dtype),)),
    True: KernelTable(_TOKEN, "static", lambda dtype: (float_dtype(_TOKEN_OP, "input", dtype),)),
}
_GROUP_KERNELS = {
    False: KernelTable(_GROUP, "quant", lambda dtype: (float_dtype(_GROUP_OP, "input", dtype),)),
    True: KernelTable(_GROUP, "silu_and_mul_quant", lambda dtype: (float_dtype(_FUSED_OP, "input", dtype),)),
}


def _width(op: str, input: object) -> int:
    """The last dimension of ``input``, which sizes the outputs."""
    if not isinstance(input, torch.Tensor):
        not_a_tensor(op, "input", input)
    if input.dim() == 0:
        raise ValueError(f"{op}: input must have at least one dimension")
    return input.shape[-1]


def _group_shapes(op: str, input: torch.Tensor, group_size: object, fused: bool) -> tuple[int, int]:
    """(hidden, groups per row) of the outputs. Python sizes the outputs, so it needs these rules
    here; C++ checks them again for callers of the kernel itself (and owns the rest: 64 or 128)."""
    width = _width(op, input)
    if type(group_size) is not int:
        raise TypeError(f"{op}: group_size must be an int, got {type(group_size).__name__}")
    if fused and width % 2:
        raise ValueError(f"{op}: the last dimension of input ({width}) must be even: [..., 2 * d], gate then up")
    hidden = width // 2 if fused else width
    if group_size <= 0 or hidden % group_size:
        what = "input / 2" if fused else "input"
        raise ValueError(
            f"{op}: the last dimension of {what} ({hidden}) must be a multiple of group_size ({group_size})"
        )
    return hidden, hidden // group_size


# ---------------------------------------------------------------------------------------------
# per_token_quant_fp8


@kernel_op(_TOKEN_OP, mutates=("output_q", "output_s"))
def _per_token(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    is_static: bool = False,
    enable_pdl: bool | None = None,
) -> Launch:
    op = _TOKEN_OP
    kernels = table_for(op, _TOKEN_KERNELS, is_static)
    if input.ndim == 2 and not is_static:  # rows as the kernel takes them; C++ checks the shapes
        return kernels, input.dtype, (output_q, output_s, input, enable_pdl), None
    same_shape_q(op, output_q, input)
    in_rows = rows(op, "input", input)
    q_rows = rows(op, "output_q", output_q)
    if is_static:
        s = one_scale(op, output_s)
    else:
        expected = (*input.shape[:-1], 1)
        if output_s.shape != expected:
            raise ValueError(f"{op}: output_s must have shape {expected}, got {tuple(output_s.shape)}")
        s = rows(op, "output_s", output_s)
    return kernels, input.dtype, (q_rows, s, in_rows, enable_pdl), None


def per_token_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    is_static: bool = False,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``input [..., hidden]`` (fp16, bf16 or fp32; rows with unit inner stride) to
    ``float8_e4m3fn`` with one float32 scale per row. Returns ``(output_q, output_s)``: ``output_q``
    of ``input``'s shape; dynamic ``output_s`` of shape ``[..., 1]`` (``absmax / 448``, 0 for an
    all-zero row, whose q is 0); static (``is_static=True``) ``output_s`` is the given per-tensor
    scale, shape ``(1,)``.

    ``enable_pdl``: launch with programmatic dependent launch (``None``: on for sm_90+)."""
    rows_as_they_are = type(input) is torch.Tensor and input.ndim == 2
    if output_q is None:
        if rows_as_they_are:
            output_q = torch.empty_like(input, dtype=torch.float8_e4m3fn)
        else:
            _width(_TOKEN_OP, input)
            output_q = input.new_empty(input.shape, dtype=torch.float8_e4m3fn)
    if output_s is None:
        if is_static is True:
            raise ValueError(f"{_TOKEN_OP}: is_static=True needs the scale in output_s")
        if rows_as_they_are:
            output_s = input.new_empty((input.shape[0], 1), dtype=torch.float32)
        else:
            _width(_TOKEN_OP, input)
            output_s = input.new_empty((*input.shape[:-1], 1), dtype=torch.float32)
    _per_token(input, output_q, output_s, is_static, enable_pdl)
    return output_q, output_s


# ---------------------------------------------------------------------------------------------
# per_token_group_quant_fp8 and the fused silu_and_mul


def _declare_group(op: str, fused: bool) -> Callable[..., Any]:
    """``per_token_group_quant_fp8`` and, with ``fused``, ``silu_and_mul_per_token_group_quant_fp8``."""
    kernels = _GROUP_KERNELS[fused]

    def plan(
        input: torch.Tensor,
        output_q: torch.Tensor,
        output_s: torch.Tensor,
        group_size: int,
        eps: float,
        scale_ue8m0: bool,
        enable_pdl: bool | None = None,
    ) -> Launch:
        args = (output_q, output_s, input, group_size, eps, scale_ue8m0, enable_pdl)
        if input.ndim == 2 and type(group_size) is int:  # rows as the kernel takes them; C++ checks the shapes
            return kernels, input.dtype, args, None
        hidden, groups = _group_shapes(op, input, group_size, fused)
        lead = tuple(input.shape[:-1])
        if output_q.shape != (*lead, hidden):
            raise ValueError(f"{op}: output_q must have shape {(*lead, hidden)}, got {tuple(output_q.shape)}")
        if output_s.shape != (*lead, groups):
            raise ValueError(f"{op}: output_s must have shape {(*lead, groups)}, got {tuple(output_s.shape)}")
        in_rows = rows(op, "input", input)
        q_rows = rows(op, "output_q", output_q)
        s_rows = rows(op, "output_s", output_s)
        return kernels, input.dtype, (q_rows, s_rows, in_rows, group_size, eps, scale_ue8m0, enable_pdl), None

    plan.__name__ = plan.__qualname__ = f"_{op}"
    return kernel_op(op, mutates=("output_q", "output_s"))(plan)


_group = _declare_group(_GROUP_OP, fused=False)
_silu_and_mul_group = _declare_group(_FUSED_OP, fused=True)


def _group_outputs(
    op: str,
    input: torch.Tensor,
    group_size: int,
    column_major_scales: bool,
    output_q: torch.Tensor | None,
    output_s: torch.Tensor | None,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs a group quantiser allocates where they are None: q ``[..., hidden]``, scales
    ``[..., groups]`` row-major, or the transpose of a ``[groups, tokens]`` buffer."""
    shape = input.shape if type(input) is torch.Tensor and input.ndim == 2 else None
    if shape is not None and type(group_size) is int and group_size > 0 and not column_major_scales:
        hidden = shape[1] // 2 if fused else shape[1]  # C++ checks the divisibility of the rows it is given
        if output_q is None:
            output_q = input.new_empty((shape[0], hidden), dtype=torch.float8_e4m3fn)
        if output_s is None:
            output_s = input.new_empty((shape[0], hidden // group_size), dtype=torch.float32)
        return output_q, output_s
    hidden, groups = _group_shapes(op, input, group_size, fused)
    lead = tuple(input.shape[:-1])
    if output_q is None:
        output_q = torch.empty((*lead, hidden), dtype=torch.float8_e4m3fn, device=input.device)
    if output_s is None:
        output_s = group_scales(lead, groups, input.device, column_major_scales)
    return output_q, output_s


def group_scales(
    lead: tuple[int, ...], groups: int, device: torch.device, column_major: bool, packed_ue8m0: bool = False
) -> torch.Tensor:
    """New scales of a group quantiser for tokens of leading dimensions ``lead``: float32 ``[...,
    groups]`` row-major or (``column_major``) the transpose of a contiguous ``[groups, tokens]``
    buffer; with ``packed_ue8m0``, int32 ``[..., ceil(groups / 4)]`` over a ``[words, tokens padded
    to 4]`` buffer (DeepGEMM's packed UE8M0 layout on sm_100)."""
    tokens = math.prod(lead)
    if packed_ue8m0:
        # [words, tokens padded to 4] seen as [tokens, words] (strides (1, padded)), then the leading dims.
        words, padded = (groups + 3) // 4, (tokens + 3) // 4 * 4
        buffer = torch.empty((words, padded), dtype=torch.int32, device=device)
        return buffer.t().narrow(0, 0, tokens).view(*lead, words)
    if column_major:
        # [groups, tokens] seen as [tokens, groups] (strides (1, tokens)), then the leading dims.
        return torch.empty((groups, tokens), dtype=torch.float32, device=device).t().view(*lead, groups)
    return torch.empty((*lead, groups), dtype=torch.float32, device=device)


def per_token_group_quant_fp8(
    input: torch.Tensor,
    group_size: int,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``input [..., hidden]`` (fp16, bf16 or fp32; rows with unit inner stride) to
    ``float8_e4m3fn`` by groups of ``group_size`` (64 or 128) elements of a row.

    ``scale = max(absmax(group), eps) / 448`` (``scale_ue8m0=True``: rounded up to a power of two,
    still float32), ``q = fp8(x * (1 / scale))``. Returns ``(output_q, output_s)``: ``output_q`` of
    ``input``'s shape, ``output_s`` float32 ``[..., hidden // group_size]``, row-major or, with
    ``column_major_scales=True``, the transpose of a contiguous ``[hidden // group_size, tokens]``
    buffer. A given ``output_s`` may have any row- or column-major strides (e.g. tokens padded to a
    multiple of 4 for TMA); its strides decide the layout. ``hidden % group_size != 0`` raises
    ``ValueError``."""
    if output_q is None or output_s is None:
        output_q, output_s = _group_outputs(
            _GROUP_OP, input, group_size, column_major_scales, output_q, output_s, fused=False
        )
    _group(input, output_q, output_s, group_size, eps, scale_ue8m0, enable_pdl)
    return output_q, output_s


def silu_and_mul_per_token_group_quant_fp8(
    input: torch.Tensor,
    group_size: int,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_ue8m0: bool = False,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_token_group_quant_fp8(silu_and_mul(input), ...)`` in one launch: ``input [..., 2 * d]``
    holds gate then up; ``a = T(silu(gate) * up)`` is computed in fp32 and rounded to the input
    dtype ``T`` (exactly as ``silu_and_mul`` stores it), then quantised by groups of ``a``'s last
    dimension ``d``. The result equals ``silu_and_mul`` followed by ``per_token_group_quant_fp8``
    bit for bit (q and scales). Returns ``(output_q [..., d], output_s [..., d // group_size])``, the
    scales laid out as in :func:`per_token_group_quant_fp8`."""
    if output_q is None or output_s is None:
        output_q, output_s = _group_outputs(
            _FUSED_OP, input, group_size, column_major_scales, output_q, output_s, fused=True
        )
    _silu_and_mul_group(input, output_q, output_s, group_size, eps, scale_ue8m0, enable_pdl)
    return output_q, output_s
