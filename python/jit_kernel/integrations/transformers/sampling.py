"""``generate()``'s sampling filters (temperature, top-k, top-p, min-p) as one ``mask_logits`` launch:
:class:`JitKernelLogitsProcessor`, and :func:`logits_processor`, which reads the filters from a
``GenerationConfig`` and returns a copy of it that turns transformers' own warpers off.

transformers builds its warpers in ``_get_logits_processor`` when ``do_sample`` is set, in the order
temperature, top-k, top-p, min-p, each one a few launches: a division, a ``topk``, a sort with a
softmax and a cumulative sum, a softmax with a maximum. User processors passed as ``logits_processor=``
run after its other processors (repetition penalty, bad words, ...) and before those warpers, so the
processor sits where the warpers did once they are off. The softmax and ``torch.multinomial`` of the
sampling step stay transformers': ``generate()`` has no hook that replaces the draw.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

import jit_kernel
from jit_kernel.ops._common import FLOAT_DTYPES

Number = float | int


def _number(owner: str, name: str, value: object, integer: bool = False) -> None:
    if integer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{owner}: {name} must be an int or None, got {type(value).__name__}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}: {name} must be a float or None, got {type(value).__name__}")


def _validated(
    owner: str, temperature: Number | None, top_k: int | None, top_p: Number | None, min_p: Number | None
) -> tuple[float | None, int | None, float | None, float | None]:
    """The parameters in ``mask_logits``' ranges, as floats and an int; a ``TypeError`` or ``ValueError``
    naming the argument otherwise. top_p 1 and min_p 0 keep every token, so they are returned as None."""
    if temperature is not None:
        _number(owner, "temperature", temperature)
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"{owner}: temperature must be a finite float >= 0 (0: greedy), got {temperature}")
        temperature = float(temperature)
    if top_k is not None:
        _number(owner, "top_k", top_k, integer=True)
        if top_k < 1:
            raise ValueError(f"{owner}: top_k must be at least 1 (None: off), got {top_k}")
    if top_p is not None:
        _number(owner, "top_p", top_p)
        if not 0 < top_p <= 1:
            raise ValueError(f"{owner}: top_p must be in (0, 1] (None: off), got {top_p}")
        top_p = None if top_p == 1 else float(top_p)
    if min_p is not None:
        _number(owner, "min_p", min_p)
        if not 0 <= min_p <= 1:
            raise ValueError(f"{owner}: min_p must be in [0, 1] (None: off), got {min_p}")
        min_p = None if min_p == 0 else float(min_p)
    return temperature, top_k, top_p, min_p


def torch_mask_logits(
    logits: torch.Tensor,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """``mask_logits`` in torch, on any device, for scalar parameters: ``logits [B, V] / temperature``
    (computed in fp32, returned in the input's dtype) where a token is kept, -inf elsewhere.

    Temperature, then top-k (every token equal to the k-th largest kept), then top-p over the
    renormalised top-k set (the smallest top set whose mass reaches ``top_p``, with every token of
    the weight at which it does), then min-p (``p >= min_p * max p``). Temperature 0 keeps the raw
    argmax logit only (the lowest index among ties). A row with a NaN or +inf logit, or with no
    finite one, is NaN. Masses are summed in float64 (the kernel sums in fixed point), so the two
    agree wherever a threshold is not within rounding of a cumulative mass or probability ratio."""
    x = logits.float()
    vocab = x.shape[-1]
    valid = ~(torch.isnan(x) | (x == math.inf)).any(-1, keepdim=True) & (x > -math.inf).any(-1, keepdim=True)
    if temperature == 0:
        top = torch.where(valid, x, 0.0).argmax(-1, keepdim=True)
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, top, True)
        out = torch.where(keep, x, -math.inf)
    else:
        score = x if temperature is None else x / temperature
        keep = score > -math.inf
        if top_k is not None and top_k < vocab:
            kth = score.topk(top_k, dim=-1).values[..., -1:]
            keep &= score >= kth
        if top_p is not None or min_p is not None:
            q = torch.softmax(torch.where(keep, score.double(), -math.inf), dim=-1)
            if top_p is not None:
                qs = q.sort(-1, descending=True).values
                last = (qs.cumsum(-1) < top_p).sum(-1, keepdim=True).clamp(max=vocab - 1)
                keep &= q >= qs.gather(-1, last)
                q = torch.where(keep, q, 0.0)
            if min_p is not None:
                keep &= q >= min_p * q.amax(-1, keepdim=True)
        out = torch.where(keep, score, -math.inf)
    return torch.where(valid, out, math.nan).to(logits.dtype)


class JitKernelLogitsProcessor(LogitsProcessor):
    """Temperature, top-k, top-p and min-p in one ``LogitsProcessor``: on CUDA scores (fp32, bf16 or
    fp16) one ``jit_kernel.mask_logits`` launch, elsewhere :func:`torch_mask_logits`, the same
    computation in torch. It returns ``scores / temperature`` where a token is kept and -inf
    elsewhere, in ``mask_logits``' order (temperature, top-k, top-p over the renormalised top-k set,
    min-p), which is transformers' order of its warpers.

    ``temperature``: a float >= 0 (0: greedy, the argmax only); ``top_k``: an int >= 1; ``top_p``: a
    float in (0, 1]; ``min_p``: a float in [0, 1]; None turns a filter off. Where it differs from
    transformers' warpers:

    - Ties at a threshold are kept: every token tied with the last one top-p takes (transformers
      keeps those its sort happens to place on the kept side).
    - It keeps the tokens the thresholds keep and no more; transformers' beam sampling
      (``num_beams > 1``) keeps at least one more token than there are eos tokens.
    - Temperature 0 is greedy (transformers' temperature warper rejects 0).
    - A row with a NaN or +inf score, or no finite one, comes back NaN.

    The parameters are one set for every row, not per request, so continuous batching, which
    keeps per-request parameters, does not take it."""

    supports_continuous_batching = False

    def __init__(
        self,
        temperature: Number | None = None,
        top_k: int | None = None,
        top_p: Number | None = None,
        min_p: Number | None = None,
    ) -> None:
        self.temperature, self.top_k, self.top_p, self.min_p = _validated(
            type(self).__name__, temperature, top_k, top_p, min_p
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        params = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)
        if scores.is_cuda and scores.dtype in FLOAT_DTYPES:
            return jit_kernel.mask_logits(scores if scores.stride(-1) == 1 else scores.contiguous(), **params)
        return torch_mask_logits(scores, **params)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(temperature={self.temperature}, top_k={self.top_k}, "
            f"top_p={self.top_p}, min_p={self.min_p})"
        )


def logits_processor(
    generation_config: GenerationConfig, **overrides: Any
) -> tuple[LogitsProcessorList, GenerationConfig]:
    """(a ``LogitsProcessorList`` of one :class:`JitKernelLogitsProcessor`, a copy of
    ``generation_config`` on which transformers adds none of the four warpers)::

        processors, config = logits_processor(model.generation_config, do_sample=True)
        model.generate(ids, generation_config=config, logits_processor=processors)

    ``overrides`` are set on the copy first, as ``generate()``'s keyword arguments would be
    (``do_sample=True``, ``top_p=0.9``, ...). The filters are read as ``generate()`` reads them:
    a field left None takes transformers' default (temperature 1, top_k 50, top_p 1; min_p off),
    top_k 0 and top_p 1 are off. ``generate()`` fills a None field of the config it is given from
    the model's ``generation_config``, so the copy sets the off values transformers skips:
    temperature 1.0, top_k 0, top_p 1.0. min_p has no such value (transformers adds its warper for
    any min_p but None), so the copy's is None: pass the model's own config (or one made from it),
    and a min_p that ``generate()`` fills in is the one already applied: a second pass of it removes
    nothing (short of float rounding at its threshold).

    The other sampling warpers (typical_p, epsilon_cutoff, eta_cutoff) stay on the copy and run after
    the processor, where transformers runs them after min-p. top_h, which transformers applies
    between temperature and top-k, has no filter here and raises ``ValueError``. The filters apply
    whenever the processor runs: use the pair with ``do_sample=True``."""
    if not isinstance(generation_config, GenerationConfig):
        raise TypeError(
            f"logits_processor: generation_config must be a transformers GenerationConfig, "
            f"got {type(generation_config).__name__}"
        )
    config = copy.deepcopy(generation_config)
    unknown = config.update(**overrides)
    if unknown:
        raise ValueError(f"logits_processor: not generation parameters: {', '.join(sorted(unknown))}")
    if config.top_h is not None:
        raise ValueError(
            f"logits_processor: top_h (={config.top_h}) has no jit_kernel filter; transformers applies it "
            "between temperature and top-k, which one launch cannot keep"
        )
    defaults = type(config)._get_default_generation_params()

    def read(name: str) -> Any:
        value = getattr(config, name)
        return defaults.get(name) if value is None else value

    top_k = read("top_k")
    processor = JitKernelLogitsProcessor(
        temperature=read("temperature"),
        top_k=None if top_k == 0 else top_k,
        top_p=read("top_p"),
        min_p=config.min_p,
    )
    # Plain attribute writes: update() would validate again and warn about sampling flags on a
    # config whose do_sample is not set yet.
    config.temperature = 1.0
    config.top_k = 0
    config.top_p = 1.0
    config.min_p = None
    return LogitsProcessorList([processor]), config
