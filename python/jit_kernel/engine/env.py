"""Where the package's files live, and every environment variable it reads. An installed wheel
carries ``include/`` and ``csrc/`` inside the package; a source checkout, at the repository root.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _data_root() -> Path:
    if (PACKAGE_DIR / "include" / "sgl_kernel").is_dir():
        return PACKAGE_DIR
    checkout_root = PACKAGE_DIR.parent.parent
    if (checkout_root / "include" / "sgl_kernel").is_dir():
        return checkout_root
    raise ImportError(
        f"jit_kernel: cannot find include/sgl_kernel next to {PACKAGE_DIR} "
        "nor at the root of a source checkout; the installation is incomplete"
    )


DATA_ROOT = _data_root()
INCLUDE_DIR = DATA_ROOT / "include"
CSRC_DIR = DATA_ROOT / "csrc"


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """Root of the on-disk JIT cache: ``$JIT_KERNEL_CACHE_DIR`` or ``~/.cache/jit_kernel``."""
    return Path(os.environ.get("JIT_KERNEL_CACHE_DIR") or "~/.cache/jit_kernel").expanduser().resolve()


def max_jobs() -> int | None:
    """``$MAX_JOBS``: how many compiles one JIT build runs at once (ninja's ``-j``; torch and tvm-ffi
    read the same variable). Unset: ninja's default."""
    value = os.environ.get("MAX_JOBS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def cuda_home() -> tuple[str, Path] | None:
    """``$CUDA_HOME``, else ``$CUDA_PATH``: (the variable's name, its value), if either is set."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(name)
        if value:
            return name, Path(value)
    return None


def cxx() -> str | None:
    """``$CXX``: the host C++ compiler, for the host pass of nvcc too (tvm-ffi's builds read it as well)."""
    return os.environ.get("CXX") or None


def cuda_arch_override() -> str | None:
    """``$JIT_KERNEL_CUDA_ARCH`` (for example ``9.0`` or ``9.0a``), if set."""
    return os.environ.get("JIT_KERNEL_CUDA_ARCH") or None


def log_level() -> str:
    return os.environ.get("JIT_KERNEL_LOG_LEVEL", "INFO").upper()


def configure_logging() -> bool:
    """Whether the package attaches its own stderr handler (``JIT_KERNEL_CONFIGURE_LOGGING=0`` opts out)."""
    return os.environ.get("JIT_KERNEL_CONFIGURE_LOGGING", "1") != "0"


def prebuilt_disabled() -> bool:
    """``JIT_KERNEL_DISABLE_PREBUILT=1``: ignore the prebuilt library, JIT-compile everything."""
    return _flag("JIT_KERNEL_DISABLE_PREBUILT")


def launch_sites_disabled() -> bool:
    """``JIT_KERNEL_DISABLE_LAUNCH_SITES=1`` (read at import): every eager call looks its kernel up
    in Python (``jit_kernel.ops._site`` says what a launch site is)."""
    return _flag("JIT_KERNEL_DISABLE_LAUNCH_SITES")


def jit_disabled() -> bool:
    """``JIT_KERNEL_DISABLE_JIT=1``: a config with no usable prebuilt symbol is an error, not a compile."""
    return _flag("JIT_KERNEL_DISABLE_JIT")


def aot_archs() -> str | None:
    """``JIT_KERNEL_AOT_ARCHS``: the arch list the prebuilt library is built for (build time only)."""
    return os.environ.get("JIT_KERNEL_AOT_ARCHS")


# The ops read JIT_KERNEL_CHECK_INDICES on every call (it may be toggled at run
# time), so the common answer, "unset", must cost one dict lookup. No public form does: os.environ.get
# and ``in`` of an unset variable raise and catch a KeyError inside, and os.environ has no hook that
# would let an answer read once see a later change (timings: docs/design/engine.md). So this module
# reads one CPython detail: os.environ keeps its encoded copy in ``_data``, which every write through
# os.environ updates, and ``CHECK_INDICES_KEY not in ENVIRON_DATA`` is one lookup in it. Where
# os.environ keeps no such dict (not CPython), ENVIRON_DATA holds the key and every call asks _flag.
# tests/test_env.py checks that the lookup follows os.environ.
CHECK_INDICES_KEY: object = getattr(os.environ, "encodekey", lambda key: key)("JIT_KERNEL_CHECK_INDICES")
_ENCODED_ENVIRON = getattr(os.environ, "_data", None)
ENVIRON_DATA: dict[object, object] = (
    _ENCODED_ENVIRON if isinstance(_ENCODED_ENVIRON, dict) else {CHECK_INDICES_KEY: None}
)


def check_indices() -> bool:
    """``JIT_KERNEL_CHECK_INDICES=1``: the hicache transfers, rope, the KV-cache store and the
    speculative-sampling ops validate indices before a launch (one reduction and a sync); read at
    every call so that it can be toggled at run time."""
    if CHECK_INDICES_KEY not in ENVIRON_DATA:
        return False  # the common case: one dict lookup (see ENVIRON_DATA)
    return _flag("JIT_KERNEL_CHECK_INDICES")


def in_ci() -> bool:
    """``CI`` or ``JIT_KERNEL_BENCH_CI`` set to 1/true/yes/on: tests and benchmarks use their CI-sized ranges."""
    return _flag("CI") or _flag("JIT_KERNEL_BENCH_CI")


def run_full_tests() -> bool:
    """``JIT_KERNEL_RUN_FULL_TESTS=1``: tests use their full ranges even in CI (``get_ci_test_range``)."""
    return _flag("JIT_KERNEL_RUN_FULL_TESTS")
