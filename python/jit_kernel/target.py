"""The one :class:`Target` per device: what to compile for and what the GPU can do.

Dispatch, JIT, the prebuilt lookup and the CLI all ask :func:`current`; nothing else derives an
arch from a compute capability or reads ``JIT_KERNEL_CUDA_ARCH``. The override wins over the
device, for the prebuilt decision as well as for JIT: a prebuilt symbol is used only when its code
runs on the arch being targeted, so ``JIT_KERNEL_CUDA_ARCH=9.0a`` never silently serves sm_80 code.
"""

from __future__ import annotations

import dataclasses
import functools

from jit_kernel import env, toolchain
from jit_kernel.arch import Arch


@dataclasses.dataclass(frozen=True)
class Target:
    """One device (or the override alone, on a machine with no GPU)."""

    arch: Arch  # what JIT compiles for, with its a/f suffix
    device: int | None  # None: no GPU is visible; the arch came from JIT_KERNEL_CUDA_ARCH
    device_name: str | None
    sm_count: int | None
    from_override: bool

    @property
    def capability(self) -> tuple[int, int]:
        """The compute capability the prebuilt lookup checks code against."""
        return self.arch.major, self.arch.minor

    @property
    def pdl(self) -> bool:
        """Programmatic dependent launch: sm_90 and newer."""
        return self.arch.major >= 9

    @property
    def arch_list(self) -> str:
        """The arch list for a build (``TORCH_CUDA_ARCH_LIST`` / ``TVM_FFI_CUDA_ARCH_LIST`` form)."""
        return str(self.arch)

    def describe(self) -> str:
        where = f"{self.device_name} (cuda:{self.device})" if self.device is not None else "no GPU visible"
        why = " from JIT_KERNEL_CUDA_ARCH" if self.from_override else ""
        return f"{self.arch.sm}{why}; {where}" + (f", {self.sm_count} SMs" if self.sm_count else "")


def arch_for_capability(major: int, minor: int) -> Arch:
    """The arch to compile for a device of this compute capability.

    Hopper and datacenter Blackwell get their arch-specific ``a`` targets (wgmma, tcgen05).
    For 12.x the family target ``f`` needs CUDA 12.9+; older toolkits get ``a``.
    """
    if major in (9, 10):
        return Arch(major, minor, "a")
    if major == 12:
        return Arch(major, minor, "f" if toolchain.nvcc_release() >= (12, 9) else "a")
    return Arch(major, minor)


def device_properties(index: int) -> tuple[tuple[int, int], int, str]:
    """(compute capability, SM count, name) of a CUDA device: the seam tests replace."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count, props.name


def _current_device() -> int | None:
    import torch

    return torch.cuda.current_device() if torch.cuda.is_available() else None


@functools.cache
def _target(device: int | None, override: str | None) -> Target:
    properties = device_properties(device) if device is not None else None
    if override:
        arch = Arch.parse(override)
    elif properties is not None:
        arch = arch_for_capability(*properties[0])
    else:
        raise toolchain.ToolchainError(
            "no CUDA GPU is visible, so the CUDA arch to compile for is unknown; "
            "set JIT_KERNEL_CUDA_ARCH (for example JIT_KERNEL_CUDA_ARCH=9.0a for an H100) to compile anyway"
        )
    sm_count, name = (properties[1], properties[2]) if properties else (None, None)
    return Target(arch, device, name, sm_count, from_override=bool(override))


def current(device: int | None = None) -> Target:
    """The target of ``device`` (default: the current CUDA device), memoised per device and override."""
    return _target(_current_device() if device is None else device, env.cuda_arch_override())


def clear() -> None:
    """Forget every memoised target (tests that fake a device)."""
    _target.cache_clear()
