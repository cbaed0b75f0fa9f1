"""Mixture-of-experts routing and combine (csrc/moe/).

- ``topk_softmax``: softmax over the router's logits, then the ``topk`` best experts (Mixtral,
  Qwen3-MoE, gpt-oss route this way); ``renormalize=True`` divides the chosen weights by their sum
  (Qwen3-MoE's ``norm_topk_prob``; for a softmax this equals a softmax over the chosen logits, which
  gpt-oss applies).
- ``topk_sigmoid``: sigmoid scores; ``correction_bias`` is added for the choice only, the weights are
  the unbiased scores (DeepSeek-V3's rule).
- ``grouped_topk``: DeepSeek-V3 / Kimi-K2 routing: experts split into ``num_expert_group``
  contiguous groups, a group scored by the sum of its two best selection scores with a
  ``correction_bias`` (else by its best score), experts chosen only within the ``topk_group`` best
  groups; weights optionally renormalised, then multiplied by ``routed_scaling_factor``.
- ``moe_align_block_size``: the (token, slot) pairs sorted by expert, padded per expert to
  ``block_size``, in the layout vLLM's and SGLang's Triton fused-MoE GEMMs read (csrc/moe/align.cuh).
- ``moe_sum_reduce``: ``out[t] = routed_scaling_factor * sum_k weights[t, k] * expert_out[t, k]``,
  accumulated in fp32.

Ranking: by ``score + correction_bias`` with a bias, else by the logits (the scores' order, without
the ties that rounding scores to fp32 makes); among equal ranks the lowest expert index wins (groups
likewise), and NaN ranks first, as in ``torch.topk``. Scores are computed in fp32 from fp16, bf16
or fp32 logits; weights are float32 ``[T, topk]``, ids int32. Up to 512 experts, top-k up to 32, up
to 32 groups. Every op is also ``torch.ops.jit_kernel.<name>``
(fake implementations, mutated outputs declared); the functions switch to those under
``torch.compile``. ``enable_pdl``: programmatic dependent launch (``None``: on for sm_90+).
"""

from __future__ import annotations

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import MOE_ALIGN, MOE_ROUTE, MOE_SUM_REDUCE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor

_ROUTE = KernelTable(
    Dispatcher(MOE_ROUTE), "route", lambda dtype: (float_dtype("moe routing", "gating_output", dtype),)
)
_ALIGN = KernelTable(Dispatcher(MOE_ALIGN), "run", lambda: ())
_SUM = KernelTable(
    Dispatcher(MOE_SUM_REDUCE), "run", lambda dtype: (float_dtype("moe_sum_reduce", "expert_out", dtype),)
)

# grouped_topk's scoring_func -> the launcher's `softmax` flag.
_SOFTMAX_SCORING = {"softmax": True, "sigmoid": False}


def _positive_int(op: str, name: str, value: object) -> int:
    """An int >= 1: Python sizes the outputs from it (C++ checks its range again)."""
    if type(value) is not int:
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{op}: {name} must be >= 1, got {value}")
    return value


def _route_outputs(op: str, gating_output: object, topk: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(gating_output, torch.Tensor):
        not_a_tensor(op, "gating_output", gating_output)
    k = topk if type(topk) is int and topk > 0 else _positive_int(op, "topk", topk)
    rows = gating_output.shape[0] if gating_output.ndim >= 1 else 0
    return (
        gating_output.new_empty((rows, k), dtype=torch.float32),
        gating_output.new_empty((rows, k), dtype=torch.int32),
    )


_OUTPUTS = ("topk_weights", "topk_ids")


@kernel_op("topk_softmax", mutates=_OUTPUTS)
def _topk_softmax(
    gating_output: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    renormalize: bool = False,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (topk_weights, topk_ids, gating_output, None, True, renormalize, 1, 1, 1.0, enable_pdl)
    return _ROUTE, gating_output.dtype, args, None


@kernel_op("topk_sigmoid", mutates=_OUTPUTS)
def _topk_sigmoid(
    gating_output: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (topk_weights, topk_ids, gating_output, correction_bias, False, renormalize, 1, 1, 1.0, enable_pdl)
    return _ROUTE, gating_output.dtype, args, None


@kernel_op("grouped_topk", mutates=_OUTPUTS)
def _grouped_topk(
    gating_output: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    correction_bias: torch.Tensor | None,
    routed_scaling_factor: float,
    scoring_func: str,
    enable_pdl: bool | None = None,
) -> Launch:
    softmax = _SOFTMAX_SCORING.get(scoring_func) if type(scoring_func) is str else None
    if softmax is None:
        raise ValueError(f"grouped_topk: scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}")
    args = (
        topk_weights,
        topk_ids,
        gating_output,
        correction_bias,
        softmax,
        renormalize,
        num_expert_group,
        topk_group,
        routed_scaling_factor,
        enable_pdl,
    )
    return _ROUTE, gating_output.dtype, args, None


def topk_softmax(
    gating_output: torch.Tensor, topk: int, renormalize: bool = False, enable_pdl: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of ``softmax(gating_output)`` (``[T, E]``, fp16/bf16/fp32, E <= 512). Returns
    ``(weights float32 [T, topk], ids int32 [T, topk])`` in descending order of weight, the lowest
    expert index first among equal weights; ``renormalize`` divides the weights by their sum."""
    weights, ids = _route_outputs("topk_softmax", gating_output, topk)
    _topk_softmax(gating_output, weights, ids, renormalize, enable_pdl)
    return weights, ids


def topk_sigmoid(
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k experts of ``sigmoid(gating_output)``, chosen on ``sigmoid + correction_bias`` (``[E]``,
    float32 or the logits' dtype) when given; the weights are the unbiased sigmoid scores (divided by
    their sum with ``renormalize``). Returns ``(weights float32 [T, topk], ids int32 [T, topk])``."""
    weights, ids = _route_outputs("topk_sigmoid", gating_output, topk)
    _topk_sigmoid(gating_output, weights, ids, renormalize, correction_bias, enable_pdl)
    return weights, ids


def grouped_topk(
    gating_output: torch.Tensor,
    topk: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool = True,
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    scoring_func: str = "sigmoid",
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 / Kimi-K2 routing (module docstring): ``scoring_func`` ``"sigmoid"`` or
    ``"softmax"``; the experts (E <= 512) split into ``num_expert_group`` (<= 32) contiguous groups;
    choice only within the ``topk_group`` best groups. Weights are the unbiased scores, divided by
    their sum with ``renormalize``, times ``routed_scaling_factor``. Returns ``(weights float32
    [T, topk], ids int32 [T, topk])``."""
    weights, ids = _route_outputs("grouped_topk", gating_output, topk)
    _grouped_topk(
        gating_output,
        weights,
        ids,
        num_expert_group,
        topk_group,
        renormalize,
        correction_bias,
        routed_scaling_factor,
        scoring_func,
        enable_pdl,
    )
    return weights, ids


@kernel_op("moe_align_block_size", mutates=("sorted_token_ids", "expert_ids", "num_tokens_post_padded"))
def _moe_align(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    expert_map: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        topk_ids,
        num_experts,
        block_size,
        expert_map,
        enable_pdl,
    )
    return _ALIGN, (), args, None


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    expert_map: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the pairs of ``topk_ids`` (``[T, k]`` int32 or int64) by expert for a Triton fused-MoE
    GEMM. Returns int32 ``(sorted_token_ids [T*k + min(T*k, E) * (block_size-1)], expert_ids
    [ceil(that / block_size)], num_tokens_post_padded [1])`` (at most ``min(T*k, E)`` experts have
    pairs, each padded by at most ``block_size - 1``): each expert's flat pair indices ``t * k + slot``
    (in unspecified order within the expert), padded with ``T * k`` to a multiple of
    ``block_size``, experts in ascending order; ``expert_ids[b]`` is block ``b``'s expert, or
    ``expert_map[expert]`` (int32 ``[E]``, -1 for experts not on this rank) with an expert-parallel
    map; blocks past ``num_tokens_post_padded`` hold 0, pairs past it ``T * k``. Ids outside
    ``[0, E)`` are not placed."""
    op = "moe_align_block_size"
    if not isinstance(topk_ids, torch.Tensor):
        not_a_tensor(op, "topk_ids", topk_ids)
    experts = (
        num_experts if type(num_experts) is int and num_experts > 0 else _positive_int(op, "num_experts", num_experts)
    )
    block = block_size if type(block_size) is int and block_size > 0 else _positive_int(op, "block_size", block_size)
    numel = topk_ids.numel()
    # min for the eager int; torch.sym_min keeps a symbolic size symbolic while torch.compile traces.
    length = numel + (min(numel, experts) if type(numel) is int else torch.sym_min(numel, experts)) * (block - 1)
    sorted_ids = topk_ids.new_empty((length,), dtype=torch.int32)
    expert_ids = topk_ids.new_empty(((length + block - 1) // block,), dtype=torch.int32)
    post_padded = topk_ids.new_empty((1,), dtype=torch.int32)
    _moe_align(topk_ids, experts, block, sorted_ids, expert_ids, post_padded, expert_map, enable_pdl)
    return sorted_ids, expert_ids, post_padded


@kernel_op("moe_sum_reduce", out="out")
def moe_sum_reduce(
    expert_out: torch.Tensor,
    weights: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
    enable_pdl: bool | None = None,
) -> Launch:
    """``out[t, h] = routed_scaling_factor * sum_k weights[t, k] * expert_out[t, k, h]`` (``expert_out``
    ``[T, k, H]`` fp16/bf16/fp32 with unit last stride; ``weights`` ``[T, k]`` float32 or the same
    dtype, or None for all ones), accumulated in fp32 and rounded once. Returns ``out [T, H]``."""
    if out is None:
        if expert_out.ndim != 3:
            raise ValueError(f"moe_sum_reduce: expert_out must be [T, k, H], got shape {tuple(expert_out.shape)}")
        shape = expert_out.shape
        out = expert_out.new_empty((shape[0], shape[2]))
    return _SUM, expert_out.dtype, (out, expert_out, weights, routed_scaling_factor, enable_pdl), out
