"""Kernel family specs: the one description that both the prebuilt library and the JIT path use.

A spec names a family's sources, its template parameters and one C++ wrapper expression per
export. A *config* is a tuple of template argument values, in parameter order: ints, bools and
C++ type names such as ``"bf16_t"``. :func:`symbol_name` names the exported symbol for the
prebuilt library and the runtime lookup alike. Torch-free: CMake runs this at configure time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

ConfigValue = int | bool | str
Config = tuple[ConfigValue, ...]


class ConfigError(ValueError):
    """A config value outside its parameter's domain; raised before any compiler runs."""


def _same(a: ConfigValue, b: ConfigValue) -> bool:
    return type(a) is type(b) and a == b  # type() as well: True == 1, but a bool is not a size


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A parameter that takes one of a few values (a dtype name, a specialised size). ``notes`` says
    what a value means where the value alone does not (``{0: "the generic kernel, ..."}``): errors,
    ``python -m jit_kernel list`` and :meth:`KernelSpec.value_notes` show it."""

    values: tuple[ConfigValue, ...]
    notes: Mapping[ConfigValue, str] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for value in self.notes:
            if not self.contains(value):
                raise ValueError(f"OneOf: a note for {cpp_literal(value)}, which is not one of the values")

    def contains(self, value: ConfigValue) -> bool:
        return any(_same(value, v) for v in self.values)

    def describe(self) -> str:
        notes = "".join(f" ({cpp_literal(v)}: {note})" for v, note in self.notes.items())
        return "one of " + ", ".join(cpp_literal(v) for v in self.values) + notes


@dataclasses.dataclass(frozen=True)
class IntRange:
    """An integer parameter in ``[low, high]``, optionally a multiple of ``step``."""

    low: int
    high: int
    step: int = 1

    def contains(self, value: ConfigValue) -> bool:
        return type(value) is int and self.low <= value <= self.high and value % self.step == 0

    def describe(self) -> str:
        multiple = f" that is a multiple of {self.step}" if self.step > 1 else ""
        return f"an integer in [{self.low}, {self.high}]{multiple}"


Domain = OneOf | IntRange


@dataclasses.dataclass(frozen=True, eq=False)  # specs are singletons: identity equality and hash
class KernelSpec:
    """One kernel family. ``exports`` maps an export name to a wrapper expression with ``{args}``
    standing for the template arguments, e.g. ``{"run": "RMSNormKernel<{args}>::run"}``. ``target``
    says whether the sources are CUDA (nvcc, for a GPU arch) or host C++. ``domains`` gives each
    parameter's allowed values: ``warm`` and the dispatcher check them before any compiler runs; a
    domain's notes explain values such as ``hidden=0`` (the kernel that takes the width at run time).
    ``prebuilt`` is the grid a build of the package compiles into its prebuilt library; a config
    outside it, or one the installed library lacks, is JIT-compiled on first use."""

    family: str
    sources: tuple[str, ...]
    params: tuple[str, ...]
    exports: Mapping[str, str]
    domains: Mapping[str, Domain]
    prebuilt: tuple[Config, ...] = ()
    target: Literal["cuda", "host"] = "cuda"
    extra_cuda_cflags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if set(self.domains) != set(self.params):
            raise ValueError(
                f"{self.family}: domains {sorted(self.domains)} must cover exactly the params {self.params}"
            )
        for config in self.prebuilt:
            self.check_config(config)

    def check_config(self, config: Config) -> None:
        """Raise :class:`ConfigError` naming the parameter and its allowed values."""
        if len(config) != len(self.params):
            raise ConfigError(
                f"{self.family} takes {len(self.params)} parameter(s) ({', '.join(self.params) or 'none'}), "
                f"got {len(config)}: {', '.join(cpp_literal(v) for v in config) or '(empty)'}"
            )
        for param, value in zip(self.params, config, strict=True):
            domain = self.domains[param]
            if not domain.contains(value):
                raise ConfigError(
                    f"{self.family}: {param}={cpp_literal(value)} is not allowed; {param} must be {domain.describe()}"
                )

    def value_notes(self) -> list[str]:
        """``hidden=0: the generic kernel, ...``: each parameter value whose meaning its domain notes."""
        return [
            f"{param}={cpp_literal(value)}: {note}"
            for param in self.params
            for value, note in getattr(self.domains[param], "notes", {}).items()
        ]

    def template_args(self, config: Config) -> str:
        return ", ".join(cpp_literal(value) for value in config)

    def describe(self, config: Config) -> str:
        """``rmsnorm<4096, bf16_t>``: how logs and errors name a config."""
        return f"{self.family}<{self.template_args(config)}>"

    def wrapper(self, export: str, config: Config) -> str:
        return self.exports[export].format(args=self.template_args(config))

    def config_from_mapping(self, values: Mapping[str, ConfigValue]) -> Config:
        """``{"hidden": 4096, "dtype": "bf16_t"}`` -> ``(4096, "bf16_t")``, checking the names."""
        missing = [p for p in self.params if p not in values]
        unknown = [k for k in values if k not in self.params]
        if missing or unknown:
            raise ValueError(f"{self.family}: parameters are {self.params}; missing {missing}, unknown {unknown}")
        return tuple(values[p] for p in self.params)


def cpp_literal(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def name_part(text: str) -> str:
    """``text`` as a piece of a C identifier or file name (symbols, JIT module names): ``-`` as ``m``,
    so that ``-4`` and ``4`` differ, any other run of non-alphanumerics as one ``_``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", text.replace("-", "m")).strip("_")


def symbol_name(spec: KernelSpec, export: str, config: Config) -> str:
    """The exported symbol of one (family, export, config), e.g. ``rmsnorm__run__4096_bf16_t``: a C
    identifier, unique per input."""
    if export not in spec.exports:
        raise KeyError(f"{spec.family} has no export {export!r}; exports: {list(spec.exports)}")
    parts = [name_part(cpp_literal(v)) for v in config]
    return "__".join([spec.family, export, "_".join(parts)]) if parts else f"{spec.family}__{export}"
