"""Before/after: the same op calls timed under two installed versions of jit_kernel.

Self-contained on purpose (torch, triton and jit_kernel's public top-level API only, which every
version since the first release has): the script can run against an older build on the
``PYTHONPATH`` and time exactly what it times against the current one. Each case is timed twice:

* **graph**: ``triton.testing.do_bench_cudagraph`` median (us) of one call replayed in a CUDA graph,
  i.e. kernel time, at decode sizes and at the large sizes of ``bench_norm``, ``bench_quant``,
  ``bench_elementwise`` and ``bench_hicache``;
* **eager** (cases up to 4096 tokens): host time per call of a loop of back-to-back calls with every
  output given (median of 5 repeats of 2,000 calls), i.e. the Python and launch path.

Usage (ci/bench-versions.sh drives both versions, interleaved, on one GPU)::

    python -m jit_kernel.benchmark.bench_versions --out after.json
    python -m jit_kernel.benchmark.bench_versions --out after.json --only 'gelu|silu'   # a subset
    python -m jit_kernel.benchmark.bench_versions --compare before1.json,before2.json after1.json,after2.json

``--compare`` takes, per side, one or more result files (repeats) and prints a markdown table of
the per-case minimum over repeats, after / before.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Case = tuple[str, Callable[[], Callable[[], object]], bool]  # (name, setup -> call, time eager)


def _cases() -> list[Case]:
    import torch

    import jit_kernel as jk

    dev, bf16 = "cuda", torch.bfloat16
    cases: list[Case] = []

    def rand(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=torch.float32).to(dtype)

    for n, d in ((1, 4096), (16, 4096), (4096, 4096), (16384, 8192)):
        eager = n <= 4096

        def rms(n: int = n, d: int = d) -> Callable[[], object]:
            x, w, out = rand(n, d), rand(d), torch.empty(n, d, device=dev, dtype=bf16)
            return lambda: jk.rmsnorm(x, w, 1e-6, out=out)

        def fused(n: int = n, d: int = d) -> Callable[[], object]:
            x, r, w = rand(n, d), rand(n, d), rand(d)
            return lambda: jk.fused_add_rmsnorm(x, r, w, 1e-6)

        cases += [(f"rmsnorm {n}x{d}", rms, eager), (f"fused_add_rmsnorm {n}x{d}", fused, eager)]

    for n in (1, 16, 4096, 16384):

        def qk(n: int = n) -> Callable[[], object]:
            qkv = rand(n, (32 + 16) * 128)
            q = qkv[:, : 32 * 128].view(n, 32, 128)
            k = qkv[:, 32 * 128 : 40 * 128].view(n, 8, 128)
            qw, kw = rand(128), rand(128)
            return lambda: jk.fused_inplace_qknorm(q, k, qw, kw, 1e-6)

        def across(n: int = n) -> Callable[[], object]:
            qkv = rand(n, 4096 + 2 * 1024)
            q, k = qkv[:, :4096], qkv[:, 4096 : 4096 + 1024]
            qw, kw = rand(4096), rand(1024)
            return lambda: jk.qknorm_across_heads(q, k, qw, kw, 1e-6)

        cases += [(f"fused_inplace_qknorm {n}x(32+8)x128", qk, n <= 4096)]
        cases += [(f"qknorm_across_heads {n}x(4096+1024)", across, n <= 4096)]

    for numel in (4096, 16 * 4096, 28 * 4096, 64 * 4096, 4096 * 4096, 16384 * 8192):

        def quant(numel: int = numel) -> Callable[[], object]:
            x = rand(numel // 4096, 4096)
            q = torch.empty_like(x, dtype=torch.float8_e4m3fn)
            s = torch.empty(1, device=dev, dtype=torch.float32)
            return lambda: jk.per_tensor_quant_fp8(x, q, s)

        def scale(numel: int = numel) -> Callable[[], object]:
            x = rand(numel // 4096, 4096)
            out = torch.empty_like(x)
            return lambda: jk.scale(x, 2.0, out)

        def add(numel: int = numel) -> Callable[[], object]:
            x = torch.randint(-1000, 1000, (numel // 4096, 4096), device=dev, dtype=torch.int32)
            out = torch.empty_like(x)
            return lambda: jk.add_constant(x, 2, out)

        eager = numel <= 4096 * 4096
        cases += [(f"per_tensor_quant_fp8 {numel}", quant, eager)]
        if numel in (4096, 4096 * 4096, 16384 * 8192):
            cases += [(f"scale {numel}", scale, eager), (f"add_constant {numel}", add, eager)]

    for rows in (1, 16, 4096, 65536):

        def hicache(rows: int = rows) -> Callable[[], object]:
            # One layer, rows of 8 x 128 bf16 (2 KiB) K and V, device -> device, random slots.
            slots = 2 * rows
            src_k, src_v = rand(slots, 1024), rand(slots, 1024)
            dst_k = torch.empty(slots, 1024, device=dev, dtype=bf16)
            dst_v = torch.empty_like(dst_k)
            i_src = torch.randperm(slots, device=dev)[:rows].to(torch.int64)
            i_dst = torch.randperm(slots, device=dev)[:rows].to(torch.int64)
            return lambda: jk.transfer_hicache_one_layer(dst_k, dst_v, i_dst, src_k, src_v, i_src)

        cases += [(f"transfer_hicache_one_layer {rows} rows x 2 KiB", hicache, rows <= 4096)]

    # Gated activations (newer than the first release, as the stores below): [N, 2d] -> [N, d].
    for op in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        for n, d in ((1, 14336), (16, 14336), (1024, 4096), (1024, 14336), (4096, 14336), (16384, 14336)):

            def act(op: str = op, n: int = n, d: int = d) -> Callable[[], object]:
                x, out = rand(n, 2 * d), torch.empty(n, d, device=dev, dtype=bf16)
                fn = getattr(jk, op)
                return lambda: fn(x, out=out)

            cases += [(f"{op} {n}x{d}", act, n <= 1024)]

    # RoPE and the fused per-head norm + RoPE, in place: NeoX, q 32 and k 8 heads x 128 of a qkv row
    # (v: 8 more heads), fp32 cos/sin cache of 8192 positions.
    for fused in (False, True):
        for n in (1, 16, 1024, 4096, 16384):

            def rope(fused: bool = fused, n: int = n) -> Callable[[], object]:
                qkv = rand(n, 48 * 128)
                q, k = qkv[:, :4096].view(n, 32, 128), qkv[:, 4096:5120].view(n, 8, 128)
                pos = torch.randint(0, 8192, (n,), device=dev)
                inv = 1.0 / 10000 ** (torch.arange(0, 128, 2, device=dev, dtype=torch.float32) / 128)
                angles = torch.arange(8192, device=dev, dtype=torch.float32)[:, None] * inv
                cache = torch.cat([angles.cos(), angles.sin()], dim=-1)
                if fused:
                    qw, kw = rand(128), rand(128)
                    return lambda: jk.fused_qknorm_rope(q, k, qw, kw, pos, cache, 1e-6)
                return lambda: jk.apply_rope_with_cos_sin_cache_inplace(pos, q, k, 128, cache)

            name = "fused_qknorm_rope" if fused else "apply_rope_with_cos_sin_cache_inplace"
            cases += [(f"{name} {n} tokens", rope, n <= 1024)]

    # Per-token-group fp8 quant, alone and fused with silu_and_mul (group 128, outputs given).
    for fused in (False, True):
        for n, d in ((1, 4096), (16, 7168), (1024, 4096), (4096, 7168)):

            def group(fused: bool = fused, n: int = n, d: int = d) -> Callable[[], object]:
                x = rand(n, 2 * d if fused else d)
                q = torch.empty(n, d, device=dev, dtype=torch.float8_e4m3fn)
                s = torch.empty(n, d // 128, device=dev, dtype=torch.float32)
                fn = jk.silu_and_mul_per_token_group_quant_fp8 if fused else jk.per_token_group_quant_fp8
                return lambda: fn(x, 128, output_q=q, output_s=s)

            name = "silu_and_mul_per_token_group_quant_fp8" if fused else "per_token_group_quant_fp8"
            cases += [(f"{name} {n}x{d}", group, n <= 1024)]

    # Per-token dynamic fp8 quant (scales computed, outputs given).
    for n, d in ((1, 4096), (16, 4096), (16, 7168), (128, 7168), (4096, 7168)):

        def token(n: int = n, d: int = d) -> Callable[[], object]:
            x = rand(n, d)
            q = torch.empty(n, d, device=dev, dtype=torch.float8_e4m3fn)
            s = torch.empty(n, 1, device=dev, dtype=torch.float32)
            return lambda: jk.per_token_quant_fp8(x, output_q=q, output_s=s)

        cases += [(f"per_token_quant_fp8 {n}x{d}", token, n <= 1024)]

    # KV-cache stores (ops newer than the first release: a build without them reports an error row).
    fp8 = torch.float8_e4m3fn
    for n, cache in (
        *((n, bf16) for n in (1, 16, 128, 1024, 4096, 16384)),
        *((n, fp8) for n in (1, 16, 128, 1024, 4096, 16384)),
    ):

        def mha(n: int = n, cache: torch.dtype = cache) -> Callable[[], object]:
            # k and v: 8 heads x 128 slices of a qkv row (32 q heads); random slots of 4x as many.
            qkv = rand(n, (32 + 16) * 128)
            k, v = qkv[:, 4096:5120].view(n, 8, 128), qkv[:, 5120:].view(n, 8, 128)
            k_cache = torch.zeros(max(4 * n, 4096), 8, 128, device=dev, dtype=cache)
            v_cache, loc = torch.zeros_like(k_cache), torch.randperm(k_cache.shape[0], device=dev)[:n]
            scales = (torch.tensor([0.05], device=dev), torch.tensor([0.02], device=dev)) if cache == fp8 else ()
            return lambda: jk.store_kv_cache(k, v, k_cache, v_cache, loc, *scales)

        def mla(n: int = n, cache: torch.dtype = cache) -> Callable[[], object]:
            # DeepSeek's latent row: 512 nope + 64 rope, slices of a wider source row.
            src = rand(n, 1, 512 + 64 + 32)
            kv_buffer = torch.zeros(max(4 * n, 4096), 1, 576, device=dev, dtype=cache)
            loc = torch.randperm(kv_buffer.shape[0], device=dev)[:n]
            kwargs = {"scale": torch.tensor([0.05], device=dev)} if cache == fp8 else {}
            return lambda: jk.set_mla_kv_buffer(kv_buffer, loc, src[..., :512], src[..., 512:576], **kwargs)

        kind = "fp8" if cache == fp8 else "bf16"
        cases += [(f"store_kv_cache {n} tokens, {kind} cache", mha, n <= 4096)]
        cases += [(f"set_mla_kv_buffer {n} tokens, {kind} cache", mla, n <= 4096)]

    def empty() -> Callable[[], object]:  # the floor of a graph-replayed launch
        x = torch.zeros(1, device=dev)
        return lambda: x.add_(1)

    return [("empty kernel (1-element add_)", empty, True), *cases]


def _eager_us(call: Callable[[], object], calls: int = 2000, repeats: int = 5) -> float:
    import torch

    for _ in range(200):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def selected(cases: list[Case], only: str | None) -> list[Case]:
    """``cases`` whose name matches the regular expression ``only`` (all when None), and the empty
    kernel always: it is the reference the comparison reads beside them."""
    if only is None:
        return cases
    pattern = re.compile(only)
    return [case for case in cases if case[0].startswith("empty kernel") or pattern.search(case[0])]


def measure(out_path: str, only: str | None = None) -> None:
    """Time the cases :func:`selected` picks and write the results to ``out_path``."""
    import torch
    import triton.testing

    import jit_kernel

    results: dict[str, Any] = {"version": getattr(jit_kernel, "__version__", "?"), "cases": {}}
    for name, setup, eager in selected(_cases(), only):
        try:
            call = setup()
            call()
            torch.cuda.synchronize()
            graph = triton.testing.do_bench_cudagraph(call, rep=100, return_mode="median") * 1e3
            results["cases"][name] = {"graph_us": graph, "eager_us": _eager_us(call) if eager else None}
        except Exception as error:  # one failing case must not hide the others
            results["cases"][name] = {"error": f"{type(error).__name__}: {error}"[:200]}
        print(name, results["cases"][name], flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


def _best(paths: str) -> dict[str, dict[str, float | None]]:
    """Per case and column, the minimum over repeats (None where a case failed in every repeat)."""
    runs = [json.loads(Path(p).read_text())["cases"] for p in paths.split(",")]
    best: dict[str, dict[str, float | None]] = {}
    for name in runs[0]:
        best[name] = {}
        for column in ("graph_us", "eager_us"):
            values = [r[name][column] for r in runs if r.get(name, {}).get(column) is not None]
            best[name][column] = min(values) if values else None
    return best


def compare(before: str, after: str) -> str:
    b, a = _best(before), _best(after)
    lines = [
        "| case | graph before us | graph after us | after/before | eager before us | eager after us | after/before |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(column: str, name: str) -> list[str]:
        x, y = b.get(name, {}).get(column), a[name][column]
        if x is None or y is None:
            return [f"{x:.2f}" if x else "-", f"{y:.2f}" if y else "-", "-"]
        return [f"{x:.2f}", f"{y:.2f}", f"{y / x:.2f}"]

    for name in a:
        lines.append("| " + " | ".join([name, *cells("graph_us", name), *cells("eager_us", name)]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write this version's measurements (JSON) here")
    parser.add_argument("--only", metavar="REGEX", help="with --out: only the cases whose name matches")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="comma-separated result files")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(*args.compare))
    elif args.out:
        measure(args.out, args.only)
    else:
        parser.error("give --out or --compare")
    return 0


if __name__ == "__main__":
    sys.exit(main())
