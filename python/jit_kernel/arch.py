"""CUDA arch strings and which compiled code runs on which GPU.

Arch strings follow ``TORCH_CUDA_ARCH_LIST``: ``MAJOR.MINOR`` with an optional ``a`` (arch-specific,
runs only on that exact GPU) or ``f`` (family, runs on the same major with an equal or newer
minor) suffix, and ``+PTX`` in arch lists to also embed PTX. Torch-free: CMake uses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)$")


@dataclass(frozen=True, order=True)
class Arch:
    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str) -> Arch:
        match = _ARCH.match(text.strip())
        if match is None:
            raise ValueError(f"invalid CUDA arch {text!r}: expected MAJOR.MINOR with an optional a/f suffix, e.g. 9.0a")
        return cls(int(match.group(1)), int(match.group(2)), match.group(3))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def digits(self) -> str:
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def sm(self) -> str:
        return f"sm_{self.digits}"

    @property
    def compute(self) -> str:
        return f"compute_{self.digits}"

    def machine_code_runs_on(self, capability: tuple[int, int]) -> bool:
        """SASS built for this arch runs on a GPU of ``capability``."""
        major, minor = capability
        if self.suffix == "a":
            return (major, minor) == (self.major, self.minor)
        return major == self.major and minor >= self.minor

    def ptx_runs_on(self, capability: tuple[int, int]) -> bool:
        """PTX for this arch can be JIT-compiled by the driver for a GPU of ``capability``."""
        if self.suffix == "a":
            return capability == (self.major, self.minor)
        if self.suffix == "f":
            return capability[0] == self.major and capability[1] >= self.minor
        return capability >= (self.major, self.minor)


@dataclass(frozen=True)
class ArchTarget:
    """One entry of an arch list: machine code for ``arch``, plus PTX when ``ptx``."""

    arch: Arch
    ptx: bool = False

    def gencode(self) -> str:
        code = f"[{self.arch.sm},{self.arch.compute}]" if self.ptx else self.arch.sm
        return f"-gencode=arch={self.arch.compute},code={code}"


def parse_arch_list(text: str) -> list[ArchTarget]:
    """``"8.0;9.0a 12.0+PTX"`` (separated by ``;``, ``,`` or spaces). ``none`` or empty: no CUDA."""
    entries = [e for e in re.split(r"[;,\s]+", text.strip()) if e]
    if entries in ([], ["none"]):
        return []
    targets = []
    for entry in entries:
        ptx = entry.upper().endswith("+PTX")
        targets.append(ArchTarget(Arch.parse(entry[:-4] if ptx else entry), ptx))
    return targets


def runs_on(machine_code: list[Arch], ptx: list[Arch], capability: tuple[int, int]) -> bool:
    return any(a.machine_code_runs_on(capability) for a in machine_code) or any(a.ptx_runs_on(capability) for a in ptx)
