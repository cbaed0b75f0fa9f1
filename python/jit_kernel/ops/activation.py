"""Gated activations: ``silu_and_mul``, ``gelu_and_mul`` (exact erf GELU), ``gelu_tanh_and_mul``.

``input [..., 2 * d] -> out [..., d]`` with ``out = act(input[..., :d]) * input[..., d:]`` (the gate
is the first half of the last dimension, the up projection the second half, as in sgl-kernel,
FlashInfer and vLLM), computed in fp32 and rounded once to the dtype (fp16, bf16 or fp32).

Non-finite gates (up = 1): NaN gives NaN in every op; +inf gives inf; -inf gives 0 for
``gelu_and_mul`` and NaN for ``silu_and_mul`` and ``gelu_tanh_and_mul`` (-inf times the sigmoid's 0).

Any ``d`` works: rows of whole, aligned 16-byte vectors use vector loads, every other shape a scalar
path. Rows may be strided (unit last stride): ``input`` may be a slice of a wider tensor. Zero
tokens is a no-op. One translation unit per dtype holds the three kernels (prebuilt).

Every op is also ``torch.ops.jit_kernel.<name>`` (``<name>_out`` with ``out``), with a fake
implementation, so ``torch.compile(fullgraph=True)`` traces it without a graph break.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import ACTIVATION
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor, rows

_ACTIVATION = Dispatcher(ACTIVATION)
_NAMES = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
# name -> (dtype -> kernel).
_KERNELS = {
    name: KernelTable(_ACTIVATION, name, lambda dtype, op=name: (float_dtype(op, "input", dtype),)) for name in _NAMES
}


def _declare(name: str, doc: str) -> Callable[..., Any]:
    """The op ``name`` (``torch.ops.jit_kernel.<name>`` and ``<name>_out``), declared once for the
    three activations. ``enable_pdl``: launch with programmatic dependent launch; ``None`` (the
    default) turns it on for sm_90+ devices (decided in C++ per device)."""
    kernels = _KERNELS[name]

    def plan(input: torch.Tensor, out: torch.Tensor | None = None, enable_pdl: bool | None = None) -> Launch:
        if input.ndim == 2:  # the rows the kernel takes as they are; C++ matches out [rows, d] against them
            if out is None:
                shape = input.shape
                # An odd last dimension gets an out of half of it, rounded down; C++ then rejects the input.
                out = input.new_empty((shape[0], shape[1] // 2))
            elif type(out) is not torch.Tensor or out.ndim != 2:
                return _general(input, out, enable_pdl)
            return kernels, input.dtype, (out, input, enable_pdl), out
        return _general(input, out, enable_pdl)

    def _general(input: torch.Tensor, out: torch.Tensor | None, enable_pdl: bool | None) -> Launch:
        """Any ``[..., 2 * d]`` input: viewed as rows, ``out`` checked against its shape."""
        try:
            dtype, shape = input.dtype, input.shape
        except AttributeError:
            not_a_tensor(name, "input", input)
        in_rows = rows(name, "input", input)
        out_shape = (*shape[:-1], shape[-1] // 2)
        if out is None:
            out = input.new_empty(out_shape)
            out_rows = out.view(in_rows.shape[0], out_shape[-1])
        else:
            if not isinstance(out, torch.Tensor):
                not_a_tensor(name, "out", out)
            if out.shape != out_shape:
                raise ValueError(
                    f"{name}: out must have shape {tuple(out_shape)} (input {tuple(shape)} with the last "
                    f"dimension halved), got {tuple(out.shape)}"
                )
            out_rows = rows(name, "out", out)
        return kernels, dtype, (out_rows, in_rows, enable_pdl), out

    plan.__name__ = plan.__qualname__ = name
    plan.__doc__ = doc
    return kernel_op(name, out="out")(plan)


silu_and_mul = _declare(
    "silu_and_mul",
    """``silu(input[..., :d]) * input[..., d:]`` for ``input [..., 2 * d]``; returns ``out [..., d]``.

    fp16, bf16 or fp32 on a CUDA device, unit last stride (rows may be strided); ``out``, when
    given, has the dtype of ``input`` and shape ``[..., d]``.""",
)
gelu_and_mul = _declare(
    "gelu_and_mul",
    """``gelu(input[..., :d]) * input[..., d:]`` with the erf GELU (erf evaluated to within 1.5e-7,
    below an fp32 ulp near 1: Abramowitz & Stegun 7.1.26); as :func:`silu_and_mul`.""",
)
gelu_tanh_and_mul = _declare(
    "gelu_tanh_and_mul",
    """``gelu_tanh(input[..., :d]) * input[..., d:]`` with the tanh approximation of GELU
    (``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``); as :func:`silu_and_mul`.""",
)
