"""One tile shape's descriptor on the GPU: the row view (forward, deterministic dQ) and, on first use, the
column view (the backward's dK/dV), in buffers allocated once and rewritten by the generated builder's kernels
(``templates/descriptor_kernels.cu.j2``: one launch per view, which counts each row's runs, finds where they go by
a decoupled look-back over the rows before it, writes them, and in its last CTA completes the view; a rank kernel
or, past 65,536 rows, a ``torch.sort`` for the work order of views of more than 256 rows), all on the caller's
stream: nothing is read back, so a build is part of whatever CUDA graph captures it.

Each view is CSR offsets, runs ``(begin, end, kind)`` and a heaviest-first order, as the host's
:class:`~maskc.kernel_ir.Descriptor`: for exact masks the same arrays, bit for bit, as long as the runs fit
the view's capacity; past it the last rows (or columns) get one PARTIAL run over their hull and the view's
``info`` says so (:meth:`maskc.DeviceMask.check` reads it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from maskc.builder_ir import BuilderSpec
from maskc.runtime.launch import PackedLaunch
from maskc.runtime.state import DeviceDescriptor

RUN_BYTES = 12
COL_WARPS = 8               # the template's columns per CTA
# A view's bytes besides its runs, per row (counts 4, costs 8, hulls 8, offsets 4, order 4, a look-back word 8:
# the row view's tiles are its rows, the column view's COL_WARPS columns) and per view (info 5 ints, offsets' end).
ROW_BYTES, VIEW_BYTES = 36, 24
# Views their own kernel does not order (_fuses_order): up to this many rows the rank kernel (O(n^2) over the grid),
# past it torch.sort.
RANK_ORDER_ROWS = 1 << 16


@dataclass(frozen=True)
class DeviceShape:
    """What the launches read of a descriptor built on the device (the host Descriptor's sizes)."""

    seq_len: int
    kv_len: int
    batch: int
    block_m: int
    block_n: int
    work_order: Any         # the view's order as a CuPy array (its size: the rows or columns)


def fixed_bytes(rows: int) -> int:
    """A view's bytes besides its runs, for ``rows`` rows (row blocks or columns): at most this."""
    return ROW_BYTES * rows + VIEW_BYTES


class View:
    """One view's buffers (torch int32/int64 on the device, with CuPy aliases for the launches): per row (row
    block or column) its run count, cost, touched hull, CSR offset and place in the work order; per tile (the rows
    one CTA of the view's kernel takes) its look-back word, zero between launches; the runs; and ``info`` = (rows
    kept exact, runs written, overflowed, CTAs done, tiles handed out), the last two zero between launches."""

    def __init__(self, rows: int, tiles: int, capacity: int, device):
        import cupy
        import torch

        i32 = dict(dtype=torch.int32, device=device)
        self.rows, self.tiles, self.capacity = rows, tiles, capacity
        self.counts = torch.zeros(rows, **i32)
        self.costs = torch.zeros(rows, dtype=torch.int64, device=device)
        self.hulls = torch.zeros(2 * rows, **i32)
        self.offsets = torch.zeros(rows + 1, **i32)
        self.info = torch.zeros(5, **i32)
        self.runs = torch.zeros((capacity, 3), **i32)
        self.order = torch.arange(rows, **i32)
        self.lookback = torch.zeros(tiles, dtype=torch.int64, device=device)
        self.version = -1                   # the mask's version these arrays hold
        self.cp = {name: cupy.asarray(getattr(self, name)) for name in
                   ("counts", "costs", "hulls", "offsets", "info", "runs", "order", "lookback")}

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.counts, self.costs, self.hulls, self.offsets, self.info, self.runs,
                                      self.order, self.lookback))

    def sort(self) -> None:
        """The work order by torch.sort (views past RANK_ORDER_ROWS; the rank kernel does the others):
        heaviest first, ties by index (the host's ``lexsort((arange, -cost))``)."""
        import torch

        self.order.copy_(torch.sort(torch.neg(self.costs), stable=True).indices)

    def arrays(self) -> dict[str, np.ndarray]:
        """offsets, runs (those written) and order, read back (tests, the host's comparison)."""
        offsets = self.offsets.cpu().numpy()
        return {"offsets": offsets, "runs": self.runs[:int(offsets[-1])].cpu().numpy(),
                "order": self.order.cpu().numpy(), "info": self.info.cpu().numpy()}


class DescriptorBuilder:
    """The row and column views of one tile shape for a device-bound mask's table (see the module docstring).
    ``kernel``: the builder's LoadedKernel; ``capacity``: runs each view holds."""

    def __init__(self, kernel, spec: BuilderSpec, table, status, heads: int, block_m: int, block_n: int,
                 capacity: tuple[int, int]):
        import cupy

        self.kernel, self.spec, self.table, self.status = kernel, spec, table, status
        self.block_m, self.block_n = block_m, block_n
        self.batch = table.batch
        self.qt, self.kt = -(-table.seq_len // block_m), -(-table.kv_len // block_n)
        self.heads = heads
        self.capacity = capacity
        self.mask_data, self.mask_offsets = cupy.asarray(table.data.view(-1)), cupy.asarray(table.offsets)
        self.status_cp = cupy.asarray(status)
        self.rows = View(self.batch * self.qt, self.batch * self.qt, capacity[0], table.device)
        self.cols: View | None = None
        self._row_launches = self._rows_plan()
        self._col_launches: list | None = None

    def _launch(self, role: str, args, grid: int, block: int) -> PackedLaunch:
        """One of the builder's kernels (BuilderSpec.ROLES) packed with ``args`` (ints passed as int32)."""
        packed = tuple(np.int32(a) if isinstance(a, (int, np.integer)) else a for a in args)
        return PackedLaunch(self.kernel.functions[self.spec.entry_for(role)], packed, (grid, 1, 1), (block, 1, 1), 0)

    def _rows_plan(self) -> list[PackedLaunch]:
        v, t = self.rows.cp, self.table
        sizes = (t.seq_len, t.kv_len, self.block_m, self.block_n, self.qt, self.kt, self.heads)
        return [self._launch("rows", (self.mask_data, self.mask_offsets, self.status_cp, *sizes, v["counts"],
                                      v["costs"], v["hulls"], v["offsets"], v["runs"], *self._finish(self.rows)),
                             self.rows.tiles, self.spec.threads)] + self._order_plan(self.rows)

    def _cols_plan(self, cols: View) -> list[PackedLaunch]:
        r, c = self.rows.cp, cols.cp
        return [self._launch("cols", (r["offsets"], r["runs"], cols.rows, self.qt, self.kt, c["counts"], c["costs"],
                                      c["hulls"], c["offsets"], c["runs"], *self._finish(cols)),
                             cols.tiles, 32 * COL_WARPS)] + self._order_plan(cols)

    def _fuses_order(self, view: View) -> bool:
        """Whether the view's kernel orders it too: while each thread of its last CTA (rows' spec.threads,
        cols' 32 * COL_WARPS) ranks one row of at most 256 (maskc_rank_rows' keys), one O(n) pass. Past that the
        rank costs O(n^2 / threads) a thread in one CTA, more than a launch of the order kernel, whose CTAs share
        the rows (run 62, H100: with views of up to 1,024 rows ranked in one CTA, a 128K bind took 4.6x the 32K
        one in a CUDA graph)."""
        return view.rows <= min(self.spec.threads, 32 * COL_WARPS, 256)

    def _finish(self, view: View) -> tuple:
        """The view kernel's last arguments: its capacity, look-back words and info, and for its last CTA the
        work order where it makes it (``_fuses_order``; ``maskc_finish_view``)."""
        return (view.capacity, view.cp["lookback"], view.cp["info"], view.cp["order"], int(self._fuses_order(view)))

    def _order_plan(self, view: View) -> list[PackedLaunch]:
        """The rank kernel's launch for the view's work order, or none where the view kernel or torch.sort does
        it (``build``)."""
        if self._fuses_order(view) or view.rows > RANK_ORDER_ROWS:
            return []
        return [self._launch("order", (view.cp["costs"], view.rows, view.cp["order"]), -(-view.rows // 256), 256)]

    def build(self, version: int, stream: int, transposed: bool) -> None:
        """Bring the row view (and with ``transposed`` the column view, made from it) to ``version``, launching
        on ``stream`` (torch's current stream: the sorts run there)."""
        if self.rows.version != version:
            for launch in self._row_launches:
                launch(stream)
            if self.rows.rows > RANK_ORDER_ROWS:
                self.rows.sort()
            self.rows.version = version
        if transposed:
            cols, launches = self.ensure_cols()
            if cols.version != version:
                for launch in launches:
                    launch(stream)
                if cols.rows > RANK_ORDER_ROWS:
                    cols.sort()
                cols.version = version

    def ensure_cols(self) -> tuple[View, list[PackedLaunch]]:
        """The column view's buffers and launches (the backward's first call makes them)."""
        if self.cols is None or self._col_launches is None:
            n = self.batch * self.kt
            self.cols = View(n, -(-n // COL_WARPS), self.capacity[1], self.table.device)
            self._col_launches = self._cols_plan(self.cols)
        return self.cols, self._col_launches

    def device_descriptor(self, transposed: bool) -> DeviceDescriptor:
        """The view as the launches take a descriptor (CuPy aliases of the buffers: they never move)."""
        view = self.cols if transposed else self.rows
        assert view is not None, "build(..., transposed=True) first"
        shape = DeviceShape(self.table.seq_len, self.table.kv_len, self.batch, self.block_m, self.block_n,
                            view.cp["order"])
        return DeviceDescriptor(shape, view.cp["offsets"], view.cp["runs"], view.cp["order"], self.mask_data,
                                self.mask_offsets)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + (self.cols.nbytes if self.cols is not None else 0)
