"""``jit_kernel.per_tensor_quant_fp8``: the seed's per-tensor fp8 quantisation API, same signatures and semantics.

Destination-passing, as in the seed: ``per_tensor_quant_fp8(input, output_q, output_s,
is_static=False)`` writes ``output_q`` (and, unless static, ``output_s``) and returns None. The
top-level ``jit_kernel.per_tensor_quant_fp8(input)`` is the torch-style form: outputs optional,
``(output_q, output_s)`` returned. Both run the one implementation in ``jit_kernel.ops.quant``.
"""

from __future__ import annotations

import torch

from jit_kernel.ops import quant as _quant


def per_tensor_quant_fp8(
    input: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    is_static: bool = False,
) -> None:
    """``output_q = fp8_e4m3(clamp(input / scale, -448, 448))`` with one float32 scale for the whole
    tensor. Dynamic (default): ``output_s = absmax(input) / 448`` is computed and written first
    (no zeroing needed). Static: ``output_s`` holds the scale and is only read."""
    if output_q is None or output_s is None:
        raise TypeError(
            "per_tensor_quant_fp8: output_q and output_s are required here (the seed's destination-passing form); "
            "jit_kernel.per_tensor_quant_fp8(input) allocates and returns them"
        )
    _quant.per_tensor_quant_fp8(input, output_q, output_s, is_static)


def per_tensor_absmax_fp8(input: torch.Tensor, output_s: torch.Tensor) -> None:
    """``output_s = max(output_s, absmax(input) / 448)``: the scale dynamic quantisation would use.

    As in the seed, ``output_s`` (float32, one element) accumulates a maximum, so zero it first, or
    call again on another tensor to get one scale for both. One launch of an absmax-only kernel
    that reads ``input`` once and combines into ``output_s`` with an atomic max; an empty ``input``
    leaves ``output_s`` unchanged. NaN elements of ``input`` are ignored, as in dynamic mode.
    """
    if not isinstance(output_s, torch.Tensor):
        raise TypeError(f"per_tensor_absmax_fp8: output_s must be a torch.Tensor, got {type(output_s).__name__}")
    _quant.per_tensor_absmax_fp8(input, output_s)


__all__ = ["per_tensor_absmax_fp8", "per_tensor_quant_fp8"]
