"""CPU tests of the norm / quant / elementwise benchmark scripts: the derived-column math of their
markdown summaries, the perf_report objects they declare, the save-path plumbing, and a whole
``main()`` run with a fake timer (no GPU: nothing is timed)."""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from jit_kernel.benchmark import _tables
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
    SAVE_PATH_ENV,
    copy_fn,
    gbps,
    get_benchmark_range,
    plot_names,
    resolve_save_path,
    run_reports,
)

NAN = float("nan")
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


@pytest.mark.parametrize("name", ["bench_norm", "bench_quant", "bench_elementwise"])
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
    out = tmp_path / "plots"
    module.main(["--save-path", str(out)])

    # every (config, provider) timed exactly once, the summary reusing those numbers
    assert len(calls) == len(set(calls)) == configs * len(SCRIPT_PROVIDERS[name])
    printed = capsys.readouterr().out
    summary = printed[printed.index("device: Fake GPU") :]
    data_rows = [line for line in summary.splitlines() if line.startswith("| ") and "jit us" not in line]
    assert len(data_rows) == configs
    for row in data_rows:
        assert "| 10.0 | 25.0 | 15.0 | 8.0 |" in row and "| 80% | 2.50x | 1.50x |" in row
    assert "empty-kernel CUDA-graph replay at the end of the run: 2.50 us" in summary
    assert (out / f"{name}.md").read_text().strip() == summary.strip()

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
# bench_dispatch: its CPU section runs for real (the add_constant host family); the GPU sections
# are skipped without CUDA.


def test_bench_dispatch_covers_every_op_and_imports_without_cuda() -> None:
    from jit_kernel.benchmark import bench_dispatch

    assert list(bench_dispatch.OPS) == [
        "rmsnorm (out=)",
        "fused_add_rmsnorm",
        "fused_inplace_qknorm",
        "qknorm_across_heads",
        "per_tensor_quant_fp8 (outputs given)",
        "scale (out=)",
        "add_constant (out=)",
        "transfer_hicache_one_layer",
    ]
    assert set(bench_dispatch.CPU_OPS) <= set(bench_dispatch.OPS)
    assert bench_dispatch.hicache_config() == (2048, 1, 1024)  # a prebuilt hicache config
    assert not torch.cuda.is_initialized()


def test_bench_dispatch_cpu_section(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from jit_kernel.benchmark import bench_dispatch

    # eager and raw compute the same thing on the benchmark's inputs
    inputs = bench_dispatch.Inputs(1, "cpu")
    eager, raw = bench_dispatch.OPS["add_constant (out=)"](inputs)
    inputs.ints_out.zero_()
    raw()
    assert torch.equal(inputs.ints_out, inputs.ints + 1)
    inputs.ints_out.zero_()
    assert eager() is inputs.ints_out
    assert torch.equal(inputs.ints_out, inputs.ints + 1)

    monkeypatch.delenv(SAVE_PATH_ENV, raising=False)
    bench_dispatch.main(["--cpu-only", "--calls", "20", "--repeats", "2", "--save-path", str(tmp_path)])
    printed = capsys.readouterr().out
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


def test_bench_dispatch_failing_op_is_an_error_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.benchmark import bench_dispatch

    def broken(inputs: object) -> tuple[Callable[[], object], Callable[[], object]]:
        raise RuntimeError("no kernel | here\nsecond line")

    monkeypatch.setitem(bench_dispatch.OPS, "broken", broken)
    rows = bench_dispatch.eager_rows(["broken", "add_constant (out=)"], "cpu", calls=5, repeats=1)
    assert rows[0] == ["broken", "error: RuntimeError: no kernel \\| here", "", "", ""]
    assert rows[1][0] == "add_constant (out=)" and float(rows[1][1]) > 0


def test_bench_versions_only_selects_matching_cases_and_the_empty_kernel() -> None:
    from jit_kernel.benchmark import bench_versions

    cases = bench_versions._cases()  # setups are not called: no CUDA needed
    names = [name for name, _, _ in bench_versions.selected(cases, "gelu_tanh|fp8 cache")]
    assert names[0].startswith("empty kernel")
    assert names[1:] and all("gelu_tanh" in name or "fp8 cache" in name for name in names[1:])
    assert {name for name, _, _ in bench_versions.selected(cases, None)} == {name for name, _, _ in cases}
    assert [name for name, _, _ in bench_versions.selected(cases, "no such case")] == [cases[0][0]]
