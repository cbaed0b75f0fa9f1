"""The benchmarks' machine-readable results: one JSON file per script, read by
``python -m jit_kernel.benchmark.report`` to generate docs/benchmarks.md.

A script writes its file when given a folder (``--json-dir DIR`` or ``$BENCH_JSON_DIR``). The file
holds the environment (device, driver, versions), the exact command line, and the script's tables:

- ``"kind": "providers"``: the kernel-family tables. Per row, the key columns, the op's minimal
  bytes and every provider's median time in us; per provider the share of the copy ceiling (the
  copy of the same bytes' time over the provider's); for decode-sized rows the empty kernel
  measured beside ours and our time over it.
- ``"kind": "cells"``: any other table, as the script prints it (header and formatted cells).

A script stopped at its time bound writes what it measured, with ``"complete": false``.

Nothing here imports triton or touches CUDA at import time.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SCHEMA = "jit_kernel.benchmark/1"
JSON_DIR_ENV = "BENCH_JSON_DIR"
COMMIT_ENV = "JIT_KERNEL_BENCH_COMMIT"
# Environment variables that change what a script measures; recorded with its command line.
GRID_ENV = ("JIT_KERNEL_BENCH_CI", "CI")

Json = dict[str, Any]


def resolve_json_dir(value: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The folder for the JSON results: ``--json-dir DIR`` (``value``), else ``$BENCH_JSON_DIR``,
    else None (no file). An empty value counts as unset."""
    if value:
        return value
    env = os.environ if environ is None else environ
    return env.get(JSON_DIR_ENV) or None


def command_line(script: str, argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> str:
    """The shell command that reruns ``script`` with ``argv`` (``sys.argv[1:]`` when None), prefixed
    by the grid variables that were set."""
    env = os.environ if environ is None else environ
    args = list(sys.argv[1:] if argv is None else argv)
    prefix = [f"{name}={shlex.quote(env[name])}" for name in GRID_ENV if env.get(name)]
    return " ".join([*prefix, "python", "-m", f"jit_kernel.benchmark.{script}", *map(shlex.quote, args)])


# ---------------------------------------------------------------------------------------------
# Stopping at a time bound

_STOP = {"requested": False}


def _on_interrupt(signum: int, frame: object) -> None:
    _STOP["requested"] = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def stoppable() -> Iterator[None]:
    """While inside, SIGINT (``run_all`` stopping a script at its bound, or Ctrl-C) raises
    KeyboardInterrupt and is remembered: a measurement whose clean-up turns the interrupt into
    another exception (e.g. a CUDA-graph capture cut short) still stops the script, at the next
    :func:`check_stop` if not at once (see :func:`stop_requested`)."""
    _STOP["requested"] = False
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _on_interrupt) if main else None
    try:
        yield
    finally:
        _STOP["requested"] = False  # a stop ends with the block that asked for it
        if main:
            signal.signal(signal.SIGINT, previous)


def stop_requested() -> bool:
    return _STOP["requested"]


def check_stop() -> None:
    """Raise KeyboardInterrupt if a stop was requested (a measurement loop calls it between
    measurements)."""
    if _STOP["requested"]:
        raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------
# The environment


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _module_version(module: str, *distributions: str) -> str | None:
    """The version of ``module`` without importing it where it is not imported yet: its
    distribution's metadata, else ``<package>/_build_meta.py`` (FlashInfer's unpacked copy has no
    metadata)."""
    loaded = sys.modules.get(module)
    if loaded is not None and isinstance(getattr(loaded, "__version__", None), str):
        return loaded.__version__
    version = _distribution_version(*distributions)
    if version is not None:
        return version
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        meta = Path(folder) / "_build_meta.py"
        if meta.is_file():
            found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", meta.read_text())
            if found:
                return found.group(1)
    return None


def _driver_version() -> str | None:
    """The NVIDIA driver release (e.g. ``580.95.05``), from nvidia-smi; None without it."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def _commit(environ: Mapping[str, str]) -> str | None:
    """``$JIT_KERNEL_BENCH_COMMIT``, else the commit of the git checkout holding this file, else None."""
    if environ.get(COMMIT_ENV):
        return environ[COMMIT_ENV]
    try:
        result = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def environment(environ: Mapping[str, str] | None = None) -> Json:
    """Device, driver and versions of this process (CUDA is initialised when available)."""
    import torch

    import jit_kernel

    env = os.environ if environ is None else environ
    device: Json = {"name": None, "capability": None, "sms": None}
    try:
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            capability = f"{props.major}.{props.minor}"
            device = {"name": props.name, "capability": capability, "sms": props.multi_processor_count}
    except RuntimeError as error:  # a CUDA error left by an interrupted measurement
        print(f"environment: no device properties ({error})")
    return {
        "device": device,
        "driver": _driver_version() if device["name"] else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _module_version("triton", "triton"),
        "tvm_ffi": _module_version("tvm_ffi", "apache-tvm-ffi"),
        "jit_kernel": jit_kernel.__version__,
        "flashinfer": _module_version("flashinfer", "flashinfer-python", "flashinfer"),
        "liger_kernel": _module_version("liger_kernel", "liger-kernel", "liger_kernel"),
        "commit": _commit(env),
        "grid": "ci" if any(env.get(name, "").lower() in ("1", "true", "yes", "on") for name in GRID_ENV) else "full",
    }


# ---------------------------------------------------------------------------------------------
# Tables


def _number(value: float | None) -> float | None:
    """A time or ratio for JSON: None where missing (nan, zero or negative)."""
    if value is None or math.isnan(value) or value <= 0:
        return None
    return round(float(value), 4)


def provider_table(
    name: str,
    title: str,
    key_columns: Sequence[str],
    providers: Mapping[str, str],
    rows: Sequence[Json],
) -> Json:
    """A kernel-family table: ``providers`` maps provider keys to their labels ("jit" is ours,
    "copy" the ceiling), ``rows`` come from :func:`provider_row`."""
    return {
        "kind": "providers",
        "name": name,
        "title": title,
        "key_columns": list(key_columns),
        "providers": dict(providers),
        "rows": list(rows),
    }


def provider_row(
    key: Sequence[object],
    times: Mapping[str, float],
    nbytes: int,
    tiny: bool,
    providers: Sequence[str],
    empty: float | None = None,
    empty_provider: str = "empty",
) -> Json:
    """One config: key cells, every provider's median us (None when it failed or does not exist),
    each provider's share of the copy ceiling (copy us / its us), and for decode-sized (``tiny``)
    configs the empty kernel measured beside ours and our time over it."""
    us = {provider: _number(times.get(provider)) for provider in providers}
    copy = us.get("copy")
    ceiling = {
        provider: (_number(copy / value) if copy and value else None)
        for provider, value in us.items()
        if provider != "copy"
    }
    row: Json = {"key": list(key), "bytes": int(nbytes), "tiny": bool(tiny), "us": us, "of_copy_ceiling": ceiling}
    if tiny:
        reference = _number(times.get(empty_provider, empty if empty is not None else math.nan))
        ours = us.get("jit")
        row["empty_us"] = reference
        row["vs_empty"] = _number(ours / reference) if ours and reference else None
    return row


def cells_table(name: str, title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> Json:
    """A table recorded as printed: its header and its cells, formatted."""
    return {
        "kind": "cells",
        "name": name,
        "title": title,
        "header": [str(cell) for cell in header],
        "rows": [[_cell(cell) for cell in row] for row in rows],
    }


def _cell(value: object) -> str | int | None:
    if value is None or (isinstance(value, (str, int)) and not isinstance(value, bool)):
        return value  # type: ignore[return-value]
    if isinstance(value, float):
        return None if math.isnan(value) else f"{value:.1f}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# The file


def document(
    script: str,
    summary: str,
    command: str,
    tables: Sequence[Json],
    *,
    complete: bool = True,
    environment_info: Json | None = None,
    notes: Sequence[str] = (),
    empty_kernel_us: float | None = None,
) -> Json:
    """One script's results. ``summary`` is one paragraph saying what the script measures."""
    return {
        "schema": SCHEMA,
        "script": script,
        "summary": " ".join(summary.split()),
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "environment": environment() if environment_info is None else environment_info,
        "complete": complete,
        "empty_kernel_us": _number(empty_kernel_us),
        "notes": list(notes),
        "tables": list(tables),
    }


def write(json_dir: str | os.PathLike[str], doc: Json) -> Path:
    """Write ``doc`` as ``<json_dir>/<script>.json`` (strict JSON: no NaN) and return the path."""
    folder = Path(json_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{doc['script']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def first_paragraph(docstring: str | None) -> str:
    """The first paragraph of a module docstring, on one line."""
    text = (docstring or "").strip().split("\n\n")[0]
    return " ".join(text.split())


def load(json_dir: str | os.PathLike[str]) -> list[Json]:
    """Every result file of ``json_dir`` (files of another schema are skipped), by script name."""
    docs = []
    for path in sorted(Path(json_dir).glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            docs.append(data)
    return docs
