"""CPU tests of the norm / quant / elementwise benchmark scripts: the derived-column math of their
markdown summaries, the perf_report objects they declare, the save-path plumbing, and a whole
``main()`` run with a fake timer (no GPU: nothing is timed)."""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from jit_helpers import source_pythonpath
from jit_kernel.benchmark import _tables, report, results, run_all
from jit_kernel.benchmark._tables import (
    COMPARISON_HEADER,
    EMPTY_PROVIDER,
    Measurements,
    comparison_cells,
    comparison_row,
    extra_header,
    format_table,
    percent_of_ceiling,
    ratio_cell,
    summary_rows,
)
from jit_kernel.benchmark.results import JSON_DIR_ENV
from jit_kernel.benchmark.utils import (
    L2_FLUSH_BYTES,
    SAVE_PATH_ENV,
    copy_fn,
    gbps,
    get_benchmark_range,
    plot_names,
    resolve_save_path,
    rotated,
    rotation_count,
    run_reports,
)
from jit_kernel.engine.spec import Config, KernelSpec

NAN = float("nan")
FIXTURE = Path(__file__).parent / "fixtures" / "bench_json"
REPO = Path(__file__).resolve().parents[1]
FAKE_ENVIRONMENT = {
    "device": {"name": "Fake GPU", "capability": "9.0", "sms": 132},
    "driver": "000.00",
    "cuda": "13.0",
    "python": "3.12.0",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "tvm_ffi": "0.1.15",
    "jit_kernel": "0.1.0",
    "flashinfer": None,
    "liger_kernel": None,
    "commit": "0000000",
    "grid": "ci",
}
PROVIDERS = ["jit", "eager", "compile", "copy"]
# Each script's providers: the standard four, then its extras.
SCRIPT_PROVIDERS = {
    "bench_norm": [*PROVIDERS, "jit_nopdl", "eager_hf"],
    "bench_quant": [*PROVIDERS, "jit_nopdl"],
    "bench_elementwise": PROVIDERS,
}

# ---------------------------------------------------------------------------------------------
# Derived columns


def test_comparison_cells_known_numbers() -> None:
    # 8 MB in 10 us = 800 GB/s; the copy of the same bytes takes 8 us, so 80% of the ceiling.
    cells = comparison_cells(8_000_000, ours=10.0, eager=25.0, compiled=15.0, copy=8.0, empty=2.0, tiny=True)
    assert cells == ["10.0", "25.0", "15.0", "8.0", "800", "80%", "2.50x", "1.50x", "5.00x"]
    assert len(cells) == len(COMPARISON_HEADER)


def test_comparison_cells_vs_empty_only_for_tiny_inputs() -> None:
    cells = comparison_cells(8_000_000, ours=10.0, eager=25.0, compiled=15.0, copy=8.0, empty=2.0, tiny=False)
    assert cells[COMPARISON_HEADER.index("vs empty")] == ""
    assert cells[COMPARISON_HEADER.index("% ceiling")] == "80%"


def test_comparison_cells_faster_than_copy_reads_above_100_percent() -> None:
    cells = comparison_cells(1000, ours=4.0, eager=4.0, compiled=2.0, copy=5.0, empty=1.0, tiny=False)
    assert cells[COMPARISON_HEADER.index("% ceiling")] == "125%"
    assert cells[COMPARISON_HEADER.index("vs eager")] == "1.00x"
    assert cells[COMPARISON_HEADER.index("vs compile")] == "0.50x"


def test_comparison_cells_missing_times_read_na() -> None:
    cells = comparison_cells(1000, ours=10.0, eager=NAN, compiled=NAN, copy=NAN, empty=NAN, tiny=True)
    assert cells == ["10.0", "n/a", "n/a", "n/a", "0", "n/a", "n/a", "n/a", "n/a"]
    ours_failed = comparison_cells(1000, ours=NAN, eager=5.0, compiled=5.0, copy=5.0, empty=1.0, tiny=True)
    assert ours_failed == ["n/a", "5.0", "5.0", "5.0", "n/a", "n/a", "n/a", "n/a", "n/a"]


def test_percent_of_ceiling_is_the_bandwidth_ratio() -> None:
    assert percent_of_ceiling(10.0, 8.0) == pytest.approx(0.8)
    nbytes = 123_456_789
    assert percent_of_ceiling(7.0, 3.5) == pytest.approx(gbps(nbytes, 7.0) / gbps(nbytes, 3.5))


def test_ratio_cell() -> None:
    assert ratio_cell(3.0, 2.0) == "1.50x"
    assert ratio_cell(NAN, 2.0) == "n/a"
    assert ratio_cell(3.0, 0.0) == "n/a"


def test_comparison_row_reads_providers_by_name() -> None:
    times = {"copy": 8.0, "compile": 15.0, "jit": 10.0, "eager": 25.0, "jit_pdl": 1.0}
    assert comparison_row(times, 8_000_000, 2.0, tiny=False) == comparison_cells(
        8_000_000, 10.0, 25.0, 15.0, 8.0, 2.0, tiny=False
    )
    assert comparison_row({"jit": 10.0}, 8_000_000, 2.0, tiny=False)[1:4] == ["n/a", "n/a", "n/a"]


def test_comparison_row_appends_extra_providers() -> None:
    times = {"copy": 8.0, "compile": 15.0, "jit": 10.0, "eager": 25.0, "jit_nopdl": 12.0}
    extras = {"jit_nopdl": "no-PDL", "eager_hf": "HF eager"}
    row = comparison_row(times, 8_000_000, 2.0, tiny=False, extras=extras)
    assert row[: len(COMPARISON_HEADER)] == comparison_row(times, 8_000_000, 2.0, tiny=False)
    assert row[len(COMPARISON_HEADER) :] == ["12.0", "1.20x", "n/a", "n/a"]
    assert extra_header(extras) == ["no-PDL us", "vs no-PDL", "HF eager us", "vs HF eager"]


def test_format_table() -> None:
    text = format_table("t", ["a", "b"], [[1, 2.25], ["x", "y"]])
    assert text == "### t\n\n| a | b |\n|---:|---:|\n| 1 | 2.2 |\n| x | y |\n"


def test_measurements_memoize_per_config_and_provider() -> None:
    calls: list[tuple[Hashable, str]] = []

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        return float(len(calls))

    def make() -> Callable[[], object]:
        raise AssertionError("the fake timer must not build inputs")

    results = Measurements(timer)
    assert results.time(("op", 1), "jit", make) == 1.0
    assert results.time(("op", 1), "eager", make) == 2.0
    assert results.time(("op", 1), "jit", make) == 1.0  # memoized, not re-measured
    assert results.time(("op", 2), "jit", make) == 3.0
    assert calls == [(("op", 1), "jit"), (("op", 1), "eager"), (("op", 2), "jit")]
    assert results.for_config(("op", 1)) == {"jit": 1.0, "eager": 2.0}
    assert results.for_config(("op", 3)) == {}


def test_measurements_keep_the_time_per_call() -> None:
    results = Measurements(lambda key, provider, make: 40.0)
    assert results.time(("op", 1), "jit", lambda: lambda: None, calls=4) == 10.0
    assert results.for_config(("op", 1)) == {"jit": 10.0}


def test_rotated_calls_each_copy_in_turn() -> None:
    assert rotation_count(L2_FLUSH_BYTES) == 1
    assert rotation_count(L2_FLUSH_BYTES // 4) == 4
    assert rotation_count(L2_FLUSH_BYTES // 4 - 1) == 5  # the copies span at least L2_FLUSH_BYTES
    assert rotation_count(0) == L2_FLUSH_BYTES
    made: list[int] = []
    ran: list[int] = []

    def make() -> Callable[[], object]:
        index = len(made)
        made.append(index)
        return lambda: ran.append(index)

    run = rotated(make, 3)
    assert made == [0, 1, 2] and ran == []  # inputs made once, up front
    run()
    run()
    assert ran == [0, 1, 2, 0, 1, 2]


def test_paired_measurements_bracket_each_jit_time_with_the_reference() -> None:
    order: list[str] = []
    references = iter([1.0, 3.0, 5.0, 9.0])

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        order.append(provider)
        return {"jit": 10.0, "copy": 8.0}[provider]

    def reference() -> float:
        order.append("empty")
        return next(references)

    results = Measurements(timer, reference)
    results.time(("op", 1), "jit", lambda: lambda: None)
    results.time(("op", 1), "copy", lambda: lambda: None)  # not paired
    results.time(("op", 1), "jit", lambda: lambda: None)  # memoized: no new reference either
    results.time(("op", 2), "jit", lambda: lambda: None)
    assert order == ["empty", "jit", "empty", "copy", "empty", "jit", "empty"]
    assert results.for_config(("op", 1)) == {"jit": 10.0, EMPTY_PROVIDER: 2.0, "copy": 8.0}
    assert results.for_config(("op", 2))[EMPTY_PROVIDER] == 7.0
    # "vs empty" reads the paired reference, not the run-level one passed in
    row = summary_rows(results, [(("op", 1), [1], 8_000_000, True)], empty=100.0)[0]
    assert row[-1] == "5.00x"


def test_summary_rows_use_the_memoized_times_and_skip_unmeasured_configs() -> None:
    results = Measurements(
        lambda key, provider, make: {"jit": 10.0, "eager": 20.0, "compile": 5.0, "copy": 8.0}[provider]
    )
    for provider in PROVIDERS:
        results.time(("op", 16), provider, lambda: lambda: None)
    rows = summary_rows(
        results, [(("op", 16), [16, "x"], 8_000_000, True), (("op", 32), [32, "x"], 1, False)], empty=2.0
    )
    assert rows == [[16, "x", "10.0", "20.0", "5.0", "8.0", "800", "80%", "2.00x", "0.50x", "5.00x"]]


# ---------------------------------------------------------------------------------------------
# CI ranges and the save path


def test_get_benchmark_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("JIT_KERNEL_BENCH_CI", raising=False)
    assert get_benchmark_range([1, 2, 3], [1]) == [1, 2, 3]
    monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
    assert get_benchmark_range([1, 2, 3], [1]) == [1]


def test_resolve_save_path() -> None:
    assert resolve_save_path([], {}) is None
    assert resolve_save_path([], {SAVE_PATH_ENV: ""}) is None
    assert resolve_save_path([], {SAVE_PATH_ENV: "/from/env"}) == "/from/env"
    assert resolve_save_path(["--save-path", "/from/cli"], {}) == "/from/cli"
    assert resolve_save_path(["--save-path=/from/cli"], {SAVE_PATH_ENV: "/from/env"}) == "/from/cli"
    with pytest.raises(SystemExit):
        resolve_save_path(["--bogus"], {})


def test_resolve_save_path_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SAVE_PATH_ENV, "/from/process/env")
    assert resolve_save_path([]) == "/from/process/env"
    monkeypatch.delenv(SAVE_PATH_ENV)
    assert resolve_save_path([]) is None


def test_copy_fn_moves_half_the_bytes_each_way() -> None:
    assert copy_fn(1000, device="cpu")().numel() == 500
    assert copy_fn(3, device="cpu")().numel() == 16  # never an empty copy


def test_run_reports_writes_plots_and_csvs(tmp_path: Path) -> None:
    triton_testing = pytest.importorskip("triton.testing")
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")

    def bench(plot_name: str) -> triton_testing.Benchmark:
        return triton_testing.Benchmark(
            x_names=["n"],
            x_vals=[1, 2],
            line_arg="provider",
            line_vals=["a", "b"],
            line_names=["A", "B"],
            ylabel="us",
            plot_name=plot_name,
            args={},
        )

    first = triton_testing.perf_report([bench("first-1"), bench("first-2")])(lambda n, provider: float(n))
    second = triton_testing.perf_report(bench("second"))(lambda n, provider: 2.0 * n)
    out = tmp_path / "not" / "yet"
    run_reports([first, second], str(out))
    assert plot_names([first, second]) == ["first-1", "first-2", "second"]
    for name in ("first-1", "first-2", "second"):
        assert (out / f"{name}.png").stat().st_size > 0
        assert (out / f"{name}.csv").exists()
    with open(out / "second.csv") as f:
        assert [row["B (us)"] for row in csv.DictReader(f)] == ["2.000000", "4.000000"]
    html = (out / "results.html").read_text()
    assert all(f'"{name}.png"' in html for name in ("first-1", "first-2", "second"))


# ---------------------------------------------------------------------------------------------
# The bench modules


@pytest.fixture
def load_bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, bool], ModuleType]]:
    """(Re)import a bench module with full or CI-sized ranges; the ranges are read at import."""
    pytest.importorskip("triton")
    loaded: list[ModuleType] = []

    def load(name: str, ci: bool) -> ModuleType:
        monkeypatch.delenv("CI", raising=False)
        if ci:
            monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
        else:
            monkeypatch.delenv("JIT_KERNEL_BENCH_CI", raising=False)
        module = importlib.reload(importlib.import_module(f"jit_kernel.benchmark.{name}"))
        loaded.append(module)
        return module

    yield load
    monkeypatch.undo()
    for module in loaded:
        importlib.reload(module)


def _describe(report: object, providers: list[str] = PROVIDERS) -> list[tuple[str, list[object], dict[str, object]]]:
    benchmarks = report.benchmarks if isinstance(report.benchmarks, list) else [report.benchmarks]
    for bench in benchmarks:
        assert bench.line_arg == "provider"
        assert bench.line_vals == providers
        assert len(bench.line_names) == len(bench.styles) == len(providers)
        assert bench.ylabel == "us"
    return [(bench.plot_name, bench.x_vals, bench.args) for bench in benchmarks]


FULL_TOKENS = [1, 16, 1024, 4096, 16384]
FULL_HIDDEN = [1024, 2048, 4096, 5120, 7168, 8192]
QK = {"hq": 32, "hk": 8, "head_dim": 128}


@pytest.mark.parametrize("ci", [False, True])
def test_bench_norm_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_norm", ci)
    tokens = [16, 4096] if ci else FULL_TOKENS
    hidden = [4096] if ci else FULL_HIDDEN
    providers = SCRIPT_PROVIDERS["bench_norm"]
    assert list(module.PROVIDERS) == providers
    assert _describe(module.bench_rmsnorm, providers) == [(f"rmsnorm-bf16-D{d}", tokens, {"hidden": d}) for d in hidden]
    assert _describe(module.bench_fused_add_rmsnorm, providers) == [
        (f"fused_add_rmsnorm-bf16-D{d}", tokens, {"hidden": d}) for d in hidden
    ]
    assert _describe(module.bench_fused_inplace_qknorm, providers) == [
        ("fused_inplace_qknorm-bf16-hq32-hk8-d128", tokens, QK)
    ]
    assert _describe(module.bench_qknorm_across_heads, providers) == [
        ("qknorm_across_heads-bf16-hq32-hk8-d128", tokens, QK)
    ]
    assert [report.fn.__name__ for report in module.REPORTS] == [
        "bench_rmsnorm",
        "bench_fused_add_rmsnorm",
        "bench_fused_inplace_qknorm",
        "bench_qknorm_across_heads",
    ]


@pytest.mark.parametrize("ci", [False, True])
def test_bench_quant_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_quant", ci)
    tokens = [16, 4096] if ci else [1, 16, 128, 1024, 4096, 16384]
    dtypes = ["bfloat16"] if ci else ["bfloat16", "float16", "float32"]
    assert _describe(module.bench_quant, SCRIPT_PROVIDERS["bench_quant"]) == [
        (f"per_tensor_quant_fp8-{dtype}-D4096", tokens, {"hidden": 4096, "dtype": dtype}) for dtype in dtypes
    ]
    assert [report.fn.__name__ for report in module.REPORTS] == ["bench_quant"]


@pytest.mark.parametrize("ci", [False, True])
def test_bench_elementwise_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_elementwise", ci)
    sizes = [1 << 10, 1 << 24] if ci else [1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 26]
    dtypes = ["bfloat16"] if ci else ["bfloat16", "float16", "float32"]
    assert _describe(module.bench_scale) == [(f"scale-{dtype}", sizes, {"dtype": dtype}) for dtype in dtypes]
    assert _describe(module.bench_add_constant) == [("add_constant-int32", sizes, {"dtype": "int32"})]
    assert [report.fn.__name__ for report in module.REPORTS] == ["bench_scale", "bench_add_constant"]


@pytest.mark.parametrize(
    "name", ["bench_norm", "bench_quant", "bench_elementwise", "bench_sampling", "bench_decode_linear"]
)
def test_bench_import_does_not_touch_cuda(load_bench: Callable[[str, bool], ModuleType], name: str) -> None:
    load_bench(name, False)
    assert not torch.cuda.is_initialized()


def test_minimal_bytes(load_bench: Callable[[str, bool], ModuleType]) -> None:
    norm = load_bench("bench_norm", False)
    assert norm.rmsnorm_bytes(4, 1024) == 2 * 4 * 1024 * 2 + 1024 * 2
    assert norm.fused_add_rmsnorm_bytes(4, 1024) == 4 * 4 * 1024 * 2 + 1024 * 2
    assert norm.qknorm_bytes(10) == 2 * 10 * (32 + 8) * 128 * 2
    quant = load_bench("bench_quant", False)
    assert quant.quant_bytes(2, 4096, "float32") == 2 * 4096 * 5
    assert quant.quant_bytes(2, 4096, "float16") == 2 * 4096 * 3
    elementwise = load_bench("bench_elementwise", False)
    assert elementwise.elementwise_bytes(1024, "bfloat16") == 4096
    assert elementwise.elementwise_bytes(1024, "int32") == 8192


def test_norm_cases_on_cpu(load_bench: Callable[[str, bool], ModuleType]) -> None:
    """The torch baselines run (on CPU) on the inputs the GPU benchmark builds, and compute the norms."""
    norm = load_bench("bench_norm", False)
    q, k = norm.qkv_slices(3, 4, 2, 8, device="cpu")
    assert q.shape == (3, 32) and k.shape == (3, 16)
    assert q.stride() == (64, 1) and k.stride() == (64, 1)  # slices of one [3, (4 + 2 * 2) * 8] tensor
    assert k.data_ptr() == q.data_ptr() + 32 * q.element_size()

    # across heads: eager normalises whole rows, and the compiled (in-place) version does the same
    ones_q, ones_k = torch.ones(32, dtype=norm.DT), torch.ones(16, dtype=norm.DT)
    eager_q, eager_k = norm._torch_qk(q, k, ones_q, ones_k)
    for row in (eager_q, eager_k):
        assert torch.allclose(row.float().pow(2).mean(-1), torch.ones(3), atol=0.05)
    norm._torch_qk_inplace(q, k, ones_q, ones_k)
    assert torch.equal(q, eager_q) and torch.equal(k, eager_k)

    # per head: each [D] head of q and k has unit mean square
    q_heads, k_heads = norm._torch_qk(q.view(3, 4, 8), k.view(3, 2, 8), torch.ones(8, dtype=norm.DT), ones_q[:8])
    assert torch.allclose(q_heads.float().pow(2).mean(-1), torch.ones(3, 4), atol=0.05)
    assert torch.allclose(k_heads.float().pow(2).mean(-1), torch.ones(3, 2), atol=0.05)

    out = norm.qknorm_across_heads_case("eager", 2, 4, 2, 8, device="cpu")()
    assert [t.shape for t in out] == [(2, 32), (2, 16)]
    assert norm.rmsnorm_case("eager", 2, 64, device="cpu")().shape == (2, 64)
    assert norm.rmsnorm_case("copy", 2, 64, device="cpu")().numel() == norm.rmsnorm_bytes(2, 64) // 2
    with pytest.raises(ValueError, match="unknown provider"):
        norm.fused_add_rmsnorm_case("bogus", 2, 64, device="cpu")


def test_quant_and_elementwise_cases_on_cpu(load_bench: Callable[[str, bool], ModuleType]) -> None:
    quant = load_bench("bench_quant", False)
    q, s = quant.quant_case("eager", 2, 64, "float16", device="cpu")()
    assert q.dtype == torch.float8_e4m3fn and q.shape == (2, 64) and s.numel() == 1
    with pytest.raises(ValueError, match="unknown provider"):
        quant.quant_case("bogus", 2, 64, "float32", device="cpu")
    elementwise = load_bench("bench_elementwise", False)
    assert elementwise.scale_case("eager", 8, "float32", device="cpu")().dtype == torch.float32
    assert elementwise.add_constant_case("copy", 8, "int32", device="cpu")().numel() == 2 * 8 * 4 // 2
    with pytest.raises(ValueError, match="unknown provider"):
        elementwise.add_constant_case("bogus", 8, "int32", device="cpu")


FAKE_US = {"jit": 10.0, "eager": 25.0, "compile": 15.0, "copy": 8.0, "jit_nopdl": 12.0, "eager_hf": 40.0}


def _fake_measurements(calls: list[tuple[Hashable, str]]) -> Measurements:
    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        return FAKE_US[provider]

    return Measurements(timer)


@pytest.mark.parametrize(
    ("name", "configs", "csv_name", "x_name", "x_vals"),
    [
        ("bench_norm", 2 * 4, "qknorm_across_heads-bf16-hq32-hk8-d128.csv", "tokens", [16, 4096]),
        ("bench_quant", 2 * 1, "per_tensor_quant_fp8-bfloat16-D4096.csv", "tokens", [16, 4096]),
        ("bench_elementwise", 2 * 2, "add_constant-int32.csv", "elements", [1 << 10, 1 << 24]),
    ],
)
def test_main_plots_and_summarises_each_measurement_once(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    configs: int,
    csv_name: str,
    x_name: str,
    x_vals: list[int],
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench(name, True)
    calls: list[tuple[Hashable, str]] = []
    monkeypatch.setattr(module, "RESULTS", _fake_measurements(calls))
    monkeypatch.setattr(_tables, "empty_kernel_us", lambda: 2.5)
    monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    out = tmp_path / "plots"
    module.main(["--save-path", str(out), "--json-dir", str(tmp_path / "json")])

    # every (config, provider) timed exactly once, the summary reusing those numbers
    assert len(calls) == len(set(calls)) == configs * len(SCRIPT_PROVIDERS[name])
    printed = capsys.readouterr().out
    summary = printed[printed.index("device: Fake GPU") : printed.index("results: ")]
    data_rows = [line for line in summary.splitlines() if line.startswith("| ") and "jit us" not in line]
    assert len(data_rows) == configs
    for row in data_rows:
        assert "| 10.0 | 25.0 | 15.0 | 8.0 |" in row and "| 80% | 2.50x | 1.50x |" in row
    assert "empty-kernel CUDA-graph replay at the end of the run: 2.50 us" in summary
    assert (out / f"{name}.md").read_text().strip() == summary.strip()

    # the JSON holds the same measurements, the command line and the environment
    doc = json.loads((tmp_path / "json" / f"{name}.json").read_text())
    assert doc["schema"] == results.SCHEMA and doc["script"] == name and doc["complete"] is True
    assert doc["command"].startswith(f"JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.{name} --save-path ")
    assert doc["environment"] == FAKE_ENVIRONMENT and doc["empty_kernel_us"] == 2.5
    assert doc["summary"] == results.first_paragraph(module.__doc__)
    rows = [row for table in doc["tables"] for row in table["rows"]]
    assert len(rows) == configs
    for row in rows:
        assert row["us"] == {provider: FAKE_US[provider] for provider in SCRIPT_PROVIDERS[name]}
        assert row["of_copy_ceiling"]["jit"] == 0.8 and row["of_copy_ceiling"]["eager"] == pytest.approx(0.32)
        assert "copy" not in row["of_copy_ceiling"]
        assert ("vs_empty" in row) == row["tiny"]

    # triton wrote a plot and a CSV per benchmark, with the measured times
    names = plot_names(module.REPORTS)
    for plot in names:
        assert (out / f"{plot}.png").exists() and (out / f"{plot}.csv").exists()
    with open(out / csv_name) as f:
        rows = list(csv.DictReader(f))
    labels = [label for label, _ in module.PROVIDERS.values()]
    assert [float(row[x_name]) for row in rows] == [float(x) for x in x_vals]
    assert {float(row[f"{label} (us)"]) for row in rows for label in labels} == {
        FAKE_US[provider] for provider in SCRIPT_PROVIDERS[name]
    }


def test_main_without_save_path_writes_nothing(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_quant", True)
    monkeypatch.delenv(SAVE_PATH_ENV, raising=False)
    monkeypatch.delenv(JSON_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    calls: list[tuple[Hashable, str]] = []
    monkeypatch.setattr(module, "RESULTS", _fake_measurements(calls))
    monkeypatch.setattr(_tables, "empty_kernel_us", lambda: NAN)
    monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
    module.main([])
    assert list(tmp_path.iterdir()) == []
    printed = capsys.readouterr().out
    assert "per_tensor_quant_fp8-bfloat16-D4096:" in printed  # triton's print_data table
    assert "empty-kernel CUDA-graph replay at the end of the run: n/a us" in printed
    assert len(calls) == 2 * 1 * len(SCRIPT_PROVIDERS["bench_quant"])


# ---------------------------------------------------------------------------------------------
# bench_sampling: its grid, the torch baselines on the CPU, and a whole main() with a fake timer
# (the read ceilings and the targets computed from the same measurements)

SAMPLE_LINES = ["jit", "flashinfer", "vllm_torch", "torch_topk", "compile", "read", "copy"]
FILTER_LINES = ["jit", "flashinfer", "vllm_torch", "copy"]
COMPAT_LINES = ["jit", "flashinfer", "copy"]
COMPAT_OPS = [
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "top_k_mask_logits",
    "top_k_top_p_sampling_from_logits",
]


@pytest.mark.parametrize("ci", [False, True])
def test_bench_sampling_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_sampling", ci)
    batches = [1, 32, 256] if ci else [1, 8, 32, 256, 1024]
    side = [128256] if ci else [128256, 151936]
    assert _describe(module.bench_sample, SAMPLE_LINES) == [
        ("sample-float32-V128256", batches, {"dtype": "float32", "vocab": 128256}),
        ("sample-float32-V151936", batches, {"dtype": "float32", "vocab": 151936}),
        ("sample-float32-V262144", [1, 32], {"dtype": "float32", "vocab": 262144}),
        *((f"sample-bfloat16-V{v}", batches, {"dtype": "bfloat16", "vocab": v}) for v in side),
    ]
    assert _describe(module.bench_filter, FILTER_LINES) == [
        (f"{name}-float32-V{v}", batches, {"name": name, "vocab": v})
        for name in ("top_k", "top_p", "min_p")
        for v in side
    ]
    assert _describe(module.bench_compat, COMPAT_LINES) == [
        (f"{op}-float32-V{v}", batches, {"op": op, "vocab": v}) for op in COMPAT_OPS for v in side
    ]
    assert [report.fn.__name__ for report in module.REPORTS] == ["bench_sample", "bench_filter", "bench_compat"]
    # every config of the summary tables is one the reports measure, and the other way round
    reports = ((module.bench_sample, "sample", "dtype"), (module.bench_filter, "filter", "name"))
    measured = {
        (kind, bench.args[arg], b, bench.args["vocab"])
        for report, kind, arg in (*reports, (module.bench_compat, "compat", "op"))
        for bench in report.benchmarks
        for b in bench.x_vals
    }
    assert {key for table in module.summary_tables() for key, *_ in table.configs} == measured


def test_bench_sampling_ci_grid_counts(load_bench: Callable[[str, bool], ModuleType]) -> None:
    module = load_bench("bench_sampling", True)
    # sample: 11 configs x 7 providers; filters: 3 x 3 x 4; compat: 7 x 3 x 3
    assert run_all.grid_counts(module.REPORTS) == {"measurements": 77 + 36 + 63, "jit": 11 + 9 + 21, "compiles": 11}


def test_sampling_bytes(load_bench: Callable[[str, bool], ModuleType]) -> None:
    module = load_bench("bench_sampling", False)
    assert module.logits_bytes(2, 1000, "bfloat16") == 4000
    assert module.sample_bytes(2, 1000) == 2 * 1000 * 4 + 2 * module.REQUEST_BYTES
    assert module.sample_bytes(2, 1000, "bfloat16") == 2 * 1000 * 2 + 2 * module.REQUEST_BYTES
    assert module.compat_bytes("top_k_renorm_probs", 2, 1000) == 2 * 2 * 1000 * 4 + 2 * 4
    assert module.compat_bytes("top_k_mask_logits", 2, 1000) == module.compat_bytes("top_p_renorm_probs", 2, 1000)
    assert module.compat_bytes("top_p_sampling_from_probs", 2, 1000) == module.sample_bytes(2, 1000)


def _allowed(logits: torch.Tensor, top_k: torch.Tensor, top_p: float | None, min_p: float | None) -> list[set[int]]:
    """Per row, the tokens top-k (then top-p over the renormalised top-k set) or min-p keep, in float64."""
    out = []
    for row, k in zip(logits.double(), top_k.tolist(), strict=True):
        probs = row.softmax(-1)
        if min_p is not None:
            out.append(set(torch.nonzero(probs >= min_p * probs.max()).flatten().tolist()))
            continue
        order = probs.argsort(descending=True)[:k]
        kept = probs[order] / probs[order].sum()
        above = kept.cumsum(-1) - kept
        keep = above < top_p if top_p is not None else torch.ones_like(kept, dtype=torch.bool)
        out.append(set(order[keep].tolist()))
    return out


def test_sampling_torch_baselines_on_cpu(load_bench: Callable[[str, bool], ModuleType]) -> None:
    """torch.topk + multinomial and vLLM's torch sampler draw only tokens that top-k then top-p (or
    min-p) keep, with each request's own k."""
    module = load_bench("bench_sampling", False)
    torch.manual_seed(0)
    logits = module.make_logits(3, 400, device="cpu")
    r = module.make_requests(3, device="cpu")
    assert logits.dtype == torch.float32 and logits.std() > 2.5  # randn * LOGITS_STD
    assert r.top_k.dtype == torch.int32 and r.seed.dtype == r.offset.dtype == torch.int64
    top_k = r.top_k.clone()
    top_k[1] = 3
    both = _allowed(logits, top_k, module.TOP_P, None)
    assert len(both[1]) <= 3 and all(1 <= len(s) <= module.TOP_K for s in both)
    k_only = _allowed(logits, top_k, None, None)
    min_p = _allowed(logits, top_k, None, module.MIN_P)
    for _ in range(20):
        drawn = module.torch_topk_sample(logits, r.temperature, top_k, r.top_p)
        vllm = module.vllm_torch_sample(logits.clone(), r.temperature, top_k, r.top_p)
        vllm_k = module.vllm_torch_sample(logits.clone(), r.temperature, top_k=top_k)
        vllm_min_p = module.vllm_torch_sample(logits.clone(), r.temperature, min_p=r.min_p)
        for row in range(3):
            assert int(drawn[row]) in both[row] and int(vllm[row]) in both[row]
            assert int(vllm_k[row]) in k_only[row] and int(vllm_min_p[row]) in min_p[row]
    # vLLM's sampler works in place on float32 logits, as vLLM does; bf16 logits are converted first
    bf16 = logits.bfloat16()
    module.vllm_torch_sample(bf16, r.temperature, top_k, r.top_p)
    assert torch.equal(bf16, logits.bfloat16())
    # the cases build the same calls
    assert module.sample_case("torch_topk", "bfloat16", 2, 300, device="cpu")().shape == (2,)
    assert module.sample_case("read", "float32", 2, 300, device="cpu")().shape == (2,)
    assert module.filter_case("vllm_torch", "top_p", 2, 300, device="cpu")().shape == (2,)
    assert module.sample_case("copy", "float32", 2, 300, device="cpu")().numel() == module.sample_bytes(2, 300) // 2
    assert module.compat_case("copy", "top_k_mask_logits", 2, 300, device="cpu")().numel() == 2 * 300 * 4 + 4
    with pytest.raises(ValueError, match="unknown provider"):
        module.compat_case("vllm_torch", "top_k_renorm_probs", 2, 300, device="cpu")
    with pytest.raises(ValueError, match="unknown op"):
        module.compat_case("jit", "top_k_sampling", 2, 300, device="cpu")
    with pytest.raises(ValueError, match="unknown filter"):
        module.filter_case("jit", "typical_p", 2, 300, device="cpu")


def test_bench_sampling_calls_bind_to_the_jit_kernel_ops(
    load_bench: Callable[[str, bool], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each jit case calls the public op with arguments its signature takes (on the CPU, the ops
    replaced by recorders)."""
    import inspect

    import jit_kernel

    module = load_bench("bench_sampling", False)
    calls: list[str] = []

    def recorder(name: str) -> Callable[..., None]:
        signature = inspect.signature(getattr(jit_kernel, name))

        def record(*args: object, **kwargs: object) -> None:
            signature.bind(*args, **kwargs)
            calls.append(name)

        return record

    for name in ("sample", *module.COMPAT_OPS):
        monkeypatch.setattr(jit_kernel, name, recorder(name))
    module.sample_case("jit", "bfloat16", 2, 64, device="cpu")()
    for name in module.FILTERS:
        module.filter_case("jit", name, 2, 64, device="cpu")()
    for op in module.COMPAT_OPS:
        module.compat_case("jit", op, 2, 64, device="cpu")()
    assert calls == ["sample"] * 4 + list(module.COMPAT_OPS)


SAMPLING_FAKE_US = {
    "jit": 10.0,
    "flashinfer": 40.0,
    "vllm_torch": 200.0,
    "torch_topk": 300.0,
    "compile": 250.0,
    "read": 5.0,
    "copy": 8.0,
}


def _main_with_fake_timer(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, measurements: Measurements, name: str
) -> dict[str, object]:
    """``module.main`` timed by ``measurements`` on a fake device (the empty kernel at 2.5 us); its
    JSON results."""
    monkeypatch.setattr(module, "RESULTS", measurements)
    monkeypatch.setattr(_tables, "empty_kernel_us", lambda: 2.5)
    monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    monkeypatch.delenv(SAVE_PATH_ENV, raising=False)
    module.main(["--json-dir", str(tmp_path)])
    return json.loads((tmp_path / f"{name}.json").read_text())


def _run_bench_sampling(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[tuple[Hashable, str]]
) -> dict[str, object]:
    """bench_sampling.main with a fake timer: the bandwidth copy at 2,000 GB/s, the paired empty
    kernel at 2.0 us, FlashInfer missing at batch 256 of the compatible ops."""

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        if key == module.BANDWIDTH_KEY:
            return module.BANDWIDTH_BYTES / 2e6  # us for 2,000 GB/s
        if provider == "flashinfer" and key[0] == "compat" and key[2] == 256:  # type: ignore[index]
            return NAN
        return SAMPLING_FAKE_US[provider]

    return _main_with_fake_timer(module, monkeypatch, tmp_path, Measurements(timer, lambda: 2.0), "bench_sampling")


def test_bench_sampling_main_checks_the_targets_on_the_same_measurements(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_sampling", True)
    calls: list[tuple[Hashable, str]] = []
    doc = _run_bench_sampling(module, monkeypatch, tmp_path, calls)
    printed = capsys.readouterr().out

    # every (config, provider) measured once, plus the bandwidth copy
    assert len(calls) == len(set(calls)) == 1 + run_all.grid_counts(module.REPORTS)["measurements"]
    assert calls[0] == (module.BANDWIDTH_KEY, "copy")
    assert doc["command"] == "JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_sampling --json-dir " + str(
        tmp_path
    )
    assert doc["complete"] is True and doc["empty_kernel_us"] == 2.5
    assert doc["notes"] == [module.bandwidth_note(2000.0)] and "at 2000 GB/s" in doc["notes"][0]
    names = [table["name"] for table in doc["tables"]]
    assert names == ["sample_float32", "sample_bfloat16", "filters", "compat", "targets"]
    tables = {table["name"]: table for table in doc["tables"]}

    # the read ceiling: the logits' bytes at 2,000 GB/s plus the empty kernel paired with the row's jit
    sample = tables["sample_float32"]
    assert list(sample["providers"]) == [*SAMPLE_LINES[:-1], "ceiling", "copy"]
    assert [row["key"] for row in sample["rows"]] == [
        [1, 128256], [32, 128256], [256, 128256], [1, 151936], [32, 151936], [256, 151936], [1, 262144], [32, 262144]
    ]  # fmt: skip
    row = sample["rows"][2]
    assert row["us"]["ceiling"] == pytest.approx(256 * 128256 * 4 / 2e3 / 1e3 + 2.0, abs=1e-3)
    assert row["us"]["jit"] == 10.0 and row["us"]["flashinfer"] == 40.0 and not row["tiny"]
    bf16 = tables["sample_bfloat16"]["rows"][0]
    assert bf16["us"]["ceiling"] == pytest.approx(128256 * 2 / 2e6 + 2.0, abs=1e-4) and bf16["vs_empty"] == 5.0
    assert "ceiling" in tables["filters"]["providers"] and "ceiling" not in tables["compat"]["providers"]
    assert tables["compat"]["rows"][2]["us"]["flashinfer"] is None  # batch 256 failed: n/a

    # the targets, from the same numbers: FlashInfer 4x, vLLM 20x, 10 us at batch 1 (missed), the
    # ceiling rows at batch >= 32, each compatible op 4x where FlashInfer was measured
    targets = tables["targets"]
    assert targets["header"] == ["target", "rows", "met", "worst row", "worst"]
    by_text = {row[0]: row[1:] for row in targets["rows"]}
    fi, vllm, ceiling, batch1, compat = (by_text[target.text] for target in module.TARGETS)
    assert fi == ["11", "11 of 11", fi[2], "4.00x"] and vllm[1:2] == ["11 of 11"] and vllm[3] == "20.00x"
    assert batch1[:2] == ["4", "0 of 4"] and batch1[3] == "10.00 us" and "batch 1" in batch1[2]
    worst_ceiling = 10.0 / (32 * 128256 * 2 / 2e6 + 2.0)  # the fewest bytes: bf16 at batch 32
    assert ceiling[:2] == ["7", "7 of 7"] and ceiling[3] == f"{worst_ceiling:.2f}x"
    assert ceiling[2] == "bfloat16, batch 32, vocab 128256"
    assert compat == ["21", "14 of 14", compat[2], "4.00x"]

    # the printed summary shows the same tables and targets
    summary = printed[printed.index("device: Fake GPU") : printed.index("results: ")]
    assert "read ceiling: the logits' bytes at 2000 GB/s" in summary
    assert "### targets, checked on this run" in summary
    assert "| sample (top-k + top-p), batch 1: <= 5 us | 4 | 0 of 4 |" in summary
    assert "| 256 | 128256 | 10.00 | 40.00 (4.00x) | 200.00 (20.00x) |" in summary


def test_report_renders_the_sampling_section(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """The section: its command, the device, where the read ceiling comes from, the providers
    tables (peers first, then the read and the ceiling) and the targets."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_sampling", True)
    doc = _run_bench_sampling(module, monkeypatch, tmp_path, [])
    text = report.render([*_fixture_docs(), doc], None)
    lines = text.splitlines()
    sections = [line for line in lines if line.startswith("## ")]
    assert sections.index("## Sampling: top-k, top-p and min-p") == sections.index("## Gated activations") + 1
    section = text[text.index("## Sampling: top-k, top-p and min-p") :]
    section = section[: section.index("\n## ")]
    assert "`JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_sampling --json-dir DIR`" in section
    assert "Device: Fake GPU (compute capability 9.0, 132 SMs)." in section
    assert f"- {module.bandwidth_note(2000.0)}" in section
    assert (
        "| batch | vocab | jit_kernel us | % of copy | vs empty | torch.compile us | FlashInfer us | vLLM torch us "
        "| torch.topk + multinomial us | torch amax (read) us | read ceiling us | copy us |" in section
    )
    assert "| 256 | 128256 | 10.0 | 80% |  | 250.0 (25.00x) | 40.0 (4.00x) | 200.0 (20.00x) |" in section
    assert "| sample (top-k + top-p), batch 1: <= 5 us | 4 | 0 of 4 |" in section
    # the summary names the sampling peers; a document without them keeps its sentence
    assert "FlashInfer in that row (sampling: also vLLM's torch sampler and torch.topk + torch.multinomial)." in text
    assert "torch.compile and FlashInfer in that row.\n" in report.render(_fixture_docs(), None)


# ---------------------------------------------------------------------------------------------
# bench_decode_linear: its grid, the weight copies and the read ceiling, the cases on the CPU, and
# a whole main() with a fake timer (the tables and the targets from the same measurements)

DECODE_LINEAR_LAYERS = [
    ("Llama-3-8B", "qkv", 6144, 4096),
    ("Llama-3-8B", "o", 4096, 4096),
    ("Llama-3-8B", "gate_up", 28672, 4096),
    ("Llama-3-8B", "down", 4096, 14336),
    ("Llama-3-8B", "lm_head", 128256, 4096),
    ("Llama-3-70B TP8", "o", 8192, 1024),
    ("Llama-3-70B TP8", "qkv", 1280, 8192),
    ("Llama-3-70B TP8", "gate_up", 7168, 8192),
    ("Llama-3-70B TP8", "down", 8192, 3584),
    ("Qwen3-8B", "gate_up", 24576, 4096),
    ("Qwen3-8B", "down", 4096, 12288),
    ("Qwen3-8B", "lm_head", 151936, 4096),
    ("Qwen3-30B-A3B", "qkv", 5120, 2048),
    ("Qwen3-30B-A3B", "o", 2048, 4096),
    ("Qwen3-30B-A3B", "router", 128, 2048),
    ("Qwen3-30B-A3B", "lm_head", 151936, 2048),
]


@pytest.mark.parametrize("ci", [False, True])
def test_bench_decode_linear_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_decode_linear", ci)
    rows = [1, 4, 16] if ci else [1, 2, 4, 8, 16]
    slug = {m: m.replace(" ", "-") for m, _, _, _ in DECODE_LINEAR_LAYERS}
    assert _describe(module.bench_decode_linear, ["jit", "cublas"]) == [
        (f"decode_linear-{slug[m]}-{layer}", rows, {"model": m, "layer": layer, "n": n, "k": k})
        for m, layer, n, k in DECODE_LINEAR_LAYERS
    ]
    assert [module.bench_decode_linear] == module.REPORTS
    assert "bench_decode_linear" in [script.name for script in run_all.SCRIPTS]
    assert run_all.grid_counts(load_bench("bench_decode_linear", True).REPORTS) == {
        "measurements": 16 * 3 * 2,
        "jit": 16 * 3,
        "compiles": 0,
    }


def test_decode_linear_weight_copies_and_ceiling(load_bench: Callable[[str, bool], ModuleType]) -> None:
    import math

    module = load_bench("bench_decode_linear", False)
    assert module.weight_bytes(4096, 4096) == 4096 * 4096 * 2
    # copies spanning 256 MB, at most 512: the 70B o (16.8 MB) 16, the 8B qkv (50.3 MB) 6, the LM head 1
    copies = [module.copies(n, k) for _, _, n, k in DECODE_LINEAR_LAYERS]
    assert copies == [6, 8, 2, 3, 1, 16, 13, 3, 5, 2, 3, 1, 13, 16, 512, 1]
    assert module.copies(8, 8) == module.MAX_COPIES == 512
    assert all(module.copies(n, k) * module.weight_bytes(n, k) >= L2_FLUSH_BYTES for _, _, n, k in DECODE_LINEAR_LAYERS)
    # 4096 x 4096 bf16 (33.6 MB) at 4,000 GB/s: 8.39 us
    assert module.ceiling_us(4096, 4096, 4000.0) == pytest.approx(4096 * 4096 * 2 / 4e12 * 1e6)
    assert math.isnan(module.ceiling_us(4096, 4096, NAN))


def test_decode_linear_cases_on_cpu(
    load_bench: Callable[[str, bool], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """cuBLAS's case is F.linear over every copy; jit_kernel's calls the public op with arguments
    its signature takes (replaced here by a recorder), on the same copies."""
    import inspect

    import jit_kernel

    module = load_bench("bench_decode_linear", False)
    module.weights.cache_clear()
    monkeypatch.setattr(module, "copies", lambda n, k: 3)
    outputs = module.linear_case("cublas", 32, 64, 4, device="cpu")()
    assert [tuple(o.shape) for o in outputs] == [(4, 32)] * 3 and outputs[0].dtype == torch.bfloat16
    ws = module.weights(32, 64, "cpu")
    assert len(ws) == 3 and len({w.data_ptr() for w in ws}) == 3  # distinct copies, kept for the shape
    assert 0.05 < float(ws[0].float().std()) < 0.25  # N(0, 1 / K)
    signature = inspect.signature(jit_kernel.decode_linear)
    seen: list[torch.Tensor] = []

    def record(*args: object, **kwargs: object) -> None:
        signature.bind(*args, **kwargs)
        seen.append(args[1])  # the weight

    monkeypatch.setattr(jit_kernel, "decode_linear", record)
    module.linear_case("jit", 32, 64, 4, device="cpu")()
    assert [w.data_ptr() for w in seen] == [w.data_ptr() for w in ws]
    with pytest.raises(ValueError, match="unknown provider"):
        module.linear_case("cutlass", 32, 64, 4, device="cpu")
    module.weights.cache_clear()


def _run_bench_decode_linear(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[tuple[Hashable, str]]
) -> dict[str, object]:
    """bench_decode_linear.main with a fake timer: the read at 4,000 GB/s; jit_kernel at 110% of
    the ceiling's time, cuBLAS 1.2x ours, but for the 70B q/k/v, where cuBLAS is 0.9x ours, and
    Qwen3-30B-A3B's router, where it is 2x ours (below 70% of the ceiling). The path column asks
    decode_linear's launcher on CUDA FakeTensors, which needs an arch where no GPU is visible."""
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        if key == _tables.READ_KEY:
            return _tables.READ_BYTES / 4e6  # us for 4,000 GB/s
        _, model, layer, _ = key  # type: ignore[misc]
        n, k = next((n, k) for m, name, n, k in module.LAYERS if (m, name) == (model, layer))
        ours = 1.1 * module.ceiling_us(n, k, 4000.0)
        if provider == "jit":
            return ours * module.copies(n, k)  # the timed call runs over every copy
        slower = {("Llama-3-70B TP8", "qkv"): 0.9, ("Qwen3-30B-A3B", "router"): 2.0}.get((model, layer), 1.2)
        return slower * ours * module.copies(n, k)

    return _main_with_fake_timer(module, monkeypatch, tmp_path, Measurements(timer), "bench_decode_linear")


def test_bench_decode_linear_main_checks_the_targets_on_the_same_measurements(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_decode_linear", True)
    calls: list[tuple[Hashable, str]] = []
    doc = _run_bench_decode_linear(module, monkeypatch, tmp_path, calls)
    printed = capsys.readouterr().out

    # every (config, provider) measured once, after the read
    assert len(calls) == len(set(calls)) == 1 + run_all.grid_counts(module.REPORTS)["measurements"]
    assert calls[0] == (_tables.READ_KEY, "read")
    command = "JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_decode_linear --json-dir "
    assert doc["command"] == command + str(tmp_path)
    assert doc["complete"] is True and doc["notes"] == [module.bandwidth_note(4000.0)]
    names = ["llama-3-8b", "llama-3-70b-tp8", "qwen3-8b", "qwen3-30b-a3b", "targets"]
    assert [t["name"] for t in doc["tables"]] == names
    tables = {t["name"]: t for t in doc["tables"]}
    assert tables["llama-3-8b"]["header"] == module.HEADER
    assert len(tables["llama-3-8b"]["rows"]) == 5 * 3 and len(tables["llama-3-70b-tp8"]["rows"]) == 4 * 3
    # the per-call times (each timed call ran over the weight's copies) and the ceiling's share
    o_row = tables["llama-3-8b"]["rows"][1 * 3]  # o, 1 row
    ceiling = 4096 * 4096 * 2 / 4e3 / 1e3
    assert o_row[:5] == ["o", "4096 x 4096", "33.6", 1, "kernel"]
    assert o_row[5:] == [f"{1.1 * ceiling:.2f}", f"{1.32 * ceiling:.2f}", "1.20x", f"{ceiling:.2f}", "91%"]
    # what decode_linear runs: cuBLAS for the weights above its size bound (gate/up, the LM head)
    paths = {(row[0], row[3]): row[4] for row in tables["llama-3-8b"]["rows"]}
    assert paths[("gate_up", 16)] == paths[("lm_head", 1)] == "cuBLAS (rule)" and paths[("down", 4)] == "kernel"

    # the targets: every weight at 91% of its ceiling; cuBLAS faster on the 70B q/k/v; cuBLAS below
    # 70% of the ceiling only on the router
    by_text = {row[0]: row[1:] for row in tables["targets"]["rows"]}
    share, mid_share, versus, weak = by_text.values()
    assert share == ["30", "30 of 30", share[2], "91%"]  # 10 of the 16 layers are 50 MB or more
    assert mid_share == ["15", "15 of 15", mid_share[2], "91%"]  # 8B o; 70B o, q/k/v; 30B-A3B o, q/k/v
    assert versus == ["48", "45 of 48", "Llama-3-70B TP8 qkv, rows 1", "0.90x"]
    assert weak == ["3", "3 of 3", "Qwen3-30B-A3B router, rows 1", "2.00x"]  # cuBLAS at 1 / 2.2 of the ceiling
    summary = printed[printed.index("device: Fake GPU") : printed.index("results: ")]
    assert "### targets, checked on this run" in summary and "at 4000 GB/s" in summary
    assert "| o | 4096 x 4096 | 33.6 | 1 | kernel |" in summary


def test_report_renders_the_decode_linear_section(
    load_bench: Callable[[str, bool], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_decode_linear", True)
    doc = _run_bench_decode_linear(module, monkeypatch, tmp_path, [])
    text = report.render([*_fixture_docs(), doc], None)
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections.index("## Decode GEMMs: decode_linear") == sections.index("## Gated activations") + 1
    section = text[text.index("## Decode GEMMs: decode_linear") :]
    section = section[: section.index("\n## ")]
    assert "`JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_decode_linear --json-dir DIR`" in section
    assert f"- {module.bandwidth_note(4000.0)}" in section
    assert "| layer | N x K | weight MB | rows | jit_kernel runs | jit_kernel us | cuBLAS us |" in section
    assert not report.has_plot(doc)  # tables of cells: no plot


# ---------------------------------------------------------------------------------------------
# bench_decode_attention: its grid, the torch baselines on the CPU, a whole main() with a fake timer
# (the read ceilings from the same measurements) and its section of the report

DECODE_LINES = ["jit", "sdpa_repeat_kv", "sdpa_gqa", "copy"]


@pytest.mark.parametrize("ci", [False, True])
def test_bench_decode_attention_reports(load_bench: Callable[[str, bool], ModuleType], ci: bool) -> None:
    module = load_bench("bench_decode_attention", ci)
    assert _describe(module.bench_decode, DECODE_LINES) == [
        (f"decode_attention-bf16-ctx{n}", [1, 8, 32], {"context": n}) for n in (1024, 8192, 32768)
    ]
    tokens = [16, 4096] if ci else [1, 16, 256, 4096]
    assert _describe(module.bench_merge) == [("merge_attn_states-bf16", tokens, {})]
    assert [report.fn.__name__ for report in module.REPORTS] == ["bench_decode", "bench_merge"]
    measured = {("decode", b, bench.args["context"]) for bench in module.bench_decode.benchmarks for b in bench.x_vals}
    measured |= {("merge", n) for n in module.bench_merge.benchmarks.x_vals}
    assert {key for table in module.summary_tables() for key, *_ in table.configs} == measured
    # 9 decode configs x 4 providers, merge 2 x 4 (CI)
    assert run_all.grid_counts(load_bench("bench_decode_attention", True).REPORTS) == {
        "measurements": 36 + 8,
        "jit": 9 + 2,
        "compiles": 2,
    }
    assert "bench_decode_attention" in [script.name for script in run_all.SCRIPTS]
    assert not torch.cuda.is_initialized()


def test_decode_attention_bench_bytes_and_baselines_on_cpu(load_bench: Callable[[str, bool], ModuleType]) -> None:
    module = load_bench("bench_decode_attention", False)
    assert module.kv_bytes(2, 1024) == 2 * 2 * 8 * 1024 * 128 * 2
    assert module.decode_bytes(2, 1024) == module.kv_bytes(2, 1024) + 2 * 2 * 32 * 128 * 2 + 8
    assert module.merge_bytes(3) == 3 * 3 * 32 * (128 * 2 + 4)
    torch.manual_seed(0)
    q, k, v, lens = module.make_decode_inputs(2, 64, device="cpu")
    assert q.shape == (2, 32, 128) and k.shape == v.shape == (2, 8, 64, 128) and lens.tolist() == [64, 64]
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("bkgd,bknd->bkgn", q.view(2, 8, 4, 128), k) / math.sqrt(128)
    expected = torch.einsum("bkgn,bknd->bkgd", scores.softmax(-1), v).reshape(2, 32, 128)
    torch.testing.assert_close(module.sdpa_repeat_kv(q, k, v), expected)
    torch.testing.assert_close(module.sdpa_gqa(q, k, v), expected)
    a, la, b, lb = module.make_merge_inputs(5, device="cpu")
    out, lse = module.torch_merge(a.double(), la.double(), b.double(), lb.double())
    both = torch.stack([la, lb]).double()
    weights = torch.softmax(both, dim=0)
    torch.testing.assert_close(out, a.double() * weights[0, ..., None] + b.double() * weights[1, ..., None])
    torch.testing.assert_close(lse, torch.logsumexp(both, dim=0))
    assert module.decode_case("copy", 1, 1024, device="cpu")().numel() == module.decode_bytes(1, 1024) // 2
    assert module.merge_case("compile", 2, device="cpu") is not None
    with pytest.raises(ValueError, match="unknown provider"):
        module.decode_case("eager", 1, 64, device="cpu")
    with pytest.raises(ValueError, match="unknown provider"):
        module.merge_case("sdpa_gqa", 1, device="cpu")


def test_bench_decode_attention_calls_bind_to_the_jit_kernel_ops(
    load_bench: Callable[[str, bool], ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    import inspect

    import jit_kernel

    module = load_bench("bench_decode_attention", False)
    calls: list[str] = []
    for name in ("decode_attention", "merge_attn_states"):
        signature = inspect.signature(getattr(jit_kernel, name))

        def record(
            *args: object, _signature: inspect.Signature = signature, _name: str = name, **kwargs: object
        ) -> None:
            _signature.bind(*args, **kwargs)
            calls.append(_name)

        monkeypatch.setattr(jit_kernel, name, record)
    module.decode_case("jit", 2, 64, device="cpu")()
    module.merge_case("jit", 2, device="cpu")()
    assert calls == ["decode_attention", "merge_attn_states"]


DECODE_FAKE_US = {"jit": 10.0, "sdpa_repeat_kv": 40.0, "sdpa_gqa": 30.0, "copy": 8.0, "eager": 20.0, "compile": 12.0}


def _run_bench_decode_attention(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, calls: list[tuple[Hashable, str]]
) -> dict[str, object]:
    """main() with a fake timer: the 2 GiB read at 2,000 GB/s, the paired empty kernel at 2.0 us,
    SDPA with enable_gqa missing at batch 32."""

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        if key == _tables.READ_KEY:
            return _tables.READ_BYTES / 2e6  # us for 2,000 GB/s
        if provider == "sdpa_gqa" and key[1] == 32:  # type: ignore[index]
            return NAN
        return DECODE_FAKE_US[provider]

    return _main_with_fake_timer(
        module, monkeypatch, tmp_path, Measurements(timer, lambda: 2.0), "bench_decode_attention"
    )


def test_bench_decode_attention_main_adds_the_read_ceiling(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    module = load_bench("bench_decode_attention", True)
    calls: list[tuple[Hashable, str]] = []
    doc = _run_bench_decode_attention(module, monkeypatch, tmp_path, calls)
    printed = capsys.readouterr().out
    assert len(calls) == len(set(calls)) == 1 + run_all.grid_counts(module.REPORTS)["measurements"]
    assert doc["complete"] is True and doc["empty_kernel_us"] == 2.5
    assert doc["notes"] == [module.bandwidth_note(2000.0)] and "at 2000 GB/s" in doc["notes"][0]
    tables = {table["name"]: table for table in doc["tables"]}
    assert list(tables) == ["decode_attention", "merge_attn_states", "targets"]
    # the targets: within 2x the ceiling but at batch 1 of 1,024 tokens (10 us against 4.1 us); 3x
    # SDPA enable_gqa, 4x SDPA + repeat_kv where enable_gqa is missing; the merge's copy
    # at 0.8 of its time
    ceiling, over_sdpa, merge = (row[1:] for row in tables["targets"]["rows"])
    assert ceiling[:3] == ["9", "8 of 9", "batch 1, context 1024"]
    assert over_sdpa == ["9", "9 of 9", "batch 1, context 1024", "3.00x"]
    assert merge == ["1", "0 of 1", "tokens 4096", "0.80x"]
    decode = tables["decode_attention"]
    assert list(decode["providers"]) == ["jit", "sdpa_repeat_kv", "sdpa_gqa", "ceiling", "copy"]
    assert [row["key"] for row in decode["rows"]][:3] == [[1, 1024], [8, 1024], [32, 1024]]
    row = decode["rows"][8]  # batch 32, context 32768
    assert row["key"] == [32, 32768] and not row["tiny"]
    assert row["us"]["ceiling"] == pytest.approx(module.decode_bytes(32, 32768) / 2e3 / 1e3 + 2.0, rel=1e-6)
    assert row["us"]["sdpa_gqa"] is None and row["us"]["sdpa_repeat_kv"] == 40.0
    assert row["of_copy_ceiling"]["jit"] == pytest.approx(0.8)
    first = decode["rows"][0]
    assert first["tiny"] and first["vs_empty"] == 5.0
    merge = tables["merge_attn_states"]
    assert list(merge["providers"]) == PROVIDERS and [r["key"] for r in merge["rows"]] == [[16], [4096]]
    assert merge["rows"][0]["tiny"] and not merge["rows"][1]["tiny"]
    summary = printed[printed.index("device: Fake GPU") : printed.index("results: ")]
    assert "read ceiling: K, V, the query and the output at 2000 GB/s" in summary
    assert "| 32 | 32768 | 10.00 | 40.00 (4.00x) | n/a |" in summary

    # its section of the report: the device, the ceiling's note, SDPA named among the summary's peers
    text = report.render([*_fixture_docs(), doc], None)
    section = text[text.index("## Decode attention and merge_attn_states") :]
    section = section[: section.index("\n## ")]
    assert "`JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_decode_attention --json-dir DIR`" in section
    assert "Device: Fake GPU (compute capability 9.0, 132 SMs)." in section
    assert f"- {module.bandwidth_note(2000.0)}" in section
    assert (
        "| batch | context | jit_kernel us | % of copy | vs empty | SDPA + repeat_kv us | SDPA enable_gqa us "
        "| read ceiling us | copy us |" in section
    )
    assert "(decode attention: also torch SDPA over repeat_kv'd heads and torch SDPA with enable_gqa)." in text


# ---------------------------------------------------------------------------------------------
# bench_dispatch: its CPU section runs for real (the add_constant host family); the GPU sections
# are skipped without CUDA.


def test_bench_dispatch_covers_every_op_and_imports_without_cuda() -> None:
    from jit_kernel.benchmark import bench_dispatch

    assert list(bench_dispatch.OPS) == [
        "rmsnorm (out=)",
        "rmsnorm (functional)",
        "fused_add_rmsnorm",
        "gemma_rmsnorm (out=)",
        "gemma_rmsnorm (functional)",
        "gemma_fused_add_rmsnorm",
        "silu_and_mul (out=)",
        "silu_and_mul (functional)",
        "gelu_and_mul (out=)",
        "gelu_and_mul (functional)",
        "gelu_tanh_and_mul (out=)",
        "gelu_tanh_and_mul (functional)",
        "fused_inplace_qknorm",
        "qknorm_across_heads",
        "per_tensor_quant_fp8 (outputs given)",
        "per_tensor_quant_fp8 (functional)",
        "per_token_quant_fp8 (outputs given)",
        "per_token_quant_fp8 (functional)",
        "per_token_group_quant_fp8 (outputs given)",
        "per_token_group_quant_fp8 (functional)",
        "silu_and_mul_per_token_group_quant_fp8 (outputs given)",
        "silu_and_mul_per_token_group_quant_fp8 (functional)",
        "rmsnorm_quant_fp8 (out=)",
        "rmsnorm_quant_fp8 (functional)",
        "fused_add_rmsnorm_quant_fp8 (out=)",
        "fused_add_rmsnorm_quant_fp8 (functional)",
        "rmsnorm_per_token_quant_fp8 (outputs given)",
        "rmsnorm_per_token_quant_fp8 (functional)",
        "fused_add_rmsnorm_per_token_quant_fp8 (outputs given)",
        "fused_add_rmsnorm_per_token_quant_fp8 (functional)",
        "rmsnorm_per_token_group_quant_fp8 (outputs given)",
        "rmsnorm_per_token_group_quant_fp8 (functional)",
        "fused_add_rmsnorm_per_token_group_quant_fp8 (outputs given)",
        "fused_add_rmsnorm_per_token_group_quant_fp8 (functional)",
        "apply_rope_with_cos_sin_cache_inplace",
        "fused_qknorm_rope",
        "store_kv_cache",
        "set_mla_kv_buffer",
        "scale (out=)",
        "scale (functional)",
        "add_constant (out=)",
        "add_constant (functional)",
        "transfer_hicache_one_layer",
        "transfer_hicache_one_layer_mla",
        "transfer_hicache_all_layer",
        "transfer_hicache_all_layer_mla",
        "topk_softmax (functional)",
        "topk_sigmoid (functional)",
        "grouped_topk (functional)",
        "moe_align_block_size (functional)",
        "moe_sum_reduce (out=)",
        "moe_sum_reduce (functional)",
        "sample (out=)",
        "sample (functional)",
        "mask_logits (out=)",
        "mask_logits (functional)",
        "sampling_from_logits (functional)",
        "sampling_from_probs (functional)",
        "top_k_sampling_from_probs (functional)",
        "top_p_sampling_from_probs (functional)",
        "min_p_sampling_from_probs (functional)",
        "top_k_top_p_sampling_from_logits (functional)",
        "top_k_top_p_sampling_from_probs (functional)",
        "top_k_renorm_probs (functional)",
        "top_p_renorm_probs (functional)",
        "top_k_mask_logits (functional)",
        "chain_speculative_sampling (functional)",
        "tree_speculative_sampling_target_only",
        "verify_tree_greedy",
        "decode_linear (out=)",
        "decode_linear (functional)",
        "decode_attention (functional)",
        "merge_attn_states (functional)",
    ]
    assert set(bench_dispatch.CPU_OPS) <= set(bench_dispatch.OPS)
    assert not torch.cuda.is_initialized()


def _public_ops() -> set[str]:
    """The public functions of jit_kernel defined in jit_kernel/ops (the ops, and helpers beside them)."""
    import inspect

    import jit_kernel

    ops_dir = Path(jit_kernel.__file__).parent / "ops"

    def in_ops(f: Callable[..., object]) -> bool:  # written there, or declared there (kernel_op)
        return Path(f.__code__.co_filename).parent == ops_dir or f.__code__.co_filename.startswith("<kernel_op ")

    functions = [getattr(jit_kernel, name) for name in jit_kernel.__all__]
    return {f.__name__ for f in functions if inspect.isfunction(f) and in_ops(f)}


def test_bench_dispatch_has_a_row_for_every_public_op() -> None:
    """A new public op fails this until bench_dispatch times it (or NO_ROW says why it does not)."""
    from jit_kernel.benchmark import bench_dispatch

    public = _public_ops()
    timed = {name.split(" (")[0] for name in bench_dispatch.OPS}
    assert {"topk_softmax", "grouped_topk", "moe_align_block_size", "moe_sum_reduce", "gemma_rmsnorm"} <= public
    assert public - set(bench_dispatch.NO_ROW) - timed == set(), "public ops without a bench_dispatch row"
    assert timed - public == set(), "rows of names that are not public ops"
    assert set(bench_dispatch.NO_ROW) <= public - timed, "NO_ROW names an op that has a row, or no op"
    assert all(bench_dispatch.NO_ROW.values())


def test_bench_dispatch_ops_selects_rows_by_op() -> None:
    from jit_kernel.benchmark import bench_dispatch

    assert bench_dispatch.selected(None) == list(bench_dispatch.OPS)
    assert bench_dispatch.selected(["decode_linear", "fused_add_rmsnorm"]) == [
        "fused_add_rmsnorm",
        "decode_linear (out=)",
        "decode_linear (functional)",
    ]
    with pytest.raises(ValueError, match=r"unknown ops \['decode_linea'\]; known: \["):
        bench_dispatch.selected(["decode_linea"])
    with pytest.raises(SystemExit):
        bench_dispatch.main(["--ops", "no_such_op", "--cpu-only"])


def test_bench_dispatch_no_op_kernels_times_each_op_on_any_machine(capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-op-kernels``: the eager rows on CPU tensors, every kernel a tvm-ffi no-op; the tables
    hold no no-op afterwards."""
    from jit_kernel.benchmark import bench_dispatch
    from jit_kernel.ops import _common, _site

    if _site._factory() is None:
        pytest.skip("no build of the launch_site module (a source checkout without a build)")
    bench_dispatch.main(["--no-op-kernels", "--repeats", "3", "--calls", "20", "--ops", "rmsnorm", "scale"])
    rows = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| rmsnorm") or line.startswith("| scale")
    ]
    assert len(rows) == 4, rows
    for row in rows:
        eager, raw, overhead = row.split("|")[2:5]
        assert float(eager) > 0 and float(raw) > 0 and re.fullmatch(r" [+-]\d+\.\d\d ", overhead), row
    assert not any(len(table) for table in _common.TABLES)


def _launcher_params(spec: KernelSpec, export: str) -> list[str]:
    """The parameter types of the C++ function ``spec`` exports as ``export``, read from its sources:
    ``ns::Struct<{args}>::name`` is Struct's ``static void name(...)`` (or ``static bool``: a
    launcher that may decline), ``ns::name<{args}>`` a free ``void name(...)``."""
    from jit_kernel.engine import env

    *_, owner, name = (re.sub(r"<.*?>", "", part) for part in spec.exports[export].split("::"))
    text = "\n".join((env.CSRC_DIR / source).read_text() for source in spec.sources)
    struct = re.search(rf"\bstruct {owner}\b[^;{{]*{{", text)
    pattern = rf"\bstatic (?:void|bool) {name}\(" if struct else rf"\bvoid {name}\("
    found = re.compile(pattern).search(text, struct.end() if struct else 0)
    assert found is not None, f"{spec.exports[export]}: no {pattern} in {spec.sources}"
    depth, params, current = 0, [], ""
    for char in text[found.end() :]:
        if char in "(<":
            depth += 1
        elif char in ">)":
            if char == ")" and depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            params.append(current)
            current = ""
        else:
            current += char
    params.append(current)
    return [re.sub(r"\s+\w+$", "", p.strip()) for p in params if p.strip()]


def _accepts(cpp_type: str, value: object) -> bool:
    """Whether ``value`` is what a raw tvm-ffi call passes for a C++ parameter of ``cpp_type``."""
    if "Optional<" in cpp_type and value is None:
        return True
    if "TensorView" in cpp_type:
        return isinstance(value, torch.Tensor)
    scalar = re.sub(r".*Optional<(.*)>.*", r"\1", cpp_type).strip()
    expected = {"double": float, "bool": bool, "int64_t": int, "int32_t": int}.get(scalar)
    assert expected is not None, f"unknown launcher parameter type {cpp_type!r}"
    return type(value) is expected


# Ops that give tensors off the GPU to their fallback before any launch: their launches are checked
# on CUDA FakeTensors instead (decode_linear: tests/test_gemm_cpu.py).
OFF_GPU_FALLBACK = {"decode_linear"}


def test_bench_dispatch_calls_match_the_ops_and_the_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU, without kernels: each row's op call binds to the public op's signature; the launch
    the op's plan makes passes the C++ launcher's parameters (csrc/..., read here), one value of the
    right kind each, to a config in the family's domain; the row's raw call is that launch, and a
    functional row's raw call gets new outputs of the returned ones' shapes and dtypes."""
    import inspect

    from jit_kernel.benchmark import bench_dispatch
    from jit_kernel.engine.dispatch import Dispatcher
    from jit_kernel.ops import _common

    calls: list[tuple[str, tuple[object, ...]]] = []

    def fake_function(self: Dispatcher, export: str, config: Config) -> Callable[..., None]:
        self.spec.check_config(config)
        params = _launcher_params(self.spec, export)

        def raw(*args: object) -> None:
            assert len(args) == len(params), f"{self.spec.exports[export]}: {len(args)} arguments for {params}"
            for i, (cpp_type, value) in enumerate(zip(params, args, strict=True)):
                assert _accepts(cpp_type, value), f"{self.spec.exports[export]} argument {i}: {cpp_type} got {value!r}"
            calls.append(("raw", args))

        return raw

    monkeypatch.setattr(Dispatcher, "function", fake_function)
    saved = [(table, dict(table)) for table in _common.TABLES]
    try:
        for table, _ in saved:
            table.clear()
        inputs = bench_dispatch.Inputs(3, "cpu")
        for row in bench_dispatch.OPS:
            spec = bench_dispatch.SPECS[row.split(" (")[0]][1](inputs)
            inspect.signature(spec.op).bind(*spec.args, **spec.kwargs)
            if row.split(" (")[0] in OFF_GPU_FALLBACK:
                calls.clear()
                spec.op(*spec.args, **spec.kwargs)
                assert calls == [], f"{row}: launched on CPU tensors"
                continue
            eager, raw, _ = bench_dispatch.OPS[row](inputs)
            calls.clear()
            eager()
            raw()
            [(first, op_args), (second, raw_args)] = calls
            assert (first, second) == ("raw", "raw"), row
            if row.endswith(bench_dispatch.FUNCTIONAL):  # new outputs of the same shapes, the rest the same
                assert len(raw_args) == len(op_args), row
                for ours, theirs in zip(raw_args, op_args, strict=True):
                    if isinstance(ours, torch.Tensor) and ours is not theirs:
                        assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), row
                    else:
                        assert ours is theirs or ours == theirs, row
            else:  # the very arguments the op passed, given outputs included
                assert all(a is b for a, b in zip(raw_args, op_args, strict=True)), row
                assert all(any(o is a for a in raw_args) for o in spec.outputs), row
    finally:
        for table, kernels in saved:
            table.clear()
            dict.update(table, kernels)


def test_bench_dispatch_cpu_section(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from jit_kernel.benchmark import bench_dispatch

    # eager and raw compute the same thing on the benchmark's inputs
    inputs = bench_dispatch.Inputs(1, "cpu")
    eager, raw, flashinfer = bench_dispatch.OPS["add_constant (out=)"](inputs)
    assert flashinfer is None  # FlashInfer has no add_constant
    inputs.ints_out.zero_()
    raw()
    assert torch.equal(inputs.ints_out, inputs.ints + 1)
    inputs.ints_out.zero_()
    assert eager() is inputs.ints_out
    assert torch.equal(inputs.ints_out, inputs.ints + 1)

    monkeypatch.delenv(SAVE_PATH_ENV, raising=False)
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    json_dir = tmp_path / "json"
    bench_dispatch.main(
        ["--cpu-only", "--calls", "20", "--repeats", "2", "--save-path", str(tmp_path), "--json-dir", str(json_dir)]
    )
    printed, written = capsys.readouterr().out.split("results: ")
    assert written.strip() == str(json_dir / "bench_dispatch.json")
    assert (
        "command: `python -m jit_kernel.benchmark.bench_dispatch --cpu-only --calls 20 --repeats 2 --save-path"
        in printed
    )
    row = next(line for line in printed.splitlines() if line.startswith("| add_constant (out=) |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    eager_us, raw_us, diff = float(cells[1]), float(cells[2]), float(cells[3])
    assert eager_us > 0 and raw_us > 0 and diff == pytest.approx(eager_us - raw_us, abs=0.011)
    assert cells[4] in ("met", "**missed**")
    assert (tmp_path / "bench_dispatch.md").read_text().strip() == printed.strip()
    doc = json.loads((json_dir / "bench_dispatch.json").read_text())
    # The command as recorded, after any grid variable set here (CI=true on a CI runner).
    assert re.match(r"(\w+=\S+ )*python -m jit_kernel.benchmark.bench_dispatch --cpu-only --calls 20", doc["command"])
    [table] = doc["tables"]
    assert table["kind"] == "cells" and table["name"] == "cpu" and table["header"] == bench_dispatch.EAGER_HEADER
    assert table["rows"][0] == cells and [row[0] for row in table["rows"]] == list(bench_dispatch.CPU_OPS)


def test_bench_dispatch_failing_op_is_an_error_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.benchmark import bench_dispatch

    def broken(inputs: object) -> tuple[Callable[[], object], Callable[[], object]]:
        raise RuntimeError("no kernel | here\nsecond line")

    monkeypatch.setitem(bench_dispatch.OPS, "broken", broken)
    rows = bench_dispatch.eager_rows(["broken", "add_constant (out=)"], "cpu", calls=5, repeats=1)
    assert rows[0] == ["broken", "error: RuntimeError: no kernel \\| here", "", "", "", ""]
    assert rows[1][0] == "add_constant (out=)" and float(rows[1][1]) > 0


def test_bench_dispatch_forms_compare_functional_with_out_plus_allocation() -> None:
    """functional - out= against the outputs' torch.empty (raw functional - raw out=), per op with both forms."""
    from jit_kernel.benchmark import bench_dispatch

    measured = {
        "rmsnorm (out=)": (5.0, 4.5),
        "rmsnorm (functional)": (7.9, 8.0),  # +2.9 against an allocation of +3.5: met
        "per_token_quant_fp8 (outputs given)": (5.0, 4.5),
        "per_token_quant_fp8 (functional)": (12.0, 9.5),  # +7.0 against +5.0: missed
        "fused_add_rmsnorm": (5.0, 4.5),  # one form only: no row
        "silu_and_mul (functional)": (9.0, 7.0),  # no out= row measured: no row
    }
    rows = bench_dispatch.forms_rows(measured)
    assert rows == [
        ["rmsnorm", "5.00", "7.90", "+2.90", "+3.50", "met"],
        ["per_token_quant_fp8", "5.00", "12.00", "+7.00", "+5.00", "**missed**"],
    ]


def test_bench_versions_only_selects_matching_cases_and_the_empty_kernel() -> None:
    from jit_kernel.benchmark import bench_versions

    cases = bench_versions._cases()  # setups are not called: no CUDA needed
    names = [name for name, _, _ in bench_versions.selected(cases, "gelu_tanh|fp8 cache")]
    assert names[0].startswith("empty kernel")
    assert names[1:] and all("gelu_tanh" in name or "fp8 cache" in name for name in names[1:])
    assert {name for name, _, _ in bench_versions.selected(cases, None)} == {name for name, _, _ in cases}
    assert [name for name, _, _ in bench_versions.selected(cases, "no such case")] == [cases[0][0]]


# ---------------------------------------------------------------------------------------------
# JSON results (results.py)


def test_provider_row_known_numbers() -> None:
    providers = ["jit", "eager", "compile", "copy", "flashinfer"]
    times = {"jit": 10.0, "eager": 25.0, "compile": 16.0, "copy": 8.0, "flashinfer": NAN, "empty": 4.0}
    row = results.provider_row([16, "x"], times, 1000, True, providers, empty=99.0)
    assert row["key"] == [16, "x"] and row["bytes"] == 1000 and row["tiny"] is True
    assert row["us"] == {"jit": 10.0, "eager": 25.0, "compile": 16.0, "copy": 8.0, "flashinfer": None}
    assert row["of_copy_ceiling"] == {"jit": 0.8, "eager": 0.32, "compile": 0.5, "flashinfer": None}
    assert row["empty_us"] == 4.0 and row["vs_empty"] == 2.5  # the paired reference, not the run-level one
    unpaired = results.provider_row([16, "x"], {"jit": 10.0}, 1000, True, ["jit", "copy"], empty=5.0)
    assert unpaired["vs_empty"] == 2.0 and unpaired["of_copy_ceiling"] == {"jit": None}
    large = results.provider_row([4096, "x"], times, 1000, False, providers)
    assert "vs_empty" not in large and "empty_us" not in large


def test_tables_json_and_markdown_read_the_same_measurements() -> None:
    measured = Measurements(lambda key, provider, make: {"jit": 10.0, "eager": 20.0, "copy": 8.0}[provider])
    for key in (("op", 16), ("op", 4096)):
        for provider in ("jit", "eager", "copy"):
            measured.time(key, provider, lambda: lambda: None)
    providers = {"jit": ("ours", ("", "")), "eager": ("torch eager", ("", "")), "copy": ("copy", ("", ""))}
    configs = [(("op", n), [n], 8_000_000, n <= 16) for n in (16, 4096, 65536)]  # 65536: not measured
    table = _tables.SummaryTable("op", "op (bf16)", ["tokens"], configs, providers)
    [doc_table] = _tables.tables_json([table], measured, 2.0)
    assert doc_table["providers"] == {"jit": "ours", "eager": "torch eager", "copy": "copy"}
    assert [row["key"] for row in doc_table["rows"]] == [[16], [4096]]
    assert doc_table["rows"][0]["vs_empty"] == 5.0 and doc_table["rows"][0]["us"]["eager"] == 20.0
    markdown = _tables.tables_markdown([table], measured, 2.0)
    assert markdown.startswith("### op (bf16)\n") and markdown.count("\n| ") == 3  # header + two rows
    assert "| 16 | 10.0 | 20.0 | n/a | 8.0 | 800 | 80% | 2.00x | n/a | 5.00x |" in markdown


def test_write_is_strict_json_and_load_skips_other_files(tmp_path: Path) -> None:
    table = results.cells_table("t", "T", ["a", "b"], [["x", NAN], [1, 2.25]])
    assert table["rows"] == [["x", None], [1, "2.2"]]
    doc = results.document("bench_x", "Line one\n  line two.", "cmd", [table], environment_info=FAKE_ENVIRONMENT)
    assert doc["summary"] == "Line one line two." and doc["complete"] is True and doc["empty_kernel_us"] is None
    path = results.write(tmp_path, doc)
    assert path == tmp_path / "bench_x.json" and json.loads(path.read_text()) == doc
    with pytest.raises(ValueError):
        results.write(tmp_path, {**doc, "script": "bad", "empty_kernel_us": NAN})
    (tmp_path / "run_all.json").write_text(json.dumps({"schema": run_all.RUN_SCHEMA}))
    (tmp_path / "other.json").write_text("[1, 2]")
    assert [d["script"] for d in results.load(tmp_path)] == ["bench_x"]


def test_json_dir_and_command_line() -> None:
    assert results.resolve_json_dir(None, {}) is None
    assert results.resolve_json_dir(None, {results.JSON_DIR_ENV: ""}) is None
    assert results.resolve_json_dir(None, {results.JSON_DIR_ENV: "/env"}) == "/env"
    assert results.resolve_json_dir("/cli", {results.JSON_DIR_ENV: "/env"}) == "/cli"
    assert (
        results.command_line("bench_x", ["--json-dir", "a b"], {})
        == "python -m jit_kernel.benchmark.bench_x --json-dir 'a b'"
    )
    ci = results.command_line("bench_x", [], {"JIT_KERNEL_BENCH_CI": "1"})
    assert ci == "JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_x"
    assert results.first_paragraph("  One\n  two.\n\n  Three.") == "One two."


def test_environment_on_this_machine() -> None:
    env = results.environment({"JIT_KERNEL_BENCH_COMMIT": "abc1234", "JIT_KERNEL_BENCH_CI": "1"})
    import jit_kernel

    assert env["torch"] == torch.__version__ and env["jit_kernel"] == jit_kernel.__version__
    assert env["tvm_ffi"] and env["commit"] == "abc1234" and env["grid"] == "ci"
    if not torch.cuda.is_available():
        assert env["device"] == {"name": None, "capability": None, "sms": None} and env["driver"] is None
    json.dumps(env, allow_nan=False)


def test_bench_hicache_tables_print_and_record(capsys: pytest.CaptureFixture[str]) -> None:
    from jit_kernel.benchmark import bench_hicache

    bench_hicache.TABLES.clear()
    table = bench_hicache.Table("t", "A title", ["dir", "GB/s"])
    table.add("d2d", "1.5")
    assert capsys.readouterr().out == "\n## A title\n| dir | GB/s |\n|---|---:|\n| d2d | 1.5 |\n"
    assert [table] == bench_hicache.TABLES
    assert table.json() == results.cells_table("t", "A title", ["dir", "GB/s"], [["d2d", "1.5"]])
    bench_hicache.TABLES.clear()


def test_bench_first_call_writes_its_tables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from jit_kernel.benchmark import bench_first_call

    phases = {"tvm_ffi": 0.1, "import": 0.05, "call": 0.002}
    cold = {"tvm_ffi": 0.1, "import": 0.05, "call": 2.0}
    monkeypatch.setattr(
        bench_first_call, "first_call", lambda *a: [("prebuilt", phases, "prebuilt"), ("jit, cold", cold, "jit")]
    )
    monkeypatch.setattr(bench_first_call, "warm_load", lambda repeats: [("load_jit", 0.006)])
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    bench_first_call.main(["--device", "cpu", "--json-dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "| prebuilt | 100.0 | 50.0 | 2.0 | 1000x | prebuilt |" in printed
    doc = json.loads((tmp_path / "bench_first_call.json").read_text())
    assert [t["name"] for t in doc["tables"]] == ["first_call", "warm_load"]
    assert doc["tables"][0]["rows"][1] == ["jit, cold", "100.0", "50.0", "2000.0", "1x", "jit"]
    assert doc["tables"][1]["rows"] == [["load_jit", "6.00"]]


def test_interrupted_script_writes_what_it_measured(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from jit_kernel.benchmark import bench_first_call

    def interrupted(*args: object) -> list[tuple[str, float]]:
        raise KeyboardInterrupt

    monkeypatch.setattr(
        bench_first_call, "first_call", lambda *a: [("prebuilt", {"tvm_ffi": 1, "import": 1, "call": 1}, "p")]
    )
    monkeypatch.setattr(bench_first_call, "warm_load", interrupted)
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    with pytest.raises(SystemExit) as stopped:
        bench_first_call.main(["--json-dir", str(tmp_path)])
    assert stopped.value.code == 130
    doc = json.loads((tmp_path / "bench_first_call.json").read_text())
    assert doc["complete"] is False and [t["name"] for t in doc["tables"]] == ["first_call"]


# ---------------------------------------------------------------------------------------------
# run_all


def test_bounds_give_slack_while_the_budget_allows_and_cut_the_last_scripts_otherwise() -> None:
    assert run_all.bounds([10, 20, 30], 1000) == [20, 40, 60]
    assert run_all.bounds([10, 20, 30], 70) == [20, 30, 40]  # slack only while the rest's estimates fit
    assert run_all.bounds([10, 30], 20) == [10, 10]  # short: the first gets its estimate, the last what is left
    assert run_all.bounds([10, 30, 5], 12) == [10, 2, 0]
    assert run_all.next_bound(10, 5, 0) == 0
    assert run_all.next_bound(10, 0, float("inf")) == 20


def test_estimate_from_counts() -> None:
    counts = {"measurements": 10, "jit": 2, "compiles": 2}
    expected = run_all.START_S + 10 * run_all.MEASURE_S + 4 * run_all.EMPTY_S + 2 * run_all.COMPILE_S
    assert run_all.estimate_from_counts(counts) == pytest.approx(expected)


def test_grid_counts_of_the_ci_grids(load_bench: Callable[[str, bool], ModuleType]) -> None:
    norm = load_bench("bench_norm", True)
    # 4 benchmarks (rmsnorm and fused_add at D 4096, both q/k norms) x 2 token counts x 6 providers
    assert run_all.grid_counts(norm.REPORTS) == {"measurements": 48, "jit": 8, "compiles": 8}
    elementwise = load_bench("bench_elementwise", True)
    assert run_all.grid_counts(elementwise.REPORTS) == {"measurements": 16, "jit": 4, "compiles": 4}


FAKE_SCRIPT = """
import json, signal, sys, time
from pathlib import Path
folder = Path(sys.argv[sys.argv.index("--json-dir") + 1])
rows = []
def write(complete):
    doc = {"schema": "jit_kernel.benchmark/1", "script": NAME, "complete": complete, "rows": rows}
    (folder / f"{NAME}.json").write_text(json.dumps(doc))
try:
    for i in range(ROWS):
        rows.append(i)
        time.sleep(0.05)
except KeyboardInterrupt:
    write(False)
    raise SystemExit(130)
write(True)
"""


def test_run_all_bounds_each_script_and_keeps_partial_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    for name, rows in (("fast_bench", 2), ("slow_bench", 10_000), ("failing_bench", 0)):
        body = FAKE_SCRIPT.replace("NAME", repr(name)).replace("ROWS", str(rows))
        if name == "failing_bench":
            body = "raise SystemExit(3)\n"
        (modules / f"{name}.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", f"{modules}:{REPO / 'python'}")
    scripts = tuple(
        run_all.Script(name, (), estimate, module=name)
        # slow_bench's bound (twice its estimate) leaves a loaded machine time to start it
        for name, estimate in (("fast_bench", 20.0), ("slow_bench", 10.0), ("failing_bench", 5.0))
    )
    monkeypatch.setattr(run_all, "SCRIPTS", scripts)
    monkeypatch.setattr(run_all, "GRACE_S", 10)
    out = tmp_path / "json"
    (out).mkdir()
    (out / "failing_bench.json").write_text("{}")  # stale: removed before the script runs
    run_all.main(["--json-dir", str(out), "--budget", "1000", "--log-dir", str(tmp_path / "logs")])
    manifest = json.loads((out / run_all.MANIFEST).read_text())
    status = {entry["script"]: entry["status"] for entry in manifest["scripts"]}
    assert status == {
        "fast_bench": "ok",
        "slow_bench": "stopped at its bound of 20 s",
        "failing_bench": "failed (exit status 3)",
    }
    assert json.loads((out / "fast_bench.json").read_text())["complete"] is True
    partial = json.loads((out / "slow_bench.json").read_text())
    assert partial["complete"] is False and 10 < len(partial["rows"]) < 10_000
    assert not (out / "failing_bench.json").exists()
    assert (tmp_path / "logs" / "slow_bench.log").exists()

    # a second run of one script keeps the others' entries in the manifest
    run_all.main(["--json-dir", str(out), "--only", "fast", "--budget", "1000"])
    manifest = json.loads((out / run_all.MANIFEST).read_text())
    assert sorted(entry["script"] for entry in manifest["scripts"]) == ["failing_bench", "fast_bench", "slow_bench"]
    # no budget left: nothing runs
    run_all.main(["--json-dir", str(out), "--only", "fast", "--budget", "0.001"])
    manifest = json.loads((out / run_all.MANIFEST).read_text())
    assert {e["script"]: e["status"] for e in manifest["scripts"]}["fast_bench"] == "not run: the budget was spent"


def test_run_all_names_a_missing_benchmark_dependency(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A machine without the 'bench' extra gets one line, not an import traceback."""
    monkeypatch.setattr(run_all, "SCRIPTS", (run_all.Script("bench_x", (), None, module="no_such_benchmark_module"),))
    with pytest.raises(SystemExit) as stop:
        run_all.main(["--plan"])
    assert stop.value.code == 2
    assert (
        "run_all: cannot import the benchmarks: No module named 'no_such_benchmark_module'" in capsys.readouterr().err
    )


# ---------------------------------------------------------------------------------------------
# The report (docs/benchmarks.md)


def _fixture_docs() -> list[dict[str, object]]:
    return results.load(FIXTURE)


def test_report_from_the_fixture(tmp_path: Path) -> None:
    out = tmp_path / "docs" / "benchmarks.md"
    text = report.generate(FIXTURE, out, with_plots=False)
    assert out.read_text() == text
    lines = text.splitlines()
    assert lines[0] == "# Benchmarks" and len(lines) <= report.MAX_LINES
    assert not (tmp_path / "docs" / "benchmarks").exists() and "![" not in text  # no plots asked for
    # the introduction: device, driver, versions, how to reproduce
    assert "- **Device**: Fake GPU (compute capability 9.0, 132 SMs)" in lines
    assert "- **NVIDIA driver**: 000.00" in lines
    assert "- **Software**: torch 2.11.0, triton 3.6.0, CUDA (torch build) 13.0, apache-tvm-ffi 0.1.15, " in text
    assert "python -m jit_kernel.benchmark.run_all --json-dir docs/benchmarks/data" in lines
    assert "python -m jit_kernel.benchmark.report --json-dir docs/benchmarks/data --output docs/benchmarks.md" in lines
    # one section per script, in the families' order, each with its command (results folder as DIR)
    sections = [line for line in lines if line.startswith("## ")]
    assert sections == [
        "## Summary",
        "## Norms",
        "## Gated activations",
        "## hicache KV-cache transfers",
        "## Dispatch overhead",
        "## Not in this run",
    ]
    assert "`JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_norm --json-dir DIR`" in lines
    # provider tables: ours, % of copy, vs empty on decode rows, each peer with its ratio to ours, the copy
    assert (
        "| tokens | D | jit_kernel us | % of copy | vs empty | torch eager us | torch.compile us "
        "| jit_kernel, PDL off us | copy us |" in lines
    )
    assert "| 16 | 4096 | 2.00 | 125% | 1.60x | 8.00 (4.00x) | 5.00 (2.50x) | 2.40 (1.20x) | 2.50 |" in lines
    assert "| 4096 | 4096 | 40.0 | 90% |  | 120.0 (3.00x) | 50.0 (1.25x) | 41.0 (1.02x) | 36.0 |" in lines
    assert "| silu_and_mul | 4096x2x14336 | 130.0 | 92% |  | 400.0 (3.08x) | 140.0 (1.08x) | n/a | 120.0 |" in lines
    # the summary: decode time and ratio to the empty kernel, prefill share of the copy, fastest peer
    assert "| rmsnorm | 2.00 | 1.60x | 90% | 2.50x | 1.25x |" in lines
    assert "| activation | 3.00 | 2.00x | 92% | 1.20x | 1.08x |" in lines
    # tables kept as printed, partial runs and scripts that did not run
    assert "| d2d | 1024 | 100.3 | 200.2 | 398.4 | 3244.8 | 2773.2 |" in lines
    assert "_The script stopped at its time bound: the rows below are those it measured._" in lines
    assert "_No rows measured._" in lines
    assert "- bench_first_call: not run: the budget was spent" in lines
    assert text == report.render(_fixture_docs(), report._manifest(FIXTURE))


def test_report_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "docs" / "benchmarks.md"
    plots = tmp_path / "docs" / "benchmarks" / "plots"
    plots.mkdir(parents=True)
    (plots / "stale.png").write_bytes(b"old")
    text = report.generate(FIXTURE, out)
    assert sorted(p.name for p in plots.iterdir()) == ["activation.png", "hicache.png", "norm.png"]
    for name in ("activation", "hicache", "norm"):
        assert (plots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(benchmarks/plots/{name}.png)" in text
    # the text does not depend on whether matplotlib drew: the same links from the data alone
    assert text == report.render(_fixture_docs(), report._manifest(FIXTURE), plots="benchmarks/plots")


def test_report_plots_the_model_decode_tables(tmp_path: Path) -> None:
    """bench_model's cells tables: a plot exactly when a decode table has rows; "n/a" cells are gaps."""
    header = [
        "mode",
        "batch",
        "unpatched us",
        "jit_kernel us",
        "jit_kernel speedup",
        "FlashInfer us",
        "FlashInfer speedup",
    ]
    rows = [
        ["eager", 1, "6547.6", "4150.8", "1.58x", "n/a", "n/a"],
        ["graph", 1, "1570.3", "1288.9", "1.22x", "1306.9", "1.20x"],
    ]
    decode = {"kind": "cells", "name": "llama_decode", "title": "decode", "header": header, "rows": rows}
    prefill = {"kind": "cells", "name": "llama_prefill", "title": "prefill", "header": header[1:], "rows": [[1024]]}
    doc = {"script": "bench_model", "tables": [prefill, decode]}
    assert report.has_plot(doc)
    assert not report.has_plot({"script": "bench_model", "tables": [prefill, {**decode, "rows": []}]})
    pytest.importorskip("matplotlib")
    path = tmp_path / "model.png"
    assert report.plot_model_decode(doc, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_fits_in_the_line_budget_on_the_full_grids(load_bench: Callable[[str, bool], ModuleType]) -> None:
    """Every script's full grid, every row measured: the document stays within its line budget."""
    docs = []
    for name in ("bench_norm", "bench_quant", "bench_elementwise", "bench_activation", "bench_rope",
                 "bench_kv_store", "bench_token_quant"):  # fmt: skip
        module = load_bench(name, False)
        measured = Measurements(lambda key, provider, make: 1.0)
        for table in module.summary_tables():
            for key, *_ in table.configs:
                for provider in table.providers:
                    measured.time(key, provider, lambda: lambda: None)
        tables = _tables.tables_json(module.summary_tables(), measured, 1.0)
        docs.append(results.document(name, "s", "c", tables, environment_info=FAKE_ENVIRONMENT))
    cells = [["d2h", 1024, 4096, 4, "1.0", "1.0", "1%", "1.0", "1.0", "1.0x"]] * 36
    docs.append(results.document("bench_hicache", "s", "c", [results.cells_table("one_layer", "t", ["h"] * 10, cells)],
                                 environment_info=FAKE_ENVIRONMENT))  # fmt: skip
    text = report.render(docs, None, plots="benchmarks/plots")
    assert text.count("\n") <= report.MAX_LINES


HISTORY = re.compile(r"\b(issue|session|call|probe|seed) \d", re.IGNORECASE)


def test_report_text_has_no_development_history() -> None:
    text = report.render(_fixture_docs(), report._manifest(FIXTURE), plots="benchmarks/plots")
    assert not HISTORY.search(text)


def test_committed_doc_is_the_generators_output() -> None:
    """docs/benchmarks.md is generated from docs/benchmarks/data, and each plot it links exists."""
    data = REPO / "docs" / "benchmarks" / "data"
    docs = results.load(data) if data.is_dir() else []
    if not docs:
        pytest.skip("no benchmark results committed in docs/benchmarks/data yet")
    committed = (REPO / "docs" / "benchmarks.md").read_text()
    plots = "benchmarks/plots" if "](benchmarks/plots/" in committed else None
    assert committed == report.render(docs, report._manifest(data), plots=plots)
    for link in re.findall(r"\]\((benchmarks/plots/[^)]+)\)", committed):
        assert (REPO / "docs" / link).is_file(), link


def test_report_and_run_all_help_run_without_a_gpu() -> None:
    for module in ("report", "run_all"):
        result = subprocess.run(
            [sys.executable, "-m", f"jit_kernel.benchmark.{module}", "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": source_pythonpath()},
            check=False,
        )
        assert result.returncode == 0 and "--json-dir" in result.stdout, result.stderr


def test_stoppable_remembers_an_interrupt_that_became_another_error() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with results.stoppable():
        assert not results.stop_requested()
        with pytest.raises(RuntimeError):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt as interrupt:  # as a CUDA-graph capture's clean-up might
                raise RuntimeError("capture invalidated") from interrupt
        assert results.stop_requested()
        with pytest.raises(KeyboardInterrupt):
            results.check_stop()
        # the next measurement does not start
        with pytest.raises(KeyboardInterrupt):
            Measurements(lambda key, provider, make: 1.0).time("k", "jit", lambda: lambda: None)
    assert signal.getsignal(signal.SIGINT) is previous
    assert not results.stop_requested()
    results.check_stop()  # nothing left over for code run outside the block


@pytest.mark.parametrize("swallowed", [False, True])
def test_a_perf_report_script_stopped_mid_run_writes_its_rows(
    load_bench: Callable[[str, bool], ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    swallowed: bool,
) -> None:
    """SIGINT in the middle of a measurement: the rows measured before it are written, marked
    incomplete, whether the interrupt arrives as KeyboardInterrupt, as another error, or is
    swallowed by a baseline's error handling (the next measurement stops)."""
    pytest.importorskip("matplotlib")
    module = load_bench("bench_quant", True)
    calls: list[str] = []

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append(provider)
        if len(calls) == 6:  # the first config's five providers are done
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except KeyboardInterrupt as interrupt:
                if swallowed:
                    return NAN
                raise RuntimeError("capture invalidated") from interrupt
        return FAKE_US[provider]

    monkeypatch.setattr(module, "RESULTS", Measurements(timer))
    monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(results, "environment", lambda: FAKE_ENVIRONMENT)
    monkeypatch.delenv(SAVE_PATH_ENV, raising=False)
    with pytest.raises(SystemExit) as stopped:
        module.main(["--json-dir", str(tmp_path)])
    assert stopped.value.code == 130
    assert "interrupted: the tables hold what was measured before the stop" in capsys.readouterr().out
    doc = json.loads((tmp_path / "bench_quant.json").read_text())
    assert doc["complete"] is False and doc["empty_kernel_us"] is None
    [table] = doc["tables"]
    assert table["rows"][0]["key"] == ["bfloat16", "16x4096"]
    assert table["rows"][0]["us"]["jit"] == 10.0


def test_report_marks_a_section_from_another_run() -> None:
    docs = _fixture_docs()
    older = next(doc for doc in docs if doc["script"] == "bench_dispatch")
    older["date"], older["environment"] = "1999-12-31", {**older["environment"], "commit": "1111111"}
    text = report.render(docs, None)
    dispatch = text[text.index("## Dispatch overhead") :]
    assert "_From another run than the other sections: 1999-12-31, commit 1111111._" in dispatch
    assert text.count("_From another run") == 1


def test_bench_dispatch_failing_peer_is_its_cell_not_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.benchmark import bench_dispatch

    def failing_peer() -> None:
        raise RuntimeError("MissingJITCacheError: norm")

    op = bench_dispatch.OPS["add_constant (out=)"]
    monkeypatch.setitem(bench_dispatch.OPS, "with a failing peer", lambda inputs: (*op(inputs)[:2], failing_peer))
    [row] = bench_dispatch.eager_rows(["with a failing peer"], "cpu", calls=5, repeats=1)
    assert float(row[1]) > 0 and float(row[2]) > 0  # our timing survives
    assert row[5] == "error: RuntimeError: MissingJITCacheError: norm"
    assert bench_dispatch.peer("no_such_module", "f") is None


def test_bench_decode_linear_fp8_main_writes_its_tables_and_targets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """bench_decode_linear_fp8.main with a fake timer (the read at 4,000 GB/s; jit_kernel at 125% of
    each weight's ceiling time, _scaled_mm 1.5x ours, but 0.8x on Llama-3-8B's o): every row measured
    once after the read, the tables per model and the two targets in the JSON, as report.py renders."""
    module = pytest.importorskip("jit_kernel.benchmark.bench_decode_linear_fp8")
    shapes = {(model, layer): (n, k) for model, layers in module.MODELS.items() for layer, n, k in layers}
    calls: list[tuple[Hashable, str]] = []

    def timer(key: Hashable, provider: str, make: Callable[[], Callable[[], object]]) -> float:
        calls.append((key, provider))
        if key == _tables.READ_KEY:
            return _tables.READ_BYTES / 4e6
        _, model, layer, _ = key  # type: ignore[misc]
        n, k = shapes[(model, layer)]
        ours = 1.25 * module.weight_bytes(n, k) / 4e6 * module.copies(n, k)
        if provider == "jit":
            return ours
        return (0.8 if (model, layer) == ("Llama-3-8B", "o") else 1.5) * ours

    doc = _main_with_fake_timer(module, monkeypatch, tmp_path, Measurements(timer), "bench_decode_linear_fp8")
    rows = len(module.ROWS)
    assert len(calls) == len(set(calls)) == 1 + 2 * rows * len(shapes) and calls[0] == (_tables.READ_KEY, "read")
    assert [t["name"] for t in doc["tables"]] == ["deepseek-v3", "qwen3-8b-fp8", "llama-3-8b", "targets"]
    tables = {t["name"]: t for t in doc["tables"]}
    o_row = tables["llama-3-8b"]["rows"][rows]  # o, the first row count
    ceiling = module.weight_bytes(4096, 4096) / 4e3 / 1e3
    assert o_row[:4] == ["o", "4096 x 4096", f"{module.weight_bytes(4096, 4096) / 1e6:.1f}", module.ROWS[0]]
    assert o_row[4:] == [f"{1.25 * ceiling:.2f}", f"{1.0 * ceiling:.2f}", "0.80x", f"{ceiling:.2f}", "80%"]
    share, versus = tables["targets"]["rows"]
    n = str(rows * len(shapes))
    assert share == [share[0], n, f"{n} of {n}", share[3], "80%"]
    assert versus[1:] == [n, f"{int(n) - rows} of {n}", f"Llama-3-8B o, rows {module.ROWS[0]}", "0.80x"]
    assert doc["notes"] and "GB/s" in doc["notes"][0]
    section = report.render([*_fixture_docs(), doc], None)
    section = section[section.index("## Decode GEMMs: decode_linear_fp8") :]
    assert "python -m jit_kernel.benchmark.bench_decode_linear_fp8 --json-dir DIR`" in section
    assert "| o | 4096 x 4096 |" in section and "targets, checked on this run" in section
    assert "bench_decode_linear_fp8" in [script.name for script in run_all.SCRIPTS]
    assert "device: Fake GPU" in capsys.readouterr().out
