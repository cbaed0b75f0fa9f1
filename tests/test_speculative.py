"""Speculative-decoding verification: chain_speculative_sampling, tree_speculative_sampling_target_only
and verify_tree_greedy.

GPU: each op against a pure-Python reference of its semantics, bit for bit (the chain reference
computes the same Philox draws, the tree ops take their uniforms as inputs), outputs poisoned first;
every probability dtype, int32 / int64 indices and counters, strided probability views, vector and
scalar rows, edge sizes, out-of-range indices (no fault; IndexError under JIT_KERNEL_CHECK_INDICES=1),
rows without mass; chi-square tests that the tokens chain speculative sampling emits follow the
target distribution; determinism, batch-slot independence of [B] seeds, CUDA-graph capture and
torch.compile. CPU: the references against known answers, and every bad input with its error (the
C++ launcher's checks run on fake CUDA tensors)."""

from __future__ import annotations

import itertools
import math
import struct

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_kernel.ops import _common

CHAIN = "chain_speculative_sampling"
TREE = "tree_speculative_sampling_target_only"
GREEDY = "verify_tree_greedy"
CHECK = "JIT_KERNEL_CHECK_INDICES"
FLT_MAX = 3.4028234663852886e38
FIXED_BITS = 40
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# ---------------------------------------------------------------------------------------------
# The references: plain Python over float32 values (every float32 operation is done in double and
# rounded once, which is exactly float32's for +, -, *, / of float32 operands)
# ---------------------------------------------------------------------------------------------

_M32 = 0xFFFFFFFF


def philox(seed: int, offset: int, index: int) -> list[int]:
    """Philox4x32-10 as <sgl_kernel/philox.cuh> draws it: key = seed, counter = (offset, index)."""
    c = [offset & _M32, (offset >> 32) & _M32, index & _M32, (index >> 32) & _M32]
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & _M32, p1 & _M32, ((p0 >> 32) ^ c[3] ^ k1) & _M32, p0 & _M32]
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return c


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def uniform01(word: int) -> float:
    return (word >> 8) / 2.0**24


def coin_bits(u: float) -> int:
    if not u > 0:
        return 0
    if u >= 1:
        return 2**64 - 1
    return int(u * 2.0**64)


def ref_draw(q: torch.Tensor, p: torch.Tensor | None, bits: int) -> int:
    """The token drawn from relu(q - p) (relu(q) without p, or where relu(q - p) has no mass) with the
    64-bit uniform ``bits``; -1 without mass. q, p: float32 rows."""

    def weights(draft: torch.Tensor | None) -> torch.Tensor:
        d = q - draft if draft is not None else q.clone()
        return torch.where((d > 0) & (d <= FLT_MAX), d, torch.zeros_like(d))

    w = weights(p)
    if p is not None and not float(w.max()) > 0:
        w = weights(None)
    largest = float(w.max())
    if not largest > 0:
        return -1
    shift = FIXED_BITS - math.frexp(largest)[1]
    fixed = torch.floor(w.double() * 2.0**shift).long()
    total = int(fixed.sum())
    r = (bits * total) >> 64
    return int(torch.searchsorted(torch.cumsum(fixed, 0), torch.tensor(r), right=True))


def ref_chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    seeds: list[int],
    offsets: list[int],
    own_streams: bool,
) -> tuple[torch.Tensor, list[int], list[int]]:
    """(output_token_ids, accepted, emitted) of chain_speculative_sampling, row b drawing from
    (seeds[b], offsets[b])."""
    dp, tp = draft_probs.float().cpu(), target_probs.float().cpu()
    ids = draft_token_ids.cpu().tolist()
    batch, n, vocab = dp.shape
    out = torch.full((batch, n + 1), -1, dtype=torch.int32)
    accepted_all, emitted_all = [], []
    for b in range(batch):
        seed, offset = seeds[b] % 2**64, offsets[b] % 2**64

        def draw(k: int, b: int = b, seed: int = seed, offset: int = offset) -> list[int]:
            return philox(seed, offset, k if own_streams else (b << 32) | k)

        pos, accepted = n, 0
        for i in range(n):
            token = ids[b][i]
            valid = 0 <= token < vocab
            q = float(tp[b, i, token]) if valid else 0.0
            p = float(dp[b, i, token]) if valid else 0.0
            words = draw(i)
            accept = f32(uniform01(words[0]) * p) < q
            independent = f32(uniform01(words[1]) * p) < q
            if pos == n and accept:
                accepted += 1
                out[b, i] = token
            else:
                pos = min(pos, i)
                accepted += independent
        words = draw(n)
        bits = (words[1] << 32) | words[0]
        out[b, pos] = ref_draw(tp[b, pos], dp[b, pos] if pos < n else None, bits)
        accepted_all.append(accepted)
        emitted_all.append(pos)
    return out, accepted_all, emitted_all


class Tree:
    """A batch of EAGLE draft trees in sgl-kernel's layout: node i of request b has token
    candidates[b][i], first child next_token[b][i], next sibling next_sibling[b][i], slot
    retrive_index[b][i] = b * D + i."""

    def __init__(self, candidates, next_token, next_sibling, retrive_index=None) -> None:
        self.candidates = candidates
        self.next_token = next_token
        self.next_sibling = next_sibling
        batch, nodes = len(candidates), len(candidates[0])
        self.retrive_index = retrive_index or [[b * nodes + i for i in range(nodes)] for b in range(batch)]

    def tensors(self, dtype: torch.dtype, device: str = "cuda") -> dict[str, torch.Tensor]:
        names = ("candidates", "retrive_index", "next_token", "next_sibling")
        keys = ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")
        return {k: torch.tensor(getattr(self, n), dtype=dtype, device=device) for k, n in zip(keys, names, strict=True)}


def _link(value: int, nodes: int) -> int:
    return value if 0 <= value < nodes else -1


def ref_tree_sampling(
    tree: Tree,
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_final: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float,
    threshold_acc: float,
) -> None:
    """tree_speculative_sampling_target_only on CPU tensors, in place (draft_probs float32)."""
    batch, nodes, vocab = target_probs.shape
    steps = accept_index.shape[1]
    tp = target_probs.float()
    single_threshold, acc_threshold = f32(threshold_single), max(f32(threshold_acc), f32(1e-9))
    for b in range(batch):

        def put(slot: int, token: int) -> None:
            if 0 <= slot < predicts.numel():
                predicts[slot] = token

        node, slot = 0, tree.retrive_index[b][0]
        accept_index[b, 0] = slot
        coin, prob_acc, accepted = float(uniform_samples[b, 0]), 0.0, 0
        for _ in range(1, steps):
            child, advanced = _link(tree.next_token[b][node], nodes), False
            tries = 0
            while child != -1 and tries < nodes:
                tries += 1
                token = tree.candidates[b][child]
                valid = 0 <= token < vocab
                single = float(tp[b, node, token]) if valid else 0.0
                prob_acc = f32(prob_acc + single)
                if valid and (coin <= f32(prob_acc / acc_threshold) or single >= single_threshold):
                    child_slot = tree.retrive_index[b][child]
                    put(slot, token)
                    accepted += 1
                    accept_index[b, accepted] = child_slot
                    prob_acc, node, slot = 0.0, child, child_slot
                    coin = float(uniform_samples[b, child])
                    advanced = True
                    break
                if valid:
                    draft_probs[b, node, token] = target_probs[b, node, token]
                child = _link(tree.next_sibling[b][child], nodes)
            if not advanced:
                break
        accept_token_num[b] = accepted
        bonus = accepted == steps - 1
        q = tp[b, node]
        p = None if bonus else draft_probs[b, node].float()
        put(slot, ref_draw(q, p, coin_bits(float(uniform_final[b]))))


def ref_tree_greedy(
    tree: Tree, predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor, target_predict
) -> None:
    """verify_tree_greedy on CPU tensors, in place."""
    batch, steps = accept_index.shape
    nodes = len(tree.candidates[0])
    flat = target_predict.reshape(-1).tolist()
    for b in range(batch):

        def put(slot: int, token: int) -> None:
            if 0 <= slot < predicts.numel():
                predicts[slot] = token

        def want(slot: int) -> int | None:
            return flat[slot] if 0 <= slot < len(flat) else None

        node, slot = 0, tree.retrive_index[b][0]
        accept_index[b, 0] = slot
        accepted = 0
        for _ in range(1, steps):
            child, advanced, tries = _link(tree.next_token[b][node], nodes), False, 0
            target = want(slot)
            while child != -1 and tries < nodes:
                tries += 1
                if target is not None and tree.candidates[b][child] == target:
                    child_slot = tree.retrive_index[b][child]
                    put(slot, target)
                    accepted += 1
                    accept_index[b, accepted] = child_slot
                    node, slot, advanced = child, child_slot, True
                    break
                child = _link(tree.next_sibling[b][child], nodes)
            if not advanced:
                break
        accept_token_num[b] = accepted
        if want(slot) is not None:
            put(slot, want(slot))


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _distributions(batch: int, rows: int, vocab: int, generator: torch.Generator, sharp: float = 2.0) -> torch.Tensor:
    logits = torch.randn(batch, rows, vocab, generator=generator) * sharp
    return torch.softmax(logits, dim=-1)


def _chain_inputs(batch: int, n: int, vocab: int, dtype: torch.dtype, seed: int, mix: float = 0.5):
    """Draft and target distributions that agree in part (so that some drafts are accepted and some
    rejected), drafts sampled from the draft distributions; on the GPU in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    target = _distributions(batch, n + 1, vocab, g)
    draft = mix * target[:, :n] + (1 - mix) * _distributions(batch, n, vocab, g)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, n)
    return draft.to(dtype).cuda(), ids.cuda(), target.to(dtype).cuda()


def _seed_list(value, batch: int) -> list[int]:
    if isinstance(value, torch.Tensor):
        values = value.tolist()
        return values * batch if len(values) == 1 else values
    return [value] * batch


def _assert_chain(got, draft, ids, target, seed, offset, own_streams: bool, base=(0, 0)) -> None:
    out, accepted, emitted = got
    batch = ids.shape[0]
    ref_out, ref_acc, ref_emit = ref_chain(
        draft, ids, target, _seed_list(seed, batch), _seed_list(offset, batch), own_streams
    )
    assert out.dtype == torch.int32 and out.shape == ref_out.shape
    assert torch.equal(out.cpu(), ref_out), (out.cpu(), ref_out)
    assert [int(a) - base[0] for a in accepted.tolist()] == ref_acc
    assert [int(e) - base[1] for e in emitted.tolist()] == ref_emit


def _chi_square_p(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test that ``observed`` counts follow ``probs`` (categories of
    probability 0 must have no count)."""
    total = float(observed.sum())
    mask = probs > 0
    assert int(observed[~mask].sum()) == 0, "a token of probability 0 was emitted"
    expected = probs[mask].double() * total
    stat = float(((observed[mask].double() - expected) ** 2 / expected).sum())
    df = int(mask.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))


# ---------------------------------------------------------------------------------------------
# CPU: the references against known answers
# ---------------------------------------------------------------------------------------------


def test_philox_reference_known_answers() -> None:
    """Random123's known answers for Philox4x32-10 (the header's own test vectors)."""
    assert philox(0, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox(2**64 - 1, 2**64 - 1, 2**64 - 1) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    seed = 0xA4093822 | (0x299F31D0 << 32)
    offset = 0x243F6A88 | (0x85A308D3 << 32)
    index = 0x13198A2E | (0x03707344 << 32)
    assert philox(seed, offset, index) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_reference_draw() -> None:
    q = torch.tensor([0.0, 0.25, 0.5, 0.25])
    p = torch.tensor([0.5, 0.25, 0.0, 0.25])
    # relu(q - p) = [0, 0, 0.5, 0]: token 2 whatever the uniform
    assert {ref_draw(q, p, bits) for bits in (0, 2**63, 2**64 - 1)} == {2}
    # relu(q) = [0, 0.25, 0.5, 0.25]: the uniform splits [0, 1) into quarters, halves, quarters
    assert [ref_draw(q, None, int(u * 2**64)) for u in (0.0, 0.24, 0.26, 0.74, 0.76, 0.999)] == [1, 1, 2, 2, 3, 3]
    assert ref_draw(q, q, 0) == 1  # no residual mass: from q
    assert ref_draw(torch.zeros(4), None, 5) == -1
    assert ref_draw(torch.tensor([float("nan"), float("inf"), 0.0, 1e-30]), None, 2**63) == 3


def _sgl_example(threshold: float):
    """sgl-kernel's example: two requests of six nodes, nearly one-hot targets."""
    tree = Tree(
        candidates=[[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]],
        next_token=[[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]],
        next_sibling=[[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]],
    )
    logits = torch.full((2, 6, 20), 1.0)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = logits[1, 0, 11] = logits[1, 4, 12] = 10
    for b in range(2):
        for i in range(6):
            if float(logits[b, i].max()) < 10:
                logits[b, i, 18] = 10
    target = torch.softmax(logits / 0.01, dim=-1)
    expected = {
        1.0: ([3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
        0.0: ([1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
    }[threshold]
    return tree, target, expected


@pytest.mark.parametrize("threshold", [1.0, 0.0])
def test_tree_reference_known_answers(threshold: float) -> None:
    tree, target, (predicts_exp, index_exp, num_exp) = _sgl_example(threshold)
    predicts = torch.full((12,), -1, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    num = torch.zeros(2, dtype=torch.int32)
    coins = torch.rand(2, 6, generator=torch.Generator().manual_seed(1))
    final = torch.rand(2, generator=torch.Generator().manual_seed(2))
    draft = torch.zeros_like(target)
    ref_tree_sampling(tree, predicts, accept_index, num, coins, final, target, draft, threshold, threshold)
    assert predicts.tolist() == predicts_exp
    assert accept_index.tolist() == index_exp
    assert num.tolist() == num_exp


def test_greedy_reference_known_answer() -> None:
    tree, target, (predicts_exp, index_exp, num_exp) = _sgl_example(1.0)
    predicts = torch.full((12,), -1, dtype=torch.int32)
    accept_index = torch.full((2, 4), -1, dtype=torch.int32)
    num = torch.zeros(2, dtype=torch.int32)
    ref_tree_greedy(tree, predicts, accept_index, num, target.argmax(-1))
    assert (predicts.tolist(), accept_index.tolist(), num.tolist()) == (predicts_exp, index_exp, num_exp)


# ---------------------------------------------------------------------------------------------
# GPU: chain_speculative_sampling against the reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("batch", "n", "vocab"),
    [(1, 1, 8), (3, 4, 1001), (5, 7, 4096), (2, 3, 32000), (1, 0, 16), (4, 40, 64), (2, 2, 151936)],
)
@pytest.mark.parametrize("seeds", ["ints", "tensors", "shared"])
def test_chain_matches_reference(dtype: torch.dtype, batch: int, n: int, vocab: int, seeds: str) -> None:
    draft, ids, target = _chain_inputs(batch, n, vocab, dtype, seed=batch * 1000 + n * 10 + vocab)
    if seeds == "ints":
        seed, offset, own = 1234, 77, batch == 1
    elif seeds == "tensors":
        seed = torch.randint(0, 2**62, (batch,), device="cuda")
        offset = torch.randint(0, 2**40, (batch,), device="cuda")
        own = True
    else:
        seed, offset, own = torch.tensor([99], device="cuda"), torch.tensor([5], device="cuda"), batch == 1
    got = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    _assert_chain(got, draft, ids, target, seed, offset, own)


@pytest.mark.gpu
def test_chain_counters_add_in_place_and_index_dtypes() -> None:
    draft, ids, target = _chain_inputs(6, 5, 300, torch.float32, seed=3)
    accepted = torch.arange(6, device="cuda", dtype=torch.int64) * 10
    emitted = torch.full((6,), 100, device="cuda", dtype=torch.int32)
    got = jit_kernel.chain_speculative_sampling(draft, ids.int(), target, accepted, emitted, seed=7, offset=8)
    assert got[1] is accepted and got[2] is emitted
    ref_out, ref_acc, ref_emit = ref_chain(draft, ids, target, [7] * 6, [8] * 6, False)
    assert torch.equal(got[0].cpu(), ref_out)
    assert accepted.tolist() == [10 * b + a for b, a in enumerate(ref_acc)]
    assert emitted.tolist() == [100 + e for e in ref_emit]


@pytest.mark.gpu
def test_chain_writes_every_output_element() -> None:
    """Through the registered op with a poisoned output: every element is written."""
    draft, ids, target = _chain_inputs(4, 6, 500, torch.float32, seed=4)
    out = torch.full((4, 7), 12345, dtype=torch.int32, device="cuda")
    accepted = torch.zeros(4, dtype=torch.int32, device="cuda")
    emitted = torch.zeros(4, dtype=torch.int32, device="cuda")
    torch.ops.jit_kernel.chain_speculative_sampling(draft, ids, target, out, accepted, emitted, None, None, 11, 12)
    ref_out, ref_acc, ref_emit = ref_chain(draft, ids, target, [11] * 4, [12] * 4, False)
    assert torch.equal(out.cpu(), ref_out)
    assert (accepted.tolist(), emitted.tolist()) == (ref_acc, ref_emit)


@pytest.mark.gpu
def test_chain_allocated_counters_are_written() -> None:
    """Counters the op allocates are written by the kernel, not zero-filled first: small blocks of
    the caching allocator are poisoned and freed, so that the op's allocations reuse them."""
    draft, ids, target = _chain_inputs(5, 4, 700, torch.float32, seed=6)
    poison = [torch.full((128,), -7, dtype=torch.int32, device="cuda") for _ in range(16)]
    del poison
    got = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=21, offset=22)
    _assert_chain(got, draft, ids, target, 21, 22, own_streams=False)


@pytest.mark.gpu
def test_chain_strided_and_unaligned_probabilities() -> None:
    """Views of wider buffers: rows at a padded stride (vector path) and at an odd offset (scalar path)."""
    batch, n, vocab = 3, 4, 1024
    draft, ids, target = _chain_inputs(batch, n, vocab, torch.float32, seed=5)
    wide_d = torch.zeros(batch, n, vocab + 64, device="cuda")
    wide_d[..., 16 : 16 + vocab] = draft
    wide_t = torch.zeros(batch, n + 2, vocab + 3, device="cuda")  # odd row stride: not 16-byte rows
    wide_t[:, 1:, 1 : 1 + vocab] = target
    views = (wide_d[..., 16 : 16 + vocab], wide_t[:, 1:, 1 : 1 + vocab])
    got = jit_kernel.chain_speculative_sampling(views[0], ids, views[1], seed=3, offset=4)
    _assert_chain(got, draft, ids, target, 3, 4, False)
    padded = torch.zeros(batch, n + 1, vocab + 64, device="cuda")  # 16-byte rows: the vector path
    padded[..., 32 : 32 + vocab] = target
    got = jit_kernel.chain_speculative_sampling(views[0], ids, padded[..., 32 : 32 + vocab], seed=3, offset=4)
    _assert_chain(got, draft, ids, target, 3, 4, False)


@pytest.mark.gpu
def test_chain_without_seed_draws_from_torch() -> None:
    """No seed: torch.randint on the device gives the seed (offset 0, rows mixed in)."""
    draft, ids, target = _chain_inputs(5, 3, 200, torch.float32, seed=6)
    generator = torch.Generator(device="cuda").manual_seed(2024)
    got = jit_kernel.chain_speculative_sampling(draft, ids, target, generator=generator)
    replay = torch.Generator(device="cuda").manual_seed(2024)
    seed = int(torch.randint(0, 2**62, (1,), device="cuda", dtype=torch.int64, generator=replay))
    _assert_chain(got, draft, ids, target, seed, 0, False)


@pytest.mark.gpu
def test_chain_out_of_range_drafts_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    draft, ids, target = _chain_inputs(4, 3, 50, torch.float32, seed=7, mix=1.0)
    ids[0, 0], ids[1, 1], ids[2, 2] = -1, 50, 2**40
    got = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=1, offset=2)
    _assert_chain(got, draft, ids, target, 1, 2, False)
    assert int(got[2][0]) == 0 and int(got[2][1]) <= 1 and int(got[2][2]) <= 2


@pytest.mark.gpu
def test_chain_index_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK, "1")
    draft, ids, target = _chain_inputs(2, 3, 50, torch.float32, seed=8)
    ids[1, 2] = 50
    with pytest.raises(IndexError, match=r"^chain_speculative_sampling: draft_token_ids\[1, 2\] = 50 is out of range"):
        jit_kernel.chain_speculative_sampling(draft, ids, target, seed=1, offset=2)
    ids[1, 2] = 0
    jit_kernel.chain_speculative_sampling(draft, ids, target, seed=1, offset=2)


@pytest.mark.gpu
def test_chain_rows_without_mass() -> None:
    """A residual without mass draws from the target; a target row without mass gives -1."""
    vocab = 10
    target = torch.full((3, 2, vocab), 0.1, device="cuda")
    draft = target[:, :1].clone()
    ids = torch.zeros(3, 1, dtype=torch.int64, device="cuda")
    draft[0, 0, 0] = 1.0  # reject is likely at row 0 (q / p = 0.1); relu(q - p) > 0 elsewhere
    draft[1, 0] = 1.0  # draft >= target everywhere: relu(q - p) = 0, so the token is from the target
    target[1, 0, 0] = 0.0  # ... and the draft token 0 is rejected for sure
    target[2, 1] = 0.0  # all accepted (q = p), then the bonus row is all zero: -1
    out, _, emitted = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=5, offset=0)
    ref_out, _, ref_emit = ref_chain(draft, ids, target, [5] * 3, [0] * 3, False)
    assert torch.equal(out.cpu(), ref_out)
    assert emitted.tolist() == ref_emit
    assert int(emitted[1]) == 0 and 1 <= int(out[1, 0]) < vocab
    assert out[2].tolist() == [0, -1] and int(emitted[2]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("nan_row", ["target", "draft"])
def test_chain_non_finite_inputs_do_not_fault(nan_row: str) -> None:
    draft, ids, target = _chain_inputs(3, 2, 64, torch.float32, seed=9)
    (target if nan_row == "target" else draft)[1, 0, ::3] = float("nan")
    target[2, 2, 5] = float("inf")
    got = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=2, offset=3)
    _assert_chain(got, draft, ids, target, 2, 3, False)


# ---------------------------------------------------------------------------------------------
# GPU: chain_speculative_sampling's distribution, determinism and streams
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chain_emits_the_target_distribution(dtype: torch.dtype) -> None:
    """Many copies of one request, drafts sampled from the draft model: the first token follows
    the target q_0; given that draft 0 was accepted, the second follows q_1; given both, the bonus
    follows q_2. Both models put zero mass on some tokens the other does not. (The expected
    distributions are computed from the rounded probabilities the kernel sees: bf16 rows do not sum
    to exactly 1.)"""
    rows, vocab, n = 60000, 7, 2
    g = torch.Generator().manual_seed(31)
    q = _distributions(1, n + 1, vocab, g, sharp=1.0)[0]
    p = _distributions(1, n, vocab, g, sharp=1.0)[0]
    q[0, 1] = 0
    p[0, 2] = 0
    p[1, 4] = 0
    q = (q / q.sum(-1, keepdim=True)).to(dtype).double()
    p = (p / p.sum(-1, keepdim=True)).to(dtype).double()
    ids = torch.stack([torch.multinomial(p[j], rows, replacement=True, generator=g) for j in range(n)], dim=1)
    draft = p.expand(rows, n, vocab).to(dtype).cuda()
    target = q.expand(rows, n + 1, vocab).to(dtype).cuda()
    out, accepted, emitted = jit_kernel.chain_speculative_sampling(draft, ids.cuda(), target, seed=777, offset=1)
    out, emitted = out.cpu().long(), emitted.cpu()
    assert (emitted == (out >= 0).sum(1) - 1).all()
    assert _chi_square_p(torch.bincount(out[:, 0], minlength=vocab), _emitted(p[0], q[0])) >= 1e-3
    second = torch.bincount(out[emitted >= 1, 1], minlength=vocab)
    assert _chi_square_p(second, _emitted(p[1], q[1])) >= 1e-3
    bonus = torch.bincount(out[emitted >= 2, 2], minlength=vocab)
    assert _chi_square_p(bonus, q[2] / q[2].sum()) >= 1e-3
    # the accepted count: up to the first rejection it counts the acceptance tests, from there on
    # (the rejected position included) an independent second test of the same draft. With k_j(d) =
    # min(1, q_j / p_j)(d), a_j = E[k_j], m_j = E[k_j^2] over drafts d ~ p_j and P_j the probability
    # that positions 0 .. j-1 were all accepted, position j counts with probability
    # P_j a_j + (a_j - P_j m_j).
    expected, prefix, variance = 0.0, 1.0, 0.0
    for j in range(n):
        drafted = p[j] / p[j].sum()
        keep = torch.where(p[j] > 0, (q[j] / p[j]).clamp(max=1), torch.zeros_like(p[j]))
        a, m = float((drafted * keep).sum()), float((drafted * keep**2).sum())
        e = prefix * a + a - prefix * m
        expected += e
        variance += e * (1 - e)
        prefix *= a
    sd = math.sqrt(n * variance * rows)  # Var(sum) <= n * sum(Var) per row
    assert abs(float(accepted.sum()) - expected * rows) < 5 * sd


def _emitted(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution of the token emitted at a position whose draft is sampled from p
    (normalised): the draft when accepted (probability min(1, q / p)), else a draw from relu(q - p)."""
    drafted = p / p.sum()
    keep = torch.where(p > 0, (q / p).clamp(max=1), torch.zeros_like(p))
    residual = (q - p).clamp(min=0)
    reject = float((drafted * (1 - keep)).sum())
    return drafted * keep + reject * residual / residual.sum()


@pytest.mark.gpu
def test_chain_determinism_and_slot_independence() -> None:
    batch, n, vocab = 8, 4, 5000
    draft, ids, target = _chain_inputs(batch, n, vocab, torch.float32, seed=10, mix=0.3)
    seed = torch.randint(0, 2**62, (batch,), device="cuda")
    offset = torch.randint(0, 2**30, (batch,), device="cuda")
    first = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    again = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    # the same (seed, offset) at other slots of a smaller batch: the same rows
    pick = torch.tensor([5, 0, 3], device="cuda")
    sub = jit_kernel.chain_speculative_sampling(
        draft[pick], ids[pick], target[pick], seed=seed[pick], offset=offset[pick]
    )
    for a, b in zip(sub, first, strict=True):
        assert torch.equal(a, b[pick])
    # another offset draws other numbers
    moved = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset + 1)
    assert not torch.equal(moved[0], first[0]) or not torch.equal(moved[1], first[1])


@pytest.mark.gpu
def test_chain_int_seed_rows_differ() -> None:
    """With one int seed, identical rows get different draws (the row is part of the stream)."""
    draft, ids, target = _chain_inputs(1, 3, 1000, torch.float32, seed=11, mix=0.0)
    rows = 64
    out, _, _ = jit_kernel.chain_speculative_sampling(
        draft.expand(rows, -1, -1), ids.expand(rows, -1).contiguous(), target.expand(rows, -1, -1), seed=1, offset=0
    )
    assert len({tuple(r) for r in out.tolist()}) > rows // 2


@pytest.mark.gpu
def test_chain_cuda_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    batch, n, vocab = 4, 3, 2000
    draft, ids, target = _chain_inputs(batch, n, vocab, torch.float32, seed=12, mix=0.2)
    seed = torch.randint(0, 2**62, (batch,), device="cuda")
    offset = torch.zeros(batch, dtype=torch.int64, device="cuda")

    def step():
        return jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    for round_ in range(3):
        offset.copy_(torch.full_like(offset, 1000 * round_ + 1))
        graph.replay()
        torch.cuda.synchronize()
        _assert_chain(outputs, draft, ids, target, seed, offset, True)

    # without a seed: the captured torch.randint draws a new seed at each replay
    unseeded = torch.cuda.CUDAGraph()
    with torch.cuda.graph(unseeded):
        drawn = jit_kernel.chain_speculative_sampling(draft, ids, target)
    seen = set()
    for _ in range(4):
        unseeded.replay()
        torch.cuda.synchronize()
        out = drawn[0].cpu()
        for b in range(batch):
            pos = int(drawn[2][b])
            assert out[b, :pos].tolist() == ids[b, :pos].tolist()
            assert 0 <= int(out[b, pos]) < vocab and (out[b, pos + 1 :] == -1).all()
        seen.add(tuple(out.reshape(-1).tolist()))
    assert len(seen) > 1


@pytest.mark.gpu
def test_chain_torch_compile_fullgraph() -> None:
    torch._dynamo.reset()
    draft, ids, target = _chain_inputs(3, 4, 700, torch.float32, seed=13)
    seed = torch.tensor([1, 2, 3], device="cuda")
    offset = torch.tensor([4, 5, 6], device="cuda")

    def fn(draft, ids, target, seed, offset):
        out, accepted, emitted = jit_kernel.chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
        return out, accepted + 0, emitted * 1

    expected = fn(draft, ids, target, seed, offset)
    got = torch.compile(fn, fullgraph=True)(draft, ids, target, seed, offset)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    explanation = torch._dynamo.explain(fn)(draft, ids, target, seed, offset)
    assert explanation.graph_break_count == 0, explanation.break_reasons


# ---------------------------------------------------------------------------------------------
# GPU: the tree ops against the references
# ---------------------------------------------------------------------------------------------


def _outputs(batch: int, nodes: int, steps: int, device: str = "cuda"):
    """Poisoned outputs: predicts [B * D] (+3 slots never named), accept_index [B, S], accept_token_num."""
    return (
        torch.full((batch * nodes + 3,), -7, dtype=torch.int32, device=device),
        torch.full((batch, steps), -5, dtype=torch.int32, device=device),
        torch.full((batch,), -3, dtype=torch.int32, device=device),
    )


def _random_tree(batch: int, nodes: int, vocab: int, target: torch.Tensor, g: torch.Generator) -> Tree:
    """Random trees whose children's tokens are drawn from the target at their parent (so that some
    are accepted), siblings in random order."""
    candidates, next_token, next_sibling = [], [], []
    for b in range(batch):
        parent = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]
        children = [
            [c for c in torch.randperm(nodes, generator=g).tolist() if c > 0 and parent[c] == i] for i in range(nodes)
        ]
        nt, ns = [-1] * nodes, [-1] * nodes
        for i, kids in enumerate(children):
            if kids:
                nt[i] = kids[0]
                for a, c in itertools.pairwise(kids):
                    ns[a] = c
        tokens = [int(torch.randint(0, vocab, (1,), generator=g))]
        for i in range(1, nodes):
            tokens.append(int(torch.multinomial(target[b, parent[i]].float(), 1, generator=g)))
        candidates.append(tokens)
        next_token.append(nt)
        next_sibling.append(ns)
    return Tree(candidates, next_token, next_sibling)


def _tree_case(batch: int, nodes: int, vocab: int, dtype: torch.dtype, seed: int, sharp: float = 4.0):
    g = torch.Generator().manual_seed(seed)
    target = _distributions(batch, nodes, vocab, g, sharp).to(dtype)
    tree = _random_tree(batch, nodes, vocab, target, g)
    coins = torch.rand(batch, nodes, generator=g)
    final = torch.rand(batch, generator=g)
    return tree, target, coins, final


def _run_tree(tree, target, coins, final, steps, index_dtype, threshold_single=1.0, threshold_acc=1.0, draft=None):
    batch, nodes, _ = target.shape
    if draft is None:
        draft = torch.zeros_like(target)
    outputs = _outputs(batch, nodes, steps)
    got_draft = draft.cuda()
    jit_kernel.tree_speculative_sampling_target_only(
        *outputs,
        **tree.tensors(index_dtype),
        uniform_samples=coins.cuda(),
        uniform_samples_for_final_sampling=final.cuda(),
        target_probs=target.cuda(),
        draft_probs=got_draft,
        threshold_single=threshold_single,
        threshold_acc=threshold_acc,
    )
    expected = [t.cpu() for t in _outputs(batch, nodes, steps, "cpu")]
    ref_draft = draft.clone()
    ref_tree_sampling(tree, *expected, coins, final, target, ref_draft, threshold_single, threshold_acc)
    for got, exp in zip(outputs, expected, strict=True):
        assert torch.equal(got.cpu(), exp), (got.cpu(), exp)
    assert torch.equal(got_draft.cpu(), ref_draft)
    return outputs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(
    ("batch", "nodes", "steps", "vocab"), [(1, 1, 1, 8), (2, 6, 4, 20), (7, 12, 5, 1001), (3, 30, 8, 32000)]
)
@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.0, 0.0), (0.6, 0.3)])
def test_tree_matches_reference(dtype, index_dtype, batch, nodes, steps, vocab, thresholds) -> None:
    tree, target, coins, final = _tree_case(batch, nodes, vocab, dtype, seed=batch * 100 + nodes + vocab)
    _run_tree(tree, target, coins, final, steps, index_dtype, *thresholds)


@pytest.mark.gpu
@pytest.mark.parametrize("threshold", [1.0, 0.0])
def test_tree_known_answers(threshold: float) -> None:
    tree, target, (predicts_exp, index_exp, num_exp) = _sgl_example(threshold)
    predicts = torch.full((12,), -1, dtype=torch.int32, device="cuda")
    accept_index = torch.full((2, 4), -1, dtype=torch.int32, device="cuda")
    num = torch.zeros(2, dtype=torch.int32, device="cuda")
    jit_kernel.tree_speculative_sampling_target_only(
        predicts,
        accept_index,
        num,
        **tree.tensors(torch.int64),
        uniform_samples=torch.rand(2, 6, device="cuda"),
        uniform_samples_for_final_sampling=torch.rand(2, device="cuda"),
        target_probs=target.cuda(),
        draft_probs=torch.zeros(2, 6, 20, device="cuda"),
        threshold_single=threshold,
        threshold_acc=threshold,
        deterministic=True,
    )
    assert (predicts.tolist(), accept_index.tolist(), num.tolist()) == (predicts_exp, index_exp, num_exp)


@pytest.mark.gpu
def test_tree_nonzero_draft_and_strided_views() -> None:
    """A draft distribution that is not zero (relu(target - draft) at the last node), probabilities as
    views at padded and odd strides."""
    batch, nodes, vocab, steps = 4, 10, 777, 4
    tree, target, coins, final = _tree_case(batch, nodes, vocab, torch.float32, seed=21, sharp=1.0)
    draft = _distributions(batch, nodes, vocab, torch.Generator().manual_seed(22), sharp=1.0)
    _run_tree(tree, target, coins, final, steps, torch.int64, draft=draft)
    wide = torch.zeros(batch, nodes, vocab + 5, device="cuda")
    wide[..., 2 : 2 + vocab] = target.cuda()
    outputs = _outputs(batch, nodes, steps)
    jit_kernel.tree_speculative_sampling_target_only(
        *outputs, **tree.tensors(torch.int64), uniform_samples=coins.cuda(),
        uniform_samples_for_final_sampling=final.cuda(), target_probs=wide[..., 2 : 2 + vocab],
        draft_probs=torch.zeros(batch, nodes, vocab, device="cuda"),
    )  # fmt: skip
    expected = _outputs(batch, nodes, steps, "cpu")
    ref_tree_sampling(tree, *expected, coins, final, target, torch.zeros_like(target), 1.0, 1.0)
    for got, exp in zip(outputs, expected, strict=True):
        assert torch.equal(got.cpu(), exp)


@pytest.mark.gpu
def test_tree_malformed_does_not_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Links outside [-1, D), cycles, slots outside predicts, tokens outside the vocabulary: no fault,
    the reference's answer."""
    monkeypatch.delenv(CHECK, raising=False)
    batch, nodes, vocab, steps = 3, 5, 40, 5
    tree, target, coins, final = _tree_case(batch, nodes, vocab, torch.float32, seed=23)
    tree.next_token[0][0] = 17  # ends the list
    tree.next_sibling[1] = [1, 2, 1, 2, 1]  # a sibling cycle
    tree.next_token[1][0] = 1
    tree.candidates[1][1] = vocab + 3
    tree.candidates[2][1:] = [-4, 10**6, 3, 3]
    tree.retrive_index[2][0] = 10**9
    tree.next_token[2][0] = 1
    tree.next_sibling[2] = [-1, 2, 3, 4, -1]
    _run_tree(tree, target, coins, final, steps, torch.int64, 0.0, 0.0)
    _run_tree(tree, target, coins, final, steps, torch.int64, 1.0, 1.0)


@pytest.mark.gpu
def test_tree_index_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK, "1")
    batch, nodes, vocab, steps = 2, 4, 30, 3
    tree, target, coins, final = _tree_case(batch, nodes, vocab, torch.float32, seed=24)

    def call(**edit):
        tensors = tree.tensors(torch.int64) | {k: v() for k, v in edit.items()}
        jit_kernel.tree_speculative_sampling_target_only(
            *_outputs(batch, nodes, steps), **tensors, uniform_samples=coins.cuda(),
            uniform_samples_for_final_sampling=final.cuda(), target_probs=target.cuda(),
            draft_probs=torch.zeros_like(target).cuda(),
        )  # fmt: skip

    call()

    def with_value(name, index, value):
        def make():
            t = tree.tensors(torch.int64)[name]
            t[index] = value
            return t

        return make

    with pytest.raises(IndexError, match=r"^tree_speculative_sampling_target_only: candidates\[1, 2\] = 30 is out"):
        call(candidates=with_value("candidates", (1, 2), 30))
    with pytest.raises(IndexError, match=r"retrive_index\[0, 3\] = 11 is out of range: it must be in \[0, 11\)"):
        call(retrive_index=with_value("retrive_index", (0, 3), 11))
    with pytest.raises(IndexError, match=r"retrive_next_sibling\[1, 0\] = -2 is out of range: it must be in \[-1, 4\)"):
        call(retrive_next_sibling=with_value("retrive_next_sibling", (1, 0), -2))
    with pytest.raises(IndexError, match=r"retrive_next_token\[0, 1\] = 4 is out of range"):
        call(retrive_next_token=with_value("retrive_next_token", (0, 1), 4))


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize(("batch", "nodes", "steps"), [(1, 1, 1), (2, 6, 4), (300, 16, 6), (5, 40, 12)])
def test_greedy_matches_reference(index_dtype: torch.dtype, batch: int, nodes: int, steps: int) -> None:
    vocab = 50
    g = torch.Generator().manual_seed(batch + nodes)
    target = _distributions(batch, nodes, vocab, g, sharp=3.0)
    tree = _random_tree(batch, nodes, vocab, target, g)
    target_predict = target.argmax(-1)
    outputs = _outputs(batch, nodes, steps)
    jit_kernel.verify_tree_greedy(
        *outputs, **tree.tensors(index_dtype), target_predict=target_predict.to(index_dtype).cuda()
    )
    expected = _outputs(batch, nodes, steps, "cpu")
    ref_tree_greedy(tree, *expected, target_predict)
    for got, exp in zip(outputs, expected, strict=True):
        assert torch.equal(got.cpu(), exp)
    if batch >= 300:
        assert int(outputs[2].max()) >= 1  # some children were accepted


@pytest.mark.gpu
def test_greedy_known_answer_and_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    tree, target, (predicts_exp, index_exp, num_exp) = _sgl_example(1.0)
    predicts = torch.full((12,), -1, dtype=torch.int32, device="cuda")
    accept_index = torch.full((2, 4), -1, dtype=torch.int32, device="cuda")
    num = torch.zeros(2, dtype=torch.int32, device="cuda")
    argmax = target.argmax(-1).cuda()
    jit_kernel.verify_tree_greedy(predicts, accept_index, num, **tree.tensors(torch.int64), target_predict=argmax)
    assert (predicts.tolist(), accept_index.tolist(), num.tolist()) == (predicts_exp, index_exp, num_exp)
    tree.retrive_index[0][3] = 99  # a slot outside predicts and target_predict
    tree.next_sibling[1] = [0, 0, 0, 0, 0, 0]
    outputs = _outputs(2, 6, 4)
    jit_kernel.verify_tree_greedy(*outputs, **tree.tensors(torch.int64), target_predict=argmax)
    expected = _outputs(2, 6, 4, "cpu")
    ref_tree_greedy(tree, *expected, argmax.cpu())
    for got, exp in zip(outputs, expected, strict=True):
        assert torch.equal(got.cpu(), exp)


@pytest.mark.gpu
def test_greedy_index_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK, "1")
    tree, target, _ = _sgl_example(1.0)
    tree.retrive_index[1][2] = 12
    with pytest.raises(
        IndexError, match=r"^verify_tree_greedy: retrive_index\[1, 2\] = 12 is out of range: it must be"
    ):
        jit_kernel.verify_tree_greedy(
            *_outputs(2, 6, 4), **tree.tensors(torch.int64), target_predict=target.argmax(-1).cuda()
        )


@pytest.mark.gpu
def test_tree_ops_cuda_graph_and_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECK, raising=False)
    batch, nodes, vocab, steps = 4, 8, 300, 4
    tree, target, coins, final = _tree_case(batch, nodes, vocab, torch.float32, seed=25)
    tensors = tree.tensors(torch.int64)
    coins_d, final_d, target_d = coins.cuda(), final.cuda(), target.cuda()
    draft_d = torch.zeros_like(target_d)
    sampled, greedy = _outputs(batch, nodes, steps), _outputs(batch, nodes, steps)
    argmax = target_d.argmax(-1)

    def step():
        jit_kernel.tree_speculative_sampling_target_only(
            *sampled, **tensors, uniform_samples=coins_d, uniform_samples_for_final_sampling=final_d,
            target_probs=target_d, draft_probs=draft_d,
        )  # fmt: skip
        jit_kernel.verify_tree_greedy(*greedy, **tensors, target_predict=argmax)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    g = torch.Generator().manual_seed(26)
    for _ in range(3):
        new_coins, new_final = torch.rand(batch, nodes, generator=g), torch.rand(batch, generator=g)
        coins_d.copy_(new_coins)
        final_d.copy_(new_final)
        draft_d.zero_()
        for t in (*sampled, *greedy):
            t.fill_(-9)
        graph.replay()
        torch.cuda.synchronize()
        expected = [torch.full_like(t.cpu(), -9) for t in sampled]
        ref_tree_sampling(tree, *expected, new_coins, new_final, target, torch.zeros_like(target), 1.0, 1.0)
        for got, exp in zip(sampled, expected, strict=True):
            assert torch.equal(got.cpu(), exp)
        expected = [torch.full_like(t.cpu(), -9) for t in greedy]
        ref_tree_greedy(tree, *expected, argmax.cpu())
        for got, exp in zip(greedy, expected, strict=True):
            assert torch.equal(got.cpu(), exp)

    torch._dynamo.reset()

    def fn(predicts, accept_index, num, draft):
        jit_kernel.tree_speculative_sampling_target_only(
            predicts, accept_index, num, **tensors, uniform_samples=coins_d,
            uniform_samples_for_final_sampling=final_d, target_probs=target_d, draft_probs=draft,
        )  # fmt: skip
        return num * 2

    eager_out, compiled_out = _outputs(batch, nodes, steps), _outputs(batch, nodes, steps)
    eager_draft, compiled_draft = torch.zeros_like(target_d), torch.zeros_like(target_d)
    expected = fn(*eager_out, eager_draft)
    got = torch.compile(fn, fullgraph=True)(*compiled_out, compiled_draft)
    assert torch.equal(got, expected)
    for a, b in zip((*compiled_out, compiled_draft), (*eager_out, eager_draft), strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# CPU: bad inputs (fake CUDA tensors; the C++ launcher's checks run, nothing launches)
# ---------------------------------------------------------------------------------------------


def _e(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


def _i64(*shape: int) -> torch.Tensor:
    return _e(*shape, dtype=torch.int64)


def _chain_args(**overrides):
    args = {"draft_probs": _e(4, 3, 100), "draft_token_ids": _i64(4, 3), "target_probs": _e(4, 4, 100)}
    return args | {name: make() for name, make in overrides.items()}


CHAIN_BAD = [
    ({"draft_probs": lambda: [1.0]}, TypeError,
     r"^chain_speculative_sampling: draft_probs must be a torch\.Tensor, got list$"),
    ({"draft_token_ids": lambda: (1, 2)}, TypeError,
     r"^chain_speculative_sampling: draft_token_ids must be a torch\.Tensor, got tuple$"),
    ({"target_probs": lambda: None}, TypeError,
     r"^chain_speculative_sampling: target_probs must be a torch\.Tensor, got NoneType$"),
    ({"draft_probs": lambda: _e(4, 3, 100, dtype=torch.float64)}, TypeError,
     r"chain_speculative_sampling: draft_probs must be one of \(float16, bfloat16, float32\), got float64"),
    ({"target_probs": lambda: _e(4, 4, 100, dtype=torch.bfloat16)}, TypeError,
     r"(?s)'target_probs'.*Dtype mismatch: expected float32 but got bfloat16"),
    ({"draft_token_ids": lambda: _e(4, 3)}, TypeError,
     r"(?s)'draft_token_ids'.*Dtype mismatch: expected one of \[int32, int64\] but got float32"),
    ({"draft_token_ids": lambda: _i64(12)}, ValueError,
     r"chain_speculative_sampling: draft_token_ids must have 2 dimensions \[batch_size, num_speculate_tokens\], got 1"),
    ({"draft_token_ids": lambda: _i64(4, 2)}, ValueError,
     r"(?s)'draft_token_ids'.*Size mismatch for shape#1\('num_speculate_tokens'\): expected 3 but got 2"),
    ({"draft_token_ids": lambda: _i64(5, 3)}, ValueError,
     r"(?s)'draft_token_ids'.*Size mismatch for shape#0\('batch_size'\): expected 4 but got 5"),
    ({"draft_token_ids": lambda: _i64(3, 4).t()}, ValueError, r"(?s)'draft_token_ids'.*not contiguous"),
    ({"target_probs": lambda: _e(4, 3, 100)}, ValueError,
     r"chain_speculative_sampling: target_probs must have num_speculate_tokens \+ 1 = 4 distributions per request"),
    ({"target_probs": lambda: _e(4, 4, 99)}, ValueError,
     r"(?s)'target_probs'.*Size mismatch for shape#2\('vocab_size'\): expected 100 but got 99"),
    ({"target_probs": lambda: _e(2, 4, 100)}, ValueError, r"(?s)'target_probs'.*shape#0\('batch_size'\)"),
    ({"draft_probs": lambda: _e(4, 3, 100, 1)}, ValueError, r"(?s)'draft_probs'.*Rank mismatch: expected 3 but got 4"),
    ({"draft_probs": lambda: _e(4, 100, 3).transpose(1, 2)}, ValueError, r"(?s)'draft_probs'.*Stride mismatch"),
    ({"target_probs": lambda: _e(4, 4, 100, device="cpu")}, ValueError,
     r"(?s)'target_probs'.*Device mismatch: expected cuda(:0)? but got cpu"),
    ({"draft_probs": lambda: _e(4, 3, 0), "target_probs": lambda: _e(4, 4, 0)}, ValueError,
     r"chain_speculative_sampling: vocab_size must be in \[1, 1048576\], got 0"),
    ({"draft_probs": lambda: _e(1, 1, 2**20 + 1), "draft_token_ids": lambda: _i64(1, 1),
      "target_probs": lambda: _e(1, 2, 2**20 + 1)}, ValueError, r"vocab_size must be in \[1, 1048576\], got 1048577"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), CHAIN_BAD)
def test_chain_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = _chain_args(**overrides)
        with pytest.raises(error, match=match):
            jit_kernel.chain_speculative_sampling(**args, seed=1, offset=2)


CHAIN_BAD_EXTRA = [
    ({"maybe_output_accepted_token_num": lambda: _e(4)}, TypeError,
     r"(?s)'output_accepted_token_num'.*Dtype mismatch: expected one of \[int32, int64\] but got float32"),
    ({"maybe_output_emitted_draft_token_num": lambda: _i64(5)}, ValueError,
     r"(?s)'output_emitted_draft_token_num'.*shape#0\('batch_size'\): expected 4 but got 5"),
    ({"maybe_output_accepted_token_num": lambda: "x"}, TypeError,
     r"^chain_speculative_sampling: output_accepted_token_num must be a torch\.Tensor, got str$"),
    ({"offset": lambda: 1}, ValueError,
     r"^chain_speculative_sampling: offset is given without seed; pass both, or neither to draw from torch$"),
    ({"seed": lambda: 1, "offset": lambda: _i64(4)}, ValueError,
     r"^chain_speculative_sampling: seed and offset must both be tensors or both be ints$"),
    ({"seed": lambda: 1.5, "offset": lambda: 0}, TypeError,
     r"^chain_speculative_sampling: seed must be an int64 CUDA tensor, an int or None, got float$"),
    ({"seed": lambda: 1, "offset": lambda: True}, TypeError,
     r"^chain_speculative_sampling: offset must be an int64 CUDA tensor, an int or None, got bool$"),
    ({"seed": lambda: 2**64, "offset": lambda: 0}, ValueError,
     r"^chain_speculative_sampling: seed must fit in 64 bits, got 18446744073709551616$"),
    ({"seed": lambda: 0, "offset": lambda: -(2**63) - 1}, ValueError, r"offset must fit in 64 bits"),
    ({"seed": lambda: _i64(3), "offset": lambda: _i64(4)}, ValueError,
     r"(?s)'seed'.*Size mismatch for shape#0\('seed_length'\): expected one of \[1, 4\] but got 3"),
    ({"seed": lambda: _i64(4), "offset": lambda: _i64(2)}, ValueError,
     r"(?s)'offset'.*Size mismatch for shape#0\('offset_length'\): expected one of \[1, 4\] but got 2"),
    ({"seed": lambda: _e(4, dtype=torch.int32), "offset": lambda: _i64(4)}, TypeError,
     r"(?s)'seed'.*Dtype mismatch: expected one of \[int64, uint64\] but got int32"),
    ({"seed": lambda: _i64(4, 1), "offset": lambda: _i64(4)}, ValueError, r"(?s)'seed'.*Rank mismatch"),
    ({"seed": lambda: _i64(4), "offset": lambda: _e(4, dtype=torch.int64, device="cpu")}, ValueError,
     r"(?s)'offset'.*Device mismatch"),
]  # fmt: skip


@pytest.mark.parametrize(("kwargs", "error", "match"), CHAIN_BAD_EXTRA)
def test_chain_bad_outputs_and_seeds(kwargs, error: type[Exception], match: str) -> None:
    with fake_cuda():
        kwargs = {name: make() for name, make in kwargs.items()}
        if "seed" not in kwargs and "offset" not in kwargs:
            kwargs |= {"seed": 1, "offset": 2}
        with pytest.raises(error, match=match):
            jit_kernel.chain_speculative_sampling(**_chain_args(), **kwargs)


def test_chain_valid_fake_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid calls pass every C++ check on FakeTensors and return before any CUDA call."""
    monkeypatch.setenv(CHECK, "1")  # the index check skips FakeTensors (no values)
    with fake_cuda():
        args = _chain_args()
        out, accepted, emitted = jit_kernel.chain_speculative_sampling(**args)
        assert (out.shape, out.dtype, accepted.shape, emitted.dtype) == ((4, 4), torch.int32, (4,), torch.int32)
        jit_kernel.chain_speculative_sampling(**args, seed=2**64 - 1, offset=-1)
        jit_kernel.chain_speculative_sampling(**args, seed=_i64(4), offset=_i64(1))
        jit_kernel.chain_speculative_sampling(**args, seed=_e(1, dtype=torch.uint64), offset=_i64(4))
        strided = torch.empty_strided((4, 3, 100), (1000, 128, 1), device="cuda")
        jit_kernel.chain_speculative_sampling(strided, _e(4, 3, dtype=torch.int32), args["target_probs"], _i64(4), None)
        # no drafts (only the bonus token), and an empty batch
        jit_kernel.chain_speculative_sampling(_e(4, 0, 100), _i64(4, 0), _e(4, 1, 100), seed=1, offset=1)
        jit_kernel.chain_speculative_sampling(_e(0, 3, 100), _i64(0, 3), _e(0, 4, 100), seed=1, offset=1)


def test_chain_seed_forms_reach_the_launcher() -> None:
    """The seed rule the sampler shares: an int seed alone has offset 0, 64-bit ints of either sign
    pass as their int64 bits, tensors pass as they are, and no seed draws one on the device."""
    with fake_cuda():
        args = _chain_args()

        def launched(**seeds: object) -> tuple[object, ...]:
            [(_, launch)], _ = _common.recorded_launches(lambda: jit_kernel.chain_speculative_sampling(**args, **seeds))
            return launch[6:10]  # seed tensor, offset tensor, seed int, offset int

        assert launched(seed=5) == (None, None, 5, 0)
        assert launched(seed=2**64 - 1, offset=2**63) == (None, None, -1, -(2**63))
        seed, offset = _i64(4), _i64(4)
        assert launched(seed=seed, offset=offset)[:2] == (seed, offset)
        drawn, none, *_ = launched()
        assert isinstance(drawn, torch.Tensor) and drawn.dtype == torch.int64 and drawn.shape == (1,) and none is None


def _tree_args(nodes: int = 6, **overrides):
    args = {
        "predicts": _e(12, dtype=torch.int32),
        "accept_index": _e(2, 4, dtype=torch.int32),
        "accept_token_num": _e(2, dtype=torch.int32),
        "candidates": _i64(2, nodes),
        "retrive_index": _i64(2, nodes),
        "retrive_next_token": _i64(2, nodes),
        "retrive_next_sibling": _i64(2, nodes),
        "uniform_samples": _e(2, nodes),
        "uniform_samples_for_final_sampling": _e(2),
        "target_probs": _e(2, nodes, 20),
        "draft_probs": _e(2, nodes, 20),
    }
    return args | {name: make() for name, make in overrides.items()}


TREE_BAD = [
    ({"predicts": lambda: None}, TypeError,
     r"^tree_speculative_sampling_target_only: predicts must be a torch\.Tensor"),
    ({"target_probs": lambda: 0.5}, TypeError,
     r"^tree_speculative_sampling_target_only: target_probs must be a torch\.Tensor, got float$"),
    ({"target_probs": lambda: _e(2, 6, 20, dtype=torch.float64)}, TypeError,
     r"tree_speculative_sampling_target_only: target_probs must be one of \(float16, bfloat16, float32\), got float64"),
    ({"draft_probs": lambda: _e(2, 6, 20, dtype=torch.float16)}, TypeError,
     r"(?s)'draft_probs'.*Dtype mismatch: expected float32 but got float16"),
    ({"draft_probs": lambda: _e(2, 6, 21)}, ValueError, r"(?s)'draft_probs'.*shape#2\('vocab_size'\): expected 20"),
    ({"predicts": lambda: _i64(12)}, TypeError, r"(?s)'predicts'.*Dtype mismatch: expected int32 but got int64"),
    ({"predicts": lambda: _e(2, 6, dtype=torch.int32)}, ValueError, r"(?s)'predicts'.*Rank mismatch: expected 1"),
    ({"accept_index": lambda: _i64(2, 4)}, TypeError, r"(?s)'accept_index'.*expected int32 but got int64"),
    ({"accept_index": lambda: _e(3, 4, dtype=torch.int32)}, ValueError,
     r"(?s)'accept_index'.*shape#0\('batch_size'\): expected 2 but got 3"),
    ({"accept_index": lambda: _e(2, 0, dtype=torch.int32)}, ValueError,
     r"accept_index must have at least one column \(num_spec_step\), got 0"),
    ({"accept_token_num": lambda: _e(2, dtype=torch.int64)}, TypeError, r"(?s)'accept_token_num'.*expected int32"),
    ({"candidates": lambda: _e(2, 6)}, TypeError,
     r"(?s)'candidates'.*Dtype mismatch: expected one of \[int32, int64\] but got float32"),
    ({"retrive_index": lambda: _e(2, 6, dtype=torch.int32)}, TypeError,
     r"(?s)'retrive_index'.*Dtype mismatch: expected int64 but got int32"),
    ({"retrive_next_token": lambda: _i64(2, 5)}, ValueError,
     r"(?s)'retrive_next_token'.*shape#1\('num_draft_tokens'\): expected 6 but got 5"),
    ({"retrive_next_sibling": lambda: _i64(6, 2).t()}, ValueError, r"(?s)'retrive_next_sibling'.*not contiguous"),
    ({"uniform_samples": lambda: _e(2, 6, dtype=torch.float16)}, TypeError,
     r"(?s)'uniform_samples'.*Dtype mismatch: expected float32 but got float16"),
    ({"uniform_samples_for_final_sampling": lambda: _e(2, 1)}, ValueError,
     r"(?s)'uniform_samples_for_final_sampling'.*Rank mismatch"),
    ({"target_probs": lambda: _e(2, 20, 6).transpose(1, 2)}, ValueError, r"(?s)'target_probs'.*Stride mismatch"),
    ({"draft_probs": lambda: _e(2, 6, 20, device="cpu")}, ValueError, r"(?s)'draft_probs'.*Device mismatch"),
    ({"target_probs": lambda: _e(2, 6, 0), "draft_probs": lambda: _e(2, 6, 0)}, ValueError,
     r"tree_speculative_sampling_target_only: vocab_size must be in \[1, 1048576\], got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), TREE_BAD)
def test_tree_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        jit_kernel.tree_speculative_sampling_target_only(**_tree_args(**overrides))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"threshold_single": 1.5}, r"threshold_single must be in \[0, 1\], got 1\.5"),
        ({"threshold_single": float("nan")}, r"threshold_single must be in \[0, 1\], got nan"),
        ({"threshold_acc": -0.1}, r"threshold_acc must be in \[0, 1\], got -0\.1"),
    ],
)
def test_tree_bad_thresholds(kwargs, match: str) -> None:
    with fake_cuda():
        with pytest.raises(ValueError, match="tree_speculative_sampling_target_only: " + match):
            jit_kernel.tree_speculative_sampling_target_only(**_tree_args(), **kwargs)
        with pytest.raises(TypeError, match=r"^tree_speculative_sampling_target_only: threshold_acc must be a float"):
            jit_kernel.tree_speculative_sampling_target_only(**_tree_args(), threshold_acc="1")


def _greedy_args(**overrides):
    args = _tree_args()
    args = {k: v for k, v in args.items() if "uniform" not in k and "probs" not in k}
    args["target_predict"] = _i64(2, 6)
    return args | {name: make() for name, make in overrides.items()}


GREEDY_BAD = [
    ({"target_predict": lambda: [0]}, TypeError,
     r"^verify_tree_greedy: target_predict must be a torch\.Tensor, got list$"),
    ({"target_predict": lambda: _e(2, 6, dtype=torch.int32)}, TypeError,
     r"(?s)'target_predict'.*Dtype mismatch: expected int64 but got int32"),
    ({"target_predict": lambda: _i64(2, 7)}, ValueError, r"(?s)'target_predict'.*shape#1\('num_draft_tokens'\)"),
    ({"target_predict": lambda: _i64(6, 2).t()}, ValueError, r"(?s)'target_predict'.*not contiguous"),
    ({"candidates": lambda: _e(2, 6, dtype=torch.int16)}, TypeError, r"(?s)'candidates'.*Dtype mismatch"),
    ({"accept_token_num": lambda: _e(3, dtype=torch.int32)}, ValueError, r"(?s)'accept_token_num'.*batch_size"),
    ({"predicts": lambda: _e(12, dtype=torch.int32, device="cpu")}, ValueError, r"(?s)'predicts'.*Device mismatch"),
    ({"accept_index": lambda: _e(2, 0, dtype=torch.int32)}, ValueError,
     r"verify_tree_greedy: accept_index must have at least one column"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "error", "match"), GREEDY_BAD)
def test_greedy_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        jit_kernel.verify_tree_greedy(**_greedy_args(**overrides))


def test_tree_valid_fake_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CHECK, "1")
    with fake_cuda():
        jit_kernel.tree_speculative_sampling_target_only(**_tree_args(), threshold_single=0, threshold_acc=0.5)
        int32 = {
            k: _e(2, 6, dtype=torch.int32)
            for k in ("candidates", "retrive_index", "retrive_next_token", "retrive_next_sibling")
        }
        wide = torch.empty_strided((2, 6, 20), (200, 24, 1), device="cuda")
        jit_kernel.tree_speculative_sampling_target_only(**(_tree_args() | int32 | {"target_probs": wide}))
        jit_kernel.verify_tree_greedy(**_greedy_args())
        jit_kernel.verify_tree_greedy(**(_greedy_args() | int32 | {"target_predict": _e(2, 6, dtype=torch.int32)}))
        empty = {k: _i64(0, 6) for k in int32} | {
            "predicts": _e(0, dtype=torch.int32), "accept_index": _e(0, 4, dtype=torch.int32),
            "accept_token_num": _e(0, dtype=torch.int32), "uniform_samples": _e(0, 6),
            "uniform_samples_for_final_sampling": _e(0), "target_probs": _e(0, 6, 20), "draft_probs": _e(0, 6, 20),
        }  # fmt: skip
        jit_kernel.tree_speculative_sampling_target_only(**empty)


def test_registered_ops_and_fakes() -> None:
    """The torch.library ops exist with their outputs as mutated arguments; their fakes run the C++
    checks on FakeTensors (so tracing rejects what the op rejects) without launching."""
    mutated = {
        CHAIN: ["output_token_ids", "output_accepted_token_num", "output_emitted_draft_token_num"],
        TREE: ["predicts", "accept_index", "accept_token_num", "draft_probs"],
        GREEDY: ["predicts", "accept_index", "accept_token_num"],
    }
    for name, expected in mutated.items():
        schema = getattr(torch.ops.jit_kernel, name).default._schema
        assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == expected
    with fake_cuda():
        outputs = (_e(4, 4, dtype=torch.int32), _e(4, dtype=torch.int32), _i64(4))
        args = _chain_args()
        torch.ops.jit_kernel.chain_speculative_sampling(*args.values(), *outputs, None, None, 1, 2)
        with pytest.raises(ValueError, match=r"(?s)'output_token_ids'.*shape#1: expected 4 but got 5"):
            torch.ops.jit_kernel.chain_speculative_sampling(
                *args.values(), _e(4, 5, dtype=torch.int32), *outputs[1:], None, None, 1, 2
            )
        torch.ops.jit_kernel.tree_speculative_sampling_target_only(*_tree_args().values(), 1.0, 1.0, True)
        with pytest.raises(TypeError, match=r"(?s)'uniform_samples'.*Dtype mismatch"):
            torch.ops.jit_kernel.tree_speculative_sampling_target_only(
                *_tree_args(uniform_samples=lambda: _i64(2, 6)).values(), 1.0, 1.0, True
            )
        torch.ops.jit_kernel.verify_tree_greedy(*_greedy_args().values())
        with pytest.raises(ValueError, match=r"(?s)'target_predict'"):
            torch.ops.jit_kernel.verify_tree_greedy(*_greedy_args(target_predict=lambda: _i64(3, 6)).values())


def test_families_spec() -> None:
    from jit_kernel.engine.families import SPECULATIVE, family

    assert family("speculative") is SPECULATIVE
    assert set(SPECULATIVE.exports) == {"chain", "tree", "greedy"}
    assert ("fp32_t",) in SPECULATIVE.prebuilt
