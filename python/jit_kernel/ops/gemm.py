"""Decode GEMMs: ``decode_linear``, ``torch.nn.functional.linear`` for the 1 to 16 rows of a decode
step (csrc/gemm/decode_linear.cuh).

``decode_linear(input, weight, bias=None, out=None)`` is ``F.linear(input, weight, bias)``: ``input
[..., K]`` (M rows once flattened), ``weight [N, K]`` as ``nn.Linear`` stores it, ``bias [N]`` or
None, the result ``[..., N]`` in the input's dtype. The kernel serves fp16 and bf16 with fp32
accumulation on tensor cores, reading the weight once; its reduction runs in a fixed order, so a call
gives the same bits every time (no atomics, no split-k with atomics). Every other call goes to
``torch.nn.functional.linear`` (cuBLAS): :func:`decode_linear_serves` is the rule, the one place it
is written.

``decode_linear_fp8(input_q, input_scale, weight, weight_scale, out_dtype, bias=None, out=None)`` is
the fp8 block-scaled form (csrc/gemm/decode_linear_fp8.cuh): ``float8_e4m3fn`` activations with one
float32 scale per 1 x 128 group of a row and weights with one per 128 x 128 block, fp32 accumulation,
one rounding to ``out_dtype``; 1 to 16 rows run the kernel, everything else ``torch._scaled_mm``'s
blockwise GEMM where cuBLAS has it, else a float32 dequantised reference
(:func:`decode_linear_fp8_serves` is the rule).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import DECODE_LINEAR, DECODE_LINEAR_FP8
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
    if (dtype is not torch.bfloat16 and dtype is not torch.float16) or weight.dtype is not dtype:
        return False
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype is not dtype or bias.dim() != 1):
        return False
    shape = weight.shape
    if len(shape) != 2:
        return False
    n, k = shape
    if k == 0 or k % _ALIGN or n * k * 2 > MAX_KERNEL_WEIGHT_BYTES:  # 2 bytes an element in both dtypes
        return False
    if input.ndim == 2:
        m, input_k = input.shape
        row_stride, inner = input.stride()
        if input_k != k or m < 1 or m > MAX_ROWS or inner != 1 or (m > 1 and row_stride % _ALIGN):
            return False
    else:
        input_shape = input.shape
        if not input_shape or input_shape[-1] != k:
            return False
        m = input.numel() // k
        if m < 1 or m > MAX_ROWS or not input.is_contiguous():
            return False
    if not weight.is_contiguous():
        return False
    # TorchDynamo cannot read storage offsets: a traced call takes them as aligned (the kernel
    # refuses a misaligned pointer, naming the tensor).
    return is_compiling() or not (weight.storage_offset() % _ALIGN or input.storage_offset() % _ALIGN)


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


# ---------------------------------------------------------------------------------------------
# decode_linear_fp8: the fp8 block-scaled GEMM of a decode step (csrc/gemm/decode_linear_fp8.cuh)

_FP8_OP = "decode_linear_fp8"
FP8 = torch.float8_e4m3fn
#: The scale blocks: 1 x 128 groups of an input row, 128 x 128 blocks of the weight.
FP8_BLOCK = 128
# K is a multiple of 16 (a thread's 16-byte loads; a last k-block may be short); rows start on 16 bytes.
_FP8_ALIGN = 16


def _fp8_config(tile: int, out_dtype: torch.dtype) -> Config:
    cpp = _DTYPES.get(out_dtype)
    if cpp is None:
        raise TypeError(
            f"{_FP8_OP}: out_dtype must be float16 or bfloat16, got {str(out_dtype).removeprefix('torch.')}"
        )
    return (tile, cpp)


_FP8_KERNELS = KernelTable(Dispatcher(DECODE_LINEAR_FP8), "run", _fp8_config)


def _collapses(t: torch.Tensor) -> bool:
    """Whether ``t``'s leading dimensions view as one (its rows have one stride)."""
    dims = [(size, stride) for size, stride in zip(t.shape[:-1], t.stride()[:-1], strict=True) if size != 1]
    return all(dims[i][1] == dims[i + 1][1] * dims[i + 1][0] for i in range(len(dims) - 1))


def decode_linear_fp8_serves(
    input_q: object,
    input_scale: object,
    weight: object,
    weight_scale: object,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: object = None,
) -> bool:
    """Whether :func:`decode_linear_fp8` runs its kernel for these arguments; where not, it runs the
    fallback (``torch._scaled_mm`` or the float32 reference). The kernel takes
    ``float8_e4m3fn`` ``input_q [..., K]`` of 1 to 16 rows and ``weight [N, K]`` (contiguous), K a
    multiple of 16; float32 ``input_scale [..., ceil(K / 128)]`` (rows that view as 2-D, any
    strides) and ``weight_scale [ceil(N / 128), ceil(K / 128)]`` (any strides); ``out_dtype``
    bfloat16 or float16; a 1-D ``bias`` of ``out_dtype`` or float32, or None; ``input_q`` rows with
    unit inner stride that start on 16 bytes. Metadata only (CUDA-graph safe; under torch.compile
    storage offsets count as aligned and the kernel refuses a misaligned pointer, naming it). A
    CPU ``input_q`` takes the fallback; the kernel refuses other tensors off ``input_q``'s GPU,
    naming them, and GPUs below sm_89."""
    if not all(isinstance(t, torch.Tensor) for t in (input_q, input_scale, weight, weight_scale)):
        return False
    assert isinstance(input_q, torch.Tensor) and isinstance(input_scale, torch.Tensor)
    assert isinstance(weight, torch.Tensor) and isinstance(weight_scale, torch.Tensor)
    if input_q.dtype != FP8 or weight.dtype != FP8 or input_q.device.type != "cuda":
        return False
    if input_scale.dtype != torch.float32 or weight_scale.dtype != torch.float32:
        return False
    if out_dtype != torch.bfloat16 and out_dtype != torch.float16:
        return False
    if bias is not None and (
        not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.dtype not in (out_dtype, torch.float32)
    ):
        return False
    if weight.dim() != 2 or input_q.dim() == 0 or not weight.is_contiguous():
        return False
    n, k = weight.shape
    if k == 0 or k % _FP8_ALIGN or input_q.shape[-1] != k:
        return False
    m = input_q.numel() // k
    if m < 1 or m > MAX_ROWS:
        return False
    blocks = -(-k // FP8_BLOCK)
    if tuple(weight_scale.shape) != (-(-n // FP8_BLOCK), blocks):
        return False
    if input_scale.shape[:-1] != input_q.shape[:-1] or input_scale.shape[-1] != blocks or not _collapses(input_scale):
        return False
    if not is_compiling() and (weight.storage_offset() % _FP8_ALIGN or input_q.storage_offset() % _FP8_ALIGN):
        return False
    if input_q.dim() == 2:
        row_stride, inner = input_q.stride()
        return inner == 1 and (m == 1 or row_stride % _FP8_ALIGN == 0)
    return input_q.is_contiguous()


@kernel_op(_FP8_OP, out="out")
def _decode_linear_fp8(
    input_q: torch.Tensor,
    input_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    """The kernel of :func:`decode_linear_fp8` without the fallback: what
    :func:`decode_linear_fp8_serves` accepts; anything else raises, naming the argument."""
    n = weight.shape[0] if weight.ndim else 0
    if input_q.ndim == 2:  # rows as the kernel takes them; C++ checks every shape
        m = input_q.shape[0]
        if out is None:
            out = input_q.new_empty((m, n), dtype=out_dtype)
        args = (out, input_q, input_scale, weight, weight_scale, bias, enable_pdl)
        return _FP8_KERNELS, (8 if m <= 8 else 16, out_dtype), args, out
    x = rows(_FP8_OP, "input_q", input_q)
    if input_scale.dim() != input_q.dim():
        raise ValueError(
            f"{_FP8_OP}: input_scale must have input_q's leading dimensions {tuple(input_q.shape[:-1])}, "
            f"got shape {tuple(input_scale.shape)}"
        )
    scales = rows(_FP8_OP, "input_scale", input_scale)
    shape = (*input_q.shape[:-1], n)
    if out is None:
        out = input_q.new_empty(shape, dtype=out_dtype)
    elif tuple(out.shape) != shape:
        raise ValueError(f"{_FP8_OP}: out must have shape {shape}, got {tuple(out.shape)}")
    m = x.shape[0]
    args = (rows(_FP8_OP, "out", out), x, scales, weight, weight_scale, bias, enable_pdl)
    return _FP8_KERNELS, (8 if m <= 8 else 16, out_dtype), args, out


# cuBLAS has the blockwise (1 x 128 by 128 x 128) fp8 GEMM on sm_90 from CUDA 12.9.
_CUDA_VERSION = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])


#: torch._scaled_mm's blockwise fp8 GEMM (cuBLAS, sm_90) takes the column-major input scales at a
#: leading dimension (the row count) that is a multiple of this (CUBLAS_STATUS_NOT_SUPPORTED
#: otherwise): callers pad the rows.
SCALED_MM_ROW_ALIGN = 4
#: ... and returns wrong products, with no error, where K is not a multiple of this (K / 128, the
#: scales' row length, not a multiple of 4; docs/integrations.md, "Fine-grained fp8 models").
SCALED_MM_K_ALIGN = 4 * FP8_BLOCK


def _scaled_mm_applies(
    input_q: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None
) -> bool:
    """Whether the fallback is ``torch._scaled_mm``'s blockwise fp8 GEMM (cuBLAS): CUDA 12.9 or
    newer, an sm_90 GPU, bf16 out and no bias (so that the result is rounded once), a contiguous
    weight, N a multiple of 16 (cuBLAS's fp8 alignment) and K of :data:`SCALED_MM_K_ALIGN` (cuBLAS
    returns wrong products, without an error, for other K). The device's properties are cached by
    torch (and constant-folded by TorchDynamo)."""
    if _CUDA_VERSION < (12, 9) or input_q.device.type != "cuda" or weight.device != input_q.device:
        return False
    if out_dtype != torch.bfloat16 or bias is not None or not weight.is_contiguous():
        return False
    n, k = weight.shape
    if k % SCALED_MM_K_ALIGN or n % 16:
        return False
    return torch.cuda.get_device_properties(input_q.device).major == 9


def _fp8_fallback(
    input_q: torch.Tensor,
    input_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """The path of every call the kernel does not serve: ``torch._scaled_mm``'s blockwise GEMM where
    it applies (:func:`_scaled_mm_applies`), else both operands dequantised to float32 by their
    blocks, then ``torch.nn.functional.linear`` in float32 (plus the bias in float32), one rounding
    to ``out_dtype``. Checks what it reads, naming the argument."""
    for name, t in (
        ("input_q", input_q),
        ("input_scale", input_scale),
        ("weight", weight),
        ("weight_scale", weight_scale),
    ):
        if not isinstance(t, torch.Tensor):
            not_a_tensor(_FP8_OP, name, t)
    if bias is not None and not isinstance(bias, torch.Tensor):
        not_a_tensor(_FP8_OP, "bias", bias)
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point or out_dtype.itemsize < 2:
        raise TypeError(
            f"{_FP8_OP}: out_dtype must be a floating-point torch.dtype of 16 bits or more, got {out_dtype}"
        )
    for name, t, dtype in (("input_q", input_q, FP8), ("weight", weight, FP8)):
        if t.dtype != dtype:
            raise TypeError(f"{_FP8_OP}: {name} must be float8_e4m3fn, got {str(t.dtype).removeprefix('torch.')}")
    for name, t in (("input_scale", input_scale), ("weight_scale", weight_scale)):
        if t.dtype != torch.float32:
            raise TypeError(
                f"{_FP8_OP}: {name} must be float32 (one scale per 128-wide block; packed UE8M0 and other "
                f"scale dtypes are not supported), got {str(t.dtype).removeprefix('torch.')}"
            )
    if weight.dim() != 2:
        raise ValueError(f"{_FP8_OP}: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if input_q.dim() == 0 or input_q.shape[-1] != k:
        raise ValueError(f"{_FP8_OP}: input_q must be [..., {k}] (weight's K), got shape {tuple(input_q.shape)}")
    blocks = -(-k // FP8_BLOCK)
    if tuple(weight_scale.shape) != (-(-n // FP8_BLOCK), blocks):
        raise ValueError(
            f"{_FP8_OP}: weight_scale must be [ceil(N / 128), ceil(K / 128)] = {(-(-n // FP8_BLOCK), blocks)}, "
            f"got {tuple(weight_scale.shape)}"
        )
    if tuple(input_scale.shape) != (*input_q.shape[:-1], blocks):
        raise ValueError(
            f"{_FP8_OP}: input_scale must be [..., ceil(K / 128)] = {(*input_q.shape[:-1], blocks)}, "
            f"got {tuple(input_scale.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"{_FP8_OP}: bias must be [{n}], got shape {tuple(bias.shape)}")
    if _scaled_mm_applies(input_q, weight, out_dtype, bias):
        # cuBLAS's blockwise fp8 GEMM: A row-major with [M, K / 128] scales at strides (1, M), B = the
        # weight column-major with [K / 128, N / 128] scales whose transpose is contiguous.
        # cuBLAS takes the input scales' leading dimension (the row count) only in multiples of
        # SCALED_MM_ROW_ALIGN: other row counts run padded with zero rows of scale 1.
        x2 = input_q.reshape(-1, k)
        s2 = input_scale.reshape(-1, blocks)
        m = x2.shape[0]
        pad = -m % SCALED_MM_ROW_ALIGN
        if pad:
            x2 = torch.cat([x2, x2.new_zeros(pad, k)])
            s2 = torch.cat([s2, s2.new_ones(pad, blocks)])
        scale_a = s2.t().contiguous().t()
        y = torch._scaled_mm(
            x2.contiguous(), weight.t(), scale_a=scale_a, scale_b=weight_scale.contiguous().t(), out_dtype=out_dtype
        )
        return (y[:m] if pad else y).view(*input_q.shape[:-1], n)
    x = input_q.to(torch.float32) * input_scale.repeat_interleave(FP8_BLOCK, dim=-1)[..., :k]
    w = (
        weight.to(torch.float32)
        * weight_scale.repeat_interleave(FP8_BLOCK, dim=0)[:n].repeat_interleave(FP8_BLOCK, dim=1)[:, :k]
    )
    y = torch.nn.functional.linear(x, w, None if bias is None else bias.to(torch.float32))
    return y.to(out_dtype)


def decode_linear_fp8(
    input_q: torch.Tensor,
    input_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """The fp8 block-scaled linear layer of a decode step (DeepSeek-V3's and transformers'
    ``FP8Linear`` with 128 x 128 weight blocks and dynamic 1 x 128 activation groups):

    ``out[m, n] = sum_b (sum_{k in block b} q[m, k] w[n, k]) * input_scale[m, b] * weight_scale[n // 128, b]
    (+ bias[n])``,

    accumulated in float32 and rounded once to ``out_dtype``. ``input_q [..., K]`` and ``input_scale
    [..., ceil(K / 128)]`` are what :func:`jit_kernel.per_token_group_quant_fp8` (``group_size=128``)
    and the fused RMSNorm + group-quant ops return, row-major or column-major (a TMA-padded buffer
    too: any strides); ``weight [N, K]`` ``float8_e4m3fn`` and ``weight_scale [ceil(N / 128),
    ceil(K / 128)]`` float32 (``FP8Linear.weight_scale_inv``); ``bias [N]`` of ``out_dtype`` or
    float32, or None. Returns ``[..., N]`` of ``out_dtype``, or writes ``out`` (of that shape and
    ``out_dtype``, rows with unit inner stride) and returns it.

    1 to 16 rows run the kernel (fp8 tensor cores, sm_89+; the weight read once; a fixed reduction
    order, so the same inputs give the same bits on every call). Everything else
    (:func:`decode_linear_fp8_serves` is the rule) runs ``torch._scaled_mm``'s blockwise fp8 GEMM
    (cuBLAS) where it applies (CUDA 12.9+, sm_90, bf16 out, no bias, K a multiple of 512, N of 16),
    else the reference: both operands dequantised to float32 and ``torch.nn.functional.linear`` in
    float32, correct but not fast. Packed UE8M0 (int32) or ``float8_e8m0fnu`` scales raise
    ``TypeError`` naming the argument. ``enable_pdl`` as in :func:`decode_linear`."""
    if decode_linear_fp8_serves(input_q, input_scale, weight, weight_scale, out_dtype, bias):
        return _decode_linear_fp8(input_q, input_scale, weight, weight_scale, out_dtype, bias, out, enable_pdl)
    result = _fp8_fallback(input_q, input_scale, weight, weight_scale, out_dtype, bias)
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        not_a_tensor(_FP8_OP, "out", out)
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(
            f"{_FP8_OP}: out must have shape {tuple(result.shape)} and dtype {result.dtype}, "
            f"got {tuple(out.shape)} and {out.dtype}"
        )
    return out.copy_(result)
