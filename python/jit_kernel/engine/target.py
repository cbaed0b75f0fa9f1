"""CUDA archs, and the one :class:`Target` per device: what to compile for and what the GPU can do.

Arch strings follow ``TORCH_CUDA_ARCH_LIST``: ``MAJOR.MINOR`` with an optional ``a`` (arch-specific:
that exact GPU) or ``f`` (family: the same major, an equal or newer minor) suffix; ``+PTX`` in arch
lists also embeds PTX. :func:`compile_arch` is the one rule for the arch a kernel is compiled for;
dispatch, JIT, the prebuilt lookup and the CLI all go through it or :func:`current`, and nothing
else reads ``JIT_KERNEL_CUDA_ARCH``, which wins over the device for the prebuilt decision as well
as for JIT (``9.0a`` never silently serves sm_80 code). Torch-free until a device is asked for:
CMake parses arch lists here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable

from jit_kernel.engine import env, toolchain

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)$")
ARCH_VARIABLE = "JIT_KERNEL_CUDA_ARCH"
ARCH_FORMS = "MAJOR.MINOR with an optional a (that exact GPU) or f (its family) suffix, e.g. 8.0, 9.0a, 12.0f"


class InvalidArchError(ValueError):
    """An arch string that is not ``MAJOR.MINOR[a|f]``. ``source`` names where it came from (the
    variable, a command's option, a function's argument), or is None."""

    def __init__(self, text: str, source: str | None = None) -> None:
        where = f"{source}={text!r}" if source else repr(text)
        super().__init__(f"invalid CUDA arch {where}: expected {ARCH_FORMS}")
        self.source = source


class NoCudaArchError(toolchain.ToolchainError):
    """No GPU is visible and ``JIT_KERNEL_CUDA_ARCH`` is unset (nor an ``--arch`` given), so there is
    no arch to compile for: :func:`compile_arch` raises it rather than guess one."""


@dataclasses.dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str, source: str | None = None) -> Arch:
        """``"9.0a"`` -> ``Arch(9, 0, "a")``; :class:`InvalidArchError` (naming ``source``, where the
        text came from, when given) for anything else."""
        match = _ARCH.match(text.strip())
        if match is None:
            raise InvalidArchError(text, source)
        return cls(int(match.group(1)), int(match.group(2)), match.group(3))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def machine_code_runs_on(self, capability: tuple[int, int]) -> bool:
        """SASS built for this arch runs on a GPU of ``capability``."""
        if self.suffix == "a":
            return capability == (self.major, self.minor)
        return capability[0] == self.major and capability[1] >= self.minor

    def ptx_runs_on(self, capability: tuple[int, int]) -> bool:
        """The driver can compile PTX for this arch for a GPU of ``capability``: any newer GPU, unless
        the PTX is arch- or family-specific (then the same GPUs as its machine code)."""
        return self.machine_code_runs_on(capability) if self.suffix else capability >= (self.major, self.minor)


@dataclasses.dataclass(frozen=True)
class ArchTarget:
    """One entry of an arch list: machine code for ``arch``, plus PTX when ``ptx``."""

    arch: Arch
    ptx: bool = False

    def gencode(self) -> str:
        code = f"[{self.arch.sm},{self.arch.compute}]" if self.ptx else self.arch.sm
        return f"-gencode=arch={self.arch.compute},code={code}"


def parse_arch_list(text: str) -> list[ArchTarget]:
    """``"8.0;9.0a 12.0+PTX"`` (separated by ``;``, ``,`` or spaces). ``none`` or empty: no CUDA."""
    entries = [e for e in re.split(r"[;,\s]+", text.strip()) if e not in ("", "none")]
    return [ArchTarget(Arch.parse(re.sub(r"(?i)\+PTX$", "", e)), e.upper().endswith("+PTX")) for e in entries]


def runs_on(machine_code: Iterable[Arch], ptx: Iterable[Arch], capability: tuple[int, int]) -> bool:
    return any(a.machine_code_runs_on(capability) for a in machine_code) or any(a.ptx_runs_on(capability) for a in ptx)


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
        return self.arch.major, self.arch.minor

    @property
    def pdl(self) -> bool:  # programmatic dependent launch
        return self.arch.major >= 9

    @property
    def arch_list(self) -> str:  # as TORCH_CUDA_ARCH_LIST / TVM_FFI_CUDA_ARCH_LIST spell it
        return str(self.arch)

    def describe(self) -> str:
        where = f"{self.device_name} (cuda:{self.device})" if self.device is not None else "no GPU visible"
        why = " from JIT_KERNEL_CUDA_ARCH" if self.from_override else ""
        return f"{self.arch.sm}{why}; {where}" + (f", {self.sm_count} SMs" if self.sm_count else "")


def arch_for_capability(major: int, minor: int) -> Arch:
    """The arch JIT compiles for on such a GPU: Hopper and datacenter Blackwell get their ``a``
    targets (wgmma, tcgen05); 12.x gets the family target ``f`` from CUDA 12.9 on, else ``a``."""
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


def no_arch_message(option: str | None = None) -> str:
    """What to do when there is no arch: every way to set it (the variable, and ``option`` where the
    command that needs the arch has one)."""
    ways = f"set {ARCH_VARIABLE} (for example {ARCH_VARIABLE}=9.0a for H100/H200, 8.0 for A100)"
    if option:
        ways += f" or pass {option} 9.0a"
    return f"no CUDA GPU is visible, so there is no CUDA arch to compile for; {ways}"


@functools.cache
def _target(device: int | None, override: str | None) -> Target:
    if device is None and not override:
        raise NoCudaArchError(no_arch_message())
    capability, sm_count, name = device_properties(device) if device is not None else (None, None, None)
    arch = Arch.parse(override, ARCH_VARIABLE) if override else arch_for_capability(*capability)
    return Target(arch, device, name, sm_count, from_override=bool(override))


def current(device: int | None = None) -> Target:
    """The target of ``device`` (default: the current CUDA device), memoised per device and override.
    Its arch follows :func:`compile_arch`'s rule; with no GPU and no override it raises
    :class:`NoCudaArchError`."""
    return _target(_current_device() if device is None else device, env.cuda_arch_override())


def compile_arch(requested: str | None = None, option: str | None = None) -> Arch:
    """The arch a CUDA kernel is compiled for, and the one rule for it, used by the dispatcher,
    ``load_jit``, ``warm``, ``doctor`` and ``clangd`` alike:

    1. ``requested`` (a command's ``--arch``, a ``cuda_arch=`` argument) when given; ``option``
       names where it came from;
    2. else ``JIT_KERNEL_CUDA_ARCH`` when set;
    3. else the current GPU's arch (:func:`arch_for_capability`: ``a`` for Hopper and datacenter
       Blackwell, ``f`` for 12.x);
    4. else :class:`NoCudaArchError`, whose message names every way to set it (the variable, and
       ``option`` where the caller has one).

    There is no default arch. A kernel built for a guessed arch is cached and then fails, or is
    silently rebuilt, on the GPU it meets later (``no kernel image``, or a cache that a warm-up did
    not fill), and an editor configured for one hides the code of every other arch; a machine
    without a GPU has to say what it compiles for, once, in the variable. A bad value raises
    :class:`InvalidArchError` naming where it came from."""
    if requested:
        return Arch.parse(requested, option)
    try:
        return current().arch
    except NoCudaArchError:
        if option is None:
            raise
        raise NoCudaArchError(no_arch_message(option)) from None


def device_count() -> int:
    """How many CUDA devices are visible: the seam tests replace."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@functools.cache
def _archs_of_devices(override: str | None) -> frozenset[Arch]:
    return frozenset(_target(device, override).arch for device in range(device_count()))


def one_arch_for_all_devices() -> bool:
    """Whether every visible GPU compiles for the same arch (or none is visible), so that a
    function resolved on one device serves them all; memoised per override."""
    return len(_archs_of_devices(env.cuda_arch_override())) <= 1


def clear() -> None:
    """Forget every memoised target (tests that fake a device)."""
    _target.cache_clear()
    _archs_of_devices.cache_clear()
