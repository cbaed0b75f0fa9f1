"""First call in a fresh process: prebuilt vs JIT with a warm cache vs JIT with a cold cache.

Each sample is a new Python process. It imports torch and creates its input (and the CUDA
context) untimed, then times ``import jit_kernel`` and, separately, the first ``add_constant``
call to its completion (synchronised). A second table times ``load_jit`` of an already-cached module in a new
process, against tvm-ffi's own ``load_inline`` on its warm cache (which runs ninja every time).

    python -m jit_kernel.benchmark.bench_first_call --device cuda --repeats 5
    python -m jit_kernel.benchmark.bench_first_call --json-dir DIR   # + DIR/bench_first_call.json (report.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from jit_kernel.benchmark import results

_FIRST_CALL = """
import json, time, torch
device = {device!r}
x = torch.arange(1 << 16, dtype=torch.int32, device=device)
if device == "cuda":
    torch.cuda.synchronize()
start = time.perf_counter()
import tvm_ffi
ffi_imported = time.perf_counter()
import jit_kernel
imported = time.perf_counter()
out = jit_kernel.add_constant(x, {constant})
if device == "cuda":
    torch.cuda.synchronize()
done = time.perf_counter()
assert torch.equal(out, x + {constant})
from jit_kernel.ops import add_constant as op
decision = (op._CUDA if device == "cuda" else op._HOST).decisions[({constant},)]
print(json.dumps({{"tvm_ffi": ffi_imported - start, "import": imported - ffi_imported, "call": done - imported,
                  "decision": decision}}))
"""

_LOAD = """
import json, time, torch, tvm_ffi, tvm_ffi.cpp
import jit_kernel
kind = {kind!r}
start = time.perf_counter()
if kind == "load_jit":
    module = jit_kernel.load_jit("bench_load", cpp_files=["add_constant.h"],
                                 cpp_wrappers=[("run", "jit_kernel::add_constant::run_host<5>")])
else:
    module = tvm_ffi.cpp.load_inline("bench_load_inline", cpp_sources="int answer() {{ return 42; }}",
                                     functions=["answer"])
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed}}))
"""


def _sample(code: str, environment: dict[str, str]) -> dict[str, object]:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark process failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def first_call(device: str, repeats: int, cold_repeats: int) -> list[tuple[str, dict[str, float], str]]:
    base = {**os.environ, "JIT_KERNEL_LOG_LEVEL": "WARNING"}
    rows = []
    with tempfile.TemporaryDirectory() as warm_cache:
        warm_env = {**base, "JIT_KERNEL_CACHE_DIR": warm_cache}
        _sample(_FIRST_CALL.format(device=device, constant=1), warm_env)  # page cache, .pyc
        samples = [_sample(_FIRST_CALL.format(device=device, constant=1), warm_env) for _ in range(repeats)]
        rows.append(("prebuilt (add_constant<1>)", samples))
        _sample(_FIRST_CALL.format(device=device, constant=97), warm_env)  # fills the cache
        samples = [_sample(_FIRST_CALL.format(device=device, constant=97), warm_env) for _ in range(repeats)]
        rows.append(("jit, warm cache (add_constant<97>)", samples))
    samples = []
    for _ in range(cold_repeats):
        with tempfile.TemporaryDirectory() as cold_cache:
            samples.append(
                _sample(_FIRST_CALL.format(device=device, constant=98), {**base, "JIT_KERNEL_CACHE_DIR": cold_cache})
            )
    rows.append(("jit, cold cache (add_constant<98>)", samples))
    phases = ("tvm_ffi", "import", "call")
    return [
        (name, {p: statistics.median(float(s[p]) for s in samples) for p in phases}, str(samples[0]["decision"]))
        for name, samples in rows
    ]


def warm_load(repeats: int) -> list[tuple[str, float]]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        environment = {**os.environ, "JIT_KERNEL_CACHE_DIR": cache, "TVM_FFI_CACHE_DIR": str(Path(cache) / "tvm-ffi")}
        for kind, label in (
            ("load_jit", "jit_kernel.load_jit, warm cache"),
            ("load_inline", "tvm_ffi load_inline, warm cache"),
        ):
            _sample(_LOAD.format(kind=kind), environment)  # build once
            times = [float(_sample(_LOAD.format(kind=kind), environment)["seconds"]) for _ in range(repeats)]
            rows.append((label, statistics.median(times)))
    return rows


FIRST_CALL_HEADER = [
    "case",
    "import tvm_ffi (ms)",
    "import jit_kernel, rest (ms)",
    "first call (ms)",
    "call vs cold JIT",
    "decision",
]
LOAD_HEADER = ["loader", "load (ms)"]


def first_call_rows(rows: list[tuple[str, dict[str, float], str]]) -> list[list[object]]:
    cold = rows[-1][1]["call"]
    return [
        [
            name,
            f"{t['tvm_ffi'] * 1e3:.1f}",
            f"{t['import'] * 1e3:.1f}",
            f"{t['call'] * 1e3:.1f}",
            f"{cold / t['call']:.0f}x",
            decision,
        ]
        for name, t, decision in rows
    ]


def _print_table(title: str, header: Sequence[str], align: str, rows: Sequence[Sequence[object]]) -> None:
    print(f"\n{title}")
    print("| " + " | ".join(header) + " |")
    print(align)
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cold-repeats", type=int, default=3)
    parser.add_argument("--json-dir", metavar="DIR", help="write the tables as DIR/bench_first_call.json")
    args = parser.parse_args(argv)
    json_dir = results.resolve_json_dir(args.json_dir)

    tables: list[results.Json] = []
    complete = True
    with results.stoppable():
        try:
            title = (
                f"first call in a fresh process, device={args.device} "
                f"(median of {args.repeats}; cold: {args.cold_repeats})"
            )
            rows = first_call_rows(first_call(args.device, args.repeats, args.cold_repeats))
            _print_table(title, FIRST_CALL_HEADER, "|---|---:|---:|---:|---:|---|", rows)
            tables.append(results.cells_table("first_call", title, FIRST_CALL_HEADER, rows))
            title = f"warm load of a cached module in a fresh process (median of {args.repeats})"
            rows = [[name, f"{seconds * 1e3:.2f}"] for name, seconds in warm_load(args.repeats)]
            _print_table(title, LOAD_HEADER, "|---|---:|", rows)
            tables.append(results.cells_table("warm_load", title, LOAD_HEADER, rows))
        except KeyboardInterrupt:  # stopped at its time bound: keep the tables measured
            complete = False
            print("\ninterrupted: the tables above hold what was measured before the stop")
    if json_dir:
        doc = results.document(
            "bench_first_call",
            results.first_paragraph(__doc__),
            results.command_line("bench_first_call", argv),
            tables,
            complete=complete,
        )
        print(f"results: {results.write(json_dir, doc)}")
    if not complete:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
