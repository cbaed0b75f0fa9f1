"""Warm load of a cached host module in a new process: ``jit_kernel.load_jit`` against tvm-ffi's
own ``tvm_ffi.cpp.load_inline`` (which runs ninja on every load). CPU-side only; no GPU needed.

    python tools/bench_warm_load.py [ROUNDS]

Each round starts one new process per loader (alternating), after one warming build of each; the
figure is the time of the load call alone (imports excluded), median over the rounds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OURS = """
import time, tvm_ffi
from jit_kernel.engine.jit import load_jit
start = time.perf_counter()
module = load_jit("warm_load", cpp_files=[{source!r}], cpp_wrappers=[("v", "u::v")])
print((time.perf_counter() - start) * 1e3); assert module.v() == 7
"""
INLINE = """
import time, tvm_ffi, tvm_ffi.cpp
start = time.perf_counter()
module = tvm_ffi.cpp.load_inline("warm_load", cpp_sources="int v() {{ return 7; }}", functions=["v"],
                                 build_directory={build!r})
print((time.perf_counter() - start) * 1e3); assert module.v() == 7
"""


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.cc"
        source.write_text("#include <sgl_kernel/utils.h>\nnamespace u { inline int v() { return 7; } }\n")
        scripts = {
            "jit_kernel load_jit": OURS.format(source=str(source)),
            "tvm_ffi load_inline": INLINE.format(build=str(Path(folder) / "inline")),
        }
        env = {**os.environ, "JIT_KERNEL_CACHE_DIR": str(Path(folder) / "cache"), "JIT_KERNEL_LOG_LEVEL": "WARNING"}

        def run(script: str) -> float:
            done = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
            return float(done.stdout.split()[-1])

        times: dict[str, list[float]] = {name: [] for name in scripts}
        for script in scripts.values():
            run(script)  # builds once
        for _ in range(rounds):
            for name, script in scripts.items():
                times[name].append(run(script))
        for name, values in times.items():
            print(f"{name:<22} warm {statistics.median(values):6.2f} ms (min {min(values):.2f}, {rounds} processes)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 11)
