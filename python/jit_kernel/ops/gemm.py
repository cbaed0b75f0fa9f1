"""Decode GEMMs: ``decode_linear``, ``torch.nn.functional.linear`` for the 1 to 16 rows of a decode
step (csrc/gemm/decode_linear.cuh).

``decode_linear(input, weight, bias=None, out=None)`` is ``F.linear(input, weight, bias)``: ``input
[..., K]`` (M rows once flattened), ``weight [N, K]`` as ``nn.Linear`` stores it, ``bias [N]`` or
None, the result ``[..., N]`` in the input's dtype. The kernel serves fp16 and bf16 with fp32
accumulation on tensor cores, reading the weight once; its reduction runs in a fixed order, so a call
gives the same bits every time (no atomics, no split-k with atomics). Every other call goes to
``torch.nn.functional.linear`` (cuBLAS): the launcher holds the rule, the one place it is written
(:func:`decode_linear_serves` asks it).

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
from jit_kernel.ops._common import DECLINED, KernelTable, Launch, is_compiling, kernel_op, not_a_tensor, rows

_OP = "decode_linear"
#: The most rows (tokens) the kernels take; more go to ``torch.nn.functional.linear``.
MAX_ROWS = 16
# The kernel's dtypes and their C++ names.
_DTYPES = {torch.bfloat16: "bf16_t", torch.float16: "fp16_t"}


def _config(dtype: torch.dtype) -> Config:
    return (_DTYPES[dtype],)


_KERNELS = KernelTable(Dispatcher(DECODE_LINEAR), "run", _config)


def _linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """The fallback: ``torch.nn.functional.linear``, copied into ``out`` when one is given."""
    if not isinstance(input, torch.Tensor):
        not_a_tensor(_OP, "input", input)
    if not isinstance(weight, torch.Tensor):
        not_a_tensor(_OP, "weight", weight)
    return _into(_OP, torch.nn.functional.linear(input, weight, bias), out)


def _into(op: str, result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A fallback's ``result``, or, with ``out`` given, copied into it (of its shape and dtype)."""
    if out is None:
        return result
    if not isinstance(out, torch.Tensor):
        not_a_tensor(op, "out", out)
    if out.shape != result.shape or out.dtype != result.dtype:
        raise ValueError(
            f"{op}: out must have shape {tuple(result.shape)} and dtype {result.dtype}, "
            f"got {tuple(out.shape)} and {out.dtype}"
        )
    return out.copy_(result)


@kernel_op(_OP, out="out", declined=_linear)
def decode_linear(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    """``torch.nn.functional.linear(input, weight, bias)`` for decode: ``input [..., K]`` of M rows
    (1 to 16 once the leading dimensions are flattened), ``weight [N, K]`` (``nn.Linear``'s layout),
    ``bias [N]`` or None; returns ``[..., N]`` in the input's dtype, or writes ``out`` (which must not
    overlap ``input``) and returns it.

    fp16 and bf16 run the kernel: fp32 accumulation on tensor cores, the weight read once, one
    rounding to the output dtype after the bias; a fixed reduction order, so the same inputs give
    the same bits on every call (at the same GPU). Calls the kernel does not serve go to
    ``torch.nn.functional.linear`` (cuBLAS): more than 16 rows, other dtypes or mixed ones, K not a
    multiple of 8, a weight that is not contiguous or is above 128 MiB (a Llama-3-8B fused gate/up
    projection or a language-model head), input rows that are not 16-byte aligned or do not
    collapse into one stride (the launcher in csrc/gemm/decode_linear.cuh holds the rule;
    :func:`decode_linear_serves` asks it), and an input off the GPU. No host synchronisation:
    CUDA-graph safe. Under
    torch.compile the op is ``torch.ops.jit_kernel.decode_linear``, which makes the same choice
    when it runs.

    ``enable_pdl``: programmatic dependent launch (``None``: on for sm_90+). The kernel starts
    reading ``weight`` before it waits for the previous kernel in the stream, as a layer's weight is
    no kernel's output: pass ``enable_pdl=False`` where the kernel launched just before writes the
    weight (an in-place weight update, say)."""
    dtype = input.dtype
    # The facts read here: the device and the dtype pick the kernel, and where out is allocated, the
    # row count (no output is allocated for a call the launcher would decline); the launcher decides
    # the rest, the row count included, and returns False for what it does not serve.
    if not input.is_cuda or dtype not in _DTYPES:
        return DECLINED
    if out is None:
        shape = input.shape
        if not shape or not 0 < input.numel() <= MAX_ROWS * shape[-1]:
            return DECLINED
        size = list(shape)  # the input's leading dimensions by N
        size[-1] = weight.shape[0] if weight.ndim else 0
        out = input.new_empty(size)
    return _KERNELS, dtype, (out, input, weight, bias, enable_pdl), out


def decode_linear_serves(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`decode_linear` runs its kernel for these arguments (True) or calls
    ``torch.nn.functional.linear`` (False): its launcher's rule, asked without launching. CUDA
    tensors, whose data pointers are part of the rule, or CUDA FakeTensors (taken as aligned; no
    GPU is needed: without one, set ``JIT_KERNEL_CUDA_ARCH``)."""
    return decode_linear.op.serves(input, weight, bias)


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
    return _into(_FP8_OP, _fp8_fallback(input_q, input_scale, weight, weight_scale, out_dtype, bias), out)
