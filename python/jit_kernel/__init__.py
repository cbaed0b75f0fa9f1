"""jit-kernel: CUDA kernels for LLM serving, prebuilt where common and JIT-compiled otherwise."""

from __future__ import annotations

import importlib.util
import logging
import types
from collections.abc import Callable

# Imported here rather than at the first kernel call: process start-up pays it, a request does not.
import tvm_ffi  # noqa: F401

from jit_kernel.engine import env
from jit_kernel.engine.cache import CacheDirError
from jit_kernel.engine.dispatch import JitDisabledError
from jit_kernel.engine.jit import CPPArgList, cache_once, load_jit, make_cpp_args
from jit_kernel.version import __version__


def _configure_logging() -> None:
    logger = logging.getLogger("jit_kernel")
    if not env.configure_logging() or logger.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[jit_kernel %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(env.log_level())
    logger.propagate = False


_configure_logging()


def _op_and_module(op: Callable[..., object], module: types.ModuleType) -> Callable[..., object]:
    """A copy of the function ``op`` (same code, defaults and closure, so a call costs exactly what
    calling ``op`` does) that also carries ``module``'s public names as attributes. Whatever the
    module holds (ours, or one a kernel author wrote in its place, as the seeds' tutorial does),
    its public names are read as they are: ``__all__`` where it has one, else every name without
    a leading underscore."""
    both = types.FunctionType(op.__code__, op.__globals__, op.__name__, op.__defaults__, op.__closure__)
    both.__kwdefaults__ = op.__kwdefaults__
    both.__doc__, both.__annotations__ = op.__doc__, op.__annotations__
    both.__module__, both.__qualname__ = __name__, op.__name__  # pickles as jit_kernel.<name>: this object
    both.__dict__.update(op.__dict__)  # a declared op's .op and signature
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name in vars(module) if not name.startswith("_")]
    for name in names:
        if hasattr(module, name):
            setattr(both, name, getattr(module, name))
    return both


# torch is a runtime dependency; only CMake's configure step (`python -m jit_kernel.engine.aot`, in a
# build environment) imports the package without it, and it needs no ops.
if importlib.util.find_spec("torch") is not None:
    # `jit_kernel.add_constant`, `.scale` and `.per_tensor_quant_fp8` are our ops (`jit_kernel.scale(x, 2.0)`,
    # also under torch.compile(fullgraph=True)) and, as in the seed, modules (`from jit_kernel.scale import
    # scale`). Python binds a submodule to the package attribute of its name when it is first imported, so
    # the three submodules are imported here, first; then each name is rebound to a copy of our op's function
    # that also carries the submodule's public names (`jit_kernel.scale.scale`, `import
    # jit_kernel.per_tensor_quant_fp8 as m; m.per_tensor_absmax_fp8`). A later import of the submodule finds
    # it in sys.modules and leaves the attribute alone. A function, not a callable module or a wrapper object:
    # TorchDynamo cannot call a module, and a wrapper would cost a Python call on every op.
    from jit_kernel import add_constant as _add_constant_module
    from jit_kernel import distributed  # noqa: F401 (jit_kernel.distributed.CustomAllReduce)
    from jit_kernel import per_tensor_quant_fp8 as _per_tensor_quant_fp8_module
    from jit_kernel import scale as _scale_module
    from jit_kernel.ops.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
    from jit_kernel.ops.add_constant import add_constant
    from jit_kernel.ops.attention import decode_attention, merge_attn_states
    from jit_kernel.ops.gemm import decode_linear, decode_linear_fp8
    from jit_kernel.ops.gemma_norm import gemma_fused_add_rmsnorm, gemma_rmsnorm
    from jit_kernel.ops.hicache import (
        can_use_hicache_jit_kernel,
        transfer_hicache_all_layer,
        transfer_hicache_all_layer_mla,
        transfer_hicache_one_layer,
        transfer_hicache_one_layer_mla,
    )
    from jit_kernel.ops.kv_store import set_mla_kv_buffer, store_kv_cache
    from jit_kernel.ops.moe import grouped_topk, moe_align_block_size, moe_sum_reduce, topk_sigmoid, topk_softmax
    from jit_kernel.ops.norm import fused_add_rmsnorm, fused_inplace_qknorm, qknorm_across_heads, rmsnorm
    from jit_kernel.ops.norm_quant import (
        fused_add_rmsnorm_per_token_group_quant_fp8,
        fused_add_rmsnorm_per_token_quant_fp8,
        fused_add_rmsnorm_quant_fp8,
        rmsnorm_per_token_group_quant_fp8,
        rmsnorm_per_token_quant_fp8,
        rmsnorm_quant_fp8,
    )
    from jit_kernel.ops.quant import per_tensor_quant_fp8
    from jit_kernel.ops.rope import apply_rope_with_cos_sin_cache_inplace, fused_qknorm_rope
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
    from jit_kernel.ops.scale import scale
    from jit_kernel.ops.speculative import (
        chain_speculative_sampling,
        tree_speculative_sampling_target_only,
        verify_tree_greedy,
    )
    from jit_kernel.ops.stream_wait import Event, StreamWaitTimeout, stream_wait_value, stream_wait_value_bounded
    from jit_kernel.ops.token_quant import (
        per_token_group_quant_fp8,
        per_token_quant_fp8,
        silu_and_mul_per_token_group_quant_fp8,
    )

    add_constant = _op_and_module(add_constant, _add_constant_module)
    per_tensor_quant_fp8 = _op_and_module(per_tensor_quant_fp8, _per_tensor_quant_fp8_module)
    scale = _op_and_module(scale, _scale_module)

__all__ = [
    "CPPArgList",
    "CacheDirError",
    "Event",
    "JitDisabledError",
    "StreamWaitTimeout",
    "__version__",
    "add_constant",
    "apply_rope_with_cos_sin_cache_inplace",
    "cache_once",
    "can_use_hicache_jit_kernel",
    "chain_speculative_sampling",
    "decode_attention",
    "decode_linear",
    "decode_linear_fp8",
    "fused_add_rmsnorm",
    "fused_add_rmsnorm_per_token_group_quant_fp8",
    "fused_add_rmsnorm_per_token_quant_fp8",
    "fused_add_rmsnorm_quant_fp8",
    "fused_inplace_qknorm",
    "fused_qknorm_rope",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "grouped_topk",
    "load_jit",
    "make_cpp_args",
    "mask_logits",
    "merge_attn_states",
    "min_p_sampling_from_probs",
    "moe_align_block_size",
    "moe_sum_reduce",
    "per_tensor_quant_fp8",
    "per_token_group_quant_fp8",
    "per_token_quant_fp8",
    "qknorm_across_heads",
    "rmsnorm",
    "rmsnorm_per_token_group_quant_fp8",
    "rmsnorm_per_token_quant_fp8",
    "rmsnorm_quant_fp8",
    "sample",
    "sampling_from_logits",
    "sampling_from_probs",
    "scale",
    "set_mla_kv_buffer",
    "silu_and_mul",
    "silu_and_mul_per_token_group_quant_fp8",
    "store_kv_cache",
    "stream_wait_value",
    "stream_wait_value_bounded",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
    "topk_sigmoid",
    "topk_softmax",
    "transfer_hicache_all_layer",
    "transfer_hicache_all_layer_mla",
    "transfer_hicache_one_layer",
    "transfer_hicache_one_layer_mla",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy",
]
