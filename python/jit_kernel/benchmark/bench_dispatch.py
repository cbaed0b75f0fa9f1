"""Per-op dispatch overhead: each public op against the raw tvm-ffi call of its kernel, eagerly and
in CUDA-graph replay.

Every op runs on decode-like inputs: bf16 activations ``[tokens, 4096]`` (q/k norms: Hq=32, Hk=8,
head_dim 128; fp8 quantisers: groups of 128, a one-element float32 static scale; hicache: one
layer, rows of 8 x 128 bf16, or MLA rows of 576, caches on the GPU; MoE: Qwen3-MoE's
``topk_softmax`` over 128 experts, DeepSeek-V3's ``grouped_topk`` over 256 experts in 8 groups,
top-4 groups, with a float32 correction bias and a scaling of 2.5, all top-8;
``moe_align_block_size`` of the tokens' top-8 ids over 256 experts in blocks of 64;
``moe_sum_reduce`` of ``[tokens, 8, 4096]``; ``decode_attention`` of the q/k norms' heads over a
256-token cache per token, ``merge_attn_states`` of two ``[tokens, 32, 128]`` results). An op with
optional outputs has two rows: its outputs preallocated (``out=``, or "outputs given"), and its
functional form, which allocates them; the functional row's raw reference allocates the same
outputs (one ``torch.empty`` of each output's shape, dtype and device) before the raw call, so both
rows' "eager - raw" is the op's own overhead.
An op that always allocates its outputs (the MoE routing ops, ``moe_align_block_size``) has the
functional row only. FlashInfer's eager call of the same op is timed beside ours where FlashInfer
has it and is importable; where FlashInfer's op takes its outputs and has no functional form
(``rmsnorm_quant``, ``fused_add_rmsnorm_quant``, ``fused_topk_deepseek``), that call is in our
outputs-given row, or in the one row of an op that always allocates. Every public op of
``jit_kernel.ops`` has a row, but for those in ``NO_ROW`` (each with its reason). Four measurements:

* **eager** (1 token): a host-bound loop of ``--calls`` back-to-back calls, timed on the host
  (warm-up first, ``torch.cuda.synchronize()`` at the end of each repeat, inside the timing; the
  median of ``--repeats``, eager and raw repeats interleaved). The op through its public API against
  the raw call: the tvm-ffi function the op launches, called with the exact arguments the op's plan
  passes it (``jit_kernel.ops._common.recorded_launches``: read from the op itself, so this file
  restates no launcher's signature), all prepared beforehand. The overhead is the median of the
  paired differences (each eager repeat minus the raw repeat just before it), which the host's
  drift does not move. Target: eager <= raw + 1 us.
* **floor** (1 token): what any op pays on this host before its own logic, timed as the eager rows:
  rmsnorm's raw call against a Python frame that passes its arguments on, the minimal op (that frame
  with the dtype and ``numel()`` reads, the key tuple and the kernel-table lookup) and
  ``jit_kernel.rmsnorm``. It reads the eager rows: an op within a few tenths of a microsecond of the
  minimal op has little Python of its own left to remove.
* **graph replay** (1 and 16 tokens): ``--graph-calls`` calls of the op captured in one CUDA graph
  (after a warm-up on a side stream), replayed ``--replays`` times, timed with CUDA events; the median
  per op call, against the same graph of an empty kernel (``x.add_(1)`` on a 1-element CUDA tensor).
  The two graphs replay alternately, so each op's reference is measured beside it: a graph-replayed
  launch's time follows the GPU's recent load (the same graph replays faster at the start of a
  process than after a minute of work), and a reference taken once would set every later ratio by
  when it ran. Target: <= 1.3x the empty kernel.
* **CPU** (runs anywhere, with no GPU): the ``add_constant`` host family, eager against raw, as above.

``--no-op-kernels`` runs only the eager rows, on CPU tensors, with every kernel table serving a
tvm-ffi function that does nothing: eager - raw is then each op's own host cost (its Python, its
key, its kernel lookup), on a machine without a GPU.

One failing op prints an error row; the others still run. Markdown tables on stdout, headed by the
device and the command line (also saved as ``bench_dispatch.md`` with ``--save-path DIR`` or
``$JIT_KERNEL_BENCH_OUT``, and as ``bench_dispatch.json`` with ``--json-dir DIR`` or
``$BENCH_JSON_DIR``, for ``python -m jit_kernel.benchmark.report``)::

    python -m jit_kernel.benchmark.bench_dispatch
    python -m jit_kernel.benchmark.bench_dispatch --ops decode_linear rmsnorm   # those ops' rows only
    python -m jit_kernel.benchmark.bench_dispatch --cpu-only --calls 2000   # quick, no GPU needed
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import statistics
import sys
import timeit
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

import jit_kernel
from jit_kernel.benchmark import results
from jit_kernel.benchmark._tables import device_name, format_table, format_us, ratio_cell
from jit_kernel.benchmark.utils import SAVE_PATH_ENV, bench_arg_parser, write_summary
from jit_kernel.ops import _common, _site
from jit_kernel.ops import norm as norm_ops

if TYPE_CHECKING:
    pass

COMMAND = "python -m jit_kernel.benchmark.bench_dispatch"
Call = Callable[[], object]

HIDDEN = 4096
HQ, HK, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
EPS = 1e-6
FACTOR = 2.0
HICACHE_ELEMENT_DIM = HK * HEAD_DIM  # one token's K (or V) of one layer: 2048 bytes in bf16
HICACHE_ROWS = 4096  # rows in each cache
HICACHE_BLOCK_QUOTA = 4  # passed to the op too, so both run the same launch
MLA_NOPE, MLA_ROPE = 512, 64  # DeepSeek's MLA latent row: 576 elements
MLA_DIM = MLA_NOPE + MLA_ROPE
HICACHE_ROW_BYTES, MLA_ROW_BYTES = HICACHE_ELEMENT_DIM * DTYPE.itemsize, MLA_DIM * DTYPE.itemsize  # 2048, 1152
GROUP = 128  # the per-group quantisers' group size
QUANT_EPS = 1e-10  # the per-group quantisers' scale floor (their default)
TOPK = 8  # MoE: experts per token
QWEN3_EXPERTS = 128  # topk_softmax: Qwen3-MoE's routing, renormalised
DSV3_EXPERTS, DSV3_GROUPS, DSV3_TOPK_GROUP, DSV3_SCALE = 256, 8, 4, 2.5  # grouped_topk: DeepSeek-V3's
ALIGN_BLOCK = 64  # moe_align_block_size: block size, over DSV3_EXPERTS experts
VOCAB = 128256  # sampling: Llama 3's vocabulary, float32 logits
SAMPLE_TOP_K, SAMPLE_TOP_P = 50, 0.9  # sampling: per-request tensors of these values
SPEC_DRAFT = 4  # speculative ops: draft tokens per request (the tree ops: a chain of SPEC_DRAFT + 1 nodes)
LINEAR_OUT = 512  # decode_linear: [tokens, 4096] x [512, 4096]^T, a 4 MB weight
ATTENTION_CONTEXT = 256  # decode_attention: each request's StaticCache length (every request at it)
GRAPH_TOKENS = (1, 16)
EAGER_TOKENS = 1
EAGER_SLACK_US = 1.0  # target: eager <= raw + 1 us
GRAPH_MAX_RATIO = 1.3  # target: graph replay <= 1.3x the empty kernel


class Inputs:
    """Every op's tensors for one token count, allocated once (nothing is allocated while timing)."""

    def __init__(self, tokens: int, device: str) -> None:
        def act(*shape: int) -> torch.Tensor:
            return torch.randn(shape, device=device).to(DTYPE)

        def weight(n: int) -> torch.Tensor:  # near 1: the in-place ops stay finite over many calls
            return (1 + 0.1 * torch.randn(n, device=device)).to(DTYPE)

        def empty(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        def addresses(cache: torch.Tensor) -> torch.Tensor:  # an all-layer pointer table of one layer
            return torch.tensor([cache.data_ptr()], dtype=torch.uint64, device=device)

        self.tokens, self.device = tokens, device
        # The ops' enable_pdl=None: on for sm_90+ (host::runtime::resolve_pdl, in C++); the raw calls pass it.
        self.pdl = device == "cuda" and torch.cuda.get_device_capability() >= (9, 0)
        # rmsnorm, gemma_rmsnorm (out: also moe_sum_reduce's)
        self.x, self.w, self.out = act(tokens, HIDDEN), weight(HIDDEN), act(tokens, HIDDEN)
        # the fused adds (in place on the residual; fused_add_rmsnorm and gemma's on the input too)
        self.fa_x, self.fa_res = act(tokens, HIDDEN), act(tokens, HIDDEN)
        # fused_inplace_qknorm, fused_qknorm_rope: per head, q [T, Hq, D], k [T, Hk, D], weights [D]
        self.q3, self.k3 = act(tokens, HQ, HEAD_DIM), act(tokens, HK, HEAD_DIM)
        self.qw3, self.kw3 = weight(HEAD_DIM), weight(HEAD_DIM)
        # qknorm_across_heads: whole rows, q [T, Hq*D], k [T, Hk*D], weights of those widths
        self.q2, self.k2 = act(tokens, HQ * HEAD_DIM), act(tokens, HK * HEAD_DIM)
        self.qw2, self.kw2 = weight(HQ * HEAD_DIM), weight(HK * HEAD_DIM)
        # the fp8 quantisers (norm + quant too): preallocated outputs; fp8 [T, HIDDEN], scales per tensor,
        # per token [T, 1] and per group of 128 [T, HIDDEN / 128] (row-major); a static scale for the norms
        self.fp8 = empty(tokens, HIDDEN, dtype=torch.float8_e4m3fn)
        self.fp8_scale = empty(1, dtype=torch.float32)
        self.token_scale = empty(tokens, 1, dtype=torch.float32)
        self.group_scale = empty(tokens, HIDDEN // GROUP, dtype=torch.float32)
        self.static_scale = torch.ones(1, dtype=torch.float32, device=device)
        # scale and add_constant: contiguous tensors of any shape
        self.scale_out = act(tokens, HIDDEN)
        self.ints = torch.randint(-1000, 1000, (tokens, HIDDEN), dtype=torch.int32, device=device)
        self.ints_out = torch.empty_like(self.ints)
        # the gated activations (and silu_and_mul's group quant): [T, 2 * HIDDEN] -> [T, HIDDEN]
        self.gate_up, self.act_out = act(tokens, 2 * HIDDEN), act(tokens, HIDDEN)
        # rope: q [T, Hq*D], k [T, Hk*D], positions [T], fp32 cos/sin cache [4096, D]
        self.positions = torch.randint(0, 4096, (tokens,), device=device)
        self.cos_sin = torch.randn(4096, HEAD_DIM, device=device)
        # store_kv_cache: k/v [T, Hk, D] into caches [slots, Hk, D] at int64 slots
        self.kv_k, self.kv_v = act(tokens, HK, HEAD_DIM), act(tokens, HK, HEAD_DIM)
        self.k_cache, self.v_cache = act(HICACHE_ROWS, HK, HEAD_DIM), act(HICACHE_ROWS, HK, HEAD_DIM)
        self.slots = torch.randperm(HICACHE_ROWS, device=device)[:tokens]
        # set_mla_kv_buffer: nope [T, 512] and rope [T, 64] into a [slots, 576] buffer at the same slots
        self.nope, self.rope, self.mla_buffer = act(tokens, MLA_NOPE), act(tokens, MLA_ROPE), act(HICACHE_ROWS, MLA_DIM)
        # hicache one layer, device to device: k/v caches [rows, Hk*D] (MLA: one [rows, 576]), int64 indices
        # [T]; the all-layer forms move the same rows through pointer tables of that one layer
        self.k_dst, self.v_dst, self.k_src, self.v_src = (act(HICACHE_ROWS, HICACHE_ELEMENT_DIM) for _ in range(4))
        self.mla_dst, self.mla_src = act(HICACHE_ROWS, MLA_DIM), act(HICACHE_ROWS, MLA_DIM)
        self.idx_dst = torch.randperm(HICACHE_ROWS, device=device)[:tokens]
        self.idx_src = torch.randperm(HICACHE_ROWS, device=device)[:tokens]
        self.k_ptr_dst, self.v_ptr_dst = addresses(self.k_dst), addresses(self.v_dst)
        self.k_ptr_src, self.v_ptr_src = addresses(self.k_src), addresses(self.v_src)
        self.mla_ptr_dst, self.mla_ptr_src = addresses(self.mla_dst), addresses(self.mla_src)
        # MoE routing: bf16 logits (Qwen3-MoE [T, 128], DeepSeek-V3 [T, 256]) and DeepSeek-V3's float32
        # correction bias, into float32 weights and int32 ids [T, 8] (FlashInfer's weights: the logits' dtype)
        self.qwen_logits, self.dsv3_logits = act(tokens, QWEN3_EXPERTS), act(tokens, DSV3_EXPERTS)
        self.dsv3_bias = 0.01 * torch.randn(DSV3_EXPERTS, device=device)
        self.topk_weights = empty(tokens, TOPK, dtype=torch.float32)
        self.topk_ids = empty(tokens, TOPK, dtype=torch.int32)
        self.topk_weights_bf16 = empty(tokens, TOPK, dtype=DTYPE)
        # moe_align_block_size: each token's top-8 of 256 experts (distinct, int32, as routing gives them)
        # into sorted ids of numel + min(numel, experts) * (block - 1), their blocks' experts and the total
        self.align_ids = torch.rand(tokens, DSV3_EXPERTS, device=device).topk(TOPK, dim=-1).indices.int()
        numel = tokens * TOPK
        length = numel + min(numel, DSV3_EXPERTS) * (ALIGN_BLOCK - 1)
        self.sorted_ids = empty(length, dtype=torch.int32)
        self.block_experts = empty((length + ALIGN_BLOCK - 1) // ALIGN_BLOCK, dtype=torch.int32)
        self.padded_total = empty(1, dtype=torch.int32)
        # moe_sum_reduce: bf16 [T, 8, HIDDEN] with float32 weights [T, 8] into out [T, HIDDEN]
        self.expert_out, self.expert_weights = act(tokens, TOPK, HIDDEN), torch.rand(tokens, TOPK, device=device)
        # sampling: float32 logits [T, VOCAB] (and their softmax), per-request top-k / top-p tensors, each
        # request's seed and offset, token ids [T]
        self.logits = torch.randn(tokens, VOCAB, device=device)
        self.probs = torch.softmax(self.logits, dim=-1)
        self.sample_top_k = torch.full((tokens,), SAMPLE_TOP_K, dtype=torch.int32, device=device)
        self.sample_top_p = torch.full((tokens,), SAMPLE_TOP_P, device=device)
        self.seeds = torch.arange(tokens, dtype=torch.int64, device=device)
        self.offsets = torch.zeros(tokens, dtype=torch.int64, device=device)
        self.token_ids = empty(tokens, dtype=torch.int32)
        self.masked = torch.empty_like(self.logits)
        # chain_speculative_sampling: 4 draft tokens per request, their draft and target distributions
        self.draft_probs = torch.softmax(torch.randn(tokens, SPEC_DRAFT, VOCAB, device=device), dim=-1)
        self.draft_ids = torch.randint(0, VOCAB, (tokens, SPEC_DRAFT), dtype=torch.int32, device=device)
        self.target_probs = torch.softmax(torch.randn(tokens, SPEC_DRAFT + 1, VOCAB, device=device), dim=-1)
        # the tree ops: request b's draft tree a chain of SPEC_DRAFT + 1 nodes over target_probs (int32
        # [T, 5]: node i's first child i + 1, no siblings, slot b * 5 + i), the drafts the target's argmax
        # (target_predict: the greedy walk accepts the whole chain); EAGLE's zero draft_probs, each node's
        # uniform and the final one; predicts [T * 5], accept_index [T, 5], accept_token_num [T] in place
        nodes = SPEC_DRAFT + 1
        self.target_predict = self.target_probs.argmax(dim=-1).int()
        chain = torch.arange(nodes, dtype=torch.int32, device=device).repeat(tokens, 1)
        root = torch.randint(0, VOCAB, (tokens, 1), dtype=torch.int32, device=device)
        self.tree = (
            torch.cat([root, self.target_predict[:, :-1]], dim=1),  # candidates
            chain + nodes * torch.arange(tokens, dtype=torch.int32, device=device)[:, None],  # retrive_index
            torch.where(chain < nodes - 1, chain + 1, -1),  # retrive_next_token
            torch.full((tokens, nodes), -1, dtype=torch.int32, device=device),  # retrive_next_sibling
        )
        self.tree_outs = (
            empty(tokens * nodes, dtype=torch.int32),
            empty(tokens, nodes, dtype=torch.int32),
            empty(tokens, dtype=torch.int32),
        )
        self.tree_coins = torch.rand(tokens, nodes, device=device)
        self.tree_final_coins = torch.rand(tokens, device=device)
        self.tree_draft_probs = torch.zeros_like(self.target_probs)
        # decode_linear: the activations [T, HIDDEN] times a weight [LINEAR_OUT, HIDDEN] into [T, LINEAR_OUT]
        self.linear_w, self.linear_out = act(LINEAR_OUT, HIDDEN), act(tokens, LINEAR_OUT)
        # decode_attention: q [T, Hq, D] over K/V caches [T, Hk, ATTENTION_CONTEXT, D] at int32 lengths;
        # merge_attn_states: two [T, Hq, D] results and their float32 LSEs [T, Hq]
        self.attn_k = act(tokens, HK, ATTENTION_CONTEXT, HEAD_DIM)
        self.attn_v = act(tokens, HK, ATTENTION_CONTEXT, HEAD_DIM)
        self.attn_lens = torch.full((tokens,), ATTENTION_CONTEXT, dtype=torch.int32, device=device)
        self.merge_a, self.merge_b = act(tokens, HQ, HEAD_DIM), act(tokens, HQ, HEAD_DIM)
        self.merge_lse_a, self.merge_lse_b = (torch.randn(tokens, HQ, device=device) for _ in range(2))


def _bind(fn: Callable[..., object], variables: Mapping[str, object], arguments: str) -> Call:
    """``lambda: fn(<arguments>)``, the arguments' text naming the closure's ``variables``."""
    source = f"def bind(fn, {', '.join(variables)}):\n    return lambda: fn({arguments})\n"
    scope: dict[str, Callable[..., Call]] = {}
    exec(source, scope)  # the text is built from identifiers only
    return scope["bind"](fn, *variables.values())


def call_site(fn: Callable[..., object], *args: object, **kwargs: object) -> Call:
    """``fn(*args, **kwargs)`` as a line of user code makes the call: its arguments are the
    closure's variables, keywords written in the call. (functools.partial would copy its keyword
    dict on every call, a cost that a user's call site does not pay.)"""
    names = [f"a{i}" for i in range(len(args))]
    variables = dict(zip(names, args, strict=True)) | kwargs
    return _bind(fn, variables, ", ".join([*names, *(f"{k}={k}" for k in kwargs)]))


def allocating(raw: Callable[..., object], args: Sequence[object], outputs: Sequence[int]) -> Call:
    """The functional form's reference: ``raw(*args)`` with the arguments at ``outputs`` replaced by
    new tensors, ``torch.empty(shape, dtype=dtype, device=device)`` of each (read beforehand),
    written in the call as a caller of the outputs-given form allocates them; so "eager - raw" of a
    functional row is the op's own overhead, as for its outputs-given row."""
    variables: dict[str, object] = {"torch": torch}
    written = []
    for i, arg in enumerate(args):
        if i in outputs:
            out = arg
            assert isinstance(out, torch.Tensor)
            variables |= {f"shape{i}": tuple(out.shape), f"dtype{i}": out.dtype, f"device{i}": out.device}
            written.append(f"torch.empty(shape{i}, dtype=dtype{i}, device=device{i})")
        else:
            variables[f"a{i}"] = arg
            written.append(f"a{i}")
    return _bind(raw, variables, ", ".join(written))


def _flashinfer(module: str) -> object | None:
    """FlashInfer's module when it is importable (the peer users would otherwise call), else None."""
    try:
        return importlib.import_module(f"flashinfer.{module}")
    except Exception:
        return None


def peer(module: str, name: str, *args: object, **kwargs: object) -> Call | None:
    """FlashInfer's eager call of the same op, or None where FlashInfer (or this op of it) is missing."""
    function = getattr(_flashinfer(module), name, None)
    return call_site(function, *args, **kwargs) if function is not None else None


# ---------------------------------------------------------------------------------------------
# The ops


@dataclasses.dataclass(frozen=True)
class Spec:
    """One op on one token count's inputs: what its rows call. The raw call is read from the op's own
    launch (``recorded_launches``)."""

    op: Callable[..., object]  # the public op
    args: tuple[object, ...]  # its arguments, in both forms
    outputs: tuple[torch.Tensor, ...] = ()  # the outputs the caller gives (out=, or outputs given)
    given_as: tuple[str, ...] = ()  # the op's keywords for `outputs` (none: positional, after `args`)
    kwargs: Mapping[str, object] = dataclasses.field(default_factory=dict)  # keywords of every form
    peer: Call | None = None  # FlashInfer's call: outputs given (in an op's one row, whatever its form)
    peer_functional: Call | None = None  # FlashInfer's functional call, where it has one


FUNCTIONAL = " (functional)"
GIVEN_OUTPUTS = (" (out=)", " (outputs given)")
ONE = ("",)  # in place, or outputs the caller always passes: one row
OUT = (GIVEN_OUTPUTS[0], FUNCTIONAL)  # an optional `out`
OUTPUTS = (GIVEN_OUTPUTS[1], FUNCTIONAL)  # optional outputs (several, or not named `out`)
ALLOCATES = (FUNCTIONAL,)  # outputs the op always allocates

Row = Callable[[Inputs], tuple[Call, Call, Call | None]]


def raw_call(eager: Call, allocates: bool) -> Call:
    """The raw tvm-ffi call of the one kernel ``eager`` launches, with the arguments the op passes
    it. Where the op allocates its outputs (``allocates``), the reference allocates the same
    outputs (found among the launch's arguments as the tensors the op returned) before the call."""
    [(kernel, args)], result = _common.recorded_launches(eager)
    if not allocates:
        return call_site(kernel, *args)
    returned = result if isinstance(result, tuple) else (result,)
    outputs = [i for i, a in enumerate(args) if any(a is r for r in returned)]
    assert len(outputs) == len(returned), "every output the op returns must be a launch argument"
    return allocating(kernel, args, outputs)


def _row(spec: Callable[[Inputs], Spec], form: str, only: bool) -> Row:
    """One form's row (``only``: the op's one row): inputs -> (the op through its public API, the raw
    tvm-ffi call of the kernel it launches, FlashInfer's eager call of the same op or None). All are
    call sites (one closure frame each, which the difference cancels)."""

    def row(t: Inputs) -> tuple[Call, Call, Call | None]:
        s = spec(t)
        if form == FUNCTIONAL:
            eager = call_site(s.op, *s.args, **s.kwargs)
            return eager, raw_call(eager, allocates=True), s.peer if only else s.peer_functional
        named = dict(zip(s.given_as, s.outputs, strict=True)) if s.given_as else {}
        positional = () if s.given_as else s.outputs
        eager = call_site(s.op, *s.args, *positional, **s.kwargs, **named)
        return eager, raw_call(eager, allocates=False), s.peer

    return row


def _all_layer_keywords(row_bytes: int) -> dict[str, object]:
    """The all-layer hicache ops' keywords: equal strides (so the element size is the stride), the quota."""
    return {
        "kv_cache_src_stride_bytes": row_bytes,
        "kv_cache_dst_stride_bytes": row_bytes,
        "block_quota": HICACHE_BLOCK_QUOTA,
    }


def _activation(name: str) -> tuple[tuple[str, ...], Callable[[Inputs], Spec]]:
    """The three gated activations."""
    return OUT, lambda t: Spec(
        getattr(jit_kernel, name),
        (t.gate_up,),
        (t.act_out,),
        ("out",),
        peer=peer("activation", name, t.gate_up, out=t.act_out),
        peer_functional=peer("activation", name, t.gate_up),
    )


def _flashinfer_sampling(
    name: str, inputs: Callable[[Inputs], tuple[object, ...]]
) -> tuple[tuple[str, ...], Callable[[Inputs], Spec]]:
    """A FlashInfer-named sampling op (it allocates its result): ours and FlashInfer's, on the same
    per-request tensors; the samplers with each request's seed and offset."""

    def spec(t: Inputs) -> Spec:
        args = inputs(t)
        kwargs = {} if name.endswith(("renorm_probs", "mask_logits")) else {"seed": t.seeds, "offset": t.offsets}
        return Spec(getattr(jit_kernel, name), args, kwargs=kwargs, peer=peer("sampling", name, *args, **kwargs))

    return ALLOCATES, spec


# op -> (its forms, inputs -> Spec): the public call of each op and its FlashInfer peer; the raw call is
# read from the op's own launch (raw_call).
SPECS: dict[str, tuple[tuple[str, ...], Callable[[Inputs], Spec]]] = {
    "rmsnorm": (
        OUT,
        lambda t: Spec(
            jit_kernel.rmsnorm,
            (t.x, t.w, EPS),
            (t.out,),
            ("out",),
            peer=peer("norm", "rmsnorm", t.x, t.w, EPS, out=t.out),
            peer_functional=peer("norm", "rmsnorm", t.x, t.w, EPS),
        ),
    ),
    "fused_add_rmsnorm": (
        ONE,
        lambda t: Spec(
            jit_kernel.fused_add_rmsnorm,
            (t.fa_x, t.fa_res, t.w, EPS),
            peer=peer("norm", "fused_add_rmsnorm", t.fa_x, t.fa_res, t.w, EPS),
        ),
    ),
    "gemma_rmsnorm": (
        OUT,
        lambda t: Spec(
            jit_kernel.gemma_rmsnorm,
            (t.x, t.w, EPS),
            (t.out,),
            ("out",),
            peer=peer("norm", "gemma_rmsnorm", t.x, t.w, EPS, out=t.out),
            peer_functional=peer("norm", "gemma_rmsnorm", t.x, t.w, EPS),
        ),
    ),
    "gemma_fused_add_rmsnorm": (
        ONE,
        lambda t: Spec(
            jit_kernel.gemma_fused_add_rmsnorm,
            (t.fa_x, t.fa_res, t.w, EPS),
            peer=peer("norm", "gemma_fused_add_rmsnorm", t.fa_x, t.fa_res, t.w, EPS),
        ),
    ),
    "silu_and_mul": _activation("silu_and_mul"),
    "gelu_and_mul": _activation("gelu_and_mul"),
    "gelu_tanh_and_mul": _activation("gelu_tanh_and_mul"),
    "fused_inplace_qknorm": (
        ONE,
        lambda t: Spec(
            jit_kernel.fused_inplace_qknorm,
            (t.q3, t.k3, t.qw3, t.kw3, EPS),
        ),
    ),
    "qknorm_across_heads": (
        ONE,
        lambda t: Spec(
            jit_kernel.qknorm_across_heads,
            (t.q2, t.k2, t.qw2, t.kw2, EPS),
        ),
    ),
    "per_tensor_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.per_tensor_quant_fp8,
            (t.x,),
            (t.fp8, t.fp8_scale),
        ),
    ),
    "per_token_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.per_token_quant_fp8,
            (t.x,),
            (t.fp8, t.token_scale),
        ),
    ),
    "per_token_group_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.per_token_group_quant_fp8,
            (t.x, GROUP),
            (t.fp8, t.group_scale),
            ("output_q", "output_s"),
        ),
    ),
    "silu_and_mul_per_token_group_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.silu_and_mul_per_token_group_quant_fp8,
            (t.gate_up, GROUP),
            (t.fp8, t.group_scale),
            ("output_q", "output_s"),
        ),
    ),
    "rmsnorm_quant_fp8": (
        OUT,
        lambda t: Spec(
            jit_kernel.rmsnorm_quant_fp8,
            (t.x, t.w, t.static_scale, EPS),
            (t.fp8,),
            ("out",),
            peer=peer("norm", "rmsnorm_quant", t.fp8, t.x, t.w, t.static_scale, EPS),
        ),
    ),
    "fused_add_rmsnorm_quant_fp8": (
        OUT,
        lambda t: Spec(
            jit_kernel.fused_add_rmsnorm_quant_fp8,
            (t.fa_x, t.fa_res, t.w, t.static_scale, EPS),
            (t.fp8,),
            ("out",),
            peer=peer("norm", "fused_add_rmsnorm_quant", t.fp8, t.fa_x, t.fa_res, t.w, t.static_scale, EPS),
        ),
    ),
    "rmsnorm_per_token_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.rmsnorm_per_token_quant_fp8,
            (t.x, t.w, EPS),
            (t.fp8, t.token_scale),
        ),
    ),
    "fused_add_rmsnorm_per_token_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.fused_add_rmsnorm_per_token_quant_fp8,
            (t.fa_x, t.fa_res, t.w, EPS),
            (t.fp8, t.token_scale),
        ),
    ),
    "rmsnorm_per_token_group_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.rmsnorm_per_token_group_quant_fp8,
            (t.x, t.w, GROUP, EPS),
            (t.fp8, t.group_scale),
            ("output_q", "output_s"),
        ),
    ),
    "fused_add_rmsnorm_per_token_group_quant_fp8": (
        OUTPUTS,
        lambda t: Spec(
            jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8,
            (t.fa_x, t.fa_res, t.w, GROUP, EPS),
            (t.fp8, t.group_scale),
            ("output_q", "output_s"),
        ),
    ),
    "apply_rope_with_cos_sin_cache_inplace": (
        ONE,
        lambda t: Spec(
            jit_kernel.apply_rope_with_cos_sin_cache_inplace,
            (t.positions, t.q2, t.k2, HEAD_DIM, t.cos_sin),
            peer=peer("rope", "apply_rope_with_cos_sin_cache_inplace", t.positions, t.q2, t.k2, HEAD_DIM, t.cos_sin),
        ),
    ),
    "fused_qknorm_rope": (
        ONE,
        lambda t: Spec(
            jit_kernel.fused_qknorm_rope,
            (t.q3, t.k3, t.qw3, t.kw3, t.positions, t.cos_sin, EPS),
        ),
    ),
    "store_kv_cache": (
        ONE,
        lambda t: Spec(
            jit_kernel.store_kv_cache,
            (t.kv_k, t.kv_v, t.k_cache, t.v_cache, t.slots),
        ),
    ),
    "set_mla_kv_buffer": (
        ONE,
        lambda t: Spec(
            jit_kernel.set_mla_kv_buffer,
            (t.mla_buffer, t.slots, t.nope, t.rope),
        ),
    ),
    "scale": (
        OUT,
        lambda t: Spec(
            jit_kernel.scale,
            (t.x, FACTOR),
            (t.scale_out,),
            ("out",),
        ),
    ),
    "add_constant": (
        OUT,
        lambda t: Spec(jit_kernel.add_constant, (t.ints, 1), (t.ints_out,), ("out",)),
    ),
    "transfer_hicache_one_layer": (
        ONE,
        lambda t: Spec(
            jit_kernel.transfer_hicache_one_layer,
            (t.k_dst, t.v_dst, t.idx_dst, t.k_src, t.v_src, t.idx_src),
            kwargs={"block_quota": HICACHE_BLOCK_QUOTA},
        ),
    ),
    "transfer_hicache_one_layer_mla": (
        ONE,
        lambda t: Spec(
            jit_kernel.transfer_hicache_one_layer_mla,
            (t.mla_dst, t.idx_dst, t.mla_src, t.idx_src),
            kwargs={"block_quota": HICACHE_BLOCK_QUOTA},
        ),
    ),
    "transfer_hicache_all_layer": (
        ONE,
        lambda t: Spec(
            jit_kernel.transfer_hicache_all_layer,
            (t.k_ptr_dst, t.v_ptr_dst, t.idx_dst, t.k_ptr_src, t.v_ptr_src, t.idx_src),
            kwargs=_all_layer_keywords(HICACHE_ROW_BYTES),
        ),
    ),
    "transfer_hicache_all_layer_mla": (
        ONE,
        lambda t: Spec(
            jit_kernel.transfer_hicache_all_layer_mla,
            (t.mla_ptr_dst, t.idx_dst, t.mla_ptr_src, t.idx_src),
            kwargs=_all_layer_keywords(MLA_ROW_BYTES),
        ),
    ),
    "topk_softmax": (
        ALLOCATES,
        lambda t: Spec(
            jit_kernel.topk_softmax,
            (t.qwen_logits, TOPK, True),
            (t.topk_weights, t.topk_ids),
        ),
    ),
    "topk_sigmoid": (
        ALLOCATES,
        lambda t: Spec(
            jit_kernel.topk_sigmoid,
            (t.dsv3_logits, TOPK, True, t.dsv3_bias),
            (t.topk_weights, t.topk_ids),
        ),
    ),
    "grouped_topk": (
        ALLOCATES,
        lambda t: Spec(
            jit_kernel.grouped_topk,
            (t.dsv3_logits, TOPK, DSV3_GROUPS, DSV3_TOPK_GROUP, True, t.dsv3_bias, DSV3_SCALE),
            (t.topk_weights, t.topk_ids),
            peer=peer(
                "fused_moe",
                "fused_topk_deepseek",
                t.dsv3_logits,
                t.dsv3_bias,
                DSV3_GROUPS,
                DSV3_TOPK_GROUP,
                TOPK,
                DSV3_SCALE,
                t.topk_weights_bf16,
                t.topk_ids,
                t.pdl,
            ),
        ),
    ),
    "moe_align_block_size": (
        ALLOCATES,
        lambda t: Spec(
            jit_kernel.moe_align_block_size,
            (t.align_ids, DSV3_EXPERTS, ALIGN_BLOCK),
            (t.sorted_ids, t.block_experts, t.padded_total),
        ),
    ),
    "moe_sum_reduce": (
        OUT,
        lambda t: Spec(
            jit_kernel.moe_sum_reduce,
            (t.expert_out, t.expert_weights),
            (t.out,),
            ("out",),
        ),
    ),
    "sample": (
        OUT,
        lambda t: Spec(
            jit_kernel.sample,
            (t.logits,),
            (t.token_ids,),
            ("out",),
            kwargs={"top_k": t.sample_top_k, "top_p": t.sample_top_p, "seed": t.seeds, "offset": t.offsets},
        ),
    ),
    "mask_logits": (
        OUT,
        lambda t: Spec(jit_kernel.mask_logits, (t.logits,), (t.masked,), ("out",), kwargs={"top_k": t.sample_top_k}),
    ),
    **{
        name: _flashinfer_sampling(name, inputs)
        for name, inputs in (
            ("sampling_from_logits", lambda t: (t.logits,)),
            ("sampling_from_probs", lambda t: (t.probs,)),
            ("top_k_sampling_from_probs", lambda t: (t.probs, t.sample_top_k)),
            ("top_p_sampling_from_probs", lambda t: (t.probs, t.sample_top_p)),
            ("min_p_sampling_from_probs", lambda t: (t.probs, t.sample_top_p)),
            ("top_k_top_p_sampling_from_logits", lambda t: (t.logits, t.sample_top_k, t.sample_top_p)),
            ("top_k_top_p_sampling_from_probs", lambda t: (t.probs, t.sample_top_k, t.sample_top_p)),
            ("top_k_renorm_probs", lambda t: (t.probs, t.sample_top_k)),
            ("top_p_renorm_probs", lambda t: (t.probs, t.sample_top_p)),
            ("top_k_mask_logits", lambda t: (t.logits, t.sample_top_k)),
            ("chain_speculative_sampling", lambda t: (t.draft_probs, t.draft_ids, t.target_probs)),
        )
    },
    "tree_speculative_sampling_target_only": (
        ONE,
        lambda t: Spec(
            jit_kernel.tree_speculative_sampling_target_only,
            (*t.tree_outs, *t.tree, t.tree_coins, t.tree_final_coins, t.target_probs, t.tree_draft_probs),
        ),
    ),
    "verify_tree_greedy": (
        ONE,
        lambda t: Spec(jit_kernel.verify_tree_greedy, (*t.tree_outs, *t.tree, t.target_predict)),
    ),
    "decode_linear": (
        OUT,
        lambda t: Spec(jit_kernel.decode_linear, (t.x, t.linear_w), (t.linear_out,), ("out",)),
    ),
    # The attention ops allocate on every call whatever out= is (decode_attention its split
    # workspace, merge_attn_states the LSE): the functional row only.
    "decode_attention": (
        ALLOCATES,
        lambda t: Spec(jit_kernel.decode_attention, (t.q3, t.attn_k, t.attn_v, t.attn_lens)),
    ),
    "merge_attn_states": (
        ALLOCATES,
        lambda t: Spec(jit_kernel.merge_attn_states, (t.merge_a, t.merge_lse_a, t.merge_b, t.merge_lse_b)),
    ),
}
OPS: dict[str, Row] = {
    name + form: _row(spec, form, only=len(forms) == 1) for name, (forms, spec) in SPECS.items() for form in forms
}
CPU_OPS = ("add_constant (out=)", "add_constant (functional)")  # the ops with a host kernel
# Public functions of jit_kernel.ops without a row, and why (tests/test_benchmarks.py checks that every
# other one has a row).
NO_ROW = {
    "can_use_hicache_jit_kernel": "a predicate on a row size: launches nothing",
    "decode_linear_fp8": "decode_linear's plan and launch path with fp8 operands: bench_decode_linear_fp8 times it",
    "stream_wait_value": "a wait on a device flag (a driver stream memory operation): its cost is the wait",
    "stream_wait_value_bounded": "a wait on a device flag (one polling thread, bounded): its cost is the wait",
}


# ---------------------------------------------------------------------------------------------
# Timing


def _sync(device: str) -> Call:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def host_us(fns: Sequence[Call], sync: Call, calls: int, repeats: int) -> tuple[list[float], list[float]]:
    """Host time per call of each of ``fns``: ``calls`` back-to-back calls then ``sync()``, timed
    together, ``repeats`` times, the functions' repeats interleaved. Returns the median per function
    and, for each function after the first, the median of its paired differences to the first
    (repeat by repeat): the host's speed drifts by more than a microsecond within a run, and pairs
    taken a few milliseconds apart see the same drift."""
    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:  # warm-up: first-call resolution, caches, the allocator
        for _ in range(min(calls, 1000)):
            fn()
    sync()
    for _ in range(repeats):
        for fn, times in zip(fns, samples, strict=True):

            def batch(fn: Call = fn) -> None:
                for _ in range(calls):
                    fn()
                sync()

            times.append(timeit.timeit(batch, number=1) / calls * 1e6)  # timeit turns the GC off
    differences = [statistics.median(t - f for t, f in zip(times, samples[0], strict=True)) for times in samples[1:]]
    return [statistics.median(times) for times in samples], differences


def _captured(fn: Call, calls: int) -> torch.cuda.CUDAGraph:
    """``calls`` calls of ``fn`` in one CUDA graph, warmed up (on a side stream, as torch wants before
    a capture) and replayed a few times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def _replay_us(graph: torch.cuda.CUDAGraph, calls: int) -> float:
    """One replay timed with CUDA events, per captured call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def paired_graph_us(fn: Call, reference: Call, calls: int, replays: int) -> tuple[float, float]:
    """CUDA-graph replay time per call of ``fn`` and of ``reference``: ``calls`` calls of each captured
    in its own graph, the two graphs replayed alternately ``replays`` times each; the two medians."""
    graphs = (_captured(fn, calls), _captured(reference, calls))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(replays):
        for graph, samples in zip(graphs, times, strict=True):
            samples.append(_replay_us(graph, calls))
    del graphs
    return statistics.median(times[0]), statistics.median(times[1])


def empty_kernel() -> Call:
    """The empty-kernel reference: ``x.add_(1)`` on a 1-element CUDA tensor (one tiny kernel launch)."""
    one = torch.zeros(1, device="cuda")
    return call_site(one.add_, 1)


# ---------------------------------------------------------------------------------------------
# Tables


def _error_cell(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"error: {type(error).__name__}: {text[:160]}".replace("|", "\\|")


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _checked_peer(flashinfer: Call | None, sync: Call) -> tuple[Call | None, str]:
    """FlashInfer's call after one checked run, or None and its error cell: a peer that fails (e.g.
    a module that is neither prebuilt nor allowed to compile) is its cell, not our row."""
    if flashinfer is None:
        return None, ""
    try:
        flashinfer()
        sync()
    except Exception as error:
        if results.stop_requested():
            raise KeyboardInterrupt from error
        return None, _error_cell(error)
    return flashinfer, ""


def eager_rows(
    names: Sequence[str], device: str, calls: int, repeats: int, measured: dict[str, tuple[float, float]] | None = None
) -> list[list[object]]:
    """One row per op: eager us, raw us, their difference and the target (eager <= raw + 1 us).
    ``measured`` collects each op's (eager us, raw us)."""
    rows: list[list[object]] = []
    sync = _sync(device)
    inputs = Inputs(EAGER_TOKENS, device)
    for name in names:
        results.check_stop()
        try:
            eager, raw, flashinfer = OPS[name](inputs)
            flashinfer, peer_cell = _checked_peer(flashinfer, sync)
            fns = [raw, eager] if flashinfer is None else [raw, eager, flashinfer]
            for fn in fns:  # one checked call each before timing
                fn()
            sync()
            times, differences = host_us(fns, sync, calls, repeats)
        except Exception as error:  # one op's failure is its row, not the run's end
            if results.stop_requested():  # an interrupt the clean-up turned into this error
                raise KeyboardInterrupt from error
            rows.append([name, _error_cell(error), "", "", "", ""])
            continue
        raw_us, eager_us, overhead_us = times[0], times[1], differences[0]
        if measured is not None:
            measured[name] = (eager_us, raw_us)
        rows.append(
            [
                name,
                format_us(eager_us, 2),
                format_us(raw_us, 2),
                f"{overhead_us:+.2f}",
                _met(overhead_us <= EAGER_SLACK_US),
                format_us(times[2], 2) if flashinfer is not None else peer_cell,
            ]
        )
    return rows


def floor_rows(device: str, calls: int, repeats: int) -> list[list[object]]:
    """What any op's eager call pays on this host before its own logic: rmsnorm's raw tvm-ffi call
    against a frame that passes the arguments on, the minimal op (that frame, the input's dtype, the
    weight's ``numel()``, the key tuple and the kernel-table lookup) and ``jit_kernel.rmsnorm`` itself,
    ``out=`` given; timed as the eager section times its rows."""
    inputs = Inputs(EAGER_TOKENS, device)
    x, weight, out = inputs.x, inputs.w, inputs.out
    [(kernel, args)], _ = _common.recorded_launches(lambda: jit_kernel.rmsnorm(x, weight, out=out))
    table = norm_ops._RMSNORM_KERNELS

    def passes_on(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: object = None) -> object:
        kernel(out, input, weight, eps, None)
        return out

    def minimal(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: object = None) -> object:
        table[input.dtype, weight.numel()](out, input, weight, eps, None)
        return out

    fns = {
        "raw tvm-ffi call": call_site(kernel, *args),
        "a frame passing its arguments on": call_site(passes_on, x, weight, out=out),
        "the minimal op: + dtype, numel(), key, table lookup": call_site(minimal, x, weight, out=out),
        "jit_kernel.rmsnorm (out=)": call_site(jit_kernel.rmsnorm, x, weight, out=out),
    }
    times, differences = host_us(list(fns.values()), _sync(device), calls, repeats)
    return [
        [name, format_us(us, 2), "" if i == 0 else f"{differences[i - 1]:+.2f}"]
        for i, (name, us) in enumerate(zip(fns, times, strict=True))
    ]


FLOOR_HEADER = ["call", "us per call", "- raw (median of paired repeats)"]


EAGER_HEADER = [
    "op",
    "eager us",
    "raw tvm-ffi us",
    "eager - raw (median of paired repeats)",
    f"eager <= raw + {EAGER_SLACK_US:g} us",
    "FlashInfer eager us",
]


def forms_rows(measured: dict[str, tuple[float, float]]) -> list[list[object]]:
    """One row per op with both forms: the functional call against the ``out=`` call plus the
    outputs' ``torch.empty`` (the raw functional reference's time over the raw call's)."""
    rows: list[list[object]] = []
    for name, (functional_us, raw_functional_us) in measured.items():
        if not name.endswith(FUNCTIONAL):
            continue
        op = name.removesuffix(FUNCTIONAL)
        given = next((op + suffix for suffix in GIVEN_OUTPUTS if op + suffix in measured), None)
        if given is None:
            continue
        out_us, raw_out_us = measured[given]
        empty_us = raw_functional_us - raw_out_us
        extra_us = functional_us - out_us
        rows.append(
            [
                op,
                format_us(out_us, 2),
                format_us(functional_us, 2),
                f"{extra_us:+.2f}",
                f"{empty_us:+.2f}",
                _met(extra_us <= empty_us),
            ]
        )
    return rows


FORMS_HEADER = [
    "op",
    "out= us",
    "functional us",
    "functional - out=",
    "torch.empty of the outputs (raw functional - raw)",
    "functional <= out= + torch.empty",
]


def graph_rows(names: Sequence[str], calls: int, replays: int) -> list[list[object]]:
    """One row per op: replay us per call, the empty kernel's replayed beside it, their ratio and the
    target, per token count."""
    rows: list[list[object]] = [[name] for name in names]
    empty = empty_kernel()
    for tokens in GRAPH_TOKENS:
        inputs = Inputs(tokens, "cuda")
        for name, row in zip(names, rows, strict=True):
            results.check_stop()
            try:
                us, empty_us = paired_graph_us(OPS[name](inputs)[0], empty, calls, replays)
            except Exception as error:
                if results.stop_requested():
                    raise KeyboardInterrupt from error
                row += [_error_cell(error), "", "", ""]
                continue
            row += [
                format_us(us, 2),
                format_us(empty_us, 2),
                ratio_cell(us, empty_us),
                _met(us <= GRAPH_MAX_RATIO * empty_us),
            ]
    return rows


def graph_header() -> list[str]:
    header = ["op"]
    for tokens in GRAPH_TOKENS:
        header += [
            f"{tokens} tok us",
            f"{tokens} tok empty us",
            f"{tokens} tok vs empty",
            f"{tokens} tok <= {GRAPH_MAX_RATIO:g}x",
        ]
    return header


Section = tuple[str, str, list[str], list[list[object]]]  # (name, title, header, rows)


def selected(ops: Sequence[str] | None) -> list[str]:
    """The rows of the ops named in ``ops`` (a row's op is its name before the form: ``decode_linear``
    selects ``decode_linear (out=)`` and ``decode_linear (functional)``), every row for None; an
    unknown name raises ``ValueError`` listing the known ones."""
    if ops is None:
        return list(OPS)
    known = {name.split(" (")[0] for name in OPS}
    unknown = sorted(set(ops) - known)
    if unknown:
        raise ValueError(f"unknown ops {unknown}; known: {sorted(known)}")
    return [name for name in OPS if name.split(" (")[0] in ops]


def no_op_rows(names: Sequence[str], calls: int, repeats: int) -> list[list[object]]:
    """The eager rows on CPU tensors, with every kernel a tvm-ffi function that takes any arguments
    and does nothing (a launch site's ``forget``, ``jit_kernel.ops._site``): eager - raw is then an
    op's own host cost (its Python, its key, its lookup) on a machine without a GPU. The kernel
    tables are emptied before and after, so no real kernel is served a no-op's key or the reverse."""
    make = _site._factory()
    if make is None:
        raise SystemExit("bench_dispatch --no-op-kernels: needs the launch_site module (an installed build)")
    nothing = make([0, 0, 0])[2]

    def missing(table: _common.KernelTable, key: Any) -> Any:
        dict.__setitem__(table, key, nothing)
        return nothing

    original = _common.KernelTable.__missing__
    for table in _common.TABLES:
        table.clear()
    _common.KernelTable.__missing__ = missing  # type: ignore[method-assign]
    try:
        return eager_rows(names, "cpu", calls, repeats)
    finally:
        _common.KernelTable.__missing__ = original  # type: ignore[method-assign]
        for table in _common.TABLES:
            table.clear()


def sections(
    calls: int,
    repeats: int,
    graph_calls: int,
    replays: int,
    cpu_only: bool,
    ops: Sequence[str] | None = None,
    no_op_kernels: bool = False,
) -> list[Section]:
    """Run every section this machine can (the eager and graph sections for the rows of ``ops``,
    every op's for None). Each is appended to ``SECTIONS`` as it completes, so an interrupted run
    keeps the ones measured."""
    cuda = torch.cuda.is_available() and not cpu_only
    names = selected(ops)
    SECTIONS.clear()
    if no_op_kernels:
        title = (
            "Eager on the CPU, every kernel a no-op tvm-ffi function: host us per call "
            f"(median of {repeats} x {calls} calls)"
        )
        SECTIONS.append(("no-op", title, EAGER_HEADER, no_op_rows(names, calls, repeats)))
        return list(SECTIONS)
    if cuda:
        torch.manual_seed(0)
        measured: dict[str, tuple[float, float]] = {}
        SECTIONS.append(
            (
                "eager",
                f"Eager, {EAGER_TOKENS} x {HIDDEN} bf16, outputs given: host us per call "
                f"(median of {repeats} x {calls} calls)",
                EAGER_HEADER,
                eager_rows(names, "cuda", calls, repeats, measured),
            )
        )
        SECTIONS.append(
            (
                "floor",
                f"The floor of an eager call on this host: rmsnorm's raw call, {EAGER_TOKENS} x {HIDDEN} bf16, "
                f"against Python functions around it (median of {repeats} x {calls} calls)",
                FLOOR_HEADER,
                floor_rows("cuda", calls, repeats),
            )
        )
        SECTIONS.append(
            (
                "forms",
                "Functional form against the out= form, from the eager section: the functional call "
                "allocates its outputs, the out= caller's cost of that is one torch.empty per output",
                FORMS_HEADER,
                forms_rows(measured),
            )
        )
        SECTIONS.append(
            (
                "graph",
                f"CUDA-graph replay: us per op call ({graph_calls} calls per graph, median of {replays} replays), "
                "against an empty kernel (1-element x.add_(1)) replayed alternately with it",
                graph_header(),
                graph_rows(names, graph_calls, replays),
            )
        )
    SECTIONS.append(
        (
            "cpu",
            f"CPU (host kernel), {EAGER_TOKENS} x {HIDDEN} int32: host us per call "
            f"(median of {repeats} x {calls} calls)",
            EAGER_HEADER,
            eager_rows(CPU_OPS, "cpu", calls, repeats),
        )
    )
    return list(SECTIONS)


SECTIONS: list[Section] = []


def markdown(args_line: str, measured: Sequence[Section], cpu_only: bool) -> str:
    cuda = torch.cuda.is_available() and not cpu_only
    lines = [
        f"command: `{args_line}`",
        "",
        f"device: {device_name() if cuda else 'no CUDA device (CPU section only)'}; torch {torch.__version__}; "
        f"jit_kernel {jit_kernel.__version__}",
        "",
    ]
    return "\n".join(lines) + "\n" + "\n".join(format_table(title, header, rows) for _, title, header, rows in measured)


def report(args_line: str, calls: int, repeats: int, graph_calls: int, replays: int, cpu_only: bool) -> str:
    """Run every section this machine can, and return the markdown."""
    return markdown(args_line, sections(calls, repeats, graph_calls, replays, cpu_only), cpu_only)


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=2000, help="calls per eager repeat (default 2000)")
    parser.add_argument("--repeats", type=int, default=61, help="eager repeats; the median is reported (default 61)")
    parser.add_argument("--graph-calls", type=int, default=100, help="op calls per CUDA graph (default 100)")
    parser.add_argument("--replays", type=int, default=50, help="timed replays of each graph (default 50)")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU section, even with a GPU")
    parser.add_argument(
        "--no-op-kernels",
        action="store_true",
        help="only the eager rows, on CPU tensors, every kernel a tvm-ffi function that does nothing: "
        "each op's own host cost, on any machine",
    )
    parser.add_argument(
        "--ops", nargs="+", metavar="OP", help="only these ops' eager and graph rows (e.g. decode_linear rmsnorm)"
    )
    args = parser.parse_args(argv)
    if min(args.calls, args.repeats, args.graph_calls, args.replays) < 1:
        parser.error("--calls, --repeats, --graph-calls and --replays must be positive")
    try:
        selected(args.ops)
    except ValueError as error:
        parser.error(str(error))
    args_line = " ".join([COMMAND, *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    complete = True
    with results.stoppable():
        try:
            measured = sections(
                args.calls, args.repeats, args.graph_calls, args.replays, args.cpu_only, args.ops, args.no_op_kernels
            )
        except KeyboardInterrupt:  # stopped at its time bound: keep the sections measured
            complete, measured = False, list(SECTIONS)
    text = markdown(args_line, measured, args.cpu_only)
    if not complete:
        text = "interrupted: the tables hold the sections measured before the stop\n\n" + text
    print(text)
    write_summary(args.save_path or os.environ.get(SAVE_PATH_ENV) or None, "bench_dispatch.md", text)
    json_dir = results.resolve_json_dir(args.json_dir)
    if json_dir:
        doc = results.document(
            "bench_dispatch",
            results.first_paragraph(__doc__),
            results.command_line("bench_dispatch", argv),
            [results.cells_table(name, title, header, rows) for name, title, header, rows in measured],
            complete=complete,
        )
        print(f"results: {results.write(json_dir, doc)}")
    if not complete:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
