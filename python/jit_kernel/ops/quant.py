"""``per_tensor_quant_fp8``: one float32 scale for a whole tensor, values in ``float8_e4m3fn``.

``q = fp8(clamp(x * (1 / scale), -448, 448))``. Dynamic mode (the default) computes
``scale = absmax(x) / 448`` into ``output_s`` itself, so ``output_s`` needs no zeroing by the
caller; static mode (``is_static=True``) reads the scale given in ``output_s``. A zero scale
(an all-zero input) gives an all-zero ``q``.

``per_tensor_absmax_fp8`` computes only the scale and folds it into ``output_s``:
``output_s = max(output_s, absmax(x) / 448)`` (one read of ``x``, no fp8 output).

Non-finite inputs: NaN elements are ignored by the absmax (fmaxf from 0) and an inf gives scale
inf, in every mode.
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import PER_TENSOR_QUANT_FP8
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor

_QUANT = Dispatcher(PER_TENSOR_QUANT_FP8)
FP8_E4M3_MAX = 448.0
_OP = "per_tensor_quant_fp8"
_KERNELS = {
    False: KernelTable(_QUANT, "dynamic", lambda dtype: (float_dtype(_OP, "input", dtype),)),
    True: KernelTable(_QUANT, "static", lambda dtype: (float_dtype(_OP, "input", dtype),)),
}
_ABSMAX_OP = "per_tensor_absmax_fp8"
_ABSMAX = KernelTable(_QUANT, "absmax", lambda dtype: (float_dtype(_ABSMAX_OP, "input", dtype),))


def table_for(op: str, tables: dict[bool, KernelTable], is_static: object) -> KernelTable:
    """The kernels of static or dynamic mode (per-tensor and per-token quant share the rule)."""
    kernels = tables.get(is_static) if type(is_static) is bool else None  # type: ignore[call-overload]
    if kernels is None:
        raise TypeError(f"{op}: is_static must be a bool, got {type(is_static).__name__}")
    return kernels


def same_shape_q(op: str, output_q: torch.Tensor, input: torch.Tensor) -> None:
    """Python allocates and reshapes ``output_q`` after ``input``, so it checks this rule itself."""
    if output_q.shape != input.shape:
        raise ValueError(
            f"{op}: output_q must have the shape of input {tuple(input.shape)}, got {tuple(output_q.shape)}"
        )


def one_scale(op: str, output_s: torch.Tensor) -> torch.Tensor:
    """``output_s`` holding exactly one float32 scale, as the ``(1,)`` tensor the kernels take (any
    shape of one element is reshaped here, so C++ cannot see it)."""
    if output_s.dim() == 1:
        return output_s  # C++ checks the size
    if output_s.numel() != 1:
        raise ValueError(f"{op}: output_s must hold one float32 scale, got shape {tuple(output_s.shape)}")
    return output_s.view(1)


@kernel_op(_OP, mutates=("output_q", "output_s"))
def _quant(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    is_static: bool = False,
    enable_pdl: bool | None = None,
) -> Launch:
    kernels = _KERNELS.get(is_static) if type(is_static) is bool else table_for(_OP, _KERNELS, is_static)
    # C++ checks the shapes (output_q has input's, any rank), contiguity, dtypes, devices.
    scale = output_s if output_s.ndim == 1 else one_scale(_OP, output_s)
    return kernels, input.dtype, (output_q, scale, input, enable_pdl), None


def per_tensor_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor | None = None,
    output_s: torch.Tensor | None = None,
    is_static: bool = False,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``input`` (fp16, bf16 or fp32, any shape, contiguous) to ``float8_e4m3fn`` with one
    per-tensor scale. Returns ``(output_q, output_s)``; ``output_s`` has shape ``(1,)``.

    ``enable_pdl``: launch with programmatic dependent launch (``None``: on for sm_90+). The
    cooperative kernel that dynamic mode uses above 64K elements is never launched with it."""
    if output_q is None:
        if not isinstance(input, torch.Tensor):
            not_a_tensor(_OP, "input", input)
        output_q = torch.empty(input.shape, dtype=torch.float8_e4m3fn, device=input.device)
    if output_s is None:
        if is_static is True:
            raise ValueError(f"{_OP}: is_static=True needs the scale in output_s")
        output_s = torch.empty(1, dtype=torch.float32, device=input.device)
    _quant(input, output_q, output_s, is_static, enable_pdl)
    return output_q, output_s


@kernel_op(_ABSMAX_OP, mutates=("output_s",))
def per_tensor_absmax_fp8(input: torch.Tensor, output_s: torch.Tensor, enable_pdl: bool | None = None) -> Launch:
    """``output_s = max(output_s, absmax(input) / 448)``: the scale dynamic quantisation would
    compute, folded into ``output_s`` with an atomic max (one launch, one read of ``input``, no
    fp8 output). ``output_s`` (float32, one element, on ``input``'s device) accumulates: zero it
    first, or call again on another tensor to get one scale for both. An empty ``input`` leaves
    it unchanged. Starting from 0, the result is bit-equal to dynamic ``per_tensor_quant_fp8``'s
    scale of the same input.

    ``input``: fp16, bf16 or fp32, any shape, contiguous (any element offset: an unaligned view is
    read with 16-byte loads all the same). NaN elements are ignored (as in dynamic mode); an inf
    gives inf. A NaN already in ``output_s`` stays NaN if its sign bit is clear (torch's NaN) and is
    replaced if it is set (the atomic compares bit patterns); any other old value gives the
    maximum. ``enable_pdl``: launch with programmatic dependent launch (``None``: on for sm_90+)."""
    # C++ checks input (contiguous, any shape) and output_s: dtypes, sizes, one device.
    return _ABSMAX, input.dtype, (one_scale(_ABSMAX_OP, output_s), input, enable_pdl), None
