"""Speculative-decoding verification: ``chain_speculative_sampling`` (FlashInfer 0.7.2's names,
argument order, shapes and semantics), ``tree_speculative_sampling_target_only`` and
``verify_tree_greedy`` (sgl-kernel's, for EAGLE draft trees), one launch each
(csrc/sampling/speculative.cuh; docs/design/speculative.md).

``chain_speculative_sampling``, request ``b`` with ``n`` draft tokens ``d_j``, draft distributions
``p_j`` and target distributions ``q_j`` (``q`` has ``n + 1`` rows): position ``j`` is accepted when
``u_j * p_j[d_j] < q_j[d_j]`` (probability ``min(1, q / p)``), in order, up to the first rejection at
``pos`` (``pos = n`` when every draft is accepted). ``output_token_ids[b]`` (int32 ``[B, n + 1]``)
holds ``d_0 .. d_{pos-1}``, then at ``pos`` a token drawn from ``relu(q_pos - p_pos)`` normalised
(the bonus token from ``q_n`` when ``pos = n``), then ``-1``. ``output_emitted_draft_token_num[b]``
gets ``pos`` added, ``output_accepted_token_num[b]`` the number of positions that pass the test
each on its own: ``pos`` plus those at and after ``pos`` that pass with a second, independent
uniform (FlashInfer's definition: a measure of how well the draft and target models agree). Both
counters are added to in place (given tensors, or zeros allocated here); the three are returned.

Random numbers: Philox4x32-10 (``<sgl_kernel/philox.cuh>``), draw ``k`` of a row keyed by the row's
``(seed, offset)``: draw ``j < n`` gives position ``j``'s uniform (first word) and the independent
test's (second word), draw ``n`` the 64 bits of the final draw. With ``seed`` / ``offset`` int64
tensors of one value per request ``[B]``, each row is its own stream (draw ``k`` is counter
``(offset[b], k)`` under key ``seed[b]``): the same ``(seed, offset)`` gives the same tokens at any
batch slot and batch size. With ints (or ``[1]`` tensors, shared by every row) the row is mixed into
the counter (``(b << 32) | k``) so rows differ. Without them a seed is drawn from torch on the
device (``torch.randint``, from ``generator`` or the default CUDA generator: CUDA-graph safe, each
replay draws a new one) and rows are mixed in likewise. ``offset`` is not advanced (FlashInfer
does not): a caller that passes seeds advances them itself.

The final draw is exact: each weight ``w`` (``q - p``, or ``q``, where positive and finite, else 0)
becomes the integer ``floor(w * 2^s)``, ``s`` putting the row's largest weight in ``[2^39, 2^40)``;
the token is the first whose running integer sum exceeds ``floor(u * total)`` with the 64-bit
uniform ``u``. So a row's result is bit-for-bit reproducible (``deterministic`` is accepted and
ignored), and tokens below ``2^-40`` of the row's largest weight are never drawn. Where the residual
has no mass, the token comes from ``q_pos`` itself; where that has none either (an all-zero or
non-finite row), the token is ``-1``.

Differences from FlashInfer 0.7.2:

- the random streams are ours (Philox counters as above, not curand's): the same seed draws other
  numbers; a ``[B]`` seed or offset makes each row's stream its own, independent of the batch slot
  (FlashInfer feeds the slot into the stream). Uniforms are 24-bit, in ``[0, 1)``;
- ``offset`` alone is an error, and an int ``seed`` alone has offset 0 (FlashInfer ignores one given
  alone); both as ints may be any 64-bit value, signed or unsigned;
- probabilities may be float32, bfloat16 or float16 (both of one dtype; FlashInfer casts both to
  float32, so it also takes mixed dtypes), rows with unit inner stride at any other strides;
  ``draft_token_ids`` int32 or int64; the counters int32 or int64, updated in place (FlashInfer
  casts an int64 counter to int32 and updates the copy);
- the final draw is exact (above); without mass the token is from the target row or ``-1``
  (FlashInfer: its last valid index, undefined for an all-zero row);
- a draft token outside ``[0, vocab)`` is rejected (FlashInfer reads out of bounds); the vocabulary
  is at most 2^20 tokens.

``tree_speculative_sampling_target_only`` (sgl-kernel's semantics, EAGLE trees): request ``b``'s
tree has ``D`` nodes; node ``i`` has token ``candidates[b, i]``, first child
``retrive_next_token[b, i]`` and next sibling ``retrive_next_sibling[b, i]`` (``-1``: none), and
output slot ``retrive_index[b, i]`` (an index into ``predicts``, usually ``b * D + i``); node 0 is
the root. For ``step = 1 .. S - 1`` (``S = accept_index.shape[1]``) the children of the last
accepted node ``c`` are tried in sibling order: child token ``t`` is accepted when
``coin <= prob_acc / max(threshold_acc, 1e-9)`` or ``target_probs[b, c, t] >= threshold_single``,
where ``prob_acc`` sums ``target_probs[b, c, t]`` over the children tried at this level and
``coin = uniform_samples[b, c]``; an accepted child's token goes to ``predicts[slot(c)]`` and its
slot to ``accept_index[b, step]``; a rejected child's ``draft_probs[b, c, t]`` is set to
``target_probs[b, c, t]`` (so the residual below leaves it out). The walk stops at the first level
with no accepted child. ``accept_token_num[b]`` = accepted children; ``accept_index[b, 0]`` = the
root's slot. The last accepted node's slot gets a token drawn with
``uniform_samples_for_final_sampling[b]`` from ``relu(target_probs - draft_probs)`` at that node
(``target_probs`` alone when all ``S - 1`` steps were accepted), drawn exactly as above with the
uniform ``floor(coin * 2^64)``. Entries not named here are left as they are.
``verify_tree_greedy`` walks the same way, accepting a child when its token equals
``target_predict`` (read flat, ``[B * D]``) at the last accepted slot, and writes that argmax to the
last slot.

Differences from sgl-kernel: probabilities float32, bfloat16 or float16 (target and draft of one
dtype), the four tree tensors (and ``target_predict``) int32 or int64, all of one dtype (sgl-kernel:
float32 and int64 only); without mass the last token is ``-1`` (sgl-kernel: ``vocab - 1``); malformed
trees do not fault: links outside ``[-1, D)`` end a list, a level tries at most ``D`` children,
slots outside ``predicts`` (or ``target_predict``) are not read or written, candidate tokens outside
``[0, vocab)`` are never accepted. ``deterministic`` is accepted and ignored.

Indices: with ``JIT_KERNEL_CHECK_INDICES=1`` the ops raise ``IndexError`` naming the argument and
the first bad position instead (one reduction and a host sync per tensor: not under CUDA-graph
capture).

Every op is also ``torch.ops.jit_kernel.<name>`` (its fake implementation runs the C++ checks on
FakeTensors; the mutated tensors declared); the functions switch to those under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import SPECULATIVE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor
from jit_kernel.ops.sampling import philox_inputs

_CHAIN_OP = "chain_speculative_sampling"
_TREE_OP = "tree_speculative_sampling_target_only"
_GREEDY_OP = "verify_tree_greedy"
_INDEX_DTYPES = (torch.int32, torch.int64)

_SPEC = Dispatcher(SPECULATIVE)
_CHAIN = KernelTable(_SPEC, "chain", lambda dtype: (float_dtype(_CHAIN_OP, "draft_probs", dtype),))
_TREE = KernelTable(_SPEC, "tree", lambda dtype: (float_dtype(_TREE_OP, "target_probs", dtype),))
# verify_tree_greedy reads no probabilities: every instance has it, the fp32 one (prebuilt) serves it.
_GREEDY = KernelTable(_SPEC, "greedy", lambda _key: ("fp32_t",))


# ---------------------------------------------------------------------------------------------
# JIT_KERNEL_CHECK_INDICES=1


def _check_range(op: str, name: str, t: object, lo: int, hi: int, what: str) -> None:
    """Raise IndexError naming ``name`` and its first element outside ``[lo, hi)``; one reduction
    and one sync. Tensors the C++ checks refuse never get here; FakeTensors have no values."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _INDEX_DTYPES or t.numel() == 0 or isinstance(t, FakeTensor):
        return
    low, high = torch.stack(torch.aminmax(t)).tolist()
    if low >= lo and high < hi:
        return
    flat = t.reshape(-1)
    position = int(((flat < lo) | (flat >= hi)).nonzero()[0, 0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(position), t.shape))
    value = int(flat[position])
    where = ", ".join(map(str, index))
    raise IndexError(f"{op}: {name}[{where}] = {value} is out of range: it must be in [{lo}, {hi}) ({what})")


def _vocab(t: object) -> int | None:
    return t.shape[-1] if isinstance(t, torch.Tensor) and t.dim() > 0 else None


def _chain_check(values: Mapping[str, Any]) -> None:
    vocab = _vocab(values["draft_probs"])
    if vocab is not None:
        _check_range(_CHAIN_OP, "draft_token_ids", values["draft_token_ids"], 0, vocab, f"vocab_size {vocab}")


def _tree_links(op: str, values: Mapping[str, Any], slots: int, slots_of: str) -> None:
    candidates = values["candidates"]
    nodes = candidates.shape[1] if isinstance(candidates, torch.Tensor) and candidates.dim() == 2 else None
    _check_range(op, "retrive_index", values["retrive_index"], 0, slots, slots_of)
    if nodes is not None:
        for name in ("retrive_next_token", "retrive_next_sibling"):
            _check_range(op, name, values[name], -1, nodes, f"-1 or a node of the {nodes}-node tree")


def _tree_check(values: Mapping[str, Any]) -> None:
    predicts = values["predicts"]
    slots = predicts.numel() if isinstance(predicts, torch.Tensor) else 0
    _tree_links(_TREE_OP, values, slots, f"predicts has {slots} slots")
    vocab = _vocab(values["target_probs"])
    if vocab is not None:
        _check_range(_TREE_OP, "candidates", values["candidates"], 0, vocab, f"vocab_size {vocab}")


def _greedy_check(values: Mapping[str, Any]) -> None:
    predicts, target = values["predicts"], values["target_predict"]
    slots = min(t.numel() if isinstance(t, torch.Tensor) else 0 for t in (predicts, target))
    _tree_links(_GREEDY_OP, values, slots, f"predicts and target_predict have {slots} slots")


# ---------------------------------------------------------------------------------------------
# chain_speculative_sampling


@kernel_op(
    _CHAIN_OP,
    mutates=("output_token_ids", "output_accepted_token_num", "output_emitted_draft_token_num"),
    index_check=_chain_check,
)
def _chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    output_token_ids: torch.Tensor,
    output_accepted_token_num: torch.Tensor,
    output_emitted_draft_token_num: torch.Tensor,
    seed: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    seed_value: int = 0,
    offset_value: int = 0,
    add_accepted: bool = True,
    add_emitted: bool = True,
) -> Launch:
    """``add_accepted`` / ``add_emitted``: add to the counter (False: the kernel writes it, for a
    counter the op allocated, which then needs no zero fill)."""
    args = (
        draft_probs,
        draft_token_ids,
        target_probs,
        output_token_ids,
        output_accepted_token_num,
        output_emitted_draft_token_num,
        seed,
        offset,
        seed_value,
        offset_value,
        add_accepted,
        add_emitted,
    )
    return _CHAIN, draft_probs.dtype, args, None


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    maybe_output_accepted_token_num: torch.Tensor | None = None,
    maybe_output_emitted_draft_token_num: torch.Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Speculative sampling of a chain of ``n`` draft tokens per request (FlashInfer's
    ``chain_speculative_sampling``): returns ``(output_token_ids, output_accepted_token_num,
    output_emitted_draft_token_num)``.

    ``draft_probs [B, n, V]`` and ``target_probs [B, n + 1, V]``: float32, bfloat16 or float16, one
    dtype, CUDA, rows with unit inner stride. ``draft_token_ids [B, n]``: int32 or int64.
    ``output_token_ids``: int32 ``[B, n + 1]``, the accepted drafts, then the token drawn at the
    first rejection (or the bonus token), then ``-1``. The counters (int32 or int64 ``[B]``; when None,
    allocated and written as if zeros) are added to in place: emitted = accepted prefix length, accepted = the
    positions that pass the test each on its own. ``seed`` / ``offset``: ints (offset 0 when None),
    both int64 tensors (``[B]``: each row its own stream; ``[1]``: shared), or both None (a seed
    drawn from ``generator`` / torch's CUDA generator, on the device). ``deterministic``: ignored (always
    deterministic). See the module docstring for the exact semantics and the differences from
    FlashInfer."""
    for name, value in (("draft_probs", draft_probs), ("draft_token_ids", draft_token_ids)):
        if not isinstance(value, torch.Tensor):
            not_a_tensor(_CHAIN_OP, name, value)
    if draft_token_ids.dim() != 2:
        raise ValueError(
            f"{_CHAIN_OP}: draft_token_ids must have 2 dimensions [batch_size, num_speculate_tokens], "
            f"got {draft_token_ids.dim()}"
        )
    batch, n = draft_token_ids.shape
    device = draft_probs.device
    output_token_ids = torch.empty((batch, n + 1), dtype=torch.int32, device=device)
    # A counter the op allocates is written by the kernel (as if zeroed, then added to).
    accepted = maybe_output_accepted_token_num
    if accepted is None:
        accepted = torch.empty(batch, dtype=torch.int32, device=device)
    emitted = maybe_output_emitted_draft_token_num
    if emitted is None:
        emitted = torch.empty(batch, dtype=torch.int32, device=device)
    seed_t, offset_t, seed_v, offset_v = philox_inputs(_CHAIN_OP, seed, offset, device, generator)
    _chain(
        draft_probs,
        draft_token_ids,
        target_probs,
        output_token_ids,
        accepted,
        emitted,
        seed_t,
        offset_t,
        seed_v,
        offset_v,
        maybe_output_accepted_token_num is not None,
        maybe_output_emitted_draft_token_num is not None,
    )
    return output_token_ids, accepted, emitted


# ---------------------------------------------------------------------------------------------
# The EAGLE tree (sgl-kernel)


@kernel_op(
    _TREE_OP,
    mutates=("predicts", "accept_index", "accept_token_num", "draft_probs"),
    index_check=_tree_check,
)
def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> Launch:
    """Verify an EAGLE draft tree per request against the target model's probabilities
    (sgl-kernel's ``tree_speculative_sampling_target_only``), in place.

    Writes ``predicts`` (int32, flat: accepted tokens at their parents' slots, the drawn token at
    the last accepted slot), ``accept_index`` (int32 ``[B, S]``: the accepted nodes' slots, the root
    first), ``accept_token_num`` (int32 ``[B]``) and, for rejected children, ``draft_probs``.
    ``candidates``, ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``: ``[B, D]``,
    int32 or int64 (one dtype). ``uniform_samples``: float32 ``[B, D]`` (the coin of each node's
    children), ``uniform_samples_for_final_sampling``: float32 ``[B]``. ``target_probs``,
    ``draft_probs``: ``[B, D, V]`` float32, bfloat16 or float16 (one dtype); ``draft_probs`` is zeros
    in EAGLE. ``threshold_single``, ``threshold_acc`` in ``[0, 1]``. ``deterministic``: ignored. See
    the module docstring for the walk and the differences from sgl-kernel."""
    args = (
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        uniform_samples_for_final_sampling,
        target_probs,
        draft_probs,
        threshold_single,
        threshold_acc,
    )
    return _TREE, target_probs.dtype, args, None


@kernel_op(_GREEDY_OP, mutates=("predicts", "accept_index", "accept_token_num"), index_check=_greedy_check)
def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> Launch:
    """Greedy verification of an EAGLE draft tree (sgl-kernel's ``verify_tree_greedy``), in place:
    a child is accepted when its token equals ``target_predict`` (the target model's argmax, read
    flat as ``[B * D]``) at the last accepted node's slot. Writes ``predicts`` (int32, flat),
    ``accept_index`` (int32 ``[B, S]``) and ``accept_token_num`` (int32 ``[B]``) as
    :func:`tree_speculative_sampling_target_only` does, the last slot getting its argmax.
    ``candidates``, the three ``retrive_*`` tensors and ``target_predict``: ``[B, D]``, int32 or
    int64 (one dtype)."""
    args = (
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
    )
    return _GREEDY, None, args, None


__all__ = ["chain_speculative_sampling", "tree_speculative_sampling_target_only", "verify_tree_greedy"]
