"""Every kernel family, and the grid of configurations the wheel prebuilds: the one obvious place.

CMake reads this module at configure time (``python -m jit_kernel.aot``) to generate the
prebuilt library's translation units; the ops read it at run time to dispatch. A config missing
from a grid still works: it is JIT-compiled on first use and cached.

Keep this module free of torch imports (the build environment has no torch).
"""

from __future__ import annotations

from jit_kernel.spec import KernelSpec

# The self-test family: runs on the CPU (host loop) and on CUDA, so that both dispatcher paths
# are exercised everywhere. Constants 1, 2 and 3 are prebuilt; any other compiles on first use.
ADD_CONSTANT_HOST = KernelSpec(
    family="add_constant_host",
    sources=("add_constant.h",),
    params=("constant",),
    exports={"run": "jit_kernel::add_constant::run_host<{args}>"},
    prebuilt=((1,), (2,), (3,)),
    target="host",
)

ADD_CONSTANT_CUDA = KernelSpec(
    family="add_constant",
    sources=("add_constant.cuh",),
    params=("constant",),
    exports={"run": "jit_kernel::add_constant::run_cuda<{args}>"},
    prebuilt=((1,), (2,), (3,)),
)

ALL_FAMILIES: tuple[KernelSpec, ...] = (ADD_CONSTANT_HOST, ADD_CONSTANT_CUDA)


def family(name: str) -> KernelSpec:
    for spec in ALL_FAMILIES:
        if spec.family == name:
            return spec
    raise KeyError(f"unknown kernel family {name!r}; known: {[s.family for s in ALL_FAMILIES]}")
