"""The patched forwards, bound to module instances (``module.forward = MethodType(fn, module)``).
Each reads its plan (:mod:`.plans`), runs the module's own forward with autograd on, and the torch
reference ops on tensors that are not on a CUDA device when its backend needs CUDA."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .backends import _ops_for
from .fp8 import _fp8_buffers, _fp8_gemm, _fp8_input, _norm_quant
from .plans import _PLAN, _AttentionPlan, _Fp8LinearPlan, _LayerPlan, _MLPPlan, _NormPlan, _RotaryPlan, _RouterPlan


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
        gate_up = _fp8_gemm(_fp8_input(x, plan.handed, plan.backend), weight, plan.gate_up.scale, bias, x.dtype)  # type: ignore[arg-type]
        rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
        q, s = _fp8_buffers(rows, inner, x.device)
        if plan.act == "silu" and ops.silu_and_mul_group_quant is not None:
            ops.silu_and_mul_group_quant(gate_up, q[:rows], s[:rows])
        else:
            ops.group_quant(ops.act_and_mul[plan.act](gate_up), q[:rows], s[:rows])  # type: ignore[misc]
        out = _fp8_gemm((q, s, rows), down.weight, down.weight_scale_inv, down.bias, x.dtype)
    else:
        gate_up = F.linear(x.reshape(-1, shape[-1]), weight, bias)
        out = F.linear(ops.act_and_mul[plan.act](gate_up), down.weight, down.bias)
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
            qkv = _fp8_gemm(activation, weight, plan.qkv.scale, bias, x.dtype)  # type: ignore[arg-type]
        else:
            qkv = F.linear(x, weight, bias)
        q, k, v = qkv.split((hq * d, hk * d, hk * d), -1)
    elif plan.fp8:  # called on the tensor the layer was given: the one its norm quantised
        q, k, v = (p(hidden_states).reshape(x.shape[0], -1) for p in (self.q_proj, self.k_proj, self.v_proj))
    else:
        q = F.linear(x, self.q_proj.weight, self.q_proj.bias)
        k = F.linear(x, self.k_proj.weight, self.k_proj.bias)
        v = F.linear(x, self.v_proj.weight, self.v_proj.bias)
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
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    if _decode_packs_heads(self, query, attention_mask, hq, hk):
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
    out = o(out) if plan.fp8 else F.linear(out, o.weight, o.bias)
    return out.view(*input_shape, out.shape[-1]), weights


def _router_forward(self: nn.Module, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' top-k softmax router: the logits' GEMM, then one ``topk_softmax``. Returns what
    the router returns: (its first output, the routing weights in that output's dtype, int64 ids)."""
    plan: _RouterPlan = self.__dict__[_PLAN]
    ops = _ops_for(plan.backend, hidden_states)
    if torch.is_grad_enabled() or ops.topk_softmax is None:
        return plan.original(self, hidden_states)
    logits = F.linear(hidden_states.reshape(-1, hidden_states.shape[-1]), self.weight)
    weights, ids = ops.topk_softmax(logits, plan.top_k, plan.renormalize)
    first = F.softmax(logits, dim=-1, dtype=torch.float32) if plan.returns_probabilities else logits
    return first, weights.to(first.dtype), ids.to(torch.int64)


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
    out = _fp8_gemm(activation, self.weight, self.weight_scale_inv, self.bias, input.dtype)
    return out.view(*input.shape[:-1], out.shape[-1])


def _decode_packs_heads(
    module: nn.Module, query: torch.Tensor, mask: torch.Tensor | None, q_heads: int, kv_heads: int
) -> bool:
    """Whether a decode step's SDPA attention runs on the KV heads with the query heads packed as
    rows (one query token, grouped KV heads, a mask shared by the heads, no dropout): transformers'
    sdpa path otherwise copies every KV head ``q_heads // kv_heads`` times (``repeat_kv``), the
    step's largest memory traffic after the weights."""
    return (
        q_heads > kv_heads
        and query.shape[2] == 1
        and module.config._attn_implementation == "sdpa"
        and not module.training
        and (mask is None or (mask.dim() == 4 and mask.shape[1] == 1))
    )


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
