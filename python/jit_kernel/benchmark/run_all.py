"""Run every benchmark script on its CI-sized grid, each in its own process with a time bound, and
collect their JSON results in one folder for ``python -m jit_kernel.benchmark.report``::

    python -m jit_kernel.benchmark.run_all --json-dir DIR                 # all, within --budget seconds
    python -m jit_kernel.benchmark.run_all --json-dir DIR --only 'norm|rope'
    python -m jit_kernel.benchmark.run_all --plan                         # the estimates and bounds only

The CI-sized grid (``JIT_KERNEL_BENCH_CI=1``) is the one docs/benchmarks.md shows: per table a
decode size (16 tokens) and a prefill size (4096 tokens). ``--full`` runs the full grids instead,
without a time budget.

Time. Each script's run time is estimated from its grid (:func:`estimate`): a perf_report script
costs a process start, about 0.8 s per measured (config, provider) (a CUDA-graph median measures
for 100 ms, ten replays after a capture), two empty-kernel references per jit measurement and one
torch.compile per config. The other scripts have fixed estimates for the arguments passed here.
Scripts run in order of importance; each gets a bound of twice its estimate while the later
scripts' estimates still fit in the budget, else its estimate, so that a budget that runs short
cuts the last scripts, not every one (:func:`bounds`). At its bound a script gets SIGINT and writes
the rows it measured, marked incomplete; ``DIR/run_all.json`` records each script's status and
time, and the report says which tables are partial.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RUN_SCHEMA = "jit_kernel.benchmark.run/1"
MANIFEST = "run_all.json"
DEFAULT_BUDGET_S = 480
GRACE_S = 20  # after SIGINT: time to write the JSON before the process group is killed

# Cost model of a perf_report script on an H100 host (seconds).
START_S = 15.0  # python, torch, triton, CUDA context, the first torch.compile's set-up
MEASURE_S = 0.8  # one CUDA-graph median: ~0.4 s at decode sizes, ~1.1 s at 4096 tokens
EMPTY_S = 0.35  # one empty-kernel reference (two per jit measurement)
COMPILE_S = 2.5  # one torch.compile of one static shape


@dataclasses.dataclass(frozen=True)
class Script:
    name: str
    args: tuple[str, ...] = ()
    # Estimate in seconds for scripts that are not perf_reports (None: computed from the grid).
    fixed_estimate_s: float | None = None
    module: str = ""  # default: jit_kernel.benchmark.<name>

    @property
    def module_name(self) -> str:
        return self.module or f"jit_kernel.benchmark.{self.name}"


# In order of importance: when the budget runs short, the last ones are cut first.
SCRIPTS: tuple[Script, ...] = (
    # 73 op rows x (op, raw, FlashInfer where it has the op) x 22 x 2000 calls x ~10 us (~90 s), the
    # graph section (2 token counts x 73 ops x 2 captures and 100 replays, ~30 s), start and imports.
    Script("bench_dispatch", ("--repeats", "21"), 140.0),
    Script("bench_norm"),
    Script("bench_activation"),
    Script("bench_kv_store"),
    Script("bench_token_quant"),
    # 13 fresh processes (~2.5 s each: torch import, CUDA context) and 4 nvcc builds (~8 s each).
    Script("bench_first_call", ("--repeats", "2", "--cold-repeats", "1"), 65.0),
    Script("bench_rope"),
    Script("bench_quant"),
    # CI grid: ~35 CUDA-graph or event-timed medians (one layer, quota sweep, alternatives,
    # all-layer, ceilings) and the host-time loops, plus a process start.
    Script("bench_hicache", (), 130.0),
    Script("bench_elementwise"),
    Script("bench_norm_quant"),
    # The grid's own estimate (routing at five sizes: ~130 s) plus room for FlashInfer's DeepSeek
    # routing module, which its JIT builds on first use when the cache carried in lacks it.
    Script("bench_moe", (), 170.0),
    # The CI grid's medians (three tables and the targets' ceilings) and FlashInfer's sampling module.
    Script("bench_sampling"),
    # The CI grid's medians (16 layer shapes x 3 row counts x 2 providers, each over weight copies
    # spanning 256 MB) and the read ceiling's 2 GiB sum.
    Script("bench_decode_linear"),
    # 14 fp8 layer shapes x 3 row counts x 2 providers (CUDA-graph medians over weight copies spanning
    # 256 MB) and the read ceiling's 2 GiB sum.
    Script("bench_decode_linear_fp8", (), 70.0),
    # decode_attention's nine (batch, context) rows and merge_attn_states' two token counts, plus the
    # 1 GiB copy that measures the read ceiling's bandwidth.
    Script("bench_decode_attention"),
    # Four 4-layer models (Llama-3-8B, Qwen3-8B, Qwen3-30B-A3B shapes, Qwen3-8B with fp8 linear
    # layers): eager, CUDA graph and torch.compile (the compiles dominate; the two dense models took
    # 57 s and 35 s on the H100, the fp8 one 30 s).
    Script("bench_model", (), 280.0),
    # Its ranks' start (torch, CUDA, the gloo group, the communicator's IPC set-up) and, per CI-grid
    # size and provider, an eager check, a capture and the replays, each in step with the other
    # ranks; where ranks share the one GPU, only the custom kernels and their unfused forms.
    Script("bench_allreduce", (), 90.0),
)


def grid_counts(reports: Sequence[Any]) -> dict[str, int]:
    """Measurements, jit measurements (each paired with two empty-kernel references) and
    torch.compile configs of a script's perf_reports."""
    counts = {"measurements": 0, "jit": 0, "compiles": 0}
    for report in reports:
        benchmarks = report.benchmarks if isinstance(report.benchmarks, (list, tuple)) else [report.benchmarks]
        for bench in benchmarks:
            points = len(bench.x_vals)
            counts["measurements"] += points * len(bench.line_vals)
            counts["jit"] += points * ("jit" in bench.line_vals)
            counts["compiles"] += points * ("compile" in bench.line_vals)
    return counts


def estimate_from_counts(counts: Mapping[str, int]) -> float:
    return START_S + MEASURE_S * counts["measurements"] + 2 * EMPTY_S * counts["jit"] + COMPILE_S * counts["compiles"]


def estimate(script: Script) -> float:
    """Seconds ``script`` is expected to take on its grid (read from the module as it is imported
    here: set ``JIT_KERNEL_BENCH_CI`` first for the CI-sized grid)."""
    if script.fixed_estimate_s is not None:
        return script.fixed_estimate_s
    import importlib

    module = importlib.import_module(script.module_name)
    return estimate_from_counts(grid_counts(module.REPORTS))


def bounds(estimates: Sequence[float], budget_s: float) -> list[float]:
    """Each script's time bound (:func:`next_bound`) when each takes its estimate. (``main``
    recomputes each bound from the time actually left when the script starts.)"""
    out = []
    left = budget_s
    for i, est in enumerate(estimates):
        bound = next_bound(est, sum(estimates[i + 1 :]), left)
        out.append(bound)
        left -= min(bound, est)
    return out


def next_bound(est: float, rest: float, left: float) -> float:
    """The bound of a script estimated at ``est`` s, with ``rest`` s of estimates after it and
    ``left`` s of budget: up to twice its estimate while the rest still fits, never less than its
    estimate, never more than what is left (0: no time for it)."""
    if left <= 0:
        return 0.0
    return min(left, max(est, min(2 * est, left - rest)))


# ---------------------------------------------------------------------------------------------
# Running


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT (the script writes what it measured), then, after a grace period, SIGKILL to the
    process group the script was started in (its compile workers included)."""
    try:
        process.send_signal(signal.SIGINT)
        process.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        _kill_group(process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_one(
    script: Script, json_dir: Path, bound_s: float | None, env: Mapping[str, str], log_dir: Path | None
) -> tuple[str, float]:
    """Run one script with ``--json-dir`` in its own session, stopped after ``bound_s`` seconds
    (None: no bound); returns ``(status, seconds)``."""
    command = [sys.executable, "-m", script.module_name, "--json-dir", str(json_dir), *script.args]
    log = open(log_dir / f"{script.name}.log", "wb") if log_dir else None  # noqa: SIM115 (closed below)
    start = time.monotonic()
    try:
        output = {"stdout": log, "stderr": subprocess.STDOUT} if log else {}
        # SIGINT back to its default in the child: a parent started in the background (or by a
        # pytest-xdist worker) ignores it, the child would inherit that, and its bound's SIGINT
        # would then never reach the script's handler that writes its partial results.
        process = subprocess.Popen(command, env=dict(env), start_new_session=True, preexec_fn=_default_sigint, **output)
        try:
            returncode = process.wait(bound_s)
            _kill_group(process)  # leftovers of a finished script (compile workers)
            status = "ok" if returncode == 0 else f"failed (exit status {returncode})"
        except subprocess.TimeoutExpired:
            _stop(process)
            status = f"stopped at its bound of {bound_s:.0f} s"
        except KeyboardInterrupt:
            _stop(process)
            raise
    finally:
        if log:
            log.close()
    return status, time.monotonic() - start


def _earlier_entries(path: Path, running: set[str]) -> list[dict[str, Any]]:
    """The entries of an earlier run's manifest in the same folder for scripts not run now (a run
    split by ``--only`` keeps one manifest)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("schema") != RUN_SCHEMA:
        return []
    return [entry for entry in data.get("scripts", []) if entry.get("script") not in running]


def _selected(only: str | None) -> list[Script]:
    return [script for script in SCRIPTS if only is None or re.search(only, script.name)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--json-dir", metavar="DIR", help="where every script writes <script>.json (required to run)")
    parser.add_argument("--only", metavar="REGEX", help="only the scripts whose name matches (re.search)")
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S}); 0: no bound",
    )
    parser.add_argument("--full", action="store_true", help="the full grids (no CI sizes, no time budget)")
    parser.add_argument("--log-dir", metavar="DIR", help="each script's output to DIR/<script>.log (default: stdout)")
    parser.add_argument("--plan", action="store_true", help="print the estimates and bounds, run nothing")
    args = parser.parse_args(argv)
    if not args.plan and not args.json_dir:
        parser.error("--json-dir is required to run the benchmarks")

    env = dict(os.environ)
    env.pop("CI", None)
    if args.full:
        env.pop("JIT_KERNEL_BENCH_CI", None)
        os.environ.pop("JIT_KERNEL_BENCH_CI", None)
    else:
        env["JIT_KERNEL_BENCH_CI"] = os.environ["JIT_KERNEL_BENCH_CI"] = "1"  # read at import by estimate()
    env["PYTHONUNBUFFERED"] = "1"
    budget = math.inf if args.full or args.budget <= 0 else args.budget

    scripts = _selected(args.only)
    try:
        estimates = [estimate(script) for script in scripts]
    except ImportError as error:  # the scripts import triton and pandas at the top
        parser.exit(2, f"run_all: cannot import the benchmarks: {error} (install the 'bench' extra)\n")
    planned = bounds(estimates, budget)
    print(f"{'script':<20} {'estimate s':>10} {'bound s':>8}")
    for script, est, bound in zip(scripts, estimates, planned, strict=True):
        print(f"{script.name:<20} {est:>10.0f} {bound:>8.0f}")
    print(f"{'total':<20} {sum(estimates):>10.0f} {'' if math.isinf(budget) else f'{budget:>8.0f}'}")
    if args.plan:
        return

    json_dir = Path(args.json_dir)
    json_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir:
        log_dir.mkdir(parents=True, exist_ok=True)
    command = " ".join(
        ["python", "-m", "jit_kernel.benchmark.run_all", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]
    )
    manifest = {
        "schema": RUN_SCHEMA,
        "command": command,
        "budget_s": None if math.isinf(budget) else budget,
        "grid": "full" if args.full else "ci",
        "scripts": [],
    }
    earlier = _earlier_entries(json_dir / MANIFEST, {script.name for script in scripts})
    start = time.monotonic()
    for i, (script, est) in enumerate(zip(scripts, estimates, strict=True)):
        left = budget - (time.monotonic() - start)
        bound = next_bound(est, sum(estimates[i + 1 :]), left)
        entry = {"script": script.name, "args": list(script.args), "estimate_s": round(est), "bound_s": None}
        if bound < 5:
            entry.update(status="not run: the budget was spent", seconds=0.0)
        else:
            (json_dir / f"{script.name}.json").unlink(missing_ok=True)  # no stale result survives a failed run
            print(f"\n=== {script.name} (estimate {est:.0f} s, bound {bound:.0f} s)", flush=True)
            status, seconds = run_one(script, json_dir, bound if math.isfinite(bound) else None, env, log_dir)
            entry.update(bound_s=None if math.isinf(bound) else round(bound), status=status, seconds=round(seconds, 1))
            print(f"=== {script.name}: {status} in {seconds:.0f} s", flush=True)
        manifest["scripts"].append(entry)
        manifest["total_s"] = round(time.monotonic() - start, 1)
        written = {**manifest, "scripts": [*earlier, *manifest["scripts"]]}
        (json_dir / MANIFEST).write_text(json.dumps(written, indent=1) + "\n")
    print(f"\nall done in {manifest['total_s']:.0f} s; results in {json_dir}")


if __name__ == "__main__":
    main()
