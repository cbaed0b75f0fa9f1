"""The patched forwards, bound to module instances (``module.forward = MethodType(fn, module)``).
Each reads its plan (:mod:`.plans`), runs the module's own forward with autograd on, and the torch
reference ops on tensors that are not on a CUDA device when its backend needs CUDA."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jit_kernel.engine.families import ATTENTION_HEAD_DIMS

from .backends import Backend, _ops_for
from .fp8 import _fp8_buffers, _fp8_gemm, _fp8_input, _norm_quant
from .plans import (
    _PLAN,
    _AttentionPlan,
    _Fp8LinearPlan,
    _LayerPlan,
    _LinearPlan,
    _MLPPlan,
    _NormPlan,
    _RotaryPlan,
    _RouterPlan,
)


def _final_norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The model's last norm: the last decoder layer has computed it where it handed it off."""
    if torch.is_grad_enabled():
        return type(self).forward(self, hidden_states)
    plan: _NormPlan = self.__dict__[_PLAN]
    chain = plan.chain
    if chain is not None and chain.src is hidden_states and chain.normed is not None:
        out = chain.normed
        chain.src = chain.normed = None
        return out
    ops = _ops_for(plan.backend, hidden_states)
    d = hidden_states.shape[-1]
    return ops.rmsnorm(hidden_states.reshape(-1, d), self.weight, self.variance_epsilon).view(hidden_states.shape)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    plan: _MLPPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, x)
    ops = _ops_for(plan.backend, x)
    weight, bias = plan.gate_up.tensors()
    shape = x.shape
    down = self.down_proj
    if plan.fp8:
        activation = _fp8_input(x, plan.handed, plan.backend)
        gate_up = _fp8_gemm(activation, weight, plan.gate_up.scale, bias, x.dtype, plan.backend)  # type: ignore[arg-type]
        rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
        q, s = _fp8_buffers(rows, inner, x.device)
        if plan.act == "silu" and ops.silu_and_mul_group_quant is not None:
            ops.silu_and_mul_group_quant(gate_up, q[:rows], s[:rows])
        else:
            ops.group_quant(ops.act_and_mul[plan.act](gate_up), q[:rows], s[:rows])  # type: ignore[misc]
        out = _fp8_gemm((q, s, rows), down.weight, down.weight_scale_inv, down.bias, x.dtype, plan.backend)
    else:
        gate_up = ops.linear(x.reshape(-1, shape[-1]), weight, bias)
        out = ops.linear(ops.act_and_mul[plan.act](gate_up), down.weight, down.bias)
    return out.view(*shape[:-1], out.shape[-1])


def _rotary_forward(self: nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Instead of per-token cos/sin: the cos/sin table and the position of every token ``[B * S]``,
    which the patched attention layers take."""
    plan: _RotaryPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, x, position_ids)
    positions = position_ids.expand(x.shape[0], x.shape[1]).reshape(-1)
    return plan.cos_sin_cache(x.device), positions


def _attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    plan: _AttentionPlan = self.__dict__[_PLAN]
    if args or torch.is_grad_enabled():
        return plan.original(self, hidden_states, position_embeddings, attention_mask, *args, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ops = _ops_for(plan.backend, hidden_states)
    cos_sin_cache, positions = position_embeddings  # type: ignore[misc]
    input_shape = hidden_states.shape[:-1]
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    d, hq, hk = plan.head_dim, plan.q_heads, plan.kv_heads
    if plan.qkv is not None:
        weight, bias = plan.qkv.tensors()
        if plan.fp8:  # quantised as the tensor the layer was given: the one its norm quantised
            activation = _fp8_input(hidden_states, plan.handed, plan.backend)
            qkv = _fp8_gemm(activation, weight, plan.qkv.scale, bias, x.dtype, plan.backend)  # type: ignore[arg-type]
        else:
            qkv = ops.linear(x, weight, bias)
        q, k, v = qkv.split((hq * d, hk * d, hk * d), -1)
    elif plan.fp8:  # called on the tensor the layer was given: the one its norm quantised
        q, k, v = (p(hidden_states).reshape(x.shape[0], -1) for p in (self.q_proj, self.k_proj, self.v_proj))
    else:
        q = ops.linear(x, self.q_proj.weight, self.q_proj.bias)
        k = ops.linear(x, self.k_proj.weight, self.k_proj.bias)
        v = ops.linear(x, self.v_proj.weight, self.v_proj.bias)
    q, k = q.unflatten(-1, (hq, d)), k.unflatten(-1, (hk, d))
    if plan.qk_norm is not None:
        q_norm, k_norm = plan.qk_norm
        ops.qknorm_rope(q, k, q_norm.weight, k_norm.weight, positions, cos_sin_cache, q_norm.variance_epsilon, True)
    else:
        if plan.separate_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        ops.rope(positions, q, k, d, cos_sin_cache, True)
    query = q.view(*input_shape, hq, d).transpose(1, 2)
    key = k.view(*input_shape, hk, d).transpose(1, 2)
    value = v.view(*input_shape, hk, d).transpose(1, 2)
    cache = kwargs.pop("cache", None)
    if cache is None:
        cache = kwargs.pop("past_key_values", None)
    static = None
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
        if ops.one_token_attention == "decode_attention" and ops.decode_attention is not None:
            static = _static_layer(cache, self.layer_idx, key, value)
            if static is not None:
                _note_prefix(cache, static, attention_mask, query.shape[2])
    choice = _one_token_attention(self, plan, ops, query, attention_mask, cache, static)
    if choice == "decode_attention":
        lengths = static.cumulative_length.reshape(1).expand(query.shape[0])  # type: ignore[union-attr]
        if query.shape[0] > 1:
            lengths = lengths.contiguous()  # the op takes unit-stride lengths
        out = ops.decode_attention(query[:, :, 0], key, value, lengths, self.scaling)  # type: ignore[misc]
        weights = None
    elif choice == "sdpa_gqa":  # no mask
        out = F.scaled_dot_product_attention(query, key, value, scale=self.scaling, enable_gqa=hq != hk)
        out = out.transpose(1, 2)
        weights = None
    elif choice == "packed":
        out, weights = _packed_decode_attention(query, key, value, attention_mask, self.scaling, hq // hk), None
    else:
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, plan.eager_attention)
        out, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **plan.attention_kwargs,
            **kwargs,
        )
    o = self.o_proj
    out = out.reshape(x.shape[0], -1)
    out = o(out) if plan.fp8 else ops.linear(out, o.weight, o.bias)
    return out.view(*input_shape, out.shape[-1]), weights


def _router_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' top-k softmax router: the logits' GEMM, then one ``topk_softmax``. Returns what
    the router returns: (its first output, the routing weights in that output's dtype, int64 ids)."""
    plan: _RouterPlan = self.__dict__[_PLAN]
    ops = _ops_for(plan.backend, hidden_states)
    if torch.is_grad_enabled() or ops.topk_softmax is None:
        return plan.original(self, hidden_states)
    logits = ops.linear(hidden_states.reshape(-1, hidden_states.shape[-1]), self.weight, None)
    weights, ids = ops.topk_softmax(logits, plan.top_k, plan.renormalize)
    first = F.softmax(logits, dim=-1, dtype=torch.float32) if plan.returns_probabilities else logits
    return first, weights.to(first.dtype), ids.to(torch.int64)


def _linear_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """A plain ``nn.Linear`` layer outside the patched modules (the output head) on the backend's
    ``linear``: ``decode_linear`` at decode sizes with jit_kernel's."""
    plan: _LinearPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, input)
    return _ops_for(plan.backend, input).linear(input, self.weight, self.bias)


def _fp8_linear_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """transformers' ``FP8Linear`` (128 x 128 weight blocks, dynamic activation scales): the input
    quantised by 1 x 128 groups (or taken as its decoder layer's norm quantised it), then
    :func:`_fp8_gemm`."""
    plan: _Fp8LinearPlan = self.__dict__[_PLAN]
    if torch.is_grad_enabled():
        return plan.original(self, input)
    if input.numel() == 0:
        return input.new_empty((*input.shape[:-1], self.weight.shape[0]))
    activation = _fp8_input(input, plan.handed, plan.backend)
    out = _fp8_gemm(activation, self.weight, self.weight_scale_inv, self.bias, input.dtype, plan.backend)
    return out.view(*input.shape[:-1], out.shape[-1])


def _one_token_attention(
    module: nn.Module,
    plan: _AttentionPlan,
    ops: Backend,
    query: torch.Tensor,
    mask: torch.Tensor | None,
    cache: Any,
    static: Any,
) -> str | None:
    """How a step's attention runs: one of :data:`.backends.ONE_TOKEN_ATTENTION_CHOICES`, or None
    for the attention function of the model's implementation, as the unpatched model runs it (every
    step of more than one query token; implementations other than sdpa; training). The backend's
    choice applies where it can:

    - ``decode_attention``: the cache layer is a StaticLayer (``static``), the query bf16 or fp16
      with a head dim the op takes, no sliding window, and the cache's sequences are known to
      attend to the prefix ``[0, cumulative_length)`` of it (:func:`_note_prefix`); otherwise as
      ``sdpa_gqa`` (left padding, say, leaves a sequence's keys no prefix: SDPA with the mask);
    - ``packed``: grouped KV heads and a mask shared by the heads; otherwise None;
    - ``sdpa_gqa``: where there is no mask; with one, None. On CUDA, SDPA with ``enable_gqa`` and a
      mask falls back to torch's math kernel; transformers' sdpa function avoids it the same way
      (with a mask it packs the query heads or repeats the KV heads, by release). A StaticCache
      step always has a mask (its keys past the write position are masked)."""
    if query.shape[2] != 1 or module.training or module.config._attn_implementation != "sdpa":
        return None
    choice = ops.one_token_attention
    if choice == "decode_attention":
        if static is not None and _kernel_serves(plan, query, cache):
            return choice
        choice = "sdpa_gqa"
    if choice == "packed":
        packs = plan.q_heads > plan.kv_heads and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1))
        return choice if packs else None
    return choice if mask is None else None


def _kernel_serves(plan: _AttentionPlan, query: torch.Tensor, cache: Any) -> bool:
    """Whether ``decode_attention`` computes this layer's one-token step: bf16/fp16, a head dim of
    its kernel, no sliding window, and the cache's verdict (:func:`_note_prefix`) that each sequence
    attends to the first ``cumulative_length`` keys."""
    if query.dtype != torch.bfloat16 and query.dtype != torch.float16:
        return False
    if query.shape[-1] not in ATTENTION_HEAD_DIMS or plan.attention_kwargs.get("sliding_window") is not None:
        return False
    seen = getattr(cache, _PREFIX, None)
    return seen is not None and bool(seen[1])


# On a cache: (the mask of the step that judged it, whether every sequence attends to the prefix
# [0, cumulative_length) of the cache), for the decode_attention choice.
_PREFIX = "_jit_kernel_prefix"


def _static_layer(cache: Any, layer_idx: int, key: torch.Tensor, value: torch.Tensor) -> Any:
    """The cache's layer ``layer_idx`` where it is transformers' StaticLayer (no subclass: a sliding
    window layer keeps other positions) and ``key`` / ``value`` are its tensors, else None."""
    layers = getattr(cache, "layers", None)
    if layers is None or not 0 <= layer_idx < len(layers):
        return None
    try:
        from transformers.cache_utils import StaticLayer
    except ImportError:  # a transformers without cache layers
        return None
    layer = layers[layer_idx]
    if type(layer) is not StaticLayer or layer.keys is not key or layer.values is not value:
        return None
    # The write position on the device (transformers 5): one for every sequence of the batch.
    if not isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
        return None
    return layer


def _note_prefix(cache: Any, static: Any, mask: torch.Tensor | None, query_len: int) -> None:
    """Judge, where the mask can be read (not under CUDA-graph capture or torch.compile), whether
    each sequence of the batch attends to the prefix ``[0, cumulative_length)`` of the cache, and
    keep the verdict on the cache. transformers' generate gives every sequence of a StaticCache one
    write position and extends the mask with attended tokens, so the verdict of a step of several
    tokens (the prefill) holds for the one-token steps after it. It is judged again at each step of
    several tokens with a mask it has not seen, and at a one-token step only where there is no
    verdict yet; one host sync each time (the first layer's; the others see the same mask)."""
    seen = getattr(cache, _PREFIX, None)
    if seen is not None and (query_len == 1 or seen[0] is mask):
        return
    if torch.compiler.is_compiling():
        return
    if mask is not None and mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    setattr(cache, _PREFIX, (mask, _prefix_mask(mask, static.cumulative_length, static.keys.shape[2])))


def _prefix_mask(mask: torch.Tensor | None, length: torch.Tensor, max_len: int) -> bool:
    """Whether ``mask`` lets the last query token of every sequence attend to keys ``[0, length)``
    of a cache of ``max_len`` and no others: no mask (transformers leaves it out where there is no
    padding), or a boolean ``[B, 1, S, max_len]`` one whose last query row is that prefix. A float
    mask, or any other shape, is not judged a prefix. Reads the mask (a host sync)."""
    if mask is None:
        return True
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-1] != max_len:
        return False
    expected = torch.arange(max_len, device=mask.device) < length.to(mask.device)
    return bool((mask[:, 0, -1, :] == expected).all())


def _packed_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float, groups: int
) -> torch.Tensor:
    """SDPA of one query token per sequence, ``query [B, Hq, 1, D]`` seen as ``[B, Hkv, groups, D]``
    (query head h reads KV head h // groups, as repeat_kv pairs them): the same products and
    softmax per row, without expanding the KV heads. Returns ``[B, 1, Hq, D]`` as transformers'
    attention functions do."""
    b, hq, _, d = query.shape
    packed = query.reshape(b, hq // groups, groups, d)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scale)
    return out.reshape(b, hq, 1, out.shape[-1]).transpose(1, 2).contiguous()


def _decoder_layer_forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """residual + attention(norm) + mlp(norm), the adds fused into the norms after them; the last
    norm of this layer is the next layer's input norm, handed off through the chain. A norm whose
    output feeds fp8 linear layers quantises it in the same launch and hands it to them."""
    plan: _LayerPlan = self.__dict__[_PLAN]
    if args or torch.is_grad_enabled():
        return plan.original(self, hidden_states, *args, **kwargs)
    ops = _ops_for(plan.backend, hidden_states)
    chain, x, fp8 = plan.chain, hidden_states, plan.fp8
    shape, d = x.shape, x.shape[-1]
    handed, quantized = None, None
    if not plan.first and chain.src is x:
        handed, quantized = chain.normed, chain.quantized
    chain.src = chain.normed = chain.quantized = None
    in_norm, post_norm = self.input_layernorm, self.post_attention_layernorm
    if handed is None:
        if plan.attn_fp8:
            normed, quantized = _norm_quant(ops.rmsnorm_group_quant, x.reshape(-1, d), in_norm)  # type: ignore[arg-type]
            handed = normed.view(shape)
        else:
            handed = ops.rmsnorm(x.reshape(-1, d), in_norm.weight, in_norm.variance_epsilon).view(shape)
        own_input = False
    else:
        # x is the previous layer's output: this layer may add into it unless someone records it.
        own_input = plan.previous is not None and not _observed(plan.previous, plan.collector)
    if fp8 is not None:
        fp8.hand(handed, quantized)
    attn, _ = self.self_attn(hidden_states=handed, **kwargs)
    if not attn.is_contiguous():  # written in place below through a [tokens, hidden] view
        attn = attn.contiguous()
    quantized = None
    if own_input and not _observed(self.self_attn, plan.collector):
        h = x
        if plan.mlp_fp8:
            op = ops.fused_add_rmsnorm_group_quant
            normed, quantized = _norm_quant(op, attn.view(-1, d), post_norm, h.view(-1, d))  # type: ignore[arg-type]
            normed = normed.view(shape)
        else:
            ops.fused_add_rmsnorm(attn.view(-1, d), h.view(-1, d), post_norm.weight, post_norm.variance_epsilon)
            normed = attn
    else:
        h = x + attn
        if plan.mlp_fp8:
            normed, quantized = _norm_quant(ops.rmsnorm_group_quant, h.view(-1, d), post_norm)  # type: ignore[arg-type]
            normed = normed.view(shape)
        else:
            normed = ops.rmsnorm(h.view(-1, d), post_norm.weight, post_norm.variance_epsilon).view(shape)
    if fp8 is not None:
        fp8.hand(normed, quantized)
    mlp_out = self.mlp(normed)
    if fp8 is not None:
        fp8.hand(None, None)
    if _observed(self.mlp, plan.collector):
        return h + mlp_out
    if not mlp_out.is_contiguous():
        mlp_out = mlp_out.contiguous()
    nxt = plan.next_norm
    if plan.next_fp8:
        op = ops.fused_add_rmsnorm_group_quant
        normed, quantized = _norm_quant(op, mlp_out.view(-1, d), nxt, h.view(-1, d))  # type: ignore[arg-type]
        chain.src, chain.normed, chain.quantized = h, normed.view(shape), quantized
    else:
        ops.fused_add_rmsnorm(mlp_out.view(-1, d), h.view(-1, d), nxt.weight, nxt.variance_epsilon)
        chain.src, chain.normed = h, mlp_out
    return h


# ---------------------------------------------------------------------------------------------
# Who sees a module's output


def _capture_collector() -> Any:
    """transformers' output-capture context variable (``output_hidden_states`` and friends), or None
    where this transformers has none (then any forward hook counts as an observer)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


def _observed(module: nn.Module, collector: Any) -> bool:
    """Whether something may hold ``module``'s output after it returns: a global forward hook, a
    forward hook of the module other than transformers' output capture, or that capture collecting."""
    if nn.modules.module._global_forward_hooks:
        return True
    hooks = module._forward_hooks
    if not hooks:
        return False
    for hook in hooks.values():
        if getattr(hook, "__name__", None) != "output_capturing_hook":
            return True
    # The capture hooks record only while a forward collects something (the collector is then a
    # non-empty dict); without the collector to ask, any hook may record.
    return collector is None or bool(collector.get())
