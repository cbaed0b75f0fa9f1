"""Sampling: temperature, top-k, top-p and min-p filtering, then a draw, a renormalisation or a
mask, one launch per call (csrc/sampling/sample.cuh); and FlashInfer's entry points of
``flashinfer.sampling`` on the same kernel.

Semantics (``sample``):

- The order is vLLM's: ``logits / temperature``, then top-k, then top-p over the renormalised
  top-k set, then min-p (``p >= min_p * max(p)``). FlashInfer's ``filter_apply_order="top_k_first"``
  is this order; ``"joint"`` takes top-p over the whole row's mass, not the top-k set's, and keeps
  the tokens that pass both.
- Ties at a threshold are kept: every token equal to the k-th largest logit, and every token of the
  weight at which top-p's cumulative mass, from the top, first reaches ``p``.
- ``temperature == 0`` rows are greedy: the argmax, the lowest index among ties, in the same launch.
- Per-request parameters are CUDA tensors ``[B]`` (float32; ``top_k`` int32 or int64) or Python
  scalars for every row; None turns a filter off.
- Random numbers: Philox4x32-10 keyed by the request's ``seed``, counter ``(offset, 0)``: int64
  tensors ``[B]`` give each request its own stream, independent of its slot in the batch, so a
  request draws the same token at any slot and batch size. ``sample`` adds one to ``offset`` in
  place on the device, so every replay of a captured CUDA graph draws new numbers with nothing
  rewritten. Int ``seed`` / ``offset`` give one stream per row (the row is the counter's second
  word) and advance nothing. Without ``seed``, a seed is drawn from torch's CUDA generator
  (``torch.randint`` on the device: graph-safe, as ``torch.multinomial``).
- Probability mass is summed in 64-bit fixed point (``round(exp(x - max) * 2^30)`` per token), so a
  row's result is bit for bit the same on every call and slot; a token below 2^-31 of the largest
  probability is never drawn.
- Invalid rows never fault: a NaN or +inf logit, no finite logit (no positive probability), or a
  tensor parameter out of range (temperature < 0 or NaN, top_k < 1, top_p outside (0, 1], min_p
  outside [0, 1]) gives token id -1 and log-probability NaN (``ids < 0`` marks them), and a row
  of NaN from the renormalisation and mask ops. Scalar parameters out of range raise
  ``ValueError`` naming the argument.

FlashInfer's entry points (``sampling_from_logits`` ... ``top_k_mask_logits``) take its names,
argument order and defaults; the differences:

- A ``[B]`` tensor ``seed`` is the request's own stream (FlashInfer also mixes the row index into
  its Philox subsequence, so a request's draws there change with its slot); a ``[1]`` tensor or an
  int seed gives one stream per row, as there. These entry points do not advance ``offset``
  (neither does FlashInfer); ``sample`` does.
- Invalid rows give -1 (FlashInfer returns an ordinary id); ``return_valid`` reports them.
- ``deterministic`` / ``is_deterministic`` are accepted and ignored: every path is deterministic.
- Inputs may be fp32, bf16 or fp16; the renormalised probabilities keep the input's dtype.

Every op is also ``torch.ops.jit_kernel.sample`` / ``sampling_filter`` (fake implementations,
mutated outputs declared); the functions switch to those under ``torch.compile``.
"""

from __future__ import annotations

from typing import Any

import torch

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import SAMPLING
from jit_kernel.ops._common import FLOAT_DTYPES, KernelTable, Launch, float_dtype, kernel_op

_SAMPLING = Dispatcher(SAMPLING)
# The kernel's modes (csrc/sampling/sample.cuh Mode).
_SAMPLE, _RENORM, _MASK = 0, 1, 2

# One kernel serves every op; the public functions name their own op in a dtype error (_rows).
_DRAW_KERNELS = KernelTable(_SAMPLING, "run", lambda dtype: (float_dtype("sample", "logits", dtype),))
_FILTER_KERNELS = KernelTable(_SAMPLING, "run", lambda dtype: (float_dtype("sampling_filter", "input", dtype),))


Number = float | int
Param = torch.Tensor | Number | None


def _split(op: str, name: str, value: Param, integer: bool = False) -> tuple[torch.Tensor | None, Any]:
    """A per-request parameter as (tensor, None), (None, scalar) or (None, None) (off)."""
    if value is None or isinstance(value, torch.Tensor):
        return value, None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an int" if integer else "a float"
        raise TypeError(f"{op}: {name} must be a CUDA tensor [batch], {kind} or None, got {type(value).__name__}")
    if integer:
        if not isinstance(value, int):
            raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
        return None, value
    return None, float(value)


def _split_all(op: str, temperature: Param, top_k: Param, top_p: Param, min_p: Param) -> tuple[Any, ...]:
    """The four per-request parameters as the launcher takes them, each ``_split``: ``(temperature,
    temperature_value, top_k, top_k_value, top_p, top_p_value, min_p, min_p_value)``."""
    return (
        *_split(op, "temperature", temperature),
        *_split(op, "top_k", top_k, integer=True),
        *_split(op, "top_p", top_p),
        *_split(op, "min_p", min_p),
    )


def philox_inputs(
    op: str, seed: object, offset: object, device: torch.device, generator: torch.Generator | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, int, int]:
    """``(seed tensor, offset tensor, seed int, offset int)`` for a launcher that draws Philox
    numbers (the sampler's and the speculative ops'): both int64 tensors (C++ checks them), ints
    (``offset`` defaults to 0), or neither: a seed drawn from ``generator`` (torch's CUDA generator
    by default) on the device, so that CUDA-graph replays draw fresh numbers."""
    if seed is None:
        if offset is not None:
            raise ValueError(f"{op}: offset is given without seed; pass both, or neither to draw from torch")
        drawn = torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64, generator=generator)
        return drawn, None, 0, 0
    if isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor):
        if not (isinstance(seed, torch.Tensor) and isinstance(offset, torch.Tensor)):
            raise ValueError(f"{op}: seed and offset must both be tensors or both be ints")
        return seed, offset, 0, 0
    return None, None, _int64(op, "seed", seed), _int64(op, "offset", 0 if offset is None else offset)


def _int64(op: str, name: str, value: object) -> int:
    """A 64-bit seed or offset as the int64 the launcher takes (its bits; C++ reads them unsigned)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int64 CUDA tensor, an int or None, got {type(value).__name__}")
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"{op}: {name} must fit in 64 bits, got {value}")
    return value - 2**64 if value >= 2**63 else value


# ---------------------------------------------------------------------------------------------
# The two declared ops: a draw (token ids), and a filter that writes rows (renorm, mask).


@kernel_op("sample", mutates=("out", "logprobs", "offset"))
def _draw(
    out: torch.Tensor,
    logprobs: torch.Tensor | None,
    input: torch.Tensor,
    indices: torch.Tensor | None,
    temperature: torch.Tensor | None,
    temperature_value: float | None,
    top_k: torch.Tensor | None,
    top_k_value: int | None,
    top_p: torch.Tensor | None,
    top_p_value: float | None,
    min_p: torch.Tensor | None,
    min_p_value: float | None,
    seed: torch.Tensor | None,
    offset: torch.Tensor | None,
    seed_value: int,
    offset_value: int,
    probs: bool,
    joint: bool,
    advance: bool,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (
        out,
        logprobs,
        input,
        indices,
        temperature,
        temperature_value,
        top_k,
        top_k_value,
        top_p,
        top_p_value,
        min_p,
        min_p_value,
        seed,
        offset,
        seed_value,
        offset_value,
        _SAMPLE,
        probs,
        joint,
        advance,
        enable_pdl,
    )
    return _DRAW_KERNELS, input.dtype, args, None


@kernel_op("sampling_filter", mutates=("out",))
def _filter(
    out: torch.Tensor,
    input: torch.Tensor,
    temperature: torch.Tensor | None,
    temperature_value: float | None,
    top_k: torch.Tensor | None,
    top_k_value: int | None,
    top_p: torch.Tensor | None,
    top_p_value: float | None,
    min_p: torch.Tensor | None,
    min_p_value: float | None,
    renorm: bool,
    joint: bool,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (
        out,
        None,
        input,
        None,
        temperature,
        temperature_value,
        top_k,
        top_k_value,
        top_p,
        top_p_value,
        min_p,
        min_p_value,
        None,
        None,
        0,
        0,
        _RENORM if renorm else _MASK,
        renorm,
        joint,
        False,
        enable_pdl,
    )
    return _FILTER_KERNELS, input.dtype, args, None


def _rows(op: str, name: str, input: object) -> int:
    """The rows of ``input [B, V]``; the errors the shared declared op cannot name the op in."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(input).__name__}")
    if input.dtype not in FLOAT_DTYPES:
        float_dtype(op, name, input.dtype)
    if input.ndim != 2:
        raise ValueError(f"{op}: {name} must have 2 dimensions [batch, vocab], got shape {tuple(input.shape)}")
    return input.shape[0]


def _draw_call(
    op: str,
    input: torch.Tensor,
    *,
    probs: bool,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
    indices: torch.Tensor | None = None,
    seed: object = None,
    offset: object = None,
    generator: torch.Generator | None = None,
    joint: bool = False,
    advance: bool = False,
    return_logprobs: bool = False,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    name = "probs" if probs else "logits"
    rows = _rows(op, name, input)
    if indices is not None and not isinstance(indices, torch.Tensor):
        raise TypeError(f"{op}: indices must be a torch.Tensor or None, got {type(indices).__name__}")
    batch = indices.shape[0] if indices is not None and indices.dim() == 1 else rows
    if out is None:
        dtype = indices.dtype if indices is not None and indices.dtype in (torch.int32, torch.int64) else torch.int32
        out = input.new_empty(batch, dtype=dtype)
    logprobs = input.new_empty(batch, dtype=torch.float32) if return_logprobs else None
    filters = _split_all(op, temperature, top_k, top_p, min_p)
    temperature_tensor, temperature_value = filters[:2]
    if seed is None and offset is None and temperature_tensor is None and temperature_value == 0.0:
        philox = None, None, 0, 0  # every row greedy: no random numbers to draw
    else:
        philox = philox_inputs(op, seed, offset, input.device, generator)
    _draw(out, logprobs, input, indices, *filters, *philox, probs, joint, advance, enable_pdl)
    return out, logprobs


def _check_nan(op: str, name: str, input: torch.Tensor) -> None:
    """FlashInfer's ``check_nan``: a host sync that raises for a NaN in ``input``."""
    if bool(torch.isnan(input).any()):
        raise ValueError(f"{op}: {name} contains NaN")


def _order(op: str, filter_apply_order: str) -> bool:
    """Whether ``filter_apply_order`` is FlashInfer's "joint" (else "top_k_first")."""
    if filter_apply_order not in ("top_k_first", "joint"):
        raise ValueError(f"{op}: filter_apply_order must be 'top_k_first' or 'joint', got {filter_apply_order!r}")
    return filter_apply_order == "joint"


def _with_valid(samples: torch.Tensor, return_valid: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    return (samples, samples >= 0) if return_valid else samples


# ---------------------------------------------------------------------------------------------
# Public ops


def sample(
    logits: torch.Tensor,
    *,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_logprobs: bool = False,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits [B, V]`` (fp32, bf16 or fp16; V up to 393,216) after
    temperature, top-k, top-p and min-p, in one launch. Returns int32 token ids ``[B]`` (into
    ``out``, int32 or int64, when given; -1 for an invalid row) and, with ``return_logprobs``, the
    float32 log-probability of each token under the processed distribution (0 for greedy rows).

    ``temperature`` / ``top_k`` / ``top_p`` / ``min_p``: a CUDA tensor ``[B]`` (float32; top_k int32
    or int64), a scalar for every row, or None (off); ``temperature == 0`` is greedy. ``seed`` and
    ``offset``: int64 CUDA tensors ``[B]`` (each request's own stream; ``offset`` is advanced by one
    in place), ints (one stream per row, nothing advanced), or None (a seed from torch's generator).
    See the module docstring for the order of the filters and the treatment of ties."""
    ids, logprobs = _draw_call(
        "sample",
        logits,
        probs=False,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
        offset=offset,
        advance=isinstance(offset, torch.Tensor),
        return_logprobs=return_logprobs,
        out=out,
        enable_pdl=enable_pdl,
    )
    return (ids, logprobs) if logprobs is not None else ids


def _filtered(
    op: str,
    input: torch.Tensor,
    *,
    renorm: bool,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
    joint: bool = False,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    _rows(op, "probs" if renorm else "logits", input)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    _filter(out, input, *_split_all(op, temperature, top_k, top_p, min_p), renorm, joint, enable_pdl)
    return out


def mask_logits(
    logits: torch.Tensor,
    *,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
    out: torch.Tensor | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """The processed logits of ``sample``'s filters: ``logits / temperature`` where a token is kept,
    -inf elsewhere (greedy rows, temperature 0: the raw argmax logit, -inf elsewhere), in the input's
    dtype; invalid rows are NaN. A softmax of the result is the distribution ``sample`` draws from."""
    return _filtered(
        "mask_logits",
        logits,
        renorm=False,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        out=out,
        enable_pdl=enable_pdl,
    )


# ---------------------------------------------------------------------------------------------
# FlashInfer's entry points (flashinfer.sampling), same names, argument order and defaults.


def sampling_from_logits(
    logits: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """A token per row of ``logits`` from ``softmax(logits)`` (FlashInfer's ``sampling_from_logits``)."""
    if check_nan:
        _check_nan("sampling_from_logits", "logits", logits)
    ids, _ = _draw_call(
        "sampling_from_logits", logits, probs=False, indices=indices, seed=seed, offset=offset, generator=generator
    )
    return ids


def sampling_from_probs(
    probs: torch.Tensor,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_valid: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A token per row of ``probs`` (FlashInfer's ``sampling_from_probs``; rows need not sum to 1)."""
    if check_nan:
        _check_nan("sampling_from_probs", "probs", probs)
    ids, _ = _draw_call(
        "sampling_from_probs", probs, probs=True, indices=indices, seed=seed, offset=offset, generator=generator
    )
    return _with_valid(ids, return_valid)


def top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_valid: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A token per row from the smallest top set of ``probs`` holding ``top_p`` of its mass."""
    op = "top_p_sampling_from_probs"
    if check_nan:
        _check_nan(op, "probs", probs)
    ids, _ = _draw_call(
        op, probs, probs=True, top_p=top_p, indices=indices, seed=seed, offset=offset, generator=generator
    )
    return _with_valid(ids, return_valid)


def top_k_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_valid: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A token per row from the ``top_k`` largest ``probs`` (ties at the k-th kept)."""
    op = "top_k_sampling_from_probs"
    if check_nan:
        _check_nan(op, "probs", probs)
    ids, _ = _draw_call(
        op, probs, probs=True, top_k=top_k, indices=indices, seed=seed, offset=offset, generator=generator
    )
    return _with_valid(ids, return_valid)


def min_p_sampling_from_probs(
    probs: torch.Tensor,
    min_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_valid: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A token per row from the ``probs`` of at least ``min_p`` times the row's largest."""
    op = "min_p_sampling_from_probs"
    if check_nan:
        _check_nan(op, "probs", probs)
    ids, _ = _draw_call(
        op, probs, probs=True, min_p=min_p, indices=indices, seed=seed, offset=offset, generator=generator
    )
    return _with_valid(ids, return_valid)


def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """A token per row of ``logits`` after top-k and top-p, in one launch (FlashInfer masks, takes a
    softmax and samples: three)."""
    op = "top_k_top_p_sampling_from_logits"
    joint = _order(op, filter_apply_order)
    if check_nan:
        _check_nan(op, "logits", logits)
    ids, _ = _draw_call(
        op,
        logits,
        probs=False,
        top_k=top_k,
        top_p=top_p,
        joint=joint,
        indices=indices,
        seed=seed,
        offset=offset,
        generator=generator,
    )
    return ids


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    return_valid: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A token per row of ``probs`` after top-k and top-p."""
    op = "top_k_top_p_sampling_from_probs"
    joint = _order(op, filter_apply_order)
    if check_nan:
        _check_nan(op, "probs", probs)
    ids, _ = _draw_call(
        op,
        probs,
        probs=True,
        top_k=top_k,
        top_p=top_p,
        joint=joint,
        indices=indices,
        seed=seed,
        offset=offset,
        generator=generator,
    )
    return _with_valid(ids, return_valid)


def top_k_renorm_probs(probs: torch.Tensor, top_k: torch.Tensor | int, is_deterministic: bool = False) -> torch.Tensor:
    """``probs`` with every entry outside the ``top_k`` largest of its row set to 0, renormalised."""
    return _filtered("top_k_renorm_probs", probs, renorm=True, top_k=top_k)


def top_p_renorm_probs(
    probs: torch.Tensor, top_p: torch.Tensor | float, is_deterministic: bool = False
) -> torch.Tensor:
    """``probs`` with every entry outside the smallest top set holding ``top_p`` of the mass set
    to 0, renormalised."""
    return _filtered("top_p_renorm_probs", probs, renorm=True, top_p=top_p)


def top_k_mask_logits(logits: torch.Tensor, top_k: torch.Tensor | int) -> torch.Tensor:
    """``logits`` with every entry outside the ``top_k`` largest of its row set to -inf."""
    return _filtered("top_k_mask_logits", logits, renorm=False, top_k=top_k)
