"""Hugging Face transformers models on jit_kernel's ops, in one call::

    import jit_kernel.integrations.transformers as jk_transformers

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda()
    jk_transformers.apply(model)          # Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE

What changes, per part (each one an option of :func:`apply`):

- ``rmsnorm``: every RMSNorm layer runs ``rmsnorm``. transformers marks these layers for the
  ``kernels`` package (``@use_kernel_forward_from_hub("RMSNorm")``); the replacement is a layer class
  that follows that package's contract (stateless, the same ``forward`` signature), installed the
  way ``kernels.kernelize`` installs one, and offered to ``kernels`` users too (:func:`kernel_mapping`).
- ``fused_add_rmsnorm``: each decoder layer adds its residuals and normalises in ``fused_add_rmsnorm``
  calls, the MLP's residual add fused with the next layer's input norm (the last layer's with the
  final norm). A layer never writes into a tensor the model returns: it writes into its own input
  only when that input is the previous layer's output and nothing records it (no forward hook other
  than transformers' output capture, and that one not collecting).
- ``mlp``: gate and up projections run as one GEMM on one ``[2 * intermediate, hidden]`` weight, then
  ``silu_and_mul`` (``gelu_tanh_and_mul`` / ``gelu_and_mul`` for GELU MLPs). The two ``nn.Parameter``
  objects stay (same names, same values): their data is moved into the halves of that one tensor.
- ``qkv``: q, k and v projections as one GEMM, the same way.
- ``rope``: rotary embedding through ``apply_rope_with_cos_sin_cache_inplace`` with positions and a
  ``[max_position_embeddings, rotary_dim]`` fp32 cos/sin table built once from the model's RoPE
  parameters (default, linear, Llama-3 and YaRN scaling; partial rotary). The model's rotary module
  then returns that table and the token positions instead of per-token cos/sin.
- ``qk_norm``: Qwen3's per-head q/k RMSNorm and the rotation in one ``fused_qknorm_rope`` call.
- ``router``: Qwen3-MoE's router (softmax over the experts, top-k, renormalised with the config's
  ``norm_topk_prob``) in one ``topk_softmax`` call after its GEMM; it returns what transformers'
  router returns (the same expert ids, as int64; the weights in transformers' dtype).
- ``fp8``: transformers' fine-grained fp8 linear layers (``FP8Linear``: 128 x 128 weight blocks,
  dynamic activation scales, as ``FineGrainedFP8Config`` loads them) run as ``decode_linear_fp8``
  (up to 16 rows) or ``torch._scaled_mm`` (more) on the input quantised by 1 x 128 groups
  (``per_token_group_quant_fp8``); where a decoder layer's norm feeds them (q/k/v, gate/up), the
  norm quantises in the same launch (``fused_add_rmsnorm_per_token_group_quant_fp8``) and hands q
  and scales to the projections.
- ``lm_head``: the output head on the backend's ``linear``, as every linear layer the patched
  forwards call (jit_kernel's: ``decode_linear`` for 1 to 16 rows of bf16/fp16, whose own rule sends
  the shapes its kernel does not take to cuBLAS; ``F.linear`` for more rows). A step of one query
  token per sequence runs its attention as the backend's ``one_token_attention`` says
  (:data:`~.backends.ONE_TOKEN_ATTENTION`: SDPA with ``enable_gqa``, SDPA on packed query heads, or
  ``decode_attention`` over a StaticCache whose sequences attend to a prefix of it).

The patched forwards run jit_kernel's ops on CUDA tensors with autograd off (``torch.no_grad()`` or
``torch.inference_mode()``, as ``generate()`` runs); with autograd on they run the model's own
forwards, and on tensors of other devices the torch reference ops (``backend="torch"``) of the same
computation. ``state_dict()`` keeps its keys and values, and a model on CPU, or a part whose config
is not supported, is left as it is with one warning naming what was skipped.

The package, by concern:

- ``backends``: the :class:`Backend` record (the ops a patched model calls), jit_kernel's and
  FlashInfer's, and which one a call runs on; ``reference``: the same computations in torch (the
  ``torch`` backend).
- ``hub``: :class:`JitKernelRMSNorm` and :func:`kernel_mapping` (the ``kernels`` package's contract).
- ``merging``: linear layers of one input merged into one GEMM, their parameters kept.
- ``fp8``: fine-grained fp8 activations and GEMMs, and which fp8 linear layers can run them.
- ``plans``: what each patched module keeps, and reading a module into its plan (or why not).
- ``forwards``: the patched forwards.
- ``patching``: :func:`apply`, one step per part, and :class:`Patched`.
- ``sampling``: ``generate()``'s temperature, top-k, top-p and min-p as one ``mask_logits`` launch
  (:class:`JitKernelLogitsProcessor`), and :func:`logits_processor`, which reads them from a
  ``GenerationConfig`` and returns a copy of it with transformers' own warpers off.

A new op that a model's module runs is a field of :class:`Backend` (as ``linear`` and
``decode_attention`` are) with its torch computation in ``reference``; a module that runs it gets a
plan in ``plans``, a forward in ``forwards`` and a step of :func:`apply` in ``patching``, with an
option of its own. What
``generate()`` runs outside the model (its logits processors) lives beside them, as ``sampling`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backends import BACKENDS as BACKENDS
from .backends import ONE_TOKEN_ATTENTION as ONE_TOKEN_ATTENTION
from .backends import ONE_TOKEN_ATTENTION_CHOICES as ONE_TOKEN_ATTENTION_CHOICES
from .backends import TORCH as TORCH
from .backends import Backend as Backend
from .backends import get_backend as get_backend
from .fp8 import FP8_IN_ALIGN as FP8_IN_ALIGN
from .fp8 import FP8_ROW_ALIGN as FP8_ROW_ALIGN
from .fp8 import _dequantize as _dequantize  # reached through the package by bench_model and the tests
from .hub import JitKernelRMSNorm as JitKernelRMSNorm
from .hub import kernel_mapping as kernel_mapping
from .patching import ROUTER_MODEL_TYPES as ROUTER_MODEL_TYPES
from .patching import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from .patching import Patched as Patched
from .patching import apply as apply
from .patching import patched_modules as patched_modules
from .plans import _PLAN as _PLAN  # reached through the package by the tests
from .plans import ACTIVATIONS as ACTIVATIONS
from .plans import STATIC_ROPE_TYPES as STATIC_ROPE_TYPES
from .reference import FP8_BLOCK as FP8_BLOCK
from .reference import FP8_E4M3_MAX as FP8_E4M3_MAX

__all__ = [
    "BACKENDS",
    "SUPPORTED_MODEL_TYPES",
    "Backend",
    "JitKernelLogitsProcessor",
    "JitKernelRMSNorm",
    "Patched",
    "apply",
    "get_backend",
    "kernel_mapping",
    "logits_processor",
]

if TYPE_CHECKING:
    from .sampling import JitKernelLogitsProcessor as JitKernelLogitsProcessor
    from .sampling import logits_processor as logits_processor

# The sampling module subclasses transformers' LogitsProcessor, so it imports transformers; the rest
# of the package imports it only where a model is patched. Its names load on first use.
_SAMPLING_NAMES = ("JitKernelLogitsProcessor", "logits_processor")


def __getattr__(name: str) -> Any:
    if name in _SAMPLING_NAMES:
        from . import sampling

        return getattr(sampling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
