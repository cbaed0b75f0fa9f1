"""``jit_kernel.distributed``: tensor-parallel collectives on ``torch.distributed``.

:class:`CustomAllReduce` is made from a process group whose ranks run on one host (the group users
already have, NCCL or gloo). It allocates a data region and a signal region per rank, shares them
through CUDA IPC handles exchanged over the group (``all_gather_object``; a gloo group carries them
as well as an NCCL one), maps every peer's regions, and then all-reduces with one kernel launch per
call: the input is copied into the rank's own region by the kernel's first phase, the ranks meet at
device flags, and each sums every rank's data in fp32 in rank order (csrc/allreduce/allreduce.cuh
has the protocol).

Where the kernels cannot serve (the group spans hosts, a pair of GPUs has no peer access, no CUDA
device, more than :data:`~jit_kernel.ops.allreduce.MAX_RANKS` ranks) every call goes to
``torch.distributed.all_reduce``; a call they cannot serve (CPU tensors, a dtype other than bf16,
fp16 or fp32, more than ``max_bytes``) goes there too. Each reason is logged once, on the
``jit_kernel.distributed`` logger. These decisions read only what every rank shares, so all ranks
take the same path. The fallback all-reduces on ``fallback_group`` (default: the group the handles
were exchanged over; with a gloo group for the exchange, pass the NCCL group here so that CUDA
tensors are not reduced by gloo). World size 1: ``all_reduce(x)`` returns ``x`` itself (``out``,
when given, receives a copy), and the fused forms are the norm ops they equal
(``jit_kernel.fused_add_rmsnorm`` and its fp8 forms).

Failure of a peer: every wait on a flag gives up after ``timeout_s`` of GPU time, records the
ranks that did not arrive in a word of pinned host memory and lets the call finish (its output is
then undefined). The host reads that word without a sync: at the start of every call outside CUDA
graph capture (so an eager call raises for a failure of an earlier call), and in :meth:`check`,
which synchronises the stream first. The error is a :class:`PeerTimeoutError` naming the ranks;
after it the communicator refuses every call. ``debug=True`` checks after every eager call (a
sync each) and checks before each call that every rank passes the same shapes and dtypes (a
``ValueError`` on every rank, before any rank launches; without it a difference is not detected).

What only one rank's tensors can get wrong (their strides and addresses: a non-contiguous or not
16-byte aligned ``out``, ``residual``, ``weight``...) never fails that rank alone, which would leave
its peers waiting in the kernel: the plans route such a tensor through a contiguous, aligned
temporary (see :func:`jit_kernel.ops.allreduce.needs_staging`).

CUDA graphs (:meth:`CustomAllReduce.capture`), two variants, chosen by ``graph_inputs``:

- ``"copy"`` (the default): a captured call is the eager call, copy-in included; nothing is
  registered, and a replay reads whatever the captured input holds then;
- ``"register"``: each ``all_reduce`` captured inside ``capture()`` takes a slot of a device table
  (one address per rank) and is launched with that slot's address; at the end of ``capture()`` the
  ranks exchange the CUDA IPC handles of the allocations holding their captured inputs (the
  allocation's base and the input's offset in it: torch's caching allocator hands out pieces of
  larger ``cudaMalloc`` segments), open the peers', and fill the slots, so that replays read
  every rank's input in place with no copy-in. Eager calls copy in as before. A slot that cannot
  be filled on every rank (memory ``cudaIpcGetMemHandle`` cannot share, such as expandable
  segments) is left empty, and that call copies in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from jit_kernel.ops import allreduce as _ops

__all__ = ["CustomAllReduce", "PeerTimeoutError"]

logger = logging.getLogger("jit_kernel.distributed")
_LOGGED: set[str] = set()
_NEXT_HANDLE = [1]


class PeerTimeoutError(RuntimeError):
    """A custom all-reduce waited longer than its timeout for one or more ranks."""


def _log_once(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        logger.warning("custom all-reduce falls back to torch.distributed.all_reduce: %s", reason)


def _log_copy_once(reason: str) -> None:
    key = "copy: " + reason
    if key not in _LOGGED:
        _LOGGED.add(key)
        logger.warning("custom all-reduce: captured calls copy their inputs in: %s", reason)


GRAPH_INPUTS = ("copy", "register")


@dataclasses.dataclass(frozen=True)
class GraphCall:
    """One ``all_reduce`` captured inside :meth:`CustomAllReduce.capture` (``graph_inputs="register"``):
    its shape, dtype and algorithm, its slot of the registered-inputs table (-1: it copies in), and
    the input's address and size in this process."""

    shape: tuple[int, ...]
    dtype: str
    algo: int
    slot: int
    address: int
    nbytes: int

    def key(self) -> tuple[tuple[int, ...], str, int, int]:
        """What every rank's call at this position must agree on."""
        return self.shape, self.dtype, self.algo, self.slot


# What a rank contributes to the exchange at the end of capture(): whether its capture raised, its
# calls' keys, its allocations' IPC handles (each once), per call (handle index, offset) or None
# where its input is not shared (it copies in, or its memory cannot be shared), and the next slot
# it would hand out.
Contribution = tuple[bool, list[Any], list[bytes], list[tuple[int, int] | None], int]


def compare_captures(contributions: Sequence[Contribution]) -> str | None:
    """Why the ranks' captures cannot be registered (a rank raised inside capture(), or the ranks
    captured different calls), or None when they agree. Reads gathered data only: every rank gets
    the same answer."""
    raised = [r for r, (failed, *_) in enumerate(contributions) if failed]
    if raised:
        return f"rank(s) {raised} raised inside capture()"
    first = contributions[0][1]
    for rank, (_, keys, *_) in enumerate(contributions):
        if len(keys) != len(first):
            return f"rank 0 captured {len(first)} all_reduce calls, rank {rank} captured {len(keys)}"
        for index, (a, b) in enumerate(zip(first, keys, strict=True)):
            if tuple(a) != tuple(b):
                return (
                    f"the captured all_reduce at index {index} differs: rank 0 (shape, dtype, algorithm, slot) "
                    f"{tuple(a)}, rank {rank} {tuple(b)}"
                )
    return None


def shared_inputs(contributions: Sequence[Contribution], index: int) -> list[tuple[bytes, int]] | None:
    """Every rank's (IPC handle, offset) of captured call ``index``, or None where some rank does
    not share its input (the call then copies in on every rank)."""
    out = []
    for _, _, handles, where, _ in contributions:
        placed = where[index]
        if placed is None:
            return None
        out.append((handles[placed[0]], placed[1]))
    return out


def _function(export: str) -> Any:
    return _ops._DISPATCH.function(export, ("bf16_t",))


def _check_same_ranks(dist: Any, group: Any, fallback_group: Any) -> None:
    """Raise ``ValueError`` unless ``fallback_group`` holds the ranks of ``group`` (what every rank
    knows alike: the groups' global ranks)."""

    def members(g: Any) -> list[int]:
        return sorted(dist.get_process_group_ranks(dist.group.WORLD if g is None else g))

    try:
        ours, theirs = members(group), members(fallback_group)
    except Exception as error:  # not a process group, or one this rank is not in
        raise ValueError(
            f"CustomAllReduce: fallback_group must be a process group of group's ranks ({type(error).__name__}: "
            f"{error})"
        ) from None
    if ours != theirs:
        raise ValueError(f"CustomAllReduce: fallback_group must hold the ranks of group {ours}, got ranks {theirs}")


def _device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _local_index_of(uuid: str) -> int | None:
    for index in range(torch.cuda.device_count()):
        if _device_uuid(torch.device("cuda", index)) == uuid:
            return index
    return None


class CustomAllReduce:
    """An all-reduce communicator over the ranks of ``group`` (one host), see the module's text.

    ``device``: this rank's GPU (default: the current CUDA device). ``max_bytes``: the largest input
    the kernels take (a multiple of 16; larger inputs go to ``torch.distributed.all_reduce``); each
    rank allocates ``2 * max_bytes`` (two halves, alternating between calls). ``timeout_s``: how long
    a rank waits for its peers in a call before it gives up and reports them. ``graph_inputs``:
    ``"copy"`` or ``"register"``, how ``all_reduce`` calls captured in :meth:`capture` get their
    inputs (see the module's text); ``max_graph_calls``: with ``"register"``, the slots of the
    registered-inputs table (``max_graph_calls * 64`` bytes on the device; captured calls beyond it
    copy in). ``fallback_group``: the process group ``torch.distributed.all_reduce`` runs on where a
    call falls back (default: ``group``), with the same ranks as ``group``: e.g. the NCCL group when
    ``group`` is a gloo group made for the exchange. ``debug``: see the module's text.

    Construction is collective: every rank of ``group`` must make it, in the same order as any other
    collective on the group, with the same ``max_bytes``, ``graph_inputs``, ``max_graph_calls`` and
    ``debug``.
    """

    def __init__(
        self,
        group: Any,
        *,
        device: torch.device | str | int | None = None,
        max_bytes: int = 8 << 20,
        timeout_s: float = 30.0,
        debug: bool = False,
        graph_inputs: str = "copy",
        max_graph_calls: int = 32768,
        fallback_group: Any = None,
    ) -> None:
        import torch.distributed as dist

        if type(max_bytes) is not int or max_bytes <= 0 or max_bytes % 16:
            raise ValueError(f"CustomAllReduce: max_bytes must be a positive multiple of 16, got {max_bytes!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"CustomAllReduce: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if not isinstance(graph_inputs, str) or graph_inputs not in GRAPH_INPUTS:
            raise ValueError(f"CustomAllReduce: graph_inputs must be 'copy' or 'register', got {graph_inputs!r}")
        if type(max_graph_calls) is not int or max_graph_calls <= 0:
            raise ValueError(f"CustomAllReduce: max_graph_calls must be a positive int, got {max_graph_calls!r}")
        if fallback_group is not None and fallback_group is not group:
            _check_same_ranks(dist, group, fallback_group)
        self.group = group
        #: The group the fallback's torch.distributed.all_reduce runs on.
        self.fallback_group = group if fallback_group is None else fallback_group
        self.world_size: int = dist.get_world_size(group)
        self.rank: int = dist.get_rank(group)
        self.max_bytes = max_bytes
        self.timeout_s = float(timeout_s)
        self.timeout_ns = max(1, int(self.timeout_s * 1e9))
        self.debug = bool(debug)
        #: Why every call falls back to torch.distributed.all_reduce (None: the kernels serve).
        self.disabled_reason: str | None = None
        self.peers = torch.zeros(2, max(self.world_size, 1), dtype=torch.int64)
        self.error_address = 0
        self._error: Any = None  # numpy view of the pinned error word
        self._failed: str | None = None
        self._capturing = False
        self._regions: list[tuple[int, int]] = []  # (address, owned) to free or close
        self.device: torch.device | None = None
        self.graph_inputs = graph_inputs
        self.max_graph_calls = max_graph_calls
        self._graph_table: torch.Tensor | None = None  # [max_graph_calls, MAX_RANKS] int64 on the device
        self._graph_table_address = 0  # its address (0: no table, every captured call copies in)
        self._graph_slots = 0  # slots handed out so far (never reused: an older graph may replay)
        self._graph_calls: list[GraphCall] = []  # captured since the last registration
        self._opened: dict[bytes, int] = {}  # a peer allocation's IPC handle -> its mapping here
        #: Captured all_reduce calls whose slots were filled (they read the inputs in place), and
        #: those that copy in, over every capture() so far (graph_inputs="register").
        self.registered_graph_calls = 0
        self.copied_graph_calls = 0
        self.handle = _NEXT_HANDLE[0]
        _NEXT_HANDLE[0] += 1
        _ops.COMMUNICATORS[self.handle] = self
        if self.world_size == 1:
            return
        try:
            self.disabled_reason = self._setup(dist, device)
        except BaseException:
            # A refused construction keeps nothing: a registered communicator would hold the group
            # (and any regions mapped so far) past destroy_process_group, to the interpreter's exit.
            self.close()
            raise
        if self.disabled_reason is not None:
            _log_once(self.disabled_reason)

    # -- set-up --------------------------------------------------------------------------------

    def _setup(self, dist: Any, device: torch.device | str | int | None) -> str | None:
        """Check the ranks can share memory; map every rank's regions. Returns why not, or None.
        Every rank reaches the same answer (each decision is made on gathered facts)."""
        if self.world_size > _ops.MAX_RANKS:
            return f"{self.world_size} ranks, more than the kernels' {_ops.MAX_RANKS}"
        uuid = None
        if torch.cuda.is_available():
            if device is None:
                device = torch.device("cuda", torch.cuda.current_device())
            elif isinstance(device, int):
                device = torch.device("cuda", device)
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError(f"CustomAllReduce: device must be a CUDA device, got {device}")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            self.device = device
            uuid = _device_uuid(device)
        settings = (self.max_bytes, self.graph_inputs, self.max_graph_calls, self.debug)
        facts: list[Any] = [None] * self.world_size
        dist.all_gather_object(facts, (socket.gethostname(), uuid, settings), group=self.group)
        if any(theirs != settings for _, _, theirs in facts):
            raise ValueError(
                "CustomAllReduce: the ranks pass different (max_bytes, graph_inputs, max_graph_calls, debug): "
                + str([theirs for _, _, theirs in facts])
            )
        if len({host for host, _, _ in facts}) > 1:
            return "the group spans hosts (" + ", ".join(sorted({host for host, _, _ in facts})) + ")"
        missing = [r for r, (_, u, _) in enumerate(facts) if u is None]
        if missing:
            return f"rank(s) {missing} have no CUDA device"
        reachable = self._peer_access([u for _, u, _ in facts])
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, reachable, group=self.group)
        for rank, unreachable in enumerate(verdicts):
            if unreachable:
                return f"no peer access (P2P) from rank {rank}'s GPU to rank(s) {unreachable}"
        self._map_regions(dist)
        if self.graph_inputs == "register":
            self._graph_table = torch.zeros(self.max_graph_calls, _ops.MAX_RANKS, dtype=torch.int64, device=self.device)
            self._graph_table_address = self._graph_table.data_ptr()
        return None

    def _peer_access(self, uuids: list[str]) -> list[int]:
        """The ranks whose GPU this rank's GPU cannot reach (its own GPU and the same GPU always can)."""
        assert self.device is not None
        mine = uuids[self.rank]
        unreachable = []
        for rank, uuid in enumerate(uuids):
            if uuid == mine:
                continue
            index = _local_index_of(uuid)
            if index is None or not torch.cuda.can_device_access_peer(self.device, index):
                unreachable.append(rank)
        return unreachable

    def _map_regions(self, dist: Any) -> None:
        assert self.device is not None
        index = self.device.index
        sizes = (2 * self.max_bytes, int(_function("signal_bytes")()))
        mine = [int(_function("ipc_alloc")(index, size)) for size in sizes]
        self._regions += [(address, True) for address in mine]
        handles = []
        for address in mine:
            handle = torch.zeros(64, dtype=torch.uint8)
            _function("ipc_handle")(index, address, handle)
            handles.append(bytes(handle.tolist()))
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, handles, group=self.group)
        for rank, theirs in enumerate(gathered):
            for row, handle in enumerate(theirs):
                if rank == self.rank:
                    address = mine[row]
                else:
                    address = int(_function("ipc_open")(index, torch.tensor(list(handle), dtype=torch.uint8)))
                    self._regions.append((address, False))
                self.peers[row, rank] = address
        error = torch.zeros(_ops.MAX_RANKS, dtype=torch.int32, pin_memory=True)  # error[r]: r did not arrive
        self._error_tensor = error  # kept alive: the kernels write it
        self._error = error.numpy()
        self.error_address = error.data_ptr()
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)  # every region is zeroed before any rank's first call

    # -- calls ---------------------------------------------------------------------------------

    def fallback_reason(self, x: torch.Tensor) -> str | None:
        """Why a call on ``x`` goes to ``torch.distributed.all_reduce``, or None (the kernels serve).
        Reads only what every rank shares (the communicator, the device type, dtype and size)."""
        if self.world_size == 1:
            return "world size 1"
        if self.disabled_reason is not None:
            return self.disabled_reason
        if x.device.type != "cuda":
            return f"{x.device.type} tensors"
        if x.dtype not in _ops.SUPPORTED_DTYPES:
            return f"dtype {str(x.dtype).removeprefix('torch.')} (the kernels take bf16, fp16, fp32)"
        if x.numel() * x.element_size() > self.max_bytes:
            return f"inputs of more than max_bytes={self.max_bytes}"
        return None

    def torch_all_reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """The fallback: ``out`` = ``torch.distributed.all_reduce`` of ``x`` over ``fallback_group``
        (through a contiguous temporary where ``out`` is not contiguous: NCCL refuses such a tensor
        and gloo reduces its storage as if it were contiguous)."""
        import torch.distributed as dist

        reason = self.fallback_reason(x)
        if reason is not None and reason != "world size 1":
            if self._capturing or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                raise RuntimeError(
                    f"CustomAllReduce: a call captured in a CUDA graph must take the custom kernels; this one falls "
                    f"back to torch.distributed.all_reduce ({reason})"
                )
            _log_once(reason)
        target = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        if target is not x:
            target.copy_(x)
        if self.world_size > 1:
            dist.all_reduce(target, group=self.fallback_group)
        if target is not out:
            out.copy_(target)

    def before_call(self) -> None:
        """Refuse a failed communicator; outside capture, raise for a failure recorded by an earlier
        call (a read of pinned memory, no sync)."""
        if self._failed is not None:
            raise PeerTimeoutError(self._failed)
        if self._error is not None and self._error.any():
            self._raise_error([r for r in range(self.world_size) if self._error[r]])

    def _raise_error(self, ranks: list[int]) -> None:
        self._failed = (
            f"CustomAllReduce (rank {self.rank} of {self.world_size}): rank(s) {ranks} did not arrive within "
            f"timeout_s={self.timeout_s}; the communicator is unusable"
        )
        raise PeerTimeoutError(self._failed)

    def check(self) -> None:
        """Synchronise the current stream and raise :class:`PeerTimeoutError` if any call so far gave
        up waiting for a peer (not during CUDA graph capture)."""
        if self._error is None:
            return
        if self.device is not None:
            torch.cuda.current_stream(self.device).synchronize()
        self.before_call()

    def _debug_checks(self, *tensors: torch.Tensor) -> None:
        """``debug=True``: raise ``ValueError`` on every rank where the ranks' tensors differ in shape
        or dtype (an ``all_gather_object`` of them over the group, before any rank launches)."""
        import torch.distributed as dist

        described = [(tuple(t.shape), str(t.dtype)) for t in tensors]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, described, group=self.group)
        if any(theirs != described for theirs in everyone):
            raise ValueError(f"CustomAllReduce: the ranks pass different shapes or dtypes: {everyone}")

    def all_reduce(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The sum of ``x`` over the group's ranks, the same bits on every rank (``out`` when given,
        which may be ``x``; else a new tensor). Every rank passes the same shape and dtype."""
        if self.world_size == 1:
            if out is None or out is x:
                return x
            return out.copy_(x)
        debug = self.debug and not self._capturing and not torch.compiler.is_compiling()
        if debug:
            self._debug_checks(x)
        result = _ops.custom_all_reduce(x, self.handle, out)
        if debug:
            self.check()
        return result

    def all_reduce_fused_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
    ) -> None:
        """In place: ``residual += all_reduce(x)`` (added in fp32, stored in the dtype), then
        ``x = rmsnorm(residual) * weight``, in one launch; bit for bit :meth:`all_reduce` followed by
        ``jit_kernel.fused_add_rmsnorm(x, residual, weight, eps)``."""
        if self.world_size == 1:
            from jit_kernel.ops.norm import fused_add_rmsnorm

            fused_add_rmsnorm(x, residual, weight, eps)
            return
        debug = self.debug and not self._capturing and not torch.compiler.is_compiling()
        if debug:
            self._debug_checks(x, residual, weight)
        _ops.custom_all_reduce_fused_add_rmsnorm(x, residual, weight, eps, self.handle)
        if debug:
            self.check()

    def all_reduce_fused_add_rmsnorm_quant_fp8(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        scale: torch.Tensor,
        eps: float = 1e-6,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`all_reduce_fused_add_rmsnorm`, and the normalised ``x`` quantised to float8_e4m3fn
        with the static per-tensor ``scale`` (float32, one element, on the device) into ``out``
        (allocated when None), in one launch: bit for bit :meth:`all_reduce_fused_add_rmsnorm` then
        ``jit_kernel.per_tensor_quant_fp8(x, out, scale, is_static=True)``. Returns ``out``."""
        if self.world_size == 1:
            from jit_kernel.ops.norm import fused_add_rmsnorm
            from jit_kernel.ops.quant import per_tensor_quant_fp8

            fused_add_rmsnorm(x, residual, weight, eps)
            return per_tensor_quant_fp8(x, out, scale, is_static=True)[0]
        debug = self.debug and not self._capturing and not torch.compiler.is_compiling()
        if debug:
            self._debug_checks(x, residual, weight)
        result = _ops.custom_all_reduce_fused_add_rmsnorm_quant_fp8(x, residual, weight, scale, eps, self.handle, out)
        if debug:
            self.check()
        return result

    def all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        group_size: int = 128,
        eps: float = 1e-6,
        quant_eps: float = 1e-10,
        column_major_scales: bool = False,
        scale_ue8m0: bool = False,
        output_q: torch.Tensor | None = None,
        output_s: torch.Tensor | None = None,
        *,
        packed_ue8m0: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`all_reduce_fused_add_rmsnorm` (``residual += all_reduce(x)``, ``x`` left
        normalised), and the normalised rows quantised to float8_e4m3fn with one dynamic scale per
        group of ``group_size`` (64 or 128) elements of a token, ``s = max(absmax, quant_eps) / 448``
        (rounded up to a power of two with ``scale_ue8m0``), ``q = fp8(x * (1 / s))``, in one
        launch: bit for bit :meth:`all_reduce` (``out=x``) then
        ``jit_kernel.fused_add_rmsnorm_per_token_group_quant_fp8(x, residual, weight, group_size,
        eps, quant_eps, column_major_scales, scale_ue8m0, output_q, output_s,
        packed_ue8m0=packed_ue8m0, normed_out=x)``, whose quantisation code the kernel runs.

        Returns ``(output_q, output_s)``, allocated where None in that op's layouts: float32 scales
        ``[..., D // group_size]`` row-major, or (``column_major_scales``) the transpose of a
        ``[groups, tokens]`` buffer, or (``packed_ue8m0=True``) int32 packed UE8M0 exponents
        (DeepGEMM's sm_100 layout). A given ``output_s`` may have any row- or column-major strides
        (TMA-padded too); its strides and dtype decide the layout, as for that op. Rows the
        one-launch kernel does not take (not whole 16-byte vectors, more than 2048 of them, not
        contiguous) and fallback cases run as those two calls."""
        if output_q is None or output_s is None:
            output_q, output_s = _ops.group_outputs(
                x, group_size, column_major_scales, packed_ue8m0, output_q, output_s
            )
        ue8m0 = scale_ue8m0 or packed_ue8m0
        if self.world_size == 1:
            from jit_kernel.ops import norm_quant

            return norm_quant.fused_add_rmsnorm_per_token_group_quant_fp8(
                x,
                residual,
                weight,
                group_size,
                eps,
                quant_eps,
                scale_ue8m0=ue8m0,
                output_q=output_q,
                output_s=output_s,
                normed_out=x,
            )
        debug = self.debug and not self._capturing and not torch.compiler.is_compiling()
        if debug:
            self._debug_checks(x, residual, weight)
        _ops.custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8(
            x, residual, weight, output_q, output_s, group_size, eps, quant_eps, ue8m0, self.handle
        )
        if debug:
            self.check()
        return output_q, output_s

    # -- CUDA graphs ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Wrap CUDA graph capture of calls on this communicator, outside ``torch.cuda.graph``::

            with comm.capture(), torch.cuda.graph(graph):
                comm.all_reduce(x, out=y)

        One context may hold several graphs' captures. On entry it raises for an earlier failure;
        inside, a call that would fall back to ``torch.distributed.all_reduce`` raises (it cannot be
        captured). Replays do not sync: call :meth:`check` after them to learn of a peer that did
        not arrive. The epoch lives in device memory, so replays and eager calls interleave freely.

        ``graph_inputs="copy"``: nothing is registered; each captured call copies its input into
        the communicator's region inside the kernel, as an eager call does.

        ``graph_inputs="register"``: each ``all_reduce`` captured here takes a slot of the
        registered-inputs table; on exit (collective: every rank leaves its ``capture()`` in step,
        after its graphs' capture ended) the ranks check that they captured the same calls (shape,
        dtype, algorithm, slot, in order; a ``ValueError`` names the first difference, and no input
        is registered), exchange the IPC handles of the allocations holding their inputs, open the
        peers' and fill the slots: replays then read every rank's input in place. Every rank must
        capture the same sequence of calls, as it must call in the same order eagerly. A captured
        call whose output overlaps its input, other than a two-shot call exactly in place, copies
        in (see :func:`jit_kernel.ops.allreduce.reads_input_in_place`), and so does one whose slot
        could not be filled on every rank. The captured inputs must stay allocated, at their
        addresses, while the graph may replay (as any graph's tensors must), and :meth:`close` may
        only follow the last replay."""
        if self._capturing:
            raise RuntimeError("CustomAllReduce: capture() contexts do not nest")
        self.check()
        self._capturing = True
        raised = False
        try:
            yield
        except BaseException:
            raised = True
            raise
        finally:
            self._capturing = False
            if self._graph_table is not None:
                self._end_capture(raised)

    def graph_input_slot(self, x: torch.Tensor, out: torch.Tensor, algo: int) -> int:
        """The device address of the registered-inputs slot an ``all_reduce`` of ``x`` into ``out``
        is launched with, or 0 (it copies in): a slot only for a call captured inside
        :meth:`capture` on a ``graph_inputs="register"`` communicator, recorded for the exchange at
        its end."""
        if not self._capturing or self._graph_table is None or isinstance(x, FakeTensor):
            return 0
        if not torch.cuda.is_current_stream_capturing():
            return 0  # an eager call inside capture() (a warm-up): the copy-in
        nbytes = x.numel() * x.element_size()
        readable = _ops.reads_input_in_place(algo, x.data_ptr(), out.data_ptr(), nbytes)
        return self._record_captured(tuple(x.shape), x.dtype, algo, x.data_ptr(), nbytes, readable)

    def _record_captured(
        self, shape: tuple[int, ...], dtype: torch.dtype, algo: int, address: int, nbytes: int, readable: bool
    ) -> int:
        """Record a captured call; its slot's device address, or 0 where it copies in (its input
        cannot be read in place, ``readable`` False, or the table is full)."""
        slot = -1
        if readable and self._graph_slots < self.max_graph_calls:
            slot = self._graph_slots
            self._graph_slots += 1
        elif readable:
            _log_copy_once(f"more than max_graph_calls={self.max_graph_calls} calls captured")
        self._graph_calls.append(GraphCall(shape, str(dtype).removeprefix("torch."), algo, slot, address, nbytes))
        return 0 if slot < 0 else self._graph_table_address + slot * _ops.GRAPH_SLOT_BYTES

    def _end_capture(self, raised: bool) -> None:
        """Register the calls captured since the last registration (see :meth:`capture`)."""
        import torch.distributed as dist

        calls, self._graph_calls = self._graph_calls, []
        if torch.cuda.is_current_stream_capturing():
            # Registration copies into the table and synchronises, which would end the capture.
            self.copied_graph_calls += len(calls)
            if not raised:
                raise RuntimeError(
                    "CustomAllReduce: capture() must enclose the graph's capture (`with comm.capture(), "
                    "torch.cuda.graph(g):`); it ended while the stream still captures, and no input was registered"
                )
            return
        mine = self._contribution(raised, calls)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.group)
        problem = compare_captures(gathered)
        if problem is not None:
            # The refused calls' slots stay empty; the ranks go on from the same next slot.
            self._graph_slots = max(theirs[4] for theirs in gathered)
            self.copied_graph_calls += len(calls)
            if raised:
                return  # this rank's own exception propagates
            raise ValueError(
                f"CustomAllReduce (rank {self.rank}): no captured input was registered: {problem}; every rank must "
                "capture the same all_reduce calls in the same order, and these graphs must not be replayed"
            )
        # Open the peers' allocations; a slot is filled only where every rank opened every peer's.
        rows: dict[int, list[int]] = {}
        for index, call in enumerate(calls):
            shared = shared_inputs(gathered, index) if call.slot >= 0 else None
            if shared is None:
                continue
            try:
                rows[call.slot] = [
                    call.address if rank == self.rank else self._open_input(handle) + offset
                    for rank, (handle, offset) in enumerate(shared)
                ]
            except Exception as error:
                _log_copy_once(f"a peer's captured input could not be opened ({type(error).__name__}: {error})")
        opened: list[Any] = [None] * self.world_size
        dist.all_gather_object(opened, sorted(rows), group=self.group)
        agreed = sorted(set.intersection(*(set(theirs) for theirs in opened)))
        if len(agreed) < sum(call.slot >= 0 for call in calls):
            _log_copy_once(
                "some captured inputs could not be shared (memory cudaIpcGetMemHandle cannot share, such as "
                "expandable segments, or a peer's allocation that did not open)"
            )
        if agreed:
            table = torch.zeros(len(agreed), _ops.MAX_RANKS, dtype=torch.int64)
            for row, slot in enumerate(agreed):
                table[row, : self.world_size] = torch.tensor(rows[slot], dtype=torch.int64)
            self._write_slots(agreed, table)
        self.registered_graph_calls += len(agreed)
        self.copied_graph_calls += len(calls) - len(agreed)

    def _write_slots(self, slots: list[int], rows: torch.Tensor) -> None:
        """Fill the table's ``slots`` with ``rows`` (CPU int64 [len(slots), MAX_RANKS]), done before
        any replay on any stream."""
        assert self._graph_table is not None and self.device is not None
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self._graph_table.index_copy_(0, index, rows.to(self.device))
        torch.cuda.synchronize(self.device)

    def _contribution(self, raised: bool, calls: list[GraphCall]) -> Contribution:
        """This rank's part of the exchange at the end of capture() (see :data:`Contribution`)."""
        handles: list[bytes] = []
        known: dict[bytes, int] = {}
        where: list[tuple[int, int] | None] = []
        handle = torch.zeros(64, dtype=torch.uint8)
        for call in calls:
            offset = -1
            if call.slot >= 0 and not raised:
                assert self.device is not None
                offset = int(_function("ipc_input_handle")(self.device.index, call.address, call.nbytes, handle))
            if offset < 0:
                where.append(None)
                continue
            key = bytes(handle.tolist())
            where.append((known.setdefault(key, len(handles)), offset))
            if len(handles) < len(known):
                handles.append(key)
        return raised, [call.key() for call in calls], handles, where, self._graph_slots

    def _open_input(self, handle: bytes) -> int:
        """This process's mapping of a peer's allocation (opened once; closed by :meth:`close`)."""
        address = self._opened.get(handle)
        if address is None:
            assert self.device is not None
            tensor = torch.tensor(list(handle), dtype=torch.uint8)
            address = int(_function("ipc_open")(self.device.index, tensor))
            self._opened[handle] = address
        return address

    def close(self) -> None:
        """Unmap the peers' regions and captured inputs and free this rank's regions and table (no
        collective; the other ranks must not call, nor replay a graph of this communicator, after
        any rank closed)."""
        if self.device is not None:
            free, close = _function("ipc_free"), _function("ipc_close")
            for address in self._opened.values():
                with contextlib.suppress(Exception):
                    close(self.device.index, address)
            for address, owned in reversed(self._regions):
                with contextlib.suppress(Exception):
                    (free if owned else close)(self.device.index, address)
        self._opened.clear()
        self._regions.clear()
        self._graph_table, self._graph_table_address = None, 0
        self.disabled_reason = self.disabled_reason or "closed"
        _ops.COMMUNICATORS.pop(self.handle, None)

    def __repr__(self) -> str:
        path = "custom kernels" if self.disabled_reason is None else f"torch.distributed ({self.disabled_reason})"
        return f"CustomAllReduce(rank={self.rank}, world_size={self.world_size}, max_bytes={self.max_bytes}, {path})"
