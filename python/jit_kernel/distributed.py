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
take the same path. World size 1: ``all_reduce(x)`` returns ``x`` itself (``out``, when given,
receives a copy), and the fused forms are the norm ops they equal (``jit_kernel.fused_add_rmsnorm``
and its fp8 forms).

Failure of a peer: every wait on a flag gives up after ``timeout_s`` of GPU time, records the
ranks that did not arrive in a word of pinned host memory and lets the call finish (its output is
then undefined). The host reads that word without a sync: at the start of every call outside CUDA
graph capture (so an eager call raises for a failure of an earlier call), and in :meth:`check`,
which synchronises the stream first. The error is a :class:`PeerTimeoutError` naming the ranks;
after it the communicator refuses every call. ``debug=True`` checks after every eager call (a
sync each) and checks before each call that every rank passes the same shape and dtype.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import torch

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


def _function(export: str) -> Any:
    return _ops._DISPATCH.function(export, ("bf16_t",))


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
    a rank waits for its peers in a call before it gives up and reports them.

    Construction is collective: every rank of ``group`` must make it, in the same order as any other
    collective on the group.
    """

    def __init__(
        self,
        group: Any,
        *,
        device: torch.device | str | int | None = None,
        max_bytes: int = 8 << 20,
        timeout_s: float = 30.0,
        debug: bool = False,
    ) -> None:
        import torch.distributed as dist

        if type(max_bytes) is not int or max_bytes <= 0 or max_bytes % 16:
            raise ValueError(f"CustomAllReduce: max_bytes must be a positive multiple of 16, got {max_bytes!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"CustomAllReduce: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.group = group
        self.world_size: int = dist.get_world_size(group)
        self.rank: int = dist.get_rank(group)
        self.max_bytes = max_bytes
        self.timeout_s = float(timeout_s)
        self.timeout_ns = max(1, int(self.timeout_s * 1e9))
        self.debug = debug
        #: Why every call falls back to torch.distributed.all_reduce (None: the kernels serve).
        self.disabled_reason: str | None = None
        self.peers = torch.zeros(2, max(self.world_size, 1), dtype=torch.int64)
        self.error_address = 0
        self._error: Any = None  # numpy view of the pinned error word
        self._failed: str | None = None
        self._capturing = False
        self._regions: list[tuple[int, int]] = []  # (address, owned) to free or close
        self.device: torch.device | None = None
        self.handle = _NEXT_HANDLE[0]
        _NEXT_HANDLE[0] += 1
        _ops.COMMUNICATORS[self.handle] = self
        if self.world_size == 1:
            return
        self.disabled_reason = self._setup(dist, device)
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
        facts: list[Any] = [None] * self.world_size
        dist.all_gather_object(facts, (socket.gethostname(), uuid), group=self.group)
        if len({host for host, _ in facts}) > 1:
            return "the group spans hosts (" + ", ".join(sorted({host for host, _ in facts})) + ")"
        missing = [r for r, (_, u) in enumerate(facts) if u is None]
        if missing:
            return f"rank(s) {missing} have no CUDA device"
        reachable = self._peer_access([u for _, u in facts])
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, reachable, group=self.group)
        for rank, unreachable in enumerate(verdicts):
            if unreachable:
                return f"no peer access (P2P) from rank {rank}'s GPU to rank(s) {unreachable}"
        self._map_regions(dist)
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
        """The fallback: ``out`` = ``torch.distributed.all_reduce`` of ``x`` over the group."""
        import torch.distributed as dist

        reason = self.fallback_reason(x)
        if reason is not None and reason != "world size 1":
            if self._capturing or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                raise RuntimeError(
                    f"CustomAllReduce: a call captured in a CUDA graph must take the custom kernels; this one falls "
                    f"back to torch.distributed.all_reduce ({reason})"
                )
            _log_once(reason)
        if out is not x:
            out.copy_(x)
        if self.world_size > 1:
            dist.all_reduce(out, group=self.group)

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

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Wrap CUDA graph capture of calls on this communicator::

            with comm.capture(), torch.cuda.graph(graph):
                comm.all_reduce(x, out=y)

        Nothing is registered: each call copies its input into the communicator's own region
        inside the kernel, so a replay reads whatever the captured input tensor holds then, and
        the epoch lives in device memory, so replays advance it. On entry it raises for an earlier
        failure; inside, a call that would fall back to ``torch.distributed.all_reduce`` raises
        (it cannot be captured). Replays do not sync: call :meth:`check` after them to learn of a
        peer that did not arrive."""
        self.check()
        self._capturing = True
        try:
            yield
        finally:
            self._capturing = False

    def close(self) -> None:
        """Unmap the peers' regions and free this rank's (no collective; the other ranks must not
        call after any rank closed)."""
        if self.device is not None:
            free, close = _function("ipc_free"), _function("ipc_close")
            for address, owned in reversed(self._regions):
                with contextlib.suppress(Exception):
                    (free if owned else close)(self.device.index, address)
        self._regions.clear()
        self.disabled_reason = self.disabled_reason or "closed"
        _ops.COMMUNICATORS.pop(self.handle, None)

    def __repr__(self) -> str:
        path = "custom kernels" if self.disabled_reason is None else f"torch.distributed ({self.disabled_reason})"
        return f"CustomAllReduce(rank={self.rank}, world_size={self.world_size}, max_bytes={self.max_bytes}, {path})"
