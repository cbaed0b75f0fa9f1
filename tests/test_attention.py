"""The attention family on the GPU: ``decode_attention`` and ``merge_attn_states`` against float64
torch references, on fresh random inputs, with outputs poisoned (NaN) before each call so that an
unwritten element fails.

decode_attention: every head dim and dtype, Hq == Hkv up to Hq = 16 * Hkv (groups that are not a
power of two too), lengths 1, max_len and mixed in one batch, one long sequence (many splits),
lengths 0 (empty: out 0, lse -inf) and out of range (NaN), cache positions past each length filled
with NaN (never read), strided caches and outputs, int64 lengths, the LSE, PDL on and off, CUDA-graph
capture and replays with new lengths and inputs, torch.compile(fullgraph=True), and two halves of
a cache merged by merge_attn_states into the whole.

merge_attn_states: the formula in float64, -inf LSEs on either side and both (the empty part's
values NaN, never reaching the output), NaN and +inf LSEs, every dtype, vector and scalar rows,
strided inputs, a large N, CUDA graphs and torch.compile.

The references are checked against torch's own attention on the CPU (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import jit_kernel

BF16, FP16, FP32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
NAN, INF = float("nan"), float("inf")
TOL = {
    BF16: {"rtol": 1e-2, "atol": 1e-2},
    FP16: {"rtol": 2e-3, "atol": 2e-3},
    FP32: {"rtol": 1e-5, "atol": 1e-5},
}
LSE_TOL = {"rtol": 1e-5, "atol": 1e-3}  # fp32 sums of up to 32,768 exponentials
MERGE_LSE_TOL = {"rtol": 1e-6, "atol": 1e-5}


# ---------------------------------------------------------------------------------------------
# References (float64)


def decode_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q . k) . v over the first ``lens[b]`` keys of each sequence, query head h
    reading KV head h // (Hq // Hkv); (out [B, Hq, D], lse [B, Hq]) in float64. Length 0: out 0 and
    lse -inf; a length outside [0, max_len]: NaN."""
    batch, heads, dim = q.shape
    kv_heads = k.shape[1]
    out = torch.zeros(batch, heads, dim, dtype=F64, device=q.device)
    lse = torch.full((batch, heads), -INF, dtype=F64, device=q.device)
    for b, n in enumerate(lens):
        if n < 0 or n > k.shape[2]:
            out[b], lse[b] = NAN, NAN
            continue
        if n == 0:
            continue
        query = q[b].to(F64).view(kv_heads, heads // kv_heads, dim)  # [Hkv, group, D]
        scores = torch.einsum("kgd,knd->kgn", query, k[b, :, :n].to(F64)) * scale
        lse[b] = torch.logsumexp(scores, dim=-1).reshape(heads)
        out[b] = torch.einsum("kgn,knd->kgd", torch.softmax(scores, dim=-1), v[b, :, :n].to(F64)).reshape(heads, dim)
    return out, lse


def merge_reference(
    a: torch.Tensor, la: torch.Tensor, b: torch.Tensor, lb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge formula in float64; a part of lse -inf contributes nothing (its values are not
    read), both -inf give out 0 and lse -inf, a NaN or +inf lse gives NaN."""
    a, b, la, lb = a.to(F64), b.to(F64), la.to(F64), lb.to(F64)
    m = torch.maximum(la, lb)
    finite_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(la - finite_m), torch.exp(lb - finite_m)
    a_only, b_only = lb == -INF, la == -INF
    wa, wb = torch.where(b_only, 0.0, wa), torch.where(a_only, 0.0, wb)
    total = wa + wb
    mixed = (torch.nan_to_num(a) * wa[..., None] + torch.nan_to_num(b) * wb[..., None]) / total[..., None]
    out = torch.where(a_only[..., None], a, torch.where(b_only[..., None], b, mixed))
    lse = finite_m + torch.log(total)
    empty = a_only & b_only
    out = torch.where(empty[..., None], 0.0, out)
    lse = torch.where(empty, -INF, lse)
    bad = la.isnan() | lb.isnan() | (la == INF) | (lb == INF)
    return torch.where(bad[..., None], NAN, out), torch.where(bad, NAN, lse)


def test_decode_reference_is_torch_attention() -> None:
    """On the CPU: the reference is torch's SDPA over repeat_kv'd heads, per sequence, and its LSE
    the log-sum-exp of the scores."""
    torch.manual_seed(0)
    q, k, v = (
        torch.randn(3, 8, 16, dtype=F64),
        torch.randn(3, 2, 10, 16, dtype=F64),
        torch.randn(3, 2, 10, 16, dtype=F64),
    )
    lens = [1, 10, 6]
    out, lse = decode_reference(q, k, v, lens, 0.3)
    for b, n in enumerate(lens):
        keys, values = k[b, :, :n].repeat_interleave(4, 0), v[b, :, :n].repeat_interleave(4, 0)
        expected = torch.nn.functional.scaled_dot_product_attention(q[b, :, None], keys, values, scale=0.3)[:, 0]
        torch.testing.assert_close(out[b], expected)
        torch.testing.assert_close(lse[b], torch.logsumexp(torch.einsum("hd,hnd->hn", q[b], keys) * 0.3, -1))
    out, lse = decode_reference(q, k, v, [0, 11, -1], 0.3)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool((lse[0] == -INF).all())
    assert bool(out[1:].isnan().all()) and bool(lse[1:].isnan().all())


def test_merge_reference_merges_halves_on_cpu() -> None:
    """On the CPU: merging the references of two halves of the keys gives the reference of all."""
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 8, dtype=F64), torch.randn(2, 2, 12, 8, dtype=F64), torch.randn(2, 2, 12, 8, dtype=F64)
    whole = decode_reference(q, k, v, [12, 12], 0.5)
    first = decode_reference(q, k[:, :, :5], v[:, :, :5], [5, 5], 0.5)
    second = decode_reference(q, k[:, :, 5:], v[:, :, 5:], [7, 7], 0.5)
    merged = merge_reference(*first, *second)
    torch.testing.assert_close(merged[0], whole[0])
    torch.testing.assert_close(merged[1], whole[1])
    empty = decode_reference(q, k, v, [0, 0], 0.5)
    torch.testing.assert_close(merge_reference(*empty, *whole)[0], whole[0])


# ---------------------------------------------------------------------------------------------
# decode_attention


def make_inputs(
    batch: int,
    heads: int,
    kv_heads: int,
    max_len: int,
    dim: int,
    dtype: torch.dtype,
    lens: list[int],
    *,
    q_scale: float = 1.0,
    layout: str = "contiguous",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, k_cache, v_cache, seq_lens int32), random; every cache position at or past a
    sequence's length is NaN, so a read of one shows. ``layout``: "contiguous"; "slice" (the first
    max_len positions of caches twice as long); "interleaved" (K and V of a position side by side in
    one buffer, [B, Hkv, max_len, 2, D])."""
    q = (torch.randn(batch, heads, dim, device="cuda") * q_scale).to(dtype)
    if layout == "contiguous":
        k = torch.randn(batch, kv_heads, max_len, dim, device="cuda").to(dtype)
        v = torch.randn(batch, kv_heads, max_len, dim, device="cuda").to(dtype)
    elif layout == "slice":
        k = torch.randn(batch, kv_heads, 2 * max_len, dim, device="cuda").to(dtype)[:, :, :max_len]
        v = torch.randn(batch, kv_heads, 2 * max_len, dim, device="cuda").to(dtype)[:, :, :max_len]
    elif layout == "interleaved":
        kv = torch.randn(batch, kv_heads, max_len, 2, dim, device="cuda").to(dtype)
        k, v = kv[:, :, :, 0], kv[:, :, :, 1]
    else:
        raise ValueError(layout)
    for b, n in enumerate(lens):
        k[b, :, max(n, 0) :] = NAN
        v[b, :, max(n, 0) :] = NAN
    return q, k, v, torch.tensor(lens, dtype=torch.int32, device="cuda")


def poison_allocator(nbytes: int) -> None:
    """Free a NaN-filled block of ``nbytes``: the caching allocator hands it to the next allocations
    of about that size (the op's split workspace), so a partial result the kernels read without
    having written shows as NaN."""
    block = torch.full((max(nbytes // 4, 1),), NAN, device="cuda")
    del block


def run_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lens: torch.Tensor,
    scale: float | None = None,
    enable_pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The registered op with both outputs given, NaN-filled first (the public function allocates
    the LSE itself); the workspace allocations poisoned."""
    out = torch.full_like(q, NAN)
    lse = torch.full(q.shape[:2], NAN, device="cuda")
    poison_allocator(q.shape[0] * q.shape[1] * 64 * q.shape[2] * 4)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    torch.ops.jit_kernel.decode_attention(out, lse, q, k, v, lens, scale, enable_pdl)
    return out, lse


def check_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = run_decode(q, k, v, lens, scale)
    expected, expected_lse = decode_reference(q, k, v, lens.tolist(), q.shape[-1] ** -0.5 if scale is None else scale)
    torch.testing.assert_close(out.to(F64), expected, **TOL[q.dtype], equal_nan=True)
    torch.testing.assert_close(lse.to(F64), expected_lse, **LSE_TOL, equal_nan=True)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 8), (16, 8), (32, 8), (64, 8), (40, 8), (28, 4), (64, 4), (12, 4)])
def test_decode_matches_the_reference(dtype: torch.dtype, dim: int, heads: int, kv_heads: int) -> None:
    """Mixed lengths in one batch: 1, max_len, and in between; groups of 1, 2, 4, 8, 5, 7, 16 and 3."""
    torch.manual_seed(dim + heads)
    max_len = 700
    lens = [1, max_len, 37, 256, 513]
    check_decode(*make_inputs(len(lens), heads, kv_heads, max_len, dim, dtype, lens))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("kv_heads", [16, 8])
def test_decode_one_long_sequence(dtype: torch.dtype, dim: int, kv_heads: int) -> None:
    """B = 1, a long context: many splits and their merge; peaky scores (a scaled query) too. On a
    132-SM GPU, 16 KV heads take 8 splits, merged inside a cluster; 8 KV heads take 16, more than a
    cluster holds, merged by the second kernel."""
    torch.manual_seed(3)
    for max_len, n, q_scale in ((32768, 32768, 1.0), (32768, 20001, 4.0), (8192, 129, 1.0)):
        check_decode(*make_inputs(1, 32, kv_heads, max_len, dim, dtype, [n], q_scale=q_scale))


@pytest.mark.gpu
def test_each_merge_gives_the_same_bits() -> None:
    """The launcher's launch with a given split count (bench_decode_attention --split-sweep's
    module): the merge kernel, a cluster and a spread cluster merge the splits in the same order, so
    they give the same bits, and match the reference; with no split count given it is the op."""
    from jit_kernel.benchmark import bench_decode_attention as bench

    torch.manual_seed(11)
    run = bench.splits_module().run_with
    q, k, v, lens = make_inputs(2, 32, 8, 4096, 128, BF16, [4096, 1500])
    expected, expected_lse = decode_reference(q, k, v, lens.tolist(), 128**-0.5)
    for splits in (2, 5, 8, 16):
        results = []
        for merge in (1, 2, 3):
            out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN, device="cuda")
            run(out, lse, q, k, v, lens, 128**-0.5, None, splits, merge)
            results.append((out, lse))
        torch.testing.assert_close(results[0][0].to(F64), expected, **TOL[BF16])
        torch.testing.assert_close(results[0][1].to(F64), expected_lse, **LSE_TOL)
        for out, lse in results[1:]:
            assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1]), splits
    out, lse = torch.full_like(q, NAN), torch.full(q.shape[:2], NAN, device="cuda")
    run(out, lse, q, k, v, lens, 128**-0.5, None, 0, 0)
    op_out, op_lse = run_decode(q, k, v, lens)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 3, 8, 32, 200])
def test_decode_batch_sizes_and_split_choices(batch: int) -> None:
    """Batches that take many, a few or one split, with lengths spread over the cache."""
    torch.manual_seed(batch)
    max_len = 4096
    lens = torch.randint(1, max_len + 1, (batch,)).tolist()
    lens[0] = max_len
    check_decode(*make_inputs(batch, 32, 8, max_len, 128, BF16, lens))


@pytest.mark.gpu
def test_decode_short_caches() -> None:
    """Caches shorter than one split, of lengths that are not multiples of any vector or step."""
    torch.manual_seed(4)
    for max_len in (1, 2, 7, 17, 100, 127, 129):
        lens = sorted({1, max_len, (max_len + 1) // 2})
        check_decode(*make_inputs(len(lens), 16, 4, max_len, 128, FP16, lens))


@pytest.mark.gpu
@pytest.mark.parametrize("max_len", [64, 5000])
def test_decode_empty_and_out_of_range_lengths(max_len: int) -> None:
    """Length 0: out 0, lse -inf. Below 0 or above max_len: NaN, and the other sequences unharmed."""
    torch.manual_seed(5)
    lens = [0, max_len + 1, -3, max_len, 1, 2**31 - 1, 0]
    out, lse = check_decode(*make_inputs(len(lens), 32, 8, max_len, 128, BF16, lens))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and bool((lse[0] == -INF).all())
    assert bool(out[1:3].isnan().all()) and bool(lse[1:3].isnan().all()) and bool(out[5].isnan().all())
    assert not bool(out[3:5].isnan().any())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["slice", "interleaved"])
def test_decode_strided_caches(layout: str) -> None:
    torch.manual_seed(6)
    lens = [300, 1000, 1]
    check_decode(*make_inputs(3, 32, 8, 1000, 128, BF16, lens, layout=layout))


@pytest.mark.gpu
def test_decode_public_function_forms() -> None:
    """The public function: its default scale, a custom one, int64 lengths, out= (a strided view),
    return_lse, and the functional form agree with the reference."""
    torch.manual_seed(7)
    lens = [5, 900, 64]
    q, k, v, lens32 = make_inputs(3, 32, 8, 900, 128, FP16, lens)
    expected, expected_lse = decode_reference(q, k, v, lens, 128**-0.5)
    torch.testing.assert_close(jit_kernel.decode_attention(q, k, v, lens32).to(F64), expected, **TOL[FP16])
    wide = torch.full((3, 32, 256), NAN, dtype=FP16, device="cuda")
    out = wide[..., 64:192]  # rows of a wider buffer
    got, lse = jit_kernel.decode_attention(q, k, v, lens32.long(), out=out, return_lse=True)
    assert got is out
    torch.testing.assert_close(out.to(F64), expected, **TOL[FP16])
    torch.testing.assert_close(lse.to(F64), expected_lse, **LSE_TOL)
    assert bool(wide[..., :64].isnan().all()) and bool(wide[..., 192:].isnan().all())  # nothing outside out
    scaled = decode_reference(q, k, v, lens, 0.02)[0]
    torch.testing.assert_close(jit_kernel.decode_attention(q, k, v, lens32, scale=0.02).to(F64), scaled, **TOL[FP16])
    strided_q = torch.randn(3, 32, 2, 128, device="cuda").to(FP16)[:, :, 1]
    expected_q = decode_reference(strided_q, k, v, lens, 128**-0.5)[0]
    torch.testing.assert_close(jit_kernel.decode_attention(strided_q, k, v, lens32).to(F64), expected_q, **TOL[FP16])


@pytest.mark.gpu
def test_decode_pdl_on_and_off_agree_bit_for_bit() -> None:
    torch.manual_seed(8)
    q, k, v, lens = make_inputs(2, 32, 8, 4096, 128, BF16, [4096, 1234])
    on = run_decode(q, k, v, lens, enable_pdl=True)
    off = run_decode(q, k, v, lens, enable_pdl=False)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@pytest.mark.gpu
def test_decode_halves_merged_are_the_whole() -> None:
    """decode_attention over a cache's first and last positions, merged by merge_attn_states, is the
    attention over the whole cache (the cascade a prefix cache takes)."""
    torch.manual_seed(9)
    lens = [3000, 4096, 2049]
    q, k, v, lens32 = make_inputs(3, 32, 8, 4096, 128, BF16, lens)
    cut = 2048
    first = jit_kernel.decode_attention(q, k[:, :, :cut], v[:, :, :cut], torch.full_like(lens32, cut), return_lse=True)
    second = jit_kernel.decode_attention(q, k[:, :, cut:], v[:, :, cut:], lens32 - cut, return_lse=True)
    out, lse = jit_kernel.merge_attn_states(*first, *second)
    expected, expected_lse = decode_reference(q, k, v, lens, 128**-0.5)
    torch.testing.assert_close(out.to(F64), expected, **TOL[BF16])
    torch.testing.assert_close(lse.to(F64), expected_lse, **LSE_TOL)


@pytest.mark.gpu
def test_decode_cuda_graph_replays() -> None:
    """Captured once; each replay reads the lengths, the query and the cache as they are then (the
    split workspace lives in the graph's pool)."""
    torch.manual_seed(10)
    max_len = 8192
    q, k, v, lens = make_inputs(2, 32, 8, max_len, 128, BF16, [max_len, max_len])
    out = torch.full_like(q, NAN)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        jit_kernel.decode_attention(q, k, v, lens, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = jit_kernel.decode_attention(q, k, v, lens, out=out, return_lse=True)
    for trial, new_lens in enumerate(([max_len, 1], [17, 5000], [0, 8000], [4096, max_len])):
        fresh_q, fresh_k, fresh_v, fresh_lens = make_inputs(2, 32, 8, max_len, 128, BF16, new_lens)
        for dst, src in ((q, fresh_q), (k, fresh_k), (v, fresh_v), (lens, fresh_lens)):
            dst.copy_(src)
        out.fill_(NAN)
        lse.fill_(NAN)
        graph.replay()
        expected, expected_lse = decode_reference(q, k, v, new_lens, 128**-0.5)
        torch.testing.assert_close(out.to(F64), expected, **TOL[BF16], msg=f"replay {trial}")
        torch.testing.assert_close(lse.to(F64), expected_lse, **LSE_TOL, msg=f"replay {trial}")


@pytest.mark.gpu
def test_decode_and_merge_under_torch_compile() -> None:
    torch._dynamo.reset()

    def step(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lens: torch.Tensor,
        prefix: torch.Tensor,
        prefix_lse: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = jit_kernel.decode_attention(q, k, v, lens, return_lse=True)
        merged, merged_lse = jit_kernel.merge_attn_states(prefix, prefix_lse, out, lse)
        return merged * 2, merged_lse

    torch.manual_seed(11)
    q, k, v, lens = make_inputs(4, 32, 8, 2048, 128, BF16, [2048, 1, 700, 1500])
    prefix = torch.randn(4, 32, 128, device="cuda").to(BF16)
    prefix_lse = torch.randn(4, 32, device="cuda") * 3
    compiled = torch.compile(step, fullgraph=True)
    got = compiled(q, k, v, lens, prefix, prefix_lse)
    eager = step(q, k, v, lens, prefix, prefix_lse)
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    explanation = torch._dynamo.explain(step)(q, k, v, lens, prefix, prefix_lse)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# merge_attn_states


def merge_inputs(
    n: int, heads: int, dim: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    a = torch.randn(n, heads, dim, device="cuda").to(dtype)
    b = torch.randn(n, heads, dim, device="cuda").to(dtype)
    return a, torch.randn(n, heads, device="cuda") * 4, b, torch.randn(n, heads, device="cuda") * 4


def check_merge(
    a: torch.Tensor, la: torch.Tensor, b: torch.Tensor, lb: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full(a.shape, NAN, dtype=a.dtype, device="cuda")
    lse = torch.full(a.shape[:2], NAN, device="cuda")
    torch.ops.jit_kernel.merge_attn_states(out, lse, a, la, b, lb, None)
    expected, expected_lse = merge_reference(a, la, b, lb)
    torch.testing.assert_close(out.to(F64), expected, **TOL[a.dtype], equal_nan=True)
    torch.testing.assert_close(lse.to(F64), expected_lse, **MERGE_LSE_TOL, equal_nan=True)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("dim", [128, 64, 256, 96, 100, 7, 1])  # 100, 7, 1: scalar rows (16-bit), 7 and 1 for fp32
@pytest.mark.parametrize("n", [1, 37, 4096])
def test_merge_matches_the_formula(dtype: torch.dtype, dim: int, n: int) -> None:
    torch.manual_seed(n + dim)
    check_merge(*merge_inputs(n, 8, dim, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16, FP32])
def test_merge_infinite_and_nan_lses(dtype: torch.dtype) -> None:
    """-inf on either side: the other part exactly, whatever the empty part holds (NaN here); both:
    out 0, lse -inf; NaN or +inf on either side: NaN."""
    torch.manual_seed(12)
    a, la, b, lb = merge_inputs(64, 4, 128, dtype)
    la[0:8], lb[8:16] = -INF, -INF
    la[16:24], lb[16:24] = -INF, -INF
    la[24:28], lb[28:32], la[32:34], lb[34:36] = NAN, NAN, INF, INF
    la[36:40], lb[36:40] = 80.0, -80.0  # the b part's weight underflows to 0
    a[0:8], b[8:16] = NAN, NAN  # the empty parts' values
    out, lse = check_merge(a, la, b, lb)
    assert torch.equal(out[0:8], b[0:8]) and torch.equal(lse[0:8], lb[0:8])
    assert torch.equal(out[8:16], a[8:16]) and torch.equal(lse[8:16], la[8:16])
    assert torch.equal(out[16:24], torch.zeros_like(out[16:24])) and bool((lse[16:24] == -INF).all())
    assert bool(out[24:36].isnan().all()) and bool(lse[24:36].isnan().all())
    assert not bool(out[36:].isnan().any()) and not bool(lse[36:].isnan().any())


@pytest.mark.gpu
def test_merge_strided_and_misaligned_inputs() -> None:
    """LSEs kept [H, N] and seen as [N, H] (vLLM's layout), rows of wider buffers, a row start off
    the 16-byte grid (the scalar kernel), an out= view."""
    torch.manual_seed(13)
    n, heads, dim = 300, 8, 128
    wide_a = torch.randn(n, heads, dim + 8, device="cuda").to(BF16)
    a = wide_a[..., 8:]
    b = torch.randn(n, heads, dim + 1, device="cuda").to(BF16)[..., 1:]  # misaligned rows
    la = (torch.randn(heads, n, device="cuda") * 4).t()
    lb = (torch.randn(heads, n, device="cuda") * 4).t()
    check_merge(a, la, b, lb)
    check_merge(a, la, a, lb)  # both aligned: the vector kernel, strided
    full = torch.full((n, heads, 2 * dim), NAN, dtype=BF16, device="cuda")
    out = full[..., :dim]
    got, lse = jit_kernel.merge_attn_states(a, la, b, lb, out=out)
    assert got is out and bool(full[..., dim:].isnan().all())
    expected, expected_lse = merge_reference(a, la, b, lb)
    torch.testing.assert_close(out.to(F64), expected, **TOL[BF16])
    torch.testing.assert_close(lse.to(F64), expected_lse, **MERGE_LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP32])
def test_merge_large_n(dtype: torch.dtype) -> None:
    torch.manual_seed(14)
    check_merge(*merge_inputs(65536, 32, 128, dtype))


@pytest.mark.gpu
def test_merge_cuda_graph_replays() -> None:
    torch.manual_seed(15)
    a, la, b, lb = merge_inputs(128, 32, 128, FP16)
    out = torch.empty_like(a)
    jit_kernel.merge_attn_states(a, la, b, lb, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = jit_kernel.merge_attn_states(a, la, b, lb, out=out)
    for _ in range(3):
        fresh = merge_inputs(128, 32, 128, FP16)
        for dst, src in zip((a, la, b, lb), fresh, strict=True):
            dst.copy_(src)
        out.fill_(NAN)
        lse.fill_(NAN)
        graph.replay()
        expected, expected_lse = merge_reference(a, la, b, lb)
        torch.testing.assert_close(out.to(F64), expected, **TOL[FP16])
        torch.testing.assert_close(lse.to(F64), expected_lse, **MERGE_LSE_TOL)
