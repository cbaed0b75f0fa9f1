"""Linear layers of one input merged into one GEMM, their parameters kept (:class:`_Merged`)."""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


class _Merged:
    """Several ``nn.Linear`` layers of one input as one GEMM. Their weights (and biases) are moved
    into consecutive rows of one tensor and each ``nn.Parameter`` keeps its identity, name and
    values, its data now a view of that tensor: ``state_dict()`` is unchanged, ``load_state_dict``
    writes through to the merged tensor, and ``save_pretrained`` clones the disjoint views. A move
    of the module (``.to()``, ``.half()``) merges again; in eager mode each call checks that the
    parameters still view the merged tensor (``load_state_dict(assign=True)`` replaces them) and
    merges again where they do not. fp8 linear layers' 128 x 128 block scales (``weight_scale_inv``,
    whole blocks of rows) are merged the same way, into ``scale``."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.linears = list(linears)
        self.weight = torch.empty(0)
        self.bias: torch.Tensor | None = None
        self.scale: torch.Tensor | None = None
        self.merge()

    def merge(self) -> None:
        with torch.no_grad():
            self.weight = self._merge([lin.weight for lin in self.linears])
            biases = [lin.bias for lin in self.linears]
            self.bias = None if biases[0] is None else self._merge(biases)  # type: ignore[arg-type]
            scales = [getattr(lin, "weight_scale_inv", None) for lin in self.linears]
            self.scale = None if scales[0] is None else self._merge(scales)  # type: ignore[arg-type]

    @staticmethod
    def _merge(params: Sequence[torch.Tensor]) -> torch.Tensor:
        merged = _static(torch.cat([p.detach() for p in params], 0))
        row = 0
        for p in params:
            n = p.shape[0]
            p.data = merged[row : row + n]
            row += n
        return merged

    def intact(self) -> bool:
        """Every parameter is still its slice of the merged tensors (a host-side check)."""
        for merged, name in ((self.weight, "weight"), (self.bias, "bias"), (self.scale, "weight_scale_inv")):
            if merged is None:
                continue
            row, step = 0, merged.stride(0) * merged.element_size()
            for lin in self.linears:
                p = getattr(lin, name, None)
                if p is None or p.dtype != merged.dtype or p.data_ptr() != merged.data_ptr() + row * step:
                    return False
                row += p.shape[0]
        return True

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not torch.compiler.is_compiling() and not self.intact():
            self.merge()
        return self.weight, self.bias


def _static(tensor: torch.Tensor) -> torch.Tensor:
    """Mark a tensor the patched forwards read (not a parameter or buffer) as having a fixed
    address, so that torch.compile's CUDA graphs read it in place rather than copying it in."""
    torch._dynamo.mark_static_address(tensor)
    return tensor


def _merge_on_apply(module: nn.Module, merged: Sequence[_Merged]) -> None:
    """After ``module._apply`` (``.to()``, ``.cuda()``, ``.half()``: new tensors for every parameter),
    merge its linear layers again."""

    def _apply(self: nn.Module, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> nn.Module:
        result = type(self)._apply(self, fn, *args, **kwargs)
        for m in merged:
            m.merge()
        return result

    module._apply = types.MethodType(_apply, module)  # type: ignore[method-assign]
