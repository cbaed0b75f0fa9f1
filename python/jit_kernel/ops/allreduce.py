"""custom_all_reduce ops: the registered collectives behind :class:`jit_kernel.distributed.CustomAllReduce`.

``torch.ops.jit_kernel.custom_all_reduce(x, handle)`` (and ``custom_all_reduce_out``),
``torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm(x, residual, weight, eps, handle)`` and
``torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, eps,
handle)`` (and its ``_out``) and
``torch.ops.jit_kernel.custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(x, residual,
weight, output_q, output_s, group_size, eps, quant_eps, scale_ue8m0, handle)``.
A communicator owns buffers, IPC mappings and a process group, none of which a ``torch.library``
schema can carry, so the ops take ``handle``: the int a communicator registers itself under in this
process (:data:`COMMUNICATORS`). A compiled graph keeps the collective as one node with that int
as a constant; its fake implementation allocates the output and runs the launcher's checks, like
every op of the package.

The algorithm, the unit and the block split of a call depend only on what every rank shares (the
shape, the dtype, the world size), never on an address: every rank makes the same choice, as the
kernels' barriers need (csrc/allreduce/allreduce.cuh). A call captured in a CUDA graph by a
communicator made with ``graph_inputs="register"`` passes the device address of its slot in the
registered-inputs table (:meth:`Communicator.graph_input_slot`); every other call passes 0 and
copies its input in.

Which launch a call makes is decided on shared facts only; the layout of a tensor (its strides, its
address) is this rank's alone. A launcher check that failed on it would raise on this rank before
its launch while the peers wait in theirs until the timeout, so the plans never leave one to the
launcher: a tensor the kernels cannot take where it lies (:func:`needs_staging`) is replaced by a
contiguous, aligned temporary, copied back after the kernel where the kernel writes it.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jit_kernel.engine.dispatch import Dispatcher
from jit_kernel.engine.families import CUSTOM_ALL_REDUCE
from jit_kernel.ops._common import KernelTable, Launch, float_dtype, kernel_op, not_a_tensor, rows, rows_like

_DISPATCH = Dispatcher(CUSTOM_ALL_REDUCE)
_ALL_REDUCE = KernelTable(_DISPATCH, "all_reduce", lambda dtype: (float_dtype("custom_all_reduce", "x", dtype),))
_FUSED = KernelTable(
    _DISPATCH, "fused_add_rmsnorm", lambda dtype: (float_dtype("custom_all_reduce_fused_add_rmsnorm", "x", dtype),)
)
_FUSED_QUANT = KernelTable(
    _DISPATCH,
    "fused_add_rmsnorm_quant_fp8",
    lambda dtype: (float_dtype("custom_all_reduce_fused_add_rmsnorm_quant_fp8", "x", dtype),),
)
_GROUP = "custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8"
_FUSED_GROUP = KernelTable(
    _DISPATCH, "fused_add_rmsnorm_per_token_group_quant_fp8", lambda dtype: (float_dtype(_GROUP, "x", dtype),)
)

logger = logging.getLogger("jit_kernel.distributed")

#: Algorithm ids, as the kernel takes them.
ONE_SHOT, TWO_SHOT = 0, 1
#: The thresholds, in one place. One-shot (every rank reads every rank's whole input) up to this
#: many bytes; above it, two-shot (a reduce-scatter then an all-gather: each rank reads 2/W of the
#: data from each peer instead of all of it) for three ranks or more. Two ranks always take
#: one-shot: two-shot moves the same bytes there, in one more barrier.
ONE_SHOT_MAX_BYTES = 512 * 1024
#: The most ranks the kernels take (csrc/allreduce/allreduce.cuh, kMaxRanks).
MAX_RANKS = 8
#: The bytes of one slot of the registered-inputs table: one address per rank (RankInputs).
GRAPH_SLOT_BYTES = 8 * MAX_RANKS
#: The widest row of the fused form: 4 vectors of 16 bytes a thread over 512 threads (the bounded
#: row kernel of fused_add_rmsnorm, csrc/norm/common.cuh).
MAX_FUSED_VECTORS = 4 * 512
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def choose_algorithm(nbytes: int, world_size: int) -> int:
    """:data:`ONE_SHOT` or :data:`TWO_SHOT` for an all-reduce of ``nbytes`` over ``world_size``
    ranks (the same answer on every rank: it reads nothing else)."""
    if world_size <= 2 or nbytes <= ONE_SHOT_MAX_BYTES:
        return ONE_SHOT
    return TWO_SHOT


def reads_input_in_place(algo: int, x_address: int, out_address: int, nbytes: int) -> bool:
    """Whether a captured ``all_reduce`` of ``nbytes`` from ``x_address`` into ``out_address`` may
    read the ranks' inputs in place (registered; csrc/allreduce/allreduce.cuh): where the output
    does not overlap the input, and for two-shot also where it is the input itself (each rank then
    writes only its own slice while the peers read the inputs). A one-shot call in place, or any
    partial overlap, copies its input in: the rank would overwrite what its peers still read."""
    if out_address + nbytes <= x_address or x_address + nbytes <= out_address:
        return True
    return algo == TWO_SHOT and out_address == x_address


def fused_vectors_per_thread(dim: int, dtype: torch.dtype) -> int:
    """The vectors a thread holds in ``fused_add_rmsnorm``'s one-pass row kernel for rows of ``dim``
    (1, 2 or 4, the rule of ``launch_generic`` in csrc/norm/common.cuh; the kernels specialised for a
    hidden size agree with it for every size they are built for), or 0 when the rows are not whole
    16-byte vectors or are too wide for it: the fused form then runs as ``all_reduce`` followed by
    ``fused_add_rmsnorm`` (two launches, the same bits)."""
    per_vector = 16 // dtype.itemsize
    if dim <= 0 or dim % per_vector:
        return 0
    vectors = dim // per_vector
    if vectors <= 512:
        return 1
    if vectors <= 1024:
        return 2
    if vectors <= MAX_FUSED_VECTORS:
        return 4
    return 0


class Communicator(Protocol):
    """What the plans read of a communicator (:class:`jit_kernel.distributed.CustomAllReduce`)."""

    world_size: int
    rank: int
    max_bytes: int
    peers: torch.Tensor
    error_address: int
    timeout_ns: int

    def fallback_reason(self, x: torch.Tensor) -> str | None: ...

    def before_call(self) -> None: ...

    def torch_all_reduce(self, x: torch.Tensor, out: torch.Tensor) -> None: ...

    def graph_input_slot(self, x: torch.Tensor, out: torch.Tensor, algo: int) -> int: ...


#: Communicators by handle, in this process.
COMMUNICATORS: dict[int, Communicator] = {}


def communicator(op: str, handle: int) -> Communicator:
    try:
        return COMMUNICATORS[handle]
    except (KeyError, TypeError):
        raise ValueError(f"{op}: no communicator has handle {handle!r} in this process") from None


class _PythonCalls:
    """A kernel table whose one entry is a Python function, so that a plan returns it like a launch
    (the fallback, the copies out of staged tensors). A fake call runs nothing."""

    def __init__(self, function: Any) -> None:
        self._function = function

    def __getitem__(self, key: str) -> Any:
        return self._function

    def get_kernel(self, key: str, run: Any) -> Any:
        return self._function if run is True else None


def _torch_all_reduce(comm: Communicator, x: torch.Tensor, out: torch.Tensor) -> None:
    comm.torch_all_reduce(x, out)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


#: ``torch.distributed.all_reduce`` (the fallback), as a launch.
_TORCH = _PythonCalls(_torch_all_reduce)
#: ``dst.copy_(src)``, as a launch: a staged tensor's contents back into the caller's.
_COPY = _PythonCalls(_copy)


def _misaligned(t: torch.Tensor) -> bool:
    """Whether ``t``'s data is not 16-byte aligned (a fake tensor has no address: False)."""
    return not isinstance(t, FakeTensor) and t.data_ptr() % 16 != 0


def needs_staging(t: torch.Tensor) -> bool:
    """Whether the kernels cannot take ``t`` where it lies: it is not contiguous, or its data is not
    16-byte aligned (a fake tensor has no address: its strides only). Facts of this rank's tensor
    alone, so a plan stages such a tensor (:func:`_stage`) rather than let the launcher refuse it on
    this rank while the peers wait in the kernel."""
    return not t.is_contiguous() or _misaligned(t)


def _stage(t: torch.Tensor, copies: list[Launch] | None, *, read: bool = True, result: Any = None) -> torch.Tensor:
    """``t``, or, where :func:`needs_staging`, a contiguous aligned temporary that stands for it in
    the launch: a copy of ``t`` where the kernel reads it (``read``), else uninitialised. Where the
    kernel writes it (``copies`` given), the launch copying the temporary back into ``t`` is
    appended to ``copies`` (its result ``result``, the op's when it is the plan's last launch)."""
    if not needs_staging(t):
        return t
    if read:
        staged = t.clone(memory_format=torch.contiguous_format)
    else:
        staged = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    if copies is not None:
        copies.append((_COPY, "copy", (t, staged), result))
    return staged


def _launches(planned: Launch | list[Launch]) -> list[Launch]:
    return [planned] if type(planned) is tuple else list(planned)


@kernel_op("custom_all_reduce", out="out")
def custom_all_reduce(x: torch.Tensor, handle: int, out: torch.Tensor | None = None) -> Launch:
    """``out`` = the sum of ``x`` over the ranks of communicator ``handle``, the same bits on every
    rank (fp32, rank order 0 .. W-1, rounded once). ``out`` may be ``x``; allocated when None."""
    comm = communicator("custom_all_reduce", handle)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    reason = comm.fallback_reason(x)
    if reason is not None:
        return _TORCH, "all_reduce", (comm, x, out), out
    comm.before_call()
    x = _stage(x, None)  # the kernel reads whole 16-byte units of a contiguous input
    copies: list[Launch] = []
    target = _stage(out, copies, read=False, result=out)
    algo = choose_algorithm(x.numel() * x.element_size(), comm.world_size)
    inputs = comm.graph_input_slot(x, target, algo)  # 0 (copy-in) but for a registered captured call
    args = (target, x, comm.peers, comm.rank, algo, comm.error_address, comm.timeout_ns, comm.max_bytes, inputs)
    if copies:
        return [(_ALL_REDUCE, x.dtype, args, target), *copies]
    return _ALL_REDUCE, x.dtype, args, out


def _one_launch_kper(comm: Communicator, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> int:
    """The fused kernel's vectors per thread for this call, or 0 when it runs as separate calls. It
    reads what every rank shares (the shapes, the dtype, the communicator), never a layout: every
    rank must launch the same kernel, and a layout the kernel cannot take is staged."""
    kper = fused_vectors_per_thread(weight.numel(), x.dtype) if x.dtype in SUPPORTED_DTYPES else 0
    one_launch = kper > 0 and x.dim() >= 2 and x.shape == residual.shape and comm.fallback_reason(x) is None
    return kper if one_launch else 0


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 else t.view(-1, t.shape[-1])


@kernel_op("custom_all_reduce_fused_add_rmsnorm", mutates=("x", "residual"))
def custom_all_reduce_fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, handle: int
) -> Launch | list[Launch]:
    """In place, in one launch: ``residual = residual + all_reduce(x)``, ``x = rmsnorm(residual) *
    weight``; bit for bit ``all_reduce`` then ``jit_kernel.fused_add_rmsnorm``. Rows the one-launch
    kernel does not take (see :func:`fused_vectors_per_thread`), inputs over the buffer and fallback
    cases run as those two calls."""
    from jit_kernel.ops.norm import fused_add_rmsnorm

    comm = communicator("custom_all_reduce_fused_add_rmsnorm", handle)
    kper = _one_launch_kper(comm, x, residual, weight)
    if kper == 0:
        reduced = custom_all_reduce.op.plan(x, handle, x)
        return [*_launches(reduced), *_launches(fused_add_rmsnorm.op.plan(x, residual, weight, eps))]
    comm.before_call()
    copies: list[Launch] = []
    x, residual, weight = _stage(x, copies), _stage(residual, copies), _stage(weight, None)
    args = (_as_rows(x), _as_rows(residual), weight, eps, comm.peers, comm.rank, kper)
    launch = (_FUSED, x.dtype, (*args, comm.error_address, comm.timeout_ns, comm.max_bytes), None)
    return [launch, *copies] if copies else launch


@kernel_op("custom_all_reduce_fused_add_rmsnorm_quant_fp8", mutates=("x", "residual"), out="out")
def custom_all_reduce_fused_add_rmsnorm_quant_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    eps: float,
    handle: int,
    out: torch.Tensor | None = None,
) -> Launch | list[Launch]:
    """:func:`custom_all_reduce_fused_add_rmsnorm`, and ``out`` (float8_e4m3fn, ``x``'s shape) =
    ``fp8(clamp(x / scale))`` of the normalised ``x`` with the static scale ``scale`` (float32, one
    element, on the device), in one launch: bit for bit that call then
    ``jit_kernel.per_tensor_quant_fp8(x, out, scale, is_static=True)``. Returns ``out``."""
    from jit_kernel.ops.quant import _quant

    comm = communicator("custom_all_reduce_fused_add_rmsnorm_quant_fp8", handle)
    if out is None:
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    kper = _one_launch_kper(comm, x, residual, weight)
    if kper == 0:
        fused = custom_all_reduce_fused_add_rmsnorm.op.plan(x, residual, weight, eps, handle)
        kernels, key, args, _ = _quant.op.plan(x, out, scale, True)
        return [*_launches(fused), (kernels, key, args, out)]
    comm.before_call()
    copies: list[Launch] = []
    q = _stage(out, copies, read=False, result=out)
    x, residual = _stage(x, copies, result=out), _stage(residual, copies, result=out)
    weight = _stage(weight, None)
    args = (_as_rows(q), _as_rows(x), _as_rows(residual), weight, scale, eps, comm.peers, comm.rank, kper)
    launch = (_FUSED_QUANT, x.dtype, (*args, comm.error_address, comm.timeout_ns, comm.max_bytes), out)
    return [launch, *copies] if copies else launch


def group_outputs(
    x: torch.Tensor,
    group_size: int,
    column_major_scales: bool,
    packed_ue8m0: bool,
    output_q: torch.Tensor | None,
    output_s: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of the per-token-group form where they are None, in the layouts of
    ``jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8`` (which allocates them the same way):
    q ``float8_e4m3fn`` of ``x``'s shape; scales float32 ``[..., D // group_size]`` row-major, or
    (``column_major_scales``) the transpose of a ``[groups, tokens]`` buffer, or (``packed_ue8m0``)
    int32 ``[..., ceil(groups / 4)]`` over a ``[words, tokens padded to 4]`` buffer. Python sizes
    them, so it checks what sizing needs (``x`` a tensor, ``group_size`` an int dividing D); C++
    checks the rest (group_size 64 or 128, the dtypes and layouts)."""
    from jit_kernel.ops.norm_quant import _group_outputs

    _groups(x, group_size)
    return _group_outputs(_GROUP, x, group_size, column_major_scales, packed_ue8m0, output_q, output_s)


def _groups(x: object, group_size: object) -> int:
    """Groups per row of ``x`` (sizing the outputs and the rows of ``output_s``)."""
    if not isinstance(x, torch.Tensor):
        not_a_tensor(_GROUP, "x", x)
    if x.dim() == 0:
        raise ValueError(f"{_GROUP}: x must have at least one dimension")
    if type(group_size) is not int:
        raise TypeError(f"{_GROUP}: group_size must be an int, got {type(group_size).__name__}")
    width = x.shape[-1]
    if group_size <= 0 or width % group_size:
        raise ValueError(f"{_GROUP}: the last dimension of x ({width}) must be a multiple of group_size ({group_size})")
    return width // group_size


@kernel_op(_GROUP, mutates=("x", "residual", "output_q", "output_s"))
def custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    output_q: torch.Tensor,
    output_s: torch.Tensor,
    group_size: int,
    eps: float,
    quant_eps: float,
    scale_ue8m0: bool,
    handle: int,
) -> Launch | list[Launch]:
    """In place, in one launch: ``residual = residual + all_reduce(x)``, ``x = rmsnorm(residual) *
    weight``, and ``x`` quantised per group of ``group_size`` (64 or 128) elements of a token into
    ``output_q`` (float8_e4m3fn, ``x``'s shape) and ``output_s`` (float32 ``[..., groups]`` row- or
    column-major, or int32 packed UE8M0 exponents with ``scale_ue8m0``), ``s = max(absmax, quant_eps)
    / 448`` (a power of two with ``scale_ue8m0``), ``q = fp8(x * (1 / s))``: bit for bit
    ``all_reduce(x, out=x)`` then ``jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(x,
    residual, weight, group_size, eps, quant_eps, scale_ue8m0=scale_ue8m0, output_q=output_q,
    output_s=output_s, normed_out=x)``, whose quantisation code the kernel runs. Rows the one-launch
    kernel does not take (see :func:`fused_vectors_per_thread`), inputs over the buffer and fallback
    cases run as those two calls."""
    from jit_kernel.ops.norm_quant import _fused_add_rmsnorm_group

    comm = communicator(_GROUP, handle)
    kper = _one_launch_kper(comm, x, residual, weight)
    if kper == 0:
        reduced = custom_all_reduce.op.plan(x, handle, x)
        args = (x, residual, weight, output_q, output_s, group_size, eps, quant_eps, scale_ue8m0, x, None)
        return [*_launches(reduced), *_launches(_fused_add_rmsnorm_group.op.plan(*args))]
    comm.before_call()
    # output_s is not staged: the kernel takes any of its layouts where it lies, by its strides.
    copies: list[Launch] = []
    output_q = _stage(output_q, copies, read=False)
    x, residual, weight = _stage(x, copies), _stage(residual, copies), _stage(weight, None)
    if x.dim() == 2:  # the rows the kernel takes as they are; C++ matches the outputs against them
        q_rows, s_rows = output_q, output_s
    else:
        groups = _groups(x, group_size)
        q_rows = rows_like(_GROUP, "output_q", output_q, x)
        width = (groups + 3) // 4 if output_s.dtype == torch.int32 else groups
        if output_s.shape != (*x.shape[:-1], width):
            raise ValueError(
                f"{_GROUP}: output_s must have shape {(*x.shape[:-1], width)}, got {tuple(output_s.shape)}"
            )
        s_rows = rows(_GROUP, "output_s", output_s)
    args = (q_rows, s_rows, _as_rows(x), _as_rows(residual), weight, group_size, eps, quant_eps, scale_ue8m0)
    launch = (
        _FUSED_GROUP,
        x.dtype,
        (*args, comm.peers, comm.rank, kper, comm.error_address, comm.timeout_ns, comm.max_bytes),
        None,
    )
    return [launch, *copies] if copies else launch
