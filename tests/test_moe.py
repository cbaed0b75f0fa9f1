"""MoE routing (topk_softmax, topk_sigmoid, grouped_topk), moe_align_block_size and moe_sum_reduce.

CPU tests (everywhere): registration, fake implementations and torch.compile tracing, bad inputs
named, one sm_90a build per kernel unit. GPU tests: against fp32 torch references on random inputs,
outputs poisoned, edge shapes, ties, every logits dtype, the align layout, the expert-parallel map.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_helpers import assert_builds_for_arch
from jit_kernel.engine import families

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _sm90a(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU the fakes' checks need a kernel: the sm_90a build the compile test makes."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")


# ---------------------------------------------------------------------------------------------
# Torch references (fp32)


def ref_route(
    logits: torch.Tensor,
    topk: int,
    *,
    softmax: bool,
    renormalize: bool,
    bias: torch.Tensor | None = None,
    groups: int = 1,
    topk_group: int = 1,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    x = logits.float()
    scores = torch.softmax(x, dim=-1) if softmax else torch.sigmoid(x)
    choice = scores + bias.float() if bias is not None else scores.clone()
    t, e = choice.shape
    if groups > 1 and topk_group < groups:
        grouped = choice.view(t, groups, e // groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1) if bias is not None else grouped.max(dim=-1).values
        keep = _stable_topk(group_scores, topk_group)
        mask = torch.zeros(t, groups, dtype=torch.bool, device=x.device).scatter_(1, keep, True)
        mask = mask.repeat_interleave(e // groups, dim=1)
        choice = choice.masked_fill(~mask, float("-inf"))
    ids = _stable_topk(choice, topk)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * scale, ids.int()


def _stable_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values per row, the lowest index first among equal values."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return order[:, :k]


def ref_align(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map: torch.Tensor | None = None
) -> tuple[list[list[int]], list[int], int]:
    """Per expert, the sorted flat pair indices; the expert id of each block; the padded total."""
    flat = topk_ids.flatten().cpu().tolist()
    segments = [[i for i, e in enumerate(flat) if e == expert] for expert in range(num_experts)]
    blocks: list[int] = []
    for expert, seg in enumerate(segments):
        n = -(-len(seg) // block_size)
        value = int(expert_map[expert]) if expert_map is not None else expert
        blocks += [value] * n
    return segments, blocks, len(blocks) * block_size


# ---------------------------------------------------------------------------------------------
# CPU: registration, fakes, tracing, bad inputs, builds

OPS = {
    "topk_softmax": {"topk_weights", "topk_ids"},
    "topk_sigmoid": {"topk_weights", "topk_ids"},
    "grouped_topk": {"topk_weights", "topk_ids"},
    "moe_align_block_size": {"sorted_token_ids", "expert_ids", "num_tokens_post_padded"},
    "moe_sum_reduce": set(),
    "moe_sum_reduce_out": {"out"},
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_registered_with_mutated_tensors(name: str) -> None:
    schema = getattr(torch.ops.jit_kernel, name).default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == OPS[name], schema


def _e(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, device="cuda", dtype=dtype)


def test_fakes_give_shapes() -> None:
    with fake_cuda():
        g = _e(5, 256)
        w, i = jit_kernel.grouped_topk(g, 8, 8, 4, True, _e(256, dtype=torch.float32), 2.5)
        assert w.shape == (5, 8) and w.dtype == torch.float32 and i.dtype == torch.int32
        w, i = jit_kernel.topk_softmax(_e(3, 60), 4)
        assert i.shape == (3, 4)
        s, b, n = jit_kernel.moe_align_block_size(i, 60, 16)
        assert s.shape == (12 + 12 * 15,) and b.shape == (12,) and n.shape == (1,)  # 12 pairs: 12 experts at most
        assert jit_kernel.moe_sum_reduce(_e(5, 8, 1000), w.new_empty(5, 8)).shape == (5, 1000)


def test_torch_compile_traces_without_graph_break() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch._dynamo.reset()
    graphs = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        return gm

    def model(g: torch.Tensor, bias: torch.Tensor, x: torch.Tensor):
        w, i = jit_kernel.grouped_topk(g, 8, 8, 4, True, bias, 2.5)
        w2, i2 = jit_kernel.topk_softmax(g, 2, True)
        w3, i3 = jit_kernel.topk_sigmoid(g, 2, False, bias)
        s, b, n = jit_kernel.moe_align_block_size(i, 256, 64)
        y = jit_kernel.moe_sum_reduce(x, w)
        return y, s, b, n, w2 + w3, i2 + i3

    with FakeTensorMode(allow_non_fake_inputs=True):
        y, s, b, n, w, i = torch.compile(model, fullgraph=True, backend=backend)(
            _e(3, 256), _e(256, dtype=torch.float32), _e(3, 8, 512)
        )
    assert y.shape == (3, 512) and s.shape == (24 + 24 * 63,) and b.shape == (24,)
    assert n.shape == (1,) and w.shape == (3, 2) and i.dtype == torch.int32
    (graph,) = graphs
    targets = {str(node.target).removesuffix(".default") for node in graph.graph.nodes if node.op == "call_function"}
    assert {f"jit_kernel.{name}" for name in OPS if name != "moe_sum_reduce_out"} <= targets, targets


BAD = [
    (lambda: jit_kernel.topk_softmax("g", 2), TypeError, "topk_softmax: gating_output must be a torch.Tensor"),
    (lambda: jit_kernel.topk_softmax(_e(4, 8, dtype=torch.int32), 2), TypeError, "gating_output must be one of"),
    (lambda: jit_kernel.topk_softmax(_e(4, 8), 2.0), TypeError, "topk_softmax: topk must be an int"),
    (lambda: jit_kernel.topk_softmax(_e(4, 8), 9), ValueError, r"topk must be in \[1, min\(32, (num_)?experts = 8\)\]"),
    (lambda: jit_kernel.topk_softmax(_e(4, 513), 2), ValueError, "gating_output must have 1 to 512 experts"),
    (lambda: jit_kernel.topk_softmax(_e(4, 8, 2), 2), ValueError, "'gating_output'"),
    (
        lambda: jit_kernel.topk_sigmoid(_e(4, 8), 2, True, _e(7, dtype=torch.float32)),
        ValueError,
        r"(?s)'correction_bias'.*Size mismatch",
    ),
    (
        lambda: jit_kernel.topk_sigmoid(_e(4, 8), 2, True, _e(8, dtype=torch.float16)),
        TypeError,
        r"(?s)'correction_bias'.*Dtype",
    ),
    (lambda: jit_kernel.grouped_topk(_e(4, 256), 8, 7, 4), ValueError, "num_expert_group must be in"),
    (lambda: jit_kernel.grouped_topk(_e(4, 256), 8, 8, 9), ValueError, "topk_group must be in"),
    (lambda: jit_kernel.grouped_topk(_e(4, 64), 9, 8, 1), ValueError, "topk .9. exceeds the experts"),
    (lambda: jit_kernel.grouped_topk(_e(4, 64), 2, 8, 1, scoring_func="relu"), ValueError, "scoring_func"),
    (
        lambda: jit_kernel.moe_align_block_size(_e(4, 2, dtype=torch.float32), 8, 16),
        TypeError,
        r"(?s)'topk_ids'.*Dtype",
    ),
    (
        lambda: jit_kernel.moe_align_block_size(_e(4, 2, dtype=torch.int32), 8, 0),
        ValueError,
        "block_size must be >= 1",
    ),
    (
        lambda: jit_kernel.moe_align_block_size(_e(4, 2, dtype=torch.int32), 2000, 16),
        ValueError,
        r"num_experts must be in \[1, 1024\]",
    ),
    (
        lambda: jit_kernel.moe_align_block_size(_e(4, 2, dtype=torch.int32), 8, 16, _e(7, dtype=torch.int32)),
        ValueError,
        r"(?s)'expert_map'.*Size mismatch",
    ),
    (lambda: jit_kernel.moe_sum_reduce(_e(4, 1000), None), ValueError, "expert_out must be"),
    (
        lambda: jit_kernel.moe_sum_reduce(_e(4, 2, 64), _e(4, 3, dtype=torch.float32)),
        ValueError,
        r"(?s)'weights'.*Size mismatch",
    ),
    (lambda: jit_kernel.moe_sum_reduce(_e(4, 2, 64), out=_e(4, 32)), ValueError, r"(?s)'out'.*Size mismatch"),
    (lambda: jit_kernel.moe_sum_reduce(_e(4, 2, 64), [1.0]), TypeError, "weights must be a torch.Tensor"),
]


@pytest.mark.parametrize(("call", "error", "match"), BAD)
def test_bad_inputs(call: Callable[[], object], error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "config"),
    [(families.MOE_ROUTE, ("bf16_t",)), (families.MOE_ALIGN, ()), (families.MOE_SUM_REDUCE, ("bf16_t",))],
    ids=lambda v: getattr(v, "family", None) or "-".join(map(str, v)),
)
def test_compiles_for_sm90a_without_a_gpu(spec, config, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each family's unit builds for sm_90a without a GPU (the prebuilt library is the proof where it
    holds the config for sm_90a; see ``assert_builds_for_arch``)."""
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    assert_builds_for_arch(spec, config, "9.0a")


# ---------------------------------------------------------------------------------------------
# GPU


def _check_route(got: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    (w, i), (rw, ri) = got, expected
    assert w.dtype == torch.float32 and i.dtype == torch.int32
    assert torch.equal(i, ri), (i, ri)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)


def _logits(t: int, e: int, dtype: torch.dtype) -> torch.Tensor:
    """Random logits without ties: each row a random permutation of (i - e / 2) / 64, i < e, values
    exact in fp16 and bf16 (at most 9 significant bits) and 1/64 apart."""
    perm = torch.argsort(torch.rand(t, e, device="cuda"), dim=-1)
    return ((perm - e // 2).float() / 64).to(dtype)


def _distinct(logits: torch.Tensor) -> bool:
    v = logits.float().sort(dim=-1).values
    return bool((v[:, 1:] > v[:, :-1]).all()) if v.shape[-1] > 1 else True


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "e", "k"), [(0, 8, 2), (1, 8, 2), (7, 128, 8), (33, 32, 4), (5, 512, 8), (4, 3, 3)])
@pytest.mark.parametrize("renormalize", [False, True])
def test_topk_softmax(t: int, e: int, k: int, renormalize: bool, dtype: torch.dtype) -> None:
    x = torch.randn(t, e, device="cuda").to(dtype)
    got = jit_kernel.topk_softmax(x, k, renormalize)
    rw, ri = ref_route(x, k, softmax=True, renormalize=renormalize)
    # ids may differ only where two probabilities are within rounding: compare the chosen weights too
    w, i = got
    same = (i == ri).all(-1)
    torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)
    assert same.float().mean() >= 0.95 if t else True


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "e", "k"), [(1, 8, 2), (9, 64, 6), (16, 256, 8), (3, 97, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_topk_sigmoid_distinct(t: int, e: int, k: int, bias: bool, dtype: torch.dtype) -> None:
    x = _logits(t, e, dtype)
    assert _distinct(x)
    b = torch.randn(e, device="cuda") * 0.01 if bias else None
    got = jit_kernel.topk_sigmoid(x, k, True, b)
    _check_route(got, ref_route(x, k, softmax=False, renormalize=True, bias=b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("e", "groups", "topk_group", "k"), [(256, 8, 4, 8), (384, 1, 1, 8), (160, 8, 3, 6), (512, 32, 4, 8), (64, 4, 4, 8)]
)
@pytest.mark.parametrize("scoring", ["sigmoid", "softmax"])
@pytest.mark.parametrize("t", [0, 1, 17, 300])
def test_grouped_topk(t: int, e: int, groups: int, topk_group: int, k: int, scoring: str, dtype: torch.dtype) -> None:
    x = _logits(t, e, dtype)
    bias = (torch.rand(e, device="cuda") * 1e-3).to(torch.float32) if scoring == "sigmoid" else None
    got = jit_kernel.grouped_topk(x, k, groups, topk_group, True, bias, 2.5, scoring)
    expected = ref_route(
        x, k, softmax=scoring == "softmax", renormalize=True, bias=bias, groups=groups, topk_group=topk_group, scale=2.5
    )
    _check_route(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", [False, True])
def test_grouped_topk_on_a_grid_beyond_four_ctas_per_sm(enable_pdl: bool) -> None:
    # 8,192 tokens are 2,048 CTAs of 4 tokens: more than 4 per SM on any current GPU, so the kernel
    # triggers its PDL dependents after the scores instead of at its start.
    x = _logits(8192, 256, torch.bfloat16)
    bias = (torch.rand(256, device="cuda") * 1e-3).to(torch.float32)
    got = jit_kernel.grouped_topk(x, 8, 8, 4, True, bias, 2.5, "sigmoid", enable_pdl)
    expected = ref_route(x, 8, softmax=False, renormalize=True, bias=bias, groups=8, topk_group=4, scale=2.5)
    _check_route(got, expected)


@pytest.mark.gpu
def test_ties_pick_the_lowest_index() -> None:
    x = torch.zeros(3, 64, device="cuda")
    x[1, 10] = x[1, 40] = 1.0  # two equal maxima: 10 first
    x[2, ::2] = 2.0
    for fn in (lambda g: jit_kernel.topk_softmax(g, 4), lambda g: jit_kernel.topk_sigmoid(g, 4)):
        _, ids = fn(x)
        assert ids[0].tolist() == [0, 1, 2, 3]
        assert ids[1].tolist() == [10, 40, 0, 1]
        assert ids[2].tolist() == [0, 2, 4, 6]
    _, ids = jit_kernel.grouped_topk(torch.zeros(2, 64, device="cuda"), 4, 8, 2)
    assert ids.tolist() == [[0, 1, 2, 3]] * 2  # groups tie too: groups 0 and 1, experts 0..3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("e", "groups", "topk_group"), [(256, 8, 4), (256, 1, 1), (512, 16, 4), (96, 3, 2), (160, 8, 3)]
)
def test_ties_between_lanes_with_a_bias(e: int, groups: int, topk_group: int, dtype: torch.dtype) -> None:
    """Every third row has five distinct logits (ties between lanes, and between groups), the others none,
    in one launch: a warp whose picks meet a tie redoes them with the exact rule, the others keep the
    fast ones. Both as the stable reference."""
    t = 64
    tied = torch.randint(-2, 3, (t, e), device="cuda").to(dtype)
    x = torch.where((torch.arange(t, device="cuda") % 3 == 0)[:, None], tied, _logits(t, e, dtype))
    bias = torch.zeros(e, device="cuda")  # a bias (64-bit candidate words) that keeps the ties
    got = jit_kernel.grouped_topk(x, 8, groups, topk_group, True, bias, 2.5)
    expected = ref_route(
        x, 8, softmax=False, renormalize=True, bias=bias, groups=groups, topk_group=topk_group, scale=2.5
    )
    _check_route(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("e", "groups", "topk_group", "softmax"),
    [
        (256, 8, 4, False),
        (256, 8, 4, True),
        (256, 1, 1, False),
        (128, 1, 1, True),
        (512, 16, 4, False),
        (64, 2, 1, False),
    ],
)
def test_lane_aligned_and_general_kernels_agree(
    e: int, groups: int, topk_group: int, softmax: bool, dtype: torch.dtype
) -> None:
    """Aligned rows and bias take the lane-aligned kernels (vector loads, groups of whole lanes merged in
    registers); the same values one element off alignment take the general kernel (element loads, groups
    staged in shared memory). Same bits from both, and the reference's choice. The logits include ties,
    -inf and, for sigmoid, denominators of 2^125 and more (the out-of-line paths); softmax's stay small,
    where no probability underflows into a tie that ranking by logits would break differently."""
    t = 40
    x = torch.randn(t, e, device="cuda") * (1 if softmax else 60)
    x[::4] = torch.randint(-2, 3, (len(x[::4]), e), device="cuda").float()  # ties between lanes
    x[1::4, ::7] = float("-inf")
    x = x.to(dtype)
    bias = torch.randint(-2, 3, (e,), device="cuda").float() * 0.25 if not softmax else None
    wide = torch.zeros(t, e + 8, device="cuda", dtype=dtype)
    wide[:, 1 : e + 1] = x
    bias_wide = None if bias is None else torch.zeros(e + 1, device="cuda")
    if bias_wide is not None:
        bias_wide[1:] = bias
    scoring = "softmax" if softmax else "sigmoid"
    aligned = jit_kernel.grouped_topk(x, 8, groups, topk_group, True, bias, 2.5, scoring)
    general = jit_kernel.grouped_topk(
        wide[:, 1 : e + 1], 8, groups, topk_group, True, None if bias_wide is None else bias_wide[1:], 2.5, scoring
    )
    assert torch.equal(aligned[1], general[1])
    assert torch.equal(aligned[0].view(torch.int32), general[0].view(torch.int32))
    expected = ref_route(
        x, 8, softmax=softmax, renormalize=True, bias=bias, groups=groups, topk_group=topk_group, scale=2.5
    )
    _check_route(aligned, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("e", "groups", "topk_group", "softmax", "renormalize"),
    [(256, 8, 4, False, True), (256, 1, 1, False, False), (128, 1, 1, True, True), (512, 1, 1, True, False)],
)
def test_weights_within_1e_6_of_a_float64_reference(
    e: int, groups: int, topk_group: int, softmax: bool, renormalize: bool, dtype: torch.dtype
) -> None:
    """The weights of the chosen experts (ids as the fp32 reference chooses them) within 1e-6 relative of
    the same weights computed in float64: the scores, the softmax denominator, the renormalising sum."""
    t = 64
    x = _logits(t, e, dtype)
    bias = None if softmax else torch.randn(e, device="cuda") * 0.1
    w, ids = jit_kernel.grouped_topk(
        x, 8, groups, topk_group, renormalize, bias, 2.5, "softmax" if softmax else "sigmoid"
    )
    _, ref_ids = ref_route(
        x, 8, softmax=softmax, renormalize=renormalize, bias=bias, groups=groups, topk_group=topk_group, scale=2.5
    )
    assert torch.equal(ids, ref_ids)
    x64 = x.double()
    scores = torch.softmax(x64, dim=-1) if softmax else torch.sigmoid(x64)
    w64 = scores.gather(1, ids.long())
    if renormalize:
        w64 = w64 / w64.sum(-1, keepdim=True)
    w64 = w64 * 2.5
    assert ((w.double() - w64).abs() / w64.abs()).max().item() <= 1e-6


@pytest.mark.gpu
def test_strided_logits() -> None:
    x = _logits(9, 256, torch.bfloat16)
    wide = torch.zeros(9, 300, device="cuda", dtype=torch.bfloat16)
    wide[:, :256] = x
    _check_route(jit_kernel.topk_sigmoid(wide[:, :256], 8, True), ref_route(x, 8, softmax=False, renormalize=True))


def _check_align(t: int, k: int, e: int, block: int, map_: torch.Tensor | None, dtype: torch.dtype) -> None:
    _check_align_ids(torch.randint(0, e, (t, k), device="cuda", dtype=dtype), e, block, map_)


def _check_align_ids(ids: torch.Tensor, e: int, block: int, map_: torch.Tensor | None) -> None:
    _check_align_layout(ids, e, block, map_, jit_kernel.moe_align_block_size(ids, e, block, map_))


def _check_align_layout(
    ids: torch.Tensor, e: int, block: int, map_: torch.Tensor | None, outputs: tuple[torch.Tensor, ...]
) -> None:
    sorted_ids, expert_ids, post = outputs
    numel = ids.numel()
    assert sorted_ids.numel() == numel + min(numel, e) * (block - 1)
    segments, blocks, total = ref_align(ids, e, block, map_)
    assert int(post.item()) == total
    got = sorted_ids.cpu().tolist()
    offset = 0
    for seg in segments:
        padded = -(-len(seg) // block) * block
        assert sorted(got[offset : offset + len(seg)]) == seg
        assert got[offset + len(seg) : offset + padded] == [numel] * (padded - len(seg))
        offset += padded
    assert got[total:] == [numel] * (len(got) - total)
    assert expert_ids[: len(blocks)].cpu().tolist() == blocks
    assert (expert_ids[len(blocks) :] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("t", "k", "e", "block"),
    [
        (0, 8, 8, 16),
        (1, 2, 8, 16),
        (1, 2, 4, 1024),  # a sorted range of 2048 positions: the last one-CTA case of the one-pair-per-thread kernel
        (3, 1, 8, 1024),  # 3072 positions: two CTAs share the stores, slices of 2 and 1 pairs
        (7, 8, 256, 64),  # 56 pairs over two CTAs
        (16, 8, 256, 64),  # the benchmark's decode size: four CTAs
        (128, 8, 256, 64),  # 1024 pairs over eight CTAs
        (128, 8, 60, 24),  # 1024 pairs: the largest one-pair-per-thread case, a block size not a power of two
        (1000, 8, 128, 128),
        (1024, 8, 256, 64),  # 8192 pairs, the benchmark's 1,024 tokens
        (1025, 8, 1024, 1),  # 8200 pairs: the most experts, blocks of one
        (4096, 8, 257, 16),
        (512, 17, 33, 8),  # 8704 pairs: on the three-kernel path, three histogram chunks, the last partial
        (16384, 8, 256, 64),  # the benchmark's size: 32 chunks
        (3000, 8, 600, 4),  # 600 experts: one histogram row sum per expert
    ],
)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_block_size(t: int, k: int, e: int, block: int, dtype: torch.dtype) -> None:
    _check_align(t, k, e, block, None, dtype)


def _align_bounds() -> dict[str, int]:
    """The op's path bounds, from csrc/moe/align.cuh (the benchmark's reader of its constants)."""
    from jit_kernel.benchmark import bench_moe

    constants = bench_moe.align_constants()
    return {"kThreads": constants["kThreads"], "kSmallPairs": constants["kSmallPairs"]}


@pytest.mark.gpu
@pytest.mark.parametrize("bound", ["kThreads", "kSmallPairs"])
@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize(("e", "block"), [(256, 64), (60, 24)])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_at_the_path_bounds(bound: str, offset: int, e: int, block: int, dtype: torch.dtype) -> None:
    """One pair below, at and above each bound of the op's paths (one pair per thread up to kThreads,
    one CTA up to kSmallPairs, three kernels beyond), as the header sets them."""
    pairs = _align_bounds()[bound] + offset
    _check_align_ids(torch.randint(0, e, (pairs, 1), device="cuda", dtype=dtype), e, block, None)


@pytest.mark.gpu
@pytest.mark.parametrize(("pairs", "e"), [(512, 256), (1024, 60), (1536, 256), (9000, 128), (16384, 64)])
@pytest.mark.parametrize("mapped", [False, True])
def test_moe_align_every_path_at_every_size(pairs: int, e: int, mapped: bool) -> None:
    """The benchmark's path-forced launchers (bench_moe --align-sweep times them) give the op's layout,
    with and without an expert map, at sizes the op may send to another path: the one-CTA kernel and the
    three kernels from 512 pairs to 16,384, the one-pair-per-thread kernel up to kThreads."""
    from jit_kernel.benchmark import bench_moe

    module = bench_moe.align_paths_module()
    ids = torch.rand(pairs // 8, e, device="cuda").topk(8, dim=-1).indices.int()
    map_ = None
    if mapped:
        map_ = torch.full((e,), -1, dtype=torch.int32, device="cuda")
        map_[e // 4 : e // 2] = torch.arange(e // 2 - e // 4, dtype=torch.int32, device="cuda")
    block = 64
    length = pairs + min(pairs, e) * (block - 1)
    for path in bench_moe.align_paths_of(pairs):
        outputs = (
            torch.full((length,), -1, dtype=torch.int32, device="cuda"),
            torch.full((-(-length // block),), -1, dtype=torch.int32, device="cuda"),
            torch.full((1,), -1, dtype=torch.int32, device="cuda"),
        )
        getattr(module, path)(*outputs, ids, e, block, map_, None)
        _check_align_layout(ids, e, block, map_, outputs)


@pytest.mark.gpu
# 512 pairs: the one-pair-per-thread kernel over two CTAs; 2400 and 16000 take the op's larger paths (each path
# with a map: test_moe_align_every_path_at_every_size)
@pytest.mark.parametrize("t", [64, 300, 2000])
def test_moe_align_expert_map(t: int) -> None:
    e = 64
    map_ = torch.full((e,), -1, dtype=torch.int32, device="cuda")
    map_[16:32] = torch.arange(16, dtype=torch.int32, device="cuda")
    _check_align(t, 8, e, 32, map_, torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_moe_align_skips_invalid_ids_beyond_one_cta(dtype: torch.dtype) -> None:
    """The histogram path and the several-CTA one-pair-per-thread kernel skip ids outside
    [0, num_experts) as the one-CTA paths do."""
    _check_align_ids(torch.randint(-3, 67, (1500, 8), device="cuda", dtype=dtype), 64, 16, None)
    _check_align_ids(torch.randint(-3, 67, (100, 8), device="cuda", dtype=dtype), 64, 64, None)


@pytest.mark.gpu
def test_moe_align_skips_invalid_ids() -> None:
    ids = torch.tensor([[0, -1], [3, 8]], dtype=torch.int32, device="cuda")
    sorted_ids, expert_ids, post = jit_kernel.moe_align_block_size(ids, 8, 4)
    assert int(post.item()) == 8 and sorted_ids[:8].tolist() == [0, 4, 4, 4, 2, 4, 4, 4]
    assert expert_ids[:2].tolist() == [0, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("t", "k", "h"), [(0, 8, 128), (1, 1, 8), (5, 8, 7168), (33, 4, 1000), (3, 2, 13)])
@pytest.mark.parametrize("weighted", [False, True])
def test_moe_sum_reduce(t: int, k: int, h: int, weighted: bool, dtype: torch.dtype) -> None:
    x = torch.randn(t, k, h, device="cuda").to(dtype)
    w = torch.rand(t, k, device="cuda") if weighted else None
    out = torch.full((t, h), float("nan"), device="cuda", dtype=dtype)
    got = jit_kernel.moe_sum_reduce(x, w, out, 2.5)
    assert got is out
    ref = (x.float() * (w[..., None] if w is not None else 1.0)).sum(1) * 2.5
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.float(), ref, rtol=tol, atol=tol)
    torch.testing.assert_close(jit_kernel.moe_sum_reduce(x, w, routed_scaling_factor=2.5), got, rtol=0, atol=0)


@pytest.mark.gpu
def test_moe_sum_reduce_strided_and_same_dtype_weights() -> None:
    big = torch.randn(6, 4, 520, device="cuda", dtype=torch.bfloat16)
    x = big[:, :, 8:520]  # aligned, row stride 520
    w = torch.rand(6, 4, device="cuda", dtype=torch.bfloat16)
    ref = (x.float() * w.float()[..., None]).sum(1)
    torch.testing.assert_close(jit_kernel.moe_sum_reduce(x, w).float(), ref, rtol=1e-2, atol=1e-2)
    odd = big[:, :, 1:514]  # misaligned: the scalar kernel
    ref = (odd.float() * w.float()[..., None]).sum(1)
    torch.testing.assert_close(jit_kernel.moe_sum_reduce(odd, w).float(), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_routing_outputs_every_element() -> None:
    x = _logits(37, 256, torch.bfloat16)
    w, i = jit_kernel.grouped_topk(x, 8, 8, 4, True, None, 1.0, "sigmoid")
    assert torch.isfinite(w).all() and ((i >= 0) & (i < 256)).all()
    assert torch.allclose(w.sum(-1), torch.ones(37, device="cuda"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "config"),
    [
        (families.MOE_ROUTE, ("bf16_t",)),
        (families.MOE_ROUTE, ("fp32_t",)),
        (families.MOE_ALIGN, ()),
        (families.MOE_SUM_REDUCE, ("bf16_t",)),
    ],
    ids=lambda v: getattr(v, "family", None) or "-".join(map(str, v)) or "none",
)
def test_kernels_do_not_spill_on_sm90a(spec, config, tmp_path) -> None:
    """Every function of the unit: ptxas reports no spill for sm_90a (each spill in a latency-bound
    routing pick is a local-memory round trip). A kernel's stack frame only holds the arguments of its
    out-of-line rare paths (the routing's IEEE reciprocals and exact tie picks), which take arrays by
    pointer; those functions have none. Device code only (nvcc -cubin)."""
    import re
    import subprocess

    import tvm_ffi.libinfo

    from jit_kernel.engine import toolchain
    from jit_kernel.engine.unit import TranslationUnit

    unit = TranslationUnit.for_config(spec, config)
    source = tmp_path / "unit.cu"
    source.write_text(unit.text())
    includes = [f"-I{tvm_ffi.libinfo.find_include_path()}", f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}"]
    command = [str(toolchain.nvcc_path()), "-cubin", "-arch=sm_90a", "-Xptxas", "-v", *unit.compile_args(), *includes]
    result = subprocess.run([*command, str(source), "-o", str(tmp_path / "unit.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    kernels = set(re.findall(r"Compiling entry function '([^']+)'", result.stderr))
    properties = re.findall(
        r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
        result.stderr,
    )
    assert kernels and kernels <= {name for name, *_ in properties}, result.stderr[-4000:]
    spilled = [(name, stores, loads) for name, _, stores, loads in properties if (stores, loads) != ("0", "0")]
    assert not spilled, spilled
    framed_helpers = [(name, frame) for name, frame, *_ in properties if name not in kernels and frame != "0"]
    assert not framed_helpers, framed_helpers


# ---------------------------------------------------------------------------------------------
# The benchmark script (tests/test_benchmarks.py covers the shared helpers)


def _load_bench(monkeypatch: pytest.MonkeyPatch):
    import importlib

    for module in ("triton", "matplotlib", "pandas"):
        pytest.importorskip(module)
    monkeypatch.setenv("JIT_KERNEL_BENCH_CI", "1")
    monkeypatch.delenv("JIT_KERNEL_BENCH_OUT", raising=False)
    return importlib.reload(importlib.import_module("jit_kernel.benchmark.bench_moe"))


def test_bench_moe_on_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    """Imports without CUDA, declares one perf_report per op, its torch baselines compute the tests'
    references, and main() runs with a fake timer (every config and provider timed once)."""
    from jit_kernel.benchmark import _tables
    from jit_kernel.benchmark._tables import Measurements

    cuda_before = torch.cuda.is_initialized()
    bench = _load_bench(monkeypatch)
    try:
        assert torch.cuda.is_initialized() == cuda_before  # importing it touches no GPU
        assert [b.plot_name for b in bench.bench_moe.benchmarks] == [f"{op}-bf16" for op in bench.OPS]
        g, bias = torch.randn(5, 256), torch.randn(256) * 0.01
        dsv3 = {"groups": 8, "topk_group": 4, "scale": 2.5}
        for got, expected in [
            (bench.torch_grouped_topk(g, bias), ref_route(g, 8, softmax=False, renormalize=True, bias=bias, **dsv3)),
            (bench.torch_topk_softmax(g[:, :128]), ref_route(g[:, :128], 8, softmax=True, renormalize=True)),
            (bench.torch_topk_sigmoid(g, bias), ref_route(g, 8, softmax=False, renormalize=True, bias=bias)),
        ]:
            assert torch.equal(got[1], expected[1])
            torch.testing.assert_close(got[0], expected[0])
        ids = torch.randint(0, 256, (40, 8))
        sorted_ids, expert_ids, post = bench.torch_moe_align(ids, 256, 16)
        segments, blocks, total = ref_align(ids, 256, 16)
        assert int(post) == total and expert_ids[: len(blocks)].tolist() == blocks
        assert (expert_ids[len(blocks) :] == 0).all()
        expected_ids = [i for seg in segments for i in seg + [ids.numel()] * (-len(seg) % 16)]
        assert sorted_ids[:total].tolist() == expected_ids  # a stable sort: ascending within each expert
        x, w = torch.randn(3, 8, 64).bfloat16(), torch.rand(3, 8)
        torch.testing.assert_close(
            bench.torch_moe_sum_reduce(x, w).float(), (x.float() * w[..., None]).sum(1), rtol=1e-2, atol=1e-2
        )

        calls: list[tuple[object, str]] = []

        def timer(key: object, provider: str, make: object) -> float:
            calls.append((key, provider))
            return 10.0

        monkeypatch.setattr(bench, "RESULTS", Measurements(timer))
        monkeypatch.setattr(_tables, "empty_kernel_us", lambda: 2.5)
        monkeypatch.setattr(_tables, "device_name", lambda: "Fake GPU")
        monkeypatch.chdir(tmp_path)  # no save path: nothing may be written
        bench.main([])
        assert list(tmp_path.iterdir()) == []
        expected = sum(len(providers) * len(bench.tokens_of(op)) for op, (providers, _) in bench.OPS.items())
        assert len(calls) == len(set(calls)) == expected
        summary = capsys.readouterr().out.split("device: Fake GPU")[1]
        rows = [line for line in summary.splitlines() if line.startswith("| ") and "jit us" not in line]
        assert len(rows) == sum(len(bench.tokens_of(op)) for op in bench.OPS)
        # the CI-sized grid: routing at every size, the align also at 128 and 16,384, the combine at two
        assert [bench.tokens_of(op) for op in bench.OPS] == [
            *[[1, 16, 128, 1024, 4096]] * 3,
            [16, 128, 4096, 16384],
            [16, 4096],
        ]
        # "vs empty": up to 16 tokens, for the align up to 1,024 token-expert pairs (128 tokens)
        tiny = {t.name: [c[3] for c in t.configs] for t in bench.summary_tables()}
        assert tiny["moe_align_block_size"] == [True, True, False, False]
        assert tiny["grouped_topk"] == [True, True, False, False, False]
    finally:
        monkeypatch.undo()


def test_align_sweep_on_cpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bench_moe --align-sweep with a fake timer: every path timed once per size where it applies, the
    crossover and the suggested kSmallPairs of known times, the op's bounds read from the header."""
    from jit_kernel.benchmark._tables import Measurements

    cuda_before = torch.cuda.is_initialized()
    bench = _load_bench(monkeypatch)
    try:
        constants = bench.align_constants()
        assert constants["kThreads"] == 1024 and constants["kMaxSlicedCtas"] == 8 and "kSmallPairs" in constants
        assert bench.per_thread_ctas(1024, 256) == 8 and bench.per_thread_ctas(512, 64) == 3
        assert bench.align_paths_of(1024) == ["per_thread", "one_cta", "three_kernels"]
        assert bench.align_paths_of(1025) == ["one_cta", "three_kernels"]
        assert [bench.op_path(p) for p in (1024, 1025, constants["kSmallPairs"], constants["kSmallPairs"] + 1)] == [
            "per_thread",
            "one_cta",
            "one_cta",
            "three_kernels",
        ]
        calls: list[tuple[object, str]] = []

        def timer(key: object, path: str, make: object) -> float:
            calls.append((key, path))
            _, experts, pairs = key
            # one CTA grows with the pairs, three kernels start higher: they cross at 4,000 pairs (the
            # experts / 512 us added to every path moves no crossover)
            base = {"per_thread": 1.0, "one_cta": 1.5 + pairs / 1000, "three_kernels": 5.0 + pairs / 8000}[path]
            return base + experts / 512

        monkeypatch.setattr(bench, "sweep_timer", lambda rep_ms: timer)
        monkeypatch.setattr(bench, "align_paths_module", lambda: None)
        monkeypatch.setattr(bench, "device_name", lambda: "Fake GPU")
        bench.main(["--align-sweep", "--rep-ms", "5"])
        out = capsys.readouterr().out
        keys = bench.align_sweep_keys()
        assert len(keys) == len(bench.ALIGN_SWEEP_SERIES) * len(bench.ALIGN_SWEEP_PAIRS) == 90
        assert {k[2] for k in keys} == {512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384, 32768}
        assert {(k[0], k[1]) for k in keys} == {(t, e) for t in (2, 4, 8) for e in (64, 128, 256)}
        assert len(calls) == len(set(calls)) == sum(len(bench.align_paths_of(k[2])) for k in keys) == 198
        assert torch.cuda.is_initialized() == cuda_before

        results = bench.align_sweep(Measurements(timer))
        assert all(bench.series_crossover(results, t, e) == (3072, 4096) for t, e in bench.ALIGN_SWEEP_SERIES)
        assert bench.suggested_small_pairs(results) == 3072
        costs = dict((bound, total) for bound, total, _ in bench.threshold_costs(results))
        assert costs[3072] == pytest.approx(0.0) and costs[1024] > 0 and costs[32768] > costs[8192]
        rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
        series = len(bench.ALIGN_SWEEP_SERIES)
        assert len(rows) == 90 + series + len(costs)  # the paths' rows, the crossovers, the candidates
        assert "| 8 | 256 | 1024 | 128 | 1.50 (8 CTA) | 3.02 | 5.63 | per-thread | per-thread |" in out
        # the op's path follows align.cuh's bounds (the one CTA path up to kSmallPairs pairs)
        op_path = "one CTA" if bench.op_path(4096) == "one_cta" else "three kernels"
        assert f"| 8 | 256 | 4096 | 512 | - | 6.10 | 6.01 | three kernels | {op_path} |" in out
        assert f"suggested kSmallPairs: 3072 (csrc/moe/align.cuh has {constants['kSmallPairs']})" in out
        assert "device: Fake GPU" in out and "198 medians" in out
        for argv, message in [
            (["--align-sweep", "--json-dir", "x"], "takes only --rep-ms"),
            (["--rep-ms", "5"], "goes"),
        ]:
            with pytest.raises(SystemExit):
                bench.main(argv)
            assert message in capsys.readouterr().err
    finally:
        monkeypatch.undo()


@pytest.mark.slow
def test_align_sweep_module_builds_for_sm90a() -> None:
    """The sweep's one module (every path's launcher) builds for sm_90a without a GPU (the autouse
    fixture sets the arch)."""
    from jit_kernel.benchmark import bench_moe

    module = bench_moe.align_paths_module()
    assert all(module.implements_function(path) for path in bench_moe.ALIGN_PATHS)


@pytest.mark.gpu
def test_bench_moe_cases_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every provider's callable runs once (FlashInfer's where it is importable)."""
    import importlib.util

    bench = _load_bench(monkeypatch)
    for op, (providers, _) in bench.OPS.items():
        for provider in providers:
            if provider == "compile" or (provider == "flashinfer" and importlib.util.find_spec("flashinfer") is None):
                continue
            bench.moe_case(provider, op, 16)()
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_fast_paths_raise_the_full_paths_errors() -> None:
    """Once a good call has loaded a kernel, the public functions call it directly; a bad call must
    then raise the same error, word for word, as on a cold kernel table (the declared op's path)."""
    from jit_kernel.ops import moe

    def error(call: Callable[[], object]) -> tuple[type[BaseException], str]:
        with pytest.raises(Exception) as info:
            call()
        return type(info.value), str(info.value)

    g = torch.randn(4, 64, device="cuda").bfloat16()
    ids = torch.randint(0, 8, (4, 2), device="cuda", dtype=torch.int32)
    x = torch.randn(4, 2, 64, device="cuda").bfloat16()
    cases = [
        (
            moe._ROUTE,
            lambda: jit_kernel.topk_softmax(g, 2),
            [lambda: jit_kernel.topk_softmax(g, 65), lambda: jit_kernel.topk_softmax(g.t(), 2)],
        ),
        (
            moe._ROUTE,
            lambda: jit_kernel.topk_sigmoid(g, 2),
            [lambda: jit_kernel.topk_sigmoid(g, 2, True, torch.zeros(63, device="cuda"))],
        ),
        (
            moe._ROUTE,
            lambda: jit_kernel.grouped_topk(g, 2, 8, 2),
            [
                lambda: jit_kernel.grouped_topk(g, 2, 7, 2),
                lambda: jit_kernel.grouped_topk(g, 2, 8, 2, scoring_func="x"),
            ],
        ),
        (
            moe._ALIGN,
            lambda: jit_kernel.moe_align_block_size(ids, 8, 16),
            [
                lambda: jit_kernel.moe_align_block_size(ids.float(), 8, 16),
                lambda: jit_kernel.moe_align_block_size(ids, 8, 16, torch.zeros(7, device="cuda", dtype=torch.int32)),
            ],
        ),
        (
            moe._SUM,
            lambda: jit_kernel.moe_sum_reduce(x),
            [
                lambda: jit_kernel.moe_sum_reduce(x, torch.rand(4, 3, device="cuda")),
                lambda: jit_kernel.moe_sum_reduce(x[:, 0]),
            ],
        ),
    ]
    for table, good, bads in cases:
        for bad in bads:
            table.clear()  # cold: the first call of the key takes the full path
            cold = error(bad)
            good()
            assert table, "the good call did not arm the fast path"
            assert error(bad) == cold


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("t", [16, 2048])  # align: one CTA; 16,384 pairs, the three kernels with their workspace
def test_cuda_graph_replays_a_moe_layer(t: int, pdl: bool) -> None:
    """grouped_topk, moe_align_block_size and moe_sum_reduce captured in one CUDA graph (PDL on or
    off), replayed on new inputs into poisoned outputs: the eager calls' results on those inputs."""
    e, k, h, block = 256, 8, 512, 64
    g = _logits(t, e, torch.bfloat16)
    bias = torch.rand(e, device="cuda") * 1e-3
    x = torch.randn(t, k, h, device="cuda", dtype=torch.bfloat16)

    def layer() -> tuple[torch.Tensor, ...]:
        w, ids = jit_kernel.grouped_topk(g, k, 8, 4, True, bias, 2.5, "sigmoid", enable_pdl=pdl)
        sorted_ids, expert_ids, post = jit_kernel.moe_align_block_size(ids, e, block, enable_pdl=pdl)
        return w, ids, sorted_ids, expert_ids, post, jit_kernel.moe_sum_reduce(x, w, enable_pdl=pdl)

    layer()  # load (or compile) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    g.copy_(_logits(t, e, torch.bfloat16))
    x.copy_(torch.randn_like(x))
    for tensor in captured:
        tensor.fill_(float("nan") if tensor.is_floating_point() else -1)
    graph.replay()
    torch.cuda.synchronize()
    w, ids, sorted_ids, expert_ids, post, y = captured
    ew, eids, esorted, eexperts, epost, ey = layer()
    assert torch.equal(ids, eids) and torch.equal(w, ew) and torch.equal(y, ey)
    assert torch.equal(post, epost) and torch.equal(expert_ids, eexperts)
    n = int(post)

    # The order of pairs within an expert's run (which may span several blocks) is unspecified:
    # compare the runs as sets, keyed by each row's expert (expert_ids, equal above).
    def by_expert(s: torch.Tensor) -> torch.Tensor:
        rows_expert = expert_ids[: n // block].long().repeat_interleave(block)
        return (rows_expert * (t * k + 1) + s[:n].long()).sort().values

    assert torch.equal(by_expert(sorted_ids), by_expert(esorted)) and torch.equal(sorted_ids[n:], esorted[n:])
