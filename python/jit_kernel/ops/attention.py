"""Attention for decode steps: ``decode_attention`` (one query token per sequence over a KV cache in
transformers' StaticCache layout, csrc/attention/decode.cuh) and ``merge_attn_states`` (two
attention results over disjoint key sets merged into one, csrc/attention/merge.cuh).

``decode_attention`` splits each sequence's keys over several CTAs when the batch times the KV heads
leaves SMs idle (flash-decoding). The launcher chooses the splits from the shapes and the device's
SM count alone, never from ``seq_lens`` (which stays on the device): a call makes no host sync and is
CUDA-graph safe. Up to 8 splits merge inside a thread-block cluster; more go through a float32
workspace the launcher allocates itself, from torch's caching allocator (the graph's pool during a
capture), and a second kernel of the same launch.

Both ops are also ``torch.ops.jit_kernel.decode_attention`` / ``merge_attn_states`` (fake
implementations, mutated outputs declared); the functions switch to those under ``torch.compile``.
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import ATTENTION_HEAD_DIMS, DECODE_ATTENTION, MERGE_ATTN_STATES
from jit_kernel.ops._common import CPP_DTYPE, KernelTable, Launch, float_dtype, kernel_op, not_a_tensor

_DECODE_OP = "decode_attention"
_MERGE_OP = "merge_attn_states"
_DECODE_DTYPES = (torch.bfloat16, torch.float16)


def _decode_config(dtype: torch.dtype, head_dim: int) -> tuple[int, str]:
    if dtype not in _DECODE_DTYPES:
        raise TypeError(f"{_DECODE_OP}: query must be bfloat16 or float16, got {str(dtype).removeprefix('torch.')}")
    if head_dim not in ATTENTION_HEAD_DIMS:
        dims = ", ".join(map(str, ATTENTION_HEAD_DIMS))
        raise ValueError(
            f"{_DECODE_OP}: the head dim of query (its last dimension) must be one of {dims}, got {head_dim}"
        )
    return head_dim, CPP_DTYPE[dtype]


_DECODE = KernelTable(Dispatcher(DECODE_ATTENTION), "run", _decode_config)
_MERGE = KernelTable(Dispatcher(MERGE_ATTN_STATES), "run", lambda dtype: (float_dtype(_MERGE_OP, "out_a", dtype),))


def _rank(op: str, name: str, t: object, rank: int, layout: str) -> None:
    """What the op needs of a tensor to size what it allocates (C++ checks every rule again)."""
    if not isinstance(t, torch.Tensor):
        not_a_tensor(op, name, t)
    if t.dim() != rank:
        raise ValueError(f"{op}: {name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")


# ---------------------------------------------------------------------------------------------
# decode_attention


@kernel_op(_DECODE_OP, mutates=("out", "lse"))
def _decode(
    out: torch.Tensor,
    lse: torch.Tensor | None,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    enable_pdl: bool | None = None,
) -> Launch:
    key = (query.dtype, query.shape[-1] if query.dim() else 0)
    args = (out, lse, query, k_cache, v_cache, seq_lens, scale, enable_pdl)
    return _DECODE, key, args, None


def decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    enable_pdl: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query token per sequence: ``query [B, Hq, D]`` (bf16 or fp16; D 64, 128 or
    256) over the first ``seq_lens[b]`` keys of ``k_cache`` / ``v_cache [B, Hkv, max_len, D]``
    (transformers' StaticCache layout, the query's dtype; unit last stride, other strides multiples
    of 16 bytes), with ``Hq`` a multiple of ``Hkv`` (grouped-query heads: query head ``h`` attends
    to KV head ``h // (Hq // Hkv)``). ``seq_lens [B]``: int32 or int64 on the device.

    Returns ``out [B, Hq, D]`` in the query's dtype (into ``out`` when given) and, with
    ``return_lse``, the float32 log-sum-exp ``[B, Hq]`` of the scaled scores (natural log), what
    :func:`merge_attn_states` takes. ``scale`` defaults to ``1 / sqrt(D)``; scores and sums are fp32.

    A length of 0 gives out 0 and lse -inf (an empty key set); a length below 0 or above
    ``max_len`` gives NaN for that sequence (the kernel reads nothing outside the cache).

    ``enable_pdl``: launch with programmatic dependent launch (``None``: on for sm_90+)."""
    _rank(_DECODE_OP, "query", query, 3, "[batch, num_heads, head_dim]")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    lse = query.new_empty(query.shape[:2], dtype=torch.float32) if return_lse else None
    if scale is None:
        scale = query.shape[-1] ** -0.5
    elif isinstance(scale, int) and not isinstance(scale, bool):
        scale = float(scale)
    _decode(out, lse, query, k_cache, v_cache, seq_lens, scale, enable_pdl)
    return (out, lse) if lse is not None else out


# ---------------------------------------------------------------------------------------------
# merge_attn_states


@kernel_op(_MERGE_OP, mutates=("out", "lse"))
def _merge(
    out: torch.Tensor,
    lse: torch.Tensor,
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    enable_pdl: bool | None = None,
) -> Launch:
    return _MERGE, out_a.dtype, (out, lse, out_a, lse_a, out_b, lse_b, enable_pdl), None


def merge_attn_states(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention results over disjoint key sets into the result over their union:
    ``out_a``, ``out_b [N, H, D]`` (fp32, bf16 or fp16, one dtype; unit last stride) with their
    float32 log-sum-exps ``lse_a``, ``lse_b [N, H]`` (natural log, any strides). Returns ``(out,
    lse)``: ``out [N, H, D]`` in the inputs' dtype (into ``out`` when given) and float32 ``lse [N, H]``::

        m = max(lse_a, lse_b)
        out = (out_a * exp(lse_a - m) + out_b * exp(lse_b - m)) / (exp(lse_a - m) + exp(lse_b - m))
        lse = m + log(exp(lse_a - m) + exp(lse_b - m))

    An lse of -inf is an empty part: the other part is returned exactly (its values as they are,
    whatever the empty part holds); both -inf give out 0 and lse -inf, never NaN. A NaN or +inf lse
    gives NaN."""
    _rank(_MERGE_OP, "out_a", out_a, 3, "[num_tokens, num_heads, head_dim]")
    if out is None:
        out = torch.empty_like(out_a, memory_format=torch.contiguous_format)
    lse = out_a.new_empty(out_a.shape[:2], dtype=torch.float32)
    _merge(out, lse, out_a, lse_a, out_b, lse_b, enable_pdl)
    return out, lse
