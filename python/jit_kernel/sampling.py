"""``jit_kernel.sampling``: FlashInfer's ``flashinfer.sampling`` entry points on our sampler (code
written for them runs with the import changed: ``from jit_kernel import sampling``), and our own
``sample`` and ``mask_logits``. The ops live in :mod:`jit_kernel.ops.sampling` (semantics and every
difference from FlashInfer in its docstring) and :mod:`jit_kernel.ops.speculative`."""

from jit_kernel.ops.sampling import (
    mask_logits,
    min_p_sampling_from_probs,
    sample,
    sampling_from_logits,
    sampling_from_probs,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from jit_kernel.ops.speculative import chain_speculative_sampling

__all__ = [
    "chain_speculative_sampling",
    "mask_logits",
    "min_p_sampling_from_probs",
    "sample",
    "sampling_from_logits",
    "sampling_from_probs",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]
