"""The attention family on the CPU: the sources built for sm_90a, the C++ launchers' checks on fake
CUDA tensors (nothing launches), the shapes and dtypes the ops and their fakes give (FakeTensor and
torch.compile tracing), the registered ops, the split bound and the launcher's split choice."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel.engine import families
from jit_kernel.ops import _common
from jit_kernel.ops import attention as ops

ROOT = Path(__file__).resolve().parents[1]
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
B, HQ, HKV, L, D = 2, 32, 8, 512, 128


@pytest.fixture(autouse=True)
def _sm90a(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU the launchers' checks run in kernels built for sm_90a, the ones the compile
    tests build, so that each config compiles once."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")


def _e(*shape: int, dtype: torch.dtype = BF16, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=device)


def _lens(b: int = B, dtype: torch.dtype = torch.int32, device: str = "cuda") -> torch.Tensor:
    return torch.empty(b, dtype=dtype, device=device)


def _value(v: object) -> object:
    return v() if callable(v) else v


# ---------------------------------------------------------------------------------------------
# The specs and the sm_90a build


def test_family_specs() -> None:
    assert {families.DECODE_ATTENTION, families.MERGE_ATTN_STATES} <= set(families.ALL_FAMILIES)
    assert families.DECODE_ATTENTION.prebuilt == tuple((d, t) for d in (64, 128, 256) for t in ("bf16_t", "fp16_t"))
    assert families.MERGE_ATTN_STATES.prebuilt == (("bf16_t",), ("fp16_t",), ("fp32_t",))
    assert families.DECODE_ATTENTION.sources == ("attention/decode.cuh",)
    assert families.MERGE_ATTN_STATES.sources == ("attention/merge.cuh",)


@pytest.mark.parametrize(
    ("spec", "config"),
    [(families.DECODE_ATTENTION, c) for c in families.DECODE_ATTENTION.prebuilt]
    + [(families.MERGE_ATTN_STATES, c) for c in families.MERGE_ATTN_STATES.prebuilt],
    ids=lambda v: getattr(v, "family", None) or "-".join(map(str, v)),
)
def test_prebuilt_configs_compile_for_sm90a_without_a_gpu(spec: families.KernelSpec, config: tuple) -> None:
    """Every prebuilt config's unit builds for sm_90a and exports its symbols (from the installed
    prebuilt library where it holds them; see ``assert_builds_for_arch``)."""
    assert_builds_for_arch(spec, config, "9.0a")


# ---------------------------------------------------------------------------------------------
# decode_attention: bad inputs raise errors naming the argument


def _strided_kv(pad: int) -> Callable[[], torch.Tensor]:
    """A cache whose token rows sit ``D + pad`` elements apart (a slice of wider rows)."""
    row = D + pad
    return lambda: torch.empty_strided((B, HKV, L, D), (HKV * L * row, L * row, row, 1), dtype=BF16, device="cuda")


DECODE_BAD = [
    ({"query": [1.0]}, TypeError, r"^decode_attention: query must be a torch\.Tensor, got list$"),
    ({"query": lambda: _e(B, HQ * D)}, ValueError,
     r"^decode_attention: query must have 3 dimensions \[batch, num_heads, head_dim\], got shape \(2, 4096\)$"),
    ({"query": lambda: _e(B, HQ, D, dtype=FP32)}, TypeError,
     r"^decode_attention: query must be bfloat16 or float16, got float32$"),
    ({"query": lambda: _e(B, HQ, D, dtype=torch.int8)}, TypeError,
     r"^decode_attention: query must be bfloat16 or float16, got int8$"),
    ({"query": lambda: _e(B, HQ, 96), "k_cache": lambda: _e(B, HKV, L, 96), "v_cache": lambda: _e(B, HKV, L, 96)},
     ValueError, r"^decode_attention: the head dim of query \(its last dimension\) must be one of 64, 128, 256, "
     r"got 96$"),
    ({"query": lambda: _e(B, 12, D)}, ValueError,
     r"decode_attention: the query heads \(query's dim 1: 12\) must be a multiple of the KV heads "
     r"\(k_cache's dim 1: 8\)"),
    ({"query": lambda: _e(B, HQ, D, device="cpu")}, ValueError, r"(?s)'query'.*Device mismatch: expected cuda"),
    ({"query": lambda: torch.empty_strided((B, HQ, D), (HQ * D, D, 2), dtype=BF16, device="cuda")}, ValueError,
     r"(?s)'query'.*Stride mismatch for stride#2"),
    ({"k_cache": [0]}, TypeError, r"^decode_attention: k_cache must be a torch\.Tensor, got list$"),
    ({"k_cache": lambda: _e(B, HKV, L, D, dtype=FP16)}, TypeError,
     r"(?s)'k_cache'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"k_cache": lambda: _e(B + 1, HKV, L, D)}, ValueError, r"(?s)'k_cache'.*Size mismatch for shape#0\('batch'\)"),
    ({"k_cache": lambda: _e(B, HKV, L, 64)}, ValueError, r"(?s)'k_cache'.*Size mismatch for shape#3\('head_dim'\)"),
    ({"k_cache": lambda: _e(B * HKV, L, D)}, ValueError, r"(?s)'k_cache'.*Rank mismatch: expected 4 but got 3"),
    ({"k_cache": lambda: _e(B, HKV, L, D, device="cpu")}, ValueError, r"(?s)'k_cache'.*Device mismatch"),
    ({"k_cache": lambda: torch.empty_strided((B, HKV, L, D), (HKV * L * D, L * D, 1, L), dtype=BF16, device="cuda")},
     ValueError, r"(?s)'k_cache'.*Stride mismatch for stride#3"),
    ({"k_cache": _strided_kv(4)}, ValueError, r"(?s)'k_cache'.*Misaligned stride for dim#2"),
    ({"v_cache": lambda: _e(B, HKV, L + 16, D)}, ValueError, r"(?s)'v_cache'.*Size mismatch for shape#2\('max_len'\)"),
    ({"v_cache": lambda: _e(B, 4, L, D)}, ValueError, r"(?s)'v_cache'.*Size mismatch for shape#1\('num_kv_heads'\)"),
    ({"v_cache": lambda: _e(B, HKV, L, D, dtype=FP16)}, TypeError, r"(?s)'v_cache'.*Dtype mismatch"),
    ({"seq_lens": lambda: _lens(dtype=FP32)}, TypeError,
     r"(?s)'seq_lens'.*Dtype mismatch: expected one of \[int32, int64\] but got float32"),
    ({"seq_lens": lambda: _lens(B + 1)}, ValueError, r"(?s)'seq_lens'.*Size mismatch for shape#0\('batch'\)"),
    ({"seq_lens": lambda: _lens(device="cpu")}, ValueError,
     r"(?s)'seq_lens'.*Device mismatch: expected cuda:0 but got cpu"),
    ({"seq_lens": lambda: torch.empty(B, 1, dtype=torch.int32, device="cuda")}, ValueError,
     r"(?s)'seq_lens'.*Rank mismatch"),
    ({"seq_lens": 7}, TypeError, r"^decode_attention: seq_lens must be a torch\.Tensor, got int$"),
    ({"out": lambda: _e(B, HQ, D, dtype=FP32)}, TypeError,
     r"(?s)'out'.*Dtype mismatch: expected bfloat16 but got float32"),
    ({"out": lambda: _e(B, HQ // 2, D)}, ValueError, r"(?s)'out'.*Size mismatch for shape#1\('num_heads'\)"),
    ({"out": [0]}, TypeError, r"^decode_attention: out must be a torch\.Tensor, got list$"),
    ({"scale": "0.1"}, TypeError, r"^decode_attention: scale must be a float, got str$"),
    ({"scale": float("inf")}, ValueError, r"decode_attention: scale must be a finite float, got inf"),
    ({"enable_pdl": "yes"}, TypeError, r"^decode_attention: enable_pdl must be a bool or None, got str$"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), DECODE_BAD)
def test_decode_attention_bad_inputs(overrides: dict[str, object], error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"query": _e(B, HQ, D), "k_cache": _e(B, HKV, L, D), "v_cache": _e(B, HKV, L, D), "seq_lens": _lens()}
        args |= {name: _value(v) for name, v in overrides.items()}
        positional = [args.pop(name) for name in ("query", "k_cache", "v_cache", "seq_lens")]
        with pytest.raises(error, match=match):
            jit_kernel.decode_attention(*positional, **args)


# ---------------------------------------------------------------------------------------------
# decode_attention: what valid calls return, and the launch they make


@pytest.mark.parametrize(
    ("dtype", "head_dim", "heads", "kv_heads"),
    [
        (BF16, 128, 32, 8),  # Llama-3-8B
        (FP16, 128, 32, 8),
        (BF16, 64, 8, 8),  # Hq == Hkv
        (FP16, 256, 64, 8),  # 8 query heads per KV head
        (BF16, 128, 40, 8),  # 5 per KV head: a CTA of 8 with 3 unwritten
        (BF16, 128, 64, 4),  # 16 per KV head: two chunks of 8
        (BF16, 128, 28, 4),  # 7 per KV head (Qwen2.5-7B)
    ],
)
def test_decode_attention_shapes_and_dtypes(dtype: torch.dtype, head_dim: int, heads: int, kv_heads: int) -> None:
    with fake_cuda():
        q = _e(3, heads, head_dim, dtype=dtype)
        kv = _e(3, kv_heads, 1024, head_dim, dtype=dtype)
        out = jit_kernel.decode_attention(q, kv, kv, _lens(3))
        assert out.shape == (3, heads, head_dim) and out.dtype == dtype
        out, lse = jit_kernel.decode_attention(q, kv, kv, _lens(3, torch.int64), scale=0.5, return_lse=True)
        assert out.shape == (3, heads, head_dim) and lse.shape == (3, heads) and lse.dtype == FP32


def test_decode_attention_output_forms() -> None:
    with fake_cuda():
        q, kv, lens = _e(B, HQ, D), _e(B, HKV, L, D), _lens()
        out = _e(B, HQ, D)
        assert jit_kernel.decode_attention(q, kv, kv, lens, out=out) is out
        given, lse = jit_kernel.decode_attention(q, kv, kv, lens, out=out, return_lse=True, enable_pdl=False)
        assert given is out and lse.shape == (B, HQ)
        # strided views: rows of wider buffers for the query and out, caches of padded token rows
        wide_q = torch.empty_strided((B, HQ, D), (HQ * 2 * D, 2 * D, 1), dtype=BF16, device="cuda")
        wide_out = torch.empty_strided((B, HQ, D), (HQ * D, D, 1), dtype=BF16, device="cuda")
        padded = _strided_kv(8)()
        assert jit_kernel.decode_attention(wide_q, padded, padded, lens, out=wide_out, scale=1) is wide_out
        # an empty batch, and a cache of no tokens (every length must then be 0)
        assert jit_kernel.decode_attention(_e(0, HQ, D), _e(0, HKV, L, D), _e(0, HKV, L, D), _lens(0)).shape == (
            0,
            HQ,
            D,
        )
        assert jit_kernel.decode_attention(q, _e(B, HKV, 0, D), _e(B, HKV, 0, D), lens).shape == (B, HQ, D)


def test_decode_attention_launch() -> None:
    """The launch the op makes: the outputs, the inputs as given, the scale as a float (the default
    1 / sqrt(D)); the launcher chooses the splits and allocates their workspace itself."""
    with fake_cuda():
        q, kv, lens = _e(4, HQ, D), _e(4, HKV, 4096, D), _lens(4)
        launches, out = _common.recorded_launches(lambda: jit_kernel.decode_attention(q, kv, kv, lens))
        [(_, args)] = launches
        assert args[0] is out and args[1] is None and args[2] is q and args[5] is lens
        assert type(args[6]) is float and args[6] == pytest.approx(D**-0.5)
        assert len(args) == 8


def test_launcher_checks_the_lse() -> None:
    """The launcher itself (as the op's plan calls it): an lse of [B, Hq] float32, or none."""
    kernel = ops._DECODE[(BF16, D)]
    with fake_cuda():
        q, kv, lens, out = _e(B, HQ, D), _e(B, HKV, L, D), _lens(), _e(B, HQ, D)
        kernel(out, None, q, kv, kv, lens, 0.1, None)
        kernel(out, _e(B, HQ, dtype=FP32), q, kv, kv, lens, 0.1, None)
        with pytest.raises(ValueError, match=r"(?s)'lse'.*Size mismatch"):
            kernel(out, _e(B, HQ + 1, dtype=FP32), q, kv, kv, lens, 0.1, None)


@pytest.mark.slow
def test_split_sweep_launcher_checks_its_split_count_and_merge() -> None:
    """bench_decode_attention --split-sweep's module (the launcher's run_with, built for sm_90a): the
    op's checks, then the split count (0 to kMaxSplits) and the merge (0 to 3) named when wrong."""
    from jit_kernel.benchmark import bench_decode_attention as bench

    run = bench.splits_module().run_with
    with fake_cuda():
        q, kv, lens, out = _e(B, HQ, D), _e(B, HKV, L, D), _lens(), _e(B, HQ, D)
        run(out, None, q, kv, kv, lens, 0.1, None, 16, 2)
        with pytest.raises(ValueError, match=r"num_splits must be 0 \(the launcher's choice\) to 64, got 65"):
            run(out, None, q, kv, kv, lens, 0.1, None, 65, 1)
        run(out, None, q, kv, kv, lens, 0.1, None, 16, 3)
        with pytest.raises(ValueError, match=r"merge must be 0 \(chosen\), 1 \(kernel\), 2 \(cluster\) or 3"):
            run(out, None, q, kv, kv, lens, 0.1, None, 4, 4)
        with pytest.raises(ValueError, match=r"(?s)'k_cache'.*Size mismatch"):
            run(out, None, q, _e(B + 1, HKV, L, D), kv, lens, 0.1, None, 4, 1)


def test_split_sweep_on_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bench_decode_attention --split-sweep with a fake timer: at each shape SDPA, the op and every
    split count of at least kMinSplitKeys keys with each merge (a cluster up to 16), the fastest form
    and the op's choice named, the bounds read from the header."""
    from jit_kernel.benchmark import bench_decode_attention as bench

    constants = bench.decode_constants()
    assert constants["kMinSplitKeys"] == 128 and constants["kMaxSplits"] == 64
    assert constants["kMaxClusterBlocks"] == 16
    assert bench.sweep_splits(1024) == [1, 2, 4, 8] and bench.sweep_splits(8192) == bench.SWEEP_SPLITS
    assert bench.sweep_merges(1) == ["kernel"] and bench.sweep_merges(16) == ["kernel", "cluster", "spread"]
    assert bench.sweep_merges(24) == ["kernel"]
    timed: list[tuple[object, str]] = []

    def timer(key: object, form: str, make: object) -> float:
        timed.append((key, form))
        if form in ("op", "sdpa_gqa"):
            return 10.0
        splits, merge = form.split()
        return 20.0 / int(splits) + {"kernel": 0.5, "cluster": 0.25, "spread": 0.0}[merge] + int(splits) / 8

    monkeypatch.setattr(bench, "sweep_timer", lambda rep_ms: timer)
    monkeypatch.setattr(bench, "splits_module", lambda: None)
    monkeypatch.setattr(bench, "chosen", lambda batch, context: (16, "kernel") if batch == 1 else (1, "kernel"))
    monkeypatch.setattr(bench, "device_name", lambda: "Fake GPU")
    bench.main(["--split-sweep", "--rep-ms", "5"])
    out = capsys.readouterr().out
    # per shape: SDPA and the op, then 1 + 3 x 3 forms at 1,024 tokens, 1 + 5 x 3 + 3 at the others
    assert len(timed) == len(set(timed)) == 3 * (2 + 10) + 6 * (2 + 19) == 162
    # 20 / s + s / 8 is least at 12 splits, spread (1.67 + 1.5); at 1,024 tokens 8 is the most
    assert "| 1 | 8192 | 10.00 (16 kernel) | 10.00 | 12 spread: 3.17 |" in out
    assert "| 8 | 1024 | 10.00 (1 kernel) | 10.00 | 8 spread: 3.50 |" in out
    assert "| 1 | 8192 | 16 | kernel | 3.75 (op's choice) |" in out
    assert "| 1 | 8192 | 16 | cluster | 3.50 |" in out
    assert "device: Fake GPU" in out and "162 medians" in out
    for argv, message in [(["--split-sweep", "--json-dir", "x"], "takes only --rep-ms"), (["--rep-ms", "5"], "goes")]:
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert message in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_launcher_split_choice(tmp_path: Path) -> None:
    """The launcher's split count (host code of csrc/attention/decode.cuh, built and run here): the
    bound from the shapes and the SM count, then the fewest splits whose waves (of one CTA per SM, as
    the launcher passes them) are within 5% of the best fill within it."""
    import tvm_ffi

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "splits.cu"
    cases = [(8, 396, 64), (64, 396, 64), (256, 396, 5), (8, 396, 8), (1024, 396, 1), (512, 396, 2), (8, 264, 64)]
    cases += [(8, 132, 64), (64, 132, 17), (4, 132, 64), (256, 132, 5)]  # the launcher's: one CTA per SM
    # split_bound(batch, kv_heads, max_len, sms) on 132 SMs
    bounds = [(1, 8, 32768), (1, 8, 1024), (32, 8, 32768), (1, 8, 100), (512, 8, 32768), (0, 8, 32768)]
    calls = "".join(f'  std::printf("%lld\\n", (long long)choose_splits({c}, {r}, {m}));\n' for c, r, m in cases)
    calls += "".join(f'  std::printf("%lld\\n", (long long)split_bound({b}, {h}, {n}, 132));\n' for b, h, n in bounds)
    source.write_text(
        "#include <attention/decode.cuh>\n#include <cstdio>\n"
        "using jit_kernel::attention::detail::choose_splits;\n"
        "using jit_kernel::attention::detail::split_bound;\n"
        f"int main() {{\n{calls}}}\n"
    )
    tvm = Path(tvm_ffi.__file__).parent
    subprocess.run(
        [nvcc, "-std=c++20", "--expt-relaxed-constexpr", f"-I{ROOT / 'include'}", f"-I{ROOT / 'csrc'}",
         f"-I{tvm / 'include'}", f"-L{tvm / 'lib'}", "-ltvm_ffi", f"-Xlinker=-rpath,{tvm / 'lib'}",
         "-o", str(tmp_path / "splits"), str(source)],
        check=True, capture_output=True,
    )  # fmt: skip
    got = [
        int(line)
        for line in subprocess.run(
            [str(tmp_path / "splits")], check=True, capture_output=True, text=True
        ).stdout.split()
    ]
    # 8 CTAs of 396 resident: 47 splits fill 376 (95% of 49's 392, the best); 64: 6 fill 384 of 396;
    # 256 (at most 5): 3 fill 768 of 792 two waves; at most 8: all 8 (one wave, the best within 8);
    # 1024 (at most 1): 1; 512 (at most 2): 2 fill 1024 of 1188 (one fills 512 of 792);
    # 8 CTAs of 264 resident: 32 splits fill 256 of 264 (the best is 33: 264).
    # On 132 SMs, a wave of 132: batch 1 x 8 KV heads takes 16 splits (128 CTAs; 33 would fill all
    # 264 of two waves); batch 8: 2 (128 of 132); 4 KV heads: 32; 256 CTAs: 1 (256 of 264).
    assert got[: len(cases)] == [47, 6, 3, 8, 1, 2, 32, 16, 2, 32, 1]
    # One sequence: the most allowed (64); a 1,024-key cache: no split under 128 keys (8); 32
    # sequences of 8 KV heads: 8 CTAs per SM, ceil(1056 / 256); shorter than one split, or a batch that
    # fills the GPU alone: 1; an empty batch (launches nothing): 64.
    assert got[len(cases) :] == [64, 8, 5, 1, 1, 64]


# ---------------------------------------------------------------------------------------------
# merge_attn_states


N, H = 5, 8

MERGE_BAD = [
    ({"out_a": (1, 2)}, TypeError, r"^merge_attn_states: out_a must be a torch\.Tensor, got tuple$"),
    ({"out_a": lambda: _e(N, H * D)}, ValueError,
     r"^merge_attn_states: out_a must have 3 dimensions \[num_tokens, num_heads, head_dim\], got shape \(5, 1024\)$"),
    ({"out_a": lambda: _e(N, H, D, dtype=torch.int32)}, TypeError,
     r"merge_attn_states: out_a must be one of \(float16, bfloat16, float32\), got int32"),
    ({"out_b": lambda: _e(N, H, D, dtype=FP16)}, TypeError,
     r"(?s)'out_b'.*Dtype mismatch: expected bfloat16 but got float16"),
    ({"out_b": lambda: _e(N, H, D + 8)}, ValueError, r"(?s)'out_b'.*Size mismatch for shape#2\('head_dim'\)"),
    ({"out_b": lambda: _e(N, H, D, device="cpu")}, ValueError, r"(?s)'out_b'.*Device mismatch"),
    ({"out_b": lambda: torch.empty_strided((N, H, D), (H * D, 1, H), dtype=BF16, device="cuda")}, ValueError,
     r"(?s)'out_b'.*Stride mismatch for stride#2"),
    ({"lse_a": lambda: _e(N, H, dtype=BF16)}, TypeError,
     r"(?s)'lse_a'.*Dtype mismatch: expected float32 but got bfloat16"),
    ({"lse_a": lambda: _e(N + 1, H, dtype=FP32)}, ValueError,
     r"(?s)'lse_a'.*Size mismatch for shape#0\('num_tokens'\)"),
    ({"lse_b": lambda: _e(N, H, 1, dtype=FP32)}, ValueError, r"(?s)'lse_b'.*Rank mismatch: expected 2 but got 3"),
    ({"lse_b": lambda: _e(N, H, dtype=FP32, device="cpu")}, ValueError, r"(?s)'lse_b'.*Device mismatch"),
    ({"lse_b": None}, TypeError, r"^merge_attn_states: lse_b must be a torch\.Tensor, got NoneType$"),
    ({"out": lambda: _e(N, H, D, dtype=FP32)}, TypeError, r"(?s)'out'.*Dtype mismatch"),
    ({"out": lambda: _e(N, H + 1, D)}, ValueError, r"(?s)'out'.*Size mismatch for shape#1\('num_heads'\)"),
    ({"enable_pdl": "on"}, TypeError, r"^merge_attn_states: enable_pdl must be a bool or None, got str$"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), MERGE_BAD)
def test_merge_attn_states_bad_inputs(overrides: dict[str, object], error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {
            "out_a": _e(N, H, D),
            "lse_a": _e(N, H, dtype=FP32),
            "out_b": _e(N, H, D),
            "lse_b": _e(N, H, dtype=FP32),
        }
        args |= {name: _value(v) for name, v in overrides.items()}
        positional = [args.pop(name) for name in ("out_a", "lse_a", "out_b", "lse_b")]
        with pytest.raises(error, match=match):
            jit_kernel.merge_attn_states(*positional, **args)


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
def test_merge_attn_states_shapes_and_forms(dtype: torch.dtype) -> None:
    with fake_cuda():
        a, b = _e(N, H, 96, dtype=dtype), _e(N, H, 96, dtype=dtype)
        la, lb = _e(N, H, dtype=FP32), _e(N, H, dtype=FP32)
        out, lse = jit_kernel.merge_attn_states(a, la, b, lb)
        assert out.shape == (N, H, 96) and out.dtype == dtype and lse.shape == (N, H) and lse.dtype == FP32
        given = _e(N, H, 96, dtype=dtype)
        assert jit_kernel.merge_attn_states(a, la, b, lb, out=given, enable_pdl=True)[0] is given
        # LSEs of any strides ([H, N] buffers seen as [N, H], as vLLM keeps them), rows of a wider buffer
        transposed = torch.empty_strided((N, H), (1, N), dtype=FP32, device="cuda")
        wide = torch.empty_strided((N, H, 96), (H * 200, 200, 1), dtype=dtype, device="cuda")
        assert jit_kernel.merge_attn_states(wide, transposed, b, lb)[0].shape == (N, H, 96)
        assert jit_kernel.merge_attn_states(_e(0, H, 7, dtype=dtype), _e(0, H, dtype=FP32), _e(0, H, 7, dtype=dtype),
                                            _e(0, H, dtype=FP32))[1].shape == (0, H)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The registered ops and tracing


def test_registered_ops_declare_what_they_write() -> None:
    for name in ("decode_attention", "merge_attn_states"):
        schema = getattr(torch.ops.jit_kernel, name).default._schema
        assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == ["out", "lse"], name


def test_registered_fakes_run_the_launchers_checks() -> None:
    with fake_cuda():
        q, kv, lens = _e(B, HQ, D), _e(B, HKV, L, D), _lens()
        torch.ops.jit_kernel.decode_attention(_e(B, HQ, D), None, q, kv, kv, lens, 0.1)
        with pytest.raises(TypeError, match=r"(?s)'v_cache'.*Dtype mismatch"):
            torch.ops.jit_kernel.decode_attention(_e(B, HQ, D), None, q, kv, _e(B, HKV, L, D, dtype=FP16), lens, 0.1)
        with pytest.raises(ValueError, match=r"must be a multiple of the KV heads"):
            torch.ops.jit_kernel.decode_attention(_e(B, 6, D), None, _e(B, 6, D), kv, kv, lens, 0.1, None)
        a, la = _e(N, H, D), _e(N, H, dtype=FP32)
        torch.ops.jit_kernel.merge_attn_states(_e(N, H, D), _e(N, H, dtype=FP32), a, la, a, la)
        with pytest.raises(ValueError, match=r"(?s)'lse'.*Size mismatch"):
            torch.ops.jit_kernel.merge_attn_states(_e(N, H, D), _e(N, H + 1, dtype=FP32), a, la, a, la)


@pytest.fixture
def reset_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_torch_compile_traces_without_graph_break(reset_dynamo: None) -> None:
    """fullgraph tracing of fake CUDA tensors (on a CPU machine too): the recorded graph calls the
    registered ops, and running it on fake tensors (their fakes) gives the shapes and dtypes."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    backend = EagerAndRecordGraphs()

    def step(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, prefix: torch.Tensor, lse: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, part_lse = jit_kernel.decode_attention(q, k, v, lens, return_lse=True)
        merged = torch.empty_like(out)
        merged, merged_lse = jit_kernel.merge_attn_states(prefix, lse, out, part_lse, out=merged)
        return merged * 2, merged_lse + jit_kernel.decode_attention(q, k, v, lens, scale=0.25).float().sum()

    with fake_cuda():
        q, kv, lens = _e(B, HQ, D, dtype=FP16), _e(B, HKV, L, D, dtype=FP16), _lens()
        prefix, lse = _e(B, HQ, D, dtype=FP16), _e(B, HQ, dtype=FP32)
        merged, merged_lse = torch.compile(step, backend=backend, fullgraph=True)(q, kv, kv, lens, prefix, lse)
    assert merged.shape == (B, HQ, D) and merged.dtype == FP16
    assert merged_lse.shape == (B, HQ) and merged_lse.dtype == FP32
    [graph] = backend.graphs
    assert graph.code.count("jit_kernel.decode_attention") == 2 and "jit_kernel.merge_attn_states" in graph.code


def test_public_names() -> None:
    assert jit_kernel.decode_attention is ops.decode_attention
    assert jit_kernel.merge_attn_states is ops.merge_attn_states
    assert "decode_attention" in jit_kernel.__all__ and "merge_attn_states" in jit_kernel.__all__
    assert jit_kernel.merge_attn_states.__doc__ and "exp(lse_a - m)" in jit_kernel.merge_attn_states.__doc__
