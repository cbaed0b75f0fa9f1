"""hicache benchmark: KV row transfers against the torch a user would write and the copy ceilings.

    python -m jit_kernel.benchmark.bench_hicache [--plot quota.png] [--only-staged | --only-pages]
        [--json-dir DIR]
    (JIT_KERNEL_BENCH_CI=1: CI sizes)

Providers, all measured in the same run on the same buffers:

- ``jit_kernel``: ``transfer_hicache_one_layer`` (default unroll and block quota);
- ``torch``: index the source, move it, ``index_copy_`` into the destination (host-side gathers
  and scatters run on the CPU, as they would in user code; timed with events, not graphs);
- ceilings: a contiguous pinned ``cudaMemcpyAsync`` of the same bytes in the same direction
  (``Tensor.copy_(non_blocking=True)``), and a device-to-device copy (``copy_ceiling_gbps``).

Further tables: page transfers (whole pages) on the bulk-copy (TMA) kernel against the register
kernel and the ceiling, with the kernel ``page_size=`` takes in that direction, at every row size
the bulk-copy kernel serves (``--only-pages``: only this table); the write-back of
whole pages from layer-first device pools to page-first and page-unified pinned host layouts
(``transfer_hicache_all_layer_staged_*``: direct stores, and the staging buffer plus copy-engine
path for comparison) against a pinned copy of the same bytes, at 4 MiB and 64 MiB a call; and the
page-unified load-back of one layer against a pinned copy of its bytes and the register kernel
reading a layer-first host layout (``--only-staged``: only these two tables).

Bytes: host<->device counts the K and V bytes moved once (``2 * n * element_size``), as the
pinned copy moves them; device->device counts bytes read plus written (``4 * n * element_size``),
as the device copy ceiling does. Indices are sorted random rows of a cache twice as large as the
batch (destinations unique). Times are CUDA-graph medians in microseconds.

Each table is printed row by row as markdown; with ``--json-dir DIR`` (or ``$BENCH_JSON_DIR``) the
tables are also written to ``DIR/bench_hicache.json`` for ``python -m jit_kernel.benchmark.report``.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence

import torch

from jit_kernel.benchmark import results
from jit_kernel.benchmark.utils import copy_ceiling_gbps, gbps, get_benchmark_range, median_time_us
from jit_kernel.engine.families import hicache_tma_stage_rows
from jit_kernel.hicache import (
    DEFAULT_BLOCK_QUOTA,
    transfer_hicache_all_layer,
    transfer_hicache_one_layer,
    transfer_hicache_one_layer_page_unified_lf,
    uses_bulk_copy_kernel,
)
from jit_kernel.ops.hicache import _ONE_LAYER_TMA_KERNELS
from jit_kernel.ops.hicache_pages import (
    transfer_hicache_all_layer_staged_lf_page_unified,
    transfer_hicache_all_layer_staged_lf_pf,
)

DIRECTIONS = {"d2h": ("cuda", "cpu"), "h2d": ("cpu", "cuda"), "d2d": ("cuda", "cuda")}


class Table:
    """A markdown table printed as its rows come (a long run shows progress), and kept for the JSON
    results: every table made is appended to ``TABLES``."""

    def __init__(self, name: str, title: str, header: Sequence[str]) -> None:
        self.name, self.title, self.header = name, title, list(header)
        self.rows: list[list[object]] = []
        TABLES.append(self)
        print(f"\n## {title}")
        print("| " + " | ".join(self.header) + " |")
        print("|---|" + "---:|" * (len(self.header) - 1))

    def add(self, *cells: object) -> None:
        self.rows.append(list(cells))
        print("| " + " | ".join(str(cell) for cell in cells) + " |")

    def json(self) -> results.Json:
        return results.cells_table(self.name, self.title, self.header, self.rows)


TABLES: list[Table] = []


def _alloc(rows: int, element_size: int, where: str) -> torch.Tensor:
    if where == "cuda":
        return torch.randint(0, 255, (rows, element_size), dtype=torch.uint8, device="cuda")
    t = torch.empty(rows, element_size, dtype=torch.uint8, pin_memory=True)
    t.random_(0, 255)
    return t


def _indices(n: int, rows: int, *, unique: bool) -> torch.Tensor:
    idx = torch.randperm(rows)[:n] if unique else torch.randint(0, rows, (n,))
    return idx.sort().values.cuda()


def _page_indices(n: int, rows: int, page_size: int) -> torch.Tensor:
    """``n`` rows as whole pages of ``page_size`` rows, in random page order, of ``rows`` rows."""
    pages = torch.randperm(rows // page_size)[: n // page_size]
    return (pages[:, None] * page_size + torch.arange(page_size)).flatten().cuda()


class Case:
    def __init__(
        self, direction: str, element_size: int, n: int, num_layers: int = 1, page_size: int | None = None
    ) -> None:
        src_where, dst_where = DIRECTIONS[direction]
        self.direction, self.element_size, self.n = direction, element_size, n
        rows = 2 * n
        self.k_src = [_alloc(rows, element_size, src_where) for _ in range(num_layers)]
        self.v_src = [_alloc(rows, element_size, src_where) for _ in range(num_layers)]
        self.k_dst = [_alloc(rows, element_size, dst_where) for _ in range(num_layers)]
        self.v_dst = [_alloc(rows, element_size, dst_where) for _ in range(num_layers)]
        if page_size is None:
            self.idx_src = _indices(n, rows, unique=False)
            self.idx_dst = _indices(n, rows, unique=True)
        else:
            self.idx_src = _page_indices(n, rows, page_size)
            self.idx_dst = _page_indices(n, rows, page_size)
        # torch baseline helpers: CPU copies of the indices and staging buffers
        self.idx_src_cpu, self.idx_dst_cpu = self.idx_src.cpu(), self.idx_dst.cpu()
        self.stage_host = torch.empty(n, element_size, dtype=torch.uint8, pin_memory=True)
        self.stage_dev = torch.empty(n, element_size, dtype=torch.uint8, device="cuda")

    def moved_bytes(self) -> int:
        factor = 4 if self.direction == "d2d" else 2
        return factor * self.n * self.element_size

    def kernel(
        self,
        *,
        unroll: int | None = None,
        block_quota: int | None = None,
        layer: int = 0,
        page_size: int | None = None,
    ) -> Callable[[], None]:
        k_dst, v_dst, k_src, v_src = self.k_dst[layer], self.v_dst[layer], self.k_src[layer], self.v_src[layer]
        return lambda: transfer_hicache_one_layer(
            k_dst, v_dst, self.idx_dst, k_src, v_src, self.idx_src, unroll=unroll, block_quota=block_quota,
            page_size=page_size,
        )  # fmt: skip

    def bulk_copy_kernel(self, *, block_quota: int) -> Callable[[], None]:
        """The bulk-copy (TMA) kernel called directly, whatever ``page_size=`` takes in this direction."""
        kernel = _ONE_LAYER_TMA_KERNELS[self.element_size]
        k_dst, v_dst, k_src, v_src = self.k_dst[0], self.v_dst[0], self.k_src[0], self.v_src[0]
        return lambda: kernel(k_dst, v_dst, self.idx_dst, k_src, v_src, self.idx_src, block_quota)

    def all_layers(self, *, block_quota: int | None = None) -> Callable[[], None]:
        def table(ts: list[torch.Tensor]) -> torch.Tensor:
            return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64, device="cuda")

        tables = [table(self.k_dst), table(self.v_dst), table(self.k_src), table(self.v_src)]
        e = self.element_size
        return lambda: transfer_hicache_all_layer(
            tables[0], tables[1], self.idx_dst, tables[2], tables[3], self.idx_src,
            kv_cache_src_stride_bytes=e, kv_cache_dst_stride_bytes=e, block_quota=block_quota,
        )  # fmt: skip

    def torch_baseline(self) -> Callable[[], None]:
        k_dst, v_dst, k_src, v_src = self.k_dst[0], self.v_dst[0], self.k_src[0], self.v_src[0]
        if self.direction == "d2d":

            def run() -> None:
                for dst, src in ((k_dst, k_src), (v_dst, v_src)):
                    dst.index_copy_(0, self.idx_dst, src.index_select(0, self.idx_src))

        elif self.direction == "d2h":

            def run() -> None:
                for dst, src in ((k_dst, k_src), (v_dst, v_src)):
                    self.stage_host.copy_(src.index_select(0, self.idx_src))  # gather on the GPU, move (syncs)
                    dst.index_copy_(0, self.idx_dst_cpu, self.stage_host)  # scatter on the CPU

        else:

            def run() -> None:
                for dst, src in ((k_dst, k_src), (v_dst, v_src)):
                    torch.index_select(src, 0, self.idx_src_cpu, out=self.stage_host)  # gather on the CPU
                    self.stage_dev.copy_(self.stage_host, non_blocking=True)  # move
                    dst.index_copy_(0, self.idx_dst, self.stage_dev)  # scatter on the GPU

        return run


def _time(fn: Callable[[], object], graph: bool = True) -> float:
    results.check_stop()
    fn()
    torch.cuda.synchronize()
    if graph:
        try:
            return median_time_us(fn)
        except Exception as error:  # a capture failure must not lose the whole table
            if results.stop_requested():  # an interrupt the capture's clean-up turned into this error
                raise KeyboardInterrupt from error
            print(f"  (graph capture failed: {type(error).__name__}: {error}; timing with events)")
    return median_time_us(fn, use_cuda_graph=False)


_ceiling_cache: dict[tuple[str, int], float] = {}


def pinned_ceiling_gbps(direction: str, num_bytes: int) -> float:
    """A contiguous pinned cudaMemcpyAsync of ``num_bytes`` in ``direction``."""
    key = (direction, num_bytes)
    if key not in _ceiling_cache:
        host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
        fn = (
            (lambda: dev.copy_(host, non_blocking=True))
            if direction == "h2d"
            else (lambda: host.copy_(dev, non_blocking=True))
        )
        _ceiling_cache[key] = gbps(num_bytes, _time(fn))
    return _ceiling_cache[key]


def ceiling_gbps(direction: str, num_bytes: int) -> float:
    if direction == "d2d":
        key = ("d2d", num_bytes)
        if key not in _ceiling_cache:
            _ceiling_cache[key] = copy_ceiling_gbps(num_bytes)
        return _ceiling_cache[key]
    return pinned_ceiling_gbps(direction, num_bytes)


def main_table(sizes: list[int], batches: list[int], num_sms: int) -> None:
    table = Table(
        "one_layer",
        f"One layer, default unroll; block quota {DEFAULT_BLOCK_QUOTA} (the default) host<->device, "
        f"{num_sms} (all SMs) device->device; sorted random indices",
        [
            "dir",
            "element B",
            "rows",
            "quota",
            "jit_kernel us",
            "GB/s",
            "% ceiling",
            "ceiling GB/s",
            "torch us",
            "speed-up",
        ],
    )
    for direction in DIRECTIONS:
        quota = num_sms if direction == "d2d" else DEFAULT_BLOCK_QUOTA
        for size in sizes:
            for n in batches:
                case = Case(direction, size, n)
                us = _time(case.kernel(block_quota=quota))
                torch_us = _time(case.torch_baseline(), graph=False)
                bw = gbps(case.moved_bytes(), us)
                ceiling = ceiling_gbps(direction, case.moved_bytes())
                table.add(
                    direction,
                    size,
                    n,
                    quota,
                    f"{us:.1f}",
                    f"{bw:.1f}",
                    f"{100 * bw / ceiling:.0f}%",
                    f"{ceiling:.1f}",
                    f"{torch_us:.1f}",
                    f"{torch_us / us:.1f}x",
                )
                del case


def quota_sweep(sizes: list[int], n: int, quotas: list[int]) -> dict[tuple[str, int], list[float]]:
    table = Table(
        "quota_sweep",
        f"Bandwidth (GB/s) against block_quota, {n} rows (blocks of 1024 threads)",
        ["dir", "element B", *(f"q={q}" for q in quotas), "ceiling"],
    )
    sweep = {}
    for direction in DIRECTIONS:
        for size in sizes:
            case = Case(direction, size, n)
            row = [gbps(case.moved_bytes(), _time(case.kernel(block_quota=q))) for q in quotas]
            sweep[(direction, size)] = row
            ceiling = ceiling_gbps(direction, case.moved_bytes())
            table.add(direction, size, *(f"{b:.1f}" for b in row), f"{ceiling:.1f}")
            del case
    return sweep


def alternatives(options: list[tuple[int, int]], n: int, num_sms: int) -> None:
    table = Table(
        "alternatives",
        f"Alternatives: unroll (rows per warp) at the default quota and at quota = {num_sms}, {n} rows, GB/s",
        ["dir", "element B", "unroll", "q=default", "q=all SMs"],
    )
    for direction in DIRECTIONS:
        for size, unroll in options:
            case = Case(direction, size, n)
            a = gbps(case.moved_bytes(), _time(case.kernel(unroll=unroll)))
            b = gbps(case.moved_bytes(), _time(case.kernel(unroll=unroll, block_quota=num_sms)))
            table.add(direction, size, unroll, f"{a:.1f}", f"{b:.1f}")
            del case


def all_layer_table(size: int, n: int, layers: int) -> None:
    table = Table(
        "all_layer",
        f"All-layer ({layers} layers, one launch) against one-layer calls, {size} B rows, {n} rows",
        ["dir", "one-layer us", "all-layer us per layer", "ratio"],
    )
    for direction in DIRECTIONS:
        case = Case(direction, size, n, num_layers=layers)
        one = _time(case.kernel())
        per_layer = _time(case.all_layers()) / layers
        table.add(direction, f"{one:.1f}", f"{per_layer:.1f}", f"{per_layer / one:.2f}")
        del case


def page_size_for(element_size: int) -> int:
    """The page size of the page tables: 64 rows, or a stage's rows where a stage holds more."""
    return max(64, hicache_tma_stage_rows(element_size))


def tma_table(sizes: list[int], n: int, num_sms: int) -> None:
    """Whole pages (random page order): the bulk-copy kernel (called directly, whichever kernel
    ``page_size=`` picks for the direction), the register kernel on the same indices, the kernel that
    ``page_size=`` picks, and the ceiling."""
    table = Table(
        "pages_tma",
        f"Page transfers, {n} rows as whole pages: bulk-copy (TMA) kernel against the register kernel; "
        f"block quota {DEFAULT_BLOCK_QUOTA} host<->device, {num_sms} device->device",
        ["dir", "element B", "page", "quota", "TMA us", "TMA GB/s", "TMA % ceiling", "register us", "register GB/s",
         "TMA / register", "page_size= takes", "ceiling GB/s"],
    )  # fmt: skip
    for direction in DIRECTIONS:
        quota = num_sms if direction == "d2d" else DEFAULT_BLOCK_QUOTA
        for size in sizes:
            page = page_size_for(size)
            if not uses_bulk_copy_kernel(size, page):
                continue
            case = Case(direction, size, n, page_size=page)
            tma_us = _time(case.bulk_copy_kernel(block_quota=quota))
            reg_us = _time(case.kernel(block_quota=quota))
            takes = "TMA" if uses_bulk_copy_kernel(size, page, device_to_device=direction == "d2d") else "register"
            moved = case.moved_bytes()
            ceiling = ceiling_gbps(direction, moved)
            tma_bw, reg_bw = gbps(moved, tma_us), gbps(moved, reg_us)
            table.add(
                direction, size, page, quota, f"{tma_us:.1f}", f"{tma_bw:.1f}", f"{100 * tma_bw / ceiling:.0f}%",
                f"{reg_us:.1f}", f"{reg_bw:.1f}", f"{reg_us / tma_us:.2f}x", takes, f"{ceiling:.1f}",
            )  # fmt: skip
            del case


def _layer_pool(layers: int, tokens: int, row_bytes: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    pool = [_alloc(tokens, row_bytes, "cuda") for _ in range(layers)]
    return pool, torch.tensor([t.data_ptr() for t in pool], dtype=torch.uint64, device="cuda")


WriteBackSize = tuple[str, int, int, int, int, int]  # (what it is, pages, layers, page_size, row_bytes, staging_pages)


def write_back_table(sizes: Sequence[WriteBackSize]) -> None:
    """Whole pages of every layer, K and V, from layer-first device pools to pinned host memory in
    page-first and page-unified (one head group) layouts: the default direct stores (one kernel,
    default block quota) and the staging path (gather into the staging buffer, one copy per run of
    host pages), against one pinned device-to-host copy of the same bytes. Host pages in random
    order; every time a CUDA-graph median, as the pinned copy's."""
    table = Table(
        "write_back",
        "Write-back device->host of whole pages, K and V, host pages in random order: direct stores (default, "
        f"block quota {DEFAULT_BLOCK_QUOTA}) and the staging path, against a pinned copy of the same bytes",
        ["size", "layout", "path", "MiB", "us", "GB/s", "% pinned copy", "pinned copy GB/s"],
    )
    for what, pages, layers, page_size, row_bytes, staging_pages in sizes:
        label = f"{what}: {pages} pages x {page_size} tokens x {layers} layers x {row_bytes} B, staging {staging_pages}"
        tokens = 2 * pages * page_size
        k_pool, k_table = _layer_pool(layers, tokens, row_bytes)  # the pools live as long as their tables
        v_pool, v_table = _layer_pool(layers, tokens, row_bytes)
        src_tok = _page_indices(pages * page_size, tokens, page_size)
        host_pages = torch.randperm(2 * pages)[:pages]
        dst_tok = (host_pages[:, None] * page_size + torch.arange(page_size)).flatten()
        moved = 2 * pages * page_size * layers * row_bytes
        pinned = pinned_ceiling_gbps("d2h", moved)
        host_k, host_v = (
            torch.empty(2 * pages * page_size, layers, row_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)
        )
        staging_k, staging_v = (
            torch.empty(staging_pages * page_size, layers, row_bytes, dtype=torch.uint8, device="cuda")
            for _ in range(2)
        )
        page_shape = (1, layers, 2, page_size, 1, row_bytes)  # one head group holding the whole row
        host_pu = torch.empty(2 * pages, *page_shape, dtype=torch.uint8, pin_memory=True)
        staging_pu = torch.empty(staging_pages, *page_shape, dtype=torch.uint8, device="cuda")
        src_pages = torch.randperm(2 * pages)[:pages].cuda()
        lf_pf_args = (k_table, v_table, src_tok, dst_tok, staging_k, staging_v, host_k, host_v)
        pu_args = (k_table, v_table, src_pages, host_pages, staging_pu, host_pu)
        lf_pf, page_unified = transfer_hicache_all_layer_staged_lf_pf, transfer_hicache_all_layer_staged_lf_page_unified
        calls: list[tuple[str, str, Callable[[], None]]] = [
            ("page-first", "direct", functools.partial(lf_pf, *lf_pf_args, page_size=page_size)),
            ("page-first", "staging", functools.partial(lf_pf, *lf_pf_args, page_size=page_size, staged_copies=True)),
            ("page-unified", "direct", functools.partial(page_unified, *pu_args)),
            ("page-unified", "staging", functools.partial(page_unified, *pu_args, staged_copies=True)),
        ]
        for layout, path, fn in calls:
            us = _time(fn)
            bw = gbps(moved, us)
            table.add(
                label, layout, path, f"{moved / 2**20:.0f}", f"{us:.1f}", f"{bw:.1f}", f"{100 * bw / pinned:.0f}%",
                f"{pinned:.1f}",
            )  # fmt: skip
        del k_pool, v_pool, host_k, host_v, staging_k, staging_v, host_pu, staging_pu


def load_back_table(tokens: int, layers: int, page_size: int, group_bytes: list[int], groups: int) -> None:
    """One layer of page-unified host pages into the device pool (K and V), against a pinned
    host-to-device copy of the same bytes and the register kernel loading the same rows from a
    layer-first host layout (``transfer_hicache_one_layer``, default quota)."""
    table = Table(
        "load_back",
        f"Page-unified load-back host->device: one layer of {tokens} tokens ({layers} layers, pages of "
        f"{page_size}, {groups} head groups), K and V, default block quota {DEFAULT_BLOCK_QUOTA}",
        ["group B", "row B", "us", "GB/s", "% pinned copy", "register kernel GB/s", "pinned copy GB/s"],
    )

    def load(gb: int) -> Callable[[], None]:
        pages = 2 * tokens // page_size
        host = torch.empty(pages, groups, layers, 2, page_size, 1, gb, dtype=torch.uint8, pin_memory=True)
        k_dst, v_dst = (torch.empty(2 * tokens, groups * gb, dtype=torch.uint8, device="cuda") for _ in range(2))
        src_tok = _page_indices(tokens, pages * page_size, page_size)
        dst_tok = _page_indices(tokens, 2 * tokens, page_size)
        return functools.partial(transfer_hicache_one_layer_page_unified_lf, k_dst, v_dst, host, src_tok, dst_tok, 1)

    for gb in group_bytes:
        row = groups * gb
        moved = 2 * tokens * row
        us = _time(load(gb))
        bw = gbps(moved, us)
        reg = gbps(moved, _time(Case("h2d", row, tokens).kernel()))
        pinned = pinned_ceiling_gbps("h2d", moved)
        table.add(gb, row, f"{us:.1f}", f"{bw:.1f}", f"{100 * bw / pinned:.0f}%", f"{reg:.1f}", f"{pinned:.1f}")


def host_overhead() -> None:
    """Host time of one call (validation + dispatch + launch) on a 1-row transfer, against the
    tvm-ffi function called directly (no Python checks) and an empty kernel launch by torch."""
    import timeit

    from jit_kernel.engine.families import HICACHE_NUM_THREADS
    from jit_kernel.hicache import default_unroll
    from jit_kernel.ops.hicache import _HICACHE

    def median_us(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        us = sorted(timeit.repeat(fn, number=2000, repeat=5))[2] / 2000 * 1e6
        torch.cuda.synchronize()
        return us

    table = Table("host_time", "Host time per call (1 row, 1024 B; median of 5 x 2000 calls)", ["call", "us per call"])
    for direction in ("d2d", "h2d"):
        case = Case(direction, 1024, 1)
        where = "CUDA caches" if direction == "d2d" else "pinned host source"
        table.add(f"transfer_hicache_one_layer, {where}", f"{median_us(case.kernel()):.2f}")
        direct = _HICACHE.function("run_one", (1024, default_unroll(1024), HICACHE_NUM_THREADS))
        args = (case.k_dst[0], case.v_dst[0], case.idx_dst, case.k_src[0], case.v_src[0], case.idx_src, 4)
        table.add(f"tvm-ffi function called directly, {where}", f"{median_us(lambda d=direct, a=args: d(*a)):.2f}")
    x = torch.zeros(1, device="cuda")
    table.add("torch: x.add_(1) on a 1-element CUDA tensor", f"{median_us(lambda: x.add_(1)):.2f}")


def plot_quota_sweep(sweep: dict[tuple[str, int], list[float]], quotas: list[int], device: str, path: str) -> None:
    """Two panels: host<->device (PCIe scale) and device->device (HBM scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (host_ax, dev_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (direction, size), row in sweep.items():
        ax = dev_ax if direction == "d2d" else host_ax
        ax.plot(quotas, row, marker="o", label=f"{direction} {size} B")
    for ax, title in ((host_ax, "host <-> device (K+V bytes)"), (dev_ax, "device -> device (read + written)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(quotas, [str(q) for q in quotas])
        ax.set_xlabel("block_quota (blocks of 1024 threads)")
        ax.set_ylabel("GB/s")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"hicache bandwidth vs block_quota, 16384 rows ({device})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def staged_tables() -> None:
    """The write-back (4 MiB and 64 MiB a call; CI: 4 MiB) and page-unified load-back tables."""
    small: WriteBackSize = ("small", 8, 4, 64, 1024, 16)
    large: WriteBackSize = ("large", 64, 8, 64, 1024, 16)
    write_back_table([small, large])  # both sizes in every grid: the large one is the realistic call
    load_back_table(get_benchmark_range(16384, 4096), 8, 64, get_benchmark_range([256, 512, 1024], [512]), 2)


def page_tables(num_sms: int) -> None:
    """The bulk-copy kernel's table, at every row size it serves in every grid (its target is per
    row size)."""
    tma_table([256, 512, 576, 1024, 1152, 2048, 4096], 16384, num_sms)


def run(args: argparse.Namespace) -> dict[tuple[str, int], list[float]] | None:
    """Every table ``args`` asks for; the quota sweep's bandwidths (for ``--plot``)."""
    props = torch.cuda.get_device_properties(0)
    num_sms = props.multi_processor_count
    print(f"device: {props.name}, {num_sms} SMs; torch {torch.__version__}")
    sizes = get_benchmark_range([256, 512, 1024, 1152, 2048, 4096], [1024])
    batches = get_benchmark_range([4096, 16384], [4096])
    if args.only_staged:
        staged_tables()
        return None
    if args.only_pages:
        page_tables(num_sms)
        return None
    host_overhead()
    if args.only_overhead:
        return None
    if not args.skip_main:
        main_table(sizes, batches, num_sms)
    quotas = get_benchmark_range([1, 2, 4, 8, 16, 32, num_sms], [1, 2, 4, num_sms])
    sweep_sizes = get_benchmark_range([256, 1024, 4096], [1024])
    sweep = quota_sweep(sweep_sizes, get_benchmark_range([16384], [4096])[0], quotas)
    alternatives(get_benchmark_range([(256, 2), (1024, 1), (1024, 4), (4096, 2)], [(1024, 1)]), 16384, num_sms)
    all_layer_table(1024, get_benchmark_range([4096], [1024])[0], 8)
    page_tables(num_sms)
    staged_tables()
    if args.plot:
        plot_quota_sweep(sweep, quotas, props.name, args.plot)
        print(f"plot: {args.plot}")
    return sweep


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", help="write the quota sweep as a PNG here")
    parser.add_argument("--skip-main", action="store_true")
    parser.add_argument("--only-overhead", action="store_true", help="only the host time per call")
    parser.add_argument(
        "--only-staged", action="store_true", help="only the write-back and page-unified load-back tables"
    )
    parser.add_argument("--only-pages", action="store_true", help="only the bulk-copy (TMA) page table")
    parser.add_argument("--json-dir", metavar="DIR", help="write the tables as DIR/bench_hicache.json")
    args = parser.parse_args(argv)
    json_dir = results.resolve_json_dir(args.json_dir)
    command = results.command_line("bench_hicache", argv)
    torch.manual_seed(0)
    TABLES.clear()
    complete = True
    with results.stoppable():
        try:
            run(args)
        except KeyboardInterrupt:  # stopped at its time bound: keep what was measured
            complete = False
        except Exception:
            if not results.stop_requested():
                raise
            complete = False
    if not complete:
        print("\ninterrupted: the tables above hold what was measured before the stop")
    if json_dir:
        doc = results.document(
            "bench_hicache",
            results.first_paragraph(__doc__),
            command,
            [table.json() for table in TABLES],
            complete=complete,
        )
        print(f"results: {results.write(json_dir, doc)}")
    if not complete:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
