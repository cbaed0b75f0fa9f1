"""RMSNorm as a layer in the ``kernels`` package's contract (stateless, transformers' ``forward``
signature), so that ``kernels.kernelize`` can install it (:func:`kernel_mapping`) as :func:`apply`
does."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .backends import _default_backend, _ops_for
from .plans import _PLAN


class JitKernelRMSNorm(nn.Module):
    """The forward of an RMSNorm layer (``weight [D]``, ``variance_epsilon``) on ``rmsnorm``.

    Stateless, with the forward signature of transformers' RMSNorm layers, so that it is a valid
    replacement layer for ``kernels.kernelize`` (:func:`kernel_mapping`); :func:`apply` installs it
    the same way (the instance's ``forward`` rebound). With autograd on, it runs the layer's own
    forward. The norm is computed in fp32 and rounded once (transformers rounds the normalised
    value to the dtype before the weight multiply, so results differ by at most about one ulp)."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return type(self).forward(self, hidden_states)
        plan = self.__dict__.get(_PLAN)
        ops = _ops_for(_default_backend() if plan is None else plan.backend, hidden_states)
        d = hidden_states.shape[-1]
        out = ops.rmsnorm(hidden_states.reshape(-1, d), self.weight, self.variance_epsilon)
        return out.view(hidden_states.shape)


class _LayerRepository:
    """A ``kernels`` repository (``load()`` returns the layer class) for a layer of this package."""

    def __init__(self, layer: type[nn.Module]) -> None:
        self.layer = layer
        self.layer_name = layer.__name__

    def load(self) -> type[nn.Module]:
        return self.layer

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _LayerRepository) and other.layer is self.layer

    def __hash__(self) -> int:
        return hash(self.layer)

    def __str__(self) -> str:
        return f"jit_kernel layer `{self.layer_name}`"


def kernel_mapping(device: str = "cuda") -> dict[str, Any]:
    """A mapping for the ``kernels`` package: transformers' ``RMSNorm`` layers to
    :class:`JitKernelRMSNorm`. Use it where a project already kernelizes::

        from kernels import Mode, kernelize, use_kernel_mapping
        with use_kernel_mapping(kernel_mapping()):
            kernelize(model, mode=Mode.INFERENCE, device="cuda")

    That covers the norms only; :func:`apply` also does the parts no hub layer covers."""
    from kernels import Mode

    return {"RMSNorm": {device: {Mode.INFERENCE | Mode.TORCH_COMPILE: _LayerRepository(JitKernelRMSNorm)}}}
