"""Fine-grained fp8 linear layers (transformers' ``FP8Linear``): activations quantised by 1 x 128
groups into padded buffers, then the backend's fp8 decode GEMM at decode sizes and
``torch._scaled_mm`` above, against the 128 x 128-block weights; the checks that decide which
layers run that way."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from jit_kernel.ops.gemm import MAX_ROWS as DECODE_ROWS
from jit_kernel.ops.gemm import SCALED_MM_K_ALIGN, SCALED_MM_ROW_ALIGN

from .backends import Backend, _ops_for
from .reference import FP8_BLOCK

# torch._scaled_mm's blockwise path (cuBLAS's rules, jit_kernel.ops.gemm): activations are
# quantised into buffers of whole multiples of its row alignment, the padding rows' products
# dropped; layers take in_features in multiples of its K alignment and out_features in whole
# 128-row blocks, as in the shapes found right (docs/integrations.md, "Fine-grained fp8 models").
FP8_ROW_ALIGN = SCALED_MM_ROW_ALIGN
FP8_IN_ALIGN = SCALED_MM_K_ALIGN


class _Fp8Input:
    """An activation quantised for the fp8 linear layers it is handed to: ``src`` (the tensor the
    layers are called with), ``q [P, K]`` fp8 and ``s [P, K / 128]`` its column-major scales, ``P``
    its rows padded to :data:`FP8_ROW_ALIGN`. A decoder layer sets it around the calls whose input
    its norm quantised in the same launch, and clears it after."""

    __slots__ = ("q", "s", "src")

    def __init__(self) -> None:
        self.src: torch.Tensor | None = None
        self.q: torch.Tensor | None = None
        self.s: torch.Tensor | None = None

    def hand(self, src: torch.Tensor | None, quantized: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        self.src = src
        self.q, self.s = quantized if quantized is not None else (None, None)


def _fp8_buffers(rows: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [P, d]`` fp8 and column-major scales ``[P, d / 128]`` (the transpose of a contiguous
    ``[d / 128, P]``), ``P`` = ``rows`` rounded up to :data:`FP8_ROW_ALIGN`; the ops write the first
    ``rows`` rows."""
    padded = -(-rows // FP8_ROW_ALIGN) * FP8_ROW_ALIGN
    q = torch.empty(padded, d, dtype=torch.float8_e4m3fn, device=device)
    s = torch.empty(d // FP8_BLOCK, padded, dtype=torch.float32, device=device).t()
    return q, s


def _norm_quant(
    op: Callable[..., object], x: torch.Tensor, norm: nn.Module, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``norm`` of the rows ``x [T, D]`` (``residual += x`` first when given) by the backend's
    ``rmsnorm_group_quant`` / ``fused_add_rmsnorm_group_quant`` ``op``: (normed ``[T, D]``, (q, s))."""
    rows, d = x.shape
    q, s = _fp8_buffers(rows, d, x.device)
    if residual is None:
        normed = op(x, norm.weight, norm.variance_epsilon, q[:rows], s[:rows])
    else:
        normed = op(x, residual, norm.weight, norm.variance_epsilon, q[:rows], s[:rows])
    return normed, (q, s)  # type: ignore[return-value]


def _dequantize(values: torch.Tensor, scales: torch.Tensor, block_rows: int) -> torch.Tensor:
    """fp32 ``values [R, K]`` times their scales, one per ``block_rows x 128`` block."""
    rows, cols = values.shape
    expanded = scales.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return values.float() * expanded


def _fp8_gemm(
    activation: tuple[torch.Tensor, torch.Tensor, int],
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    backend: Backend | None = None,
) -> torch.Tensor:
    """``[rows, N]`` in ``dtype``: the quantised activation ``(q, s, rows)`` (:func:`_fp8_input`)
    times an fp8 weight ``[N, K]`` with its 128 x 128 block scales, plus the bias. Up to
    :data:`~jit_kernel.ops.gemm.MAX_ROWS` rows run the ``backend``'s ``fp8_decode_linear`` where it
    has one (jit_kernel's ``decode_linear_fp8``); other calls on CUDA one ``torch._scaled_mm``
    (blockwise 1 x 128 by 128 x 128, fp32 accumulation), elsewhere the same product of the
    dequantised operands in fp32."""
    q, s, rows = activation
    decode = None if backend is None or rows > DECODE_ROWS else _ops_for(backend, q).fp8_decode_linear
    if decode is not None:
        return decode(q[:rows], s[:rows], weight, weight_scale, dtype, bias)
    if q.is_cuda:
        out = torch._scaled_mm(q, weight.t(), scale_a=s, scale_b=weight_scale.t(), out_dtype=dtype)[:rows]
    else:
        a = _dequantize(q[:rows], s[:rows], 1)
        out = (a @ _dequantize(weight, weight_scale, FP8_BLOCK).t()).to(dtype)
    return out if bias is None else out + bias


def _fp8_input(x: torch.Tensor, handed: _Fp8Input | None, backend: Backend) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``x [..., K]`` quantised by 1 x 128 groups as ``(q, s, rows)`` (:func:`_fp8_buffers`): the
    decoder layer's hand-off where ``x`` is the tensor its norm quantised, else by ``group_quant``."""
    k = x.shape[-1]
    rows = x.numel() // k
    if handed is not None and handed.src is x and handed.q is not None and handed.s is not None:
        return handed.q, handed.s, rows
    q, s = _fp8_buffers(rows, k, x.device)
    _ops_for(backend, x).group_quant(x.reshape(rows, k), q[:rows], s[:rows])  # type: ignore[misc]
    return q, s, rows


def _fp8_linear_unsupported(module: nn.Module) -> str | None:
    """Why transformers' fp8 linear layer ``module`` cannot run on :func:`_fp8_gemm`, or None."""
    weight, scale = getattr(module, "weight", None), getattr(module, "weight_scale_inv", None)
    if not (isinstance(weight, torch.Tensor) and isinstance(scale, torch.Tensor)) or weight.dim() != 2:
        return f"{type(module).__name__} without an [N, K] weight and weight_scale_inv"
    if weight.dtype != torch.float8_e4m3fn or scale.dtype != torch.float32:
        return f"fp8 weights of {weight.dtype} with {scale.dtype} scales (float8_e4m3fn with float32 scales run)"
    if tuple(getattr(module, "block_size", None) or ()) != (FP8_BLOCK, FP8_BLOCK):
        return f"weight blocks {getattr(module, 'block_size', None)} (128 x 128 run)"
    if getattr(module, "activation_scale", None) is not None:
        return "static activation scales (dynamic ones run)"
    n, k = weight.shape
    if k % FP8_IN_ALIGN or n % FP8_BLOCK or scale.shape != (n // FP8_BLOCK, k // FP8_BLOCK):
        return (
            f"an fp8 weight of {n} x {k} (torch._scaled_mm's blockwise GEMM: in_features in multiples of 512, "
            "out_features of 128)"
        )
    if weight.device.type == "meta" or hasattr(module, "_hf_hook"):
        return "fp8 weights on the meta device or behind hooks"
    return None


def _fp8_gemm_check(weight: torch.Tensor, scale: torch.Tensor, backend: Backend) -> str | None:
    """Why :func:`_fp8_gemm` cannot serve this weight's shape on its device, or None: it raises, or
    its product with 4 random quantised rows differs from the dequantised product in the first and
    last 128 output features (``torch._scaled_mm`` returns wrong products, without an error, for
    some shapes it accepts: :data:`FP8_IN_ALIGN`)."""
    n, k = weight.shape
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(0)).to(weight.device, torch.bfloat16)
    q, s = _fp8_buffers(4, k, weight.device)
    try:
        _ops_for(backend, x).group_quant(x, q[:4], s[:4])  # type: ignore[misc]
        got = _fp8_gemm((q, s, 4), weight, scale, None, torch.float32)
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as error:
        first = str(error).splitlines()[0] if str(error) else ""
        return f"the fp8 GEMM fails on {n} x {k} ({type(error).__name__}: {first})"
    a = _dequantize(q[:4], s[:4], 1)
    for block in sorted({0, n // FP8_BLOCK - 1}):
        rows = slice(block * FP8_BLOCK, (block + 1) * FP8_BLOCK)
        expected = a @ _dequantize(weight[rows], scale[block : block + 1], FP8_BLOCK).t()
        if (got[:, rows] - expected).abs().max() > 1e-2 * expected.abs().max():
            return f"torch._scaled_mm's products on {n} x {k} differ from the dequantised ones"
    return None


def _is_fp8_linear(module: object) -> bool:
    """transformers' fine-grained fp8 linear layer (``FP8Linear``, its subclasses excluded)."""
    cls = type(module)
    return cls.__name__ == "FP8Linear" and cls.__module__.endswith("finegrained_fp8")
