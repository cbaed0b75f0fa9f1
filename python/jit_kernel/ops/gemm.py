"""Decode GEMMs: ``decode_linear``, ``torch.nn.functional.linear`` for the 1 to 16 rows of a decode
step (csrc/gemm/decode_linear.cuh).

``decode_linear(input, weight, bias=None, out=None)`` is ``F.linear(input, weight, bias)``: ``input
[..., K]`` (M rows once flattened), ``weight [N, K]`` as ``nn.Linear`` stores it, ``bias [N]`` or
None, the result ``[..., N]`` in the input's dtype. The kernel serves fp16 and bf16 with fp32
accumulation on tensor cores, reading the weight once; its reduction runs in a fixed order, so a call
gives the same bits every time (no atomics, no split-k with atomics). Every other call goes to
``torch.nn.functional.linear`` (cuBLAS): :func:`decode_linear_serves` is the rule, the one place it
is written.
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import DECODE_LINEAR
from jit_kernel.engine.spec import Config
from jit_kernel.ops._common import KernelTable, Launch, is_compiling, kernel_op, not_a_tensor, rows

_OP = "decode_linear"
#: The most rows (tokens) the kernel takes; more go to ``torch.nn.functional.linear``.
MAX_ROWS = 16
# The kernel's dtypes and their C++ names (the other config parameter is the row tile, 8 or 16).
_DTYPES = {torch.bfloat16: "bf16_t", torch.float16: "fp16_t"}
# A row starts on 16 bytes: the kernel's vector loads. In elements of a 16-bit dtype.
_ALIGN = 8
#: Weights of more bytes than this go to cuBLAS: at that size cuBLAS streams them at least as fast
#: as the kernel's column blocks (the measurements behind it: docs/design/decode-gemm.md).
MAX_KERNEL_WEIGHT_BYTES = 128 << 20


def _config(tile: int, dtype: torch.dtype) -> Config:
    cpp = _DTYPES.get(dtype)
    if cpp is None:
        raise TypeError(f"{_OP}: input must be float16 or bfloat16, got {str(dtype).removeprefix('torch.')}")
    return (tile, cpp)


_KERNELS = KernelTable(Dispatcher(DECODE_LINEAR), "run", _config)


def decode_linear_serves(input: object, weight: object, bias: object = None) -> bool:
    """Whether :func:`decode_linear` runs its kernel for these arguments; where not, it calls
    ``torch.nn.functional.linear``. The kernel takes fp16 or bf16 ``input``, ``weight`` and
    ``bias`` of one dtype; 1 to 16 rows (``input``'s elements over K); K a multiple of 8; a
    contiguous 2-D ``weight`` of at most :data:`MAX_KERNEL_WEIGHT_BYTES`; ``input`` rows with unit
    inner stride that start on 16 bytes (a contiguous tensor, or 2-D with a row stride that is a
    multiple of 8); a 1-D ``bias`` or None.
    Alignment is judged by storage offsets (allocations start on 16 bytes), so the rule reads only
    metadata and holds under CUDA-graph capture; under torch.compile, which cannot read storage
    offsets, they are taken as aligned (the kernel refuses a misaligned pointer, naming the tensor).
    The device is not part of the rule: the kernel refuses tensors off the GPU, naming them."""
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return False
    dtype = input.dtype
    if (dtype != torch.bfloat16 and dtype != torch.float16) or weight.dtype != dtype:
        return False
    if weight.dim() != 2 or input.dim() == 0:
        return False
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != dtype or bias.dim() != 1):
        return False
    k = weight.shape[1]
    if k == 0 or k % _ALIGN or input.shape[-1] != k:
        return False
    m = input.numel() // k
    if m < 1 or m > MAX_ROWS:
        return False
    if not weight.is_contiguous() or weight.numel() * weight.element_size() > MAX_KERNEL_WEIGHT_BYTES:
        return False
    # TorchDynamo cannot read storage offsets: a traced call takes them as aligned (the kernel
    # refuses a misaligned pointer, naming the tensor).
    if not is_compiling() and (weight.storage_offset() % _ALIGN or input.storage_offset() % _ALIGN):
        return False
    if input.dim() == 2:
        row_stride, inner = input.stride()
        return inner == 1 and (m == 1 or row_stride % _ALIGN == 0)
    return input.is_contiguous()


@kernel_op(_OP, out="out")
def _decode_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    """The kernel of :func:`decode_linear` without the fallback: ``input [M, K]`` or ``[..., K]``
    with 1 <= M <= 16, fp16 or bf16, K a multiple of 8 (what :func:`decode_linear_serves` accepts);
    anything else raises, naming the argument."""
    n = weight.shape[0] if weight.ndim else 0
    if input.ndim == 2:  # rows as the kernel takes them; C++ checks every shape
        m = input.shape[0]
        if out is None:
            out = input.new_empty((m, n))
        return _KERNELS, (8 if m <= 8 else 16, input.dtype), (out, input, weight, bias, enable_pdl), out
    x = rows(_OP, "input", input)
    shape = (*input.shape[:-1], n)
    if out is None:
        out = input.new_empty(shape)
    elif tuple(out.shape) != shape:
        raise ValueError(f"{_OP}: out must have shape {shape}, got {tuple(out.shape)}")
    m = x.shape[0]
    return _KERNELS, (8 if m <= 8 else 16, input.dtype), (rows(_OP, "out", out), x, weight, bias, enable_pdl), out


def _linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> torch.Tensor:
    """The fallback: ``torch.nn.functional.linear``, copied into ``out`` when one is given."""
    result = torch.nn.functional.linear(input, weight, bias)
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        not_a_tensor(_OP, "out", out)
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(
            f"{_OP}: out must have shape {tuple(result.shape)} and dtype {result.dtype}, "
            f"got {tuple(out.shape)} and {out.dtype}"
        )
    return out.copy_(result)


def decode_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.linear(input, weight, bias)`` for decode: ``input [..., K]`` of M rows
    (1 to 16 once the leading dimensions are flattened), ``weight [N, K]`` (``nn.Linear``'s layout),
    ``bias [N]`` or None; returns ``[..., N]`` in the input's dtype, or writes ``out`` (which must not
    overlap ``input``) and returns it.

    fp16 and bf16 run the kernel: fp32 accumulation on tensor cores, the weight read once, one
    rounding to the output dtype after the bias; a fixed reduction order, so the same inputs give
    the same bits on every call (at the same GPU). Shapes the kernel does not serve go to
    ``torch.nn.functional.linear`` (cuBLAS): more than 16 rows, K not a multiple of 8, a dtype
    mismatch or other dtypes, a non-contiguous weight, a weight above :data:`MAX_KERNEL_WEIGHT_BYTES`
    (128 MiB: a Llama-3-8B fused gate/up projection or a language-model head), input rows that are not 16-byte aligned
    (:func:`decode_linear_serves` is the rule). No host synchronisation: CUDA-graph safe, and
    traceable by ``torch.compile(fullgraph=True)`` (the rule reads metadata only).

    ``enable_pdl``: programmatic dependent launch (``None``: on for sm_90+). The kernel starts
    reading ``weight`` before it waits for the previous kernel in the stream, as a layer's weight is
    no kernel's output: pass ``enable_pdl=False`` where the kernel launched just before writes the
    weight (an in-place weight update, say)."""
    if decode_linear_serves(input, weight, bias):
        return _decode_linear(input, weight, bias, out, enable_pdl)
    if not isinstance(input, torch.Tensor):
        not_a_tensor(_OP, "input", input)
    if not isinstance(weight, torch.Tensor):
        not_a_tensor(_OP, "weight", weight)
    return _linear(input, weight, bias, out)
