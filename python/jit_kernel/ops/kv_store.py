"""KV-cache stores: ``store_kv_cache`` (K and V rows into paged caches) and ``set_mla_kv_buffer``
(DeepSeek MLA's latent and rope parts into one buffer), one launch each (csrc/kv_store.cuh).

Semantics, for token ``i`` and ``slot = loc[i]``:

- ``store_kv_cache``: ``k_cache[slot] = q(k[i])``, ``v_cache[slot] = q(v[i])`` (SGLang's
  ``set_kv_buffer``, vLLM's ``reshape_and_cache_flash`` for a flash layout).
- ``set_mla_kv_buffer``: ``kv_buffer[slot, :Dn] = q(cache_k_nope[i])``,
  ``kv_buffer[slot, Dn:] = q(cache_k_rope[i])`` (SGLang's MLA pool).

``q`` is a plain copy when the cache has the activation dtype, and
``fp8_e4m3(clamp(x * (1 / scale), -448, 448))`` for a ``float8_e4m3fn`` cache. A scale is a float32 CUDA
tensor of one element (what SGLang and vLLM pass; read on the device, so CUDA graphs see its
current value) or a Python float. Scales are ignored for caches in the activation dtype (vLLM
passes them, 1.0, for every cache). A scale must be positive and normal (at least 2^-126; a float
is checked, a tensor's value is not). Values beyond +-448 after the division, and infinities,
saturate to +-448; NaN stays NaN. ``store_kv_cache`` needs both scales for an fp8 cache;
``set_mla_kv_buffer``'s ``scale`` defaults to 1 (SGLang casts the MLA parts to fp8 unscaled).

Layouts: every tensor is rows: rank 2 ``[rows, width]`` or rank 3 ``[rows, heads, head_dim]``,
contiguous inside a row, any row stride (k/v may be views of a fused qkv tensor, a cache a view of
a ``[layers, slots, ...]`` buffer). ``loc`` is int32 or int64, 1-D, any stride.

Indices: a slot outside ``[0, slots)`` is skipped by the kernel: no fault, that token's row is not
written, every other row is. With ``JIT_KERNEL_CHECK_INDICES=1`` the op raises ``IndexError``
naming the argument and the first bad position instead (one reduction and a host sync per call, so
not under CUDA-graph capture). Duplicate slots: the writers race and which one wins is undefined per
16-byte input vector (per element where a row is not made of aligned vectors): every such piece of
the row comes whole from one of the writers, but a row may mix writers.

Every op is also registered as ``torch.ops.jit_kernel.*`` with its fake implementation, which runs
the C++ launcher's checks on the FakeTensors (the launcher returns before any CUDA call); the
functions here switch to those under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import KV_STORE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, split_scale

_KV = Dispatcher(KV_STORE)
_STORE = "store_kv_cache"
_MLA = "set_mla_kv_buffer"
_INDEX_DTYPES = (torch.int32, torch.int64)


def _selector(op: str, name: str):
    def select(dtype: torch.dtype, cache_dtype: torch.dtype) -> tuple[str, str]:
        cpp = float_dtype(op, name, dtype)
        # Any other cache dtype gets the plain config, whose C++ check names the cache's dtype.
        return (cpp, "fp8_e4m3_t" if cache_dtype == torch.float8_e4m3fn else cpp)

    return select


_STORE_KERNELS = KernelTable(_KV, "store", _selector(_STORE, "k"))
_MLA_KERNELS = KernelTable(_KV, "mla", _selector(_MLA, "cache_k_nope"))


def _check_bounds(op: str, name: str, loc: object, caches: tuple[tuple[str, object], ...]) -> None:
    """``JIT_KERNEL_CHECK_INDICES=1``: ``loc`` against the slots of every cache; one reduction and one
    sync. Inputs C++ will reject anyway (not a tensor, a float ``loc``) are left to it."""
    if not isinstance(loc, torch.Tensor) or loc.dtype not in _INDEX_DTYPES or loc.dim() != 1 or loc.numel() == 0:
        return
    if isinstance(loc, FakeTensor):  # torch.compile's fake run: no values to check
        return
    sizes = [(n, c.shape[0]) for n, c in caches if isinstance(c, torch.Tensor) and c.dim() > 0]
    if not sizes:
        return
    lo, hi = torch.stack(torch.aminmax(loc)).tolist()
    for cache_name, slots in sizes:
        if lo >= 0 and hi < slots:
            continue
        bad = (loc < 0) | (loc >= slots)
        position = int(bad.nonzero()[0, 0])
        value = int(loc[position])
        raise IndexError(
            f"{op}: {name}[{position}] = {value} is out of range: it must be in [0, {slots}) ({cache_name} has "
            f"{slots} slots)"
        )


def _store_check(values: Mapping[str, Any]) -> None:
    caches = (("k_cache", values["k_cache"]), ("v_cache", values["v_cache"]))
    _check_bounds(_STORE, "out_cache_loc", values["out_cache_loc"], caches)


def _mla_check(values: Mapping[str, Any]) -> None:
    _check_bounds(_MLA, "loc", values["loc"], (("kv_buffer", values["kv_buffer"]),))


@kernel_op(_STORE, mutates=("k_cache", "v_cache"), index_check=_store_check)
def _store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_scale_value: float | None = None,
    v_scale_value: float | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (k, v, k_cache, v_cache, out_cache_loc, k_scale, v_scale, k_scale_value, v_scale_value, enable_pdl)
    return _STORE_KERNELS, (k.dtype, k_cache.dtype), args, None


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out_cache_loc: torch.Tensor,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """``k_cache[out_cache_loc[i]] = k[i]`` and ``v_cache[out_cache_loc[i]] = v[i]`` in one launch.

    ``k``, ``v``: ``[tokens, kv_heads, head_dim]`` or ``[tokens, kv_heads * head_dim]`` (fp16, bf16 or
    fp32; any token stride). ``k_cache``, ``v_cache``: ``[slots, kv_heads, head_dim]`` or
    ``[slots, kv_heads * head_dim]`` in the activation dtype or ``float8_e4m3fn`` (any slot stride).
    ``out_cache_loc``: int32/int64 ``[tokens]``. ``k_scale``, ``v_scale``: required for an fp8 cache
    (float32 tensor of one element, or a float; the stored value is ``fp8(clamp(x * (1 / scale),
    -448, 448))``), ignored otherwise. ``enable_pdl``: programmatic dependent launch (``None``: on for
    sm_90+). See the module docstring for out-of-range and duplicate slots."""
    if k_scale is None and v_scale is None:  # a cache in the activation dtype
        _store(k, v, k_cache, v_cache, out_cache_loc, None, None, None, None, enable_pdl)
        return
    ks, ksv = split_scale(_STORE, "k_scale", k_scale)
    vs, vsv = split_scale(_STORE, "v_scale", v_scale)
    _store(k, v, k_cache, v_cache, out_cache_loc, ks, vs, ksv, vsv, enable_pdl)


@kernel_op(_MLA, mutates=("kv_buffer",), index_check=_mla_check)
def _mla(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    cache_k_nope: torch.Tensor,
    cache_k_rope: torch.Tensor,
    scale: torch.Tensor | None = None,
    scale_value: float | None = None,
    enable_pdl: bool | None = None,
) -> Launch:
    args = (kv_buffer, loc, cache_k_nope, cache_k_rope, scale, scale_value, enable_pdl)
    return _MLA_KERNELS, (cache_k_nope.dtype, kv_buffer.dtype), args, None


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    cache_k_nope: torch.Tensor,
    cache_k_rope: torch.Tensor,
    *,
    scale: torch.Tensor | float | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """``kv_buffer[loc[i]] = cat(cache_k_nope[i], cache_k_rope[i])`` in one launch, without the cat.

    ``kv_buffer``: ``[slots, 1, Dn + Dr]`` or ``[slots, Dn + Dr]`` (e.g. 576) in the activation
    dtype or ``float8_e4m3fn``; ``cache_k_nope``: ``[tokens, 1, Dn]`` or ``[tokens, Dn]`` (e.g. 512),
    ``cache_k_rope``: ``[tokens, 1, Dr]`` or ``[tokens, Dr]`` (e.g. 64), both any token stride;
    ``loc``: int32/int64 ``[tokens]``. ``scale`` (fp8 buffers only; default 1): the stored value is
    ``fp8(clamp(x * (1 / scale), -448, 448))``."""
    if scale is None:
        _mla(kv_buffer, loc, cache_k_nope, cache_k_rope, None, None, enable_pdl)
        return
    s, sv = split_scale(_MLA, "scale", scale)
    _mla(kv_buffer, loc, cache_k_nope, cache_k_rope, s, sv, enable_pdl)


__all__ = ["set_mla_kv_buffer", "store_kv_cache"]
