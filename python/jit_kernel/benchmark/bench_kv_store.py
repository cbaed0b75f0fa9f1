"""store_kv_cache and set_mla_kv_buffer against torch eager (index_put), torch.compile of it,
FlashInfer (where it has the same operation) and a device-to-device copy of the same bytes, measured
in the same run. Times are CUDA-graph medians in microseconds.

    python -m jit_kernel.benchmark.bench_kv_store                                  # full grid, print only
    JIT_KERNEL_BENCH_CI=1 python -m jit_kernel.benchmark.bench_kv_store            # CI-sized grid
    python -m jit_kernel.benchmark.bench_kv_store --save-path bench-out/kv_store   # + PNG plots, CSVs, summary
    python -m jit_kernel.benchmark.bench_kv_store --json-dir bench-json            # + JSON results (report.py)

Cases (one ``triton.testing.perf_report`` benchmark each):

- ``mha``: 8 KV heads x 128, bf16, k and v views of a fused qkv tensor (32 q heads), bf16 caches;
- ``mha_fp8``: the same into float8_e4m3fn caches with float32 scale tensors;
- ``mla``: DeepSeek MLA, 512 + 64 bf16 (views of one [tokens, 1, 576 + 32] tensor) into a 576 row;
- ``mla_fp8``: the same into a float8_e4m3fn buffer with a scale tensor.

Tokens 1, 4, 16, 128, 1024, 4096, 16384 (CI-sized grid, the one docs/benchmarks.md shows: 16, 4096),
each at slots drawn at random (without repetition) from a cache of ``max(4 * tokens, 4096)`` slots. Providers:

- ``jit``: jit_kernel;
- ``eager``: ``k_cache[loc] = k; v_cache[loc] = v`` (MLA: ``kv_buffer[loc] = cat(nope, rope)``); fp8:
  ``(x.float() / scale).clamp(-448, 448).to(float8_e4m3fn)`` first, stored through uint8 views as
  SGLang does;
- ``compile``: torch.compile of the eager function, one static-shape graph per shape;
- ``copy``: a device copy of the minimal bytes;
- ``flashinfer``: ``flashinfer.page.append_paged_kv_cache`` with page size 1, one request and
  ``kv_indices = loc`` (the same scatter); for MLA ``append_paged_mla_kv_cache`` into the 512 and 64
  parts of the one buffer as strided views. Each is timed only after one run matched the torch
  reference, else "n/a"; not for fp8 (FlashInfer's appends take no per-tensor scale).

The "vs empty" column is the jit time in empty-kernel replays for up to 16 tokens.

Minimal bytes: the k and v rows read once plus the cache rows written once plus the indices:
``tokens * (row * (elem + cache_elem) + index_bytes)``, with ``row`` = 2 * 8 * 128 for MHA (k and v)
and 576 for MLA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton.testing

import jit_kernel
from jit_kernel.benchmark._tables import (
    STANDARD_PROVIDERS,
    Measurements,
    SummaryTable,
    compile_static,
    provider_benchmark,
    run_script,
    tables_markdown,
)
from jit_kernel.benchmark.utils import DEFAULT_DEVICE, copy_fn, get_benchmark_range

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
HEADS, HEAD_DIM, Q_HEADS = 8, 128, 32
NOPE, ROPE = 512, 64
CASES = ["mha", "mha_fp8", "mla", "mla_fp8"]
TOKENS = get_benchmark_range([1, 4, 16, 128, 1024, 4096, 16384], [16, 4096])
TINY_TOKENS = 16  # "vs empty" is shown up to this many tokens

PROVIDERS: dict[str, tuple[str, tuple[str, str]]] = {
    **STANDARD_PROVIDERS,
    "flashinfer": ("FlashInfer", ("tab:red", "--")),
}
EXTRAS = {"flashinfer": "FlashInfer"}

RESULTS = Measurements.paired()


def row_elems(case: str) -> int:
    """Elements written per token: k and v rows for MHA, the 576-wide latent row for MLA."""
    return 2 * HEADS * HEAD_DIM if case.startswith("mha") else NOPE + ROPE


def store_bytes(tokens: int, case: str) -> int:
    """Rows read (bf16) plus rows written (bf16 or fp8) plus the int64 indices."""
    cache_elem = 1 if case.endswith("fp8") else 2
    return tokens * (row_elems(case) * (2 + cache_elem) + 8)


def _fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _torch_store(k, v, k_cache, v_cache, loc) -> None:
    k_cache[loc] = k
    v_cache[loc] = v


def _torch_store_fp8(k, v, k_cache, v_cache, loc, k_scale, v_scale) -> None:
    k_cache.view(torch.uint8)[loc] = _fp8(k, k_scale).view(torch.uint8)  # SGLang's byte view
    v_cache.view(torch.uint8)[loc] = _fp8(v, v_scale).view(torch.uint8)


def _torch_mla(kv_buffer, loc, nope, rope) -> None:
    kv_buffer[loc] = torch.cat([nope, rope], dim=-1)


def _torch_mla_fp8(kv_buffer, loc, nope, rope, scale) -> None:
    kv_buffer.view(torch.uint8)[loc] = _fp8(torch.cat([nope, rope], dim=-1), scale).view(torch.uint8)


def _checked(fn: Callable[[], object], ok: Callable[[], bool]) -> Callable[[], object]:
    """``fn`` after one run whose result matches the torch reference: a baseline whose layout does
    not fit (e.g. strides ignored) raises here and reads "n/a" instead of timing another operation."""
    fn()
    torch.cuda.synchronize()
    if not ok():
        raise RuntimeError("the result differs from the torch reference: this layout does not fit the baseline")
    return fn


def _flashinfer_args(tokens: int, loc: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One request whose pages (page size 1) are the slots ``loc``: batch indices, positions,
    kv_indices, kv_indptr, kv_last_page_len."""
    dev = loc.device
    return (
        torch.zeros(tokens, dtype=torch.int32, device=dev),
        torch.arange(tokens, dtype=torch.int32, device=dev),
        loc.to(torch.int32),
        torch.tensor([0, tokens], dtype=torch.int32, device=dev),
        torch.ones(1, dtype=torch.int32, device=dev),
    )


def _flashinfer_store(k, v, k_cache, v_cache, loc) -> Callable[[], object]:
    import flashinfer  # may be missing: time_case reports the failure as n/a

    batch, positions, indices, indptr, last = _flashinfer_args(k.shape[0], loc)
    paged = (k_cache.unsqueeze(1), v_cache.unsqueeze(1))  # [pages, page_size=1, heads, head_dim]

    def fn() -> None:
        flashinfer.page.append_paged_kv_cache(k, v, batch, positions, paged, indices, indptr, last, kv_layout="NHD")

    return _checked(fn, lambda: torch.equal(k_cache[loc], k) and torch.equal(v_cache[loc], v))


def _flashinfer_mla(kv_buffer, loc, nope, rope) -> Callable[[], object]:
    """``append_paged_mla_kv_cache`` into the 512 and 64 parts of the one 576-wide buffer (strided
    views); it counts only if the result matches (see ``_checked``)."""
    import flashinfer

    batch, positions, indices, indptr, last = _flashinfer_args(nope.shape[0], loc)
    ckv, kpe = kv_buffer[..., :NOPE], kv_buffer[..., NOPE:]  # [pages, page_size=1, 512 | 64]

    def fn() -> None:
        flashinfer.page.append_paged_mla_kv_cache(
            nope[:, 0], rope[:, 0], batch, positions, ckv, kpe, indices, indptr, last
        )

    return _checked(fn, lambda: torch.equal(kv_buffer[loc], torch.cat([nope, rope], dim=-1)))


def store_case(provider: str, tokens: int, case: str, device: str = DEFAULT_DEVICE) -> Callable[[], object]:
    if provider == "copy":
        return copy_fn(store_bytes(tokens, case), device)
    fp8 = case.endswith("fp8")
    cache_dtype = FP8 if fp8 else torch.bfloat16
    slots = max(4 * tokens, 4096)
    loc = torch.randperm(slots, device=device)[:tokens]
    scale_a = torch.tensor([0.05], device=device)
    scale_b = torch.tensor([0.02], device=device)
    if case.startswith("mha"):
        kv = HEADS * HEAD_DIM
        qkv = torch.randn(tokens, Q_HEADS * HEAD_DIM + 2 * kv, device=device, dtype=torch.bfloat16)
        k = qkv[:, Q_HEADS * HEAD_DIM : Q_HEADS * HEAD_DIM + kv].view(tokens, HEADS, HEAD_DIM)
        v = qkv[:, Q_HEADS * HEAD_DIM + kv :].view(tokens, HEADS, HEAD_DIM)
        k_cache = torch.zeros(slots, HEADS, HEAD_DIM, device=device, dtype=cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        scales = (scale_a, scale_b) if fp8 else ()
        if provider == "jit":
            return lambda: jit_kernel.store_kv_cache(k, v, k_cache, v_cache, loc, *scales)
        fn = _torch_store_fp8 if fp8 else _torch_store
        if provider == "eager":
            return lambda: fn(k, v, k_cache, v_cache, loc, *scales)
        if provider == "compile":
            compiled = compile_static(fn)
            return lambda: compiled(k, v, k_cache, v_cache, loc, *scales)
        if provider == "flashinfer":
            if fp8:
                raise NotImplementedError("FlashInfer's append has no per-tensor scale")
            return _flashinfer_store(k, v, k_cache, v_cache, loc)
    else:
        src = torch.randn(tokens, 1, NOPE + ROPE + 32, device=device, dtype=torch.bfloat16)
        nope, rope = src[..., :NOPE], src[..., NOPE : NOPE + ROPE]
        kv_buffer = torch.zeros(slots, 1, NOPE + ROPE, device=device, dtype=cache_dtype)
        scale = (scale_a,) if fp8 else ()
        if provider == "jit":
            kwargs = {"scale": scale_a} if fp8 else {}
            return lambda: jit_kernel.set_mla_kv_buffer(kv_buffer, loc, nope, rope, **kwargs)
        fn = _torch_mla_fp8 if fp8 else _torch_mla
        if provider == "eager":
            return lambda: fn(kv_buffer, loc, nope, rope, *scale)
        if provider == "compile":
            compiled = compile_static(fn)
            return lambda: compiled(kv_buffer, loc, nope, rope, *scale)
        if provider == "flashinfer":
            if fp8:
                raise NotImplementedError("FlashInfer's MLA append has no per-tensor scale")
            return _flashinfer_mla(kv_buffer, loc, nope, rope)
    raise ValueError(f"unknown provider {provider!r}; known: {list(PROVIDERS)}")


@triton.testing.perf_report(
    [
        provider_benchmark(
            PROVIDERS,
            x_name="tokens",
            x_vals=TOKENS,
            xlabel="tokens",
            plot_name=f"kv_store-{case}",
            args={"case": case},
        )
        for case in CASES
    ]
)
def bench_kv_store(tokens: int, case: str, provider: str) -> float:
    if provider == "flashinfer" and case.endswith("fp8"):
        return float("nan")  # no such operation (see the module docstring); nothing to time
    return RESULTS.time(("kv_store", case, tokens), provider, lambda: store_case(provider, tokens, case))


REPORTS = [bench_kv_store]


def summary_tables() -> list[SummaryTable]:
    configs = [
        (("kv_store", case, n), [case, n], store_bytes(n, case), n <= TINY_TOKENS) for case in CASES for n in TOKENS
    ]
    title = "store_kv_cache / set_mla_kv_buffer (bf16 activations)"
    return [SummaryTable("kv_store", title, ["case", "tokens"], configs, PROVIDERS, EXTRAS)]


def summary_markdown(results: Measurements, empty: float) -> str:
    return tables_markdown(summary_tables(), results, empty)


def main(argv: Sequence[str] | None = None) -> None:
    run_script("bench_kv_store", __doc__, argv, REPORTS, lambda: RESULTS, summary_tables)


if __name__ == "__main__":
    main()
