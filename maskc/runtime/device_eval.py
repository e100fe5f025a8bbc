"""The mask's integer expressions evaluated over a :class:`~maskc.runtime.device_table.DeviceTable` in torch
operations: the segments' origins of a mask bound on the CPU (:meth:`DeviceTable.apply`, the torch model of the
builder's ``validate`` kernel, which on the GPU computes them, and checks the `require` rules, in generated code)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from maskc import ir
from maskc.analysis.interpret import Interpreter

if TYPE_CHECKING:
    import torch

    from maskc.runtime.device_table import DeviceTable


def as_tensor_on(device, x, dtype=None) -> "torch.Tensor":
    """``x`` (a tensor or a Python number) as a tensor on ``device``: a number by a fill, never a copy from the
    host (a pageable host-to-device copy cannot be captured in a CUDA graph). Named apart from
    :func:`maskc.runtime.operands.on_device`, the context manager that selects a device."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.to(device=device, dtype=dtype or x.dtype)
    if isinstance(x, (np.ndarray, list, tuple)):     # host data: a copy (the update path's, outside capture)
        return torch.as_tensor(x, dtype=dtype, device=device)
    if dtype is None:
        dtype = torch.bool if isinstance(x, (bool, np.bool_)) else torch.int64
    return torch.full((), x, dtype=dtype, device=device)


class TableInts(Interpreter):
    """The interpreter's integer primitives over the device table (torch, one value per batch element: [B, 1]
    against positions [B or 1, P]); segments looked up in the table's bounds (gap segments outside them)."""

    def __init__(self, table: DeviceTable):
        self.mask, self.t = table.resolved, table

    def builtin(self, name: str):
        return {"seq_len": self.t.seq_len, "kv_len": self.t.kv_len, "h": 0,
                "b": self._column(lambda torch: torch.arange(self.t.batch, device=self.t.device))}[name]

    def _column(self, make):
        import torch
        return make(torch).to(torch.int64)[:, None]

    def param(self, name: str):
        slot = self.t.layout.int_slot(name)
        return self._column(lambda torch: self.t.data[:, slot])

    def segment(self, seg: str, attr: str, positions):
        import torch

        at, n = self.t.segment_at[seg], self.t.capacity[seg]
        bounds = self.t.data[:, at + 1:at + 2 + n].to(torch.int64)
        pos = as_tensor_on(self.t.device, positions, torch.int64).expand(self.t.batch, -1)
        idx = torch.searchsorted(bounds, pos.contiguous(), right=True) - 1
        inside = (idx >= 0) & (idx < n)
        safe = idx.clamp(0, n - 1)
        before = pos < bounds[:, :1]
        extent = max(self.t.seq_len, self.t.kv_len)
        start = torch.where(inside, bounds.gather(1, safe), torch.where(before, 0, bounds[:, n:]))
        end = torch.where(inside, bounds.gather(1, safe + 1), torch.where(before, bounds[:, :1], extent))
        if attr.startswith("value:"):
            name = attr[len("value:"):]
            base = at + 2 + n * (1 + self.t.layout.array_slot(name))
            values = self.t.data[:, base:base + n].to(torch.int64)
            return torch.where(inside, values.gather(1, safe), 0)
        return {"index": torch.where(inside, idx, -1), "start": start, "end": end, "length": end - start}[attr]

    def table(self, e: ir.TableAt, indices: list, q, k):
        import torch

        index_sum: Any = 0
        for index, stride in zip(indices, e.strides):
            index_sum = index_sum + index * self.int(stride, q, k)
        at, count = self.t.table_at[e.table] + 1, int(np.prod(self.t.shapes[e.table]))
        values = self.t.data[:, at:at + count].to(torch.int64)
        flat = as_tensor_on(self.t.device, index_sum, torch.int64)
        flat = flat.reshape(1, -1) if flat.dim() < 2 else flat
        return values.gather(1, flat.expand(self.t.batch, -1).clamp(0, count - 1))

    def minimum(self, a, b):
        import torch
        return torch.minimum(as_tensor_on(self.t.device, a), as_tensor_on(self.t.device, b))

    def maximum(self, a, b):
        import torch
        return torch.maximum(as_tensor_on(self.t.device, a), as_tensor_on(self.t.device, b))

    def compare(self, op: str, a, b):
        from maskc.analysis.interpret import COMPARE
        return as_tensor_on(self.t.device, COMPARE[op](a, b))

    def absolute(self, a):
        import torch
        return torch.abs(as_tensor_on(self.t.device, a))

    def truth(self, value: bool, q, k):
        return as_tensor_on(self.t.device, value)
