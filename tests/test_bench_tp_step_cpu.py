"""bench_tp_step without a GPU: its arguments, the per-rank shapes of the sharding, the checks, the
table from fake measurements, the JSON it writes, the import and the exit without a GPU, and one
decode step at small sizes with torch stand-ins for the kernels, against a float32 Llama layer
written here. The GPU tests run the script with 2 ranks on one GPU, and with one rank on each of
2 GPUs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from jit_helpers import source_pythonpath
from jit_kernel.benchmark import bench_tp_step as bench
from jit_kernel.benchmark import results, run_all
from jit_kernel.benchmark.bench_allreduce import Timing
from jit_kernel.benchmark.bench_tp_step import Shard, StepInfo

REPO = Path(__file__).resolve().parents[1]
NAN = math.nan


# ---------------------------------------------------------------------------------------------
# Import, arguments


def test_import_does_not_touch_cuda_and_without_a_gpu_it_exits_0() -> None:
    """A real process that sees no GPU (even on a GPU host): the import leaves CUDA alone, and the
    script says why it measures nothing and returns (exit status 0)."""
    code = "import torch, jit_kernel.benchmark.bench_tp_step as b; assert not torch.cuda.is_initialized(); b.main([])"
    env = {**os.environ, "PYTHONPATH": source_pythonpath(), "CUDA_VISIBLE_DEVICES": ""}
    for name in ("RANK", "WORLD_SIZE"):
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bench_tp_step: no CUDA device; nothing measured", result.stdout + result.stderr


def test_arguments() -> None:
    args = bench.parse_args([])
    assert (args.layers, args.context, args.batches, args.world, args.calls, args.reps) == (
        2,
        1024,
        [1, 8, 32],
        *[None] * 3,
    )
    assert args.json_dir is None and args.time_limit == 1200.0
    args = bench.parse_args(["--layers", "4", "--context=4096", "--batches", "1,16", "--world", "8", "--calls", "3"])
    assert (args.layers, args.context, args.batches, args.world, args.calls) == (4, 4096, [1, 16], 8, 3)
    bad = [["--layers", "0"], ["--context", "0"], ["--batches", "0"], ["--batches", "a,b"], ["--batches", ","]]
    bad += [["--world", "3"], ["--world", "0"], ["--reps", "0"], ["--nope"]]
    for argv in bad:
        with pytest.raises(SystemExit) as stop:
            bench.parse_args(argv)
        assert stop.value.code == 2, argv


def test_world_that_does_not_split_the_heads_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--world", "3"])
    assert "--world: world size 3" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Sharding


@pytest.mark.parametrize(
    ("world", "heads", "kv_heads", "replicas", "intermediate"),
    [(1, 64, 8, 1, 28672), (2, 32, 4, 1, 14336), (4, 16, 2, 1, 7168), (8, 8, 1, 1, 3584), (16, 4, 1, 2, 1792)],
)
def test_per_rank_shapes(world: int, heads: int, kv_heads: int, replicas: int, intermediate: int) -> None:
    s = bench.shard(world)
    assert s == Shard(world, heads, kv_heads, replicas, intermediate)
    assert s.weight_shapes() == {
        "qkv": ((heads + 2 * kv_heads) * 128, 8192),
        "o": (8192, heads * 128),
        "gate_up": (2 * intermediate, 8192),
        "down": (8192, intermediate),
    }
    assert s.kv_cache_shape(32, 1024) == (32, kv_heads, 1024, 128)
    # Row-parallel shards put together give the whole layer; so do the column-parallel ones (KV
    # heads: each replicated on `replicas` ranks).
    assert world * s.heads == 64 and world * s.kv_heads == 8 * replicas and world * s.intermediate == 28672
    assert s.heads % s.kv_heads == 0  # whole query-head groups per KV head


def test_per_rank_weight_bytes() -> None:
    layer = 8192 * (64 + 16) * 128 + 8192 * 64 * 128 + 3 * 8192 * 28672  # Llama-3-70B, one layer
    for world in (1, 2, 4, 8):
        assert bench.shard(world).weight_bytes() == 2 * layer // world
    # Above 8 ranks each rank keeps a whole KV head (replicated), more than 1 / W of k and v.
    assert bench.shard(16).weight_bytes() == 2 * (layer - 8192 * 16 * 128) // 16 + 2 * 8192 * 2 * 128


@pytest.mark.parametrize("world", [0, 3, 5, 6, 7, 12, -2])
def test_shard_refuses_uneven_splits(world: int) -> None:
    with pytest.raises(ValueError, match="world size"):
        bench.shard(world)


def test_decode_linear_kernel_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    # decode_linear's own rule: up to 16 rows and 128 MiB of weight run its kernel.
    if not torch.cuda.is_available():  # the launcher's rule, in the kernel built for sm_90a
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    assert bench.kernel_linears(bench.shard(2), 1) == ["qkv", "o"]  # gate_up 448 MiB, down 224 MiB: cuBLAS
    assert bench.kernel_linears(bench.shard(4), 8) == ["qkv", "o", "down"]
    assert bench.kernel_linears(bench.shard(8), 16) == ["qkv", "o", "gate_up", "down"]
    assert bench.kernel_linears(bench.shard(8), 32) == []
    assert bench.linears_cell([]) == "none (cuBLAS)" and bench.linears_cell(["qkv", "o"]) == "qkv, o"


def test_max_bytes() -> None:
    assert bench.max_bytes([1, 8, 32]) == 32 * 8192 * 2
    assert bench.max_bytes([1]) == 16384


# ---------------------------------------------------------------------------------------------
# Checks


def test_bits_and_close_checks() -> None:
    a = torch.randn(4, 8).to(torch.bfloat16)
    b = a.clone()
    assert bench.bits_check([a, a], [b, b], "unfused") == "bits = unfused"
    b[0, 0] += 1
    assert bench.bits_check([a, a], [b, a], "unfused") == "WRONG: 1 of 64 elements differ from unfused"
    near = (a.float() * (1 + 1e-3)).to(torch.bfloat16)
    assert bench.close_check([near], [a], "ours").startswith("close to ours (rel ")
    assert bench.close_check([-a], [a], "ours") == "WRONG: not close to ours (rel 2.0e+00)"
    inf = a.clone()
    inf[1, 1] = float("inf")
    assert bench.close_check([inf], [a], "ours") == "WRONG: not close to ours (rel inf)"


def test_merge_checks_reports_every_rank_that_is_wrong() -> None:
    fine = {"fused": "bits = unfused", "nccl": "close to ours (rel 1.0e-03)"}
    assert bench.merge_checks([fine, fine]) == fine
    wrong = {"fused": "WRONG: ranks differ", "nccl": "close to ours (rel 1.0e-03)"}
    merged = bench.merge_checks([fine, wrong, wrong])
    assert merged == {"fused": "rank 1: WRONG: ranks differ; rank 2: WRONG: ranks differ", "nccl": fine["nccl"]}


# ---------------------------------------------------------------------------------------------
# Tables from fake measurements

INFO = StepInfo(world=2, gpus=2, shared=False, steps=20, reps=50, layers=2, context=1024, custom_path="custom kernels")
SHARED = "ranks share a GPU (NCCL refuses two ranks on one device)"


def fake_results() -> dict[tuple[int, str], Timing]:
    return {
        (1, "nccl"): Timing(400.0, 410.0, check="close to ours (rel 2.1e-03)"),
        (1, "fused"): Timing(320.0, 330.0, check="bits = unfused, same on every rank, replay: bits = eager"),
        (1, "unfused"): Timing(340.0, 345.0, check="replay: bits = eager"),
        (32, "nccl"): Timing.missing("rank 1: RuntimeError: NCCL error"),
        (32, "fused"): Timing(500.0, 520.0, check="rank 1: WRONG: ranks differ"),
        (32, "unfused"): Timing(NAN, NAN, reason="rank 0: ValueError: bad"),
    }


def test_rows_from_fake_measurements() -> None:
    rows = bench.step_rows(fake_results(), [1, 8, 32], INFO)
    assert len(rows) == 2  # batch 8 has no measurement: no row
    assert rows[0] == [
        1,
        "400.00 (410.00)",
        "320.00 (330.00)",
        "340.00 (345.00)",
        "1.25x",
        "1.06x",
        "qkv, o",
        "baseline: close to ours (rel 2.1e-03); ours: bits = unfused, same on every rank, replay: bits = eager; "
        "ours unfused: replay: bits = eager",
    ]
    assert rows[1][:7] == [32, "n/a", "500.00 (520.00)", "n/a", "n/a", "n/a", "none (cuBLAS)"]
    assert "ours: rank 1: WRONG: ranks differ" in rows[1][7]


def test_output_markdown_json_and_notes() -> None:
    markdown, tables, notes = bench.output(fake_results(), INFO, [1, 8, 32])
    assert markdown.count("### ") == 1
    assert markdown.startswith("### TP=2 decode step, 2 Llama-3-70B layers (per rank: 32 query heads, 4 KV heads")
    assert (
        "| batch | baseline us | ours us | ours-unfused us | baseline / ours | unfused / fused | "
        "decode_linear kernel for | checks |" in markdown
    )
    assert notes[:2] == [bench.RATIO_NOTE, bench.STEP_NOTE] and bench.SHARED_NOTE not in notes
    assert "baseline: not measured: rank 1: RuntimeError: NCCL error" in notes
    assert "ours unfused: not measured: rank 0: ValueError: bad" in notes
    assert all(f"- {note}" in markdown for note in notes)
    (table,) = tables
    assert table["kind"] == "cells" and table["name"] == "tp2" and table["header"] == bench.HEADER
    assert len(table["rows"]) == 2
    shared = StepInfo(2, 1, True, 5, 10, 1, 64, "custom kernels")
    assert bench.SHARED_NOTE in bench.output({(1, "nccl"): Timing.missing(SHARED)}, shared, [1])[2]
    line = bench.header_line(shared)
    assert line.startswith("2 ranks on 1 GPU(s); 5 steps per CUDA graph, median of 10 replays") and "falls" not in line
    fallback = bench.header_line(dataclass_replace(shared, custom_path="no peer access (P2P)"))
    assert "CustomAllReduce falls back to torch.distributed (no peer access (P2P))" in fallback


def dataclass_replace(info: StepInfo, **changes: object) -> StepInfo:
    import dataclasses

    return dataclasses.replace(info, **changes)  # type: ignore[arg-type]


def test_write_output_prints_and_writes_one_file_per_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    for name in results.GRID_ENV:
        monkeypatch.delenv(name, raising=False)
    argv = ["--json-dir", str(tmp_path / "json"), "--save-path", str(tmp_path / "out"), "--batches", "1,32"]
    args = bench.parse_args(argv)
    bench.write_output(args, argv, fake_results(), INFO, complete=True)
    printed = capsys.readouterr().out
    assert "device: Fake GPU; torch " in printed and "2 ranks on 2 GPU(s); 20 steps per CUDA graph" in printed
    assert "interrupted" not in printed
    assert (tmp_path / "out" / "bench_tp_step_tp2.md").read_text().startswith("device: Fake GPU")
    doc = json.loads((tmp_path / "json" / "bench_tp_step_tp2.json").read_text())
    assert doc["script"] == "bench_tp_step_tp2" and doc["complete"] is True
    assert doc["command"].startswith("python -m jit_kernel.benchmark.bench_tp_step --json-dir")
    assert doc["summary"].startswith("A tensor-parallel decode step: ``--layers`` Llama-3-70B-shaped decoder layers")
    assert [len(t["rows"]) for t in doc["tables"]] == [2]
    assert results.load(tmp_path / "json")[0]["script"] == "bench_tp_step_tp2"


# ---------------------------------------------------------------------------------------------
# Without a GPU


def test_main_without_cuda_says_why_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RANK", raising=False)
    bench.main([])  # the launcher: no ranks started
    assert "bench_tp_step: no CUDA device; nothing measured" in capsys.readouterr().out
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    bench.main([])  # a rank under torchrun
    assert "bench_tp_step: no CUDA device; nothing measured" in capsys.readouterr().out


def test_main_refuses_a_default_world_that_does_not_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match=r"world size 3.*pass --world 2, 4 or 8"):
        bench.main([])


def test_not_in_run_all() -> None:
    assert not [s for s in run_all.SCRIPTS if s.name.startswith("bench_tp_step")]  # it needs several GPUs


# ---------------------------------------------------------------------------------------------
# One step at small sizes: torch stand-ins for the kernels, against a float32 Llama layer


@pytest.fixture
def small_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Llama-shaped, small: hidden 64, 8 query heads and 2 KV heads of 16, intermediate 96; the
    step's kernels replaced by torch code (on the CPU)."""
    import jit_kernel

    for name, value in {"HIDDEN": 64, "HEADS": 8, "KV_HEADS": 2, "HEAD_DIM": 16, "INTERMEDIATE": 96}.items():
        monkeypatch.setattr(bench, name, value)

    def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(weight.dtype)

    def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        residual.copy_((x.float() + residual.float()).to(x.dtype))
        x.copy_(norm(residual, weight, eps))

    def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, size: int, cache: torch.Tensor) -> None:
        cos, sin = cache[positions].chunk(2, dim=-1)
        for t in (q, k):
            heads = t.view(t.shape[0], -1, size).float()
            a, b = heads.chunk(2, dim=-1)
            c, s = cos[:, None], sin[:, None]
            t.view(t.shape[0], -1, size).copy_(torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(t.dtype))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        assert bool((seq_lens == k.shape[2]).all())
        group = q.shape[1] // k.shape[1]
        k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
        scores = torch.einsum("bhd,bhld->bhl", q.float(), k) * q.shape[-1] ** -0.5
        return torch.einsum("bhl,bhld->bhd", scores.softmax(-1), v).to(q.dtype)

    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)

    fakes = {
        "rmsnorm": norm,
        "fused_add_rmsnorm": fused_add_rmsnorm,
        "decode_linear": lambda x, w: F.linear(x, w),
        "apply_rope_with_cos_sin_cache_inplace": rope,
        "decode_attention": attention,
        "silu_and_mul": silu_and_mul,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(jit_kernel, name, fake)
    yield


def reference_step(
    model: bench.Model, embed: torch.Tensor, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor]
) -> torch.Tensor:
    """Llama decoder layers in float32 at world size 1: the new token at position context - 1."""
    dim, heads, kv_heads, context = bench.HEAD_DIM, bench.HEADS, bench.KV_HEADS, model.context
    position = context - 1
    inv_freq = 1.0 / (bench.ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    cos, sin = (f(position * inv_freq).float() for f in (torch.cos, torch.sin))

    def rotate(x: torch.Tensor) -> torch.Tensor:  # [B, H, dim], rotate-half (NeoX)
        a, b = x[..., : dim // 2], x[..., dim // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + bench.EPS) * w.float()

    batch = embed.shape[0]
    residual = embed.float()
    norms = [layer.input_norm for layer in model.layers[1:]] + [model.final_norm]
    hidden = rms(residual, model.layers[0].input_norm)
    for layer, next_norm, k_cache, v_cache in zip(model.layers, norms, k_caches, v_caches, strict=True):
        wq, wk, wv = layer.qkv.float().split([heads * dim, kv_heads * dim, kv_heads * dim])
        q = rotate((hidden @ wq.T).view(batch, heads, dim))
        k = rotate((hidden @ wk.T).view(batch, kv_heads, dim))
        keys, values = k_cache[:batch].float().clone(), v_cache[:batch].float().clone()
        keys[:, :, position] = k
        values[:, :, position] = (hidden @ wv.T).view(batch, kv_heads, dim)
        keys, values = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (keys, values))
        weights = (torch.einsum("bhd,bhld->bhl", q, keys) / math.sqrt(dim)).softmax(-1)
        attention = torch.einsum("bhl,bhld->bhd", weights, values).reshape(batch, heads * dim)
        residual = residual + attention @ layer.o.float().T
        hidden = rms(residual, layer.post_attention_norm)
        gate, up = (hidden @ layer.gate_up.float().T).chunk(2, dim=-1)
        residual = residual + (F.silu(gate) * up) @ layer.down.float().T
        hidden = rms(residual, next_norm)
    return hidden


def local_reduce_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    """World size 1's all-reduce (none), then the norm."""
    import jit_kernel

    jit_kernel.fused_add_rmsnorm(x, residual, weight, bench.EPS)


@pytest.mark.usefixtures("small_model")
def test_one_step_is_a_llama_decode_step() -> None:
    model = bench.Model(bench.shard(1), layers=2, context=8, max_batch=4, rank=0, device=torch.device("cpu"))
    inputs = model.inputs(3)
    k_caches = [layer.k_cache.clone() for layer in model.layers]
    v_caches = [layer.v_cache.clone() for layer in model.layers]
    expected = reference_step(model, inputs.embed, k_caches, v_caches)
    hidden, residual = model.step(inputs, local_reduce_norm)
    assert hidden.shape == (3, 64) and residual.shape == (3, 64) and hidden.dtype == torch.bfloat16
    assert bench.relative_error(hidden, expected) < 3e-2
    # The step wrote its token's K and V at position context - 1 of the first 3 sequences only.
    for layer, k_before in zip(model.layers, k_caches, strict=True):
        assert torch.equal(layer.k_cache[:, :, :7], k_before[:, :, :7]) and torch.equal(layer.k_cache[3], k_before[3])
        assert not torch.equal(layer.k_cache[:3, :, 7], k_before[:3, :, 7])
    # A second step from the same input gives the same bits (a replayed graph's premise).
    again, _ = model.step(inputs, local_reduce_norm)
    assert torch.equal(again, hidden)


@pytest.mark.usefixtures("small_model")
@pytest.mark.parametrize("world", [2, 8])
def test_sharded_step_shapes(world: int) -> None:
    """Each rank's step runs at its shard's shapes (the all-reduce left out: a local sum)."""
    s = bench.shard(world)
    model = bench.Model(s, layers=1, context=4, max_batch=2, rank=1, device=torch.device("cpu"))
    layer = model.layers[0]
    assert layer.qkv.shape == s.weight_shapes()["qkv"] and layer.down.shape == s.weight_shapes()["down"]
    assert layer.k_cache.shape == s.kv_cache_shape(2, 4)
    hidden, _ = model.step(model.inputs(2), local_reduce_norm)
    assert hidden.shape == (2, 64) and bool(torch.isfinite(hidden.float()).all())


class OneRankComm:
    """CustomAllReduce at world size 1, on the CPU: the sum is the input; the fused form the norm."""

    def all_reduce(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(x)

    def all_reduce_fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float
    ) -> None:
        import jit_kernel

        jit_kernel.fused_add_rmsnorm(x, residual, w, eps)


class OneRankDist:
    def all_reduce(self, x: torch.Tensor, group: object = None) -> None:
        if group is None:  # the gloo reference: float32 copies
            assert x.dtype == torch.float32


def cpu_rank(skip: dict[str, str], flip_unfused: bool = False) -> bench.TPRank:
    """A TPRank whose collectives are one rank's, on the CPU (checks only; no graphs)."""
    state = bench.TPRank.__new__(bench.TPRank)
    state.rank, state.world, state.device = 0, 1, torch.device("cpu")
    state.dist, state.comm, state.nccl, state.skip = OneRankDist(), OneRankComm(), object(), dict(skip)
    state.model = bench.Model(bench.shard(2), layers=1, context=4, max_batch=2, rank=0, device=state.device)
    state.gather = lambda value: [value, value]  # type: ignore[method-assign]

    def attempt(fn: object) -> str | None:
        fn()  # type: ignore[operator]
        return None

    state.attempt = attempt  # type: ignore[method-assign]
    if flip_unfused:
        reduce_norm = state.reduce_norm

        def flipped(provider: str) -> bench.ReduceNorm:
            inner = reduce_norm(provider)
            if provider != "unfused":
                return inner

            def wrong(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> None:
                inner(x, residual, w)
                x.view(-1)[0] += 1

            return wrong

        state.reduce_norm = flipped  # type: ignore[method-assign]
    return state


@pytest.mark.usefixtures("small_model")
def test_checks_of_the_eager_steps() -> None:
    checks, outputs = cpu_rank({}).check(2)
    assert checks == {"fused": "bits = unfused, same on every rank", "nccl": "close to ours (rel 0.0e+00)"}
    assert set(outputs) == {"nccl", "fused", "unfused"}
    checks, outputs = cpu_rank({"nccl": "ranks share a GPU"}).check(2)  # the gloo reference instead
    assert checks["fused"].startswith("bits = unfused, same on every rank, close to torch.distributed (gloo) (rel ")
    assert "nccl" not in checks and "nccl" not in outputs
    checks, _ = cpu_rank({}, flip_unfused=True).check(2)
    assert checks["fused"].startswith("rank 0: WRONG: ") and "of 256 elements differ from unfused" in checks["fused"]
    assert "; rank 1: WRONG: " in checks["fused"]  # every rank's verdict (the fake gathers rank 0's twice)


# ---------------------------------------------------------------------------------------------
# On GPUs


def run_script(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": source_pythonpath()}
    command = [sys.executable, "-m", "jit_kernel.benchmark.bench_tp_step", *args, "--layers", "1", "--batches", "1,8"]
    command += ["--calls", "2", "--reps", "3", "--json-dir", str(tmp_path), "--time-limit", "500"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WRONG" not in result.stdout, result.stdout
    return result, json.loads((tmp_path / "bench_tp_step_tp2.json").read_text())


@pytest.mark.gpu
def test_two_ranks_on_one_gpu(tmp_path: Path) -> None:
    result, doc = run_script(tmp_path, "--world", "2", "--ranks-per-gpu", "2")
    assert (
        "checks, batch 1: ours: bits = unfused, same on every rank, close to torch.distributed (gloo)" in result.stdout
    )
    assert doc["complete"] is True
    (table,) = doc["tables"]  # type: ignore[attr-defined]
    assert [row[0] for row in table["rows"]] == [1, 8]
    for row in table["rows"]:
        assert row[1] == "n/a" and row[2] != "n/a" and row[3] != "n/a", row  # NCCL cannot run on one GPU
        assert "ours: bits = unfused, same on every rank" in row[7] and "replay: bits = eager" in row[7], row
    assert any("share a GPU" in note for note in doc["notes"])  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_one_rank_on_each_of_two_gpus(tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _, doc = run_script(tmp_path, "--world", "2")
    (table,) = doc["tables"]  # type: ignore[attr-defined]
    for row in table["rows"]:
        assert row[1] != "n/a" and row[2] != "n/a" and row[3] != "n/a", row
        assert "baseline: close to ours" in row[7] and "ours: bits = unfused" in row[7], row
