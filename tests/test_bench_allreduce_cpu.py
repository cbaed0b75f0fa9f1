"""bench_allreduce without a GPU: its arguments, the size grids, where the ranks go, which providers
it tries, the tables from fake measurements, the JSON it writes, and the launcher starting real
ranks that find no CUDA device. One GPU test runs the script with 2 ranks on one GPU."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jit_helpers import source_pythonpath
from jit_kernel.benchmark import bench_allreduce as bench
from jit_kernel.benchmark import results, run_all
from jit_kernel.benchmark.bench_allreduce import RunInfo, Size, Timing

REPO = Path(__file__).resolve().parents[1]
NAN = math.nan


# ---------------------------------------------------------------------------------------------
# Import, grids, arguments


def test_import_does_not_touch_cuda() -> None:
    code = (
        "import torch, jit_kernel.benchmark.bench_allreduce as b; assert not torch.cuda.is_initialized(); print('ok')"
    )
    env = {**os.environ, "PYTHONPATH": source_pythonpath()}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_size_grid() -> None:
    sizes = bench.all_reduce_sizes([1, 8, 32, 128, 512, 2048])
    assert [s.nbytes for s in sizes] == [512, 16 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20, 32 << 20]
    assert [s.label for s in sizes[:2]] == ["512 B", "1 x 8192"]
    assert [s.decode for s in sizes] == [True, True, True, True, True, False, False]
    assert [s.tokens for s in bench.fused_sizes([1, 8, 32, 128])] == [1, 8, 32, 128]
    assert bench.max_bytes(sizes) == 32 << 20
    assert bench.max_bytes([Size(3, None)]) == 16  # rounded up to the kernels' 16-byte unit


def test_ci_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        monkeypatch.delenv("CI", raising=False)
        monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
        module = importlib.reload(bench)
        assert module.TOKENS == [1, 128, 2048] and module.FUSED_TOKENS == [1, 128]
        monkeypatch.delenv("JIT_KERNEL_BENCH_CI")
        module = importlib.reload(bench)
        assert module.TOKENS == [1, 8, 32, 128, 512, 2048] and module.FUSED_TOKENS == [1, 8, 32, 128]
    finally:
        monkeypatch.undo()
        importlib.reload(bench)


def test_arguments() -> None:
    args = bench.parse_args([])
    assert (args.world, args.ranks_per_gpu, args.calls, args.reps, args.warmup) == (None, None, None, None, 3)
    assert args.json_dir is None and args.save_path is None
    args = bench.parse_args(["--world", "4", "--ranks-per-gpu=2", "--calls", "8", "--json-dir", "d"])
    assert (args.world, args.ranks_per_gpu, args.calls, args.json_dir) == (4, 2, 8, "d")
    for bad in (["--world", "0"], ["--reps", "0"], ["--peer-timeout", "0"], ["--warmup", "-1"], ["--nope"]):
        with pytest.raises(SystemExit) as stop:
            bench.parse_args(bad)
        assert stop.value.code == 2


def test_timing_counts_are_smaller_where_ranks_share_a_gpu() -> None:
    assert bench.timing_counts(bench.parse_args([]), shared=False) == (20, 50)
    assert bench.timing_counts(bench.parse_args([]), shared=True) == (5, 10)
    assert bench.timing_counts(bench.parse_args(["--calls", "3", "--reps", "7"]), shared=True) == (3, 7)


# ---------------------------------------------------------------------------------------------
# Placement


@pytest.mark.parametrize(
    ("world", "per_gpu", "gpus", "expected"),
    [
        (None, None, 1, (2, 2)),  # one GPU: two ranks on it
        (None, None, 4, (4, 1)),  # one rank per GPU
        (None, 2, 4, (8, 2)),
        (4, None, 1, (4, 4)),
        (4, None, 2, (4, 2)),
        (3, None, 8, (3, 1)),
        (2, 2, 1, (2, 2)),
    ],
)
def test_plan_world_and_rank_devices_agree(
    world: int | None, per_gpu: int | None, gpus: int, expected: tuple[int, int]
) -> None:
    assert bench.plan_world(world, per_gpu, gpus) == expected
    size, planned = expected
    # The ranks get the launcher's arguments and place themselves: blocks of the planned size.
    devices = [bench.rank_device(r, size, gpus, per_gpu) for r in range(size)]
    assert devices == [r // planned for r in range(size)]
    assert max(devices) < gpus


def test_plan_world_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="no CUDA device"):
        bench.plan_world(None, None, 0)
    with pytest.raises(ValueError, match="2 to 8 ranks"):
        bench.plan_world(None, 2, 8)  # 16 ranks
    with pytest.raises(ValueError, match="2 to 8 ranks"):
        bench.plan_world(1, None, 4)
    with pytest.raises(ValueError, match="needs 4 GPUs; 2 here"):
        bench.plan_world(4, 1, 2)
    with pytest.raises(ValueError, match="would need GPU 2; 2 here"):
        bench.rank_device(4, 6, 2, 2)


def test_rank_environments() -> None:
    envs = bench.rank_environments(2, 29500, {"PATH": "/bin", "OMP_NUM_THREADS": "4"})
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    for env in envs:
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_ADDR"], env["MASTER_PORT"]) == (
            "2",
            "2",
            "127.0.0.1",
            "29500",
        )
        assert env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/bin" and env[bench.SPAWNED_ENV] == "1"


# ---------------------------------------------------------------------------------------------
# Providers


def test_providers_not_tried_where_ranks_share_a_gpu() -> None:
    skip = bench.unavailable(shared=True, nccl_built=True)
    assert set(skip) == {"nccl", "nccl_unfused", "symm_mem"}
    assert all("share a GPU" in reason for reason in skip.values())
    assert bench.unavailable(shared=False, nccl_built=True) == {}  # all tried (failures are caught then)
    no_nccl = bench.unavailable(shared=False, nccl_built=False)
    assert set(no_nccl) == {"nccl", "nccl_unfused", "symm_mem"} and "no NCCL" in no_nccl["nccl"]


# ---------------------------------------------------------------------------------------------
# Tables from fake measurements

SIZES = bench.all_reduce_sizes([1, 2048])
FUSED = bench.fused_sizes([1])
SHARED = "ranks share a GPU (NCCL refuses two ranks on one device)"


def fake_results() -> dict[tuple[str, int, str], Timing]:
    small, _, big = SIZES
    return {
        ("all_reduce", small.numel, "jit"): Timing(4.0, 5.0, check="bits"),
        ("all_reduce", small.numel, "jit_registered"): Timing(5.0, 5.5, check="bits"),
        ("all_reduce", small.numel, "nccl"): Timing(16.0, 17.0, check="close"),
        ("all_reduce", small.numel, "symm_mem"): Timing.missing("rank 1: RuntimeError: no"),
        ("all_reduce", small.numel, "empty"): Timing(2.0, 2.5),
        ("all_reduce", big.numel, "jit"): Timing(100.0, 110.0, check="WRONG: 3 of 16777216 elements"),
        ("all_reduce", big.numel, "nccl"): Timing(150.0, 150.0, check="close"),
        ("all_reduce", big.numel, "jit_registered"): Timing.missing("rank 0: ValueError: differ"),
        ("rmsnorm", FUSED[0].numel, "fused"): Timing(5.0, 6.0, check="bits = unfused"),
        ("rmsnorm", FUSED[0].numel, "unfused"): Timing(8.0, 8.0),
        ("rmsnorm", FUSED[0].numel, "nccl_unfused"): Timing.missing(SHARED),
        ("rmsnorm_fp8", FUSED[0].numel, "fused"): Timing(NAN, NAN, reason="rank 0: ValueError: bad"),
        ("rmsnorm_group_fp8", FUSED[0].numel, "fused"): Timing(6.0, 6.5, check="bits = unfused"),
        ("rmsnorm_group_fp8", FUSED[0].numel, "unfused"): Timing(9.0, 9.0),
    }


def test_cells_and_bandwidths() -> None:
    assert bench.time_cell(Timing(4.0, 5.25)) == "4.00 (5.25)"
    assert bench.time_cell(Timing.missing("x")) == "n/a" and bench.time_cell(None) == "n/a"
    assert bench.algbw(16384, 10.0) == pytest.approx(1.6384)
    assert bench.busbw(16384, 10.0, 4) == pytest.approx(1.6384 * 1.5)
    assert math.isnan(bench.algbw(16384, NAN)) and math.isnan(bench.busbw(16384, 0.0, 2))


def test_all_reduce_rows_from_fake_measurements() -> None:
    rows = bench.all_reduce_rows(fake_results(), SIZES, world=2)
    assert len(rows) == 2  # the size with no measurement has no row
    assert rows[0] == [
        "512 B",
        512,
        "4.00 (5.00)",
        "5.00 (5.50)",
        "16.00 (17.00)",
        "n/a",
        "0.80x",  # copy-in / registered
        "4.00x",
        "n/a",
        "0.1",
        "0.1",
        "2.00x",
        "jit: bits; jit_registered: bits; nccl: close",
    ]
    big = rows[1]
    assert big[:2] == ["2048 x 8192", 32 << 20]
    assert big[3] == "n/a" and big[6] == "n/a"  # the registered variant not measured
    assert big[9] == f"{(32 << 20) / 100e-6 / 1e9:.1f}" and big[9] == big[10]  # busbw = algbw at 2 ranks
    assert big[11] == ""  # no "vs empty" above decode sizes
    assert "jit: WRONG" in big[12]


def test_fused_rows_from_fake_measurements() -> None:
    rows = bench.fused_rows(fake_results(), "rmsnorm", FUSED)
    assert rows == [[1, 16384, "5.00 (6.00)", "8.00 (8.00)", "n/a", "1.60x", "n/a", "fused: bits = unfused"]]
    assert bench.fused_rows(fake_results(), "rmsnorm_fp8", FUSED)[0][2] == "n/a"
    assert bench.fused_rows({}, "rmsnorm", FUSED) == []
    group = bench.fused_rows(fake_results(), "rmsnorm_group_fp8", FUSED)
    assert group == [[1, 16384, "6.00 (6.50)", "9.00 (9.00)", "n/a", "1.50x", "n/a", "fused: bits = unfused"]]


def test_output_markdown_json_and_notes() -> None:
    info = RunInfo(world=2, gpus=1, shared=True, calls=5, reps=10, custom_path="custom kernels")
    markdown, tables, notes = bench.output(fake_results(), info, SIZES, FUSED)
    assert markdown.count("### ") == 4
    assert "all-reduce + fused_add_rmsnorm_per_token_group_quant_fp8 (fp8, groups of 128)" in markdown
    assert "| size | bytes | jit_kernel us | jit_kernel registered us | NCCL us | symm_mem one-shot us |" in markdown
    assert "all_reduce, jit_kernel registered: not measured: rank 0: ValueError: differ" in notes
    assert "| tokens | bytes | fused us | unfused us | NCCL + norm us |" in markdown
    assert notes[0] == bench.SHARED_NOTE
    assert f"rmsnorm, NCCL + norm: not measured: {SHARED}" in notes
    assert "all_reduce, symm_mem one-shot: not measured: rank 1: RuntimeError: no" in notes
    assert "rmsnorm_fp8, fused: not measured: rank 0: ValueError: bad" in notes
    assert all(f"- {note}" in markdown for note in notes)
    assert [t["name"] for t in tables] == ["all_reduce", "rmsnorm", "rmsnorm_fp8", "rmsnorm_group_fp8"]
    assert all(t["kind"] == "cells" for t in tables)
    assert tables[0]["header"] == bench.ALL_REDUCE_HEADER and len(tables[0]["rows"]) == 2
    line = bench.header_line(info)
    assert line.startswith("2 ranks on 1 GPU(s); 5 calls per CUDA graph, median of 10 replays")
    assert "falls back" not in line
    fallback = bench.header_line(RunInfo(2, 2, False, 20, 50, "no peer access (P2P) from rank 0's GPU to rank(s) [1]"))
    assert "CustomAllReduce falls back to torch.distributed (no peer access" in fallback


def test_write_output_prints_and_writes_strict_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    for name in results.GRID_ENV:  # the command line names the grid variables that are set (CI=true)
        monkeypatch.delenv(name, raising=False)
    args = bench.parse_args(["--json-dir", str(tmp_path / "json"), "--save-path", str(tmp_path / "out")])
    info = RunInfo(2, 1, True, 5, 10, "custom kernels")
    argv = ["--json-dir", str(tmp_path / "json"), "--save-path", str(tmp_path / "out")]
    bench.write_output(args, argv, fake_results(), info, SIZES, FUSED, complete=False)
    printed = capsys.readouterr().out
    assert "interrupted: the tables hold what was measured before the stop" in printed
    assert "device: Fake GPU; torch " in printed and "2 ranks on 1 GPU(s)" in printed
    assert (tmp_path / "out" / "bench_allreduce.md").read_text().startswith("interrupted")
    doc = json.loads((tmp_path / "json" / "bench_allreduce.json").read_text())
    assert doc["script"] == "bench_allreduce" and doc["complete"] is False
    assert doc["command"].startswith("python -m jit_kernel.benchmark.bench_allreduce --json-dir")
    assert doc["summary"].startswith("Tensor-parallel all-reduce: jit_kernel.distributed.CustomAllReduce")
    assert [t["name"] for t in doc["tables"]] == ["all_reduce", "rmsnorm", "rmsnorm_fp8", "rmsnorm_group_fp8"]
    assert results.load(tmp_path / "json")[0]["script"] == "bench_allreduce"


# ---------------------------------------------------------------------------------------------
# The fused forms' steps: what each form calls, fused and unfused, and what its check compares


class _Recorder:
    """Stands for the communicator and the jit_kernel ops: records each call by name."""

    def __init__(self, calls: list[tuple[str, tuple[object, ...], dict[str, object]]]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> object:
        def call(*args: object, **kwargs: object) -> None:
            self.calls.append((name, args, kwargs))

        return call


def _fused_tensors(tokens: int = 2) -> bench.FusedTensors:
    x = torch.randn(tokens, bench.HIDDEN).to(bench.DTYPE)
    q = torch.zeros(tokens, bench.HIDDEN, dtype=torch.float8_e4m3fn)
    return bench.FusedTensors(x, torch.randn_like(x), q, torch.rand(tokens, bench.HIDDEN // bench.GROUP_SIZE))


def test_each_fused_form_calls_its_fused_and_unfused_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    import jit_kernel

    calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
    ops = _Recorder(calls)
    for name in ("fused_add_rmsnorm", "fused_add_rmsnorm_quant_fp8", "fused_add_rmsnorm_per_token_group_quant_fp8"):
        monkeypatch.setattr(jit_kernel, name, getattr(ops, name))
    comm, t = _Recorder(calls), _fused_tensors()
    weight, scale = torch.ones(bench.HIDDEN, dtype=bench.DTYPE), torch.tensor([bench.FP8_SCALE])
    eps, group = bench.EPS, bench.GROUP_SIZE
    expected = {
        "rmsnorm": (
            [("all_reduce_fused_add_rmsnorm", (t.x, t.residual, weight, eps), {})],
            [("fused_add_rmsnorm", (t.x, t.residual, weight, eps), {})],
        ),
        "rmsnorm_fp8": (
            [("all_reduce_fused_add_rmsnorm_quant_fp8", (t.x, t.residual, weight, scale, eps), {"out": t.q})],
            [("fused_add_rmsnorm_quant_fp8", (t.x, t.residual, weight, scale, eps), {"out": t.q})],
        ),
        "rmsnorm_group_fp8": (
            [
                (
                    "all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8",
                    (t.x, t.residual, weight, group, eps),
                    {"output_q": t.q, "output_s": t.s},
                )
            ],
            [
                (
                    "fused_add_rmsnorm_per_token_group_quant_fp8",
                    (t.x, t.residual, weight, group, eps),
                    {"output_q": t.q, "output_s": t.s, "normed_out": t.x},
                )
            ],
        ),
    }
    assert set(expected) == set(bench.FUSED_FORMS)  # every form has its expectation here
    for form, (fused, norm) in expected.items():
        calls.clear()
        bench.fused_step(form, comm, t, weight, scale)
        assert calls == fused, form
        calls.clear()
        bench.unfused_step(form, lambda x: calls.append(("all_reduce", (x,), {})), t, weight, scale)
        assert calls == [("all_reduce", (t.x,), {}), *norm], form
    with pytest.raises(ValueError, match="unknown fused form 'nope'"):
        bench.fused_step("nope", comm, t, weight, scale)
    with pytest.raises(ValueError, match="unknown fused form"):
        bench.unfused_step("nope", lambda x: pytest.fail("no all-reduce for an unknown form"), t, weight, scale)


def test_fused_checks_compare_what_each_form_writes() -> None:
    a = _fused_tensors()

    def changed(field: str) -> bench.FusedTensors:
        b = bench.FusedTensors(a.x.clone(), a.residual.clone(), a.q.clone(), a.s.clone())
        tensor = getattr(b, field)
        tensor.view(torch.uint8).view(-1)[0] += 1  # one bit pattern of one element
        return b

    same = bench.FusedTensors(a.x.clone(), a.residual.clone(), a.q.clone(), a.s.clone())
    compared = {"rmsnorm": {"residual", "x"}, "rmsnorm_fp8": {"residual", "q"}}
    compared["rmsnorm_group_fp8"] = {"residual", "x", "q", "s"}
    assert set(compared) == set(bench.FUSED_FORMS)
    for form, fields in compared.items():
        assert bench.same_outputs(form, a, same), form
        for field in ("x", "residual", "q", "s"):
            assert bench.same_outputs(form, a, changed(field)) is (field not in fields), (form, field)
    nan = bench.FusedTensors(a.x, a.residual, a.q, torch.full_like(a.s, float("nan")))
    assert bench.same_outputs("rmsnorm_group_fp8", nan, nan)  # scales compare by their bits


# ---------------------------------------------------------------------------------------------
# Without a GPU


def test_main_without_cuda_says_why_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RANK", raising=False)
    bench.main([])  # the launcher: no ranks started
    assert "no CUDA device; nothing measured" in capsys.readouterr().out
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    bench.main([])  # a rank under torchrun
    assert "no CUDA device; nothing measured" in capsys.readouterr().out


def test_launcher_starts_every_rank_and_only_rank_0_prints(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The launcher believes it has one GPU; the ranks it starts (real processes, with RANK and
    WORLD_SIZE) find none, say so on rank 0 only, and exit 0."""
    if torch.cuda.is_available():
        pytest.skip("the ranks would find the GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "python"))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert bench.launch(bench.parse_args([]), []) == 0
    out = capfd.readouterr().out
    assert out.count("bench_allreduce: no CUDA device; nothing measured") == 1


def test_run_all_lists_the_script_with_a_fixed_estimate() -> None:
    (script,) = [s for s in run_all.SCRIPTS if s.name == "bench_allreduce"]
    assert script.fixed_estimate_s and script.module_name == "jit_kernel.benchmark.bench_allreduce"


# ---------------------------------------------------------------------------------------------
# On a GPU: two ranks on one GPU (the NCCL and symm_mem columns say why they are absent)


@pytest.mark.gpu
def test_two_ranks_on_one_gpu(tmp_path: Path) -> None:
    env = {**os.environ, "JIT_KERNEL_BENCH_CI": "1", "PYTHONPATH": source_pythonpath()}
    command = [sys.executable, "-m", "jit_kernel.benchmark.bench_allreduce", "--world", "2", "--ranks-per-gpu", "2"]
    command += ["--calls", "2", "--reps", "3", "--json-dir", str(tmp_path), "--time-limit", "500"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WRONG" not in result.stdout, result.stdout
    doc = json.loads((tmp_path / "bench_allreduce.json").read_text())
    assert doc["complete"] is True
    rows = {t["name"]: t["rows"] for t in doc["tables"]}
    assert len(rows["all_reduce"]) == 4
    assert all(len(rows[form]) == 2 for form in bench.FUSED_FORMS), rows
    # Both variants of ours timed, NCCL not; the registered one checked on its replays.
    assert all(row[2] != "n/a" and row[3] != "n/a" and row[4] == "n/a" for row in rows["all_reduce"]), rows
    assert all("jit: bits" in row[-1] and "jit_registered: bits" in row[-1] for row in rows["all_reduce"]), rows
    assert not any("copied in" in row[-1] for row in rows["all_reduce"]), rows
    fused_rows = [row for form in bench.FUSED_FORMS for row in rows[form]]
    assert all(row[2] != "n/a" and "fused: bits = unfused" in row[-1] for row in fused_rows), rows
    assert any("share a GPU" in note for note in doc["notes"])
